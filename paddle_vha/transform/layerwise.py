"""A model's forward in memory bounded by one decoder layer: what the transforms' calibration and logit KL run.

The family's own model class is built under `paddle.LazyGuard` (no parameter memory), in float32 (Paddle's CPU has
no bfloat16 matmul). Its real backbone forward runs on `inputs_embeds` gathered from the embedding's rows; a forward
pre-hook on decoder layer i sets that layer's parameters from the weights (`Weights.read`, on-disk layout: Linear
weights [out, in], transposed here as checkpoint/load.py does) and a post-hook frees them, so one layer's float32
weights are held at a time. The LM head never runs inside the model: `logit_stats` streams its rows (vocabulary
chunks) against the final hidden states of two models and accumulates, in float64, the same numbers as
paddle_vha.evaluate.compare_logits (max_abs, max_rel, mean_kl) plus the reference's cross-entropy, without ever
holding positions x vocabulary logits.

Memory of one pass over T tokens (batch B x length S), float32: the largest layer's weights (twice: numpy and
Paddle), about T * (6 * hidden + 4 * intermediate) * 4 bytes of activations and B * heads * S^2 * 8 bytes of
attention scores; `passes` splits the token windows so that a pass stays under `pass_tokens`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import CheckpointError, is_linear_weight
from ..checkpoint.folder import CheckpointFolder

__all__ = ["Weights", "folder_weights", "passes", "final_hidden", "attention_moments", "logit_stats",
           "compare_weights", "EMBED", "HEAD"]

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
VOCAB_CHUNK = 8192  # rows of the embedding / LM head read at a time: the vocabulary entries of one logit block
POSITION_CHUNK = 1024  # positions per logit block (float64 blocks of 1024 x 8192: 64 MB)


@dataclass
class Weights:
    """A model to run: its config object (the family's), model class, and its tensors by checkpoint name.

    read(name): the whole tensor (on-disk layout, any float dtype); rows(name): (first row, float32 block) pieces
    of a 2-D tensor, for the embedding and the LM head; head: the name of the LM head's tensor (the embedding when
    tied)."""

    config: object
    model_cls: type
    read: Callable[[str], np.ndarray]
    rows: Callable[[str], Iterator[Tuple[int, np.ndarray]]]  # blocks of VOCAB_CHUNK rows
    head: str


def folder_weights(folder, model_cls=None, override: Optional[Callable[[str], Optional[np.ndarray]]] = None,
                   code: Optional[str] = None, config=None) -> Weights:
    """Weights of a checkpoint folder (path or CheckpointFolder), read tensor by tensor with pread, as the model
    class and config of its family (or `model_cls` and `config`).

    override(name): a computed tensor that replaces the folder's (None: the folder's own): a transform's output
    before it is written, described by `config` and `model_cls`; every tensor is then rounded to safetensors dtype
    `code` as the write would round it."""
    from ..families import family_of

    ck = CheckpointFolder.open(folder)
    if config is None or model_cls is None:
        fam = family_of(ck)
        config = config if config is not None else fam.load_config(ck)
        model_cls = model_cls or fam.model_class
    cfg, cls = config, model_cls
    head = HEAD if HEAD in ck.tensors else EMBED

    def rounded(a: np.ndarray) -> np.ndarray:
        return st.to_float32(st.cast(a, code)) if code is not None else a

    def read(name: str) -> np.ndarray:
        made = override(name) if override is not None else None
        if made is not None:
            return rounded(made)
        if name not in ck.tensors:
            raise CheckpointError(f"{ck.path}: the model needs tensor {name}, which the folder does not hold")
        return rounded(st.to_float32(st.read_tensor(ck.tensors[name])))

    def rows(name: str):
        ref = ck.tensors[name]
        for a in range(0, ref.shape[0], VOCAB_CHUNK):
            yield a, rounded(st.to_float32(st.read_rows(ref, a, min(ref.shape[0], a + VOCAB_CHUNK))))

    return Weights(cfg, cls, read, rows, head)


def passes(windows: Sequence[np.ndarray], pass_tokens: int) -> List[np.ndarray]:
    """The [batch, length] token windows regrouped into passes ([B, S] arrays) of at most pass_tokens tokens each
    (at least one window per pass)."""
    rows = np.concatenate([np.asarray(w).reshape(-1, np.asarray(w).shape[-1]) for w in windows])  # (N, S)
    per = max(1, pass_tokens // rows.shape[1])
    return [rows[i:i + per] for i in range(0, len(rows), per)]


def _gather_rows(w: Weights, ids: np.ndarray) -> np.ndarray:
    """Embedding rows of `ids` (any shape) -> float32 [*ids.shape, hidden], reading the embedding in row blocks."""
    flat = ids.reshape(-1)
    out = None
    for a, block in w.rows(EMBED):
        sel = (flat >= a) & (flat < a + len(block))
        if out is None:
            out = np.empty((len(flat), block.shape[1]), np.float32)
        out[sel] = block[flat[sel] - a]
    return out.reshape(*ids.shape, -1)  # (..., hidden)


def _set(param, value: np.ndarray, name: str) -> None:
    a = value.T if is_linear_weight(name, value.ndim) else value
    if list(a.shape) != list(param.shape):
        raise CheckpointError(f"{name}: shape {list(value.shape)} on disk, the model expects {list(param.shape)} "
                              "(after the Linear transpose)")
    param.set_value(np.ascontiguousarray(a, dtype=np.float32))


def _lazy_model(w: Weights):
    """The family's model, parameters unallocated, float32; the final norm loaded."""
    import paddle

    cfg = copy.deepcopy(w.config)
    cfg.dtype = "float32"
    paddle.set_default_dtype("float32")
    with paddle.LazyGuard():
        model = w.model_cls(cfg)
    model.eval()
    for name, p in model.model.norm.named_parameters():
        _set(p, w.read(f"model.norm.{name}"), f"model.norm.{name}")
    return model


