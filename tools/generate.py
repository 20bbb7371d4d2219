#!/usr/bin/env python
"""Generate text from an exported decoder with onnxruntime or Paddle Inference, using its KV cache.

The command line lives in paddle_vha/cli/generate.py (installed as `paddle-vha-generate`); run with --help for its options.
"""
import sys

from paddle_vha.cli.generate import main

if __name__ == "__main__":
    sys.exit(main())
