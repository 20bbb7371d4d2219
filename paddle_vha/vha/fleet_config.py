"""PaddleFleet's VHA config names -> Qwen3VHAConfig's (Qwen3VHAConfig calls `translate` on its arguments).

Two upstream dialects are read:

* PaddleFleet (`SelfAttentionVHA`, `use_vha_attention: true`): `num_attention_heads` counts VIRTUAL heads, as ours
  does. `vha_q_lora_rank` is r (default head_dim); `vha_postmix_rank` defaults to the layer's heads // 4;
  `gated_attention` is the sigmoid output gate; `sliding_window` + `window_attn_skip_freq` pick the window layers
  (None: every layer; an int N: layer i (0-based) unless i % N == 0; a list: 1 = window layer), and the `swa_*`
  fields size them (`swa_vha_q_lora_rank` defaults to the window head width, `swa_vha_postmix_rank` to the window
  layer's heads // 4).
* The research fork (D-URing/PaddleFleet, `attn_type: "vha"`): `num_attention_heads` counts PHYSICAL heads H_p,
  so H_v = H_p * H_kv; Premix is [H_kv, d, d] (r = d); `vha_postmix_rank` defaults to 4. With
  `vha_enable_premix: false` (its "kv_postmix_only" conversion) there is no Premix and `num_attention_heads` is H_v.

Upstream's HF export (paddlefleet/transformer/hf_export.py) writes two of those under other names, read as the Fleet
name: `use_gated_attn` (= gated_attention) and `hybrid_layer_pattern` (= window_attn_skip_freq, 0-based layers as
upstream's is_layer_window_attention counts them). Its newer fields are read as upstream means them (_newer_fields):
`head_wise_swa_ratio` (int(ratio * H_kv) of a window layer's KV heads windowed, the first ones full: only "all heads
windowed" is Qwen3), `qk_norm_eps` (None = rms_norm_eps, Qwen3's one eps), `high_precision_rope` (upstream's choice of
a float32 RoPE kernel: no tensor, the same function; read, not stored) and `muon_slice_specs` (Muon optimizer slicing:
this project has no Muon, so a non-empty one is refused). Attention sinks: `add_swa_attention_sink_bias` is our
`window_attention_sinks` (a learned sink logit per head of every window layer, upstream's `softmax_type="learnable"`
on those layers), upstream's DEFAULT true where a PaddleFleet config has window layers, ignored (as upstream does)
where it has none; `softmax_type` other than "vanilla" (a sink on every layer; Qwen3VHAConfig, for any config) and
`add_full_attention_sink_bias` true (sinks on the full layers) are refused.

A config that uses any upstream name is read with upstream's defaults. What this project cannot represent (partial
RoPE, a value head width other than head_dim, a value scale, another softmax scale, per-layer q/k norms, a two-sided
window, Postmix switched off, ...) raises VHAConfigError with one line naming the field.
"""
from __future__ import annotations

import math
from typing import Dict, Tuple

__all__ = ["translate", "UPSTREAM_KEYS", "window_layer_types", "QKV_LAYOUTS", "UP_GATE_ORDERS"]

# how fused upstream projections are laid out (tools/import_fleet.py --qkv-layout / --up-gate-order)
QKV_LAYOUTS = ("grouped", "concat")
UP_GATE_ORDERS = ("gate-up", "up-gate")

