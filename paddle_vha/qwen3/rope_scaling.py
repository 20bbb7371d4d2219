"""Qwen3's RoPE scaling as data: which scaling a config asks for, refused in one line when we do not implement it or
when PaddleFormers and Hugging Face would read it differently, and its inverse frequencies and attention factor.

The trained model takes its RoPE from PaddleFormers' Qwen3RotaryEmbedding (paddle_vha/qwen3/modeling.py); the exported
graph (paddle_vha/export/decoder.py) takes it from here. The types implemented, as PaddleFormers 1.0.0's
`modeling_rope_utils` and Hugging Face transformers 4.57's define them for Qwen3 (d = head_dim, i = 0, 2, .., d - 2,
theta = rope_theta, M = max_position_embeddings, f = factor):

    default   inv_freq_i = theta^(-i/d)
    linear    inv_freq_i = theta^(-i/d) / f
    dynamic   (NTK) for a call whose largest position is L - 1: theta' = theta * (f s / M - (f - 1))^(d / (d - 2)) with
              s = max(L, M), inv_freq_i = theta'^(-i/d)  (equal to default while L <= M)
    yarn      inv_freq = interpolated theta^(-i/d)/f blended with extrapolated theta^(-i/d) by a linear ramp over the
              dimensions between the correction range of beta_fast / beta_slow rotations at the original context;
              cos and sin multiplied by the attention factor (0.1 ln f + 1 unless given, or its mscale ratio)
    llama3    (Llama 3.1+) with wavelength w_i = 2 pi / theta^(-i/d), original context O, low / high frequency factors
              l / h: w_i < O/h keeps theta^(-i/d), w_i > O/l divides it by f, and between the two it is blended,
              (1 - a) theta^(-i/d) / f + a theta^(-i/d) with a = (O / w_i - l) / (h - l)

Llama 3's scaling needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings (both libraries
assert them). Yarn with `original_max_position_embeddings` is read differently by the two libraries: PaddleFormers 1.0.0 replaces f
by M / original_max_position_embeddings, transformers 4.57 keeps f. Such a config is refused unless both agree
(M = f x original). Types other than these five (longrope, unknown names) and `partial_rotary_factor` != 1 are
refused. The effective parameters are `rope_parameters` when the config has them, else `rope_scaling` (as
PaddleFormers' configs read config.json). Every base takes its RoPE from here (Qwen3, Llama, Qwen2). Pure Python and
numpy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

__all__ = ["RopeScaling", "rope_scaling_of", "rope_fields_problem", "IMPLEMENTED"]

IMPLEMENTED = ("default", "linear", "dynamic", "yarn", "llama3")
_YARN_NUMBERS = ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _effective(fields: dict) -> Optional[dict]:
    r = fields.get("rope_parameters")
    return r if r is not None else fields.get("rope_scaling")


def _type_of(r: Optional[dict]) -> str:
    return "default" if r is None else r.get("rope_type", r.get("type", "default"))


def rope_fields_problem(fields: dict) -> Optional[str]:
    """Why the RoPE of config fields `fields` (config.json as read) cannot be served as PaddleFormers and
    transformers both define it, in one line; None when it can. `rope_parameters` / `rope_scaling` are objects here
    (paddle_vha/qwen3/contract.py checked that first)."""
    if "rope_parameters" in fields and fields["rope_parameters"] is None:
        return ("rope_parameters is null: PaddleFormers' Qwen3 reads it (and fails on a null); remove the key "
                "(rope_scaling is then read) or give an object")
    prf = fields.get("partial_rotary_factor")
    if prf is not None and prf != 1:
        return f"partial_rotary_factor {prf!r}: Qwen3 rotates the whole head (only 1 is implemented)"
    both = [fields.get(k) for k in ("rope_parameters", "rope_scaling")]
    said = [(_type_of(r), repr(r.get("factor"))) if isinstance(r, dict) else None for r in both]  # repr: NaN == NaN
    if None not in said and said[0] != said[1]:
        return (f"rope_parameters ({said[0][0]}, factor {said[0][1]}) and rope_scaling ({said[1][0]}, factor "
                f"{said[1][1]}) disagree: give one (PaddleFormers reads rope_parameters, transformers 4.57 "
                "rope_scaling)")
    r = _effective(fields)
    kind = _type_of(r)
    key = "rope_parameters" if fields.get("rope_parameters") is not None else "rope_scaling"
    if kind not in IMPLEMENTED:
        return (f"{key} rope_type {kind!r} is not implemented (paddle-vha serves {', '.join(IMPLEMENTED)}, the "
                "types Qwen3, Qwen2 and Llama configs use)")
    if kind == "default":
        return None
    f = r.get("factor")
    if not (_number(f) and f >= 1):
        return f"{key} {kind}: factor must be a finite number >= 1, got {f!r}"
    if kind == "yarn":
        return _yarn_problem(r, key, fields)
    if kind == "llama3":
        return _llama3_problem(r, key)
    return None


def _llama3_problem(r: dict, key: str) -> Optional[str]:
    for name in ("low_freq_factor", "high_freq_factor"):
        if not (_number(r.get(name)) and r[name] > 0):
            return f"{key} llama3: {name} must be a finite number > 0, got {r.get(name)!r}"
    if not r["high_freq_factor"] > r["low_freq_factor"]:
        return (f"{key} llama3: high_freq_factor {r['high_freq_factor']!r} must exceed low_freq_factor "
                f"{r['low_freq_factor']!r}")
    orig = r.get("original_max_position_embeddings")
    if not (isinstance(orig, int) and not isinstance(orig, bool) and orig >= 1):
        return f"{key} llama3: original_max_position_embeddings must be a positive int, got {orig!r}"
    return None


def _yarn_problem(r: dict, key: str, fields: dict) -> Optional[str]:
    for name in _YARN_NUMBERS:
        v = r.get(name)
        if v is not None and not (_number(v) and v >= 0):
            return f"{key} yarn: {name} must be a finite number >= 0, got {v!r}"
    if r.get("truncate", True) not in (True, False):
        return f"{key} yarn: truncate must be true or false, got {r.get('truncate')!r}"
    orig = r.get("original_max_position_embeddings")
    if orig is None:
        return None
    if not (isinstance(orig, int) and not isinstance(orig, bool) and orig >= 1):
        return f"{key} yarn: original_max_position_embeddings must be a positive int, got {orig!r}"
    m = fields.get("max_position_embeddings")
    if isinstance(m, int) and m / orig != r["factor"]:
        return (f"{key} yarn: factor {r['factor']:g} but max_position_embeddings / original_max_position_embeddings "
                f"= {m}/{orig} = {m / orig:g}; PaddleFormers 1.0.0 scales by the ratio, transformers 4.57 by the "
                f"factor: set max_position_embeddings to {r['factor'] * orig:g} (factor x original) so both agree")
    return None


@dataclass(frozen=True)
class RopeScaling:
    """One config's RoPE: its type, base, head width, factor and context (M), the inverse frequencies (float64, d/2)
    at positions below M, and the factor cos / sin are multiplied by."""

    rope_type: str
    theta: float
    dim: int
    factor: float
    max_position: int
    inv_freq: np.ndarray
    attention_scaling: float

    @property
    def dynamic(self) -> bool:
        return self.rope_type == "dynamic"

    @property
    def context(self) -> int:
        """The longest sequence the scaled RoPE is meant for: M, or f x M for dynamic NTK."""
        return int(self.factor * self.max_position) if self.dynamic else self.max_position

    def dynamic_inv_freq(self, seq_len: int) -> np.ndarray:
        """Dynamic NTK's inverse frequencies for a call whose largest position is seq_len - 1."""
        s = max(seq_len, self.max_position)
        f, d = self.factor, self.dim
        base = self.theta * ((f * s / self.max_position) - (f - 1)) ** (d / (d - 2))
        return 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)


