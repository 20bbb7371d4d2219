#!/usr/bin/env python
"""Fold a Qwen3-VHA checkpoint into a stock Qwen3 GQA checkpoint that computes the same function.

The command line lives in paddle_vha/cli/fold.py (installed as `paddle-vha-fold`); run with --help for its options.
"""
import sys

from paddle_vha.cli.fold import main

if __name__ == "__main__":
    sys.exit(main())