def _layer_hooks(layers, w: Weights):
    """Pre-hooks loading layer i's parameters from `w`, post-hooks freeing them; returns the hook handles."""
    handles = []
    for i, layer in enumerate(layers):
        def load(lay, _inputs, i=i):
            for name, p in lay.named_parameters():
                _set(p, w.read(f"model.layers.{i}.{name}"), f"model.layers.{i}.{name}")

        def free(lay, _inputs, _outputs):
            for _, p in lay.named_parameters():
                p._clear_data()

        handles += [layer.register_forward_pre_hook(load), layer.register_forward_post_hook(free)]
    return handles


def final_hidden(w: Weights, ids_passes: Sequence[np.ndarray],
                 on_model: Optional[Callable[[object], list]] = None) -> np.ndarray:
    """The final-norm hidden states (float32 [N, S, hidden], passes concatenated) of the model `w` on the token
    passes; on_model(model) may register more hooks (it returns their handles). Ids must be < the vocabulary."""
    import paddle

    model = _lazy_model(w)
    handles = _layer_hooks(model.model.layers, w) + (on_model(model) if on_model else [])
    outs = []
    try:
        with paddle.no_grad():
            for ids in ids_passes:
                x = paddle.to_tensor(_gather_rows(w, np.asarray(ids)))
                h = model.model(inputs_embeds=x, use_cache=False, return_dict=True).last_hidden_state
                outs.append(h.numpy().astype(np.float32))
                del x, h
    finally:
        for hk in handles:
            hk.remove()
        del model
    return np.concatenate(outs)


def attention_moments(w: Weights, ids_passes: Sequence[np.ndarray]) -> Dict[int, np.ndarray]:
    """E[x x^T] (float64, hidden x hidden) of every decoder layer's attention input (q_proj's input: the
    input_layernorm output) over the token passes."""
    sums: Dict[int, np.ndarray] = {}

    def hooks(model):
        out = []
        for i, layer in enumerate(model.model.layers):
            def grab(_layer, inputs, i=i):
                x = inputs[0].numpy().reshape(-1, inputs[0].shape[-1]).astype(np.float64)  # (B*S, h)
                sums[i] = sums.get(i, 0.0) + x.T @ x
            out.append(layer.self_attn.q_proj.register_forward_pre_hook(grab))
        return out

    final_hidden(w, ids_passes, hooks)
    count = sum(int(np.asarray(p).size) for p in ids_passes)
    return {i: v / count for i, v in sums.items()}


