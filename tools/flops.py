#!/usr/bin/env python
"""Training and serving FLOPs per token for MHA, GQA-n, MLA, VHA (as trained and as folded) and MEA.

The command line lives in paddle_vha/cli/flops.py (installed as `paddle-vha-flops`); run with --help for its options.
"""
import sys

from paddle_vha.cli.flops import main

if __name__ == "__main__":
    sys.exit(main())
