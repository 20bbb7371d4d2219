"""Quick-start: train a small Qwen3-VHA next to the same-size GQA-8, then fold, export and generate.

The pipeline train -> fold -> export -> serve, end to end on an embedded corpus:
  1. train: both models (same hidden size, layers, 16 query heads; GQA-8 has 8 KV heads, VHA has 2 KV heads and
     8 physical query heads), a few dozen AdamW steps each on byte-level Python standard-library source with the
     same batches; prints loss, parameter counts and KV-cache bytes per token side by side. -> OUT/vha
  2. fold: the VHA checkpoint into a stock Qwen3 GQA-2 checkpoint (tools/fold.py's code), checked in Paddle. -> OUT/folded
  3. export: an ONNX decoder with KV cache (tools/export_onnx.py's code), self-validated. -> OUT/onnx
  4. serve: generate a few lines with onnxruntime from the exported model; prints tokens/s.
  5. demo: the same fold -> export -> generate on assets/demo-vha, a Qwen3-VHA of the same shape trained for about an
     hour by `python tools/train.py configs/demo-vha.json` (how is in assets/demo-vha/demo_info.json), sampling with
     temperature and top-p: what the pipeline gives once a model has learned something. 40 steps do not get there.

    bash tools/env.sh python tools/quickstart.py            # defaults: 40 steps, ~1 minute on 2 cores
    bash tools/env.sh python tools/quickstart.py --steps 200 --out runs/longer
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from paddle_vha.cli import command, fail, quiet

from .toy import toy_fields


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per model (default 40)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--val-batches", type=int, default=8)
    p.add_argument("--corpus-mb", type=float, default=8.0, help="MB of standard-library source to read")
    p.add_argument("--out", default="runs/quickstart", help="where the VHA checkpoint goes (OUT/vha)")
    p.add_argument("--no-baseline", action="store_true", help="train only the VHA model")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-deploy", action="store_true", help="stop after training (skip fold, export, generate)")
    p.add_argument("--gen-tokens", type=int, default=48, help="new tokens per generated line (default 48)")
    p.add_argument("--no-demo", action="store_true", help="skip the demo checkpoint (assets/demo-vha) stage")
    p.add_argument("--demo-tokens", type=int, default=160, help="new bytes per demo sample (default 160)")
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "seq_len", "hidden_size", "layers", "head_dim", "val_batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.head_dim % 2:
        p.error("--head-dim must be even (RoPE)")
    return args


def build_configs(args):
    """GQA-8 and VHA (2 KV heads, Postmix rank 4) of the same shape; the MLP is configs/demo-vha.json's 8/3 x hidden."""
    from paddleformers.transformers import Qwen3Config

    from paddle_vha import Qwen3VHAConfig

    fields = lambda kv: toy_fields(args.hidden_size, args.layers, args.head_dim, 16, kv, args.seq_len,  # noqa: E731
                                   intermediate=int(args.hidden_size * 8 / 3) // 16 * 16, min_positions=512)
    return Qwen3Config(**fields(8)), Qwen3VHAConfig(vha_postmix_rank=4, **fields(2))


def train_both(args, corpus) -> list:
    """GQA-8 (unless --no-baseline) and VHA trained on the same batches; one row of numbers per model. The trained VHA
    is saved to OUT/vha."""
    import paddle
    from paddleformers.transformers import Qwen3ForCausalLM

    from paddle_vha import Qwen3VHAForCausalLM
    from paddle_vha.accounting import arch_from_config, attention_parameters_per_layer, kv_bytes_per_token
    from paddle_vha.checkpoint.folder import save_pretrained_atomic
    from paddle_vha.train.loop import TrainSettings, train_lm

    gqa8_cfg, vha_cfg = build_configs(args)
    rows = []
    for label, cfg, cls in (("GQA-8", gqa8_cfg, Qwen3ForCausalLM), ("VHA (GQA-2)", vha_cfg, Qwen3VHAForCausalLM)):
        if args.no_baseline and cls is Qwen3ForCausalLM:
            continue
        paddle.seed(args.seed)
        model = cls(cfg)
        try:
            out = train_lm(model, corpus, TrainSettings(steps=args.steps, batch_size=args.batch_size,
                                                       seq_len=args.seq_len, lr=args.lr, data_seed=args.seed,
                                                       val_batches=args.val_batches, progress=not args.no_progress,
                                                       label=f"train {label}"))
        except ValueError as e:  # e.g. a corpus too small for the sequence length (--corpus-mb)
            fail(f"{e} (raise --corpus-mb or lower --seq-len)")
        res = dict(first=out.first, last=out.last, val=out.val_loss, seconds=out.seconds)
        arch = arch_from_config(cfg.to_dict(), label=label)
        res.update(label=label, cfg=cfg, params=int(sum(p.size for p in model.parameters())),
                   attn=attention_parameters_per_layer(arch)["total"], kv_layer=int(kv_bytes_per_token(arch, 2)),
                   kv_all=int(kv_bytes_per_token(arch, 2, all_layers=True)))
        rows.append(res)
        if cls is Qwen3VHAForCausalLM:
            dest = os.path.join(args.out, "vha")
            save_pretrained_atomic(model, dest)
            print(f"saved the trained Qwen3-VHA checkpoint to {dest}")
    return rows


def print_comparison(args, rows) -> None:
    """The side-by-side table: KV heads, parameters, KV-cache bytes per token, losses, time per step."""
    print(f"\n{args.steps} AdamW steps, batch {args.batch_size} x {args.seq_len} bytes, lr {args.lr}, seed {args.seed}; "
          f"hidden {args.hidden_size}, {args.layers} layers, head_dim {args.head_dim}, 16 (virtual) query heads")
    hdr = f"{'model':<12} {'KV heads':>8} {'params':>10} {'attn/layer':>11} {'KV B/tok/layer':>15} {'KV B/tok':>9} " \
          f"{'train loss':>15} {'val loss':>9} {'s/step':>7}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['label']:<12} {r['cfg'].num_key_value_heads:>8} {r['params']:>10,} {r['attn']:>11,} {r['kv_layer']:>15,} "
              f"{r['kv_all']:>9,} {r['first']:>6.3f} -> {r['last']:<6.3f} {r['val']:>9.3f} {r['seconds'] / args.steps:>7.3f}")
    if len(rows) == 2:
        print(f"\nKV cache per token (bf16): GQA-8 {rows[0]['kv_all']:,} B vs VHA {rows[1]['kv_all']:,} B "
              f"= {rows[0]['kv_all'] / rows[1]['kv_all']:.1f}x smaller; "
              f"VHA has {rows[1]['params'] / rows[0]['params']:.1%} of GQA-8's parameters")


