#!/usr/bin/env python
"""Export a stock Llama / Qwen2 / Qwen3 checkpoint to one GGUF file for llama.cpp, by llama.cpp's own converter and
quantizer.

The command line lives in paddle_vha/cli/export_gguf.py (installed as `paddle-vha-export-gguf`); run with --help.
"""
import sys

from paddle_vha.cli.export_gguf import main

if __name__ == "__main__":
    sys.exit(main())
