#!/usr/bin/env python
"""Store a teacher's top-K log-probabilities (and the rest's mass) on the training windows once, for distillation
that runs the student only.

The command line lives in paddle_vha/cli/store_teacher.py (installed as `paddle-vha-store-teacher`); run with --help for its options.
"""
import sys

from paddle_vha.cli.store_teacher import main

if __name__ == "__main__":
    sys.exit(main())
