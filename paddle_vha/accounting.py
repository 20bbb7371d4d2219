"""Bytes, weights and FLOPs that say what VHA buys: KV cache per token, attention weights, training / serving FLOPs.

`Arch` (paddle_vha/spec/cost.py) is a plain description of one decoder-only model with one attention variant — MHA,
GQA-n, MLA, VHA (as trained), VHA folded (the stock GQA model it is served as) and MEA — and everything here is a pure
function over it, generic over the attention kinds: each kind's formulas are an AttentionCost, in its family's cost.py
(paddle_vha/{qwen3,vha,mea}/cost.py) or, for the comparison-only MLA, below:
`kv_bytes_per_token`, `attention_weights_per_layer`, `attention_parameters_per_layer`, `query_weights_per_layer`,
`forward_flops_per_token`, `training_flops_per_token`, `model_weights`. `paper_variants("1.7b")` builds the VHA paper's
comparison set at a named shape; `arch_from_config(dict)` reads a config.json: the family registry
(paddle_vha/families.py) gives each family's attention fields, and any other Qwen3 / Qwen3-MoE / DeepSeek-V2-style
config is read as GQA / MHA / MLA. tools/kv_calc.py and tools/flops.py are thin command lines over these; the quick-
start, the trainer's summary and compress_kv use them too, so every KV-bytes number comes from one function.

FLOP convention (the one the VHA article uses to re-derive the paper's Table 5, docs/calculators.md):
matmul FLOPs only, 2 per multiply-add; per token, summed over layers; attention scores and the weighted sum
over values cost 2·S·H·d each per head (S = context length, no causal halving unless `causal=True`);
training = 3 × forward. Norms, RoPE, softmax and residual adds are not counted.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple

from .checkpoint.contract import read_json_object
from .families import DEFAULT_MODEL_TYPE, FAMILIES
from .spec.cost import Arch, ArchError, AttentionCost
from .units import fmt_bytes

__all__ = [
    "Arch",
    "ArchError",
    "KINDS",
    "NAMED_SHAPES",
    "is_named_shape",
    "active_weights",
    "named_shape",
    "paper_variants",
    "fold_vha",
    "arch_from_config",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "attention_weights_per_layer",
    "attention_parameters_per_layer",
    "query_weights_per_layer",
    "forward_flops_per_token",
    "training_flops_per_token",
    "model_weights",
    "fmt_bytes",
    "DTYPE_BYTES",
]


# ---------------------------------------------------------------------------------------------------------------
# Attention kinds: each family's formulas (the registry's cost modules) and MLA, a comparison-only kind.

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1, "int8": 1}


class MLACost(AttentionCost):
    """DeepSeek-V2's multi-head latent attention: the cache holds the latent c_kv and a decoupled RoPE key."""

    kind = "mla"
    windows = False

    def validate(self, a: Arch) -> None:
        if a.kv_lora_rank < 1 or a.qk_rope_head_dim < 0:
            raise ArchError(f"{a.label}: MLA needs kv_lora_rank >= 1 and qk_rope_head_dim >= 0")

    def group_size(self, a: Arch) -> int:
        return a.num_heads

    def kv_bytes(self, a: Arch, bytes_per_elem: float) -> float:
        return (a.kv_lora_rank + a.qk_rope_head_dim) * bytes_per_elem  # latent + decoupled RoPE key

    def weights(self, a: Arch) -> Dict[str, int]:
        h, H = a.hidden_size, a.num_heads
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        parts = {}
        if a.q_lora_rank:
            parts["q_a_proj"] = h * a.q_lora_rank
            parts["q_b_proj"] = a.q_lora_rank * H * qk
        else:
            parts["q_proj"] = h * H * qk
        parts["kv_a_proj"] = h * (a.kv_lora_rank + a.qk_rope_head_dim)
        parts["kv_b_proj"] = a.kv_lora_rank * H * (a.qk_nope_head_dim + a.v_head_dim)
        parts["o_proj"] = H * a.v_head_dim * h
        return parts

    def biases_and_norms(self, a: Arch, parts: Dict[str, int]) -> Dict[str, int]:
        raise ArchError(f"{a.label}: parameter counts with biases and norms are not modelled for MLA")

    def score_widths(self, a: Arch) -> Tuple[int, int]:
        return a.qk_nope_head_dim + a.qk_rope_head_dim, a.v_head_dim

    def named_fields(self, shape: dict) -> dict:
        return dict(MLA_DEFAULTS)

    def cache_description(self, a: Arch) -> str:
        return f"latent {a.kv_lora_rank} + rope {a.qk_rope_head_dim}"


