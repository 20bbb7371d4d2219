#!/usr/bin/env python
"""Make healing data from the original model itself (its chat answers and text continuations) as PaddleFormers
pretraining data.

The command line lives in paddle_vha/cli/make_heal_data.py (installed as `paddle-vha-make-heal-data`); run with --help for its options.
"""
import sys

from paddle_vha.cli.make_heal_data import main

if __name__ == "__main__":
    sys.exit(main())
