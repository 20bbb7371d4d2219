"""MEA attention (HLC over K and V, head norm) over a base's attention class: `MEAAttention` and `StockKVAttention`,
put before the base's own (Qwen3's here; Llama's and Qwen2's in paddle_vha/llama/, paddle_vha/qwen2/).

Single-device math (docs/mea.md), with n_p physical KV heads, n_v virtual KV heads, H query heads:

    Q    = RoPE(q_norm(x W_Q))                                   (B, H, S, d)       as Qwen3 (no q/k norm: Llama,
                                                                                    Qwen2)
    K_p  = x W_K,  V_p = x W_V                                    (B, n_p, S, d)     what the cache stores
    K_v  = HLC(K_p, mea_k_lc),  V_v = HLC(V_p, mea_v_lc)          (B, n_v, T, d)     composed when read
           HLC(t, lc)[j] = sum_p t[p] * lc[p, j],  lc: [n_p, n_v]
    k_norm + RoPE: on the virtual heads after HLC ('after_hlc', the cache holds K_p before norm and RoPE)
                   or on the physical heads before it ('before_hlc', the cache holds normed, rotated K_p)
    Y    = Attention(Q, K_v, V_v)       query head i reads virtual head i // (H / n_v)   (stock GQA kernel)
    Y    = RMSNorm_head(Y) * mea_norm   per head over d        only with mea_group_norm
    out  = Y W_O

Every deviation from PaddleFormers' attention is marked `# MEA:`.
"""
from __future__ import annotations

from typing import Optional, Tuple

import paddle
from paddle import nn
from paddleformers.transformers.qwen3.modeling import (
    Qwen3Attention,
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
    rotate_half,
)

from ..modeling.parameters import build_declared
from ..qwen3.modeling import attention_core, head_norm
from .config import MEAConfigError, Qwen3MEAConfig
from .functional import head_rms_norm, hlc, multiquery_attention
from .spec import MEA_LAYER, MEA_STOCK_LAYER

__all__ = ["MEAAttention", "StockKVAttention", "Qwen3MEAAttention", "Qwen3StockKVAttention", "use_multiquery_form"]


class StockKVAttention:
    """A base's stock attention in a layer that MEA leaves alone, with mea_stock_kv_heads KV heads (its original count).
    Put before the base's attention class; `layer_spec` is the variant's stock layer over that base."""

    layer_spec = MEA_STOCK_LAYER

    def __init__(self, config: Qwen3MEAConfig, layer_idx: int = 0):
        super().__init__(config, layer_idx)
        n_s = config.mea_stock_kv_heads
        if n_s != config.num_key_value_heads:  # MEA: the parent sized K/V from num_key_value_heads (n_p)
            self.num_key_value_heads = n_s
            self.num_key_value_groups = config.num_attention_heads // n_s
            self.gqa_or_mqa = config.num_attention_heads != n_s
        build_declared(self, self.layer_spec, config, layer_idx, "self_attn.")  # k_proj / v_proj of n_s heads


