"""A decoder (any base: Qwen3, Llama, Qwen2) with an explicit KV-cache interface, written for static-graph export from
the library's math.

Same function as the family's PaddleFormers model (checked by the export's self-validation), with the cache passed
in and out as tensors, named as onnxruntime-genai / Optimum expect:

    inputs : input_ids (B, S) int64, attention_mask (B, P+S) int64, position_ids (B, S) int64,
             past_key_values.{i}.key / .value (B, heads_i, P, width_i)   (.key only for a shared-KV layer)
    outputs: logits (B, S, V), present.{i}.key / .value (B, heads_i, P+S, width_i)

cache_io="buffer" (tools/export_onnx.py --cache buffer) is the in-place flavour: past_key_values.{i}.* are the
runtime's cache buffers (B, heads_i, capacity, width_i), of which attention_mask (B, capacity + S) marks the filled
slots, and the outputs are only the new positions, new.{i}.key / .value (B, heads_i, S, width_i), which the runtime
writes into its buffers (paddle_vha/serve/session.py). Attention reads each buffer once and nothing copies it: the
standard interface's past -> present concatenation is a third of a long-context step's bytes.

A sliding-window layer (Qwen3's layer_types + sliding_window W) sees the W positions ending at each query's own, and
its cache holds only the last W - 1 positions (all a later query can see): its past is (B, heads_i, min(P, W-1),
width_i) and its present the last W - 1 positions of past + new, so its bytes stop growing past the window. Its keys
are the last columns of attention_mask.

Each layer is the stock Qwen3 layer (paddle_vha/qwen3/functional.py) with its family's export form (asked from the
registry), over the tensors its base declares: the per-head q/k RMSNorm where the checkpoint holds q_norm / k_norm
(Qwen3; not Llama or Qwen2), each projection's bias where it holds one (Qwen2: q/k/v; Qwen3 and Llama: all four with
attention_bias): a stock GQA layer caches its KV heads as they are (paddle_vha/qwen3/serving.py); a Qwen3-MEA layer caches
one wide head and carries its HLC coefficients in the queries and outputs (paddle_vha/mea/serving.py); a shared-KV
layer caches one tensor, both keys and values, and rotates its output back (paddle_vha/shared_kv/serving.py).
Attention runs in the grouped layout (B, H_kv, G*S, w), so each cached head is read once per step, not once per query
head.
"""
from __future__ import annotations

import math
from typing import List, Mapping

import numpy as np
import paddle
from paddle import nn

from ..qwen3.functional import (apply_rope, grouped_attention, grouped_attention_past_new, rms_norm, rope_tables,
                                swiglu_mlp)
from .plan import CACHE_IO, cache_windows, io_names  # noqa: F401 - re-exported: the graph's names and windows

__all__ = ["KVDecoder", "io_names", "cache_windows", "CACHE_IO"]

NEG_INF = -1e9  # additive mask value; finite so fully-masked (padding) rows stay NaN-free
_LAYER_WEIGHTS = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                  "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
_IF_PRESENT = ("self_attn.q_norm.weight", "self_attn.k_norm.weight", "self_attn.q_proj.bias",
               "self_attn.o_proj.bias")  # what one base declares and another does not


