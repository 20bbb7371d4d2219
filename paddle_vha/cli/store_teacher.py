"""Store a teacher's outputs once for distillation: its top-K next-token log-probabilities and the rest's mass at every
position of the training windows, so that tools/train.py --teacher STORE runs the student only.

The windows are DATA's documents (PaddleFormers pretraining data, e.g. tools/make_heal_data.py's) concatenated and cut
every --seq-len tokens, as the training run will read them (paddle_vha/train/stored_teacher.py says the format and the
loss). The teacher runs through its float32 ONNX export (TEACHER exported once into STORE.export unless --export
names one, or DATA.export is there from make_heal_data). Work is saved every batch in STORE.partial: an interrupted
run continues when run again. --measure STUDENT_EXPORT first prints, on the first windows, how far the stored KL
(top-K + rest) falls below the full-vocabulary KL for each K of --measure-k, against that student: the numbers to
choose --top-k by.

    python tools/store_teacher.py runs/smollm2 data/heal/smol --out data/heal/smol-top64
    python tools/store_teacher.py runs/smollm2 data/heal/smol --out /tmp/x --measure runs/converted-export --only-measure
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from paddle_vha.cli import command, fail, quiet
from paddle_vha.cli.options import ALWAYS, Effect, parse_checked


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("teacher", metavar="TEACHER", help="the teacher checkpoint folder (the original model)")
    p.add_argument("data", metavar="DATA", help="data prefix: DATA.bin + DATA.idx")
    p.add_argument("--out", required=True, metavar="STORE", help="the store folder to write")
    p.add_argument("--export", metavar="DIR", help="the teacher's float32 ONNX export (default: DATA.export if there, "
                   "else made in STORE.export)")
    p.add_argument("--seq-len", type=int, default=256, help="window length, the training run's max_seq_len "
                   "(default 256)")
    p.add_argument("--top-k", type=int, default=64, help="log-probabilities kept per position (default 64)")
    p.add_argument("--batch", type=int, default=4, help="windows per teacher call (default 4)")
    p.add_argument("--threads", type=int, default=0, help="onnxruntime threads (default: its own choice)")
    p.add_argument("--measure", metavar="STUDENT_EXPORT", help="an ONNX export of a student: print the stored KL's "
                   "shortfall against the full KL per K first")
    p.add_argument("--measure-k", type=int, nargs="+", default=[8, 32, 64, 128, 256])
    p.add_argument("--measure-windows", type=int, default=8)
    p.add_argument("--only-measure", action="store_true", help="print the measurement and write no store")
    p.add_argument("--no-progress", action="store_true")
    return p


TAKES_EFFECT = {
    "TEACHER": ALWAYS, "DATA": ALWAYS, "--out": ALWAYS, "--export": ALWAYS, "--seq-len": ALWAYS, "--batch": ALWAYS,
    "--threads": ALWAYS, "--measure": ALWAYS, "--no-progress": ALWAYS,
    "--top-k": Effect("unless --only-measure", lambda a: not a.only_measure),
    "--measure-k": Effect("with --measure", lambda a: bool(a.measure)),
    "--measure-windows": Effect("with --measure", lambda a: bool(a.measure)),
    "--only-measure": Effect("with --measure", lambda a: bool(a.measure)),
}


def _check(p, args) -> None:
    if not os.path.isdir(args.teacher):
        p.error(f"{args.teacher}: no such folder")
    for ext in (".bin", ".idx"):
        if not os.path.isfile(args.data + ext):
            p.error(f"{args.data}{ext}: no such file (DATA is a prefix: DATA.bin + DATA.idx)")
    for name in ("seq_len", "top_k", "batch", "measure_windows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    if any(k < 1 for k in args.measure_k):
        p.error("--measure-k: every K must be >= 1")
    if args.threads < 0:
        p.error(f"--threads {args.threads}: must be >= 0")
    for flag, d in (("--export", args.export), ("--measure", args.measure)):
        if d and not os.path.isfile(os.path.join(d, "export_info.json")):
            p.error(f"{flag} {d}: not an export folder (no export_info.json)")
    if not args.only_measure and os.path.exists(args.out):
        p.error(f"--out {args.out}: exists (a store is written once; remove it to compute it again)")


def teacher_export(args) -> str:
    """--export, DATA.export (make_heal_data's), or TEACHER exported once (float32) into STORE.export."""
    from paddle_vha.export.float32_export import float32_export, is_export

    if args.export:
        return args.export
    if is_export(args.data + ".export"):
        return args.data + ".export"
    return _exported(lambda: float32_export(args.teacher, args.out + ".export", "to run the teacher"))


def _logits_fn(session):
    import numpy as np

    def run(ids):
        logits, _ = session.prefill(np.asarray(ids, np.int64))
        return logits  # (b, S, V)

    return run


def measure(args, teacher_fn, info) -> None:
    """The stored KL's shortfall against the full KL, per K, on the first --measure-windows windows."""
    import numpy as np

    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.train.stored_teacher import stream_of, topk_kl_gap

    student = _logits_fn(OrtDecoder.from_dir(args.measure, threads=args.threads))
    stream = stream_of(args.data)
    n = min(args.measure_windows, (len(stream) - 1) // args.seq_len)
    full, est = [], {k: [] for k in args.measure_k}
    mass = {k: [] for k in args.measure_k}
    for i in range(n):
        x = stream[i * args.seq_len:(i + 1) * args.seq_len][None]
        g = topk_kl_gap(teacher_fn(x), student(x), args.measure_k)
        full.append(g["full"])
        for k in args.measure_k:
            est[k].append(g["k"][k]["estimate"])
            mass[k].append(g["k"][k]["teacher_mass"])
    f = float(np.mean(full))
    print(f"stored KL against the full KL, {n} windows x {args.seq_len} positions, student {args.measure}: "
          f"full KL {f:.4f} nats")
    print("| K | stored KL | shortfall | teacher mass in the top K | bytes per token |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for k in args.measure_k:
        e = float(np.mean(est[k]))
        print(f"| {k} | {e:.4f} | {100 * (1 - e / f) if f > 0 else 0:.1f}% | {float(np.mean(mass[k])):.3f} | "
              f"{8 * k + 4:,} |")


@command
def main(argv=None):
    args, _ = parse_checked(build_parser(), argv, TAKES_EFFECT, _check)
    from paddle_vha.train.run_lock import hold_lock

    lock = None
    if not args.only_measure:  # one writer per store: a second one would interleave its windows with the first's
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        lock = hold_lock(args.out + ".lock")
        if lock is None:
            fail(f"--out {args.out}: another store_teacher is writing it (it holds {args.out}.lock)")
    export = teacher_export(args)
    quiet()
    from tqdm import tqdm

    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.serve.session import ServeError, read_export_info
    from paddle_vha.train.stored_teacher import StoreError, write_windows

    try:
        info = read_export_info(export)
        teacher_fn = _logits_fn(OrtDecoder.from_dir(export, threads=args.threads))
        if args.top_k > info["vocab_size"]:
            fail(f"--top-k {args.top_k} exceeds the vocabulary ({info['vocab_size']})")
        if args.measure:
            measure(args, teacher_fn, info)
        if args.only_measure:
            return 0
        bar = tqdm(unit=" windows", disable=args.no_progress, file=sys.stderr)
        t0 = time.perf_counter()

        def progress(done, total):
            bar.total = total
            bar.n = done
            bar.refresh()

        meta = write_windows(args.out, args.data, args.seq_len, args.top_k, teacher_fn,
                             teacher=os.path.abspath(args.teacher), batch=args.batch, progress=progress,
                             vocab_size=info["vocab_size"])
        bar.close()
    except (ServeError, StoreError) as e:
        fail(str(e))
    dt = time.perf_counter() - t0
    os.remove(args.out + ".lock")  # the store is complete: a later run is refused by --out existing
    lock.close()
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print(f"wrote {args.out}: top-{meta['k']} of {meta['windows']:,} windows x {meta['seq_len']} = {meta['tokens']:,} "
          f"tokens, {size / 2**20:.1f} MiB ({size / meta['tokens']:.0f} bytes per token); {dt:.0f} s this run")
    return 0


def _exported(make):
    """make() (a float32 export), its ExportError as the tool's one-line failure."""
    from paddle_vha.export.errors import ExportError

    try:
        return make()
    except ExportError as e:
        fail(str(e))


if __name__ == "__main__":
    sys.exit(main())
