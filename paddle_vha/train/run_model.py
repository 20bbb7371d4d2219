"""What a run trains, resolved once (RunModel): the family asked from the registry, its config checked by its base's
rules and the model's own runtime refusals at the run's parallel degrees, and whether paddle_vha.parallel shards it.
`describe` is the model line a run prints."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..checkpoint.contract import CheckpointError, read_json_object
from ..families import Family, UnknownFamily, family
from .errors import TrainError
from .memory import refuse_raw_fields
from .paddleformers_trainer import LlmMetaConfig

__all__ = ["RunModel", "model_family", "model_config_dict", "build_config", "vocab_parallel_here", "describe"]


@dataclass(frozen=True)
class RunModel:
    """What one run trains, resolved once by build_config: the family (Qwen3-VHA, Llama-VHA, ...), its checked config,
    the tensor-parallel degree asked for, and whether paddle_vha.parallel shards the model (the family has a plan and
    tp > 1)."""

    family: Family
    config: object
    tp: int
    plan_tp: bool

    @property
    def model_cls(self):
        return self.family.model_class


def model_family(model_type: str):
    try:
        fam = family(model_type)
    except UnknownFamily as e:
        raise TrainError(str(e))
    if not fam.has_model:  # a checkpoint-level family (Qwen3-MoE): nothing to train here, said in one line
        try:
            fam.model_class
        except CheckpointError as e:
            raise TrainError(f"model_type {model_type}: {e}") from None
    return fam


def model_config_dict(model_args) -> dict:
    src = model_args.model_config
    if src is None:
        if model_args.model_name_or_path:
            src = model_args.model_name_or_path
        else:
            raise TrainError("model_config is required (the model's config.json fields, or a path to a config.json)")
    if src.lstrip().startswith("{"):
        try:
            cfg = json.loads(src)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, a 5,000-digit int, deep nesting
            raise TrainError(f"model_config: not a usable JSON object ({type(e).__name__}: {str(e)[:200]})")
    else:  # the checked reader: a device (/dev/zero), FIFO, folder or link loop, too big, not JSON: one line
        path = os.path.join(src, "config.json") if os.path.isdir(src) else src
        cfg = read_json_object(path, TrainError)
    if not isinstance(cfg, dict):
        raise TrainError("model_config must be a JSON object")
    cfg.pop("model_type", None)
    cfg.pop("architectures", None)
    return cfg


def build_config(model_args, data_args, training_args, tp: int) -> RunModel:
    """The run's model (RunModel: the family, its config validated by its base's rules with one line on error, and how
    it is sharded) at tensor-parallel degree tp."""
    fam = model_family(model_args.model_type)
    config_cls = fam.config_class
    plan_tp = tp > 1 and fam.tp_plan is not None
    fields = model_config_dict(model_args)
    if data_args.dataset == "stdlib":
        from .corpus import BYTE_VOCAB_SIZE

        fields.setdefault("vocab_size", BYTE_VOCAB_SIZE)
        if fields["vocab_size"] < BYTE_VOCAB_SIZE:
            raise TrainError(f"model_config vocab_size={fields['vocab_size']} is smaller than the byte corpus' "
                             f"{BYTE_VOCAB_SIZE}")
    fields.setdefault("max_position_embeddings", data_args.max_seq_len)
    if fields["max_position_embeddings"] < data_args.max_seq_len:
        raise TrainError(f"max_seq_len={data_args.max_seq_len} exceeds the model's max_position_embeddings="
                         f"{fields['max_position_embeddings']}")
    try:
        fam.base.check_fields(fields)  # the base's sizes and numbers as written, then with the class's defaults
        refuse_raw_fields(fields, TrainError)  # a memory bomb before PaddleFormers builds its per-layer lists
        config = config_cls(**fields)
        fam.base.check_config(config)
    except (ValueError, TypeError) as e:  # VHAConfigError / MEAConfigError are ValueErrors
        raise TrainError(f"model_config: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    LlmMetaConfig.set_llm_config(config, training_args)  # parallel degrees, recompute, fusions: as PaddleFormers does
    check = getattr(config, "check_runtime_support", None)
    if check is not None:  # the model's own refusals, judged on the degrees the config asks for
        saved, config.tensor_model_parallel_size = config.tensor_model_parallel_size, tp
        try:
            if plan_tp:
                from ..parallel.apply import check_plan

                check(tensor_parallel_plan=True)  # sharded by paddle_vha.parallel, not by fleet's layers
                check_plan(config, tp)
                if vocab_parallel_here(training_args):  # vocabulary-parallel embedding and head
                    check_vocab_parallel_run(config, training_args, tp)
                if getattr(training_args, "sequence_parallel", False):
                    check_sequence_parallel_run(training_args, data_args.max_seq_len, tp)
            else:
                check()
        except ValueError as e:  # VHAConfigError, MEAConfigError, TPPlanError
            raise TrainError(str(e))
        config.tensor_model_parallel_size = saved
    if tp > max(1, training_args.world_size) and not training_args.dry_run:
        raise TrainError(f"tensor_model_parallel_size={tp} needs at least {tp} processes: launch with "
                         f"python -m paddle.distributed.launch --nproc_per_node N tools/train.py ...")
    return RunModel(fam, config, tp, plan_tp)


def check_vocab_parallel_run(config, training_args, tp: int) -> None:
    """TPPlanError / TrainError (one line) for a vocabulary-parallel run the plan cannot give."""
    from ..parallel.vocab import check_vocab_split

    check_vocab_split(config.vocab_size, tp)
    if training_args.pipeline_model_parallel_size > 1 and getattr(config, "tie_word_embeddings", False):
        raise TrainError("vocab_parallel with pipeline_model_parallel_size > 1 and a tied LM head "
                         "(tie_word_embeddings) is not supported (not tested: docs/training.md); use tools/train.py "
                         "--vocab_parallel false")
    if getattr(config, "use_fused_head_and_loss_fn", False):
        raise TrainError("use_fused_head_and_loss_fn with the vocabulary-parallel LM head is not supported "
                         "(PaddleFormers' fused head and loss reads fleet's mp layers); set use_fused_head_and_loss_fn "
                         "false, or vocab_parallel false")


def check_sequence_parallel_run(training_args, seq_len: int, tp: int) -> None:
    """TPPlanError (one line) for a sequence-parallel run the plan cannot give (paddle_vha/parallel/sequence.py)."""
    from ..parallel.sequence import check_sequence_split
    from ..spec.sharding import TPPlanError

    if training_args.pipeline_model_parallel_size > 1:
        raise TPPlanError("sequence_parallel with pipeline_model_parallel_size > 1 is not built (the pipe stages "
                          "pass whole sequences); set sequence_parallel false")
    if getattr(training_args, "teacher", None):
        raise TPPlanError("sequence_parallel with a teacher is not built (the hidden-state distillation term reads "
                          "whole sequences); set sequence_parallel false")
    check_sequence_split(seq_len, tp)


def vocab_parallel_here(training_args) -> bool:
    """The plan splits the embedding and LM head by vocabulary row (`vocab_parallel`; under PP x TP the first
    stage's embedding and the last stage's head, paddle_vha/parallel/pipe_vocab.py)."""
    return bool(getattr(training_args, "vocab_parallel", True))


def describe(config, data_args, training_args) -> str:
    from ..accounting import ArchError, arch_from_config, kv_bytes_per_token, model_weights, training_flops_per_token
    from ..units import fmt_bytes

    try:
        arch = arch_from_config({**config.to_dict(), "model_type": config.model_type}, label=config.model_type)
    except ArchError as e:
        return f"model: {config.model_type} ({e})"
    S = data_args.max_seq_len
    w = model_weights(arch)["total"]
    kv = kv_bytes_per_token(arch, 2, all_layers=True)
    fl = training_flops_per_token(arch, seq_len=S, causal=True)["total"]
    return (f"model: {config.model_type}, {arch.num_layers} layers, hidden {arch.hidden_size}, {arch.num_heads} query / "
            f"{arch.num_kv_heads} KV heads x {arch.head_dim}; {w:,} weights; KV cache {fmt_bytes(kv)} per token (bf16); "
            f"{fl / 1e9:.3g} GFLOPs per training token at S={S} (causal)")
