"""A stock GQA or MHA checkpoint -> VHA over its base with N KV heads (Qwen3 -> Qwen3-VHA, Llama -> Llama-VHA,
Qwen2 -> Qwen2-VHA): a start for uptraining (docs/conversion.md).

The converted model keeps every query head as a virtual head (virtual head j = g*H_p + i keeps old query head j,
H_p = H_q / N physical heads), so after uptraining it folds back to a stock GQA-N model of the original's shape and base.
In on-disk layout (Linear weights [out, in]), per attention layer:

    queries   old block j (d x h) ~= Premix[g]^T W^(i)   for j = g*H_p + i: one factorization shared by all heads.
              A_i = [Q_(0*H_p+i)^T | ... | Q_((N-1)*H_p+i)^T]  (h x N*d);  stacked over i: A (H_p*h x N*d)
              A ~= W P with P (r x N*d) the top-r right singular vectors of L^T A (L = I for "mean"/"svd", the
              Cholesky-like factor of the attention input's second moment for "calibrated"), so
              Premix[g] = sqrt(N) P[:, g*d:(g+1)*d] and W^(i) = P A_i^T / sqrt(N): the best rank-r fit in that metric.
    keys      the m = H_kv_old / N old KV heads of a new group are averaged (every method): k_norm and RoPE sit
              between k_proj and the scores and admit no d x d map to absorb, and the least-squares single head
              under any weighting shared by the m heads is their mean.
    values    "mean": averaged. "svd" / "calibrated": the best rank-d fit of the group's m heads,
              [V_1^T | ... | V_m^T] ~= V_g^T [T_1 | ... | T_m], with each d x d map T_t absorbed into the o_proj input
              blocks of the query heads that used old head t (values pass no norm or RoPE, so this is exact algebra).
    Postmix   the identity (V = 0; U small and seeded, as a fresh layer's, so V receives gradients).
    premix="off" (the research fork's kv_postmix_only): q_proj is copied (its H_q heads are the virtual heads, no
              Premix); keys, values and Postmix as above. Exact when N = H_kv_old (then only Postmix is added).
    biases    (Qwen2's q/k/v; attention_bias) are one more input column of their projection, [W | b] acting on [x; 1]:
              factorized, averaged or fitted with the weight (a calibrated metric adds E[1 * 1] = 1 to the
              moment's diagonal and no cross term); o_proj's bias is copied.
    q_norm, k_norm (Qwen3), o_proj (but for the T_t above), MLPs, embeddings: copied.

Exact where the model allows it: a checkpoint that came from a fold (tools/fold.py) has rank-r query blocks in exactly
this structure, so converting it back with the same N and r gives the original function (Postmix then lives in
o_proj); tested. For a general GQA model the conversion is an approximation and uptraining does the rest.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import numpy as np

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import CheckpointError
from ..transform import Description, Entry, TransformPlan, check_dtype, output_code, write_plan
from ..transform.describe import kv_cache_line, output_line
from ..transform.plan import open_output
from ..vha.spec import POSTMIX_TENSORS, PREMIX_TENSORS
from . import regroup as rg
from .source import open_stock

__all__ = ["ConvertError", "ConvertPlan", "METHODS", "PREMIX", "factor_queries", "merge_kv", "plan_convert", "convert_layer",
           "LayerTensors", "convert_state", "calibration_moments", "candidate_weights", "convert_checkpoint",
           "write_candidate", "pool_kv_heads_state"]

METHODS = ("mean", "svd", "calibrated")
PREMIX = ("on", "off")  # --premix: off keeps the stock query heads (the research fork's kv_postmix_only)
(_PREMIX_W,), (_POSTMIX_U, _POSTMIX_V) = PREMIX_TENSORS, POSTMIX_TENSORS  # their names: the VHA spec's
# what convert_state computes in every attention layer (the biases where the base has them); every other tensor is copied
CONVERTED = ("q_proj.weight", _PREMIX_W, "k_proj.weight", "v_proj.weight", "o_proj.weight", _POSTMIX_U, _POSTMIX_V,
             "q_proj.bias", "k_proj.bias", "v_proj.bias")


class ConvertError(CheckpointError):
    """A checkpoint or request convert_to_vha refuses; the message is one line naming the problem."""


# --- one layer (float64 numpy, on-disk layout) ----------------------------------------------------------------

def with_bias(w: np.ndarray, b: Optional[np.ndarray]) -> np.ndarray:
    """[W | b] (out, in + 1): the projection with its bias as one more input column (acting on [x; 1]); W if b is
    None."""
    return w if b is None else np.concatenate([np.asarray(w, np.float64), np.asarray(b, np.float64)[:, None]], axis=1)


def moment_with_bias(moment: Optional[np.ndarray], biased: bool) -> Optional[np.ndarray]:
    """The (h + 1) x (h + 1) moment of [x; 1] for a biased projection: E[x x^T], E[1 * 1] = 1, no cross term (the
    calibration keeps no E[x]); the moment itself otherwise."""
    if moment is None or not biased:
        return moment
    h = moment.shape[0]
    out = np.zeros((h + 1, h + 1))
    out[:h, :h], out[h, h] = moment, 1.0
    return out


def split_bias(w: np.ndarray, biased: bool) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """with_bias's inverse: (W, b), b None when the projection has none."""
    return (w[:, :-1], w[:, -1]) if biased else (w, None)


