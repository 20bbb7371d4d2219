"""What a training run needs in memory, said before the model is built, and the one up-front refusal.

Per process, for W weights of which this process holds W / (tensor x pipeline degree) (bytes):

    BASE                 Paddle, PaddleFormers and the Trainer imported                                 ~ 0.8 GB
    state                float32 weights, gradients and AdamW's two moments: 16 per weight
    save                 a checkpoint-N / model save: the state's copies on their way to disk: 16 per weight
    activations          the logits' float32 forward and backward: 16 x batch x sequence x vocabulary, plus
                         the decoder layers' activations: 4 x batch x sequence x layers x (12 h + 4 I)
    teacher              with --teacher: its float32 weights, whole on every process (replicated): 4 per teacher
                         weight, plus the KD logit terms (teacher logits, both softmaxes at T, their difference and
                         the KL's backward): 32 x batch x sequence x vocabulary

The per-weight constants are from measured peaks (docs/training.md, "Memory"). Processes launched on one machine
share its memory: the need is multiplied by the launcher's local process count (PADDLE_LOCAL_SIZE).
"""
from __future__ import annotations

import math
import os

from ..machine import available_memory_bytes, shortfall_line
from ..units import fmt_bytes

__all__ = ["BASE", "STATE_PER_WEIGHT", "SAVE_PER_WEIGHT", "TEACHER_PER_WEIGHT", "KD_PER_LOGIT", "weight_count", "train_need",
           "refuse_if_short", "refuse_raw_fields"]

BASE = 800 << 20
STATE_PER_WEIGHT = 16
SAVE_PER_WEIGHT = 16
TEACHER_PER_WEIGHT = 4
KD_PER_LOGIT = 32


def weight_count(config) -> int:
    """Elements of every tensor the family declares for this config (its on-disk contract)."""
    from ..families import family_of

    return sum(math.prod(s) for s in family_of(config).spec.tensor_shapes(config).values())


def train_need(config, batch: int, seq_len: int, model_parallel: int = 1, saves: bool = True, local_procs: int = 1,
               teacher_weights: int = 0):
    """(bytes, formula) of a run: every term of the module docstring, summed over the local processes
    (teacher_weights: the teacher's weight count, 0 without one)."""
    w = weight_count(config) / max(1, model_parallel)
    tokens = batch * seq_len
    parts = {"base": BASE, "weights, grads, AdamW": STATE_PER_WEIGHT * w,
             "save copies": SAVE_PER_WEIGHT * w if saves else 0,
             "activations": 16 * tokens * config.vocab_size + 4 * tokens * config.num_hidden_layers
             * (12 * config.hidden_size + 4 * config.intermediate_size)}
    if teacher_weights:
        parts["teacher"] = TEACHER_PER_WEIGHT * teacher_weights + KD_PER_LOGIT * tokens * config.vocab_size
    per_proc = int(sum(parts.values()))
    formula = " + ".join(f"{k} {fmt_bytes(v)}" for k, v in parts.items() if v)
    if local_procs > 1:
        formula = f"{local_procs} processes x ({formula})"
    return per_proc * local_procs, formula


def refuse_raw_fields(fields: dict, error) -> None:
    """Before any config class sees `fields` (model_config as written: PaddleFormers' Qwen3Config builds per-layer
    lists, so num_hidden_layers 1e8 would hang there first): `error` (one line) when even a lower bound of the weights
    (the embedding and, per layer, two norms and the MLP's three matrices; missing sizes counted as 1), held once in
    float32, needs more than the machine has. train_need's full figure is checked once the config is built."""
    size = {k: fields.get(k) if isinstance(fields.get(k), int) and fields.get(k) > 0 else 1
            for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size")}
    h = size["hidden_size"]
    weights = size["vocab_size"] * h + size["num_hidden_layers"] * (2 * h + 3 * h * size["intermediate_size"])
    need = BASE + 4 * weights
    refusal = shortfall_line(need, available_memory_bytes(), f"at least {weights:,} float32 weights "
                             f"(num_hidden_layers {size['num_hidden_layers']:,}, hidden_size {h:,})", "train",
                             "lower num_hidden_layers / hidden_size / intermediate_size / vocab_size")
    if refusal is not None:
        raise error(refusal)


def local_process_count() -> int:
    """Processes paddle.distributed.launch started on this machine (1 outside a launch)."""
    try:
        return max(1, int(os.environ.get("PADDLE_LOCAL_SIZE", "1")))
    except ValueError:
        return 1


def refuse_if_short(need: int, formula: str, error) -> str:
    """The memory line to print; raises `error` (one line) when MemAvailable is below `need`."""
    have = available_memory_bytes()
    line = f"memory: needs about {fmt_bytes(need)} ({formula})" + (f"; MemAvailable {fmt_bytes(have)}" if have else "")
    refusal = shortfall_line(need, have, formula, "train", "free memory, lower per_device_train_batch_size / "
                             "max_seq_len, or shard the model with tensor_model_parallel_size")
    if refusal is not None:
        raise error(refusal)
    return line
