"""GPU check of the fused VHA prologue's CUDA kernels, for a machine with PyTorch and nvcc but no Paddle.

    python tools/gpu_check.py                        # build, check, time; short table last (< 5 min)
    python tools/gpu_check.py --skip-timing          # correctness only
    python tools/gpu_check.py --tokens 4096,16384    # time only these token counts
    python tools/gpu_check.py --json PATH            # also write the results (default: $OUT/gpu_check.json if $OUT)
    python tools/gpu_check.py --selftest-table       # no GPU: the bytes model and table on made-up timings

STATUS: run on an NVIDIA H200 on 2026-12-04: correctness PASS, forward + backward 3.2-5.6x the composed chain, forward
at 35% of copy bandwidth (docs/prologue.md, "Measured on an H200").

1. Builds ops/csrc/cuda/c_api.cu (the extern "C" launcher over the same kernels the Paddle op uses)
   with nvcc for this GPU's architecture, and loads it with ctypes.
2. Forward and backward vs the float64 numpy oracle (prologue_check/oracle.py, which imports no Paddle) on
   adversarial shapes (S = 1 with a position offset, prime S, B > 1, r < d, H_kv = 1 / 2 / 3, d = 64 / 128),
   in float32, bfloat16, float16 and float64; in the low-precision dtypes the fused error must be at most
   2x the composed PyTorch chain's own error against float64 (plus one output ulp). The exit status is this
   check's (the speed targets below are reported, not enforced).
3. Times, at the 1.7B shape (B 1, H_p 8, H_kv 2, d = r = 128, bf16, [B, S, H, d] layout on both sides) for
   1 to 16K tokens: the fused forward, backward and forward + backward against the composed chain in PyTorch
   (composed_torch; its backward by torch.autograd.grad on given output gradients). Each function is warmed up
   outside capture, then 20 calls are captured into one torch.cuda.CUDAGraph and replayed back to back between
   CUDA events: per-call time = GPU time / calls, the median of several samples, host overhead excluded. If a
   capture fails, that function is timed by an event-timed loop of back-to-back eager calls instead (host
   overhead included) and the table's last column says so. Reports the fused forward's GB/s against this
   device's device-to-device copy bandwidth measured in the same run (bytes read + written, same method), and
   the fused backward's TFLOP/s on its 3 GEMMs; then the short table and one line per target (forward >= 75% of
   copy bandwidth at >= 4K tokens; forward + backward >= 2x faster than the composed chain).

The parts live in the package beside this file (tools/prologue_check/: launcher, accuracy, timing, roofline, and the
oracle the tests share); only the GPU path imports PyTorch, so --selftest-table runs anywhere numpy does.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from prologue_check.roofline import TOKENS, selftest_table, table_lines, target_lines

OUTPUTS = ["q", "k", "dq_phys", "dk", "dpremix", "dq_norm.w", "dk_norm.w"]


def parse_tokens(values) -> list:
    tokens = [int(x) for v in values for x in str(v).split(",") if x.strip()]
    if not tokens or min(tokens) < 1:
        raise ValueError(values)
    return tokens


def parse_args():
    """The command line, and the token counts to time."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-timing", action="store_true", help="correctness checks only")
    ap.add_argument("--tokens", nargs="+", default=None,
                    help=f"token counts to time, space- or comma-separated (default {','.join(map(str, TOKENS))})")
    ap.add_argument("--json", default=None, help="write the results here (default: $OUT/gpu_check.json if $OUT "
                                                 "is set, else not written)")
    ap.add_argument("--budget-s", type=float, default=280.0,
                    help="no new token count is timed after this many seconds from the start (default 280)")
    ap.add_argument("--selftest-table", action="store_true",
                    help="no GPU: print the table and target lines on made-up timings, then exit")
    args = ap.parse_args()
    try:
        tokens = parse_tokens(args.tokens) if args.tokens else TOKENS
    except ValueError:
        ap.error(f"--tokens wants positive integers, got {args.tokens}")
    return args, tokens


def write_json(json_path, ok, results, copy_gbps, copy_method, rows, targets, t_start):
    """The whole run as JSON (correctness rows, timings, targets)."""
    import torch

    Path(json_path).write_text(json.dumps(dict(
        ok=ok, device=torch.cuda.get_device_name(), torch=torch.__version__, check=results,
        copy_gbps=copy_gbps, copy_method=copy_method, timing=rows, targets=targets,
        elapsed_s=time.time() - t_start), indent=1, default=str))
    print(f"[json] {json_path}")


def print_worst(results, dtypes):
    """The worst fused / composed error ratio per dtype and output."""
    worst = {}
    for r in results:
        key = (r["dtype"], r["out"])
        worst[key] = max(worst.get(key, 0.0), r["fused"] / max(r["composed"], 1e-30))
    print("\nworst fused/composed error ratio per dtype and output (bound in bfloat16 / float16: 2, plus one ulp; "
          "float32 / float64: 4e-6 / 1e-11 relative):")
    for dt in dtypes:
        print(f"  {dt:9s} " + "  ".join(f"{o}={worst[(dt, o)]:.2f}" for o in OUTPUTS))


def main():
    args, tokens = parse_args()
    if args.selftest_table:
        return selftest_table(tokens)
    import tempfile

    import torch

    from prologue_check.accuracy import check
    from prologue_check.launcher import DTYPES, Fused, build_launcher
    from prologue_check.timing import timing

    t_start = time.time()
    print(f"[gpu] {torch.cuda.get_device_name()} capability {torch.cuda.get_device_capability()}, torch "
          f"{torch.__version__}", flush=True)
    fused = Fused(build_launcher(Path(tempfile.mkdtemp())))
    results = []
    ok = check(fused, results)
    rows, copy_gbps, copy_method = [], None, None
    if not args.skip_timing:
        rows, copy_gbps, copy_method = timing(fused, tokens, t_start + args.budget_s)
    targets = target_lines(rows) if rows else []
    json_path = args.json or (str(Path(os.environ["OUT"]) / "gpu_check.json") if os.environ.get("OUT") else None)
    if json_path:
        write_json(json_path, ok, results, copy_gbps, copy_method, rows, targets, t_start)
    print_worst(results, DTYPES)
    print(f"\nRESULT (correctness): {'PASS' if ok else 'FAIL'} ({time.time() - t_start:.0f} s)")
    if rows:
        print()
        for line in table_lines(rows, copy_gbps, copy_method) + [""] + targets:
            print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