# upstream name -> our name (same meaning, same default once translated)
_RENAMED = {
    "vha_q_lora_rank": "vha_q_head_dim",
    "gated_attention": "vha_gated_attention",
    "swa_vha_q_lora_rank": "vha_window_q_head_dim",
    "swa_vha_postmix_rank": "vha_window_postmix_rank",
    "swa_num_attention_heads": "vha_window_num_attention_heads",
    "swa_num_key_value_heads": "vha_window_num_key_value_heads",
    "swa_head_dim": "vha_window_head_dim",
    "swa_rope_theta": "vha_window_rope_theta",
    "vha_enable_premix": "vha_premix",
}
# upstream fields that must hold the value that means "as Qwen3 does it" (None = absent is fine too)
_MUST_BE = {
    "rotary_percent": (1.0, "partial RoPE (rotary_percent < 1) is not supported: Qwen3 rotates the whole head"),
    "attention_value_scale": (None, "a value scale is not part of Qwen3's attention"),
    "use_qk_norm": (True, "Qwen3 always normalises queries and keys (q_norm, k_norm)"),
    "qk_norm_type": ("per_head", "Qwen3's q_norm / k_norm are per head (qk_norm_type 'per_head')"),
    "qk_l2_norm": (False, "Qwen3's q_norm / k_norm are RMSNorms, not L2 norms"),
    "use_bias": (False, "use_bias adds MLP biases, which Qwen3 does not have (attention_bias covers q/k/v)"),
    "vha_enable_postmix": (True, "Postmix switched off is not supported (set vha_postmix_rank instead)"),
    "vha_postmix_grouped": (False, "grouped Postmix is PaddleFleet's DeepSeek-V4 hybrid attention, not Qwen3's"),
    "fuse_inv_rope_into_vha_postmix": (False, "PaddleFleet's DeepSeek-V4 hybrid attention option, not Qwen3's"),
    "use_vha_premix": (None, "PaddleFleet's DeepSeek-V4 hybrid attention option, not Qwen3's"),
    "vha_premix_groups": (None, "PaddleFleet's DeepSeek-V4 hybrid attention option, not Qwen3's"),
    "vha_premix_alpha_init": (None, "the fork's gated-Premix design (a learned alpha per group) is not supported"),
}
# upstream's HF-export name -> the Fleet name it stands for (hf_export.py's FLEET_HF_FIELD_MAPPING)
_HF_EXPORT_NAMES = {"use_gated_attn": "gated_attention", "hybrid_layer_pattern": "window_attn_skip_freq"}
# upstream fields read by _newer_fields / _check_sinks
# (softmax_type is not one: PaddleFormers' configs carry it too, as "vanilla"; Qwen3VHAConfig refuses other values)
_NEWER = ("head_wise_swa_ratio", "qk_norm_eps", "high_precision_rope", "muon_slice_specs",
          "add_full_attention_sink_bias", "add_swa_attention_sink_bias")
# names that mark a config as upstream's (softmax_scale is not one: PaddleFormers' configs carry it too, as None)
UPSTREAM_KEYS = frozenset(_RENAMED) | frozenset(_MUST_BE) | frozenset(_HF_EXPORT_NAMES) | frozenset(_NEWER) | {
    "use_vha_attention", "attn_type", "window_attn_skip_freq", "v_head_dim", "swa_v_head_dim"}


class _Error(ValueError):
    pass


def window_layer_types(num_layers: int, skip_freq) -> list:
    """Qwen3 layer_types from upstream's window_attn_skip_freq (with a sliding_window set): None -> every layer is a
    window layer; an int N > 0 -> layer i (0-based) is one unless i % N == 0; a list of num_layers 0/1 -> 1 marks one."""
    if skip_freq is None:
        swa = [True] * num_layers
    elif isinstance(skip_freq, int) and not isinstance(skip_freq, bool):
        if skip_freq <= 0:
            raise _Error(f"window_attn_skip_freq must be > 0, got {skip_freq}")
        swa = [i % skip_freq != 0 for i in range(num_layers)]
    elif isinstance(skip_freq, list):
        if len(skip_freq) != num_layers or any(v not in (0, 1, True, False) for v in skip_freq):
            raise _Error(f"window_attn_skip_freq as a list must hold num_hidden_layers={num_layers} values of 0 or 1, "
                         f"got {skip_freq!r}")
        swa = [bool(v) for v in skip_freq]
    else:
        raise _Error(f"window_attn_skip_freq must be None, a positive int or a list of 0/1, got {skip_freq!r}")
    return ["sliding_attention" if s else "full_attention" for s in swa]


def _set(ours: Dict, name: str, value, source: str) -> None:
    """Give our field `name` the upstream value, refusing a different value given under our own name."""
    if ours.get(name) is not None and ours[name] != value:
        raise _Error(f"{source}={value!r} and {name}={ours[name]!r} disagree (give one of them)")
    ours[name] = value


def translate(ours: Dict, kwargs: Dict, defaults) -> Tuple[Dict, Dict]:
    """Read upstream names out of `kwargs` into `ours` (our vha_* arguments, None where not given).

    defaults(name): Qwen3Config's default of a plain field absent from kwargs. Returns (ours, kwargs) with every
    upstream key removed from kwargs, plus `upstream`: the dialect read ("paddlefleet", "fork" or None) in ours.
    Raises ValueError (one line) for what cannot be represented; Qwen3VHAConfig turns it into a VHAConfigError.
    """
    present = sorted(k for k in kwargs if k in UPSTREAM_KEYS)
    ours = dict(ours, upstream=None)
    if not present:
        return ours, kwargs
    kwargs = dict(kwargs)
    up = {k: kwargs.pop(k) for k in present}
    get = lambda k: kwargs.get(k, defaults(k))  # noqa: E731
    head_dim = get("head_dim") or get("hidden_size") // get("num_attention_heads")

    up = _fleet_names(up)
    fork = _is_fork(up)
    ours["upstream"] = "fork" if fork else "paddlefleet"
    for key in ("model_type", "architectures"):  # upstream files say qwen3 / Qwen3ForCausalLM; this is Qwen3-VHA
        kwargs.pop(key, None)
    _check_representable(up, kwargs, head_dim)
    _newer_fields(up, get)
    for key, name in _RENAMED.items():
        if key in up and up[key] is not None:
            _set(ours, name, up[key], key)
    if fork:
        _read_fork(ours, kwargs, get, head_dim)
        windows = bool(kwargs.get("sliding_window")) and "sliding_attention" in (kwargs.get("layer_types") or [])
        _read_sinks(ours, up, windows, None)  # the fork: as given (its windows are Qwen3's layer_types)
    else:
        _read_paddlefleet(ours, kwargs, up, get, head_dim)
    return ours, kwargs


