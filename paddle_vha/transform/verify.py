"""The one verify / logit-KL path of the checkpoint transforms: run checkpoint folders in Paddle, compare logits.

fold --verify and import_fleet --verify compare on random tokens (a tolerance decides): model_logits runs a folder
one decoder layer at a time in float32 (layerwise.py; another dtype loads the whole model through a folder of
symlinks); compress_kv and convert_to_vha report the KL from the original on held-out text through layerwise.py and
text.py. The folders compared are never modified.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Dict, Iterable, Sequence

import numpy as np

from ..checkpoint.folder import CheckpointFolder
from ..checkpoint.fsutil import linked_view, scratch_dir

__all__ = ["random_tokens", "model_logits", "nonfinite_sides", "left_unchanged", "folder_logits"]


def random_tokens(vocab: int, num_sequences: int, seq_len: int, seed: int = 0) -> np.ndarray:
    """[num_sequences, seq_len] token ids drawn uniformly from the vocabulary."""
    return np.random.default_rng(seed).integers(0, vocab, size=(num_sequences, seq_len))


def model_logits(model_dir: str, token_batches: Iterable[np.ndarray], model_cls, dtype: str = "float32") -> np.ndarray:
    """Logits (float64 numpy, batches concatenated on axis 0) of the checkpoint folder `model_dir` run as
    `model_cls`; ids at or above the vocabulary size wrap modulo it (byte tokens on a smaller vocabulary).

    float32 (the default) runs one decoder layer at a time (transform/layerwise.py: memory of one layer plus these
    tokens' logits, whatever the depth); another dtype loads the whole model through from_pretrained."""
    import paddle

    batches = [np.asarray(x) for x in token_batches]
    if dtype == "float32":
        from .layerwise import final_hidden, folder_weights

        w = folder_weights(model_dir, model_cls)
        hidden = final_hidden(w, [x % w.config.vocab_size for x in batches])  # (N, S, h)
        return np.concatenate([(hidden @ block.T).astype(np.float64) for _, block in w.rows(w.head)], axis=-1)
    with scratch_dir("vha-logits-") as tmp:
        model = model_cls.from_pretrained(linked_view(model_dir, os.path.join(tmp, "m")), dtype=dtype)
        model.eval()
        vocab = model.config.vocab_size
        outs = []
        with paddle.no_grad():
            for x in batches:
                outs.append(model(paddle.to_tensor(x % vocab), return_dict=True).logits.astype("float64").numpy())
        del model
    return np.concatenate(outs)


def nonfinite_sides(cmp: Dict, sides: Sequence[str]) -> str:
    """compare_logits' `nonfinite` ("reference", "compared" or both) in the caller's words: sides = (what the
    reference is, what the compared model is), e.g. ("the original model's", "the compressed model's")."""
    which = dict(zip(("reference", "compared"), sides))
    return " and ".join(which[w] for w in cmp["nonfinite"].split(" and "))


def _listing(path: str):
    return sorted((f, os.stat(os.path.join(path, f)).st_size, os.stat(os.path.join(path, f)).st_mtime_ns)
                  for f in os.listdir(path))


@contextmanager
def left_unchanged(*folders: str):
    """RuntimeError after the block if any folder's listing (names, sizes, mtimes) changed: verification reads only."""
    before = [_listing(f) for f in folders]
    yield
    if [_listing(f) for f in folders] != before:
        raise RuntimeError(f"verify modified {' or '.join(folders)}; this is a bug")


def folder_logits(folder: str, ids: np.ndarray) -> np.ndarray:
    """Logits of a checkpoint folder of a family with no Paddle model (Qwen3-MoE, Qwen3-MoE-VHA) from its tensors in
    float64 numpy (paddle_vha/moe/reference.py), read one tensor at a time as the layers ask for them."""
    from ..checkpoint import safetensors_io as st
    from ..families import family_of
    from ..moe.reference import reference_logits

    ck = CheckpointFolder.open(folder)
    cfg = family_of(ck).load_config(ck)
    return reference_logits(ids, lambda n: st.to_float64(ck.read(n)), lambda n: n in ck.tensors, cfg)
