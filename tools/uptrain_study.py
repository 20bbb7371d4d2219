#!/usr/bin/env python
"""Head-to-head at equal KV budget: ways from a trained GQA-8 Qwen3 to a 4x smaller KV cache, uptrained alike.

The command line lives in paddle_vha/cli/uptrain_study.py (installed as `paddle-vha-uptrain-study`); run with --help for its options.
"""
import sys

from paddle_vha.cli.uptrain_study import main

if __name__ == "__main__":
    sys.exit(main())
