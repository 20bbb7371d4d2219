#!/usr/bin/env python
"""Small-scale VHA vs GQA study: same tokens, same hyper-parameters, several seeds, honest noise estimate.

The experiment lives in tools/experiments/study.py (it runs from a checkout and is not installed);
run with --help for its options.
"""
import sys

from experiments.study import main  # tools/ is first on sys.path

if __name__ == "__main__":
    sys.exit(main())
