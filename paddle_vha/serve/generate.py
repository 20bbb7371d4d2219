"""Generation loops over a decoder session (OrtDecoder or PaddleInferenceDecoder) with its KV cache.

Stopping: `eos_token_id` is an id or a list of ids (Qwen3's generation_config.json lists two). A row that emits one of
them is finished: its later positions hold `pad_token_id` (default: the first EOS id) and are not fed as real tokens'
results, while the other rows go on; the loop ends when every row has finished or after max_new_tokens.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .session import ServeError

__all__ = ["generate", "GenerationResult", "eos_ids"]


@dataclass
class GenerationResult:
    tokens: np.ndarray  # (B, N) new tokens; a finished row holds pad ids after its EOS
    prefill_seconds: float
    decode_seconds: float
    finished: Optional[np.ndarray] = None  # (B,) True where the row emitted an EOS
    lengths: Optional[np.ndarray] = None  # (B,) new tokens of each row, its EOS included

    def __post_init__(self):
        b, n = self.tokens.shape
        if self.finished is None:
            self.finished = np.zeros(b, bool)
        if self.lengths is None:
            self.lengths = np.full(b, n, np.int64)

    def row(self, i: int, keep_eos: bool = False) -> np.ndarray:
        """Row i's new tokens, cut after its EOS (the EOS itself kept only if keep_eos)."""
        n = int(self.lengths[i])
        return self.tokens[i, : n if keep_eos or not self.finished[i] else n - 1]

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput: new tokens after the first, over all sequences, per second of decode time."""
        b, n = self.tokens.shape
        return b * max(n - 1, 0) / self.decode_seconds if self.decode_seconds > 0 else float("nan")


def eos_ids(eos_token_id) -> np.ndarray:
    """The stop ids as an int64 array ([] for None): an id or a list of ids."""
    if eos_token_id is None:
        return np.zeros(0, np.int64)
    return np.atleast_1d(np.asarray(eos_token_id, np.int64)).reshape(-1)


# candidates kept by a partial sort before top-p's full sort is needed: a row whose CANDIDATES most probable tokens
# already hold the top-p mass has its whole nucleus among them (the nucleus is a prefix of the sorted order)
CANDIDATES = 1024


def _choose(logits: np.ndarray, rng, do_sample: bool, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Next token per row from last-position logits (B, V): the argmax, or a draw from softmax(logits / temperature)
    restricted to the top_k largest (0: all), then to the smallest most-probable set whose mass reaches top_p,
    renormalized (Hugging Face's definitions). Only candidates are sorted: the k largest with top_k, else the
    CANDIDATES largest when they hold the top-p mass (that row sorted whole otherwise), so a step costs a partial sort
    and one exp over the vocabulary, not a sort of it (at batch 16 over a 49,152-token vocabulary the full sort was
    half of a 135M model's decode step)."""
    if not do_sample:
        return logits.argmax(-1)
    z = np.asarray(logits, np.float32) / np.float32(max(temperature, 1e-6))  # (B, V); float64 for the kept ones
    B, V = z.shape
    k = top_k if top_k and top_k < V else V
    c = k if k < V else (CANDIDATES if top_p < 1.0 and CANDIDATES < V else V)
    cand = np.argpartition(-z, c - 1, axis=-1)[:, :c] if c < V else np.broadcast_to(np.arange(V), (B, V))  # (B, c)
    out = np.empty(B, np.int64)
    u = rng.random(B)
    m = z.max(-1, keepdims=True)
    total = np.exp(z - m).sum(-1, dtype=np.float64) if k == V else None  # (B,) the normalizer over the vocabulary
    for r in range(B):
        if c == V and top_p >= 1.0:  # temperature alone: no order needed
            p = np.exp(z[r].astype(np.float64) - m[r, 0])
            cdf = np.cumsum(p)
            out[r] = min(int(np.searchsorted(cdf, u[r] * cdf[-1], side="right")), V - 1)
            continue
        ids = cand[r][np.argsort(-z[r, cand[r]], kind="stable")]  # most probable first
        p = np.exp(z[r, ids].astype(np.float64) - m[r, 0])
        mass = p.sum() if total is None else total[r]  # the renormalizer after top-k
        if top_p < 1.0 and c < V and k == V and p.sum() < top_p * mass:  # the nucleus reaches past the candidates
            ids = np.argsort(-z[r], kind="stable")
            p = np.exp(z[r, ids].astype(np.float64) - m[r, 0])
        if top_p < 1.0:
            p = p[np.cumsum(p) - p < top_p * mass]  # the nucleus: a prefix of the sorted candidates
        cdf = np.cumsum(p)
        out[r] = ids[min(int(np.searchsorted(cdf, u[r] * cdf[-1], side="right")), len(p) - 1)]
    return out


def generate(session, prompt_ids, max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, eos_token_id=None, pad_token_id=None,
             attention_mask=None) -> GenerationResult:
    """Greedy (default) or sampled continuation of `prompt_ids` (B, S), each row stopping at its first EOS (an id or a
    list of ids; the module docstring says how a batch goes on).

    attention_mask (B, S): 0 marks left padding in a batch of unequal prompts.
    """
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    rng = np.random.default_rng(seed)
    stop = eos_ids(eos_token_id)
    pad = int(pad_token_id) if pad_token_id is not None else (int(stop[0]) if stop.size else 0)
    ids = np.asarray(prompt_ids, np.int64)
    t0 = time.perf_counter()
    mask = np.ones(ids.shape, np.int64) if attention_mask is None else np.asarray(attention_mask, np.int64)
    logits, cache = session.prefill(ids, mask)
    t1 = time.perf_counter()
    out = []
    done = np.zeros(ids.shape[0], bool)
    lengths = np.zeros(ids.shape[0], np.int64)
    for step in range(max_new_tokens):
        live = logits[~done, -1]
        if not np.isfinite(live).all():  # argmax of NaN rows is token 0: say so instead of emitting it
            raise ServeError(f"the model's logits are not finite (NaN or Inf) at generation step {step + 1}")
        last = np.where(done[:, None], 0.0, logits[:, -1])  # a finished row's logits are never used
        nxt = np.where(done, pad, _choose(last, rng, do_sample, temperature, top_k, top_p))
        lengths += ~done
        done |= np.isin(nxt, stop)
        out.append(nxt)
        if step == max_new_tokens - 1 or done.all():
            break
        mask = np.concatenate([mask, np.ones((ids.shape[0], 1), np.int64)], axis=1)
        logits, cache = session.step(nxt[:, None].astype(np.int64), cache, mask)
    t2 = time.perf_counter()
    return GenerationResult(np.stack(out, axis=1), prefill_seconds=t1 - t0, decode_seconds=t2 - t1,
                            finished=done, lengths=lengths)
