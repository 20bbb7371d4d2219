"""What every decoder session shares: building one call's inputs, the empty cache, prefill and step."""
from __future__ import annotations

from typing import List, Tuple

import numpy as np

__all__ = ["DecoderSession", "decoder_feeds"]


def decoder_feeds(ids, past_len: int, attention_mask=None):
    """(input_ids, attention_mask, position_ids) for `ids` (B, S) after `past_len` cached tokens.

    attention_mask (B, past_len + S), 1 for real tokens, 0 for padding (left padding for batched prompts);
    positions count real tokens only, so a left-padded row is rotated exactly like the same row unpadded.
    """
    ids = np.asarray(ids, np.int64)
    batch, seq = ids.shape
    if attention_mask is None:
        attention_mask = np.ones((batch, past_len + seq), np.int64)
    attention_mask = np.asarray(attention_mask, np.int64)
    if attention_mask.shape != (batch, past_len + seq):
        raise ValueError(f"attention_mask shape {attention_mask.shape} != (batch, past + seq) = {(batch, past_len + seq)}")
    position_ids = np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0)[:, past_len:]
    return ids, attention_mask, np.ascontiguousarray(position_ids)


class DecoderSession:
    """Subclasses set cache_shapes ((heads, width) of every cache input, in order) and implement
    _run(list of input arrays) -> outputs."""

    cache_shapes: List[Tuple[int, int]]

    def _run(self, arrays: List[np.ndarray]) -> List[np.ndarray]:
        raise NotImplementedError

    def empty_cache(self, batch: int) -> List[np.ndarray]:
        return [np.zeros((batch, h, 0, w), np.float32) for h, w in self.cache_shapes]

    def run(self, ids, cache, attention_mask=None) -> Tuple[np.ndarray, list]:
        """logits (B, S, V) and the new cache (each (B, H_kv, past + S, d))."""
        feeds = decoder_feeds(ids, cache[0].shape[2], attention_mask)
        out = self._run(list(feeds) + [np.ascontiguousarray(c) for c in cache])
        return out[0], out[1:]

    def prefill(self, ids, attention_mask=None):
        return self.run(ids, self.empty_cache(np.asarray(ids).shape[0]), attention_mask)

    def step(self, ids, cache, attention_mask=None):
        return self.run(ids, cache, attention_mask)
