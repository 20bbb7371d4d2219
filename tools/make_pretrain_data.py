#!/usr/bin/env python
"""Write text as PaddleFormers pretraining data (PREFIX.bin + PREFIX.idx) for tools/train.py (dataset=pretrain).

The command line lives in paddle_vha/cli/make_pretrain_data.py (installed as `paddle-vha-make-pretrain-data`); run with --help for its options.
"""
import sys

from paddle_vha.cli.make_pretrain_data import main

if __name__ == "__main__":
    sys.exit(main())
