"""The command lines: one module per tool, each with `main(argv=None) -> exit status`.

`python tools/X.py` runs `paddle_vha.cli.X.main`; an installed paddle_vha has the same as `paddle-vha-X`
(pyproject.toml). Importing a command module is cheap: Paddle loads inside `main`, after its arguments are checked.

This module holds what they share: quiet imports and one-line errors. Importing Paddle and PaddleFormers prints a page of warnings that say nothing about the user's job (no ccache,
no PyTorch, distutils, checkpoint INFO lines). Tools call `quiet()` before importing them; the library itself
never silences anything.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
from typing import NoReturn
import warnings

__all__ = ["quiet", "fail", "command", "report_models", "add_converter_options", "report_verify"]

_NOISE = ("Due to potential compatibility issues between PaddlePaddle and PyTorch",)


class _DropNoise(logging.Filter):
    def filter(self, record):
        return record.levelno >= logging.WARNING and not any(n in record.getMessage() for n in _NOISE)


def quiet() -> None:
    """Call before importing paddle / paddleformers."""
    os.environ.setdefault("GLOG_minloglevel", "2")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # Paddle's bundled MKL takes a slow GEMM path on AMD CPUs unless told the CPU type (docs/prologue.md);
    # harmless elsewhere. Use the machine's cores for GEMMs (Paddle's own default is one thread).
    os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
    os.environ.setdefault("MKL_NUM_THREADS", str(min(os.cpu_count() or 1, 8)))
    for msg in ("No ccache found", "Setuptools is replacing distutils", "Tensor do not have 'place' interface"):
        warnings.filterwarnings("ignore", message=f".*{msg}.*")
    # PaddleFormers' logger, and Paddle's fleet / flex-checkpoint logger (INFO lines on every from_pretrained)
    for name in ("PaddleFormers", "paddle.distributed.fleet.utils.log_util"):
        logging.getLogger(name).addFilter(_DropNoise())


def command(main):
    """Decorator for a tool's main(argv=None): Ctrl-C ends it with one line and exit status 130, not a traceback
    (outputs are written through temporary folders, so an interrupted run leaves nothing half-written)."""

    @functools.wraps(main)
    def wrapped(argv=None):
        try:
            return main(argv)
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130

    return wrapped


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one line naming the problem and exit non-zero."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def report_models(specs, rows_for, print_table, as_json: bool, error=ValueError) -> int:
    """The calculators' output (tools/kv_calc.py, tools/flops.py): rows_for(spec) for every MODEL argument, then one
    JSON list or print_table(spec, rows) per model; `error` (one line) exits 2."""
    import json

    try:
        all_rows = [(spec, rows_for(spec)) for spec in specs]
    except error as e:
        fail(str(e))
    if as_json:
        print(json.dumps([r for _, rows in all_rows for r in rows], indent=1))
        return 0
    for spec, rows in all_rows:
        print_table(spec, rows)
    return 0


def add_converter_options(p, shard_help: str = "largest output shard, e.g. 5GB, 500MB (default 5GB)") -> None:
    """The options every checkpoint converter (fold, compress_kv, import_fleet) shares."""
    p.add_argument("--force", action="store_true", help="replace an existing OUT_DIR (only once the new one is complete)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan; write nothing")
    p.add_argument("--max-shard-size", default="5GB", help=shard_help)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def report_verify(r: dict, tol: float, what: str, sides=("reference", "compared")) -> int:
    """Print a converter's --verify result (paddle_vha.evaluate.compare_logits' dict) in one line and return the exit
    status: 1 for non-finite logits (sides names the reference and the compared model, in that order) or a relative
    difference above `tol`, else 0."""
    if r["nonfinite"]:
        which = dict(zip(("reference", "compared"), sides))
        names = " and ".join(which[w] for w in r["nonfinite"].split(" and "))
        print(f"error: verify: {names} logits are not finite (NaN or Inf)", file=sys.stderr)
        return 1
    ok = r["max_rel"] <= tol
    print(f"verify ({what}): max abs logit diff {r['max_abs']:.3e}, max rel {r['max_rel']:.3e} (tol {tol:.0e}), "
          f"mean KL {r['mean_kl']:.3e} nats -> {'OK' if ok else 'FAIL'}")
    if not ok:
        print(f"error: verify: relative logit difference {r['max_rel']:.3e} above tolerance {tol:.0e}", file=sys.stderr)
        return 1
    return 0
