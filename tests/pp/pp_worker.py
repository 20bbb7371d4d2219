"""One rank of the pipeline-parallel exactness checks (run by tests/test_pipeline_parallel.py).

    python tests/pp/pp_worker.py --out OUT --mode single                    # one process, one pipeline stage
    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir DIR tests/pp/pp_worker.py --out OUT --mode pp2

Every rank builds the plain causal LM of each case (same seed, tiny, fp32) and the family's pipe model
(paddle_vha/modeling/pipe.py) with the same weights. `single`: the pipe model's one stage runs the whole model;
logits, loss and every parameter gradient are compared with the plain model's. `pp2`: the pipe model is cut into two
stages and trained through fleet's PipelineParallel (2 micro-batches of 1 sequence per step, SGD with momentum)
next to the plain model trained on the same 2-sequence batches in this process; each rank compares the loss of
every step and, after the steps, the parameters of its own stage. Results go to OUT/{mode}-rank{k}.json.

The CPU shims live here and nowhere in the product (docs/training.md, "Pipeline parallelism"): see cpu_shims().
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from paddle_vha.cli import quiet  # noqa: E402

quiet()

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from _utils import TINY  # noqa: E402

CASES = {
    # Qwen3-VHA: 8 virtual heads over 2 KV heads, gate and biases, narrow physical heads (r = 12 < d)
    "vha": dict(model="qwen3_vha", num_attention_heads=8, vha_gated_attention=True, attention_bias=True,
                vha_q_head_dim=12, vha_fused_prologue=False),
    # the LM head tied to the embedding (a weight shared by the first and the last stage)
    "vha-tied": dict(model="qwen3_vha", num_attention_heads=8, tie_word_embeddings=True, vha_fused_prologue=False),
    # shared-KV VHA: one projection for K = V
    "vha-shared-kv": dict(model="qwen3_vha", num_attention_heads=8, vha_shared_kv=True, vha_fused_prologue=False),
    # Qwen3-MEA: layer 0 stock (4 KV heads), layer 1 MEA (k_norm after HLC, head norm, biases)
    "mea": dict(model="qwen3_mea", num_attention_heads=8, num_key_value_heads=2, mea_kv_heads=4, mea_layers=[1],
                attention_bias=True),
    # Qwen3 shared-KV (what shared-KV VHA folds into)
    "skv": dict(model="qwen3_shared_kv", num_attention_heads=8, attention_bias=True),
}
STEPS, LR, MOMENTUM, BATCH, SEQ = 3, 0.05, 0.9, 2, 11


def cpu_shims():
    """Test-only: what Paddle 3.3.1's pipeline parallel lacks on a CPU build.

    * fleet's PipelineLayer reads `dist.ParallelEnv().device_id`, whose `_device_id` a CPU build never sets
      (AttributeError: 'ParallelEnv' object has no attribute '_device_id'): give it 0.
    * PaddleFormers' pipe model asks get_pp_vp_split_layers for its no-recompute layers, which asserts a pipeline
      degree > 1; with one stage (mode `single`) the answer is only logged, so it is given as the empty set.
    The third gap, `ProcessGroupGLOO does not support send with sync_op and use_calc_stream flag`, is fleet's own
    switch, not a patch: pp_configs.use_batch_p2p_comm = False (plain isend / irecv, see init_fleet).
    """
    import paddleformers.nn.pp_model as pp_model
    from paddle.distributed.parallel import ParallelEnv

    if not hasattr(ParallelEnv(), "_device_id"):
        ParallelEnv._device_id = 0
    pp_model.get_pp_vp_split_layers = lambda config, skip_recompute_num=-1: set()


def init_fleet(pp: int, tp: int = 1, accumulate: int = 1):
    from paddle.distributed import fleet

    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": tp, "pp_degree": pp, "sharding_degree": 1}
    strategy.pipeline_configs = {"accumulate_steps": accumulate, "micro_batch_size": BATCH // accumulate}
    strategy.hybrid_configs["pp_configs"].use_batch_p2p_comm = False
    fleet.init(is_collective=True, strategy=strategy)
    return fleet


def rel(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    diff = np.abs(got - ref)
    return {"max_abs": float(diff.max()), "rel": float(diff.max() / max(np.abs(ref).max(), 1e-30))}


def worst(d: dict):
    name = max(d, key=lambda n: d[n]["rel"])
    return {**d[name], "name": name, "count": len(d)}


def np_(t):
    return t.detach().astype("float64").numpy()


def build_pair(overrides):
    """(config, plain causal LM, pipe model) of one case, the pipe with the plain model's weights."""
    from paddle_vha.families import family

    overrides = dict(overrides)
    fam = family(overrides.pop("model"))
    paddle.seed(1234)
    cfg = fam.config_class(**{**TINY, **overrides})
    plain = fam.model_class(cfg)
    for n, p in plain.named_parameters():  # V = 0, zero biases, unit head norm at init: give them an effect
        if n.endswith("vha_postmix_V") or n.endswith(".bias"):
            p.set_value(paddle.randn(p.shape) * 0.3)
        if n.endswith("mea_norm.weight"):
            p.set_value(1 + paddle.randn(p.shape) * 0.3)
    pipe = fam.pipe_class(fam.config_class(**{**TINY, **overrides}))
    state = plain.state_dict()
    pipe.set_state_dict(dict(state))
    names = pipe._pp_to_single_mapping
    missing = [names[n] for n, p in pipe.named_parameters() if names[n] not in state]
    assert not missing, f"pipe parameters the plain model lacks: {missing}"
    return cfg, plain, pipe


