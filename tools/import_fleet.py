#!/usr/bin/env python
"""Import a VHA checkpoint written by upstream PaddleFleet (or its research fork) into this project's Qwen3-VHA format.

The command line lives in paddle_vha/cli/import_fleet.py (installed as `paddle-vha-import-fleet`); run with --help.
"""
import sys

from paddle_vha.cli.import_fleet import main

if __name__ == "__main__":
    sys.exit(main())