@command
def main(argv=None):
    args = parse_args(argv)
    quiet()
    from paddle_vha.train.corpus import load_stdlib_corpus

    corpus = load_stdlib_corpus(max_bytes=int(args.corpus_mb * (1 << 20)))
    print(f"corpus: {corpus.n_files} standard-library .py files from {corpus.root}: "
          f"{len(corpus.train):,} train / {len(corpus.val):,} validation byte tokens")
    print_comparison(args, train_both(args, corpus))
    if not args.no_deploy:
        from paddle_vha.checkpoint.contract import CheckpointError
        from paddle_vha.export.onnx_export import ExportError

        try:
            deploy(os.path.join(args.out, "vha"), args)
            if not args.no_demo:
                demo(args)
        except (CheckpointError, ExportError) as e:  # e.g. an output folder an older version wrote, without marker
            fail(str(e))
    return 0


# The checkout this file sits in (tools/experiments/quickstart.py): the demo checkpoint is part of it, not of the wheel.
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO_DIR = os.path.join(CHECKOUT, "assets", "demo-vha")
DEMO_PROMPTS = ("def ", "class ", "    if ", "    def __init__(self")


def demo(args, demo_dir: str = DEMO_DIR):
    """fold -> export -> sample from the demo checkpoint kept in the checkout's assets/ (one line and nothing else
    when it is not there)."""
    import json

    from paddle_vha.export.onnx_export import export_onnx
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.train.corpus import decode, encode
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold

    if not os.path.isdir(demo_dir):
        print(f"\ndemo: {demo_dir} not found (it ships in the repository's assets/); skipped")
        return
    info = json.load(open(os.path.join(demo_dir, "demo_info.json")))
    print(f"\ndemo: {demo_dir}: a Qwen3-VHA of this shape trained by `{info['command']}`: {info['steps']:,} steps x "
          f"{info['tokens_per_step']:,} bytes ({info['tokens'] / 1e6:.1f} M bytes of standard-library source, "
          f"{info['minutes']:.0f} min on {info['machine']}), validation loss {info['val_loss']:.3f} nats/byte")
    folded, onnx_dir = os.path.join(args.out, "demo-folded"), os.path.join(args.out, "demo-onnx")
    fold_checkpoint(plan_fold(demo_dir, folded, force=True), progress=False)
    export_onnx(folded, onnx_dir, force=True, log=lambda m: None)
    print(f"  folded -> {folded}, exported -> {onnx_dir} (self-validated)")
    session = OrtDecoder.from_dir(onnx_dir)
    print(f"  onnxruntime, sampled (temperature 0.8, top-p 0.95, seed {args.seed}), {args.demo_tokens} new bytes each:")
    for prompt in DEMO_PROMPTS:
        res = generate(session, encode(prompt)[None], args.demo_tokens, do_sample=True, temperature=0.8, top_p=0.95,
                       seed=args.seed)
        text = prompt + decode(res.tokens[0])
        print("  ----- prompt " + repr(prompt))
        for line in text.splitlines():
            print("  | " + line)


