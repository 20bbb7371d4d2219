#!/usr/bin/env python
"""Time one decode step of a single attention layer: stock Qwen3 GQA vs MEA (after_hlc, before_hlc, multi-query form).

Each variant gets a cache of T tokens, then decodes one token; the median of --repeats steps is printed with the
cache bytes per token. CPU numbers say how the forms compare on this machine, not what a GPU kernel would do.

    bash tools/env.sh python tools/bench_mea_decode.py                        # 1.7B-like layer, T = 4096
    bash tools/env.sh python tools/bench_mea_decode.py --context 16384 --physical 2 --virtual 8
"""
from __future__ import annotations

import argparse
import sys
import time

from paddle_vha.cli import quiet


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16, help="query heads H")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--virtual", type=int, default=8, help="n_v virtual KV heads (= the stock layer's KV heads)")
    p.add_argument("--physical", type=int, default=2, help="n_p physical (cached) KV heads")
    p.add_argument("--context", type=int, default=4096, help="cached tokens T")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    if min(args.hidden, args.heads, args.head_dim, args.virtual, args.physical, args.context, args.batch, args.repeats) < 1:
        p.error("all sizes must be >= 1")
    if args.physical > args.virtual or args.heads % args.virtual or args.head_dim % 2:
        p.error("need physical <= virtual, heads divisible by virtual, even head-dim")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    quiet()
    import numpy as np
    import paddle
    from paddleformers.transformers import Qwen3Config
    from paddleformers.transformers.cache_utils import DynamicCache
    from paddleformers.transformers.qwen3.modeling import Qwen3Attention, Qwen3RotaryEmbedding

    from paddle_vha.mea.attention import Qwen3MEAAttention, use_multiquery_form
    from paddle_vha.mea.config import Qwen3MEAConfig

    common = dict(hidden_size=args.hidden, num_attention_heads=args.heads, head_dim=args.head_dim,
                  num_hidden_layers=1, max_position_embeddings=args.context + 8, intermediate_size=64, vocab_size=256)
    variants = [("stock GQA", Qwen3Config(num_key_value_heads=args.virtual, **common), Qwen3Attention, False)]
    for pos in ("after_hlc", "before_hlc"):
        cfg = Qwen3MEAConfig(num_key_value_heads=args.physical, mea_kv_heads=args.virtual, mea_group_norm=True,
                             mea_k_norm_position=pos, **common)
        variants.append((f"MEA {pos}", cfg, Qwen3MEAAttention, False))
    variants.append(("MEA multi-query", variants[-1][1], Qwen3MEAAttention, True))

    B, T = args.batch, args.context
    print(f"one decode step, B={B}, T={T} cached tokens, h={args.hidden}, H={args.heads}, d={args.head_dim}, "
          f"n_v={args.virtual}, n_p={args.physical}, fp32, {paddle.get_device()}")
    print(f"{'variant':<18} {'KV heads cached':>15} {'cache B/token':>14} {'ms/step':>9}")
    with paddle.no_grad():
        for label, cfg, cls, mq in variants:
            paddle.seed(0)
            attn = cls(cfg, 0)
            attn.eval()
            if mq:
                use_multiquery_form(attn)
            rotary = Qwen3RotaryEmbedding(cfg)
            x = paddle.randn([B, T, args.hidden])
            cache = DynamicCache()
            pos = paddle.arange(T, dtype="int64").expand([B, T])
            attn(x, position_embeddings=rotary(x, pos), past_key_values=cache, use_cache=True)  # prefill (causal by sdpa/eager)
            k = cache.layers[0].keys
            x1 = paddle.randn([B, 1, args.hidden])
            pe = rotary(x1, paddle.full([B, 1], T, dtype="int64"))
            times = []
            for _ in range(args.repeats):
                c = DynamicCache()
                c.update(cache.layers[0].keys, cache.layers[0].values, 0)
                t0 = time.perf_counter()
                attn(x1, position_embeddings=pe, past_key_values=c, use_cache=True)
                times.append(time.perf_counter() - t0)
            heads = k.shape[1]
            print(f"{label:<18} {heads:>15} {2 * heads * args.head_dim * 2:>14,} {1e3 * float(np.median(times)):>9.2f}")
    print("cache B/token: K and V of this layer in bf16. On Paddle CPU the direct forms run attention as per-head\n"
          "batched matmuls with one query row (slow there); the multi-query form is one GEMM over all heads.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
