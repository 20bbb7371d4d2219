"""Training and serving FLOPs per token for MHA, GQA-n, MLA, VHA (as trained and as folded) and MEA.

MODEL is a named shape of the VHA paper (0.6b, 1.7b, 4b: Qwen3's shapes, shown as the paper's comparison set)
or a config.json / checkpoint folder (Qwen3, Qwen3-VHA, Qwen3-MEA, Qwen3-MoE, DeepSeek-style MLA).
Convention (the VHA article's, used to re-derive the paper's Table 5): matmul FLOPs, 2 per multiply-add, per
token at context S (attention 4·S·H·d per layer, no causal halving unless --causal), training = 3 × forward.
"Serving" is the forward pass of the model as deployed: VHA's folded GQA form (its Premix multiplied into q_proj).

    python tools/flops.py                          # 1.7B comparison, S = 4096
    python tools/flops.py 4b --breakdown           # per-part table
    python tools/flops.py 1.7b --intermediate-size 5504 --no-lm-head   # the paper's Table 5 totals (docs)
    python tools/flops.py configs/vha-1.7b.json --json
"""
from __future__ import annotations

import argparse
import sys


from paddle_vha.accounting import (
    ArchError,
    forward_flops_per_token,
    active_weights,
    model_weights,
    query_weights_per_layer,
    attention_weights_per_layer,
    is_named_shape,
    resolve_models,
)
from paddle_vha.cli import command, report_models
from paddle_vha.cli.options import ALWAYS, Effect, parse_checked

# --breakdown's columns around the K/V side (whose names come from the models: breakdown_columns)
QUERY_PARTS = ("q_proj", "q_a_proj", "q_b_proj", "premix")
LATER_PARTS = ("attention", "postmix", "gate_proj", "o_proj", "mlp", "lm_head")
SUMS = ("attention_block", "total")


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("models", nargs="*", default=["1.7b"], metavar="MODEL",
                   help="named shape (0.6b, 1.7b, 4b) or config.json / checkpoint folder (default 1.7b)")
    p.add_argument("--seq-len", type=int, default=4096, help="context S the attention term is counted at (default 4096)")
    p.add_argument("--causal", action="store_true", help="halve the attention term (average causal context S/2)")
    p.add_argument("--no-lm-head", action="store_true", help="leave out the output projection (the paper's Table 5 does)")
    p.add_argument("--intermediate-size", type=int, default=None, help="override the MLP width of every model")
    p.add_argument("--mea-kv-heads", type=int, default=2,
                   help="named shapes: cached KV heads n_p of the MEA row (its n_v is GQA-8's 8; default 2)")
    p.add_argument("--breakdown", action="store_true", help="also print per-part training GFLOPs")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return p


TAKES_EFFECT = {"MODEL": ALWAYS, "--seq-len": ALWAYS, "--causal": ALWAYS, "--no-lm-head": ALWAYS,
                "--intermediate-size": ALWAYS, "--json": ALWAYS,
                "--mea-kv-heads": Effect("with a named shape MODEL (0.6b, 1.7b, 4b): a config's MEA layers say theirs",
                                         lambda a: any(is_named_shape(m) for m in a.models)),
                "--breakdown": Effect("with the tables (--json prints every part already)", lambda a: not a.json)}