class MEAAttention:
    """A base's attention whose n_v KV heads are virtual: HLC compositions of the n_p cached physical heads. Put before
    the base's attention class; `layer_spec` is the variant's MEA layer over that base, `rotary_class` the base's
    rotary embedding (the angles of cached keys, 'after_hlc')."""

    layer_spec = MEA_LAYER
    rotary_class = Qwen3RotaryEmbedding

    def __init__(self, config: Qwen3MEAConfig, layer_idx: int = 0):
        config.check_runtime_support()
        super().__init__(config, layer_idx)
        n_p, n_v = config.num_key_value_heads, config.mea_kv_heads
        self.num_physical_heads = n_p  # what k_proj / v_proj emit and the cache stores
        self.num_virtual_heads = n_v
        self.k_norm_after_hlc = config.mea_k_norm_position == "after_hlc"
        # MEA: the attention core sees n_v (virtual) KV heads, so GQA groups are H / n_v.
        self.num_key_value_groups = config.num_attention_heads // n_v
        self.gqa_or_mqa = config.num_attention_heads != n_v
        # MEA: the tensors paddle_vha/mea/spec.py declares: the HLC coefficients mea_k_lc, mea_v_lc [n_p, n_v] (virtual
        # head j starts as physical head j % n_p plus noise) and, with mea_group_norm, the head norm's weight [H*d].
        build_declared(self, self.layer_spec, config, layer_idx, "self_attn.")
        if self.k_norm_after_hlc:
            # MEA: k_norm/RoPE run on cached keys too, so the layer needs angles for every cached position.
            # Held outside the sublayer tree: it has no parameters and nothing to save.
            self._rotary = (self.rotary_class(config),)
        self.serving_form = False  # MEA: set by use_multiquery_form
        self.hlc_columns = None  # MEA: (a, b) under tensor parallelism with replicated virtual heads (mea/tp_plan.py)

    def hlc_coefficients(self):
        """(mea_k_lc, mea_v_lc) [n_p, n_v] as this layer reads them: whole, or virtual heads [a, b) of them (a
        differentiable column slice) when tensor parallelism replicates the HLC matrices."""
        if self.hlc_columns is None:
            return self.mea_k_lc, self.mea_v_lc
        a, b = self.hlc_columns
        return self.mea_k_lc[:, a:b], self.mea_v_lc[:, a:b]

    def compose_kv(self, k_p, v_p, cos_keys=None, sin_keys=None):
        """Virtual heads from the physical cache: (B, n_p, T, d) -> (B, n_v, T, d) each."""
        k_lc, v_lc = self.hlc_coefficients()
        k_v, v_v = hlc(k_p, k_lc), hlc(v_p, v_lc)
        if self.k_norm_after_hlc:
            k_v = head_norm(self, "k_norm", k_v)  # RMSNorm over d, the last axis: no transpose needed
            # RoPE with cos/sin expanded over the heads (broadcasting them is ~3x slower on CPU)
            shape = k_v.shape
            cos_k = cos_keys.unsqueeze(1).expand(shape).astype(k_v.dtype)
            sin_k = sin_keys.unsqueeze(1).expand(shape).astype(k_v.dtype)
            k_v = k_v * cos_k + rotate_half(k_v) * sin_k
        return k_v, v_v

    def _key_angles(self, hidden_states, cos, sin, total_len: int):
        """cos/sin for all T keys: the cached ones sit at positions 0..T-S-1 (the model's default numbering)."""
        S = cos.shape[1]
        if total_len == S:
            return cos, sin
        B = cos.shape[0]
        prefix = paddle.arange(total_len - S, dtype="int64").expand([B, total_len - S])
        cos_p, sin_p = self._rotary[0](hidden_states, prefix)
        return paddle.concat([cos_p, cos], axis=1), paddle.concat([sin_p, sin], axis=1)

    def forward(
        self,
        hidden_states,
        position_embeddings: Optional[Tuple[paddle.Tensor, paddle.Tensor]] = None,
        attention_mask: Optional[paddle.Tensor] = None,
        past_key_values=None,
        use_cache: bool = False,
        attn_mask_startend_row_indices: Optional[paddle.Tensor] = None,
        batch_size: Optional[int] = None,
        **kwargs,
    ):
        n_p, d = self.num_physical_heads, self.head_dim
        q = self.q_proj(hidden_states).reshape([0, 0, self.num_heads, d])
        k_p = self.k_proj(hidden_states).reshape([0, 0, n_p, d])  # MEA: n_p physical heads
        v_p = self.v_proj(hidden_states).reshape([0, 0, n_p, d]).transpose([0, 2, 1, 3])  # (B, n_p, S, d)
        cos, sin = position_embeddings
        q = head_norm(self, "q_norm", q).transpose([0, 2, 1, 3])  # (B, H, S, d)
        if self.k_norm_after_hlc:
            # MEA: K_p stays before norm and RoPE; both act on the virtual heads after HLC.
            k_p = k_p.transpose([0, 2, 1, 3])
            q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        else:
            q, k_p = apply_rotary_pos_emb(q, head_norm(self, "k_norm", k_p).transpose([0, 2, 1, 3]), cos, sin)

        if past_key_values is not None:  # MEA: the cache stores the n_p physical heads only
            k_p, v_p = past_key_values.update(k_p, v_p, self.layer_idx)

        if self.serving_form:
            k_lc, v_lc = self.hlc_coefficients()
            attn_output = multiquery_attention(q, k_p, v_p, k_lc, v_lc, self.num_key_value_groups, attention_mask)
            attn_weights = None
        else:
            cos_k, sin_k = self._key_angles(hidden_states, cos, sin, k_p.shape[2]) if self.k_norm_after_hlc else (None, None)
            k_v, v_v = self.compose_kv(k_p, v_p, cos_k, sin_k)  # MEA: virtual heads composed when read
            attn_output, attn_weights = attention_core(self, q, k_v, v_v, attention_mask,
                                                       attn_mask_startend_row_indices)  # (B, S, H * d)

        if self.config.mea_group_norm:  # MEA: head-level norm before o_proj
            y = head_rms_norm(attn_output.reshape([0, 0, self.num_heads, d]), self.mea_norm.weight,
                              self.config.rms_norm_eps)
            attn_output = y.flatten(2)
        return self.o_proj(attn_output), attn_weights


class Qwen3StockKVAttention(StockKVAttention, Qwen3Attention):
    """Stock Qwen3 attention with its own KV heads in a Qwen3-MEA model."""


class Qwen3MEAAttention(MEAAttention, Qwen3Attention):
    """Qwen3 attention with MEA (MEAAttention over PaddleFormers' Qwen3Attention)."""


def use_multiquery_form(model, enabled: bool = True):
    """Switch every MEA layer of `model` (an MEA model or layer) to the multi-query serving form (or back)."""
    layers = [m for m in model.sublayers(include_self=True) if isinstance(m, MEAAttention)]
    if enabled:
        bad = [m.layer_idx for m in layers if m.k_norm_after_hlc]
        if bad:
            raise MEAConfigError(
                f"the multi-query serving form needs mea_k_norm_position='before_hlc' (k_norm on the cached physical "
                f"heads); MEA layers {bad} normalise after HLC")
    for m in layers:
        m.serving_form = enabled
    return model
