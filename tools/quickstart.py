#!/usr/bin/env python
"""Quick-start: train a small Qwen3-VHA next to the same-size GQA-8, then fold, export and generate.

The command line lives in paddle_vha/cli/quickstart.py (installed as `paddle-vha-quickstart`); run with --help for its options.
"""
import sys

from paddle_vha.cli.quickstart import main

if __name__ == "__main__":
    sys.exit(main())
