"""The embedded default corpus: the Python standard library's own source files, as byte-level tokens.

Present on every machine that runs Python, so the quick-start and the tests need no download. Tokens are
raw bytes (vocab 256). Files are split into train / validation by a hash of their relative path, so the
split is stable across machines that have the same files (the exact corpus depends on the Python version).
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

__all__ = ["ByteCorpus", "load_stdlib_corpus", "BYTE_VOCAB_SIZE", "encode", "decode"]

BYTE_VOCAB_SIZE = 256
DOC_SEPARATOR = 0  # NUL never appears in Python source text; it marks file boundaries


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def decode(tokens) -> str:
    return bytes(int(t) for t in tokens if 0 < int(t) < 256).decode("utf-8", errors="replace")


@dataclass
class ByteCorpus:
    train: np.ndarray  # (N_train,) uint8 token stream
    val: np.ndarray  # (N_val,) uint8 token stream
    root: str
    n_files: int

    def batch(self, rng: np.random.Generator, batch_size: int, seq_len: int, split: str = "train"):
        """Random windows: inputs (B, S) and next-byte labels (B, S), int64."""
        data = self.train if split == "train" else self.val
        if len(data) <= seq_len + 1:
            raise ValueError(f"{split} split has {len(data)} tokens, fewer than seq_len+1={seq_len + 1}")
        starts = rng.integers(0, len(data) - seq_len - 1, size=batch_size)
        win = np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int64)  # (B, S+1)
        return win[:, :-1], win[:, 1:]

    def val_batches(self, batch_size: int, seq_len: int, n_batches: int):
        """A fixed set of validation windows (same for every model and run)."""
        rng = np.random.default_rng(0)
        return [self.batch(rng, batch_size, seq_len, "val") for _ in range(n_batches)]


def _stdlib_files(root: str) -> List[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__", "dist-packages"))
        out += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return out


def load_stdlib_corpus(max_bytes: int = 8 << 20, val_fraction: float = 0.1, root: Optional[str] = None) -> ByteCorpus:
    """Read up to `max_bytes` of stdlib .py files; about `val_fraction` of files go to validation."""
    root = root or sysconfig.get_paths()["stdlib"]
    if not os.path.isdir(root):
        raise FileNotFoundError(f"standard library folder not found: {root}")
    train, val, total, n = [], [], 0, 0
    for path in _stdlib_files(root):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if not data or b"\0" in data:
            continue
        rel = os.path.relpath(path, root).encode()
        bucket = int.from_bytes(hashlib.sha1(rel).digest()[:4], "little") / 2**32
        (val if bucket < val_fraction else train).append(data + bytes([DOC_SEPARATOR]))
        total += len(data) + 1
        n += 1
        if total >= max_bytes:
            break
    to_arr = lambda parts: np.frombuffer(b"".join(parts), dtype=np.uint8)  # noqa: E731
    return ByteCorpus(train=to_arr(train), val=to_arr(val), root=root, n_files=n)
