"""Stock Qwen3 -> Qwen3-MEA by the MEA paper's SVD (eq. 23): fewer cached KV heads, HLC rebuilds the originals.

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
keys come out ||W^(j)|| times too large).

IN_DIR is only read (tensors through safetensors headers and pread; models for the KL check load through a
folder of symlinks); OUT_DIR appears only when complete (temporary folder, then rename).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np


from ..accounting import arch_from_config, kv_bytes_per_token
from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import CheckpointError
from ..checkpoint.folder import produced_or_copied, read_finite_float64, write_checkpoint_folder
from ..checkpoint.fsutil import atomic_dir, check_output_dir, linked_view
from ..evaluate import compare_logits, log_softmax
from ..qwen3.source import open_stock_qwen3
from ..units import fmt_bytes
from .config import K_NORM_POSITIONS, MEAConfigError, Qwen3MEAConfig
from .spec import tensor_shapes as mea_tensor_shapes
from .layers import parse_layer_spec

__all__ = ["CompressError", "CompressPlan", "svd_compress", "plan_compress", "compress_checkpoint", "format_plan",
           "logit_kl"]

DTYPE_CHOICES = ("auto", "float32", "float64", "bfloat16", "float16")


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


@dataclass
class CompressPlan:
    in_dir: str
    out_dir: str
    in_config: dict
    out_config: dict
    cfg: Qwen3MEAConfig
    out_code: str
    inputs: Dict[str, "st.TensorRef"]
    out_shapes: Dict[str, Tuple[int, ...]]
    layers: List[int]
    copy_files: List[str]
    force: bool = False  # replace an existing OUT_DIR (one this project wrote)
    errors: Dict[int, Tuple[float, float]] = field(default_factory=dict)  # layer -> (rel err W_K, rel err W_V)

    @property
    def bytes_out(self) -> int:
        return sum(int(np.prod(s)) * st.DTYPES[self.out_code].itemsize for s in self.out_shapes.values())


def plan_compress(src, out_dir: str, kv_heads: int, layers: str = "all", k_norm: str = "after_hlc",
                  dtype: str = "auto", force: bool = False) -> CompressPlan:
    """Validate `src` (a stock Qwen3 checkpoint: path or CheckpointFolder) and the request from headers alone; reads no
    tensor data."""
    if dtype not in DTYPE_CHOICES:
        raise CompressError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPE_CHOICES)}")
    if k_norm not in K_NORM_POSITIONS:
        raise CompressError(f"--k-norm {k_norm!r}: expected one of {', '.join(K_NORM_POSITIONS)}")
    ck, src_cfg = open_stock_qwen3(src, CompressError)
    in_dir, raw = ck.path, ck.config
    H_kv = src_cfg.num_key_value_heads
    if not (isinstance(kv_heads, int) and 1 <= kv_heads <= H_kv):
        raise CompressError(f"--kv-heads {kv_heads}: must be between 1 and the checkpoint's {H_kv} KV heads")
    try:
        layer_list = parse_layer_spec(layers, src_cfg.num_hidden_layers)
    except MEAConfigError as e:
        raise CompressError(f"--layers: {e}") from None
    check_output_dir(out_dir, [in_dir], force, CompressError)

    ck.require_float()
    inputs = ck.tensors
    out_code = inputs["model.embed_tokens.weight"].dtype if dtype == "auto" else st.dtype_code(dtype)

    out_raw = {k: v for k, v in raw.items() if k not in ("_name_or_path", "transformers_version")}
    out_raw.update(model_type=Qwen3MEAConfig.model_type, architectures=["Qwen3MEAForCausalLM"], num_key_value_heads=kv_heads,
                   mea_kv_heads=H_kv, mea_stock_kv_heads=H_kv, mea_layers=layer_list, mea_group_norm=False,
                   mea_k_norm_position=k_norm, dtype=st.dtype_name(out_code))
    out_raw.pop("torch_dtype", None)
    try:
        cfg = Qwen3MEAConfig.from_dict(out_raw)
    except (ValueError, TypeError) as e:
        raise CompressError(f"{in_dir}/config.json: cannot describe the compressed model ({e})") from None
    copy_files, _ = ck.side_files()
    return CompressPlan(in_dir, out_dir, raw, out_raw, cfg, out_code, inputs, mea_tensor_shapes(cfg), layer_list,
                        copy_files, force)


def format_plan(plan: CompressPlan) -> str:
    c = plan.cfg
    H_kv, n_p, L, d = c.mea_kv_heads, c.num_key_value_heads, c.num_hidden_layers, c.head_dim
    elem = st.DTYPES[plan.out_code].itemsize
    before = kv_bytes_per_token(arch_from_config(plan.in_config), elem, all_layers=True)
    after = kv_bytes_per_token(arch_from_config(plan.out_config), elem, all_layers=True)
    return "\n".join([
        f"compress {plan.in_dir} -> {plan.out_dir}",
        f"  Qwen3: {L} layers, {c.num_attention_heads} query heads, {H_kv} KV heads, head_dim {d}, hidden {c.hidden_size}",
        f"  MEA layers ({len(plan.layers)} of {L}): {_ranges(plan.layers)}; KV heads there {H_kv} -> {n_p} physical "
        f"(HLC rebuilds {H_kv} virtual); k_norm {c.mea_k_norm_position}",
        f"  KV cache per token ({st.dtype_name(plan.out_code)}): {fmt_bytes(before, fixed=True)} -> "
        f"{fmt_bytes(after, fixed=True)} "
        f"({after / before:.1%})",
        f"  output: {len(plan.out_shapes)} tensors, {fmt_bytes(plan.bytes_out, fixed=True)}; copied files: "
        f"{', '.join(plan.copy_files) or 'none'}",
    ])


def _ranges(layers: List[int]) -> str:
    out, start = [], None
    for i, x in enumerate(layers):
        if start is None:
            start = x
        if i + 1 == len(layers) or layers[i + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


def compress_checkpoint(plan: CompressPlan, progress: bool = True, max_shard_size="5GB", check=None) -> str:
    """Compute the compressed tensors and write OUT_DIR atomically; fills plan.errors. Returns OUT_DIR.

    check(folder): run on the complete folder before it becomes OUT_DIR (the CLI's logit KL); if it raises, nothing is
    written. CompressError (one line naming the tensor) for a NaN or Inf in an input, or a value --dtype cannot hold.
    """
    from tqdm import tqdm

    c = plan.cfg
    H_kv, n_p, d = c.mea_kv_heads, c.num_key_value_heads, c.head_dim
    out: Dict[str, np.ndarray] = {}

    def read(n):  # float64 math on finite inputs only
        return read_finite_float64(plan.inputs, n, CompressError, "compress")

    for i in tqdm(plan.layers, desc="svd", disable=not progress, leave=False):
        p = f"model.layers.{i}.self_attn."
        errs = []
        for t in ("k", "v"):
            bias = read(p + f"{t}_proj.bias") if c.attention_bias else None
            w_phys, b_phys, lc, err = svd_compress(read(p + f"{t}_proj.weight"), bias, H_kv, d, n_p,
                                                   norm_columns=(t == "k" and c.mea_k_norm_position == "before_hlc"))
            out[p + f"{t}_proj.weight"], out[p + f"mea_{t}_lc"] = w_phys, lc
            if b_phys is not None:
                out[p + f"{t}_proj.bias"] = b_phys
            errs.append(err)
        plan.errors[i] = tuple(errs)

    try:
        max_bytes = st.parse_size(max_shard_size)
    except ValueError as e:
        raise CompressError(f"--max-shard-size: {e}") from None
    names = sorted(plan.out_shapes, key=st.natural_key)
    shards = st.plan_shards([(n, plan.out_code, tuple(plan.out_shapes[n])) for n in names], max_bytes)
    out_dir = os.path.abspath(plan.out_dir)
    chunks = produced_or_copied(plan.inputs, out, CompressError, "compress")

    # --force: an existing OUT_DIR is replaced only by a complete, checked new folder (fsutil's output rule)
    with atomic_dir(out_dir, tool="compress_kv", replace=plan.force, error=CompressError) as tmp:
        bar = tqdm(total=len(names), desc="write", disable=not progress, leave=False)
        write_checkpoint_folder(tmp, shards, chunks, plan.out_config, plan.bytes_out, plan.in_dir, plan.copy_files,
                                on_written=lambda name, nbytes: bar.update(1))
        bar.close()
        if check is not None:
            check(tmp)
    return out_dir


def logit_kl(in_dir: str, out_dir: str, batches: int = 4, seq_len: int = 128, batch_size: int = 4,
             corpus_mb: float = 2.0) -> Dict[str, float]:
    """Original (IN_DIR, stock Qwen3) vs compressed (OUT_DIR, Qwen3-MEA) on validation text, in fp32 Paddle.

    Text: the embedded standard-library corpus as byte tokens (ids >= vocab_size wrap modulo vocab_size).
    Returns mean_kl = mean over positions of KL(original || compressed) in nats, max_rel = max |logit diff| /
    max |logit|, and the original's own cross-entropy (nats/token) for scale.
    """
    import paddle
    from paddleformers.transformers import Qwen3ForCausalLM

    from ..train.corpus import load_stdlib_corpus
    from .modeling import Qwen3MEAForCausalLM

    corpus = load_stdlib_corpus(max_bytes=int(corpus_mb * (1 << 20)))
    windows = corpus.val_batches(batch_size, seq_len, batches)
    logits = {}
    with tempfile.TemporaryDirectory(prefix="mea-kl-") as tmp:
        for key, cls, path in (("orig", Qwen3ForCausalLM, in_dir), ("mea", Qwen3MEAForCausalLM, out_dir)):
            model = cls.from_pretrained(linked_view(path, os.path.join(tmp, key)), dtype="float32")
            model.eval()
            vocab = model.config.vocab_size
            outs = []
            with paddle.no_grad():
                for x, _ in windows:
                    outs.append(model(paddle.to_tensor(x % vocab), return_dict=True).logits.astype("float64").numpy())
            logits[key] = np.concatenate(outs)
            del model
    a, b = logits["orig"], logits["mea"]
    cmp = compare_logits(a, b)
    if cmp["nonfinite"]:
        which = {"reference": "the original model's", "compared": "the compressed model's"}
        raise CompressError("logit KL: " + " and ".join(which[w] for w in cmp["nonfinite"].split(" and ")) +
                            " logits are not finite (NaN or Inf)")
    labels = np.concatenate([y for _, y in windows]) % a.shape[-1]
    ce = -np.take_along_axis(log_softmax(a), labels[..., None], axis=-1).mean()
    return {"mean_kl": cmp["mean_kl"], "max_rel": cmp["max_rel"], "orig_ce": float(ce),
            "tokens": int(a.shape[0] * a.shape[1])}
