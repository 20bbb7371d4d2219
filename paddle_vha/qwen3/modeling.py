"""What the families' layers and backbones share on top of PaddleFormers' Qwen3: the attention core through the
configured backend, the shared K = V cache update, RoPE tables per (head width, base), cache-continuing positions and
single-device Linears. (The classes themselves are built by paddle_vha/modeling/factory.py.)"""
from __future__ import annotations

import copy

import paddle
from paddle import nn
from paddleformers.nn.attention.interface import ALL_ATTENTION_FUNCTIONS
from paddleformers.transformers.qwen3.modeling import Qwen3RotaryEmbedding

__all__ = ["head_norm", "CacheContinuingPositionsMixin", "cache_continuation_positions", "single_device_linear", "attention_core",
           "update_shared_kv_cache", "RoPETables", "LayerwiseRotaryEmbedding", "with_sink_column"]


def head_norm(layer, name: str, x):
    """The layer's per-head norm `name` ("q_norm", "k_norm") applied to x (..., d), or x itself where the base's
    attention has none (Llama, Qwen2: its spec declares no such tensor)."""
    norm = getattr(layer, name, None)
    return x if norm is None else norm(x)


def single_device_linear(in_features: int, out_features: int, bias: bool) -> nn.Linear:
    """A plain Linear ([in, out] weight). The families build single-device layers only; tensor parallelism is applied
    from outside by paddle_vha.parallel, so no fleet parallel-layer type is named here."""
    return nn.Linear(in_features, out_features, bias_attr=bias)


def attention_core(layer, q, k, v, attention_mask=None, attn_mask_startend_row_indices=None, sinks=None):
    """Softmax attention through the backend the config names (`eager`, `sdpa`, ...), as Qwen3Attention.forward calls
    it. q (B, H, S, d); k, v (B, H_kv, T, d), read in groups of layer.num_key_value_groups; attention_mask
    (B, 1, S, >= T), whose last T columns are the keys'. sinks (H,) or None: a learned sink logit per query head
    (with_sink_column). Returns the output (B, S, H*d) and the weights (or None)."""
    attention_interface = ALL_ATTENTION_FUNCTIONS[layer.config._attn_implementation]
    if attention_mask is not None and attention_mask.shape[-1] > k.shape[-2]:
        # Deviation from Qwen3Attention: a sliding-window cache layer returns only its last keys while PaddleFormers
        # builds the mask over the whole past and the eager backend keeps its *first* columns; keep the last ones.
        attention_mask = attention_mask[..., -k.shape[-2]:]
    S, T = q.shape[-2], k.shape[-2]
    if attention_mask is None and attn_mask_startend_row_indices is None and 1 < S < T:
        # Deviation from Qwen3Attention: PaddleFormers passes no mask to the sdpa backend, which then takes
        # is_causal, aligned at the first key: wrong for a chunk of queries after a filled cache; align at the last.
        attention_mask = causal_mask(S, T, q.dtype)
    if sinks is not None:
        if attn_mask_startend_row_indices is not None:
            raise ValueError("attention sinks need a dense attention mask; attn_mask_startend_row_indices (FlashMask "
                             "rows) is not supported with window_attention_sinks")
        k, v, attention_mask = with_sink_column(q, k, v, attention_mask, sinks)
    out, weights = attention_interface(
        layer,
        query=q,
        key=k,
        value=v,
        attention_mask=attention_mask,
        attn_mask_startend_row_indices=attn_mask_startend_row_indices,
        dropout=0.0 if not layer.training else layer.attention_dropout,
        scaling=layer.scaling,
    )
    if sinks is not None and weights is not None:
        weights = weights[..., :-1]  # the sink's column holds no key
    return out, weights


def causal_mask(S: int, T: int, dtype):
    """(1, 1, S, T) additive causal mask for S queries that are the last S of T positions: 0 where seen, -inf not."""
    seen = paddle.arange(T).unsqueeze(0) <= paddle.arange(T - S, T).unsqueeze(1)  # (S, T)
    zero, hidden = paddle.zeros([1], dtype), paddle.full([1], float("-inf"), dtype)
    return paddle.where(seen, zero, hidden).unsqueeze(0).unsqueeze(0)  # (1, 1, S, T)


