"""Float64 numpy reference of Qwen3-MEA, written from the method's equations (docs/mea.md).

Imports nothing from paddle_vha or paddle. Weights use the on-disk (Hugging Face) layout: Linear weights are
[out, in], so y = x @ W.T (+ b). `cfg` is a plain dict with config.json's keys.

One MEA attention layer (n_p physical KV heads, n_v virtual KV heads, H query heads, d head width):

    K_p = x W_K,  V_p = x W_V                         (B, S, n_p, d)
    K_v[j] = sum_p K_p[p] * k_lc[p, j]                 (B, S, n_v, d)   HLC, k_lc: [n_p, n_v]
    V_v[j] = sum_p V_p[p] * v_lc[p, j]                                  v_lc: [n_p, n_v]
    k_norm (RMSNorm over d) on the physical heads before HLC ("before_hlc") or on the virtual heads after
    it ("after_hlc"); RoPE after k_norm. Q = RoPE(q_norm(x W_Q)).
    query head i reads virtual KV head i // (H / n_v)
    C_i = softmax(Q_i K_v^T / sqrt(d) + causal) V_v
    with mea_group_norm: C_i = RMSNorm(C_i) * g[i]   (per head over d, weight g: [H*d] viewed as [H, d])
    out = concat(C) W_O

A layer not listed in mea_layers is stock Qwen3 attention with mea_stock_kv_heads KV heads.
"""
from __future__ import annotations

import numpy as np


def rms_norm(x, w, eps):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def head_norm(x, w, eps):
    """The per-head q/k RMSNorm with weight w (Qwen3), or x unchanged where the layer has none (w None: Llama, Qwen2)."""
    return x if w is None else rms_norm(x, w, eps)


def linear(x, w, b=None):
    y = x @ np.asarray(w, np.float64).T
    return y if b is None else y + b


