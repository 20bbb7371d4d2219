"""The command lines: one module per tool, each with `main(argv=None) -> exit status`.

`python tools/X.py` runs `paddle_vha.cli.X.main`; an installed paddle_vha has the same as `paddle-vha-X`
(pyproject.toml). Importing a command module is cheap: Paddle loads inside `main`, after its arguments are checked.

This module holds what they share: quiet imports, one-line errors, and the one driver of the four checkpoint transforms
(parse -> plan -> print the plan / --dry-run -> write -> verify -> exit status; `run_transform`).

Importing Paddle and PaddleFormers prints a page of warnings that say nothing about the user's job (no ccache,
no PyTorch, distutils, checkpoint INFO lines). Tools call `quiet()` before importing them; the library itself
never silences anything.
"""
from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import sys
import time
from typing import Callable, NoReturn, Optional
import warnings

__all__ = ["quiet", "fail", "command", "report_models", "converter_parser", "add_converter_options",
           "add_verify_options", "add_eval_options", "parse_converter_args", "run_transform", "verify_step",
           "report_verify"]

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


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that every `finally` / atomic_dir / scratch_dir cleanup runs."""


def _raise_terminated(signum, frame):
    raise Terminated()


_RESETS_SIGTERM = ("paddle", "paddleformers")  # Paddle's native library installs its own handler (it prints a stack
# and aborts); PaddleFormers' __init__ calls paddle.disable_signal_handler(), which sets SIGTERM's back to the default


class _ReclaimSigterm:
    """A sys.meta_path finder that, after `paddle` or `paddleformers` is imported, puts our SIGTERM handler back: both
    replace the operating system's handler under Python's (_RESETS_SIGTERM), so a `kill` ended the tool at once, no
    cleanup ran and its temporaries stayed. Tools import them inside main(), after `command` set the handler."""

    def find_spec(self, name, path=None, target=None):
        if name not in _RESETS_SIGTERM:
            return None
        import importlib.util

        sys.meta_path.remove(self)  # not into ourselves while finding it
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if any(n not in sys.modules and n != name for n in _RESETS_SIGTERM):
                sys.meta_path.insert(0, self)  # the other one is still to come
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            import signal
            import threading

            if threading.current_thread() is threading.main_thread() and \
                    signal.getsignal(signal.SIGTERM) is _raise_terminated:
                signal.signal(signal.SIGTERM, _raise_terminated)  # the OS handler back to Python's

        spec.loader.exec_module = exec_module
        return spec


def _reclaim_sigterm_on_import() -> None:
    if not all(n in sys.modules for n in _RESETS_SIGTERM) and \
            not any(isinstance(f, _ReclaimSigterm) for f in sys.meta_path):
        sys.meta_path.insert(0, _ReclaimSigterm())


def command(main):
    """Decorator for a tool's main(argv=None): Ctrl-C ends it with one line and exit status 130, SIGTERM with one line
    and 143, a full disk (ENOSPC / EDQUOT) with one line and 2, not a traceback; all three unwind through the cleanups
    (outputs are written through temporary folders and scratch space is removed, so an interrupted run leaves nothing
    behind)."""

    @functools.wraps(main)
    def wrapped(argv=None):
        import signal
        import threading

        ours = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _raise_terminated) if ours else None
        if ours:
            _reclaim_sigterm_on_import()
        try:
            return main(argv)
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130
        except Terminated:
            print("error: terminated (SIGTERM); temporaries removed", file=sys.stderr)
            return 143
        except OSError as e:
            import errno

            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            where = f" writing {e.filename}" if e.filename else ""
            print(f"error: out of disk space{where} ({e.strerror}); temporaries removed, nothing written",
                  file=sys.stderr)
            return 2
        finally:
            if ours:
                signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)

    return wrapped


# every character str.splitlines() breaks at, and the other C0 controls: a name read from a file may hold any of them
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(32), 127, 0x85]}
_ESCAPES.update({0x2028: "\\u2028", 0x2029: "\\u2029"})


def one_line(message: str) -> str:
    """`message` as one printable line: control and line-breaking characters (a tensor name from a corrupt file may
    hold a carriage return) written as escapes."""
    return message.translate(_ESCAPES)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one line naming the problem and exit non-zero."""
    print(f"error: {one_line(message)}", file=sys.stderr)
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


# --- the checkpoint transforms' command lines: fold, convert_to_vha, compress_kv, import_fleet ------------------------

