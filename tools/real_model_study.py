#!/usr/bin/env python
"""The conversion measured on a real pretrained model (SmolLM2-135M-Instruct, 3 KV heads -> 1), every start healed with
cross-entropy and with distillation, on English prose.

The experiment lives in tools/experiments/real_model_study.py (it runs from a checkout and is not installed);
run with --help for its options.
"""
import sys

from experiments.real_model_study import main  # tools/ is first on sys.path

if __name__ == "__main__":
    sys.exit(main())
