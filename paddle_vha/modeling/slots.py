"""Filling a base's class slots for one constructor call.

PaddleFormers' Qwen3 constructors name the classes they build as module globals: Qwen3DecoderLayer.__init__ builds
`Qwen3Attention(config, i)`, Qwen3Model.__init__ builds `Qwen3DecoderLayer(config, i)` for each layer and
Qwen3ForCausalLM.__init__ builds `Qwen3Model(config)`. Rather than copying those constructor bodies (which would
diverge silently on an upgrade), a family's constructor calls the base's own with the name resolving to the family's
class for the duration of that call. The module is restored on exit, errors included; one re-entrant lock
serializes constructions (a causal LM's constructor nests the backbone's, which nests each layer's).
"""
from __future__ import annotations

import contextlib
import threading
from types import ModuleType
from typing import Dict

__all__ = ["filled_slots"]

_LOCK = threading.RLock()


@contextlib.contextmanager
def filled_slots(module: ModuleType, classes: Dict[str, type]):
    """Within the block, `module.<name>` is `classes[name]` for each name (each must already exist in `module`)."""
    with _LOCK:
        saved = {}
        try:
            for name, cls in classes.items():
                saved[name] = getattr(module, name)  # AttributeError: the base no longer has that class
                setattr(module, name, cls)
            yield
        finally:
            for name, cls in saved.items():
                setattr(module, name, cls)