class KVDecoder(nn.Layer):
    """The family's causal LM over on-disk (HF layout) tensors, with tensor KV-cache I/O (see the module docstring),
    for the checkpoint and cache interface of a serving plan (paddle_vha/export/plan.py)."""

    def __init__(self, plan, tensors: Mapping[str, np.ndarray], dtype: str = "float32"):
        super().__init__()
        cfg, cache_io = plan.config, plan.cache_io
        assert cache_io in CACHE_IO, f"cache_io must be one of {CACHE_IO}, got {cache_io!r}"
        self.cache_io = cache_io
        self.dtype_name = dtype
        self.num_layers = cfg.num_hidden_layers
        self.h_q, self.d = cfg.num_attention_heads, cfg.head_dim
        self.eps = float(cfg.rms_norm_eps)
        self.rope = plan.rope  # the config's RoPE scaling (paddle_vha/qwen3/rope_scaling.py)
        self.inv_freq = self._const(self.rope.inv_freq.astype(np.float32).reshape(1, 1, -1))  # (1, 1, d/2)
        if self.rope.dynamic:  # the exponents i/d of dynamic NTK's base, (1, 1, d/2)
            self.rope_exponents = self._const((np.arange(0, self.d, 2, dtype=np.float64) / self.d).reshape(1, 1, -1))
        self.scale = self.d ** -0.5

        def w(name, transpose=False):
            a = tensors[name]
            if transpose:
                a = np.ascontiguousarray(a.T)  # (in, out); the (out, in) original is freed here
            return self._const(a, source=name)

        self.weight_sources = {}  # the program's parameter name -> the checkpoint tensor it holds (quantization
        # reads roles from it: paddle_vha/export/quant_plan.py)
        self.embed = w("model.embed_tokens.weight")  # (V, h)
        self.final_norm = w("model.norm.weight")
        # tied embeddings: the LM head multiplies by the embedding itself, stored once (None here)
        self.lm_head = w("lm_head.weight", True) if "lm_head.weight" in tensors else None  # (h, V)
        self.windows = list(plan.cache_windows)
        assert cache_io == "concat" or not any(self.windows), "the buffer flavour has no sliding-window layers"
        self.layer_weights: List[dict] = []
        self.forms = []
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            form = plan.export_form(i, tensors, self._const)
            names = _LAYER_WEIGHTS + tuple(f"self_attn.{n}.weight" for n in form.kv_projections)
            names += tuple(n for n in _IF_PRESENT + tuple(f"self_attn.{k}.bias" for k in form.kv_projections)
                           if p + n in tensors)
            self.layer_weights.append({k: w(p + k, transpose=k.endswith("proj.weight")) for k in names})
            self.forms.append(form)

    def _const(self, array, source=None):
        """A frozen parameter holding `array`, copied straight into it (no passing paddle copy: at real size the
        export builds one of these per checkpoint tensor and holds only the parameters)."""
        a = np.ascontiguousarray(np.asarray(array, np.float32))
        p = self.create_parameter(list(a.shape), dtype=self.dtype_name,
                                  default_initializer=nn.initializer.Constant(0.0))
        p.set_value(a if self.dtype_name == "float32" else paddle.to_tensor(a).astype(self.dtype_name))
        del a
        p.stop_gradient = True
        self.add_parameter(f"w{len(self._parameters)}", p)  # registered, so jit.save stores it
        if source is not None:
            self.weight_sources[p.name] = source
        return p

    def _lin(self, x, lw, name):
        y = paddle.matmul(x, lw[f"{name}.weight"])
        return y + lw[f"{name}.bias"] if f"{name}.bias" in lw else y

    def _head_norm(self, x, lw, name):
        """The per-head RMSNorm `name` ("self_attn.q_norm") over x (..., d), or x where the layer has none."""
        w = lw.get(f"{name}.weight")
        return x if w is None else rms_norm(x, w, self.eps)

    def forward(self, input_ids, attention_mask, position_ids, past_key_values):
        past = list(past_key_values)  # the cache inputs in order: key_0, value_0, key_1, ... (key_i only if shared)
        x = paddle.nn.functional.embedding(input_ids, self.embed)  # (B, S, h)
        cos, sin = rope_tables(position_ids, self._inv_freq(position_ids), x.dtype)  # (B, S, 1, d), computed once
        if self.rope.attention_scaling != 1.0:  # YaRN's attention factor, on cos and sin as Qwen3RotaryEmbedding
            cos, sin = cos * self.rope.attention_scaling, sin * self.rope.attention_scaling
        base_masks, total = self._base_masks(input_ids, attention_mask)
        masks = {}  # rows of the grouped layout are (query head in group, position): tile per group size, once
        presents, capacity = [], None
        for i, (lw, form) in enumerate(zip(self.layer_weights, self.forms)):
            hdn = rms_norm(x, lw["input_layernorm.weight"], self.eps)
            q, new = self._queries_and_new(hdn, lw, form, cos, sin)
            cached = [past.pop(0) for _ in new]  # this layer's cache inputs, (B, heads, P or capacity, width) each
            if self.cache_io == "buffer":  # attend to the buffers and the new positions; output only the new ones
                y, capacity = self._attend_buffers(q, cached, new, form, base_masks, masks, capacity)
                presents += new
            else:
                y, kept = self._attend_concat(q, cached, new, form, self.windows[i], base_masks, masks, total)
                presents += kept
            y = form.output(y.transpose([0, 2, 1, 3]), cos, sin)  # (B, S, H, d)
            x = x + self._lin(y.reshape([0, 0, self.h_q * self.d]), lw, "self_attn.o_proj")
            hdn = rms_norm(x, lw["post_attention_layernorm.weight"], self.eps)
            x = x + swiglu_mlp(hdn, lw["mlp.gate_proj.weight"], lw["mlp.up_proj.weight"], lw["mlp.down_proj.weight"])
        x = rms_norm(x, self.final_norm, self.eps)
        if self.lm_head is None:
            logits = paddle.matmul(x, self.embed, transpose_y=True)  # (B, S, V), the tied embedding
        else:
            logits = paddle.matmul(x, self.lm_head)  # (B, S, V)
        return tuple([logits] + presents)

    def _inv_freq(self, position_ids):
        """The inverse frequencies (1, 1, d/2) of this call: the config's, or for dynamic NTK, once the call's largest
        position passes max_position_embeddings M, those of the base theta * (f s / M - (f - 1))^(d / (d - 2)),
        s = largest position + 1 (paddle_vha/qwen3/rope_scaling.py)."""
        r = self.rope
        if not r.dynamic:
            return self.inv_freq
        s = paddle.max(position_ids).astype("float32") + 1.0  # (), the call's sequence length
        ratio = paddle.maximum(s, paddle.full([], float(r.max_position), "float32")) * (r.factor / r.max_position) \
            - (r.factor - 1.0)
        log_base = math.log(r.theta) + (r.dim / (r.dim - 2)) * paddle.log(ratio)  # ()
        scaled = paddle.exp(-self.rope_exponents * log_base)  # (1, 1, d/2)
        return paddle.where(s > float(r.max_position), scaled, self.inv_freq)

    def _base_masks(self, input_ids, attention_mask):
        """({window or None: additive mask (B, S, T)}, T): causal over absolute positions and the caller's padding
        mask, and per sliding window W the keys at or before q - W hidden too."""
        seq = paddle.shape(input_ids)[1]
        total = paddle.shape(attention_mask)[1]
        q_pos = paddle.arange(seq, dtype="int64") + (total - seq)  # (S,)
        k_pos = paddle.arange(total, dtype="int64")  # (T,)
        allowed = (k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)).unsqueeze(0) & (attention_mask.unsqueeze(1) > 0)  # (B, S, T)
        zero, neg = paddle.zeros([1], "float32"), paddle.full([1], NEG_INF, "float32")
        base_masks = {None: paddle.where(allowed, zero, neg)}  # (B, S, T) additive, per window (None: full)
        for w in set(self.windows) - {None}:  # a window layer also hides keys at or before q - W
            in_window = (k_pos.unsqueeze(0) > q_pos.unsqueeze(1) - w).unsqueeze(0)  # (1, S, T)
            base_masks[w] = paddle.where(allowed & in_window, zero, neg)
        return base_masks, total

    def _queries_and_new(self, hdn, lw, form, cos, sin):
        """One layer's queries (B, H, S, width) and its new positions in the cached layout, (B, heads, S, width)
        each."""
        h_q, d = self.h_q, self.d
        q = self._lin(hdn, lw, "self_attn.q_proj").reshape([0, 0, h_q, d])  # (B, S, H, d)
        kv = [self._lin(hdn, lw, f"self_attn.{n}").reshape([0, 0, form.kv_heads, d])  # (B, S, n_k, d) each
              for n in form.kv_projections]
        q = apply_rope(self._head_norm(q, lw, "self_attn.q_norm"), cos, sin)
        k = apply_rope(self._head_norm(kv[0], lw, "self_attn.k_norm"), cos, sin)
        new = form.to_cache(k, kv[1] if len(kv) > 1 else None)  # (B, heads, S, width) each: the cached layout
        return form.queries(q.transpose([0, 2, 1, 3])), new  # (B, H, S, width)

    def _attend_buffers(self, q, buffers, new, form, base_masks, masks, capacity):
        """The buffer flavour: attention over the runtime's buffers (B, heads, capacity, width) and the new positions,
        no copy of either; ((B, H, S, width), the buffers' capacity: read from the first layer's, the same for all)."""
        g = self.h_q // form.cache_shape[0]  # query heads per cached head
        if g not in masks:  # the full-attention mask (key None): the buffer's columns, then the new ones
            masks[g] = paddle.tile(base_masks[None].unsqueeze(1), [1, 1, g, 1])  # (B, 1, G*S, T + S)
        if capacity is None:
            capacity = paddle.shape(buffers[0])[2]  # every buffer has the same capacity
        (k_past, v_past), (k_new, v_new) = form.attention_kv(buffers), form.attention_kv(new)
        return grouped_attention_past_new(q, k_past, v_past, k_new, v_new, masks[g], self.scale, capacity), capacity

    def _attend_concat(self, q, past, new, form, window, base_masks, masks, total):
        """The standard flavour: attention over past + new; ((B, H, S, width), the present tensors to output: past +
        new, or for a sliding-window layer its last W - 1 positions)."""
        g = self.h_q // form.cache_shape[0]  # query heads per cached head
        cached = [paddle.concat([p, t], axis=2) for p, t in zip(past, new)]  # (B, heads, T_i, width): past + new
        if (g, window) not in masks:
            m = base_masks[window]
            if window is not None:  # this layer's keys are the last T_i positions: the mask's last T_i columns
                m = m[:, :, total - paddle.shape(cached[0])[2]:]  # (B, S, T_i)
            masks[(g, window)] = paddle.tile(m.unsqueeze(1), [1, 1, g, 1])  # (B, 1, G*S, T_i), row gi*S + s
        if window is None:
            kept = cached
        else:  # keep what a later query can still see: the last W - 1 positions
            kept = [t[:, :, -(window - 1):] if window > 1 else t[:, :, :0] for t in cached]
        k, v = form.attention_kv(cached)
        sinks = getattr(form, "sinks", None)  # a window layer's sink logits (H,), Qwen3 with sinks; else None
        return grouped_attention(q, k, v, masks[(g, window)], self.scale, sinks), kept  # scale 1/sqrt(d)