class _Online:
    """Per-position running log-sum-exp of one model's logits over vocabulary blocks (float64)."""

    def __init__(self, n: int):
        self.m = np.full(n, -np.inf)
        self.s = np.zeros(n)

    def add(self, z: np.ndarray, sl: slice) -> np.ndarray:
        """Fold block z [positions, V_c] in; returns exp(z - new max) and the factor the old sums scale by."""
        m_new = np.maximum(self.m[sl], z.max(1))
        scale = np.exp(self.m[sl] - m_new)
        e = np.exp(z - m_new[:, None])
        self.s[sl] = self.s[sl] * scale + e.sum(1)
        self.m[sl] = m_new
        return e, scale

    def lse(self) -> np.ndarray:
        return self.m + np.log(self.s)


def logit_stats(ref: Weights, ha: np.ndarray, other: Weights, hb: np.ndarray,
                labels: Optional[np.ndarray] = None) -> Dict[str, float]:
    """compare_logits' numbers for the logits ha @ W_ref^T vs hb @ W_other^T (hidden states [..., hidden]), computed
    in vocabulary blocks x position blocks, accumulated in float64: max_abs, max_rel (max |diff| / max |ref|),
    mean_kl (KL(ref || other) per position, nats), nonfinite ("", "reference", "compared" or both) and, with
    labels (same leading shape), ref_ce: the reference's cross-entropy in nats/token."""
    ha, hb = ha.reshape(-1, ha.shape[-1]), hb.reshape(-1, hb.shape[-1])
    n = len(ha)
    la, lb = _Online(n), _Online(n)
    t = np.zeros(n)  # sum_v exp(a_v - m_a) (a_v - b_v)
    at_label = np.zeros(n)
    lab = None if labels is None else np.asarray(labels).reshape(-1)
    bad = {"reference": False, "compared": False}
    max_abs = max_ref = 0.0
    for (v0, wa), (_, wb) in zip(ref.rows(ref.head), other.rows(other.head)):
        for p0 in range(0, n, POSITION_CHUNK):
            sl = slice(p0, min(n, p0 + POSITION_CHUNK))
            a = (ha[sl] @ wa.T).astype(np.float64)  # (P, V_c)
            b = (hb[sl] @ wb.T).astype(np.float64)
            bad["reference"] |= not np.isfinite(a).all()
            bad["compared"] |= not np.isfinite(b).all()
            if bad["reference"] or bad["compared"]:
                continue
            max_abs, max_ref = max(max_abs, float(np.abs(a - b).max())), max(max_ref, float(np.abs(a).max()))
            e, scale = la.add(a, sl)
            t[sl] = t[sl] * scale + (e * (a - b)).sum(1)
            lb.add(b, sl)
            if lab is not None:
                hit = (lab[sl] >= v0) & (lab[sl] < v0 + a.shape[1])
                at_label[sl][hit] = a[hit, lab[sl][hit] - v0]
    nonfinite = " and ".join(k for k, v in bad.items() if v)
    if nonfinite:
        nan = float("nan")
        return {"max_abs": nan, "max_rel": nan, "mean_kl": nan, "ref_ce": nan, "nonfinite": nonfinite}
    kl = t / la.s - la.lse() + lb.lse()
    out = {"max_abs": max_abs, "max_rel": max_abs / max(max_ref, 1e-30), "mean_kl": float(kl.mean()),
           "nonfinite": "", "tokens": n}
    if lab is not None:
        out["ref_ce"] = float((la.lse() - at_label).mean())
    return out


def compare_weights(ref: Weights, other: Weights, ids_passes: Sequence[np.ndarray],
                    labels: Optional[np.ndarray] = None) -> Dict[str, float]:
    """Two models on the same token passes, one layer held at a time: logit_stats of their logits."""
    ha = final_hidden(ref, ids_passes)
    hb = final_hidden(other, ids_passes)
    return logit_stats(ref, ha, other, hb, labels)
