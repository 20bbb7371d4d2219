#!/usr/bin/env python
"""Compress the KV cache of a stock Qwen3 checkpoint into a Qwen3-MEA checkpoint (the MEA paper's SVD).

The command line lives in paddle_vha/cli/compress_kv.py (installed as `paddle-vha-compress-kv`); run with --help for its options.
"""
import sys

from paddle_vha.cli.compress_kv import main

if __name__ == "__main__":
    sys.exit(main())
