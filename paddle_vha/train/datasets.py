"""Datasets for PaddleFormers' Trainer: the embedded byte corpus, and real data in PaddleFormers' pretraining format.

Every sample is a dict `{"input_ids": int64[S], "labels": int64[S]}` with labels already shifted by one token
(PaddleFormers' Qwen3 criterion does not shift), so the Trainer's default collator stacks them.

* `ByteWindows` cuts a token stream into windows of S + 1 tokens at stride S and visits them in a seeded
  permutation, a fresh one per pass; the order is a pure function of (seed, index), so a run resumed from a
  checkpoint (the Trainer skips the batches it already consumed, with an unshuffled sampler) sees exactly the
  batches an uninterrupted run would.
* `stdlib_datasets` builds train / validation sets from the Python standard library's source (corpus.py:
  files are split by a hash of their path, so validation text is never trained on).
* `pretrain_datasets` reads a PaddleFormers pretraining corpus: `PREFIX.bin` + `PREFIX.idx` (mmap indexed
  dataset, what PaddleFormers' data tools write), split by documents "train,valid,test" and indexed by
  PaddleFormers' own `build_train_valid_test_datasets` (its GPTDataset), as PaddleFormers' pretraining entry
  point does. `write_pretrain_data` writes that format, e.g. to convert the byte corpus.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional, Tuple

import numpy as np
import paddle

from .corpus import BYTE_VOCAB_SIZE, DOC_SEPARATOR, load_stdlib_corpus

__all__ = ["ByteWindows", "TeacherWindows", "ShiftedTokens", "stdlib_datasets", "data_prefixes", "pretrain_datasets", "write_pretrain_data",
           "BYTE_VOCAB_SIZE"]


class ByteWindows(paddle.io.Dataset):
    """Windows of `seq_len + 1` tokens from `tokens` at stride `seq_len`, in a seeded order.

    Args:
        tokens: 1-D token stream.
        seq_len: S; each sample is S inputs and the S next tokens as labels.
        seed: the visiting order; None keeps file order (used for validation).
        num_samples: length of the dataset; beyond one pass, later passes use fresh permutations.
            Default: one pass.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: Optional[int] = 0, num_samples: Optional[int] = None):
        super().__init__()
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self.tokens = np.asarray(tokens)
        self.seq_len = seq_len
        self.n_windows = (len(self.tokens) - 1) // seq_len
        if self.n_windows < 1:
            raise ValueError(f"{len(self.tokens)} tokens are fewer than seq_len + 1 = {seq_len + 1}")
        self.seed = seed
        self.num_samples = self.n_windows if num_samples is None else int(num_samples)
        self._perms = {}

    def __len__(self) -> int:
        return self.num_samples

    def window_index(self, idx: int) -> int:
        epoch, i = divmod(int(idx), self.n_windows)
        if self.seed is None:
            return i
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)}
        return int(self._perms[epoch][i])

    def __getitem__(self, idx: int) -> dict:
        if not 0 <= idx < self.num_samples:
            raise IndexError(idx)
        s = self.window_index(idx) * self.seq_len
        win = self.tokens[s : s + self.seq_len + 1].astype(np.int64)
        return {"input_ids": win[:-1], "labels": win[1:]}


