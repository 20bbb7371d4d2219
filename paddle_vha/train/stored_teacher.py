"""A teacher's outputs computed once and stored (tools/store_teacher.py), so that a distillation step runs the student
only (tools/train.py --teacher STORE).

The data are the windows the student trains on: the documents of a PaddleFormers data prefix (PREFIX.bin / .idx)
concatenated into one token stream, cut into windows of seq_len + 1 tokens at stride seq_len (ByteWindows'
windows: inputs stream[i S : i S + S], labels shifted by one). For every input position the store keeps the teacher's
K most probable next tokens and their log-probabilities, and the log of the probability left to the rest of the
vocabulary:

    ids[n, s, :]    the K largest logits' token ids at position s of window n        int32 (N, S, K), most probable first
    logp[n, s, :]   their log-probabilities log p_t (normalized over the whole vocabulary)        float32 (N, S, K)
    rest[n, s]      log r_t = log(1 - sum_k p_t[k]), the remainder's mass                         float32 (N, S)

The loss (`stored_kl`) is the KL between the two distributions coarsened to K + 1 outcomes (the K tokens, "any other"):

    KL_K = sum_k p_t[k] (log p_t[k] - log p_s[k]) + r_t (log r_t - log r_s),   r_s = 1 - sum_k p_s[k]

which is at most the full-vocabulary KL (the data-processing inequality) and equals it when the teacher puts no mass
outside its K tokens; how far below it lies for a given K is measured by `topk_kl_gap` (tools/store_teacher.py
--measure). Stored at temperature 1: the stored values cannot be re-tempered (the remainder is one number).

Files (STORE/): meta.json (format, K, seq_len, windows, the data prefix and its size, the teacher), ids.npy, logp.npy,
rest.npy; written in STORE.partial and renamed when complete; an interrupted run resumes from the windows done.
"""
from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import numpy as np

__all__ = ["FORMAT", "StoreError", "read_meta", "is_store", "stream_of", "TeacherStore", "write_windows",
           "topk_of_logits", "topk_kl_gap", "stored_kl"]

FORMAT = "paddle-vha stored teacher v1"


class StoreError(ValueError):
    """A store that is missing, incomplete, or does not fit the run (one line)."""


def is_store(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "meta.json"))


