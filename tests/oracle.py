"""Float64 numpy reference of Qwen3-VHA, written from the method's equations (docs/method.md), and of the same layers
over Llama and Qwen2: a layer whose tensors hold no q_norm / k_norm (Llama, Qwen2) normalises nothing, and every bias
the tensors hold (Qwen2: q/k/v only) is added to its projection.

Imports nothing from paddle_vha or paddle. Weights use the on-disk (Hugging Face) layout: Linear
weights are [out, in], so y = x @ W.T (+ b). `cfg` is a plain dict with config.json's keys.
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
    """Rotate-half RoPE on the last axis of x (..., S, H, d); positions (B, S) or (S,)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,)
    ang = np.asarray(positions, np.float64)[..., None] * inv_freq  # (B, S, d/2)
    ang = np.concatenate([ang, ang], axis=-1)[..., None, :]  # (B, S, 1, d)
    cos, sin = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    rot = np.concatenate([-x2, x1], axis=-1)
    return x * cos + rot * sin


def causal_mask(positions, T, window=None):
    """True where key position t is hidden from the query at position s: t > s, or t <= s - window (a sliding-window
    layer sees the `window` positions ending at its own, as Hugging Face's Qwen3 does)."""
    key_pos = np.arange(T)[None, None, :]
    pos = np.asarray(positions)[:, :, None]
    hidden = key_pos > pos
    if window:
        hidden |= key_pos <= pos - window
    return hidden


def layer_window(cfg, layer):
    """The sliding window of decoder layer `layer` (None: full attention), from config.json's layer_types."""
    types = cfg.get("layer_types") or []
    return cfg.get("sliding_window") if layer is not None and layer < len(types) and types[layer] == "sliding_attention" \
        else None


def layer_sizes(cfg, layer):
    """(H_v, H_kv, d, r, RoPE base) of decoder layer `layer`: a sliding-window layer takes the vha_window_* values that
    are set (a new head width d_w makes r = d_w unless vha_window_q_head_dim says otherwise)."""
    d = cfg["head_dim"]
    sizes = [cfg["num_attention_heads"], cfg["num_key_value_heads"], d, cfg.get("vha_q_head_dim") or d,
             cfg["rope_theta"]]
    if layer_window(cfg, layer) is None:
        return tuple(sizes)
    w = lambda k, default: default if cfg.get(k) is None else cfg[k]  # noqa: E731
    d_w = w("vha_window_head_dim", d)
    r_w = w("vha_window_q_head_dim", sizes[3] if d_w == d else d_w)
    return (w("vha_window_num_attention_heads", sizes[0]), w("vha_window_num_key_value_heads", sizes[1]), d_w, r_w,
            w("vha_window_rope_theta", sizes[4]))


def softmax_with_sink(scores, sink=None):
    """softmax over the last axis of scores (-inf = hidden); with a sink logit s (a scalar, this head's), the
    denominator gains exp(s) and no column is added: w_t = exp(a_t) / (sum_u exp(a_u) + exp(s)) (docs/method.md,
    "Attention sinks")."""
    m = scores.max(-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink)
    e = np.exp(scores - m)
    denom = e.sum(-1, keepdims=True) + (0.0 if sink is None else np.exp(sink - m))
    return e / denom


def head_sink(p, cfg, layer, j):
    """Head j's sink logit on a window layer whose tensors hold `sinks`, else None."""
    if "sinks" not in p or layer_window(cfg, layer) is None:
        return None
    return float(np.asarray(p["sinks"], np.float64)[j])


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def vha_attention(x, p, cfg, positions, past=None, layer=None):
    """One Qwen3-VHA attention layer (layer: its index, for sliding-window layers).

    x: (B, S, h); p: dict of this layer's tensors keyed like 'q_proj.weight', 'vha_premix_weight', ...
    positions: (B, S) absolute positions; past: optional (K, V), each (B, P, H_kv, d), already rotated.
    Returns (out (B, S, h), (K, V) including the new tokens).

    Without Premix (cfg vha_premix false): q_proj emits the H_v heads (width r = d) and they are attended directly.

    Shared KV (cfg vha_shared_kv): S = RoPE(k_norm(x W_S)) is both K and V, and each output head is rotated back
    by the query's own angle, R(-theta s), before Postmix.

    Sinks (a `sinks` tensor [H_v] on a window layer): virtual head j's softmax denominator gains exp(sinks[j]).
    """
    B, S, _ = x.shape
    h_v, h_kv, d, r, theta = layer_sizes(cfg, layer)
    h_p = h_v // h_kv  # virtual heads per KV head
    eps = cfg["rms_norm_eps"]
    b = (lambda n: p.get(n + ".bias"))

    shared = bool(cfg.get("vha_shared_kv"))
    n_q = h_p if cfg.get("vha_premix", True) else h_v  # heads q_proj emits
    q_phys = linear(x, p["q_proj.weight"], b("q_proj")).reshape(B, S, n_q, r)
    if shared:
        k = linear(x, p["shared_kv_proj.weight"], b("shared_kv_proj")).reshape(B, S, h_kv, d)
    else:
        k = linear(x, p["k_proj.weight"], b("k_proj")).reshape(B, S, h_kv, d)
        v = linear(x, p["v_proj.weight"], b("v_proj")).reshape(B, S, h_kv, d)

    if cfg.get("vha_premix", True):
        # Premix: virtual head j = g * H_p + i is Q_i @ W_premix[g].
        premix = np.asarray(p["vha_premix_weight"], np.float64)  # (H_kv, r, d)
        q = np.empty((B, S, h_v, d))
        for g in range(h_kv):
            for i in range(h_p):
                q[:, :, g * h_p + i, :] = q_phys[:, :, i, :] @ premix[g]
    else:
        q = q_phys  # no Premix: q_proj's H_v heads of width d are the virtual heads

    q = rope(head_norm(q, p.get("q_norm.weight"), eps), positions, theta)
    k = rope(head_norm(k, p.get("k_norm.weight"), eps), positions, theta)
    if shared:
        v = k  # K = V: the normed, rotated shared projection
    if past is not None:
        k = np.concatenate([past[0], k], axis=1)
        v = np.concatenate([past[1], v], axis=1)
    T = k.shape[1]

    # Attention: virtual head j reads KV head j // H_p; causal over absolute positions (and the layer's window).
    mask = causal_mask(positions, T, layer_window(cfg, layer))
    y = np.empty((B, S, h_v, d))
    for j in range(h_v):
        g = j // h_p
        scores = np.einsum("bsd,btd->bst", q[:, :, j], k[:, :, g]) / np.sqrt(d)
        scores = np.where(mask, -np.inf, scores)
        w = softmax_with_sink(scores, head_sink(p, cfg, layer, j))
        y[:, :, j] = np.einsum("bst,btd->bsd", w, v[:, :, g])
    if shared:
        y = rope(y, -np.asarray(positions, np.float64), theta)  # R(-theta s): rotation by the negated angle

    # Postmix: Y'_j = sum_k M[j, k] Y_k, M = I + V U^T.
    M = np.eye(h_v) + np.asarray(p["vha_postmix_V"], np.float64) @ np.asarray(p["vha_postmix_U"], np.float64).T
    y = np.einsum("jk,bskd->bsjd", M, y).reshape(B, S, h_v * d)
    if cfg.get("vha_gated_attention"):
        y = y * sigmoid(linear(x, p["gate_proj.weight"]))
    return linear(y, p["o_proj.weight"], b("o_proj")), (k, v)


