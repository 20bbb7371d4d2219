"""Forward post-hooks that keep the outputs of a model's decoder layers (or of their attention blocks) while switched
on: what the hidden-state and attention-output distillation terms compare (distill_trainer.py, loop.py)."""
from __future__ import annotations

from contextlib import contextmanager

__all__ = ["Capture", "decoder_layers", "attention_blocks", "capturing"]


def decoder_layers(model):
    """The decoder layers of a family's causal LM (PaddleFormers' Qwen3 layout: model.model.layers)."""
    return list(model.model.layers)


def attention_blocks(model):
    """Each decoder layer's attention block (`self_attn`: its output is o_proj's, [B, S, h], before the residual)."""
    return [layer.self_attn for layer in decoder_layers(model)]


class Capture:
    """Keeps output i of modules[i] (the first element when a module returns a tuple) while `on` is set."""

    def __init__(self, modules):
        self.on, self.outputs = False, {}
        self.handles = [m.register_forward_post_hook(self._hook(i)) for i, m in enumerate(modules)]

    def _hook(self, i):
        def hook(layer, inputs, output):
            if self.on:
                self.outputs[i] = output[0] if isinstance(output, (tuple, list)) else output
        return hook

    def take(self):
        """The kept outputs in module order, and forget them."""
        out = [self.outputs[i] for i in sorted(self.outputs)]
        self.outputs = {}
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


@contextmanager
def capturing(captures):
    """Switch every Capture in `captures` on for the block."""
    for c in captures:
        c.on = True
    try:
        yield
    finally:
        for c in captures:
            c.on = False
