"""A stock-Qwen3 decoder with an explicit KV-cache interface, written for static-graph export.

Same function as PaddleFormers' Qwen3ForCausalLM (checked by the export's self-validation), but with the
cache passed in and out as tensors, named as onnxruntime-genai / Optimum expect:

    inputs : input_ids (B, S) int64, attention_mask (B, P+S) int64, position_ids (B, S) int64,
             past_key_values.{i}.key / .value (B, H_kv, P, d)
    outputs: logits (B, S, V), present.{i}.key / .value (B, H_kv, P+S, d)

Attention runs in the grouped layout (B, H_kv, G*S, d) with G = H_q / H_kv query heads per KV head, so each
cached K/V head is read once per step, not once per query head (no repeat-KV copy).

Qwen3-MEA checkpoints ('before_hlc') export in the multi-query serving form (paddle_vha/mea/serving.py): an MEA
layer caches ONE wide KV head, its n_p physical heads concatenated, (B, 1, T, n_p*d); the K-side HLC coefficients
are absorbed into each query head and the V-side ones applied after attention, then the head norm. Layers MEA left
alone are stock GQA layers with their own KV head count.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
import paddle
from paddle import nn

__all__ = ["Qwen3KVDecoder", "io_names", "cache_shapes"]

NEG_INF = -1e9  # additive mask value; finite so fully-masked (padding) rows stay NaN-free


def io_names(num_layers: int):
    past = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids"] + past, ["logits"] + present


def _rms_norm(x, w, eps):
    var = paddle.mean(x * x, axis=-1, keepdim=True)
    return x * paddle.rsqrt(var + eps) * w


def _rotate_half(x, half):
    return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)


def cache_shapes(cfg):
    """Per layer (heads, head width) of the exported cache: (H_kv, d) for GQA layers, (1, n_p*d) for MEA layers."""
    shapes = []
    for i in range(cfg.num_hidden_layers):
        if getattr(cfg, "model_type", "") == "qwen3_mea" and cfg.is_mea_layer(i):
            shapes.append((1, cfg.num_key_value_heads * cfg.head_dim))  # one wide head: n_p physical heads side by side
        elif getattr(cfg, "model_type", "") == "qwen3_mea":
            shapes.append((cfg.mea_stock_kv_heads, cfg.head_dim))
        else:
            shapes.append((cfg.num_key_value_heads, cfg.head_dim))
    return shapes


class Qwen3KVDecoder(nn.Layer):
    """Stock Qwen3 (or Qwen3-MEA, serving form) causal LM over on-disk (HF layout) tensors, with tensor KV-cache I/O."""

    def __init__(self, cfg, tensors: Dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__()
        self.num_layers = cfg.num_hidden_layers
        self.h_q, self.d = cfg.num_attention_heads, cfg.head_dim
        self.eps = float(cfg.rms_norm_eps)
        self.bias = bool(getattr(cfg, "attention_bias", False))
        theta = float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        mea = getattr(cfg, "model_type", "") == "qwen3_mea"
        inv_freq = 1.0 / theta ** (np.arange(0, self.d, 2, dtype=np.float64) / self.d)
        self.inv_freq = self._const(inv_freq.astype(np.float32).reshape(1, 1, -1), "float32")  # (1, 1, d/2)
        self.scale = self.d ** -0.5

        def w(name, transpose=False):
            a = tensors[name]
            return self._const(a.T if transpose else a, dtype)

        def w_arr(a):
            return self._const(np.asarray(a, np.float32), dtype)

        self.embed = w("model.embed_tokens.weight")  # (V, h)
        self.final_norm = w("model.norm.weight")
        self.lm_head = w("lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight", True)
        self.layer_weights: List[dict] = []
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            lw = {k: w(p + k, transpose=k.endswith("proj.weight")) for k in (
                "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
                "self_attn.k_norm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                "self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                "mlp.down_proj.weight")}
            if self.bias:
                lw.update({k: w(p + k) for k in ("self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                                  "self_attn.v_proj.bias", "self_attn.o_proj.bias")})
            if mea and cfg.is_mea_layer(i):
                n_p, n_v = cfg.num_key_value_heads, cfg.mea_kv_heads
                groups = self.h_q // n_v  # query head h reads virtual KV head h // groups
                for side in ("k", "v"):  # coef[h, p] = lc[p, h // groups]: HLC folded into per-head scales
                    lc = tensors[p + f"self_attn.mea_{side}_lc"]  # (n_p, n_v)
                    lw[f"coef_{side}"] = w_arr(np.repeat(lc, groups, axis=1).T.reshape(1, 1, self.h_q, n_p, 1))
                if cfg.mea_group_norm:
                    lw["mea_norm"] = w_arr(tensors[p + "self_attn.mea_norm.weight"].reshape(self.h_q, self.d))
                lw.update(kind="mea", h_kv=1, n_p=n_p)
            else:
                lw.update(kind="gqa", h_kv=cfg.mea_stock_kv_heads if mea else cfg.num_key_value_heads)
            self.layer_weights.append(lw)

    def _const(self, array, dtype):
        t = paddle.to_tensor(np.ascontiguousarray(array)).astype(dtype)
        p = self.create_parameter(list(t.shape), dtype=dtype, default_initializer=nn.initializer.Assign(t))
        p.stop_gradient = True
        self.add_parameter(f"w{len(self._parameters)}", p)  # registered, so jit.save stores it
        return p

    def _lin(self, x, lw, name):
        y = paddle.matmul(x, lw[f"{name}.weight"])
        return y + lw[f"{name}.bias"] if self.bias and f"{name}.bias" in lw else y

    def forward(self, input_ids, attention_mask, position_ids, past_key_values):
        past = past_key_values  # list: key_0, value_0, key_1, ...
        h_q, d = self.h_q, self.d
        x = paddle.nn.functional.embedding(input_ids, self.embed)  # (B, S, h)

        # RoPE tables from absolute positions, computed once: (B, S, 1, d)
        freqs = position_ids.astype("float32").unsqueeze(-1) * self.inv_freq  # (B, S, d/2)
        emb = paddle.concat([freqs, freqs], axis=-1).unsqueeze(2)
        cos, sin = paddle.cos(emb).astype(x.dtype), paddle.sin(emb).astype(x.dtype)

        # Additive mask: causal over absolute positions and the caller's padding mask.
        seq = paddle.shape(input_ids)[1]
        total = paddle.shape(attention_mask)[1]
        q_pos = paddle.arange(seq, dtype="int64") + (total - seq)  # (S,)
        k_pos = paddle.arange(total, dtype="int64")  # (T,)
        allowed = (k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)).unsqueeze(0) & (attention_mask.unsqueeze(1) > 0)  # (B, S, T)
        base_mask = paddle.where(allowed, paddle.zeros([1], "float32"), paddle.full([1], NEG_INF, "float32"))
        masks = {}  # rows of the grouped layout are (query head in group, position): tile per group size, once

        presents = []
        for i, lw in enumerate(self.layer_weights):
            h_kv = lw["h_kv"]
            g = h_q // h_kv
            if g not in masks:
                masks[g] = paddle.tile(base_mask.unsqueeze(1), [1, 1, g, 1])  # (B, 1, G*S, T), row gi*S + s
            hdn = _rms_norm(x, lw["input_layernorm.weight"], self.eps)
            q = self._lin(hdn, lw, "self_attn.q_proj").reshape([0, 0, h_q, d])  # (B, S, H_q, d)
            n_k = lw["n_p"] if lw["kind"] == "mea" else h_kv  # heads k_proj / v_proj emit
            k = self._lin(hdn, lw, "self_attn.k_proj").reshape([0, 0, n_k, d])  # (B, S, n_k, d)
            v = self._lin(hdn, lw, "self_attn.v_proj").reshape([0, 0, n_k, d])
            q = _rms_norm(q, lw["self_attn.q_norm.weight"], self.eps)
            k = _rms_norm(k, lw["self_attn.k_norm.weight"], self.eps)
            q = q * cos + _rotate_half(q, d // 2) * sin
            k = k * cos + _rotate_half(k, d // 2) * sin
            if lw["kind"] == "mea":
                # serving form: the n_p physical heads side by side are ONE wide KV head (B, 1, S, n_p*d), and each
                # query head carries its K-side HLC coefficients: [coef_k[h, p] * q_h for p] (B, S, H_q, n_p*d)
                k = k.reshape([0, 0, 1, -1]).transpose([0, 2, 1, 3])
                v = v.reshape([0, 0, 1, -1]).transpose([0, 2, 1, 3])
                q = (q.unsqueeze(3) * lw["coef_k"]).reshape([0, 0, h_q, -1])
            else:
                k, v = k.transpose([0, 2, 1, 3]), v.transpose([0, 2, 1, 3])  # (B, H_kv, S, d)
            k = paddle.concat([past[2 * i], k], axis=2)  # (B, H_kv, T, width)
            v = paddle.concat([past[2 * i + 1], v], axis=2)
            presents += [k, v]
            width = lw["n_p"] * d if lw["kind"] == "mea" else d
            # grouped layout: query head j = kv*G + gi reads KV head kv; its G*S query rows share one K/V read
            qg = q.reshape([0, 0, h_kv, g, width]).transpose([0, 2, 3, 1, 4]).reshape([0, 0, -1, width])  # (B, H_kv, G*S, w)
            scores = paddle.matmul(qg, k, transpose_y=True) * self.scale  # (B, H_kv, G*S, T); scale is 1/sqrt(d)
            probs = paddle.nn.functional.softmax(scores.astype("float32") + masks[g], axis=-1)
            y = paddle.matmul(probs.astype(v.dtype), v)  # (B, H_kv, G*S, w)
            y = y.reshape([0, 0, g, -1, width]).transpose([0, 3, 1, 2, 4]).reshape([0, 0, h_q, width])  # (B, S, H_q, w)
            if lw["kind"] == "mea":
                n_p = lw["n_p"]
                y = (y.reshape([0, 0, h_q, n_p, d]) * lw["coef_v"]).sum(axis=3)  # V-side HLC: (B, S, H_q, d)
                if "mea_norm" in lw:  # head-level RMSNorm before o_proj
                    y = _rms_norm(y, lw["mea_norm"], self.eps)
            y = y.reshape([0, 0, h_q * d])  # (B, S, H_q*d), head-major
            x = x + self._lin(y, lw, "self_attn.o_proj")
            hdn = _rms_norm(x, lw["post_attention_layernorm.weight"], self.eps)
            mlp = paddle.nn.functional.silu(paddle.matmul(hdn, lw["mlp.gate_proj.weight"])) * paddle.matmul(
                hdn, lw["mlp.up_proj.weight"])
            x = x + paddle.matmul(mlp, lw["mlp.down_proj.weight"])
        x = _rms_norm(x, self.final_norm, self.eps)
        logits = paddle.matmul(x, self.lm_head)  # (B, S, V)
        return tuple([logits] + presents)