def layer_params(state, i, sub):
    prefix = f"model.layers.{i}.{sub}."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def causal_lm(input_ids, state, cfg, positions=None, past=None, attention=None):
    """Logits (B, S, vocab) of the whole Qwen3-VHA causal LM, and the per-layer (K, V) cache."""
    attention = attention or vha_attention
    input_ids = np.asarray(input_ids)
    B, S = input_ids.shape
    if positions is None:
        start = 0 if past is None else past[0][0].shape[1]
        positions = np.broadcast_to(np.arange(start, start + S), (B, S))
    eps = cfg["rms_norm_eps"]
    x = np.asarray(state["model.embed_tokens.weight"], np.float64)[input_ids]
    cache = []
    for i in range(cfg["num_hidden_layers"]):
        g = lambda n: state[f"model.layers.{i}.{n}"]  # noqa: E731
        a, kv = attention(
            rms_norm(x, g("input_layernorm.weight"), eps),
            layer_params(state, i, "self_attn"),
            cfg,
            positions,
            None if past is None else past[i],
            layer=i,
        )
        cache.append(kv)
        x = x + a
        hdn = rms_norm(x, g("post_attention_layernorm.weight"), eps)
        mlp = silu(linear(hdn, g("mlp.gate_proj.weight"))) * linear(hdn, g("mlp.up_proj.weight"))
        x = x + linear(mlp, g("mlp.down_proj.weight"))
    x = rms_norm(x, state["model.norm.weight"], eps)
    head = state.get("lm_head.weight", state["model.embed_tokens.weight"])
    return linear(x, head), cache


def gqa_attention(x, p, cfg, positions, past=None, layer=None):
    """One stock Qwen3 GQA attention layer (query head j reads KV head j // (H_q / H_kv)); same I/O as vha_attention.
    With a shared_kv_proj tensor (Qwen3 shared-KV, the folded form of shared-KV VHA): K = V = RoPE(k_norm(x W_S)) and
    each output head is rotated back by the query's angle. A `sinks` tensor [H] on a window layer: head j's softmax
    denominator gains exp(sinks[j])."""
    B, S, _ = x.shape
    h_q, h_kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    b = (lambda n: p.get(n + ".bias"))
    shared = "shared_kv_proj.weight" in p
    q = linear(x, p["q_proj.weight"], b("q_proj")).reshape(B, S, h_q, d)
    k = linear(x, p["shared_kv_proj.weight" if shared else "k_proj.weight"],
               b("shared_kv_proj" if shared else "k_proj")).reshape(B, S, h_kv, d)
    q = rope(head_norm(q, p.get("q_norm.weight"), eps), positions, theta)
    k = rope(head_norm(k, p.get("k_norm.weight"), eps), positions, theta)
    v = k if shared else linear(x, p["v_proj.weight"], b("v_proj")).reshape(B, S, h_kv, d)
    if past is not None:
        k, v = np.concatenate([past[0], k], axis=1), np.concatenate([past[1], v], axis=1)
    mask = causal_mask(positions, k.shape[1], layer_window(cfg, layer))
    y = np.empty((B, S, h_q, d))
    for j in range(h_q):
        g = j // (h_q // h_kv)
        scores = np.einsum("bsd,btd->bst", q[:, :, j], k[:, :, g]) / np.sqrt(d)
        scores = np.where(mask, -np.inf, scores)
        w = softmax_with_sink(scores, head_sink(p, cfg, layer, j))
        y[:, :, j] = np.einsum("bst,btd->bsd", w, v[:, :, g])
    if shared:
        y = rope(y, -np.asarray(positions, np.float64), theta)
    return linear(y.reshape(B, S, h_q * d), p["o_proj.weight"], b("o_proj")), (k, v)


def stock_causal_lm(input_ids, state, cfg, positions=None, past=None):
    """Logits of a stock Qwen3 (GQA) causal LM from on-disk tensors: causal_lm with gqa_attention."""
    return causal_lm(input_ids, state, cfg, positions, past, attention=gqa_attention)
