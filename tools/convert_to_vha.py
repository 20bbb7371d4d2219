#!/usr/bin/env python
"""Convert a stock Qwen3 checkpoint (GQA or MHA) into a Qwen3-VHA checkpoint with N KV heads, to uptrain.

The command line lives in paddle_vha/cli/convert_to_vha.py (installed as `paddle-vha-convert-to-vha`); run with --help for its options.
"""
import sys

from paddle_vha.cli.convert_to_vha import main

if __name__ == "__main__":
    sys.exit(main())