def _whitener(moment: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """L^T with L L^T = moment (h x h, symmetric PSD): ||L^T x||^2 = x^T moment x. None -> None (plain metric)."""
    if moment is None:
        return None
    lam, vec = np.linalg.eigh(np.asarray(moment, np.float64))
    return np.sqrt(np.clip(lam, 0.0, None))[:, None] * vec.T  # (h, h)


def factor_queries(w_q: np.ndarray, num_heads: int, n_kv: int, head_dim: int, r: int,
                   moment: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray, float]:
    """Stock q_proj [H_v*d, h] -> (VHA q_proj [H_p*r, h], Premix [N, r, d], relative fit error in the metric).

    moment: the attention input's second moment E[x x^T] (h x h) for the calibrated fit, else None.
    """
    d, h = head_dim, w_q.shape[1]
    h_p = num_heads // n_kv
    blocks = np.asarray(w_q, np.float64).reshape(n_kv, h_p, d, h)  # (N, H_p, d, h): block j = g*H_p + i
    a = blocks.transpose(1, 3, 0, 2).reshape(h_p, h, n_kv * d)  # (H_p, h, N*d): A_i = [Q_(g,i)^T]_g
    lt = _whitener(moment)
    aw = a if lt is None else np.matmul(lt[None], a)  # (H_p, h, N*d) in the metric
    _, s, vt = np.linalg.svd(aw.reshape(h_p * h, n_kv * d), full_matrices=False)
    p = vt[:r]  # (r, N*d), orthonormal rows
    scale = np.sqrt(n_kv)
    premix = (scale * p).reshape(r, n_kv, d).transpose(1, 0, 2)  # (N, r, d)
    w = np.matmul(a, p.T) / scale  # (H_p, h, r): W^(i)T
    total = float((s ** 2).sum())
    err = float(np.sqrt(max((s[r:] ** 2).sum(), 0.0) / total)) if total > 0 else 0.0
    return w.transpose(0, 2, 1).reshape(h_p * r, h), premix, err


def merge_kv(w: np.ndarray, n_old: int, n_new: int, head_dim: int, low_rank: bool,
             moment: Optional[np.ndarray] = None) -> Tuple[np.ndarray, Optional[np.ndarray], float]:
    """k_proj / v_proj [H_kv_old*d, h] -> ([N*d, h], maps T [H_kv_old, d, d] or None, relative fit error).

    low_rank=False: each new head is the mean of its m = H_kv_old / N old heads (T = None: nothing to absorb).
    low_rank=True: the best rank-d fit [V_1^T .. V_m^T] ~= V_g^T [T_1 .. T_m] (in the moment's metric if given);
    old head t is then approximated by V_g^T T_t, and T_t must be absorbed downstream (values only).
    """
    d, h = head_dim, w.shape[1]
    m = n_old // n_new
    blocks = np.asarray(w, np.float64).reshape(n_new, m, d, h)  # (N, m, d, h)
    if not low_rank:
        merged = blocks.mean(axis=1)  # (N, d, h)
        diff = blocks - merged[:, None]
        total = float((blocks ** 2).sum())
        err = float(np.sqrt((diff ** 2).sum() / total)) if total > 0 else 0.0
        return merged.reshape(n_new * d, h), None, err
    lt = _whitener(moment)
    out = np.empty((n_new, d, h))
    maps = np.empty((n_new, m, d, d))
    dropped = total = 0.0
    for g in range(n_new):
        b = blocks[g].transpose(2, 0, 1).reshape(h, m * d)  # (h, m*d): [V_1^T | ... | V_m^T]
        bw = b if lt is None else lt @ b
        _, s, vt = np.linalg.svd(bw, full_matrices=False)
        t = np.sqrt(m) * vt[:d]  # (d, m*d): T' T'^T = m I, so identical heads give T_t = orthogonal
        out[g] = (b @ t.T / m).T  # V_g (d, h) = (B T'^T / m)^T
        maps[g] = t.reshape(d, m, d).transpose(1, 0, 2)  # (m, d, d): T_t
        dropped += float((s[d:] ** 2).sum())
        total += float((s ** 2).sum())
    err = float(np.sqrt(dropped / total)) if total > 0 else 0.0
    return out.reshape(n_new * d, h), maps.reshape(n_old, d, d), err


def absorb_value_maps(w_o: np.ndarray, maps: np.ndarray, num_heads: int, n_old: int, head_dim: int) -> np.ndarray:
    """o_proj [h, H_v*d]: input block j (the query head that read old KV head t = j // (H_v / H_kv_old)) becomes
    W_O_j T_t^T, since that head's attention output is now out_j' with out_j ~= out_j' T_t."""
    d = head_dim
    w = np.asarray(w_o, np.float64).reshape(w_o.shape[0], num_heads, d)  # (h, H_v, d)
    group = num_heads // n_old
    t = np.repeat(maps, group, axis=0)  # (H_v, d, d): T of each query head's old KV head
    return np.einsum("hjd,jed->hje", w, t).reshape(w_o.shape)  # block j: W_O_j T_t^T


# --- a whole model ---------------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class ConvertPlan(TransformPlan):
    """plan_convert's plan: cfg is the VHA config written (of `target`, the VHA family over the source's base), src_cfg
    the stock one read (of `source_family`)."""

    tool, verb = "convert_to_vha", "convert"
    error = ConvertError

    src_cfg: object
    method: str
    seed: int = 0
    errors: Dict[int, Tuple[float, float, float]] = field(default_factory=dict)  # layer -> (q, k, v) rel fit error
    regroup: str = "contiguous"  # how the old KV heads of each new one are chosen (transform/regroup.py)
    groups: Dict[int, list] = field(default_factory=dict)  # layer -> the old KV heads of each new KV head

    def describe(self) -> Description:
        c, s = self.cfg, self.src_cfg
        h_p = c.num_attention_heads // c.num_key_value_heads
        queries = (f"{h_p} physical heads (width {c.vha_q_head_dim}) x {c.num_key_value_heads} Premix groups"
                   if c.vha_premix else "the query heads kept, no Premix (--premix off)")
        return Description(f"convert {self.in_dir} -> {self.out_dir} (method {self.method})", [
            f"{self.source_family.label}: {s.num_hidden_layers} layers, {s.num_attention_heads} query heads over {s.num_key_value_heads} "
            f"KV heads, head_dim {s.head_dim}, hidden {s.hidden_size}",
            f"{self.target.label}: {c.num_attention_heads} virtual heads = {queries} over {c.num_key_value_heads} KV heads; "
            f"Postmix rank {c.vha_postmix_rank} (starts as the identity)",
            kv_cache_line(self),
            output_line(self),
        ], notes=self.notes)


def _check_request(src_cfg, in_dir: str, kv_heads, q_head_dim, postmix_rank, premix: bool = True) -> int:
    """The physical query head width r of the request, checked against the stock model; ConvertError otherwise."""
    h_q, h_kv, d = src_cfg.num_attention_heads, src_cfg.num_key_value_heads, src_cfg.head_dim
    if not (isinstance(kv_heads, int) and 1 <= kv_heads <= h_kv and h_kv % kv_heads == 0):
        raise ConvertError(f"--kv-heads {kv_heads}: must divide the checkpoint's {h_kv} KV heads "
                           f"(new groups merge whole old groups)")
    if h_q % kv_heads:
        raise ConvertError(f"--kv-heads {kv_heads}: does not divide the {h_q} query heads")
    r = d if q_head_dim is None else q_head_dim
    if not premix and r != d:
        raise ConvertError(f"--q-head-dim {r} with --premix off: without Premix the query heads stay head_dim = {d} "
                           "wide")
    if not (isinstance(r, int) and 1 <= r <= d):
        raise ConvertError(f"--q-head-dim {r}: must be between 1 and head_dim = {d} (VHA's physical query heads "
                           "are at most head_dim wide)")
    if not (isinstance(postmix_rank, int) and 1 <= postmix_rank <= h_q):
        raise ConvertError(f"--postmix-rank {postmix_rank}: must be between 1 and the {h_q} query heads")
    return r


def _converted_config(raw: dict, in_dir: str, kv_heads: int, r: int, postmix_rank: int, code: str, target,
                      premix: bool = True):
    """(config.json, config object) of the converted model, of family `target`."""
    out_raw = {k: v for k, v in raw.items() if k not in ("_name_or_path", "transformers_version", "torch_dtype")}
    out_raw.update(model_type=target.model_type, architectures=[target.causal_lm_name],
                   num_key_value_heads=kv_heads, vha_q_head_dim=r, vha_postmix_rank=postmix_rank,
                   dtype=st.dtype_name(code), **({} if premix else dict(vha_premix=False)))
    try:
        return out_raw, target.config_class.from_dict(out_raw)
    except (ValueError, TypeError) as e:
        raise ConvertError(f"{in_dir}/config.json: cannot describe the converted model ({e})") from None


def plan_convert(src, out_dir: str, kv_heads: int, q_head_dim: Optional[int] = None, postmix_rank: int = 4,
                 method: str = "svd", dtype: str = "auto", force: bool = False, seed: int = 0,
                 max_shard_size="5GB", premix="on", regroup="contiguous") -> ConvertPlan:
    """Validate `src` (a stock checkpoint of a base with a VHA variant: path or CheckpointFolder) and the request from
    headers alone.
    premix "off": keep q_proj as it is, no Premix (the research fork's kv_postmix_only); regroup: transform/regroup.py."""
    if method not in METHODS:
        raise ConvertError(f"--method {method!r}: expected one of {', '.join(METHODS)}")
    if regroup not in rg.REGROUP:
        raise ConvertError(f"--regroup {regroup!r}: expected one of {', '.join(rg.REGROUP)}")
    if premix not in PREMIX:
        raise ConvertError(f"--premix {premix!r}: expected one of {', '.join(PREMIX)}")
    premix = premix == "on"
    check_dtype(dtype, ConvertError)
    source = open_stock(src, ConvertError, "vha", hint="; a VHA checkpoint folds first (tools/fold.py)")
    ck, src_cfg = source.folder, source.config
    r = _check_request(src_cfg, ck.path, kv_heads, q_head_dim, postmix_rank, premix)
    open_output(ck, out_dir, force, ConvertError)
    code = output_code(dtype, ck.tensors)
    out_raw, cfg = _converted_config(ck.config, ck.path, kv_heads, r, postmix_rank, code, source.target, premix)
    entries = [Entry(n, tuple(shape), code, "convert" if n.rsplit("self_attn.", 1)[-1] in CONVERTED else "copy",
                     (n,)) for n, shape in source.target.tensor_shapes(cfg).items()]
    return ConvertPlan.build(ck, out_dir, entries, max_shard_size, cfg=cfg, out_config=out_raw, out_code=code,
                             force=force, src_cfg=src_cfg, method=method, source_family=source.family,
                             target=source.target, seed=seed, regroup=regroup)


def convert_layer(plan: ConvertPlan, i: int, method: str, moment: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
    """Layer i's converted attention tensors (float64, on-disk layout) for one method; moment: E[x x^T] of its
    attention input (needed by "calibrated"; read by --regroup key-similarity when given). Sets plan.errors[i] and
    plan.groups[i]."""
    c, s = plan.cfg, plan.src_cfg
    if method == "calibrated" and moment is None:
        raise ValueError("the calibrated method needs calibration moments")
    n_new, n_old, d, h_v = c.num_key_value_heads, s.num_key_value_heads, s.head_dim, s.num_attention_heads
    rng = np.random.default_rng([plan.seed, i])  # Postmix's U of layer i: the same whichever layers run first
    read, p = plan.read_float64, f"model.layers.{i}.self_attn."
    mom = moment if method == "calibrated" else None
    if plan.regroup != "contiguous":
        plan.groups[i] = rg.choose_groups(plan.regroup, read(p + "k_proj.weight"), read(p + "v_proj.weight"),
                                          n_old, n_new, d, moment, low_rank=method != "mean", value_moment=mom)
        read = rg.permuted_reader(read, p, rg.head_order(plan.groups[i]), h_v, n_old, d)  # groups made contiguous
    have = set(plan.source.tensors)

    def projection(name):  # [W | b] and whether it has a bias (the bias as one more input column)
        biased = f"{p}{name}.bias" in have
        return with_bias(read(f"{p}{name}.weight"), read(f"{p}{name}.bias") if biased else None), biased

    (wq, q_biased), (wk, k_biased), (wv, v_biased) = map(projection, ("q_proj", "k_proj", "v_proj"))
    if c.vha_premix:
        wq, premix, eq = factor_queries(wq, h_v, n_new, d, c.vha_q_head_dim, moment_with_bias(mom, q_biased))
    else:  # no Premix: the stock query heads are kept as they are
        premix, eq = None, 0.0
    wk, _, ek = merge_kv(wk, n_old, n_new, d, low_rank=False)
    wv, maps, ev = merge_kv(wv, n_old, n_new, d, low_rank=method != "mean", moment=moment_with_bias(mom, v_biased))
    (wq, bq), (wk, bk), (wv, bv) = split_bias(wq, q_biased), split_bias(wk, k_biased), split_bias(wv, v_biased)
    wo = read(p + "o_proj.weight")
    if maps is not None:
        wo = absorb_value_maps(wo, maps, h_v, n_old, d)
    rank = c.vha_postmix_rank
    plan.errors[i] = (eq, ek, ev)
    out = {p + "q_proj.weight": wq, p + _PREMIX_W: premix, p + "k_proj.weight": wk,
           p + "v_proj.weight": wv, p + "o_proj.weight": wo, p + "q_proj.bias": bq, p + "k_proj.bias": bk,
           p + "v_proj.bias": bv,
           p + _POSTMIX_U: rng.normal(0.0, c.vha_postmix_u_init_std, (h_v, rank)),  # (H_v, R)
           p + _POSTMIX_V: np.zeros((h_v, rank))}  # (H_v, R): M = I + V U^T starts as the identity
    return {k: v for k, v in out.items() if v is not None}


class LayerTensors:
    """name -> converted tensor (float64), computed one layer at a time: the layer a requested name belongs to is
    converted on first request and kept until a name of another layer is asked for; None for a tensor the conversion
    copies. The write asks in name order (a layer's tensors together), the layer-wise forward layer by layer, so one
    layer's converted tensors are held at a time."""

    def __init__(self, plan: ConvertPlan, method: str, moments: Optional[Dict[int, np.ndarray]] = None):
        self.plan, self.method, self.moments = plan, method, moments
        self._layer, self._tensors = None, {}

    def __call__(self, name: str) -> Optional[np.ndarray]:
        parts = name.split(".self_attn.")
        if len(parts) != 2 or parts[1] not in CONVERTED:
            return None
        i = int(name.split(".")[2])
        if i != self._layer:
            self._tensors = {}  # the previous layer's arrays go before the next one's are made
            mom = self.moments[i] if self.moments is not None else None
            self._tensors, self._layer = convert_layer(self.plan, i, self.method, mom), i
        return self._tensors[name]

    def __getitem__(self, name: str) -> np.ndarray:
        return self(name)


def convert_state(plan: ConvertPlan, method: str, moments: Optional[Dict[int, np.ndarray]] = None,
                  progress: bool = False) -> Dict[str, np.ndarray]:
    """Every layer's converted attention tensors at once (float64; small models: tools/uptrain_study.py). The tools
    stream instead (LayerTensors). Fills plan.errors."""
    from tqdm import tqdm

    if method == "calibrated" and moments is None:
        raise ValueError("the calibrated method needs calibration moments")
    out: Dict[str, np.ndarray] = {}
    for i in tqdm(range(plan.src_cfg.num_hidden_layers), desc=f"convert ({method})", disable=not progress,
                  leave=False):
        out.update(convert_layer(plan, i, method, moments[i] if moments is not None else None))
    return out


def calibration_moments(in_dir: str, tokens: int, seq_len: int = 128, seed: int = 0, text=None,
                        pass_tokens: int = 4096) -> Dict[int, np.ndarray]:
    """E[x x^T] (float64, h x h) of every layer's attention input (q_proj's input: the input_layernorm output) over
    `tokens` tokens of random windows of the calibration text (`text`: transform.text.load_text's; default the
    embedded corpus as the checkpoint's tokens), run through the original model in fp32 one layer at a time."""
    from .layerwise import attention_moments, folder_weights, passes
    from .text import load_text

    w = folder_weights(in_dir)  # the stock family's model
    text = text or load_text(in_dir, w.config.vocab_size, None, ConvertError)
    batch = 4
    windows = text.windows("train", max(1, -(-tokens // (batch * seq_len))), seq_len, batch, seed)
    return attention_moments(w, passes([x for x, _ in windows], pass_tokens))


def candidate_weights(plan: ConvertPlan, tensors) -> "object":
    """The converted model before it is written (layerwise.Weights): converted tensors from `tensors` (LayerTensors),
    the rest read from IN_DIR, every tensor rounded to the output dtype as the write rounds it."""
    from .layerwise import folder_weights

    return folder_weights(plan.source, plan.target.model_class, override=tensors, code=plan.out_code, config=plan.cfg)


def convert_checkpoint(plan: ConvertPlan, converted, progress: bool = True, check=None) -> str:
    """Write OUT_DIR atomically; converted: LayerTensors (streamed) or convert_state's dict; check(folder) runs on the
    complete folder first."""
    return write_plan(plan, lambda entry: converted[entry.name], progress, check=check)


def write_candidate(plan: ConvertPlan, converted, folder: str) -> str:
    """A converted model written to a scratch folder; the caller removes it."""
    return write_plan(dataclasses.replace(plan, out_dir=folder, force=False), lambda entry: converted[entry.name],
                      progress=False)


# --- GQA -> GQA by mean pooling (the GQA paper's uptraining start; used by tools/uptrain_study.py) ----------------

def pool_kv_heads_state(state: Dict[str, np.ndarray], n_old: int, n_new: int, head_dim: int) -> Dict[str, np.ndarray]:
    """A stock state dict (on-disk layout, bias-free) with each group of n_old / n_new KV heads mean-pooled into one."""
    out = dict(state)
    for name, value in state.items():
        if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            out[name] = merge_kv(value, n_old, n_new, head_dim, low_rank=False)[0]
    return out
