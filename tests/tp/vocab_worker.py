"""One rank of the vocabulary-parallel check (launched by tests/test_vocab_parallel.py).

    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir DIR tests/tp/vocab_worker.py --out OUT

Every rank builds the single-device Qwen3-VHA model (tiny, vocabulary 96) and a copy sharded by paddle_vha.parallel
with vocab_parallel=True, tied and untied, with PaddleFormers' tensor_parallel_output True (this rank's logits, the
parallel cross-entropy) and False (whole logits, the ordinary one), in float32 and float64, labels partly -100. It
reports the worst relative error of the loss, the (gathered) logits and every gradient against the single-device
model, and whether the tied head is still the embedding's parameter. Then the master-gradient order: PaddleFormers'
MixPrecisionLayer (amp_master_grad's hook, fp32 main_grad) wrapped around the sharded float32 model must give the
single-device gradients in main_grad, and wrapping before sharding is refused. Results: OUT/rank{k}.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from paddle_vha.cli import quiet  # noqa: E402

quiet()

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from _utils import TINY  # noqa: E402


def rel(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def np_(t):
    return t.detach().astype("float64").numpy()


def pair(dtype, tied, tp_output):
    """(single-device model, its vocab-parallel copy) with the same weights."""
    from paddle_vha import Qwen3VHAConfig, Qwen3VHAForCausalLM
    from paddle_vha.parallel import parallelize_model

    paddle.set_default_dtype(dtype)
    paddle.seed(1)
    fields = {**TINY, "vocab_size": 96, "num_attention_heads": 8, "tie_word_embeddings": tied,
              "vha_fused_prologue": False}
    ref = Qwen3VHAForCausalLM(Qwen3VHAConfig(**fields))
    cfg = Qwen3VHAConfig(**fields)
    cfg.tensor_parallel_output = tp_output
    tp = Qwen3VHAForCausalLM(cfg)
    tp.set_state_dict({k: v.clone() for k, v in ref.state_dict().items()})
    return ref, tp, parallelize_model(tp, vocab_parallel=True)


def batch():
    ids = paddle.to_tensor(np.random.RandomState(3).randint(0, 96, size=(2, 9)).astype("int64"))
    labels = ids.clone()
    labels[0, :3] = -100
    return ids, labels


def gathered(model, state, attr):
    """{name: the whole tensor} of every parameter's `attr` ("grad", "main_grad"), split ones all-gathered."""
    out = {}
    for name, p in model.named_parameters():
        x = getattr(p, attr)
        if state.shard(name).axis is not None:
            parts = []
            dist.all_gather(parts, x.contiguous(), group=state.group)
            x = paddle.concat(parts, axis=state.shard(name).axis)
        out[name] = np_(x)
    return out


def exactness(dtype, tied, tp_output) -> dict:
    ref, tp, state = pair(dtype, tied, tp_output)
    ids, labels = batch()
    o_ref, o_tp = ref(ids, labels=labels, return_dict=True), tp(ids, labels=labels, return_dict=True)
    o_ref.loss.backward()
    o_tp.loss.backward()
    g_ref = {n: np_(p.grad) for n, p in ref.named_parameters()}
    g_tp = gathered(tp, state, "grad")
    res = {"loss": rel([float(o_tp.loss)], [float(o_ref.loss)]), "logits_width": o_tp.logits.shape[-1],
           "grads": max(rel(g_tp[n], g_ref[n]) for n in g_ref),
           "embedding_grad": rel(g_tp["model.embed_tokens.weight"], g_ref["model.embed_tokens.weight"]),
           "embedding_rows": tp.model.embed_tokens.weight.shape[0],
           "tied_kept": tp.lm_head.weight is tp.model.embed_tokens.weight}
    if not tp_output:
        res["logits"] = rel(np_(o_tp.logits), np_(o_ref.logits))
    return res


def master_grad() -> dict:
    from paddle.distributed.fleet.utils import mix_precision_utils

    ref, tp, state = pair("float32", True, True)
    mix_precision_utils.MixPrecisionLayer(tp, dtype="bfloat16")  # what the Trainer does with amp_master_grad
    ids, labels = batch()
    for _ in range(2):  # two micro-batches: the hook accumulates into main_grad and asserts grad is None each time
        ref(ids, labels=labels, return_dict=True).loss.backward()
        tp(ids, labels=labels, return_dict=True).loss.backward()
    g_ref = {n: np_(p.grad) for n, p in ref.named_parameters()}
    g_tp = gathered(tp, state, "main_grad")
    res = {"main_grads": max(rel(g_tp[n], g_ref[n]) for n in g_ref),
           "grads_left": [n for n, p in tp.named_parameters() if p.grad is not None and p.grad._is_initialized()]}
    from paddle_vha import Qwen3VHAConfig, Qwen3VHAForCausalLM
    from paddle_vha.parallel import parallelize_model

    m = Qwen3VHAForCausalLM(Qwen3VHAConfig(**{**TINY, "vocab_size": 96, "vha_fused_prologue": False}))
    mix_precision_utils.MixPrecisionLayer(m, dtype="bfloat16")
    try:
        parallelize_model(m, vocab_parallel=True)
        res["wrapped_first"] = "accepted"
    except RuntimeError as e:
        res["wrapped_first"] = str(e)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_parallel_env()
    res = {}
    for dtype in ("float32", "float64"):
        for tied in (False, True):
            for tp_output in (True, False):
                res[f"{dtype}.tied{int(tied)}.tp_output{int(tp_output)}"] = exactness(dtype, tied, tp_output)
    res["master_grad"] = master_grad()
    with open(os.path.join(args.out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
