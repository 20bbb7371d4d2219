#!/usr/bin/env python
"""Where a healing step's time goes on this CPU: a checkpoint (the student) trained for a few steps of --batch x
--seq-len random tokens, each step timed by phase (forward with the loss, backward, optimizer) and, under Paddle's
profiler, by operator (forward ops and their gradient nodes separately), for each variant asked:

    ce              the student's own cross-entropy, every weight trained (what tools/train.py does by default)
    stored-kd       + the KL against a stored teacher's top-K (random stand-in values of the same shape: the cost)
    attention       ce, only the self-attention blocks trained (train_only attention)
    frozen-embed    ce, the embedding table / tied LM head frozen (freeze_embeddings)
    attention+frozen-embed
    ce-pow          ce with PaddleFormers' own RMSNorm (x.pow(2)); every other variant runs the training room's
                    (paddle.square, paddle_vha/train/square_norm.py), so ce-pow vs ce is that cut, side by side

Tokens per second are --batch x --seq-len over the mean step (after --warmup steps), side by side in one run; the
machine line first (machines here differ). Threads: Paddle's CPU threads are --threads (default: the cores this
process may use).

    python tools/profile_heal_step.py runs/smol-vha                       # every variant, 3 steps each
    python tools/profile_heal_step.py runs/smol-vha --variants ce attention --steps 4 --ops 15
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import time

import numpy as np

VARIANTS = ("ce", "stored-kd", "attention", "frozen-embed", "attention+frozen-embed", "ce-pow")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="the student checkpoint folder (any registered family)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant (default 3)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--top-k", type=int, default=64, help="stored-kd: the stored K (default 64)")
    p.add_argument("--ops", type=int, default=12, help="operator rows printed per variant (default 12; 0: none)")
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args(argv)
    for name in ("batch", "seq_len", "steps", "top_k"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not os.path.isdir(args.checkpoint):
        p.error(f"{args.checkpoint}: no such folder")
    return args


def op_table(text: str, rows: int):
    """(name, calls, total ms) of the profiler's operator summary, largest first."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^(\S.*?)\s{2,}(\d+)\s+([\d.]+) / ", line)
        if m and not line.startswith(("Name", "-")):
            out.append((m.group(1).strip(), int(m.group(2)), float(m.group(3))))
    seen, uniq = set(), []
    for r in sorted(out, key=lambda r: -r[2]):
        if r[0] not in seen:
            seen.add(r[0])
            uniq.append(r)
    return uniq[:rows]


def run_variant(model_path, variant, args, rng):
    import paddle
    import paddle.profiler as profiler

    from paddle_vha.families import load_float32_model
    from paddle_vha.train.stored_teacher import stored_kl
    from paddle_vha.train.trainable import apply_trainable

    paddle.seed(0)
    model, cfg = load_float32_model(model_path)
    if variant != "ce-pow":
        from paddle_vha.train.square_norm import use_square_norms

        use_square_norms(model)  # as the training room builds it (paddle_vha/train/model_build.py)
    train_only = "attention" if variant.startswith("attention") else "all"
    n, total = apply_trainable(model, train_only, freeze_embeddings=variant.endswith("frozen-embed"))
    model.train()
    opt = paddle.optimizer.AdamW(learning_rate=1e-5, parameters=[p for p in model.parameters() if not p.stop_gradient])
    B, S, V = args.batch, args.seq_len, cfg.vocab_size
    x = paddle.to_tensor(rng.integers(0, V, (B, S)), dtype="int64")
    y = paddle.to_tensor(rng.integers(0, V, (B, S)), dtype="int64")
    k = args.top_k
    ids = paddle.to_tensor(rng.integers(0, V, (B, S, k)), dtype="int64")
    logp = paddle.to_tensor(np.log(np.full((B, S, k), 0.9 / k, np.float32)))
    rest = paddle.to_tensor(np.full((B, S), np.log(0.1), np.float32))
    phases = {"forward + loss": [], "backward": [], "optimizer": []}

    def step(record: bool):
        t0 = time.perf_counter()
        out = model(input_ids=x, labels=y, return_dict=True)
        loss = out.loss
        if variant == "stored-kd":
            loss = loss + stored_kl(out.logits, ids, logp, rest)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.clear_grad()
        t3 = time.perf_counter()
        if record:
            for name, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2)):
                phases[name].append(dt)

    for _ in range(args.warmup):
        step(False)
    for _ in range(args.steps):
        step(True)
    table = []
    if args.ops:
        prof = profiler.Profiler(targets=[profiler.ProfilerTarget.CPU], on_trace_ready=lambda p: None)  # no trace files
        prof.start()
        step(False)
        prof.step()
        prof.stop()
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            prof.summary(sorted_by=profiler.SortedKeys.CPUTotal, op_detail=False, thread_sep=False, time_unit="ms")
        text = buf.getvalue()
        text = text[text.find("Operator Summary"):] if "Operator Summary" in text else text
        table = op_table(text, args.ops)
    mean = {k: float(np.mean(v)) for k, v in phases.items()}
    return dict(variant=variant, trainable=n, total=total, phases=mean, step=sum(mean.values()),
                tokens_per_second=B * S / sum(mean.values()), ops=table)


def main(argv=None) -> int:
    args = parse_args(argv)
    from paddle_vha.cli import quiet
    from paddle_vha.machine import cpu_line

    quiet()
    import paddle

    if args.threads:
        paddle.set_num_threads(args.threads) if hasattr(paddle, "set_num_threads") else None
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    print(cpu_line())
    print(f"student {args.checkpoint}; batch {args.batch} x {args.seq_len} tokens; {args.steps} timed steps after "
          f"{args.warmup} warm-up per variant; float32")
    rng = np.random.default_rng(0)
    results = [run_variant(args.checkpoint, v, args, rng) for v in args.variants]
    base = results[0]["tokens_per_second"]
    print("\n| variant | trainable weights | forward + loss s | backward s | optimizer s | step s | tokens/s | vs "
          f"{results[0]['variant']} |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        ph = r["phases"]
        print(f"| {r['variant']} | {r['trainable']:,} of {r['total']:,} | {ph['forward + loss']:.2f} | "
              f"{ph['backward']:.2f} | {ph['optimizer']:.2f} | {r['step']:.2f} | {r['tokens_per_second']:.1f} | "
              f"{r['tokens_per_second'] / base:.2f}x |")
    for r in results:
        if r["ops"]:
            tot = sum(t for _, _, t in r["ops"])
            print(f"\n{r['variant']}: the largest operators of one profiled step (forward ops, and their gradient "
                  "nodes: ...GradNode)")
            print("| operator | calls | ms | share of these rows |")
            print("| --- | ---: | ---: | ---: |")
            for name, calls, t in r["ops"]:
                print(f"| {name} | {calls} | {t:.1f} | {100 * t / tot:.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
