"""Small Qwen3-MoE-VHA checkpoints written in numpy (config.json + safetensors, Hugging Face names and layout): several
experts, top-2, a dense layer among the MoE layers, Premix with r < d, Postmix of rank 2. Nothing from paddle_vha."""
import json
import os

import numpy as np
from safetensors.numpy import save_file

MOE_VHA = dict(
    model_type="qwen3_moe_vha", architectures=["Qwen3MoeVHAForCausalLM"], vocab_size=97, hidden_size=32,
    intermediate_size=40, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, head_dim=8,
    vha_q_head_dim=6, vha_postmix_rank=2, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
    tie_word_embeddings=False, attention_bias=False, hidden_act="silu", num_experts=6, num_experts_per_tok=2,
    moe_intermediate_size=12, decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=True,
)


def moe_vha_tensors(c, seed=0):
    """{name: float64 array} of a random Qwen3-MoE-VHA model with config dict c (Premix near identity plus noise,
    Postmix U, V nonzero, a router scaled so the routing is far from ties)."""
    rng = np.random.default_rng(seed)
    h, d, h_kv, h_v = c["hidden_size"], c["head_dim"], c["num_key_value_heads"], c["num_attention_heads"]
    r, R, E, I = c["vha_q_head_dim"], c["vha_postmix_rank"], c["num_experts"], c["moe_intermediate_size"]
    n = lambda *s, scale=0.2: rng.standard_normal(s) * scale  # noqa: E731
    t = {"model.embed_tokens.weight": n(c["vocab_size"], h, scale=1.0), "model.norm.weight": 1 + n(h, scale=0.1)}
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = n(c["vocab_size"], h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": 1 + n(h, scale=0.1), p + "post_attention_layernorm.weight": 1 + n(h, scale=0.1),
                  p + "self_attn.q_proj.weight": n(h_v // h_kv * r, h), p + "self_attn.k_proj.weight": n(h_kv * d, h),
                  p + "self_attn.v_proj.weight": n(h_kv * d, h), p + "self_attn.o_proj.weight": n(h, h_v * d),
                  p + "self_attn.q_norm.weight": 1 + n(d, scale=0.1), p + "self_attn.k_norm.weight": 1 + n(d, scale=0.1),
                  p + "self_attn.vha_premix_weight": np.eye(r, d)[None] * np.sqrt(d / r) + n(h_kv, r, d, scale=0.3),
                  p + "self_attn.vha_postmix_U": n(h_v, R, scale=0.5), p + "self_attn.vha_postmix_V": n(h_v, R, scale=0.5)})
        moe = i not in (c.get("mlp_only_layers") or []) and (i + 1) % c.get("decoder_sparse_step", 1) == 0
        if not moe:
            inter = c["intermediate_size"]
            t.update({p + "mlp.gate_proj.weight": n(inter, h), p + "mlp.up_proj.weight": n(inter, h),
                      p + "mlp.down_proj.weight": n(h, inter)})
            continue
        t[p + "mlp.gate.weight"] = n(E, h, scale=0.4)
        for e in range(E):
            q = f"{p}mlp.experts.{e}."
            t.update({q + "gate_proj.weight": n(I, h), q + "up_proj.weight": n(I, h), q + "down_proj.weight": n(h, I)})
    return t


def write_checkpoint(folder, config, tensors, dtype=np.float32):
    """config.json and one model.safetensors (tensors cast to dtype) in folder; returns the folder."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    save_file({k: np.ascontiguousarray(v, dtype) for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"))
    return str(folder)


def make_moe_vha(folder, seed=0, dtype=np.float64, **overrides):
    """A Qwen3-MoE-VHA checkpoint at MOE_VHA's sizes with `overrides`: (config dict, float64 tensors as written)."""
    c = dict(MOE_VHA, **overrides)
    t = moe_vha_tensors(c, seed)
    write_checkpoint(folder, c, t, dtype)
    return c, {k: np.asarray(v, dtype).astype(np.float64) for k, v in t.items()}


def add_shared_expert(t, c, width, seed=1, gated=True):
    """The shared expert (Hugging Face Qwen2-MoE names, as this family declares them) on every MoE layer of t."""
    rng = np.random.default_rng(seed)
    h = c["hidden_size"]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp."
        if p + "gate.weight" not in t:
            continue
        t[p + "shared_expert.gate_proj.weight"] = rng.standard_normal((width, h)) * 0.2
        t[p + "shared_expert.up_proj.weight"] = rng.standard_normal((width, h)) * 0.2
        t[p + "shared_expert.down_proj.weight"] = rng.standard_normal((h, width)) * 0.2
        if gated:
            t[p + "shared_expert_gate.weight"] = rng.standard_normal((1, h)) * 0.3
    return t


def upstream_config(c, shared=None, gated=False):
    """c as upstream PaddleFleet writes a VHA + MoE config: use_vha_attention, vha_q_lora_rank, n_routed_experts,
    the router's fields, the shared expert's."""
    out = {k: v for k, v in c.items() if k not in ("vha_q_head_dim", "num_experts", "architectures")}
    out.update(model_type="qwen3_moe", use_vha_attention=True, vha_q_lora_rank=c["vha_q_head_dim"],
               n_routed_experts=c["num_experts"], scoring_func="softmax", topk_method="greedy",
               routed_scaling_factor=1.0, moe_shared_expert_intermediate_size=shared, moe_shared_expert_gate=gated)
    return out


def to_upstream(t, grouped=False):
    """Our (HF-named, [out, in]) tensors as PaddleFleet stores them: no `model.` prefix, embedding.embed_tokens,
    Linear weights [in, out], gate | up fused per MLP and per expert (or stacked grouped-GEMM weight1 / weight2), the
    router [E, h] as it is, shared_experts.* with gate_weight [h, 1]."""
    out, experts = {}, {}
    for name, v in t.items():
        n = name[len("model."):] if name.startswith("model.") else name
        if n == "embed_tokens.weight":
            out["embedding.embed_tokens.weight"] = v
        elif name == "lm_head.weight" or name.endswith("_proj.weight"):
            out[n] = v.T
        elif n.endswith("shared_expert_gate.weight"):
            out[n.replace("shared_expert_gate.weight", "shared_experts.gate_weight")] = v.T
        else:
            out[n] = v
    for n in [k for k in out if k.endswith("gate_proj.weight") and ".self_attn." not in k]:
        base = n[: -len("gate_proj.weight")]
        up = base + "up_proj.weight"
        out[base + "up_gate_proj.weight"] = np.concatenate([out.pop(n), out.pop(up)], axis=1)  # [h, 2 I]: gate | up
    for n in [k for k in out if ".shared_expert." in k]:
        out[n.replace(".shared_expert.", ".shared_experts.")] = out.pop(n)
    if grouped:
        for n in sorted(k for k in out if ".mlp.experts." in k):
            layer, rest = n.split(".mlp.experts.")
            e, what = rest.split(".", 1)
            experts.setdefault((layer, what), {})[int(e)] = out.pop(n)
        for (layer, what), per in experts.items():
            w = "weight1" if what.startswith("up_gate") else "weight2"
            out[f"{layer}.mlp.grouped_gemm_experts.{w}"] = np.stack([per[e] for e in sorted(per)])  # (E, in, out)
    return out