def _fleet_names(up: Dict) -> Dict:
    """Upstream's HF-export names (use_gated_attn, hybrid_layer_pattern) as the Fleet names they stand for."""
    up = dict(up)
    for hf, fleet in _HF_EXPORT_NAMES.items():
        if hf not in up:
            continue
        value = up.pop(hf)
        if fleet in up and up[fleet] != value:
            raise _Error(f"{hf}={value!r} and {fleet}={up[fleet]!r} disagree ({hf} is upstream's HF name for {fleet})")
        up[fleet] = value
    return up


def _newer_fields(up: Dict, get) -> None:
    """head_wise_swa_ratio's type and range, qk_norm_eps, high_precision_rope, muon_slice_specs, sinks on full layers
    (the window layers' sink default is checked where the window layers are known)."""
    ratio = up.get("head_wise_swa_ratio")
    if ratio is not None and not (isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 <= ratio <= 1):
        raise _Error(f"head_wise_swa_ratio={ratio!r}: upstream's share of a window layer's KV heads, a number in [0, 1]")
    eps, rms = up.get("qk_norm_eps"), get("rms_norm_eps")
    if eps is not None and not (isinstance(eps, (int, float)) and math.isclose(eps, rms, rel_tol=1e-9)):
        raise _Error(f"qk_norm_eps={eps!r} differs from rms_norm_eps={rms!r}: Qwen3's q_norm / k_norm use rms_norm_eps")
    if up.get("high_precision_rope") not in (None, True, False):
        raise _Error(f"high_precision_rope={up['high_precision_rope']!r}: must be true or false")
    if up.get("muon_slice_specs"):
        raise _Error("muon_slice_specs: upstream's Muon-optimizer slicing of fused weights; this project trains with "
                     "AdamW and has no Muon (drop the field)")
    if up.get("add_full_attention_sink_bias"):
        raise _Error("add_full_attention_sink_bias=True: learnable attention sinks on full layers are not supported")
    swa_sinks = up.get("add_swa_attention_sink_bias")
    if swa_sinks not in (None, True, False):
        raise _Error(f"add_swa_attention_sink_bias={swa_sinks!r}: must be true or false")


def _read_sinks(ours: Dict, up: Dict, has_windows: bool, default) -> None:
    """add_swa_attention_sink_bias -> window_attention_sinks where there are window layers (absent: `default`, upstream's
    true for PaddleFleet); without window layers upstream builds no sink, and neither do we."""
    value = up.get("add_swa_attention_sink_bias")
    value = default if value is None else value
    if has_windows and value is not None:
        _set(ours, "window_attention_sinks", bool(value), "add_swa_attention_sink_bias")


def _check_window_heads(up: Dict, ours: Dict, get) -> None:
    """Window layers exist: upstream's default add_swa_attention_sink_bias (true: sinks) and a head-wise window share."""
    _read_sinks(ours, up, True, True)
    h_kv = ours.get("vha_window_num_key_value_heads") or get("num_key_value_heads")
    n_swa = int((up.get("head_wise_swa_ratio") or 0.0) * h_kv)  # upstream: int(ratio * kv heads) heads windowed
    if 0 < n_swa < h_kv:
        raise _Error(f"head_wise_swa_ratio={up['head_wise_swa_ratio']!r}: {n_swa} of a window layer's {h_kv} KV heads "
                     "windowed and the rest full is not Qwen3's per-layer window (a ratio giving 0 or all heads: "
                     "every head windowed)")


def _is_fork(up: Dict) -> bool:
    """Whether the upstream fields are the research fork's (attn_type 'vha') rather than PaddleFleet's."""
    if "use_vha_attention" in up and up["use_vha_attention"] is not True:
        raise _Error(f"use_vha_attention={up['use_vha_attention']!r}: not a VHA config (load it as stock Qwen3)")
    fork = "attn_type" in up
    if fork and up["attn_type"] != "vha":
        raise _Error(f"attn_type={up['attn_type']!r}: only the research fork's attn_type 'vha' is read")
    return fork