MLA = MLACost()
KINDS = AttentionCost.kinds()  # the families' kinds registered when the registry imported their cost modules, and MLA


# Qwen3's published shapes (the VHA paper trains these, docs/calculators.md). head_dim 128, vocab 151936,
# tied embeddings. `postmix_rank` is the paper's Postmix rank (stated for 1.7B and 4B; 0.6B's is not stated,
# 4 is assumed). `mha_heads` gives MHA the same attention weights as GQA-8: 4·H = 2·H_q + 2·H_kv.
NAMED_SHAPES: Dict[str, dict] = {
    "0.6b": dict(hidden_size=1024, num_layers=28, intermediate_size=3072, num_heads=16, postmix_rank=4),
    "1.7b": dict(hidden_size=2048, num_layers=28, intermediate_size=6144, num_heads=16, postmix_rank=4),
    "4b": dict(hidden_size=2560, num_layers=36, intermediate_size=9728, num_heads=32, postmix_rank=8),
}
_COMMON = dict(head_dim=128, vocab_size=151936, tie_word_embeddings=True)
# MLA as the article assumes it: latent 512 and a 64-wide decoupled RoPE key (DeepSeek-V2's value; it makes the
# paper's 1.12 KB come out exactly). Its per-head widths (nope 128, v 128) and no query LoRA are our assumptions.
MLA_DEFAULTS = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=0)


def _shape_key(name: str) -> str:
    key = name.strip().lower().replace("qwen3-", "").replace("qwen3_", "")
    if key not in NAMED_SHAPES:
        raise ArchError(f"unknown shape {name!r} (named shapes: {', '.join(NAMED_SHAPES)}; or pass a config.json)")
    return key


def named_shape(name: str, kind: str = "gqa", num_kv_heads: int = 8, **overrides) -> Arch:
    """One model at a named shape ('0.6b', '1.7b', '4b'); default the paper's GQA-8 baseline."""
    key = _shape_key(name)
    s = dict(NAMED_SHAPES[key])
    extra = AttentionCost.for_kind(kind).named_fields(s)
    s.pop("postmix_rank")
    fields = dict(_COMMON, **s, kind=kind, num_kv_heads=num_kv_heads, label=f"{key} {kind}", **extra)
    fields.update(overrides)
    return Arch(**fields)


