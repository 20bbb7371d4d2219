"""The text a transform calibrates on and reports its logit KL on, as the checkpoint's own token ids.

Source: --calib-data FILE (.txt: the whole file; .jsonl: the "text" field of every line), split into a calibration
part (the first 90% of its tokens) and a held-out part (the last 10%); by default the embedded standard-library
corpus (paddle_vha/train/corpus.py: its training split for calibration, its validation split held out).

Tokens: the checkpoint's tokenizer.json (the `tokenizers` package) when IN_DIR has one; byte values when it has none
and its vocabulary is byte-sized (< BYTE_LEVEL_MAX entries: the toy checkpoints; ids at or above the vocabulary wrap
modulo it, as before); anything else is refused in one line (a 151,936-entry vocabulary fed byte values would measure
nothing).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

__all__ = ["TextTokens", "load_text", "BYTE_LEVEL_MAX", "TOKENIZER_FILE"]

BYTE_LEVEL_MAX = 1024
TOKENIZER_FILE = "tokenizer.json"
HELD_OUT = 0.1  # the last tenth of a --calib-data file's tokens is held out for the KL
DEFAULT_TEXT_MB = 2.0  # of the embedded corpus (tokenized: its first MB or so is plenty)
TOKENIZED_TEXT_CHARS = 600_000  # characters of each split of the embedded corpus fed to a tokenizer


@dataclass
class TextTokens:
    """Token streams (int64) for calibration (`train`) and the KL (`val`), and what they are, in words."""

    train: np.ndarray
    val: np.ndarray
    source: str  # "the embedded standard-library corpus" or the file
    tokens_how: str  # "tokenized with the checkpoint's tokenizer" / "as byte ids (...)"
    byte_level: bool

    def windows(self, split: str, count: int, seq_len: int, batch_size: int = 4,
                seed: int = 0) -> List[Tuple[np.ndarray, np.ndarray]]:
        """(inputs, next-token labels) batches [batch_size, seq_len]: `count` batches of random windows of the
        calibration stream (split "train", drawn with `seed`) or of the held-out stream (split "val", fixed: seed 0)."""
        data = self.train if split == "train" else self.val
        rng = np.random.default_rng(seed if split == "train" else 0)
        out = []
        for _ in range(count):
            starts = rng.integers(0, len(data) - seq_len - 1, size=batch_size)
            win = np.stack([data[s:s + seq_len + 1] for s in starts]).astype(np.int64)  # (B, S+1)
            out.append((win[:, :-1], win[:, 1:]))
        return out

    def describe(self, tokens: int, split: str) -> str:
        part = {"train": "", "val": "held-out "}[split]
        return f"{tokens} {part}tokens of {self.source}, {self.tokens_how}"


def _read_documents(path: str, error, flag: str = "--calib-data") -> List[str]:
    """The documents of a --calib-data file: a .jsonl's "text" fields, or the whole of any other file (refused when it
    is empty, or binary: NUL bytes)."""
    try:
        with open(path, encoding="utf-8") as f:
            if path.endswith(".jsonl"):
                docs = []
                for k, line in enumerate(f, 1):
                    if line.strip():
                        obj = json.loads(line)
                        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                            raise ValueError(f"line {k} has no string \"text\" field")
                        docs.append(obj["text"])
            else:
                docs = [f.read()]
    except OSError as e:
        raise error(f"{flag} {path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise error(f"{flag} {path}: not UTF-8 text (a binary file?)") from None
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise error(f"{flag} {path}: not JSON lines with a \"text\" field ({str(e).splitlines()[0]})") from None
    if not any(d.strip() for d in docs):
        raise error(f"{flag} {path}: no text in it (empty, or only whitespace)")
    if any("\0" in d for d in docs):
        raise error(f"{flag} {path}: a binary file (it holds NUL bytes), not text")
    return docs


def _encoder(in_dir: str, vocab: int, error):
    """(encode(list of texts) -> token stream, how in words, byte_level) for the checkpoint in `in_dir`."""
    path = os.path.join(in_dir, TOKENIZER_FILE)
    if os.path.isfile(path):
        from ..checkpoint.tokenizer_file import guarded, open_tokenizer

        tok = open_tokenizer(path, error)
        batch = guarded(tok.encode_batch, path, "encode", error)

        def encode(docs):
            ids = [np.asarray(e.ids, np.int64) for e in batch(docs, add_special_tokens=False)]
            return np.concatenate(ids) if ids else np.zeros(0, np.int64)
        return encode, "tokenized with the checkpoint's tokenizer", False
    if vocab >= BYTE_LEVEL_MAX:
        raise error(f"{in_dir}: no {TOKENIZER_FILE}, and its {vocab}-token vocabulary is not byte-level: calibration "
                    f"and the KL need the model's own tokenizer (copy its {TOKENIZER_FILE} into the folder)")

    def encode_bytes(docs):
        return np.frombuffer("\0".join(docs).encode("utf-8"), np.uint8).astype(np.int64) % vocab
    return encode_bytes, f"as byte ids (a byte-level checkpoint: {vocab}-token vocabulary, no {TOKENIZER_FILE})", True


def _check_range(tokens: np.ndarray, vocab: int, in_dir: str, error) -> None:
    if len(tokens) and int(tokens.max()) >= vocab:
        raise error(f"{in_dir}/{TOKENIZER_FILE}: produces token id {int(tokens.max())}, outside the model's "
                    f"{vocab}-token vocabulary")


def load_text(in_dir: str, vocab: int, calib_data: Optional[str], error, min_tokens: int = 130,
              flag: str = "--calib-data", source: Optional[str] = None) -> TextTokens:
    """The calibration and held-out token streams for the checkpoint in `in_dir` (see the module docstring);
    `error` (one line) when the text cannot be read or tokenized, or a stream is shorter than `min_tokens`. `flag`:
    the option that named the file, in messages; `source`: the file's description in words (its path otherwise)."""
    encode, how, byte_level = _encoder(in_dir, vocab, error)
    if calib_data is None:
        from ..train.corpus import load_stdlib_corpus

        corpus = load_stdlib_corpus(max_bytes=int(DEFAULT_TEXT_MB * (1 << 20)))
        if byte_level:  # exactly the bytes the toy checkpoints' tests were written against
            train, val = corpus.train.astype(np.int64) % vocab, corpus.val.astype(np.int64) % vocab
        else:
            split = lambda a: a.tobytes()[:TOKENIZED_TEXT_CHARS].decode("utf-8", "replace").split("\0")  # noqa: E731
            train, val = encode(split(corpus.train)), encode(split(corpus.val))
        source = "the embedded standard-library corpus"
    else:
        tokens = encode(_read_documents(calib_data, error, flag))
        cut = int(len(tokens) * (1 - HELD_OUT))
        train, val, source = tokens[:cut], tokens[cut:], source or calib_data
    for name, part in (("calibration", train), ("held-out", val)):
        if len(part) < min_tokens:
            raise error(f"{flag} {source}: its {name} part has {len(part)} tokens, fewer than the {min_tokens} "
                        "one window needs (the last 10% of a file's tokens are held out for the KL)")
    _check_range(np.concatenate([train, val]), vocab, in_dir, error)
    return TextTokens(train, val, source, how, byte_level)