def _check_representable(up: Dict, kwargs: Dict, head_dim: int) -> None:
    """One line for an upstream setting Qwen3-VHA cannot represent (see _MUST_BE), a value head width other than
    head_dim or another softmax scale."""
    for key, (want, why) in _MUST_BE.items():
        if key in up and up[key] is not None and up[key] != want:
            raise _Error(f"{key}={up[key]!r}: {why}")
    if up.get("v_head_dim") not in (None, head_dim):
        raise _Error(f"v_head_dim={up['v_head_dim']!r} differs from head_dim={head_dim}: Qwen3's values are as wide as "
                     "its keys")
    scale = kwargs.get("softmax_scale")  # PaddleFormers' field too: checked, kept
    if scale is not None and not math.isclose(scale, head_dim ** -0.5, rel_tol=1e-9):
        raise _Error(f"softmax_scale={scale!r}: Qwen3 scales scores by 1/sqrt(head_dim) = {head_dim ** -0.5:.6g}")


def _read_fork(ours: Dict, kwargs: Dict, get, head_dim: int) -> None:
    """The research fork: num_attention_heads counts physical heads; Premix is d x d; Postmix rank 4 by default."""
    h_p, h_kv = get("num_attention_heads"), get("num_key_value_heads")
    # kv_postmix_only (vha_enable_premix false): its num_attention_heads already counts the virtual heads
    kwargs["num_attention_heads"] = h_p if ours.get("vha_premix") is False else h_p * h_kv
    _set(ours, "vha_q_head_dim", head_dim, "the fork's Premix (d x d)")
    if ours.get("vha_postmix_rank") is None:
        ours["vha_postmix_rank"] = 4  # the fork's default


def _read_paddlefleet(ours: Dict, kwargs: Dict, up: Dict, get, head_dim: int) -> None:
    """PaddleFleet: upstream's defaults for the Postmix rank and r, its window layers as Qwen3 layer_types."""
    window = kwargs.get("sliding_window")
    if isinstance(window, (list, tuple)):
        raise _Error(f"sliding_window={window!r}: a (left, right) window is not causal Qwen3 attention")
    h_v = get("num_attention_heads")
    if ours.get("vha_postmix_rank") is None:  # upstream: the layer's heads // 4
        if h_v // 4 < 1:
            raise _Error(f"vha_postmix_rank is absent and upstream's default num_attention_heads // 4 is 0 for "
                         f"{h_v} heads: set vha_postmix_rank")
        ours["vha_postmix_rank"] = h_v // 4
    if ours.get("vha_q_head_dim") is None:
        ours["vha_q_head_dim"] = head_dim  # upstream's default
    types = window_layer_types(get("num_hidden_layers"), up.get("window_attn_skip_freq")) if window else None
    if types is not None and kwargs.get("layer_types") not in (None, types):
        raise _Error(f"layer_types {kwargs['layer_types']!r} disagree with upstream's window layers {types!r} "
                     f"(sliding_window={window}, window_attn_skip_freq={up.get('window_attn_skip_freq')!r})")
    if types is None or "sliding_attention" not in types:  # no window layer: upstream ignores the swa_* sizes
        for key, name in _RENAMED.items():
            if key.startswith("swa_"):
                ours[name] = None
        return
    kwargs.update(layer_types=types, use_sliding_window=True)
    _read_window_sizes(ours, up, head_dim, h_v)
    _check_window_heads(up, ours, get)


def _read_window_sizes(ours: Dict, up: Dict, head_dim: int, h_v: int) -> None:
    """The window layers' sizes with upstream's defaults (swa_vha_q_lora_rank: the window head width;
    swa_vha_postmix_rank: the window layer's heads // 4)."""
    d_w = ours.get("vha_window_head_dim") or head_dim
    if up.get("swa_v_head_dim") not in (None, d_w):
        raise _Error(f"swa_v_head_dim={up['swa_v_head_dim']!r} differs from the window head width {d_w}")
    if ours.get("vha_window_q_head_dim") is None:
        ours["vha_window_q_head_dim"] = d_w  # upstream: swa_vha_q_lora_rank defaults to swa_head_dim
    if ours.get("vha_window_postmix_rank") is None:
        h_w = ours.get("vha_window_num_attention_heads") or h_v
        if h_w // 4 < 1:
            raise _Error(f"swa_vha_postmix_rank is absent and upstream's default (window heads {h_w}) // 4 is 0: set it")
        ours["vha_window_postmix_rank"] = h_w // 4
