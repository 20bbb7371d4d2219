"""VHA attention (Premix + Postmix) over a base's attention class: `VHAAttention`, put before the base's own
(Qwen3VHAAttention over Qwen3Attention here; Llama's and Qwen2's in paddle_vha/llama/, paddle_vha/qwen2/).

Single-device math, read top to bottom as the method's equations (docs/method.md):

    Q_p  = x W_Q                          (B, S, H_p, r)     physical query heads
    Q_v  = Q_p[i] W_premix[g]             (B, S, H_v, d)     virtual head j = g*H_p + i (group-major)
    Q_v  = RoPE(q_norm(Q_v)),  K = RoPE(k_norm(x W_K)),  V = x W_V     (no q/k norm over Llama / Qwen2)
    Y    = Attention(Q_v, K, V)           (B, S, H_v, d)     head j reads KV head j // H_p (stock GQA); on a window
                                                             layer with sinks, softmax_t(a_jt) -> e^a_jt / (sum e^a + e^s_j)
    Y'   = M Y along heads, M = I + V_pm U_pm^T              Postmix (low-rank or dense form, same result)
    Y''  = Y' * sigmoid(x W_gate)                            only with vha_gated_attention
    out  = Y'' W_O

Shared KV (vha_shared_kv): one projection S = RoPE(k_norm(x W_S)) (B, S, H_kv, d) is both K and V, the cache holds
it once, and the attention output is rotated back to the query's position before Postmix:
    Y    = R(-theta s) Attention(Q_v, S, S)                  (on the head width d, per query position s)

Without Premix (vha_premix=false, the research fork's kv_postmix_only): q_proj emits the H_v heads of width d
themselves (H_p = H_v, r = d), Q_v = Q_p, and the layer is stock GQA attention followed by Postmix.

Every deviation from PaddleFormers' attention is marked `# VHA:`. Biases are the base's (Qwen2: q/k/v; Qwen3 and Llama:
all four with attention_bias); Premix maps q_proj's whole output, its bias included.
"""
from __future__ import annotations

from typing import Optional, Tuple

import paddle
from paddle import nn
from paddle.distributed.fleet.recompute.recompute import recompute
from paddleformers.transformers.qwen3.modeling import Qwen3Attention, apply_rotary_pos_emb

from ..qwen3.functional import inverse_rope
from ..modeling.parameters import build_declared
from ..qwen3.modeling import RoPETables, attention_core, head_norm, update_shared_kv_cache
from . import postmix_form
from .config import Qwen3VHAConfig, VHAConfigError
from .spec import VHA_LAYER
from ..kernels.dispatch import should_use_fused
from ..kernels.prologue import fused_prologue

__all__ = ["VHAAttention", "Qwen3VHAAttention", "postmix", "postmix_dense", "premix"]


def premix(q_phys: paddle.Tensor, premix_weight: paddle.Tensor) -> paddle.Tensor:
    """(B, S, H_p, r) x (H_kv, r, d) -> (B, S, H_v, d), virtual head j = g*H_p + i is Q_i @ W_premix[g]."""
    h_kv, r, d = premix_weight.shape
    h_p = q_phys.shape[2]
    # (r, H_kv*d): all groups in one GEMM. A concat of the groups, not transpose([1, 0, 2]).reshape: the transpose's
    # backward leaves Premix a strided (non-contiguous) gradient, which Paddle's collectives refuse ("The tensor must
    # be contiguous": the sharding optimizer's gradient reduce, docs/training.md)
    w = paddle.concat([premix_weight[g] for g in range(h_kv)], axis=1)
    q = paddle.matmul(q_phys, w)  # (B, S, H_p, H_kv*d)
    q = q.reshape([0, 0, h_p, h_kv, d]).transpose([0, 1, 3, 2, 4])  # (B, S, H_kv, H_p, d)
    return q.flatten(2, 3)  # (B, S, H_v, d), group-major


def postmix(y: paddle.Tensor, u: paddle.Tensor, v: paddle.Tensor, reduce=None) -> paddle.Tensor:
    """Y'_j = Y_j + sum_k (V U^T)[j, k] Y_k along the head axis of y (B, S, H_v, d): the low-rank form, two GEMMs.

    reduce: applied to Z = U^T Y before it is mixed back (tensor parallelism: each rank holds rows of U, V for its
    heads, and the sum of the ranks' Z, R x d per token, is the only exchange)."""
    z = paddle.matmul(u, y, transpose_x=True)  # (R, H_v) @ (B, S, H_v, d) -> (B, S, R, d)
    if reduce is not None:
        z = reduce(z)
    return y + paddle.matmul(v, z)  # (H_v, R) @ (B, S, R, d) -> (B, S, H_v, d)


