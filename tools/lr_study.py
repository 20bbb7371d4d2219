#!/usr/bin/env python
"""MEA's central claim, re-measured: learning-rate robustness, spikes, and the power-law pick of the rate.

The experiment lives in tools/experiments/lr_study.py (it runs from a checkout and is not installed);
run with --help for its options.
"""
import sys

from experiments.lr_study import main  # tools/ is first on sys.path

if __name__ == "__main__":
    sys.exit(main())
