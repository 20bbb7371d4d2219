#!/usr/bin/env python
"""MEA's central claim, re-measured: learning-rate robustness, spikes, and the power-law pick of the rate.

The command line lives in paddle_vha/cli/lr_study.py (installed as `paddle-vha-lr-study`); run with --help for its options.
"""
import sys

from paddle_vha.cli.lr_study import main

if __name__ == "__main__":
    sys.exit(main())
