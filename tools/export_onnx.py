#!/usr/bin/env python
"""Export a folded (stock Qwen3) checkpoint to an ONNX decoder with KV cache, and validate it.

The command line lives in paddle_vha/cli/export_onnx.py (installed as `paddle-vha-export-onnx`); run with --help for its options.
"""
import sys

from paddle_vha.cli.export_onnx import main

if __name__ == "__main__":
    sys.exit(main())
