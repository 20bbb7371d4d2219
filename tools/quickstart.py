#!/usr/bin/env python
"""Quick-start: train a small Qwen3-VHA next to the same-size GQA-8, then fold, export and generate.

The experiment lives in tools/experiments/quickstart.py (it runs from a checkout and is not installed);
run with --help for its options.
"""
import sys

from experiments.quickstart import main  # tools/ is first on sys.path

if __name__ == "__main__":
    sys.exit(main())
