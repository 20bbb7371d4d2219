#!/usr/bin/env python
"""Train with PaddleFormers' Trainer from a JSON config: see paddle_vha/cli/train.py (installed as paddle-vha-train)."""
from paddle_vha.cli.train import entry

if __name__ == "__main__":
    entry()