class TeacherWindows(ByteWindows):
    """ByteWindows whose window n (of the store's: the same stream, the same stride) also carries the stored teacher's
    outputs for its S input positions: teacher_ids (S, K) int64, teacher_logp (S, K) float32, teacher_rest (S,)
    float32 (paddle_vha/train/stored_teacher.py)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, store, seed: Optional[int] = 0,
                 num_samples: Optional[int] = None):
        super().__init__(tokens, seq_len, seed=seed, num_samples=num_samples)
        if store.seq_len != seq_len or self.n_windows > store.meta["windows"]:
            raise ValueError(f"{store.path}: windows of {store.seq_len} x {store.meta['windows']}, not {seq_len} x "
                             f"{self.n_windows}")
        self.store = store

    def __getitem__(self, idx: int) -> dict:
        sample = super().__getitem__(idx)
        ids, logp, rest = self.store.window(self.window_index(idx))
        sample.update(teacher_ids=ids.astype(np.int64), teacher_logp=logp.astype(np.float32),
                      teacher_rest=rest.astype(np.float32))
        return sample


class ShiftedTokens(paddle.io.Dataset):
    """Wraps a PaddleFormers GPTDataset ({"text": S + 1 tokens}) into input_ids / labels samples (the first
    `limit` samples only, if given); with vocab_size, a sample holding an id >= vocab_size raises IdRangeError."""

    def __init__(self, dataset, limit: Optional[int] = None, vocab_size: Optional[int] = None):
        super().__init__()
        self.dataset, self.vocab_size = dataset, vocab_size
        self.limit = len(dataset) if limit is None else min(limit, len(dataset))

    def __len__(self) -> int:
        return self.limit

    def __getitem__(self, idx: int) -> dict:
        if not 0 <= idx < self.limit:
            raise IndexError(idx)
        text = np.asarray(self.dataset[idx]["text"], dtype=np.int64)
        if self.vocab_size is not None and text.size and int(text.max()) >= self.vocab_size:
            from .data_checks import IdRangeError

            raise IdRangeError(f"training sample {idx} holds token id {int(text.max()):,} >= the model's vocab_size "
                               f"{self.vocab_size:,}: the data was tokenized for another vocabulary")
        return {"input_ids": text[:-1], "labels": text[1:]}


def stdlib_datasets(seq_len: int, corpus_mb: float = 8.0, val_fraction: float = 0.1, seed: int = 0,
                    num_train_samples: Optional[int] = None, max_eval_samples: Optional[int] = None,
                    root: Optional[str] = None) -> Tuple[ByteWindows, ByteWindows, dict]:
    """Train and validation ByteWindows over the standard-library byte corpus, plus a description dict."""
    corpus = load_stdlib_corpus(max_bytes=int(corpus_mb * (1 << 20)), val_fraction=val_fraction, root=root)
    if len(corpus.val) <= seq_len + 1:
        raise ValueError(f"the validation split has {len(corpus.val):,} tokens, too few for max_seq_len={seq_len}; "
                         "raise corpus_mb or val_fraction")
    train = ByteWindows(corpus.train, seq_len, seed=seed, num_samples=num_train_samples)
    val = ByteWindows(corpus.val, seq_len, seed=None)
    if max_eval_samples is not None:
        val.num_samples = min(val.num_samples, max_eval_samples)
    info = dict(source=f"Python standard library ({corpus.root})", files=corpus.n_files, train_tokens=len(corpus.train),
                val_tokens=len(corpus.val), vocab_size=BYTE_VOCAB_SIZE)
    return train, val, info


def data_prefixes(input_dir: str) -> Tuple[list, list]:
    """(data_prefix as PaddleFormers' builder takes it, the PREFIXes of the files) of an input_dir: a prefix, a folder
    of .bin/.idx pairs, or a weighted blend "w1 PREFIX1 w2 PREFIX2 ..."; ValueError (one line) for missing files."""
    parts = input_dir.split()
    if len(parts) > 1:
        prefixes = parts
        check = parts[1::2]
    else:
        p = parts[0] if parts else ""
        if os.path.isdir(p):
            found = sorted({os.path.join(p, f[: -len(".idx")]) for f in os.listdir(p) if f.endswith(".idx")})
            if not found:
                raise ValueError(f"{p}: no *.idx / *.bin pretraining data in this folder")
            prefixes = found if len(found) == 1 else [x for f in found for x in ("1.0", f)]
            check = found
        else:
            prefixes = check = [p]
    for prefix in check:
        for ext in (".bin", ".idx"):
            if not os.path.isfile(prefix + ext):
                raise ValueError(f"{prefix}{ext}: missing (input_dir names PaddleFormers pretraining data: PREFIX.bin "
                                 "and PREFIX.idx)")
    return prefixes, check


def pretrain_datasets(input_dir: str, seq_len: int, split: str = "949,50,1", seed: int = 1234,
                      num_train_samples: int = 1, num_eval_samples: int = 1, data_cache: Optional[str] = None,
                      vocab_size: Optional[int] = None):
    """Train and validation sets from PaddleFormers pretraining data.

    `input_dir` is a data prefix (`PREFIX` of PREFIX.bin / PREFIX.idx), a folder holding one such pair, or
    "w1 PREFIX1 w2 PREFIX2 ..." for a weighted blend — as PaddleFormers' own pretraining entry point accepts.
    With vocab_size, a sample holding an id >= vocab_size raises IdRangeError (paddle_vha/train/data_checks.py).
    """
    from paddleformers.data.causal_dataset import build_train_valid_test_datasets

    prefixes, check = data_prefixes(input_dir)
    train, valid, _ = build_train_valid_test_datasets(
        data_prefix=prefixes, data_impl="mmap", splits_string=split,
        train_val_test_num_samples=[num_train_samples, num_eval_samples, 0], seq_length=seq_len, seed=seed,
        skip_warmup=True, data_cache_path=data_cache)
    if train is None or valid is None or len(valid) == 0:
        raise ValueError(f"split {split!r} leaves no train or validation documents in {input_dir}")
    return ShiftedTokens(train, vocab_size=vocab_size), ShiftedTokens(valid, limit=num_eval_samples, vocab_size=vocab_size)


def write_pretrain_data(prefix: str, documents: Iterable[np.ndarray], vocab_size: int = BYTE_VOCAB_SIZE) -> dict:
    """Write token documents as PaddleFormers pretraining data (PREFIX.bin + PREFIX.idx, mmap format)."""
    from paddleformers.data.indexed_dataset import MMapIndexedDatasetBuilder, data_file_path, index_file_path

    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    dtype = np.uint16 if vocab_size < 65500 else np.int32
    builder = MMapIndexedDatasetBuilder(data_file_path(prefix), dtype=dtype)
    n_docs = n_tok = 0
    for doc in documents:
        doc = np.asarray(doc)
        if doc.size == 0:
            continue
        builder.add_item(doc.astype(np.int64))
        builder.end_document()
        n_docs += 1
        n_tok += doc.size
    builder.finalize(index_file_path(prefix))
    return dict(documents=n_docs, tokens=n_tok)


def stdlib_documents(tokens: np.ndarray):
    """Split a corpus token stream back into its files (at the NUL separators)."""
    cuts = np.where(tokens == DOC_SEPARATOR)[0] + 1
    return [d for d in np.split(tokens, cuts) if d.size]
