"""Upstream VHA's forward pass in float64 numpy, on an upstream checkpoint's own tensors (names, Paddle [in, out]
layout, fused projections), written from upstream's equations: what tools/import_fleet.py --verify compares the
imported model against.

Per layer (PaddleFleet SelfAttentionVHA; the research fork is the same with r = d):
    q   = x W_q                                   (B, S, g, r)    g = H_v / H_kv physical query heads
    q_v = einsum("btgr,krd->btkgd", q, P)         (B, S, H_kv, g, d) -> (B, S, H_v, d): virtual head k*g + j
    k, v = x W_k, x W_v    (shared KV: s = x W_s is both, after k_norm and RoPE; the output is rotated back)
    q_v, k = RoPE(rms(q_v) w_q), RoPE(rms(k) w_k);  y = softmax(q_v k^T / sqrt(d) + mask) v   (head h reads h // g)
    y'  = (I + V U^T) y over heads;  y' * sigmoid(x W_gate) if gated;  out = y' W_o
Sliding-window layers hide keys at or before q - W and use their own sizes and RoPE base. A layer whose core attention
holds `softmax_offset` [H_v] (upstream's learnable softmax, add_swa_attention_sink_bias) takes its softmax as
upstream's dot_product_attention does: m = max(max_t a_ht, s_h), w_ht = exp(a_ht - m) / (sum_t exp(a_ht - m) +
exp(s_h - m)) (a value-less virtual token).
MoE layers (a router `mlp.gate.weight` [E, h], PaddleFleet's StandardMoERouter with scoring softmax, greedy top-k):
    p = softmax(x W^T);  top_gate, top_idx = top-k of p;  top_gate /= (sum + 1e-20) with norm_topk_prob
    out = sum_j top_gate_j * SwiGLU_{top_idx_j}(x)  (+ shared expert, times sigmoid(x w_g) when it has its gate)
with each expert's up_gate_proj [h, 2 I_e] chunked gate | up, or the grouped-GEMM weight1 / weight2 [E, ...].
"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np

__all__ = ["reference_logits", "SINK_NAMES"]

# where upstream keeps a layer's sink logits: its core attention's softmax_offset (PaddleFleet's state dict), or the
# name its HF export writes (GPT-OSS's `sinks`)
SINK_NAMES = ("self_attn.core_attention.softmax_offset", "self_attn.sinks")


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, pos, theta, sign=1.0):
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = sign * pos[:, :, None].astype(np.float64) * inv  # (B, S, d/2)
    ang = np.concatenate([ang, ang], -1)[:, :, None, :]  # (B, S, 1, d)
    half = d // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * np.cos(ang) + rot * np.sin(ang)


def reference_logits(ids: np.ndarray, get: Callable[[str], np.ndarray], names: Dict[str, str], cfg, layout: str,
                     qkv_layout: str, up_gate_order: str) -> np.ndarray:
    """Logits (B, S, V) of the upstream model. get(name) reads an input tensor (float64); names maps this module's
    keys ('embed', 'norm', 'lm_head', 'L{i}.<rest>') to input names; cfg is the translated Qwen3VHAConfig (sizes,
    windows); layout 'paddle' ([in, out]) or 'hf' ([out, in])."""
    B, S = ids.shape
    eps = cfg.rms_norm_eps
    pos = np.broadcast_to(np.arange(S), (B, S))
    lin = _linear(get, names, layout)
    x = get(names["embed"])[ids]  # (B, S, h)
    for i in range(cfg.num_hidden_layers):
        L = f"L{i}."
        hdn = _rms(x, get(names[L + "input_layernorm.weight"]), eps)
        x = x + lin(L + "self_attn.o_proj.weight", _attention(hdn, i, get, names, lin, cfg, pos, qkv_layout))
        hdn = _rms(x, get(names[L + "post_attention_layernorm.weight"]), eps)
        x = x + _mlp(hdn, L, names, lin, up_gate_order, get, cfg)
    x = _rms(x, get(names["norm"]), eps)
    if "lm_head" in names:
        return lin("lm_head", x)
    return x @ get(names["embed"]).T


def _linear(get, names: Dict[str, str], layout: str):
    """lin(key, inp): inp times the weight `key` (in either layout, as [in, out]) plus its bias, if it has one."""
    def lin(key, inp):
        w = get(names[key])
        w = w if layout == "paddle" else w.T  # -> [in, out]
        b = names.get(key[: -len(".weight")] + ".bias") if key.endswith(".weight") else None
        return inp @ w + (get(b) if b else 0.0)

    return lin


def _attention(hdn, i: int, get, names: Dict[str, str], lin, cfg, pos, qkv_layout: str):
    """Layer i's attention output before o_proj, (B, S, H_v * d): Premix, norms and RoPE, softmax attention, the
    inverse RoPE of a shared-KV layer, Postmix and the optional sigmoid gate."""
    B, S = hdn.shape[:2]
    eps = cfg.rms_norm_eps
    dims = cfg.layer_dims(i)
    h_v, h_kv, d, r, theta = dims.num_heads, dims.num_kv_heads, dims.head_dim, dims.q_head_dim, dims.rope_theta
    g = h_v // h_kv
    L = f"L{i}."
    shared = L + "self_attn.shared_kv_proj.weight" in names
    q, k, v = _qkv(hdn, L, names, lin, shared, (g, r, h_kv, d), qkv_layout)
    q = q.reshape(B, S, g, r)
    premix = get(names[L + "self_attn.vha_premix_weight"])  # (H_kv, r, d)
    qv = np.einsum("btgr,krd->btkgd", q, premix).reshape(B, S, h_v, d)
    k = k.reshape(B, S, h_kv, d)
    qv = _rope(_rms(qv, get(names[L + "self_attn.q_norm.weight"]), eps), pos, theta)
    k = _rope(_rms(k, get(names[L + "self_attn.k_norm.weight"]), eps), pos, theta)
    v = k if shared else v.reshape(B, S, h_kv, d)
    sink = next((get(names[L + n]) for n in SINK_NAMES if L + n in names), None)  # (H_v,) or None
    y = _softmax_attention(qv, k, v, g, dims.window, sink)  # (B, S, H_v, d)
    if shared:
        y = _rope(y, pos, theta, sign=-1.0)
    m = np.eye(h_v) + get(names[L + "self_attn.vha_postmix_V"]) @ get(names[L + "self_attn.vha_postmix_U"]).T
    y = np.einsum("hj,bsjd->bshd", m, y).reshape(B, S, h_v * d)
    if L + "self_attn.gate_proj.weight" in names:  # elementwise sigmoid gate after Postmix
        y = y / (1.0 + np.exp(-lin(L + "self_attn.gate_proj.weight", hdn)))
    return y


def _qkv(hdn, L: str, names: Dict[str, str], lin, shared: bool, sizes, qkv_layout: str):
    """(q (B, S, g*r), k (B, S, H_kv*d), v or None for a shared-KV layer) from the fused or separate projections."""
    B, S = hdn.shape[:2]
    g, r, h_kv, d = sizes
    if L + "self_attn.qkv_proj.weight" in names:
        qkv = lin(L + "self_attn.qkv_proj.weight", hdn)  # (B, S, g*r + 2*H_kv*d)
        if qkv_layout == "concat":
            return tuple(np.split(qkv, [g * r, g * r + h_kv * d], axis=-1))
        per = qkv.reshape(B, S, h_kv, g // h_kv * r + 2 * d)  # per KV group: [its g / H_kv query heads | K | V]
        q = per[..., : g // h_kv * r].reshape(B, S, g * r)
        k = per[..., g // h_kv * r: g // h_kv * r + d].reshape(B, S, h_kv * d)
        v = per[..., g // h_kv * r + d:].reshape(B, S, h_kv * d)
        return q, k, v
    q = lin(L + "self_attn.q_proj.weight", hdn)
    k = lin(L + ("self_attn.shared_kv_proj.weight" if shared else "self_attn.k_proj.weight"), hdn)
    v = None if shared else lin(L + "self_attn.v_proj.weight", hdn)
    return q, k, v


def _softmax_attention(qv, k, v, g: int, window, sink=None):
    """softmax(q k^T / sqrt(d) + causal (and window) mask) v, (B, S, H_v, d); query head h reads KV head h // g; with
    sink (H_v,) a value-less virtual token of logit sink[h] in head h's softmax."""
    S, d = qv.shape[1], qv.shape[-1]
    hidden = np.arange(S)[None, :] > np.arange(S)[:, None]  # (S, T): key after query
    if window:
        hidden |= np.arange(S)[None, :] <= np.arange(S)[:, None] - window
    kk = np.repeat(k, g, axis=2)  # (B, T, H_v, d): head h reads KV head h // g
    vv = np.repeat(v, g, axis=2)
    scores = np.einsum("bshd,bthd->bhst", qv, kk) / np.sqrt(d)
    scores = np.where(hidden[None, None], -np.inf, scores)
    if sink is None:
        w = np.exp(scores - scores.max(-1, keepdims=True))
        return np.einsum("bhst,bthd->bshd", w / w.sum(-1, keepdims=True), vv)  # (B, S, H_v, d)
    s = np.asarray(sink, np.float64).reshape(1, -1, 1, 1)  # (1, H_v, 1, 1)
    row_max = np.maximum(scores.max(-1, keepdims=True), s)
    e = np.exp(scores - row_max)
    return np.einsum("bhst,bthd->bshd", e / (e.sum(-1, keepdims=True) + np.exp(s - row_max)), vv)