def converter_parser(doc: str, source: str, output: str) -> argparse.ArgumentParser:
    """A transform's parser: description and epilog from its module docstring, then IN_DIR (a `source` checkpoint)
    and OUT_DIR (where the `output` checkpoint goes)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=doc.split("\n\n", 1)[1])
    p.add_argument("in_dir", metavar="IN_DIR", help=f"{source} checkpoint folder (config.json + safetensors)")
    p.add_argument("out_dir", metavar="OUT_DIR", help=f"where the {output} checkpoint goes (must not exist)")
    return p


def add_converter_options(p, dtype_help: str = "output dtype; auto = the input's (default auto)") -> None:
    """The options every checkpoint transform shares: the one --dtype, --force, --dry-run, --max-shard-size,
    --no-progress."""
    from paddle_vha.transform.dtype import DTYPE_CHOICES

    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=dtype_help)
    p.add_argument("--force", action="store_true", help="replace an existing OUT_DIR (only once the new one is complete)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan; write nothing")
    p.add_argument("--max-shard-size", default="5GB", help="largest output shard, e.g. 5GB, 500MB (default 5GB)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_verify_options(p, sequences: int, length: int, tol: Optional[float], verify_help: str, tol_help: str) -> None:
    """--verify [N] (random sequences, N defaults to `sequences`), --verify-len, --verify-tol: fold and import_fleet."""
    p.add_argument("--verify", type=int, nargs="?", const=sequences, default=None, metavar="N", help=verify_help)
    p.add_argument("--verify-len", type=int, default=length, help=f"tokens per --verify sequence (default {length})")
    p.add_argument("--verify-tol", type=float, default=tol, help=tol_help)


def add_eval_options(p, batches_help: str) -> None:
    """--eval-batches, --eval-len, --calib-data, --pass-tokens: the text (calibration, the logit KL on held-out text)
    of compress_kv and convert_to_vha."""
    p.add_argument("--eval-batches", type=int, default=4, help=batches_help)
    p.add_argument("--eval-len", type=int, default=128, help="tokens per evaluation sequence (default 128)")
    p.add_argument("--calib-data", default=None, metavar="FILE",
                   help="text to calibrate on and to report the KL on: FILE.txt, or FILE.jsonl with a \"text\" field "
                        "per line (its last 10%% of tokens held out for the KL), tokenized with IN_DIR's tokenizer.json "
                        "(byte ids for a byte-level checkpoint without one); default: the embedded standard-library "
                        "corpus")
    p.add_argument("--pass-tokens", type=int, default=4096, metavar="T",
                   help="tokens per layer-by-layer forward pass (bounds the activations' memory; default 4096)")


def _converter_ranges(p: argparse.ArgumentParser, args) -> None:
    """The ranges of the verify / eval options (argparse's usage error, exit 2)."""
    if getattr(args, "verify", None) is not None and args.verify < 1:
        p.error("--verify N must be >= 1")
    if getattr(args, "verify_len", 1) < 1:
        p.error("--verify-len must be >= 1")
    tol = getattr(args, "verify_tol", None)
    if tol is not None and not (math.isfinite(tol) and tol >= 0):  # NaN passed every check; found after the job
        p.error(f"--verify-tol {tol}: must be a finite number >= 0")
    if hasattr(args, "eval_batches") and (args.eval_batches < 0 or args.eval_len < 2 or args.pass_tokens < 1):
        p.error("--eval-batches must be >= 0, --eval-len >= 2 and --pass-tokens >= 1")


def converter_effects(verify: bool = False, **own) -> dict:
    """A transform's TAKES_EFFECT table (paddle_vha/cli/options): IN_DIR / OUT_DIR and the shared converter options,
    the verify options (`verify`: add_verify_options), then `own` (its other options)."""
    from .options import ALWAYS, PERMISSION, Effect

    table = {"IN_DIR": ALWAYS, "OUT_DIR": ALWAYS, "--dtype": ALWAYS, "--force": PERMISSION,
             "--dry-run": ALWAYS, "--max-shard-size": ALWAYS,
             "--no-progress": Effect("always (with --dry-run there is no bar to hide: what it asks holds)")}
    if verify:
        given = Effect("with --verify", lambda a: a.verify is not None)
        table.update({"--verify": ALWAYS, "--verify-len": given, "--verify-tol": given})
    return {**table, **own}


def parse_converter_args(p: argparse.ArgumentParser, argv=None, effects: Optional[dict] = None,
                         check_ranges: Optional[Callable] = None) -> argparse.Namespace:
    """p.parse_args(argv), with the ranges of the verify / eval options checked (argparse's usage error, exit 2), then
    check_ranges(p, args) (the tool's own), then every given option's Effect in `effects` (one line, exit 2: an option
    that cannot take effect in this run, paddle_vha/cli/options.py)."""
    from .options import parse_checked

    def ranges(parser, args):
        _converter_ranges(parser, args)
        if check_ranges is not None:
            check_ranges(parser, args)

    args, given = parse_checked(p, argv, effects if effects is not None else converter_effects(), ranges)
    args.given_options = frozenset(given)  # for the Effects only the input decides, checked once it is read
    return args


def check_memory(args, made, memory: Optional[Callable]) -> None:
    """Print the transform's memory need (memory(args, plan) -> (bytes, how it is made up)); unless --dry-run, refuse
    (CheckpointError, one line) when /proc/meminfo's MemAvailable is below it."""
    if memory is None:
        return
    from paddle_vha.transform.memory import mem_available, refuse_if_short
    from paddle_vha.units import fmt_bytes

    need, how = memory(args, made)
    have = mem_available()
    print(f"memory: needs about {fmt_bytes(need)} ({how}); MemAvailable "
          f"{fmt_bytes(have) if have is not None else 'unknown'}")
    if not args.dry_run:
        refuse_if_short(need, how, made.error, made.verb)


def run_transform(args, plan: Callable, write: Callable, what: str, done: Callable,
                  memory: Optional[Callable] = None, estimate: Optional[Callable] = None) -> int:
    """A transform's main after parsing: quiet(), plan(args) (a refusal exits 2), print the plan and its memory need
    (memory(args, plan) -> (bytes, formula); refused up front when MemAvailable is below it), stop at --dry-run,
    write(args, plan) (a refusal found while writing, or an OS error, exits 2 with nothing written; `what` names the
    output in that message), then done(args, plan, seconds, written) (written: what write returned) prints the
    result and returns the exit status. estimate(args, plan) -> a line or None: the work ahead, printed after the memory
    need (also by --dry-run). The callbacks import Paddle-dependent modules themselves, after quiet()."""
    quiet()
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.checkpoint.fsutil import check_no_overlap
    from paddle_vha.transform import format_plan

    try:
        if getattr(args, "calib_data", None):  # a text file the transform reads: never inside what --force replaces
            check_no_overlap(args.out_dir, [args.calib_data], input_label="--calib-data")
        made = plan(args)
    except CheckpointError as e:
        fail(str(e))
    print(format_plan(made))
    try:
        check_memory(args, made, memory)
    except CheckpointError as e:
        fail(str(e))
    said = estimate(args, made) if estimate is not None else None
    if said:
        print(said, flush=True)
    if args.dry_run:
        print("dry run: nothing written")
        return 0
    t0 = time.perf_counter()
    try:
        written = write(args, made)
    except CheckpointError as e:  # a NaN / Inf or an overflowing cast found while writing: nothing was written
        fail(str(e))
    except OSError as e:
        fail(f"{args.out_dir}: could not write the {what} ({e.strerror or e})")
    return done(args, made, time.perf_counter() - t0, written)


def verify_step(args, run: Callable[[], dict], tol: float, what: str, sides) -> int:
    """--verify after a transform wrote: 0 without it, else run() (compare_logits' dict) reported by report_verify."""
    if args.verify is None:
        return 0
    # Paddle's checkpoint loader logs INFO lines per load through this logger, which quiet() does not cover.
    logging.getLogger("paddle.distributed.fleet.utils.log_util").setLevel(logging.WARNING)
    return report_verify(run(), tol, what, sides)


def report_verify(r: dict, tol: float, what: str, sides=("reference", "compared")) -> int:
    """Print a converter's --verify result (paddle_vha.evaluate.compare_logits' dict) in one line and return the exit
    status: 1 for non-finite logits (sides names the reference and the compared model, in that order) or a relative
    difference above `tol`, else 0."""
    from paddle_vha.transform.verify import nonfinite_sides

    if r["nonfinite"]:
        print(f"error: verify: {nonfinite_sides(r, sides)} logits are not finite (NaN or Inf)", file=sys.stderr)
        return 1
    ok = r["max_rel"] <= tol
    print(f"verify ({what}): max abs logit diff {r['max_abs']:.3e}, max rel {r['max_rel']:.3e} (tol {tol:.0e}), "
          f"mean KL {r['mean_kl']:.3e} nats -> {'OK' if ok else 'FAIL'}")
    if not ok:
        print(f"error: verify: relative logit difference {r['max_rel']:.3e} above tolerance {tol:.0e}", file=sys.stderr)
        return 1
    return 0
