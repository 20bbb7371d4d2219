#!/usr/bin/env python
"""Import a GGUF file (llama.cpp's format: Llama, Qwen2, Qwen3) as a Hugging Face-layout safetensors checkpoint.

The command line lives in paddle_vha/cli/import_gguf.py (installed as `paddle-vha-import-gguf`); run with --help.
"""
import sys

from paddle_vha.cli.import_gguf import main

if __name__ == "__main__":
    sys.exit(main())
