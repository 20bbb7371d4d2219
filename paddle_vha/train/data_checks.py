"""Does the training data fit the model? Token ids against the vocabulary, byte data against a tokenized model.

Two mistakes train without an error and teach the model nothing it can use: ids the embedding does not have (data
tokenized for another vocabulary: PaddleFormers' embedding lookup does not check), and byte-level data (the embedded
stdlib corpus, or `tools/make_pretrain_data.py --bytes`: ids 0-255) fed to a model that has a real tokenizer and a
larger vocabulary (a converted Qwen3: 151,936 ids, of which bytes are not the first 256). The pretraining format
(PREFIX.bin + PREFIX.idx) does not record its tokenizer, so the ids themselves are read:

* `check_token_ids` scans each .bin before anything is built: all of it up to SCAN_TOKENS ids, else SCAN_BLOCKS
  evenly spaced blocks (a 2-core CPU scans ~1 GB/s). The largest id must be < vocab_size; and if the model has a
  tokenizer and more than 256 ids, data whose ids all lie below 256 is refused as byte data;
* `IdRangeError` is what the training datasets raise for a sample holding an id >= vocab_size (the part of a large
  file the scan did not read), reported by the trainer in one line.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

import numpy as np

from .corpus import BYTE_VOCAB_SIZE
from .errors import TrainError

__all__ = ["IdRangeError", "TOKENIZER_FILES", "tokenizer_folder", "check_stdlib_fits", "check_token_ids",
           "SCAN_TOKENS", "SCAN_BLOCKS"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
SCAN_TOKENS = 1 << 28  # 256 M ids (0.5-1 GB) are read whole
SCAN_BLOCKS = 256  # a larger file: this many blocks of SCAN_TOKENS // SCAN_BLOCKS ids, evenly spaced


class IdRangeError(ValueError):
    """A training sample holds a token id the model's embedding does not have; str(e) is one line."""


def tokenizer_folder(model_args) -> Optional[str]:
    """The folder of the model's tokenizer: model_name_or_path (or a model_config folder) if it holds tokenizer
    files, else None."""
    for folder in (model_args.model_name_or_path, model_args.model_config):
        if folder and os.path.isdir(folder) and any(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES):
            return folder
    return None


def _byte_data_error(what: str, vocab_size: int, tokenizer: str) -> TrainError:
    return TrainError(f"{what} is byte-level (token ids 0-255), but the model has a tokenizer ({tokenizer}) and "
                      f"vocab_size {vocab_size:,}: tokenize text with it (tools/make_pretrain_data.py FILES|stdlib "
                      f"--tokenizer {tokenizer} --out PREFIX) and train with dataset=pretrain, input_dir=PREFIX")


def check_stdlib_fits(vocab_size: int, tokenizer: Optional[str]) -> None:
    """TrainError for the byte corpus (dataset=stdlib) under a model with a tokenizer and a larger vocabulary."""
    if tokenizer is not None and vocab_size > BYTE_VOCAB_SIZE:
        raise _byte_data_error("dataset=stdlib (the embedded corpus)", vocab_size, tokenizer)


_IDX_MAGIC = b"MMIDIDX\x00\x00"  # PaddleFormers' MMapIndexedDataset index: magic, <Q version 1, <B dtype code, ...


def _check_idx_header(path: str) -> None:
    """TrainError (one line) for a PREFIX.idx whose header is not PaddleFormers' mmap index (magic, version 1, a known
    dtype code): checked here because PaddleFormers' Index, failing on those, also prints an ignored-exception
    traceback from its __del__."""
    from paddleformers.data.indexed_dataset import dtypes

    with open(path, "rb") as f:
        head = f.read(18)
    if len(head) < 18 or head[:9] != _IDX_MAGIC or int.from_bytes(head[9:17], "little") != 1 or head[17] not in dtypes:
        raise TrainError(f"{path}: not PaddleFormers mmap pretraining data (its header is not an MMIDIDX version 1 "
                         "index; write the data with tools/make_pretrain_data.py)")


def _max_id(prefix: str) -> tuple:
    """(largest id read, ids read, ids in the file) of PREFIX.bin, read as its PREFIX.idx says."""
    from paddleformers.data.indexed_dataset import MMapIndexedDataset

    _check_idx_header(prefix + ".idx")
    try:
        dtype = np.dtype(MMapIndexedDataset.Index(prefix + ".idx", skip_warmup=True).dtype)
    except (AssertionError, OSError, ValueError, KeyError, TypeError) as e:
        raise TrainError(f"{prefix}.idx: not PaddleFormers mmap pretraining data ({type(e).__name__}: {e})") from None
    n = os.path.getsize(prefix + ".bin") // dtype.itemsize
    if n == 0:
        return -1, 0, 0
    data = np.memmap(prefix + ".bin", dtype=dtype, mode="r", shape=(n,))
    if n <= SCAN_TOKENS:
        blocks = [(a, min(n, a + (1 << 24))) for a in range(0, n, 1 << 24)]
    else:
        width = SCAN_TOKENS // SCAN_BLOCKS
        blocks = [(a, a + width) for a in np.linspace(0, n - width, SCAN_BLOCKS).astype(np.int64)]
    top = max(int(data[a:b].max()) for a, b in blocks)
    return top, sum(b - a for a, b in blocks), n


def check_token_ids(prefixes: Iterable[str], vocab_size: int, tokenizer: Optional[str]) -> None:
    """TrainError (one line) if a pretraining file holds an id >= vocab_size, or is byte data for a tokenized model
    (the module docstring)."""
    for prefix in prefixes:
        top, read, total = _max_id(prefix)
        part = "" if read == total else f" (in the {read:,} of {total:,} ids read)"
        if top >= vocab_size:
            raise TrainError(f"{prefix}.bin: token id {top:,} >= the model's vocab_size {vocab_size:,}{part}: the data "
                             "was tokenized for another vocabulary")
        if 0 <= top < BYTE_VOCAB_SIZE and read >= 64:
            if tokenizer is not None and vocab_size > BYTE_VOCAB_SIZE:
                raise _byte_data_error(f"{prefix}.bin (every id read is < 256{part})", vocab_size, tokenizer)
