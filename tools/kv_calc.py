#!/usr/bin/env python
"""KV-cache bytes per token for MHA, GQA-n, MLA, VHA (as trained and as folded) and MEA.

The command line lives in paddle_vha/cli/kv_calc.py (installed as `paddle-vha-kv-calc`); run with --help for its options.
"""
import sys

from paddle_vha.cli.kv_calc import main

if __name__ == "__main__":
    sys.exit(main())
