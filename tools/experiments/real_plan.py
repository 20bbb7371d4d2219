"""What the real-model study (real_model_study.py) runs, as data its report and cost phase read too: the arms' names,
the keys its journal files measurements under, the healing plan, the KV bytes of a folder. A leaf module: it imports
nothing of the study, so real_model_study, real_cost and real_report all import it and not each other."""
from __future__ import annotations

import json
import os

ORIGINAL, FINETUNED = "original", "original fine-tuned"
STARTS = ["MQA mean-pool", "MEA", "VHA mean", "VHA svd", "VHA calibrated", "VHA refined"]
LOSSES = ["ce", "kd"]
PHASES = ["step0", "heal", "cost", "report"]
CHEAP = ("MQA mean-pool", "MEA", "VHA mean", "VHA svd")  # built in seconds: not kept on the (shared) disk


def eval_key(args) -> dict:
    return dict(eval_windows=args.eval_windows, seq_len=args.seq_len, cloze=args.cloze_items,
                cloze_context=args.cloze_context, chat_new=args.chat_new, kv=args.kv_heads,
                calib=args.calib_tokens, refine=[args.refine_steps, args.refine_tokens, args.refine_len])


def train_key(args) -> dict:
    return dict(eval_key(args), lr=args.lr, warmup=args.warmup, batch=args.batch_size, eval_every=args.eval_every)


def kv_bytes_per_token(folder) -> int:
    """Cache bytes per token in 16-bit values: layers x 2 (K, V) x KV heads x head_dim x 2 B (MEA: its physical heads,
    what its serving form caches)."""
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * head_dim * 2


def heal_plan(args, s0) -> list:
    """[(start, loss, seed, steps, trainable)] in the order they run: the best starts first (full length), the
    fine-tuned control, the other starts (short), the extra seeds of the best, the attention-only run."""
    ranked = sorted(args.starts, key=lambda n: s0[n]["metrics"]["kl"] if n in s0 else float("inf"))
    full = ranked[:args.full]
    plan = [(n, l, args.seeds[0], args.heal_steps, "all") for n in full for l in args.losses]
    plan.append((ORIGINAL, "ce", args.seeds[0], args.finetune_steps or args.heal_steps, "all"))
    plan += [(n, l, args.seeds[0], args.short_steps, "all") for n in ranked[args.full:] for l in args.losses]
    for seed in args.seeds[1:]:
        plan += [(n, l, seed, args.heal_steps if n in full else args.short_steps, "all")
                 for n in ranked[:args.best] for l in args.losses]
    attn = ranked[0] if args.attn_only_start == "best" else args.attn_only_start
    if attn != "none" and attn in s0:
        plan.append((attn, "kd", args.seeds[0], args.heal_steps if attn in full else args.short_steps, "attention"))
    return plan