def _check_ranges(p, args) -> None:
    for name in ("seq_len", "mea_kv_heads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.intermediate_size is not None and args.intermediate_size < 1:
        p.error("--intermediate-size must be >= 1")


def parse_args(argv=None):
    args, _ = parse_checked(build_parser(), argv, TAKES_EFFECT, _check_ranges)
    return args


def g(x: float) -> float:
    return x / 1e9


def gf(x: float, width: int = 8, digits: int = 2) -> str:
    return f"{x:>{width}.{digits}f}"


def models_for(spec: str, args):
    over = {} if args.intermediate_size is None else {"intermediate_size": args.intermediate_size}
    return resolve_models(spec, mea_kv_heads=args.mea_kv_heads, **over)


def breakdown_columns(models, rows) -> list:
    """--breakdown's columns: the query side; what makes the cached keys and values (the models' K/V projections as
    their families' specs name them, then the other kinds' own parts: MLA's latent, MEA's head composition); then
    attention and what follows it."""
    present = dict.fromkeys(k for r in rows for k in r["training_parts"])
    kv = dict.fromkeys(n for m in models for n in m.kv_projections if n in present)
    kv.update(dict.fromkeys(k for k in present if k not in QUERY_PARTS + LATER_PARTS + SUMS))
    return [c for c in QUERY_PARTS if c in present] + list(kv) + [c for c in LATER_PARTS if c in present]


def rows_for(spec: str, args):
    models = models_for(spec, args)
    kw = dict(seq_len=args.seq_len, causal=args.causal, lm_head=not args.no_lm_head)
    ref = next((m for m in models if m.label == "GQA-8"), models[0])
    ref_fwd = forward_flops_per_token(ref, **kw)
    rows = []
    for m in models:
        fwd = forward_flops_per_token(m, **kw)
        served = m.cost.served_as(m) or m  # VHA: the folded stock model it is served as
        serve = forward_flops_per_token(served, **kw)
        rows.append(dict(
            model=spec, variant=m.label, kind=m.kind, reference=ref.label,
            query_weights_per_layer=query_weights_per_layer(m),
            query_weights_per_layer_served=query_weights_per_layer(served),
            attention_weights_per_layer=attention_weights_per_layer(m)["total"],
            model_weights=model_weights(m)["total"],
            active_weights=active_weights(m)["total"],
            forward_gflops=g(fwd["total"]), training_gflops=g(3 * fwd["total"]),
            training_delta_gflops=g(3 * (ref_fwd["total"] - fwd["total"])),
            training_saving=(ref_fwd["total"] - fwd["total"]) / ref_fwd["total"],
            serving_gflops=g(serve["total"]),
            serving_saving=(ref_fwd["total"] - serve["total"]) / ref_fwd["total"],
            training_parts={k: g(3 * v) for k, v in fwd.items()},
        ))
    return rows


def print_tables(spec, rows, args):
    w = max(22, *(len(r['variant']) for r in rows))
    conv = (f"S = {args.seq_len:,}{' causal' if args.causal else ''}, training = 3 x forward"
            f"{', no LM head' if args.no_lm_head else ''}")
    print(f"\n{spec}: GFLOPs per token ({conv}); deltas and savings vs {rows[0]['reference']}")
    hdr = (f"{'variant':<{w}} {'q weights/layer':>15} {'served':>10} {'train':>8} {'Δ train':>8} {'saving':>7} "
           f"{'serve fwd':>9} {'saving':>7}")
    print(hdr)
    print("-" * len(hdr))
    dg = 2 if max(r["training_gflops"] for r in rows) >= 1 else 4  # more digits for tiny models
    for r in rows:
        print(f"{r['variant']:<{w}} {r['query_weights_per_layer']:>15,} {r['query_weights_per_layer_served']:>10,} "
              f"{gf(r['training_gflops'], 8, dg)} {gf(r['training_delta_gflops'], 8, dg)} {r['training_saving']:>7.1%} "
              f"{gf(r['serving_gflops'], 9, dg)} {r['serving_saving']:>7.1%}")
    by_label = {r["variant"]: r for r in rows}
    vha, ref = by_label.get("VHA (trained)"), by_label.get("GQA-8")
    if vha and ref:  # the article's decomposition of VHA's training saving
        p, q = vha["training_parts"], ref["training_parts"]
        dq, dkv = q["q_proj"] - p["q_proj"], q["k_proj"] + q["v_proj"] - p["k_proj"] - p["v_proj"]
        add = p.get("premix", 0) + p.get("postmix", 0)
        print(f"VHA vs GQA-8, training: q_proj halving saves {dq:.3f} G, K/V 8 -> 2 heads saves {dkv:.3f} G, "
              f"Premix + Postmix add {add:.3f} G: net {dq + dkv - add:.3f} G per token "
              f"(K/V share of the gross saving {dkv / (dq + dkv):.0%}).")
        print(f"Served folded, the forward saving is the K/V share only: "
              f"{ref['forward_gflops'] - vha['serving_gflops']:.3f} of {ref['forward_gflops']:.2f} G "
              f"({vha['serving_saving']:.1%}).")
    for r in rows:
        if r["active_weights"] != r["model_weights"]:  # MoE: FLOPs above count the routed experts a token uses
            print(f"{r['variant']}: weights {r['model_weights'] / 1e9:.2f} B in all, {r['active_weights'] / 1e9:.2f} B "
                  "active per token (attention, router, the top-k experts, embeddings); the MLP FLOPs above are "
                  "the active experts'")
    if any(r["kind"] == "mla" for r in rows):
        print("note: MLA counted un-absorbed, DeepSeek-V2 style: latent 512, RoPE key 64, nope/value widths = head_dim, "
              "no query LoRA (assumptions; the paper does not state them).")
    if args.breakdown:
        cols = breakdown_columns(models_for(spec, args), rows)
        print(f"\ntraining GFLOPs per token by part ({spec})")
        hdr = f"{'variant':<{w}} " + " ".join(f"{c:>9}" for c in cols) + f" {'total':>9}"
        print(hdr)
        print("-" * len(hdr))
        for r in rows:
            parts = r["training_parts"]
            print(f"{r['variant']:<{w}} " + " ".join(f"{parts.get(c, 0):>9.3f}" for c in cols) + f" {parts['total']:>9.3f}")


@command
def main(argv=None):
    args = parse_args(argv)
    return report_models(args.models, lambda spec: rows_for(spec, args), lambda spec, rows: print_tables(spec, rows, args),
                         args.json, ArchError)


if __name__ == "__main__":
    sys.exit(main())
