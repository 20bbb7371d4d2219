"""Bytes and parameter counts that say what VHA buys: KV cache per token, attention weights per layer."""
from __future__ import annotations

__all__ = ["kv_cache_bytes_per_token", "attention_params_per_layer", "count_parameters"]


def kv_cache_bytes_per_token(cfg, bytes_per_elem: int = 2, all_layers: bool = False) -> int:
    """K and V for one token: 2 * H_kv * d elements per layer (times L with all_layers)."""
    per_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * bytes_per_elem
    return per_layer * (cfg.num_hidden_layers if all_layers else 1)


def attention_params_per_layer(cfg) -> dict:
    """Weights of one attention layer by part (biases and norms included), as trained."""
    h, d, h_q, h_kv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    bias = bool(cfg.attention_bias)
    vha = getattr(cfg, "model_type", "") == "qwen3_vha"
    q_out = (h_q // h_kv) * cfg.vha_q_head_dim if vha else h_q * d
    parts = {
        "q_proj": h * q_out + bias * q_out,
        "k_proj": h * h_kv * d + bias * h_kv * d,
        "v_proj": h * h_kv * d + bias * h_kv * d,
        "o_proj": h_q * d * h + bias * h,
        "qk_norm": 2 * d,
    }
    if vha:
        parts["premix"] = h_kv * cfg.vha_q_head_dim * d
        parts["postmix"] = 2 * h_q * cfg.vha_postmix_rank
        if cfg.vha_gated_attention:
            parts["gate_proj"] = h * h_q * d
    parts["total"] = sum(parts.values())
    return parts


def count_parameters(model) -> int:
    return int(sum(p.size for p in model.parameters()))
