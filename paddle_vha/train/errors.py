"""The one exception the training glue raises for a run it will not start or cannot finish as asked.

Its message is one line naming the problem (a config value, an input folder, a non-finite loss). The library never
exits the process: paddle_vha/cli/train.py prints `error: MESSAGE` and exits with status 2.
"""
from __future__ import annotations

__all__ = ["TrainError"]


class TrainError(Exception):
    """A training run refused or stopped; str(e) is the one-line reason."""