def batches(cfg):
    rng = np.random.RandomState(7)
    return [paddle.to_tensor(rng.randint(0, cfg.vocab_size, size=(BATCH, SEQ)).astype("int64")) for _ in range(STEPS)]


def single_case(overrides) -> dict:
    """One stage: forward and gradients of the pipe model against the plain model's."""
    cfg, plain, pipe = build_pair(overrides)
    plain.train()
    pipe.train()
    ids = batches(cfg)[0]
    out = plain(ids, labels=ids, return_dict=True)
    out.loss.backward()
    logits = pipe(ids)  # PipelineLayer.forward: every layer of this (only) stage
    loss = pipe._loss_fn[0](logits, ids)  # the loss layer the pipeline applies on its last stage
    loss.backward()
    names = pipe._pp_to_single_mapping
    ref_grads = {n: np_(p.grad) for n, p in plain.named_parameters()}
    got_grads = {names[n]: np_(p.grad) for n, p in pipe.named_parameters()}
    assert set(got_grads) == set(ref_grads), sorted(set(got_grads) ^ set(ref_grads))
    return {"logits": rel(np_(logits), np_(out.logits)), "loss": rel([float(loss)], [float(out.loss)]),
            "stock_layer_logits": rel(_stock_layer_logits(pipe, overrides, ids), np_(out.logits)),
            "loss_value": float(out.loss), "grads": worst({n: rel(got_grads[n], ref_grads[n]) for n in ref_grads}),
            "layer_class": type(pipe.run_function[1]).__mro__[1].__name__}


def _stock_layer_logits(pipe, overrides, ids):
    """The control: the same pipe with PaddleFormers' own pipe layer (make_decoder_layer_pipe of the family's decoder
    layer), which passes the eager backend no mask; its logits differ from the plain model's."""
    from paddleformers.nn.pp_model import make_decoder_layer_pipe

    cls = type(pipe).__mro__[0]
    stock = type(cls.__name__ + "Stock", (cls,),
                 {"_decoder_layer_pipe_cls": make_decoder_layer_pipe(cls._decoder_layer_cls)})
    config = dict(overrides)
    model = stock(type(pipe.config)(**{**TINY, **{k: v for k, v in config.items() if k != "model"}}))
    model.set_state_dict(dict(pipe.state_dict()))
    with paddle.no_grad():
        return np_(model(ids))


def pp2_case(overrides, fleet) -> dict:
    """Two stages, two micro-batches a step: losses and this stage's parameters against the plain model's."""
    cfg, plain, pipe = build_pair(overrides)
    model = fleet.distributed_model(pipe)
    opt = fleet.distributed_optimizer(paddle.optimizer.Momentum(LR, momentum=MOMENTUM, parameters=pipe.parameters()))
    ref_opt = paddle.optimizer.Momentum(LR, momentum=MOMENTUM, parameters=plain.parameters())
    plain.train()
    res = {"stage": pipe._stage_id, "losses": [], "ref_losses": []}
    for ids in batches(cfg):
        loss = model.train_batch([ids, ids], opt)  # the loss reaches every stage (fleet broadcasts it)
        out = plain(ids, labels=ids, return_dict=True)
        out.loss.backward()
        ref_opt.step()
        ref_opt.clear_grad()
        res["losses"].append(float(loss))
        res["ref_losses"].append(float(out.loss))
    names = pipe._pp_to_single_mapping
    ref = {n: np_(p) for n, p in plain.state_dict().items()}  # a tied LM head under both names
    res["params"] = worst({names[n]: rel(np_(p), ref[names[n]]) for n, p in pipe.named_parameters()})
    res["stage_params"] = sorted(names[n] for n, _ in pipe.named_parameters())
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=("single", "pp2"), required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    paddle.set_default_dtype("float32")
    cpu_shims()
    fleet = init_fleet(pp=2, accumulate=2) if args.mode == "pp2" else init_fleet(pp=1)
    rank = dist.get_rank()
    results = {"rank": rank, "cases": {}}
    try:
        for name in args.cases.split(","):
            run = single_case if args.mode == "single" else (lambda o: pp2_case(o, fleet))
            results["cases"][name] = run(CASES[name])
            print(name, json.dumps(results["cases"][name]), flush=True)
    except Exception:
        results["error"] = traceback.format_exc()
        print(results["error"], file=sys.stderr, flush=True)
    with open(os.path.join(args.out, f"{args.mode}-rank{rank}.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 1 if "error" in results else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip teardown: Paddle's process-group destructors abort now and then at exit
