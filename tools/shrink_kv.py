#!/usr/bin/env python
"""Shrink a model's KV cache in one command: convert, heal on its own words, fold, export, and the before / after
table.

The command line lives in paddle_vha/cli/shrink_kv.py (installed as `paddle-vha-shrink-kv`); run with --help for its options.
"""
import sys

from paddle_vha.cli.shrink_kv import main

if __name__ == "__main__":
    sys.exit(main())