def with_sink_column(q, k, v, attention_mask, sinks):
    """Attention sinks as one more key column, exact on every backend (none of PaddleFormers' CPU backends takes a
    sink): a key and a value of zeros (score q . 0 = 0, no value) whose additive mask entry is the head's sink logit
    s_h, so the softmax denominator gains exp(s_h) and the output nothing; gradients reach s_h through the mask.

    q (B, H, S, d); k, v (B, H_kv, T, d); attention_mask (B, 1 or H, S, T) additive or boolean (True = seen), or None
    (causal, the last S of the T positions are the queries). Returns k, v (B, H_kv, T + 1, d) and the mask
    (B, H, S, T + 1)."""
    B, H, S, _ = q.shape
    T = k.shape[-2]
    zero = paddle.zeros([k.shape[0], k.shape[1], 1, k.shape[3]], dtype=k.dtype)
    k, v = paddle.concat([k, zero], axis=2), paddle.concat([v, zero.astype(v.dtype)], axis=2)  # (B, H_kv, T+1, d)
    if attention_mask is None:
        attention_mask = causal_mask(S, T, q.dtype)
    if attention_mask.dtype == paddle.bool:
        attention_mask = paddle.where(attention_mask, paddle.zeros([1], q.dtype), paddle.full([1], float("-inf"), q.dtype))
    mask = attention_mask.astype(q.dtype).expand([B, H, S, T])
    sink = sinks.astype(q.dtype).reshape([1, H, 1, 1]).expand([B, H, S, 1])  # (B, H, S, 1)
    return k, v, paddle.concat([mask, sink], axis=-1)  # (B, H, S, T+1)


def update_shared_kv_cache(cache, s, layer_idx: int):
    """A shared K = V tensor s (B, H_kv, S, d) through a PaddleFormers cache: stored once (the cache's value slot gets
    a zero-width tensor, so it holds no bytes), the whole cached tensor (B, H_kv, T, d) returned. Sliding-window cache
    layers trim it as they trim keys."""
    keys, _ = cache.update(s, s[..., :0], layer_idx)
    return keys


class RoPETables(tuple):
    """(cos, sin) at the model's head width and RoPE base, as Qwen3 passes position_embeddings to every layer, plus the
    tables of the other (head_dim, rope_theta) some layers use (sliding-window layers with their own sizes)."""

    def __new__(cls, cos, sin, others):
        tables = super().__new__(cls, (cos, sin))
        tables.others = others
        return tables

    def for_layer(self, head_dim: int, rope_theta: float):
        return self.others.get((head_dim, float(rope_theta)), (self[0], self[1]))


class LayerwiseRotaryEmbedding(nn.Layer):
    """Qwen3RotaryEmbedding for the model's head width, and one more per other (head_dim, rope_theta) in `others`;
    returns RoPETables."""

    def __init__(self, config, others):
        super().__init__()
        self.main = Qwen3RotaryEmbedding(config=config)
        self.others = {}
        for i, (head_dim, theta) in enumerate(sorted(set(others))):
            cfg = copy.copy(config)
            cfg.head_dim, cfg.rope_theta = head_dim, theta
            cfg.rope_parameters = {**(getattr(config, "rope_parameters", None) or {}), "rope_theta": theta}
            rotary = Qwen3RotaryEmbedding(config=cfg)
            self.add_sublayer(f"other_{i}", rotary)
            self.others[(head_dim, float(theta))] = rotary

    def forward(self, x, position_ids):
        cos, sin = self.main(x, position_ids)
        return RoPETables(cos, sin, {key: rotary(x, position_ids) for key, rotary in self.others.items()})


def cache_continuation_positions(past_key_values, input_ids=None, inputs_embeds=None):
    """Positions (B, S) that continue a filled cache, or None when there is no filled cache.

    Fix of a parent quirk: Qwen3Model numbers positions from 0 even when a filled cache is passed, which rotates
    new tokens as if they were at the start.
    """
    if past_key_values is None or past_key_values.get_seq_length() == 0:
        return None
    batch, seq = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
    start = past_key_values.get_seq_length()
    return paddle.arange(start, start + seq, dtype="int64").expand([batch, seq])


class CacheContinuingPositionsMixin:
    """Put before Qwen3Model in a backbone's bases: without position_ids, positions continue a filled cache
    (cache_continuation_positions) instead of restarting at 0."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, **kwargs):
        if position_ids is None:
            position_ids = cache_continuation_positions(past_key_values, input_ids, inputs_embeds)
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=past_key_values, inputs_embeds=inputs_embeds, **kwargs)