def _mlp(hdn, L: str, names: Dict[str, str], lin, up_gate_order: str, get=None, cfg=None):
    """The SwiGLU MLP, from a fused up_gate_proj (in up_gate_order) or separate gate / up projections; on a MoE layer
    (a router mlp.gate.weight) upstream's routed experts (_moe)."""
    if L + "mlp.gate.weight" in names:
        return _moe(hdn, L, names, lin, up_gate_order, get, cfg)
    return _swiglu(hdn, L + "mlp.", names, lin, up_gate_order)


def _swiglu(hdn, m: str, names: Dict[str, str], lin, up_gate_order: str):
    """silu(gate) * up, then down, for the MLP whose keys start with m ('L0.mlp.', 'L0.mlp.experts.3.', ...)."""
    if m + "up_gate_proj.weight" in names:
        first, second = np.split(lin(m + "up_gate_proj.weight", hdn), 2, axis=-1)  # paddle.chunk(x, 2): gate | up
        gate, up = (first, second) if up_gate_order == "gate-up" else (second, first)
    else:
        gate, up = lin(m + "gate_proj.weight", hdn), lin(m + "up_proj.weight", hdn)
    return lin(m + "down_proj.weight", gate / (1.0 + np.exp(-gate)) * up)


def _moe(hdn, L: str, names: Dict[str, str], lin, up_gate_order: str, get, cfg):
    """Upstream's MoE layer (StandardMoERouter + experts + shared expert), tokens (B, S, h): logits = x W^T with the
    router W [E, h] as stored, softmax, greedy top-k, top_gate / (sum + 1e-20) when norm_topk_prob; out = sum of the
    chosen experts' SwiGLU times their gate, plus the shared expert (times sigmoid(x w_g) if it has its gate)."""
    m = L + "mlp."
    logits = hdn @ get(names[m + "gate.weight"]).T  # (B, S, E)
    gates = np.exp(logits - logits.max(-1, keepdims=True))
    gates = gates / gates.sum(-1, keepdims=True)
    top_idx = np.argsort(-gates, axis=-1, kind="stable")[..., : cfg.num_experts_per_tok]  # (B, S, k), sorted
    top_gate = np.take_along_axis(gates, top_idx, -1)
    if cfg.norm_topk_prob:
        top_gate = top_gate / (top_gate.sum(-1, keepdims=True) + 1e-20)
    grouped = m + "grouped_gemm_experts.weight1" in names
    w1 = get(names[m + "grouped_gemm_experts.weight1"]) if grouped else None  # (E, h, 2 I_e)
    w2 = get(names[m + "grouped_gemm_experts.weight2"]) if grouped else None  # (E, I_e, h)
    out = np.zeros_like(hdn)
    for e in np.unique(top_idx):
        b, s, slot = np.nonzero(top_idx == e)
        x = hdn[b, s]  # (n, h): the tokens routed to expert e
        if grouped:  # paddle.chunk(x W1[e], 2): gate | up (as the fused per-expert form)
            first, second = np.split(x @ w1[e], 2, axis=-1)
            gate, up = (first, second) if up_gate_order == "gate-up" else (second, first)
            y = (gate / (1.0 + np.exp(-gate)) * up) @ w2[e]
        else:
            y = _swiglu(x, f"{m}experts.{e}.", names, lin, up_gate_order)
        np.add.at(out, (b, s), top_gate[b, s, slot][:, None] * y)
    if m + "shared_experts.down_proj.weight" in names:
        shared = _swiglu(hdn, m + "shared_experts.", names, lin, up_gate_order)
        if m + "shared_experts.gate_weight" in names:  # [h, 1]: F.linear(x, w) = x w, then sigmoid
            shared = shared / (1.0 + np.exp(-lin(m + "shared_experts.gate_weight", hdn)))
        out = out + shared
    return out
