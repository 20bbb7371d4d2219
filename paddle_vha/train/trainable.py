"""Which weights a run trains (tools/train.py train_only / freeze_embeddings): the others get stop_gradient, so no
gradient is computed for them and the optimizer holds no state for them (healing a converted model: what the
conversion changed is the attention; the MLPs' and the vocabulary's weight gradients are a third of a step)."""
from __future__ import annotations

from typing import Tuple

__all__ = ["TRAIN_ONLY", "apply_trainable", "check_trainable"]

TRAIN_ONLY = ("all", "attention")


def check_trainable(train_only: str) -> None:
    if train_only not in TRAIN_ONLY:
        raise ValueError(f"train_only {train_only!r} is not one of {', '.join(TRAIN_ONLY)}")


def _is_embedding(name: str) -> bool:
    return name.endswith("embed_tokens.weight") or name.startswith("lm_head.")


def apply_trainable(model, train_only: str = "all", freeze_embeddings: bool = False) -> Tuple[int, int]:
    """Freeze what the settings leave out; returns (trainable, total) parameter elements. Attention means the
    parameters under a `.self_attn.` module (projections, q/k norms, VHA Premix / Postmix)."""
    check_trainable(train_only)
    trainable = total = 0
    for name, p in model.named_parameters():
        keep = not p.stop_gradient
        if train_only == "attention" and ".self_attn." not in name:
            keep = False
        if freeze_embeddings and _is_embedding(name):
            keep = False
        p.stop_gradient = not keep
        total += int(p.size)
        trainable += int(p.size) if keep else 0
    if trainable == 0:
        raise ValueError("train_only / freeze_embeddings leave no weight to train")
    return trainable, total
