#!/usr/bin/env python
"""Head-to-head at equal KV budget: ways from a trained GQA-8 Qwen3 to a 4x smaller KV cache, uptrained alike.

The experiment lives in tools/experiments/uptrain_study.py (it runs from a checkout and is not installed);
run with --help for its options.
"""
import sys

from experiments.uptrain_study import main  # tools/ is first on sys.path

if __name__ == "__main__":
    sys.exit(main())
