"""A stock checkpoint -> MEA over its base (Qwen3 -> Qwen3-MEA, Llama -> Llama-MEA, Qwen2 -> Qwen2-MEA) by the MEA
paper's SVD (eq. 23): fewer cached KV heads, HLC rebuilds the originals.

For one projection of a compressed layer (W_K or W_V, HF layout [H*d, h], H = the original KV heads):

    M[:, j]  = vec(W^(j))  (with the bias appended as one more input column)     M: [(h+1)*d, H]
    M        = U S V^T,  keep the top n_p singular directions
    physical head p   = U[:, p]  reshaped to [d, h] (+ bias)                      -> k_proj / v_proj [n_p*d, h]
    HLC coefficients  = S[:n_p] V[:, :n_p]^T                                      -> mea_k_lc / mea_v_lc [n_p, H]

so HLC(x W_phys) = x (U_n S_n V_n^T) ~= x W, exactly when n_p = H. The relative reconstruction error is
||M - M_n||_F / ||M||_F = sqrt(sum of dropped s^2 / sum of s^2).

k_norm (docs/mea.md): with 'after_hlc' (default) it acts on the rebuilt virtual heads, exactly as in the
original model. With 'before_hlc' it acts on each physical head, whose weights are unit-norm columns of U, so the
K-side coefficients of virtual head j are divided by ||M[:, j]|| (a data-free rescale; without it the virtual
keys come out ||W^(j)|| times too large). A base without k_norm (Llama, Qwen2) has no such choice: RoPE commutes with
HLC, and both positions are the same function.

IN_DIR is only read (tensors through safetensors headers and pread; models for the KL check load through a
folder of symlinks); OUT_DIR appears only when complete (temporary folder, then rename).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import CheckpointError
from ..transform import Description, Entry, TransformPlan, check_dtype, output_code, write_plan
from ..transform.describe import kv_cache_line, output_line
from ..transform.plan import open_output
from ..mea.config import K_NORM_POSITIONS, MEAConfigError
from ..mea.layers import parse_layer_spec
from .source import open_stock

__all__ = ["CompressError", "CompressPlan", "svd_compress", "plan_compress", "compress_layer", "LayerTensors",
           "compress_checkpoint", "logit_kl"]


class CompressError(CheckpointError):
    """A checkpoint or request compress_kv refuses; the message is one line naming the problem."""


def svd_compress(w: np.ndarray, bias: Optional[np.ndarray], n_heads: int, head_dim: int, n_p: int,
                 norm_columns: bool = False):
    """One projection: W [n_heads*d, h] (+ bias [n_heads*d]) -> (W_phys [n_p*d, h], b_phys or None, lc [n_p, n_heads], rel_err).

    norm_columns: divide column j of lc by ||M[:, j]|| (the 'before_hlc' rescale, K side).
    """
    d = head_dim
    w = np.asarray(w, np.float64)
    aug = w if bias is None else np.concatenate([w, np.asarray(bias, np.float64)[:, None]], axis=1)  # [H*d, h(+1)]
    cols = aug.shape[1]
    M = aug.reshape(n_heads, d * cols).T  # column j = head j's [d, cols] block, row-major flattened
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    phys = U[:, :n_p].T.reshape(n_p * d, cols)
    lc = s[:n_p, None] * Vt[:n_p]
    total = float((s ** 2).sum())
    rel_err = float(np.sqrt(max((s[n_p:] ** 2).sum(), 0.0) / total)) if total > 0 else 0.0
    if norm_columns:
        lc = lc / np.maximum(np.linalg.norm(M, axis=0), 1e-30)[None, :]
    if bias is None:
        return phys, None, lc, rel_err
    return phys[:, :-1], phys[:, -1], lc, rel_err


@dataclass(kw_only=True)
class CompressPlan(TransformPlan):
    """plan_compress's plan: cfg is the MEA config written (of `target`, the MEA family over the source's base);
    `layers` the compressed layers."""

    tool, verb = "compress_kv", "compress"
    error = CompressError

    layers: List[int]
    errors: Dict[int, Tuple[float, float]] = field(default_factory=dict)  # layer -> (rel err W_K, rel err W_V)

    def describe(self) -> Description:
        c = self.cfg
        H_kv, n_p, L, d = c.mea_kv_heads, c.num_key_value_heads, c.num_hidden_layers, c.head_dim
        return Description(f"compress {self.in_dir} -> {self.out_dir}", [
            f"{self.source_family.label}: {L} layers, {c.num_attention_heads} query heads, {H_kv} KV heads, head_dim {d}, "
            f"hidden {c.hidden_size}",
            f"MEA layers ({len(self.layers)} of {L}): {_ranges(self.layers)}; KV heads there {H_kv} -> {n_p} physical "
            f"(HLC rebuilds {H_kv} virtual); k_norm {c.mea_k_norm_position}",
            kv_cache_line(self),
            output_line(self),
        ], notes=self.notes)


def _compressed_config(raw: dict, in_dir: str, kv_heads: int, stock_kv: int, layers: List[int], k_norm: str,
                       code: str, target):
    """(config.json, config object) of the compressed model, of family `target`."""
    out_raw = {k: v for k, v in raw.items() if k not in ("_name_or_path", "transformers_version")}
    out_raw.update(model_type=target.model_type, architectures=[target.causal_lm_name],
                   num_key_value_heads=kv_heads, mea_kv_heads=stock_kv, mea_stock_kv_heads=stock_kv, mea_layers=layers,
                   mea_group_norm=False, mea_k_norm_position=k_norm, dtype=st.dtype_name(code))
    out_raw.pop("torch_dtype", None)
    try:
        return out_raw, target.config_class.from_dict(out_raw)
    except (ValueError, TypeError) as e:
        raise CompressError(f"{in_dir}/config.json: cannot describe the compressed model ({e})") from None


def _svd_names(layers: List[int], bias: bool) -> set:
    """The tensors compress_checkpoint computes: k/v projections (and biases) and HLC coefficients of MEA layers."""
    leaves = ["k_proj.weight", "v_proj.weight", "mea_k_lc", "mea_v_lc"]
    leaves += ["k_proj.bias", "v_proj.bias"] if bias else []
    return {f"model.layers.{i}.self_attn.{leaf}" for i in layers for leaf in leaves}


def plan_compress(src, out_dir: str, kv_heads: int, layers: str = "all", k_norm: str = "after_hlc",
                  dtype: str = "auto", force: bool = False, max_shard_size="5GB") -> CompressPlan:
    """Validate `src` (a stock checkpoint of a base with an MEA variant: path or CheckpointFolder) and the request from
    headers alone; reads no tensor data."""
    check_dtype(dtype, CompressError)
    if k_norm not in K_NORM_POSITIONS:
        raise CompressError(f"--k-norm {k_norm!r}: expected one of {', '.join(K_NORM_POSITIONS)}")
    source = open_stock(src, CompressError, "mea")
    ck, src_cfg = source.folder, source.config
    H_kv = src_cfg.num_key_value_heads
    if not (isinstance(kv_heads, int) and 1 <= kv_heads <= H_kv):
        raise CompressError(f"--kv-heads {kv_heads}: must be between 1 and the checkpoint's {H_kv} KV heads")
    try:
        layer_list = parse_layer_spec(layers, src_cfg.num_hidden_layers)
    except MEAConfigError as e:
        raise CompressError(f"--layers: {e}") from None
    open_output(ck, out_dir, force, CompressError)
    code = output_code(dtype, ck.tensors)
    out_raw, cfg = _compressed_config(ck.config, ck.path, kv_heads, H_kv, layer_list, k_norm, code, source.target)
    made = _svd_names(layer_list, "model.layers.0.self_attn.k_proj.bias" in ck.tensors)  # the base's k/v biases
    entries = [Entry(n, tuple(shape), code, "svd" if n in made else "copy", (n,))
               for n, shape in source.target.tensor_shapes(cfg).items()]
    return CompressPlan.build(ck, out_dir, entries, max_shard_size, cfg=cfg, out_config=out_raw, out_code=code,
                              force=force, layers=layer_list, source_family=source.family, target=source.target)


def _ranges(layers: List[int]) -> str:
    out, start = [], None
    for i, x in enumerate(layers):
        if start is None:
            start = x
        if i + 1 == len(layers) or layers[i + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


def compress_layer(plan: CompressPlan, i: int) -> Dict[str, np.ndarray]:
    """The SVD of layer i's k/v projections (float64, on-disk layout); sets plan.errors[i]."""
    c = plan.cfg
    H_kv, n_p, d = c.mea_kv_heads, c.num_key_value_heads, c.head_dim
    read, p = plan.read_float64, f"model.layers.{i}.self_attn."  # float64 math on finite inputs only
    out: Dict[str, np.ndarray] = {}
    errs = []
    for t in ("k", "v"):
        bias = read(p + f"{t}_proj.bias") if p + f"{t}_proj.bias" in plan.source.tensors else None
        w_phys, b_phys, lc, err = svd_compress(read(p + f"{t}_proj.weight"), bias, H_kv, d, n_p,
                                               norm_columns=(t == "k" and c.mea_k_norm_position == "before_hlc"))
        out[p + f"{t}_proj.weight"], out[p + f"mea_{t}_lc"] = w_phys, lc
        if b_phys is not None:
            out[p + f"{t}_proj.bias"] = b_phys
        errs.append(err)
    plan.errors[i] = tuple(errs)
    return out


