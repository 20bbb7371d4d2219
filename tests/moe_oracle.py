"""An independent float64 oracle of the unfolded Qwen3-MoE-VHA forward and of stock Qwen3-MoE, written from the
equations (docs/method.md, Hugging Face's Qwen3MoeSparseMoeBlock), importing nothing from paddle_vha.

    attention  physical heads q_i = x W_q^(i) (width r); virtual head g*H_p + i = q_i P[g] (d wide), per KV group g;
               per-head RMSNorm and RoPE on queries and keys; causal softmax attention, head g*H_p + i reads KV head g;
               Postmix Y' = (I + V U^T) Y over heads; o_proj.  Stock: H_q heads of width d, no Premix / Postmix.
    MoE MLP    p = softmax(x W_r^T) over all experts; the top-k of p; weights renormalised to sum 1 when
               norm_topk_prob; out = sum over chosen e of w_e * down_e(silu(gate_e x) * up_e x).
               Here every expert is evaluated on every token and masked (a different order of work from the
               package's per-expert gather), so the two share no code and little structure. A shared expert
               (upstream PaddleFleet's) adds silu-SwiGLU_s(x), times sigmoid(x w_g) when it has its gate.
"""
import numpy as np


def rms(x, w, eps):
    return w * (x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps))


def rope(x, theta):
    """x (B, H, S, d), positions 0..S-1, rotate-half."""
    S, d = x.shape[-2], x.shape[-1]
    freq = theta ** (-np.arange(0, d // 2) * 2.0 / d)  # (d/2,)
    ang = np.arange(S)[:, None] * freq[None, :]  # (S, d/2)
    cos, sin = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def attention(x, t, p, c):
    """One layer's attention (B, S, h) from tensors t (HF names, prefix p), config dict c."""
    B, S, _ = x.shape
    d, h_kv, eps = c["head_dim"], c["num_key_value_heads"], c["rms_norm_eps"]
    lin = lambda n, v: v @ t[p + n + ".weight"].T + (t[p + n + ".bias"] if p + n + ".bias" in t else 0)  # noqa
    premix = t.get(p + "self_attn.vha_premix_weight")
    q = lin("self_attn.q_proj", x)
    if premix is not None:
        r = premix.shape[1]
        phys = q.reshape(B, S, -1, r)  # (B, S, H_p, r)
        q = np.concatenate([phys @ premix[g] for g in range(h_kv)], axis=2)  # (B, S, H_kv*H_p, d) group-major
    q = q.reshape(B, S, -1, d).transpose(0, 2, 1, 3)  # (B, H_v, S, d)
    k = lin("self_attn.k_proj", x).reshape(B, S, h_kv, d).transpose(0, 2, 1, 3)
    v = lin("self_attn.v_proj", x).reshape(B, S, h_kv, d).transpose(0, 2, 1, 3)
    q = rope(rms(q, t[p + "self_attn.q_norm.weight"], eps), c["rope_theta"])
    k = rope(rms(k, t[p + "self_attn.k_norm.weight"], eps), c["rope_theta"])
    h_v = q.shape[1]
    per = h_v // h_kv
    causal = np.tril(np.ones((S, S), bool))
    y = np.empty_like(q)
    for j in range(h_v):
        s = q[:, j] @ k[:, j // per].transpose(0, 2, 1) / np.sqrt(d)  # (B, S, S)
        s = np.where(causal, s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        y[:, j] = (a / a.sum(-1, keepdims=True)) @ v[:, j // per]
    if p + "self_attn.vha_postmix_U" in t:
        m = np.eye(h_v) + t[p + "self_attn.vha_postmix_V"] @ t[p + "self_attn.vha_postmix_U"].T  # (H_v, H_v)
        y = np.einsum("jk,bksd->bjsd", m, y)
    return lin("self_attn.o_proj", y.transpose(0, 2, 1, 3).reshape(B, S, -1))


def swiglu(x, gate, up, down):
    g = x @ gate.T
    return (g * (1 / (1 + np.exp(-g))) * (x @ up.T)) @ down.T


def moe(x, t, p, c):
    """Routed experts on x (B, S, h): all experts on all tokens, masked by the top-k routing weights."""
    logits = x @ t[p + "mlp.gate.weight"].T  # (B, S, E)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    probs = e / e.sum(-1, keepdims=True)
    k = c["num_experts_per_tok"]
    kth = np.sort(probs, -1)[..., -k][..., None]  # the k-th largest probability per token
    chosen = probs >= kth  # (B, S, E): exactly k per token for distinct values
    w = np.where(chosen, probs, 0.0)
    if c["norm_topk_prob"]:
        w = w / w.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for ex in range(c["num_experts"]):
        q = f"{p}mlp.experts.{ex}."
        out += w[..., ex:ex + 1] * swiglu(x, t[q + "gate_proj.weight"], t[q + "up_proj.weight"], t[q + "down_proj.weight"])
    s = p + "mlp.shared_expert."
    if s + "gate_proj.weight" in t:  # a shared expert every token goes through, sigmoid-gated if it has the gate
        y = swiglu(x, t[s + "gate_proj.weight"], t[s + "up_proj.weight"], t[s + "down_proj.weight"])
        g = p + "mlp.shared_expert_gate.weight"
        out += y * (1 / (1 + np.exp(-(x @ t[g].T)))) if g in t else y
    return out


def is_moe_layer(i, c):
    return i not in (c.get("mlp_only_layers") or []) and (i + 1) % c.get("decoder_sparse_step", 1) == 0


def logits(ids, t, c):
    """Logits (B, S, V) of the checkpoint tensors t (float64, HF names) with config.json dict c."""
    x = t["model.embed_tokens.weight"][ids]
    eps = c["rms_norm_eps"]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attention(rms(x, t[p + "input_layernorm.weight"], eps), t, p, c)
        hn = rms(x, t[p + "post_attention_layernorm.weight"], eps)
        if is_moe_layer(i, c):
            x = x + moe(hn, t, p, c)
        else:
            x = x + swiglu(hn, t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"], t[p + "mlp.down_proj.weight"])
    x = rms(x, t["model.norm.weight"], eps)
    return x @ t.get("lm_head.weight", t["model.embed_tokens.weight"]).T


def topk_margin(ids, t, c):
    """The smallest relative gap (p_k - p_k+1) / p_k, over tokens and MoE layers, between the k-th and (k+1)-th
    routing probability: how far the routing is from a tie that float32 rounding could flip."""
    x = t["model.embed_tokens.weight"][ids]
    eps, gaps = c["rms_norm_eps"], []
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attention(rms(x, t[p + "input_layernorm.weight"], eps), t, p, c)
        hn = rms(x, t[p + "post_attention_layernorm.weight"], eps)
        if is_moe_layer(i, c):
            lg = hn @ t[p + "mlp.gate.weight"].T
            pr = np.exp(lg - lg.max(-1, keepdims=True))
            pr = np.sort(pr / pr.sum(-1, keepdims=True), -1)
            k = c["num_experts_per_tok"]
            gaps.append(((pr[..., -k] - pr[..., -k - 1]) / pr[..., -k]).min())
            x = x + moe(hn, t, p, c)
        else:
            x = x + swiglu(hn, t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"], t[p + "mlp.down_proj.weight"])
    return float(min(gaps))