def paper_variants(name: str, mea_kv_heads: int = 2, **overrides) -> List[Arch]:
    """The comparison set at a named shape: MHA (GQA-8's attention weights), GQA-8 / 4 / 2, GQA-2 with halved query
    heads, MLA, VHA, shared-KV VHA and premix-off VHA as trained and folded, MEA (GQA-8's 8 KV heads composed from `mea_kv_heads`
    cached ones)."""
    key = _shape_key(name)
    h_q = NAMED_SHAPES[key]["num_heads"]
    mha_heads = (2 * h_q + 2 * 8) // 4
    out = [
        named_shape(key, "mha", num_kv_heads=mha_heads, num_heads=mha_heads, label=f"MHA-{mha_heads}", **overrides),
        named_shape(key, "gqa", 8, label="GQA-8", **overrides),
        named_shape(key, "gqa", 4, label="GQA-4", **overrides),
        named_shape(key, "gqa", 2, label="GQA-2", **overrides),
        named_shape(key, "gqa", 2, num_heads=h_q // 2, label=f"GQA-2 ({h_q // 2} q heads)", **overrides),
        named_shape(key, "mla", 0, label="MLA", **overrides),
    ]
    vha = named_shape(key, "vha", 2, label="VHA (trained)", **overrides)
    out += [vha, fold_vha(vha, label="VHA (folded)")]
    skv = vha.cost.with_shared_kv(vha.replace(label="VHA shared-KV (trained)"))
    out += [skv, fold_vha(skv, label="VHA shared-KV (folded)")]
    nop = named_shape(key, "vha_nopremix", 2, label="VHA premix-off (trained)", **overrides)
    out += [nop, fold_vha(nop, label="VHA premix-off (folded)")]
    out.append(named_shape(key, "mea", mea_kv_heads, mea_kv_heads=8, label=f"MEA ({mea_kv_heads} of 8 KV)", **overrides))
    return out


def fold_vha(arch: Arch, label: Optional[str] = None) -> Arch:
    """The stock GQA model a VHA model is served as (its kind's served form): H_v query heads of width d, same KV
    heads, no Premix/Postmix. ArchError for any other kind, and for a VHA model without a stock form."""
    fold = getattr(arch.cost, "fold", None)  # the kinds that fold define how
    if fold is None:
        raise ArchError(f"{arch.label}: only a VHA model folds (kind {arch.kind!r})")
    return fold(arch, label)


# ---------------------------------------------------------------------------------------------------------------
# config.json -> Arch


def _need(cfg: dict, key: str, where: str):
    if key not in cfg or cfg[key] is None:
        raise ArchError(f"{where}: config has no {key!r}")
    return cfg[key]


def _window_fields(cfg: dict, num_layers: int, label: str) -> dict:
    """sliding_window / num_window_layers from a Qwen3-style config: the sliding_attention entries of layer_types
    when given, else (Qwen3's default) the layers from max_window_layers on when use_sliding_window is set; none
    without a sliding_window (Qwen3 then attends fully everywhere)."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise ArchError(f"{label}: layer_types must list one type per layer ({num_layers})")
        n = sum(1 for t in types if t == "sliding_attention")
    elif cfg.get("use_sliding_window"):
        n = max(num_layers - int(cfg.get("max_window_layers") or 0), 0)
    else:
        n = 0
    return dict(sliding_window=window, num_window_layers=n) if n and window else {}


def arch_from_config(cfg: dict, label: str = "config") -> Arch:
    """An Arch from a config.json dict: a registered family (paddle_vha/families.py: its own attention fields), a
    DeepSeek-V2/V3 MLA config (anything with kv_lora_rank), or any other Qwen3-style config (GQA / MHA, MoE MLPs)."""
    if not isinstance(cfg, dict):
        raise ArchError(f"{label}: expected a JSON object")
    fam = FAMILIES.get(cfg.get("model_type"))
    h = _need(cfg, "hidden_size", label)
    L = _need(cfg, "num_hidden_layers", label)
    n_heads = _need(cfg, "num_attention_heads", label)
    head_dim = cfg.get("head_dim") or (h // n_heads)
    n_kv = cfg.get("num_key_value_heads") or n_heads
    common = dict(label=label, hidden_size=h, num_layers=L, head_dim=head_dim, num_heads=n_heads,
                  intermediate_size=cfg.get("intermediate_size") or 0,
                  vocab_size=_need(cfg, "vocab_size", label),
                  tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                  attention_bias=bool(cfg.get("attention_bias", False)))
    if fam is not None:  # the base's biases and q/k norms, as its layer spec declares them (Qwen2, Llama, Qwen3)
        sizes = fam.base.layer.sizes(SimpleNamespace(**dict(cfg, num_attention_heads=n_heads, num_key_value_heads=n_kv,
                                                            head_dim=head_dim)), 0)
        common.update(attention_bias=sizes.bias, o_bias=sizes.o_bias, qk_norm=fam.base.has("self_attn.q_norm.weight"))
    common.update(_window_fields(cfg, L, label))
    n_exp = cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    if n_exp:
        step = cfg.get("decoder_sparse_step") or 1
        dense = set(cfg.get("mlp_only_layers") or [])
        first_dense = cfg.get("first_k_dense_replace") or 0
        moe_layers = sum(1 for i in range(L) if i not in dense and i >= first_dense and (i + 1) % step == 0)
        common.update(num_experts=n_exp, num_experts_per_tok=_need(cfg, "num_experts_per_tok", label),
                      moe_intermediate_size=_need(cfg, "moe_intermediate_size", label), num_moe_layers=moe_layers)
    try:
        if cfg.get("kv_lora_rank"):
            return Arch(kind="mla", num_kv_heads=0, kv_lora_rank=cfg["kv_lora_rank"],
                        qk_rope_head_dim=cfg.get("qk_rope_head_dim") or 0,
                        qk_nope_head_dim=cfg.get("qk_nope_head_dim") or head_dim,
                        v_head_dim=cfg.get("v_head_dim") or head_dim, q_lora_rank=cfg.get("q_lora_rank") or 0,
                        **common)
        if fam is not None and fam.cost is not None:
            return Arch(**fam.cost.arch_fields(cfg, dict(common, num_layers=L)), **common)
        return Arch(kind="mha" if n_kv == n_heads else "gqa", num_kv_heads=n_kv, **common)
    except (TypeError, ValueError) as e:  # a field of the wrong JSON type, an unreadable layer list
        if isinstance(e, ArchError):
            raise
        raise ArchError(f"{label}: {e}") from None


# ---------------------------------------------------------------------------------------------------------------
# Accounting.


def kv_bytes_per_token(a: Arch, bytes_per_elem: float = 2, all_layers: bool = False) -> float:
    """KV-cache bytes one token adds: per layer (an MEA layer for MEA), or summed over all layers."""
    if not all_layers:
        return a.cost.kv_bytes(a, bytes_per_elem)
    return sum(layer.cost.kv_bytes(layer, bytes_per_elem) * n for layer, n, _ in a.cost.layers(a))


def kv_cache_bytes(a: Arch, context: int, bytes_per_elem: float = 2) -> float:
    """KV-cache bytes one sequence of `context` tokens holds, all layers: a sliding-window layer holds at most
    sliding_window - 1 positions (what a later query can still see), so its share stops growing there."""
    return sum(layer.cost.kv_bytes(layer, bytes_per_elem) * n * (context if window is None else min(context, window - 1))
               for layer, n, window in a.cost.layers(a))


def attention_weights_per_layer(a: Arch) -> Dict[str, int]:
    """Weights of one attention layer by part (matmul weights; biases and norms excluded), plus 'total'."""
    parts = a.cost.weights(a)
    parts["total"] = sum(parts.values())
    return parts


def attention_parameters_per_layer(a: Arch) -> Dict[str, int]:
    """Every parameter of one attention layer as built (an MEA layer for MEA), by part: the matmul weights, their
    biases (attention_bias) and the norm weights (q_norm, k_norm; MEA's head norm), plus 'total'."""
    parts = a.cost.biases_and_norms(a, a.cost.weights(a))
    parts["total"] = sum(parts.values())
    return parts


def query_weights_per_layer(a: Arch) -> int:
    """Weights that make the queries of one layer: q_proj, plus Premix for VHA (the article's 'query projection':
    H_p·h·r + H_kv·r·d as trained, H_v·h·d once folded)."""
    w = a.cost.weights(a)
    return sum(v for k, v in w.items() if k in ("q_proj", "q_a_proj", "q_b_proj", "premix"))


def _context(seq_len: int, causal: bool, window: Optional[int]) -> float:
    """Keys one query attends to: S (a query at the end of the context), S/2 averaged over a causal sequence (the
    article's convention); with a sliding window W < S, W, or the exact causal average of min(s, W) over s = 1..S."""
    if window is None or window >= seq_len:
        return seq_len / 2 if causal else seq_len
    if not causal:
        return window
    return (window * (window + 1) / 2 + (seq_len - window) * window) / seq_len


def _layer_forward_flops(a: Arch, seq_len: int, causal: bool, window: Optional[int] = None) -> Dict[str, float]:
    """Forward matmul FLOPs of one attention layer for one token, by part."""
    f: Dict[str, float] = {name: a.cost.part_flops(a, name, n) for name, n in a.cost.weights(a).items()}
    ctx = _context(seq_len, causal, window)
    qk, vd = a.cost.score_widths(a)
    f["attention"] = 2 * ctx * a.num_heads * qk + 2 * ctx * a.num_heads * vd  # Q K^T and A V
    return f


def forward_flops_per_token(a: Arch, seq_len: int = 4096, causal: bool = False, lm_head: bool = True) -> Dict[str, float]:
    """Forward FLOPs per token, summed over layers, by part; 'attention_block' and 'total' are sums."""
    if seq_len < 1:
        raise ArchError(f"seq_len must be >= 1, got {seq_len}")
    out: Dict[str, float] = {}

    def add(parts: Dict[str, float], times: int):
        for k, v in parts.items():
            out[k] = out.get(k, 0.0) + v * times

    for layer, n, window in a.cost.layers(a):
        add(_layer_forward_flops(layer, seq_len, causal, window=window), n)
    out["attention_block"] = sum(out.values())
    h = a.hidden_size
    n_moe = (a.num_layers if a.num_moe_layers is None else a.num_moe_layers) if a.num_experts else 0
    mlp = 2 * 3 * h * a.intermediate_size * (a.num_layers - n_moe)
    mlp += (2 * 3 * h * a.moe_intermediate_size * a.num_experts_per_tok + 2 * h * a.num_experts) * n_moe
    out["mlp"] = mlp
    out["lm_head"] = 2 * h * a.vocab_size if lm_head else 0
    out["total"] = out["attention_block"] + out["mlp"] + out["lm_head"]
    return out


def training_flops_per_token(a: Arch, seq_len: int = 4096, causal: bool = False, lm_head: bool = True) -> Dict[str, float]:
    """Training FLOPs per token: 3 × forward (forward + backward for activations and weights)."""
    return {k: 3 * v for k, v in forward_flops_per_token(a, seq_len, causal, lm_head).items()}


def model_weights(a: Arch) -> Dict[str, int]:
    """Matmul and embedding weights of the whole model (norms and biases excluded): attention, mlp, embeddings."""
    attn = sum(sum(layer.cost.weights(layer).values()) * n for layer, n, _ in a.cost.layers(a))
    h = a.hidden_size
    n_moe = (a.num_layers if a.num_moe_layers is None else a.num_moe_layers) if a.num_experts else 0
    mlp = 3 * h * a.intermediate_size * (a.num_layers - n_moe)
    mlp += (3 * h * a.moe_intermediate_size * a.num_experts + h * a.num_experts) * n_moe
    emb = a.vocab_size * h * (1 if a.tie_word_embeddings else 2)
    return {"attention": attn, "mlp": mlp, "embeddings": emb, "total": attn + mlp + emb}


def active_weights(a: Arch) -> Dict[str, int]:
    """The weights one token uses (a MoE model's "A3B"): the attention, the dense MLPs, on each MoE layer the router
    and num_experts_per_tok of the experts, and the embeddings (as model_weights counts them). Equal to model_weights
    for a dense model."""
    full = model_weights(a)
    n_moe = (a.num_layers if a.num_moe_layers is None else a.num_moe_layers) if a.num_experts else 0
    idle = 3 * a.hidden_size * a.moe_intermediate_size * (a.num_experts - a.num_experts_per_tok) * n_moe
    mlp = full["mlp"] - idle
    return {"attention": full["attention"], "mlp": mlp, "embeddings": full["embeddings"],
            "total": full["attention"] + mlp + full["embeddings"]}


def variants_for_config(a: Arch) -> List[Arch]:
    """What a config.json shows: itself, plus its folded form for VHA (when it has one)."""
    try:
        served = a.cost.served_as(a, label=f"{a.label} (folded)")
    except ArchError:  # no stock form (VHA window layers with their own head counts)
        served = None
    return [a] if served is None else [a.replace(label=f"{a.label} (trained)"), served]


def is_named_shape(spec: str) -> bool:
    """Whether a command-line MODEL names one of the paper's shapes (0.6b, 1.7b, 4b; 'qwen3-' optional)."""
    return spec.strip().lower().replace("qwen3-", "") in NAMED_SHAPES


def resolve_models(spec: str, mea_kv_heads: int = 2, **overrides) -> List[Arch]:
    """A command-line model argument: a named shape ('1.7b': the paper's comparison set), a config.json / a
    checkpoint folder holding one, or a tools/train.py trainer config (its model_config) — that model, plus its
    folded form for VHA. ArchError with one line otherwise."""
    import os

    if is_named_shape(spec):
        return paper_variants(spec, mea_kv_heads=mea_kv_heads, **overrides)
    path = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
    if not os.path.isfile(path):
        raise ArchError(f"{spec}: not a named shape ({', '.join(NAMED_SHAPES)}), a config.json or a checkpoint folder")
    cfg = read_json_object(path, ArchError)
    if isinstance(cfg.get("model_config"), dict):  # a tools/train.py trainer config
        cfg = {**cfg["model_config"], "model_type": cfg.get("model_type", DEFAULT_MODEL_TYPE)}
        cfg.setdefault("vocab_size", 256)  # the byte corpus, train.py's default
    label = spec.rstrip("/")
    if label.endswith("/config.json"):
        label = label[: -len("/config.json")]
    arch = arch_from_config(cfg, label=label or "config")
    if overrides:
        arch = arch.replace(**overrides)
    return variants_for_config(arch)