def read_meta(path: str) -> dict:
    try:
        with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise StoreError(f"{path}: not a stored teacher ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise StoreError(f"{path}: not a stored teacher (meta.json's format is not {FORMAT!r})")
    if meta.get("windows_done") != meta.get("windows"):
        raise StoreError(f"{path}: incomplete ({meta.get('windows_done')} of {meta.get('windows')} windows); run "
                         "tools/store_teacher.py again to finish it")
    return meta


def stream_of(prefix: str) -> np.ndarray:
    """The documents of PREFIX.bin / .idx concatenated (int64), in their order."""
    from paddleformers.data.indexed_dataset import MMapIndexedDataset

    if not (os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx")):
        raise StoreError(f"{prefix}: no {prefix}.bin / {prefix}.idx")
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # the reader prints its own progress
        ds = MMapIndexedDataset(prefix)
    return np.concatenate([np.asarray(ds[i], np.int64) for i in range(len(ds))])


def data_signature(prefix: str) -> dict:
    """What ties a store to its data: the two files' sizes (a rewritten prefix is refused, not silently mixed)."""
    return {ext: os.path.getsize(prefix + ext) for ext in (".bin", ".idx")}


def topk_of_logits(logits: np.ndarray, k: int):
    """(ids (..., k) int32 most probable first, logp (..., k) float32, rest (...) float32) of logits (..., V)."""
    z = np.asarray(logits, np.float32)
    m = z.max(-1, keepdims=True)
    lse = m + np.log(np.exp(z - m).sum(-1, keepdims=True, dtype=np.float64)).astype(np.float32)  # (..., 1)
    idx = np.argpartition(-z, k - 1, axis=-1)[..., :k]
    zk = np.take_along_axis(z, idx, -1)
    order = np.argsort(-zk, axis=-1, kind="stable")
    idx, zk = np.take_along_axis(idx, order, -1), np.take_along_axis(zk, order, -1)
    logp = (zk - lse).astype(np.float32)
    kept = np.exp(logp.astype(np.float64)).sum(-1)
    rest = np.log(np.maximum(1.0 - kept, 1e-30)).astype(np.float32)
    if k >= z.shape[-1]:  # nothing remains: the floor, not the rounding error of 1 - sum
        rest[...] = np.float32(np.log(1e-30))
    return idx.astype(np.int32), logp, rest


def _log_softmax(z):
    z = np.asarray(z, np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def topk_kl_gap(teacher_logits: np.ndarray, student_logits: np.ndarray, ks: Sequence[int]) -> dict:
    """Full-vocabulary KL(teacher || student) per position (mean) and, per K, the stored estimate KL_K's mean and its
    shortfall as a share of the full KL (float64, from the definitions)."""
    lt, ls = _log_softmax(teacher_logits), _log_softmax(student_logits)  # (..., V)
    full = (np.exp(lt) * (lt - ls)).sum(-1)
    out = {"full": float(full.mean()), "k": {}}
    for k in ks:
        idx, logp, rest = topk_of_logits(teacher_logits, k)
        pt = np.exp(logp.astype(np.float64))
        lsk = np.take_along_axis(ls, idx.astype(np.int64), -1)
        rs = np.log(np.maximum(1.0 - np.exp(lsk).sum(-1), 1e-30))
        est = (pt * (logp - lsk)).sum(-1) + np.exp(rest.astype(np.float64)) * (rest - rs)
        out["k"][int(k)] = dict(estimate=float(est.mean()), shortfall=float(1 - est.mean() / full.mean())
                                if full.mean() > 0 else 0.0, teacher_mass=float(pt.sum(-1).mean()))
    return out


class TeacherStore:
    """A complete store opened for reading (memory-mapped): `window(n)` -> (ids (S, K), logp (S, K), rest (S,))."""

    def __init__(self, path: str):
        self.path, self.meta = path, read_meta(path)
        try:
            self.ids = np.load(os.path.join(path, "ids.npy"), mmap_mode="r")
            self.logp = np.load(os.path.join(path, "logp.npy"), mmap_mode="r")
            self.rest = np.load(os.path.join(path, "rest.npy"), mmap_mode="r")
        except (OSError, ValueError) as e:
            raise StoreError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
        n, s, k = self.meta["windows"], self.meta["seq_len"], self.meta["k"]
        for name, arr, shape in (("ids", self.ids, (n, s, k)), ("logp", self.logp, (n, s, k)), ("rest", self.rest, (n, s))):
            if tuple(arr.shape) != shape:
                raise StoreError(f"{path}: {name}.npy has shape {tuple(arr.shape)}, meta.json says {shape}")

    @property
    def k(self) -> int:
        return int(self.meta["k"])

    @property
    def seq_len(self) -> int:
        return int(self.meta["seq_len"])

    @property
    def data_prefix(self) -> str:
        return self.meta["data_prefix"]

    def check_data(self, prefix: Optional[str] = None) -> None:
        """StoreError unless the data prefix (the store's own, or `prefix`) is the one the store was computed on."""
        prefix = prefix or self.data_prefix
        if os.path.abspath(prefix) != os.path.abspath(self.data_prefix):
            raise StoreError(f"{self.path} was computed on {self.data_prefix}, not {prefix}")
        try:
            sig = data_signature(prefix)
        except OSError:
            raise StoreError(f"{self.path}: its data {prefix}.bin / .idx are missing") from None
        if sig != self.meta["data_signature"]:
            raise StoreError(f"{self.path}: {prefix}.bin / .idx changed since the store was computed (sizes {sig}, "
                             f"then {self.meta['data_signature']}); compute it again")

    def window(self, n: int):
        return np.asarray(self.ids[n]), np.asarray(self.logp[n]), np.asarray(self.rest[n])


def write_windows(path: str, prefix: str, seq_len: int, k: int, logits_fn, teacher: str, batch: int = 4,
                  progress=None, vocab_size: Optional[int] = None) -> dict:
    """Compute (or finish) the store at `path` for the data prefix: logits_fn(ids (b, S) int64) -> logits (b, S, V)
    runs the teacher. Work goes to PATH.partial (meta.json's windows_done says how far), renamed when complete."""
    stream = stream_of(prefix)
    n = (len(stream) - 1) // seq_len
    if n < 1:
        raise StoreError(f"{prefix}: {len(stream)} tokens, fewer than one window of {seq_len + 1}")
    partial = path + ".partial"
    meta = dict(format=FORMAT, k=int(k), seq_len=int(seq_len), windows=int(n), windows_done=0, tokens=int(n * seq_len),
                data_prefix=os.path.abspath(prefix), data_signature=data_signature(prefix), teacher=teacher,
                temperature=1.0, vocab_size=vocab_size)
    fixed = ("k", "seq_len", "windows", "data_prefix", "data_signature", "teacher")
    if os.path.isfile(os.path.join(partial, "meta.json")):
        with open(os.path.join(partial, "meta.json"), encoding="utf-8") as f:
            old = json.load(f)
        if any(old.get(x) != meta[x] for x in fixed):
            raise StoreError(f"{partial}: an unfinished store for other settings or data; remove it to start over")
        meta["windows_done"] = old["windows_done"]
        mode = "r+"
    else:
        os.makedirs(partial, exist_ok=True)
        mode = "w+"

    def arr(name, dtype, shape):
        f = os.path.join(partial, name + ".npy")
        return np.lib.format.open_memmap(f, mode=mode, dtype=dtype, shape=shape)

    ids, logp, rest = arr("ids", np.int32, (n, seq_len, k)), arr("logp", np.float32, (n, seq_len, k)), \
        arr("rest", np.float32, (n, seq_len))

    def save_meta():
        tmp = os.path.join(partial, "meta.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)
        os.replace(tmp, os.path.join(partial, "meta.json"))

    save_meta()
    if progress is not None:
        progress(meta["windows_done"], n)
    while meta["windows_done"] < n:
        a = meta["windows_done"]
        b = min(n, a + batch)
        x = np.stack([stream[i * seq_len:(i + 1) * seq_len] for i in range(a, b)])  # (b, S)
        i_, l_, r_ = topk_of_logits(logits_fn(x), k)
        ids[a:b], logp[a:b], rest[a:b] = i_, l_, r_
        for m in (ids, logp, rest):
            m.flush()
        meta["windows_done"] = b
        save_meta()
        if progress is not None:
            progress(b, n)
    del ids, logp, rest
    if os.path.exists(path):
        raise StoreError(f"{path}: exists (the finished store stays in {partial})")
    os.replace(partial, path)
    return meta


def stored_kl(student_logits, ids, logp, rest, labels=None):
    """KL_K (module docstring) between the stored teacher and the student, mean over the counted positions (label >=
    0; all when labels is None); paddle tensors: logits (B, S, V), ids (B, S, K) int64, logp (B, S, K), rest (B, S).

    From one softmax of the student's logits (Paddle 3.3's CPU log_softmax / logsumexp over 49,152 classes cost 1000x
    / 5x a softmax): log p_s of the K tokens floored at 1e-30, the student's remainder r_s = 1 - sum_k p_s floored at
    1e-7 (float32's cancellation: below it the difference is rounding)."""
    import paddle

    p = paddle.nn.functional.softmax(student_logits.astype("float32"), axis=-1)  # (B, S, V)
    pk = paddle.take_along_axis(p, ids, axis=-1)  # (B, S, K): p_s of the teacher's K tokens
    lsk = pk.clip(min=1e-30).log()
    rs = (1.0 - pk.sum(axis=-1)).clip(min=1e-7).log()  # (B, S): log r_s
    per_pos = (logp.exp() * (logp - lsk)).sum(axis=-1) + rest.exp() * (rest - rs)  # (B, S)
    if labels is None:
        return per_pos.mean()
    mask = (labels.reshape(per_pos.shape) >= 0).astype("float32")
    return (per_pos * mask).sum() / mask.sum().clip(min=1.0)