def postmix_dense(y: paddle.Tensor, u: paddle.Tensor, v: paddle.Tensor) -> paddle.Tensor:
    """The same Y' as `postmix`, as one GEMM: M = I + V U^T (H_v x H_v, built once per call), then M Y along heads.
    Needs every head's Y, so it runs on one device only (paddle_vha/vha/postmix_form.py)."""
    m = paddle.matmul(v, u, transpose_y=True) + paddle.eye(v.shape[0], dtype=v.dtype)  # (H_v, H_v)
    return paddle.matmul(m, y)  # (H_v, H_v) @ (B, S, H_v, d) -> (B, S, H_v, d)


class VHAAttention:
    """A base's attention whose H_v query heads are virtual: H_p physical heads times H_kv Premix maps. Put before the
    base's attention class; `layer_spec` is the variant's layer over that base (paddle_vha/vha/spec.py vha_layer)."""

    layer_spec = VHA_LAYER

    def __init__(self, config: Qwen3VHAConfig, layer_idx: int = 0):
        config.check_runtime_support()
        self.dims = config.layer_dims(layer_idx)  # VHA: a sliding-window layer may have its own sizes
        full_config, config = config, config.for_layer(layer_idx)
        super().__init__(config, layer_idx)
        self.num_physical_heads = config.num_physical_heads  # H_p
        self.q_head_dim = config.vha_q_head_dim  # r
        self.postmix_rank = config.vha_postmix_rank  # R
        self.shared_kv = config.vha_shared_kv
        self.has_premix = config.vha_premix  # False: q_proj's heads are the virtual heads
        # VHA: the tensors paddle_vha/vha/spec.py declares: q_proj emits H_p physical heads of width r; Premix, one
        # (r, d) map per KV group; Postmix U, V over the H_v heads (V = 0: the identity at step 0); one shared K = V
        # projection in place of k_proj and v_proj (vha_shared_kv); the sigmoid output gate (vha_gated_attention).
        build_declared(self, self.layer_spec, full_config, layer_idx, "self_attn.")
        if config.vha_fused_prologue is True and getattr(self, "q_norm", None) is None:
            raise VHAConfigError("vha_fused_prologue=true: the fused operator is Premix + q/k RMSNorm + RoPE, and this "
                                 "base's attention has no q/k norm; leave it unset (None) or false")
        # VHA: hooks for tensor parallelism (paddle_vha/vha/tp_plan.py sets them; single-device: unused).
        self.premix_groups = None  # (a, b): this rank reads Premix groups [a, b) of the whole parameter
        self.postmix_reduce = None  # applied to Postmix's Z = U^T Y (the all-reduce of the ranks' parts)
        # VHA: Postmix's form (low-rank / dense, paddle_vha/vha/postmix_form.py) and its selective recompute.
        self.postmix_form = config.vha_postmix_form  # "auto": resolved per call, by its token count
        try:
            self.recompute_postmix = postmix_form.recomputes_postmix(full_config, layer_idx)
        except ValueError as e:
            raise VHAConfigError(str(e)) from None

    def premix_weight(self) -> paddle.Tensor:
        """Premix [H_kv, r, d] as this layer reads it: the whole parameter, or groups [a, b) of it under tensor
        parallelism with replicated KV heads (a differentiable slice)."""
        if self.premix_groups is None:
            return self.vha_premix_weight
        a, b = self.premix_groups
        return self.vha_premix_weight[a:b]

    def mix_heads(self, y: paddle.Tensor) -> paddle.Tensor:
        """Postmix of y (B, S, H_v, d): the low-rank form under tensor parallelism (its R·d all-reduce), else the
        layer's form; rerun in the backward instead of keeping its intermediates when selected (recompute)."""
        u, v, reduce = self.vha_postmix_U, self.vha_postmix_V, self.postmix_reduce
        if postmix_form.resolve(self.postmix_form, y.shape[0] * y.shape[1], reduce is not None) == "dense":
            fn = lambda a: postmix_dense(a, u, v)  # noqa: E731
        else:
            fn = lambda a: postmix(a, u, v, reduce)  # noqa: E731
        if self.recompute_postmix and self.training and not y.stop_gradient:
            return recompute(fn, y)
        return fn(y)

    def prologue(
        self, q_phys: paddle.Tensor, k: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor
    ) -> Tuple[paddle.Tensor, paddle.Tensor]:
        """Premix -> q_norm / k_norm -> RoPE. In: (B, S, H_p, r), (B, S, H_kv, d). Out: (B, H_v, S, d), (B, H_kv, S, d)."""
        # VHA: one fused operator when enabled and available (paddle_vha/kernels/); the composed chain below
        # stays the reference and the fallback.
        if not self.has_premix:  # VHA: no Premix: the physical heads are the virtual heads (B, S, H_v, d)
            q = head_norm(self, "q_norm", q_phys).transpose([0, 2, 1, 3])  # (B, H_v, S, d)
            return apply_rotary_pos_emb(q, head_norm(self, "k_norm", k).transpose([0, 2, 1, 3]), cos, sin)
        w = self.premix_weight()
        normed = getattr(self, "q_norm", None) is not None  # the fused operator includes the q/k norms
        if normed and should_use_fused(getattr(self.config, "vha_fused_prologue", None), q_phys):
            return fused_prologue(q_phys, k, w, self.q_norm.weight, self.k_norm.weight, cos, sin,
                                  self.q_norm.variance_epsilon, heads_first=True)
        q = premix(q_phys, w)  # (B, S, H_v, d)
        q = head_norm(self, "q_norm", q).transpose([0, 2, 1, 3])  # (B, H_v, S, d)
        k = head_norm(self, "k_norm", k).transpose([0, 2, 1, 3])  # (B, H_kv, S, d)
        return apply_rotary_pos_emb(q, k, cos, sin)

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
        h_kv, d = self.num_key_value_heads, self.head_dim
        # VHA: physical queries of width r; K and V exactly as Qwen3 (or one shared projection).
        q_phys = self.q_proj(hidden_states).reshape([0, 0, self.num_physical_heads, self.q_head_dim])  # (B, S, H_p, r)
        k_proj = self.shared_kv_proj if self.shared_kv else self.k_proj
        key_states = k_proj(hidden_states).reshape([0, 0, h_kv, d])  # (B, S, H_kv, d)

        cos, sin = position_embeddings
        if isinstance(position_embeddings, RoPETables):  # VHA: this layer's own head width / RoPE base
            cos, sin = position_embeddings.for_layer(d, self.dims.rope_theta)
        # VHA: Premix before q_norm and RoPE, so both act on virtual heads.
        query_states, key_states = self.prologue(q_phys, key_states, cos, sin)  # (B, H_v, S, d), (B, H_kv, S, d)

        if self.shared_kv:  # VHA: the normed, rotated S is the keys and the values, cached once
            if past_key_values is not None:
                key_states = update_shared_kv_cache(past_key_values, key_states, self.layer_idx)  # (B, H_kv, T, d)
            value_states = key_states
        else:
            value_states = self.v_proj(hidden_states).reshape([0, 0, h_kv, d]).transpose([0, 2, 1, 3])  # (B, H_kv, S, d)
            if past_key_values is not None:
                key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)

        # VHA: a window layer with window_attention_sinks adds exp(s_j) to head j's softmax denominator
        attn_output, attn_weights = attention_core(self, query_states, key_states, value_states, attention_mask,
                                                   attn_mask_startend_row_indices,
                                                   getattr(self, "sinks", None))  # (B, S, H_v * d)
        y = attn_output.reshape([0, 0, self.num_heads, d])  # (B, S, H_v, d)
        if self.shared_kv:  # VHA: values were rotated with the keys: rotate the output back to the query's position
            y = inverse_rope(y, cos.unsqueeze(2).astype(y.dtype), sin.unsqueeze(2).astype(y.dtype))

        # VHA: Postmix along the head axis, then the optional gate.
        y = self.mix_heads(y)  # (B, S, H_v, d)
        y = y.flatten(2)  # (B, S, H_v * d)
        if self.config.vha_gated_attention:
            y = y * nn.functional.sigmoid(self.gate_proj(hidden_states))
        return self.o_proj(y), attn_weights


class Qwen3VHAAttention(VHAAttention, Qwen3Attention):
    """Qwen3 attention with VHA (VHAAttention over PaddleFormers' Qwen3Attention)."""
