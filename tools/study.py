#!/usr/bin/env python
"""Small-scale VHA vs GQA study: same tokens, same hyper-parameters, several seeds, honest noise estimate.

The command line lives in paddle_vha/cli/study.py (installed as `paddle-vha-study`); run with --help for its options.
"""
import sys

from paddle_vha.cli.study import main

if __name__ == "__main__":
    sys.exit(main())