def rope(x, positions, theta):
    """Rotate-half RoPE on the last axis of x (B, S, H, d); positions (B, S)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.asarray(positions, np.float64)[..., None] * inv_freq  # (B, S, d/2)
    ang = np.concatenate([ang, ang], axis=-1)[..., None, :]  # (B, S, 1, d)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * np.cos(ang) + np.concatenate([-x2, x1], axis=-1) * np.sin(ang)


def silu(x):
    return x / (1.0 + np.exp(-x))


def hlc(t, lc):
    """(B, S, n_p, d) x (n_p, n_v) -> (B, S, n_v, d): virtual head j = sum_p t[p] * lc[p, j]."""
    return np.einsum("bspd,pv->bsvd", t, np.asarray(lc, np.float64))


def mea_layers(cfg):
    layers = cfg.get("mea_layers")
    return set(range(cfg["num_hidden_layers"])) if layers is None else set(layers)


def attention(x, p, cfg, positions, past=None, mea=True):
    """One attention layer, MEA (mea=True) or stock Qwen3 (mea=False); without q_norm / k_norm tensors (Llama, Qwen2)
    nothing is normalised, and the biases are the ones the tensors hold.

    x: (B, S, h); p: this layer's tensors keyed like 'q_proj.weight', 'mea_k_lc', ...
    positions: (B, S) absolute positions of x; past: dict of cached per-token tensors (see below) or None.
    The cache holds what the layer keeps per token: for MEA 'before_hlc' the physical K (normed, rotated) and V;
    for MEA 'after_hlc' the physical K before norm and RoPE, V, and the key positions; for stock the rotated K
    and V. Returns (out (B, S, h), new cache dict).
    """
    B, S, _ = x.shape
    H, d = cfg["num_attention_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    b = lambda n: p.get(n + ".bias")  # noqa: E731
    q = rope(head_norm(linear(x, p["q_proj.weight"], b("q_proj")).reshape(B, S, H, d), p.get("q_norm.weight"), eps),
             positions, theta)
    k = linear(x, p["k_proj.weight"], b("k_proj")).reshape(B, S, -1, d)
    v = linear(x, p["v_proj.weight"], b("v_proj")).reshape(B, S, -1, d)
    after = mea and cfg.get("mea_k_norm_position", "before_hlc") == "after_hlc"
    if not after:
        k = rope(head_norm(k, p.get("k_norm.weight"), eps), positions, theta)
    new = {"k": k, "v": v, "pos": np.asarray(positions)}
    if past is not None:
        new = {n: np.concatenate([past[n], new[n]], axis=1) for n in new}
    k, v, key_pos = new["k"], new["v"], new["pos"]
    if mea:
        k, v = hlc(k, p["mea_k_lc"]), hlc(v, p["mea_v_lc"])
        if after:  # norm and RoPE on the virtual heads, each key at its own position
            k = rope(head_norm(k, p.get("k_norm.weight"), eps), key_pos, theta)
    n_kv = k.shape[2]
    group = H // n_kv

    y = np.empty((B, S, H, d))
    for i in range(H):
        j = i // group
        scores = np.einsum("bsd,btd->bst", q[:, :, i], k[:, :, j]) / np.sqrt(d)
        mask = key_pos[:, None, :] > np.asarray(positions)[:, :, None]
        scores = np.where(mask, -np.inf, scores)
        w = np.exp(scores - scores.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        y[:, :, i] = np.einsum("bst,btd->bsd", w, v[:, :, j])
    if mea and cfg.get("mea_group_norm"):
        y = rms_norm(y, np.asarray(p["mea_norm.weight"], np.float64).reshape(H, d), eps)
    return linear(y.reshape(B, S, H * d), p["o_proj.weight"], b("o_proj")), new


def layer_params(state, i, sub):
    prefix = f"model.layers.{i}.{sub}."
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def causal_lm(input_ids, state, cfg, positions=None, past=None):
    """Logits (B, S, vocab) of the whole MEA causal LM (stock if no layer is MEA), and the cache."""
    input_ids = np.asarray(input_ids)
    B, S = input_ids.shape
    if positions is None:
        start = 0 if past is None else past[0]["k"].shape[1]
        positions = np.broadcast_to(np.arange(start, start + S), (B, S))
    eps = cfg["rms_norm_eps"]
    mea = mea_layers(cfg) if "mea_kv_heads" in cfg else set()  # an MEA config (over any base), else stock
    x = np.asarray(state["model.embed_tokens.weight"], np.float64)[input_ids]
    cache = []
    for i in range(cfg["num_hidden_layers"]):
        g = lambda n: state[f"model.layers.{i}.{n}"]  # noqa: E731
        a, kv = attention(rms_norm(x, g("input_layernorm.weight"), eps), layer_params(state, i, "self_attn"), cfg,
                          positions, None if past is None else past[i], mea=i in mea)
        cache.append(kv)
        x = x + a
        hdn = rms_norm(x, g("post_attention_layernorm.weight"), eps)
        x = x + linear(silu(linear(hdn, g("mlp.gate_proj.weight"))) * linear(hdn, g("mlp.up_proj.weight")),
                       g("mlp.down_proj.weight"))
    x = rms_norm(x, state["model.norm.weight"], eps)
    return linear(x, state.get("lm_head.weight", state["model.embed_tokens.weight"])), cache


def svd_compress(w, n_heads, d, n_p):
    """The paper's eq. 23 for one projection, from the definition: W [n_heads*d, h] (HF layout).

    Column j of M [(h*d), n_heads] is head j's weight block flattened; M = U S V^T; keep the top n_p:
    physical weights U[:, :n_p] (as [n_p*d, h]) and HLC coefficients lc = S[:n_p] V[:, :n_p]^T  [n_p, n_heads].
    """
    w = np.asarray(w, np.float64)
    h = w.shape[1]
    M = np.stack([w[j * d:(j + 1) * d].reshape(-1) for j in range(n_heads)], axis=1)  # (d*h, H)
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    phys = np.concatenate([U[:, p].reshape(d, h) for p in range(n_p)], axis=0)
    lc = s[:n_p, None] * Vt[:n_p]
    return phys, lc
