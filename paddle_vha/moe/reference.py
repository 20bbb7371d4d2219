"""The forward pass of a Qwen3-MoE or Qwen3-MoE-VHA checkpoint in float64 numpy, on its own tensors (Hugging Face
names, [out, in] Linear weights): what `tools/fold.py --verify` runs on both sides of a MoE fold (there is no Paddle
Qwen3-MoE model here, paddle_vha/moe/base.py says why).

Per layer, with x the residual stream (B, S, h):
    attention   q = x W_q^T  (VHA: H_p heads of width r, then Premix: virtual head g*H_p + i = q_i P[g])
                k, v = x W_k^T, x W_v^T;  q, k = RoPE(rms(q) w_q), RoPE(rms(k) w_k)
                y = softmax(q k^T / sqrt(d) + causal) v      (query head j reads KV head j // (H_v / H_kv))
                VHA: y_j <- sum_k M[j, k] y_k,  M = I + V U^T;   out = y W_o^T (+ biases)
    MLP         dense: SwiGLU; MoE: p = softmax(x W_r^T), the k largest p (renormalised with norm_topk_prob),
                out = sum_j p_j SwiGLU_{e_j}(x)  (+ the shared expert, times sigmoid(x w_g) when gated)
Tensors are read one layer at a time through `get(name)` (float64).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .fields import moe_layers

__all__ = ["reference_logits"]


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):
    """Qwen3's rotate-half RoPE on (B, S, H, d) at positions pos (B, S)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = pos[:, :, None].astype(np.float64) * inv  # (B, S, d/2)
    ang = np.concatenate([ang, ang], -1)[:, :, None, :]  # (B, S, 1, d)
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * np.cos(ang) + rot * np.sin(ang)


def _theta(cfg) -> float:
    if getattr(cfg, "rope_scaling", None):
        raise ValueError("rope_scaling is set: the float64 reference models the plain RoPE only")
    return float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", cfg.rope_theta))


def _lin(get, has, name, x):
    """x W^T (+ b) for Linear `name` (without '.weight')."""
    out = x @ get(f"{name}.weight").T
    return out + get(f"{name}.bias") if has(f"{name}.bias") else out


def _attention(x, p: str, get, has, cfg, pos):
    """Layer attention output (B, S, h); p is the layer's prefix."""
    B, S = x.shape[:2]
    a, eps, d = p + "self_attn.", cfg.rms_norm_eps, cfg.head_dim
    if has(a + "shared_kv_proj.weight"):
        raise ValueError(f"{a}shared_kv_proj: shared-KV attention is not in the MoE reference")
    q = _lin(get, has, a + "q_proj", x)
    if has(a + "vha_premix_weight"):
        premix = get(a + "vha_premix_weight")  # (H_kv, r, d)
        q = q.reshape(B, S, -1, premix.shape[1])  # (B, S, H_p, r)
        q = np.einsum("bsir,grd->bsgid", q, premix).reshape(B, S, -1, d)  # virtual head g*H_p + i
    else:
        q = q.reshape(B, S, -1, d)  # (B, S, H, d)
    k = _lin(get, has, a + "k_proj", x).reshape(B, S, -1, d)  # (B, S, H_kv, d)
    v = _lin(get, has, a + "v_proj", x).reshape(B, S, -1, d)
    theta = _theta(cfg)
    q = _rope(_rms(q, get(a + "q_norm.weight"), eps), pos, theta)
    k = _rope(_rms(k, get(a + "k_norm.weight"), eps), pos, theta)
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)  # (B, S, H_v, d): head j reads j // group
    scores = np.einsum("bshd,bthd->bhst", q, k) / np.sqrt(d)
    scores = np.where(np.triu(np.ones((S, S), bool), 1)[None, None], -np.inf, scores)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    y = np.einsum("bhst,bthd->bshd", w / w.sum(-1, keepdims=True), v)  # (B, S, H_v, d)
    if has(a + "vha_postmix_U"):
        u, vv = get(a + "vha_postmix_U"), get(a + "vha_postmix_V")
        y = np.einsum("jk,bskd->bsjd", np.eye(u.shape[0]) + vv @ u.T, y)  # y_j <- sum_k M[j, k] y_k
    return _lin(get, has, a + "o_proj", y.reshape(B, S, -1))


def _swiglu(get, prefix: str, x):
    g = x @ get(f"{prefix}.gate_proj.weight").T
    return (g / (1.0 + np.exp(-g)) * (x @ get(f"{prefix}.up_proj.weight").T)) @ get(f"{prefix}.down_proj.weight").T


def _moe(x, p: str, get, has, cfg):
    """The routed experts (and the shared expert) on tokens x (N, h)."""
    m = p + "mlp."
    probs = x @ get(m + "gate.weight").T  # (N, E) router logits
    probs = np.exp(probs - probs.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, : cfg.num_experts_per_tok]  # (N, k)
    weights = np.take_along_axis(probs, top, -1)
    if cfg.norm_topk_prob:
        weights = weights / weights.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for e in np.unique(top):
        rows, slot = np.nonzero(top == e)  # the tokens routed to expert e
        out[rows] += weights[rows, slot][:, None] * _swiglu(get, f"{m}experts.{e}", x[rows])
    if has(m + "shared_expert.gate_proj.weight"):
        shared = _swiglu(get, m + "shared_expert", x)
        if has(m + "shared_expert_gate.weight"):
            shared = shared / (1.0 + np.exp(-(x @ get(m + "shared_expert_gate.weight").T)))
        out += shared
    return out


def reference_logits(ids: np.ndarray, get: Callable[[str], np.ndarray], has: Callable[[str], bool], cfg) -> np.ndarray:
    """Logits (B, S, V) of the checkpoint whose tensors get(name) reads (float64); cfg: its config (a Qwen3MoeConfig
    or Qwen3MoeVHAConfig)."""
    B, S = ids.shape
    pos = np.broadcast_to(np.arange(S), (B, S))
    eps = cfg.rms_norm_eps
    x = get("model.embed_tokens.weight")[ids]  # (B, S, h)
    sparse = set(moe_layers(cfg))
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        x = x + _attention(_rms(x, get(p + "input_layernorm.weight"), eps), p, get, has, cfg, pos)
        hdn = _rms(x, get(p + "post_attention_layernorm.weight"), eps).reshape(B * S, -1)  # (B*S, h)
        mlp = _moe(hdn, p, get, has, cfg) if i in sparse else _swiglu(get, p + "mlp", hdn)
        x = x + mlp.reshape(B, S, -1)
    x = _rms(x, get("model.norm.weight"), eps)
    head = get("lm_head.weight") if has("lm_head.weight") else get("model.embed_tokens.weight")
    return x @ head.T
