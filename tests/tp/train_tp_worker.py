"""Train a trainer config with tensor_parallel_degree > 1 through PaddleFormers' Trainer, one rank of the launcher.

    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir DIR tests/tp/train_tp_worker.py \
        configs/tiny_vha_tp2.json --output_dir OUT

It reads the config with tools/train.py's own parser and data builder (same arguments, same data) and differs from
tools/train.py in two places only, the hook that tool still needs for Qwen3-VHA tensor parallelism
(docs/tensor_parallel.md, "Trainer"):

* the model is built by paddle_vha.parallel.build_tensor_parallel_model over fleet's model-parallel group
  (tools/train.py builds `model_cls(config)`, which Qwen3-VHA refuses at tensor_model_parallel_size > 1);
* the trained model is written with paddle_vha.parallel.save_merged (every rank its slices, rank 0 merges them into
  OUT/model, the Qwen3-VHA checkpoint format), instead of Trainer.save_model / save_pretrained, whose distributed
  path calls .cuda() (fails on the CPU) and does not know this plan's layout.

Rank 0 writes OUT/tp_train_result.json (losses per logged step, parameter divergence across ranks, merged model).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)


def load_train_tool():
    spec = importlib.util.spec_from_file_location("vha_train_tool", os.path.join(ROOT, "tools", "train.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)  # quiet() and PaddleFormers' imports, as tools/train.py does
    return mod


def main(argv=None) -> int:
    tt = load_train_tool()
    argv = sys.argv[1:] if argv is None else argv
    model_args, data_args, training_args, requested = tt.parse(argv)
    training_args.dataloader_shuffle = False

    import paddle.distributed as dist
    from paddle.distributed import fleet
    from paddleformers.trainer import Trainer, set_seed
    from paddleformers.transformers.configuration_utils import LlmMetaConfig

    from paddle_vha.parallel import build_tensor_parallel_model, model_parallel_group, replica_divergence, save_merged

    config_cls, model_cls = tt.model_classes(model_args.model_type)
    fields = tt.model_config_dict(model_args)
    fields.setdefault("max_position_embeddings", data_args.max_seq_len)
    config = config_cls(**fields)
    LlmMetaConfig.set_llm_config(config, training_args)
    t = training_args.tensor_model_parallel_size
    if t < 2 or dist.get_world_size() < t:
        tt.fail(f"this driver is for tensor_model_parallel_size >= 2 under the launcher (got {t}, "
                f"world size {dist.get_world_size()})")
    train, val, desc = tt.build_data(data_args, training_args)
    print(tt.describe(config, data_args, training_args))
    print(f"data: {desc}")

    if training_args.device == "cpu":
        # fleet's TensorParallel wrapper broadcasts each batch from mp rank 0 (broadcast_input_data), which asserts a
        # GPU / XPU device. Every mp rank here reads the same deterministic batches (dataset_world_size = dp degree),
        # so on the CPU fleet's own switch mp_configs.need_broadcast_data is turned off; the result records per-rank
        # losses to show they agree. GPU runs
        # keep fleet's broadcast.
        fleet.fleet._user_defined_strategy.hybrid_configs["mp_configs"].need_broadcast_data = False
    hcg = fleet.get_hybrid_communicate_group()
    set_seed(training_args.seed)
    model = build_tensor_parallel_model(model_cls, config, model_parallel_group())  # the change to the model build
    log = tt.TrainLog(model, os.path.join(training_args.output_dir, "train_log.jsonl"), False)
    trainer = Trainer(model=model, args=training_args, train_dataset=train if training_args.do_train else None,
                      eval_dataset=val if training_args.do_eval else None, callbacks=[log])
    result = trainer.train()
    losses = []
    path = os.path.join(training_args.output_dir, "train_log.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            losses = [(r["step"], r["loss"]) for r in map(json.loads, f) if "loss" in r]
    eval_loss = trainer.evaluate().get("eval_loss") if training_args.do_eval else None
    divergence = replica_divergence(model)

    save_merged(model, os.path.join(training_args.output_dir, "model"))  # the change to the final save
    out = {"t": t, "global_step": result.global_step, "losses": losses, "eval_loss": eval_loss,
           "replica_param_divergence": divergence, "mp_rank": hcg.get_model_parallel_rank()}
    if dist.get_rank() == 0:
        with open(os.path.join(training_args.output_dir, "tp_train_result.json"), "w") as f:
            json.dump(out, f, indent=1)
        print(f"train: {result.global_step} steps with tensor_parallel_degree {t}; loss {losses[-1][1]:.4f}; "
              f"validation loss {eval_loss:.4f} (perplexity {math.exp(min(eval_loss, 50)):.2f})"
              if losses and eval_loss is not None else f"train: {out}")
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (see tests/tp/tp_worker.py)
