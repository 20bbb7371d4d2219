"""What a quantized KV cache costs in quality: an export's logits over held-out text against the same graph with the
float32 cache, at a long context, where the cache's errors accumulate.

The text is read the way serving reads a long prompt and then generates: the first `chunk` tokens prefilled, every
later chunk of `chunk` tokens run through the cache of all before it (so nearly all of the attention reads the
quantized cache), and the last `steps` tokens one cached decode step each (teacher-forced on the text). Both graphs
give logits for every position; compared position by position (paddle_vha/export/quality.py's measures: mean logit KL
in nats, greedy-token agreement on the decisive positions, on all positions, max abs logit difference) over the
positions after the first chunk (which no cache has touched yet in the buffer flavour), a block at a time, so no
(positions x vocabulary) float64 array is ever whole.
"""
from __future__ import annotations

from typing import Iterator, List, Tuple, Union

import numpy as np

from ..evaluate import log_softmax
from .errors import ExportError
from .quality import DECISIVE, Quality

__all__ = ["cached_logits", "compare_blocks", "CACHE_BOUNDS", "check_cache_quality", "compare_exports",
           "quality_line"]

# int8 cache vs float32 cache: (max mean KL in nats, min greedy agreement on decisive positions). Measured
# (docs/deploy.md): see there; a dropped or misplaced scale moves the distribution by orders of magnitude more
CACHE_BOUNDS = {"int8": (0.01, 0.95)}


def cached_logits(session, ids: np.ndarray, chunk: int, steps: int) -> Iterator[Tuple[int, np.ndarray]]:
    """(first position, logits (B, n, V)) blocks of `session` over `ids` (B, S): a prefill of `chunk` tokens, then
    chunks of `chunk` through the cache, then the last `steps` tokens one at a time (the module docstring)."""
    total = ids.shape[1]
    prefill_end = max(min(chunk, total - steps), 1)
    logits, cache = session.prefill(ids[:, :prefill_end])
    yield 0, logits
    pos = prefill_end
    while pos < total - steps:
        end = min(pos + chunk, total - steps)
        logits, cache = session.step(ids[:, pos:end], cache, np.ones((ids.shape[0], end), np.int64))
        yield pos, logits
        pos = end
    for t in range(pos, total):
        logits, cache = session.step(ids[:, t:t + 1], cache, np.ones((ids.shape[0], t + 1), np.int64))
        yield t, logits


class _Tally:
    """The running sums of paddle_vha/export/quality.py's measures over blocks of positions."""

    def __init__(self):
        self.kl_sum = self.kl_max = self.max_abs = 0.0
        self.positions = self.same = self.decisive = self.decisive_same = 0

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        if not (np.isfinite(ref).all() and np.isfinite(got).all()):
            raise ExportError("cache quality check failed: logits are not finite (NaN or Inf)")
        la, lb = log_softmax(ref.astype(np.float64)), log_softmax(got.astype(np.float64))
        kl = (np.exp(la) * (la - lb)).sum(-1)
        same = ref.argmax(-1) == got.argmax(-1)
        top2 = np.partition(la, -2, axis=-1)[..., -2:]
        decisive = (top2[..., 1] - top2[..., 0]) >= DECISIVE
        self.kl_sum += float(kl.sum())
        self.kl_max = max(self.kl_max, float(kl.max()))
        self.max_abs = max(self.max_abs, float(np.abs(ref.astype(np.float64) - got).max()))
        self.positions += kl.size
        self.same += int(same.sum())
        self.decisive += int(decisive.sum())
        self.decisive_same += int(same[decisive].sum())

    def quality(self, text: str) -> Quality:
        n = max(self.positions, 1)
        return Quality(mean_kl=self.kl_sum / n, max_kl=self.kl_max,
                       agreement=self.decisive_same / self.decisive if self.decisive else 1.0,
                       decisive=self.decisive, agreement_all=self.same / n, positions=self.positions,
                       max_abs=self.max_abs, text=text)


def compare_blocks(reference: Union[List[Tuple[int, np.ndarray]], "object"], session, ids: np.ndarray, chunk: int,
                   steps: int, text: str) -> Quality:
    """`session`'s cached logits over `ids` against `reference`'s: a session run alongside (both in memory), or its
    blocks already computed (a list of cached_logits' (position, logits); a prefix of that list compares only its
    positions). Positions before the first chunk's end are not counted."""
    ref_blocks = iter(reference) if isinstance(reference, list) else cached_logits(reference, ids, chunk, steps)
    tally = _Tally()
    # the reference first: a shortened reference list stops the session's run after its last block
    for (ref_start, ref), (start, got) in zip(ref_blocks, cached_logits(session, ids, chunk, steps)):
        assert start == ref_start and got.shape == ref.shape, (start, ref_start, got.shape, ref.shape)
        if start > 0:
            tally.add(ref, got)
    return tally.quality(text)


def check_cache_quality(quality: Quality, kv_cache: str, bounds=None) -> None:
    """ExportError (one line) when the cache's quality is outside its bounds."""
    max_kl, min_agree = bounds or CACHE_BOUNDS[kv_cache]
    if not quality.mean_kl <= max_kl:
        raise ExportError(f"quality check failed: the {kv_cache} KV cache's mean KL {quality.mean_kl:.3e} nats vs the "
                          f"float32 cache > the bound {max_kl:g} (a broken cache, or a model whose keys or values do "
                          "not quantize well)")
    if not quality.agreement >= min_agree:
        raise ExportError(f"quality check failed: the {kv_cache} KV cache's greedy-token agreement "
                          f"{100 * quality.agreement:.1f}% < the bound {100 * min_agree:g}% (on the {quality.decisive} "
                          "positions where the float32 cache's choice is decisive)")


def quality_line(quality: Quality, kv_cache: str, bounds=None) -> str:
    max_kl, min_agree = bounds or CACHE_BOUNDS[kv_cache]
    return (f"quality: the {kv_cache} KV cache vs the float32 cache on {quality.text}: mean KL {quality.mean_kl:.2e} "
            f"nats (max {quality.max_kl:.2e}; bound {max_kl:g}), greedy-token agreement {100 * quality.agreement:.1f}% "
            f"of the {quality.decisive} decisive positions (bound {100 * min_agree:g}%; "
            f"{100 * quality.agreement_all:.1f}% of all {quality.positions}), max abs logit diff {quality.max_abs:.3f}")


def compare_exports(reference_dir: str, quantized_dir: str, positions: int, chunk: int = 256, steps: int = 16,
                    batch: int = 1, threads: int = 0) -> Quality:
    """Two export folders of one checkpoint (a float32 cache and a quantized one; the same flavour) compared over
    `batch` held-out windows of `positions` tokens, both sessions alongside (paddle_vha/export/quality.py's text: the
    folder's own tokenizer, or bytes)."""
    from ..serve.ort_session import OrtDecoder
    from ..serve.session import read_export_info
    from .quality import held_out_windows

    info = read_export_info(reference_dir)
    if positions > int(info.get("context_length") or info["max_position_embeddings"]):
        raise ExportError(f"--positions {positions}: past the model's context "
                          f"({info.get('context_length') or info['max_position_embeddings']})")
    ids, text = held_out_windows(reference_dir, int(info["vocab_size"]), batch=batch, seq_len=positions)
    reference, quantized = OrtDecoder.from_dir(reference_dir, threads), OrtDecoder.from_dir(quantized_dir, threads)
    return compare_blocks(reference, quantized, ids, chunk, steps,
                          text + f" (prefill {chunk}, then chunks of {chunk} through the cache, the last {steps} one "
                          "step each)")