def deploy(vha_dir, args):
    """fold -> verify -> export (self-validating) -> generate with onnxruntime."""
    from paddle_vha.train.corpus import decode, encode
    from paddle_vha.export.onnx_export import export_onnx
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold, verify_fold
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.ort_session import OrtDecoder

    folded, onnx_dir = os.path.join(args.out, "folded"), os.path.join(args.out, "onnx")
    print(f"\nfold: {vha_dir} -> {folded} (stock Qwen3, 16 query heads, 2 KV heads)")
    fold_checkpoint(plan_fold(vha_dir, folded, force=True), progress=not args.no_progress)
    v = verify_fold(vha_dir, folded, num_sequences=4, seq_len=64, seed=args.seed)
    print(f"fold parity (Paddle fp32, 4 x 64 tokens): VHA vs folded logits max abs diff {v['max_abs']:.2e}, "
          f"max rel {v['max_rel']:.2e}, mean KL {v['mean_kl']:.2e}")
    print(f"export: {folded} -> {onnx_dir}")
    export_onnx(folded, onnx_dir, force=True, log=lambda m: print("  " + m))
    session = OrtDecoder.from_dir(onnx_dir)
    prompts = ["def ", "import ", "class Test", "    return "]
    width = max(len(x) for x in prompts)
    ids = np.array([[0] * (width - len(x)) + encode(x).tolist() for x in prompts], np.int64)  # left padding
    mask = np.array([[0] * (width - len(x)) + [1] * len(x) for x in prompts], np.int64)
    res = generate(session, ids, args.gen_tokens, attention_mask=mask)
    print(f"generate (onnxruntime, greedy, {len(prompts)} prompts x {args.gen_tokens} new bytes):")
    for prompt, toks in zip(prompts, res.tokens):
        print("  " + repr(prompt + decode(toks)))
    print(f"onnxruntime: prefill {res.prefill_seconds * 1e3:.1f} ms, decode {res.tokens_per_second:.0f} tokens/s "
          f"(batch {len(prompts)})")


if __name__ == "__main__":
    sys.exit(main())
