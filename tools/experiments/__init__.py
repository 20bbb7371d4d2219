"""Experiments run from a checkout, never installed: the quick-start and the three studies.

`python tools/quickstart.py` (and `study.py`, `uptrain_study.py`, `lr_study.py`) runs `experiments.X.main`: Python puts
the script's folder, tools/, first on sys.path, so this folder is importable as `experiments` from there (and as
`tools.experiments` from the test suite, which has the checkout on sys.path). The wheel carries paddle_vha only; the
experiments use the library like any other client and add what only they need:

    toy.py        the scaled-down byte-level Qwen3 every experiment trains (one builder for its config fields)
    report.py     strict-JSON and text outputs, each written atomically
    scaling.py    the power-law fit of a loss curve and the loss-spike detector (lr_study)
"""
