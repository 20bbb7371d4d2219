#!/usr/bin/env python
"""Merge a tensor-parallel sharded save into one Qwen3-VHA or Qwen3-MEA checkpoint (what from_pretrained and fold.py read).

The command line lives in paddle_vha/cli/merge_tp_checkpoint.py (installed as `paddle-vha-merge-tp-checkpoint`); run with --help for its options.
"""
import sys

from paddle_vha.cli.merge_tp_checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