def rope_scaling_of(cfg) -> RopeScaling:
    """The RoPE of a built Qwen3 config object (ValueError, one line, for one rope_fields_problem refuses)."""
    fields = {k: getattr(cfg, k) for k in ("rope_parameters", "rope_scaling", "partial_rotary_factor",
                                           "max_position_embeddings") if getattr(cfg, k, None) is not None}
    why = rope_fields_problem(fields)
    if why:
        raise ValueError(why)
    r = _effective(fields) or {}
    theta = float(r.get("rope_theta") or getattr(cfg, "rope_theta", None) or 10000.0)
    d, m, kind = int(cfg.head_dim), int(cfg.max_position_embeddings), _type_of(r or None)
    f = float(r.get("factor", 1.0)) if kind != "default" else 1.0
    base = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    inv, scaling = base, 1.0
    if kind == "linear":
        inv = base / f
    elif kind == "yarn":
        inv, scaling = _yarn(r, theta, d, f, m)
    elif kind == "llama3":
        inv = _llama3(r, base, f)
    return RopeScaling(kind, theta, d, f, m, inv, scaling)


def _llama3(r: dict, base: np.ndarray, f: float) -> np.ndarray:
    """Llama 3's inverse frequencies (see the module docstring)."""
    orig, low, high = r["original_max_position_embeddings"], r["low_freq_factor"], r["high_freq_factor"]
    wavelen = 2 * math.pi / base
    a = (orig / wavelen - low) / (high - low)  # 0 at the long-wavelength end, 1 at the short one
    blended = (1 - a) * base / f + a * base
    return np.where(wavelen < orig / high, base, np.where(wavelen > orig / low, base / f, blended))


def _yarn(r: dict, theta: float, d: int, f: float, m: int):
    """(inv_freq, attention factor) of YaRN (see the module docstring)."""
    orig = r.get("original_max_position_embeddings") or m

    def mscale(scale, k=1.0):
        return 1.0 if scale <= 1 else 0.1 * k * math.log(scale) + 1.0

    att = r.get("attention_factor")
    if att is None:
        ms, ms_all = r.get("mscale"), r.get("mscale_all_dim")
        att = mscale(f, ms) / mscale(f, ms_all) if ms and ms_all else mscale(f)
    fast, slow = r.get("beta_fast") or 32, r.get("beta_slow") or 1

    def correction_dim(rotations):
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(fast), correction_dim(slow)
    if r.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # the definition's guard against a zero-width ramp
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1: keep the original frequency, 0: interpolate it by f
    pos = theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    inv = (1.0 / (f * pos)) * (1 - extrapolation) + (1.0 / pos) * extrapolation
    return inv, float(att)