class LayerTensors:
    """name -> compressed tensor (float64), one layer at a time (the layer of the requested name is computed on
    first request, the previous one dropped); None for a tensor that is copied."""

    def __init__(self, plan: CompressPlan):
        self.plan, self._made = plan, {e.name for e in plan.entries if e.how == "svd"}
        self._layer, self._tensors = None, {}

    def __call__(self, name: str) -> Optional[np.ndarray]:
        if name not in self._made:
            return None
        i = int(name.split(".")[2])
        if i != self._layer:
            self._tensors = {}
            self._tensors, self._layer = compress_layer(self.plan, i), i
        return self._tensors[name]


def compress_checkpoint(plan: CompressPlan, progress: bool = True, check=None) -> str:
    """Compute the compressed tensors (one layer at a time) and write OUT_DIR atomically; fills plan.errors.

    check(folder): run on the complete folder before it becomes OUT_DIR (the CLI's logit KL); if it raises, nothing is
    written. CompressError (one line naming the tensor) for a NaN or Inf in an input, or a value --dtype cannot hold.
    """
    made = LayerTensors(plan)
    return write_plan(plan, lambda entry: made(entry.name), progress, check=check)


def logit_kl(in_dir: str, out_dir: str, batches: int = 4, seq_len: int = 128, batch_size: int = 4,
             text=None, pass_tokens: int = 4096) -> Dict[str, float]:
    """Original (IN_DIR, stock) vs compressed (OUT_DIR, MEA) on held-out text, in fp32 Paddle, one decoder layer at a
    time (transform/layerwise.py), each as its family's model.

    text: transform.text.load_text's (default: the embedded corpus as the checkpoint's tokens). Returns mean_kl =
    mean over positions of KL(original || compressed) in nats, max_rel = max |logit diff| / max |logit|, the
    original's own cross-entropy (nats/token) for scale, and the text in words (`text`)."""
    from .layerwise import compare_weights, folder_weights, passes
    from .text import load_text

    ref = folder_weights(in_dir)
    text = text or load_text(in_dir, ref.config.vocab_size, None, CompressError)
    windows = text.windows("val", batches, seq_len, batch_size)
    labels = np.concatenate([y for _, y in windows])
    r = compare_weights(ref, folder_weights(out_dir), passes([x for x, _ in windows], pass_tokens), labels)
    if r["nonfinite"]:
        names = r["nonfinite"].replace("reference", "the original model's").replace("compared",
                                                                                    "the compressed model's")
        raise CompressError(f"logit KL: {names} logits are not finite (NaN or Inf)")
    return {"mean_kl": r["mean_kl"], "max_rel": r["max_rel"], "orig_ce": r["ref_ce"], "tokens": r["tokens"],
            "text": text.describe(r["tokens"], "val")}
