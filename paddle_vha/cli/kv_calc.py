"""KV-cache bytes per token for MHA, GQA-n, MLA, VHA (as trained and as folded) and MEA, with sliding-window layers.

MODEL is a named shape of the VHA paper (0.6b, 1.7b, 4b: Qwen3's shapes, shown as the paper's comparison set)
or a config.json / checkpoint folder (Qwen3, Qwen3-VHA, Qwen3-MEA, Qwen3-MoE, DeepSeek-style MLA).
Bytes use 1024-based units, as the VHA article does (4096 B = 4 KB).

    python tools/kv_calc.py                         # the 1.7B comparison in bf16
    python tools/kv_calc.py 4b --dtype fp8 --context 131072 --batch 8
    python tools/kv_calc.py runs/quickstart/vha     # a trained checkpoint
    python tools/kv_calc.py 1.7b --json             # machine-readable
"""
from __future__ import annotations

import argparse
import sys


from paddle_vha.accounting import (DTYPE_BYTES, ArchError, fmt_bytes, is_named_shape, kv_bytes_per_token,
                                   kv_cache_bytes, resolve_models)
from paddle_vha.cli import command, report_models
from paddle_vha.cli.options import ALWAYS, Effect, parse_checked


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("models", nargs="*", default=["1.7b"], metavar="MODEL",
                   help="named shape (0.6b, 1.7b, 4b) or config.json / checkpoint folder (default 1.7b)")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_BYTES), metavar="DTYPE",
                   help="cache element type: " + ", ".join(sorted(DTYPE_BYTES)) + " (default bf16)")
    p.add_argument("--context", type=int, default=4096, help="tokens per sequence for the total (default 4096)")
    p.add_argument("--batch", type=int, default=1, help="sequences for the total (default 1)")
    p.add_argument("--mea-kv-heads", type=int, default=2,
                   help="named shapes: cached KV heads n_p of the MEA row (its n_v is GQA-8's 8; default 2)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


TAKES_EFFECT = {"MODEL": ALWAYS, "--dtype": ALWAYS, "--context": ALWAYS, "--batch": ALWAYS, "--json": ALWAYS,
                "--mea-kv-heads": Effect("with a named shape MODEL (0.6b, 1.7b, 4b): a config's MEA layers say theirs",
                                         lambda a: any(is_named_shape(m) for m in a.models))}


def _check_ranges(p, args) -> None:
    for name in ("context", "batch", "mea_kv_heads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")


def parse_args(argv=None):
    args, _ = parse_checked(build_parser(), argv, TAKES_EFFECT, _check_ranges)
    return args


def rows_for(spec: str, args):
    elem = DTYPE_BYTES[args.dtype]
    models = resolve_models(spec, mea_kv_heads=args.mea_kv_heads)
    ref = next((m for m in models if m.label == "GQA-8"), models[0])
    ref_bytes = kv_bytes_per_token(ref, elem)
    rows = []
    for m in models:
        per_layer = kv_bytes_per_token(m, elem)
        all_layers = kv_bytes_per_token(m, elem, all_layers=True)
        cached = m.cost.cache_description(m)
        rows.append(dict(model=spec, variant=m.label, kind=m.kind, cached=cached, query_heads=m.num_heads,
                         group_size=m.group_size, layers=m.num_layers, bytes_per_token_per_layer=per_layer,
                         bytes_per_token=all_layers, total_bytes=kv_cache_bytes(m, args.context, elem) * args.batch,
                         vs_reference=per_layer / ref_bytes, reference=ref.label,
                         window_layers=m.num_window_layers, sliding_window=m.sliding_window))
    return rows


def print_table(spec, rows, args):
    w = max(22, *(len(r['variant']) for r in rows))
    print(f"\n{spec}: KV cache in {args.dtype}; total for {args.batch} x {args.context:,} tokens; "
          f"ratio vs {rows[0]['reference']} per layer")
    hdr = (f"{'variant':<{w}} {'cache holds':<32} {'q heads':>7} {'group':>5} {'B/tok/layer':>11} {'per layer':>9} "
           f"{'per token':>10} {'total':>10} {'ratio':>6}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['variant']:<{w}} {r['cached']:<32} {r['query_heads']:>7} {r['group_size']:>5} "
              f"{r['bytes_per_token_per_layer']:>11,.0f} {fmt_bytes(r['bytes_per_token_per_layer']):>9} "
              f"{fmt_bytes(r['bytes_per_token']):>10} {fmt_bytes(r['total_bytes']):>10} {r['vs_reference']:>6.3f}")
    notes = []
    if any(r["kind"] == "mla" for r in rows):
        notes.append("MLA caches its 512-wide latent plus a 64-wide decoupled RoPE key (the article's assumption).")
    if any(r["kind"] == "mea" for r in rows):
        notes.append("MEA: per-layer figure is an MEA layer's; layers outside mea_layers cache n_v heads.")
    for r in rows:
        if r["window_layers"]:
            notes.append(f"{r['variant']}: {r['window_layers']} of {r['layers']} layers use a sliding window of "
                         f"{r['sliding_window']:,} and hold at most {r['sliding_window'] - 1:,} positions; 'per layer' "
                         "is a full layer's, 'per token' counts every layer up to the window, 'total' caps the window "
                         "layers.")
    for n in notes:
        print(f"note: {n}")


@command
def main(argv=None):
    args = parse_args(argv)
    return report_models(args.models, lambda spec: rows_for(spec, args), lambda spec, rows: print_table(spec, rows, args),
                         args.json, ArchError)


if __name__ == "__main__":
    sys.exit(main())
