"""Apply the Qwen3-MEA tensor-parallel plan (mea_plan.py) to one decoder layer's attention, from outside its math.

Called by apply.parallelize_model for every layer of a Qwen3-MEA model after the parameters were sliced:

* MEA layer: head counts become the rank's (H/t query heads over its virtual KV heads), the class becomes
  TensorParallelMEAAttention, which overrides two steps: its input enters the TP region (`copy_to_tp`) and — when
  virtual heads are replicated (t > n_v) — `hlc_coefficients` returns the rank's column of the whole HLC matrices;
  the direct form, the multi-query serving form and the cache (all n_p physical heads) are the inherited code;
* stock layer: Qwen3 GQA with the rank's query / KV heads (KV heads replicated with t > n_s: k_proj / v_proj
  compute only the rank's KV head); the class becomes TensorParallelGQAAttention (`copy_to_tp` on the input);
* o_proj becomes row-parallel (all-reduce of h per token), as in the Qwen3-VHA plan.

No new collective: an MEA layer communicates exactly what a stock Qwen3 layer does (the input-gradient all-reduce
and o_proj's all-reduce), plus the gradient all-reduce of the replicated k_proj / v_proj / norms once per step.
"""
from __future__ import annotations

from .apply import EntersTPRegion, make_column_slice, make_row_parallel, swap_class
from .plan import HeadLayout

__all__ = ["TensorParallelMEAAttention", "TensorParallelGQAAttention", "parallelize_mea_attention",
           "parallelize_stock_attention"]


class TensorParallelMEAAttention(EntersTPRegion):
    """Mixin placed in front of Qwen3MEAAttention: the MEA math on this rank's query and virtual KV heads."""

    _tp_virtual_head = None  # t > n_v: the one virtual head this rank reads from the whole HLC matrices, else None

    def hlc_coefficients(self):
        k_lc, v_lc = super().hlc_coefficients()
        if self._tp_virtual_head is None:  # virtual heads split: the parameters hold exactly this rank's columns
            return k_lc, v_lc
        g = self._tp_virtual_head  # replicated (gradient summed): a differentiable column slice [n_p, 1]
        return k_lc[:, g:g + 1], v_lc[:, g:g + 1]


class TensorParallelGQAAttention(EntersTPRegion):
    """Mixin placed in front of a stock Qwen3 attention (an MEA model's non-MEA layers): only the input changes."""


def parallelize_mea_attention(attn, lay: HeadLayout, group) -> None:
    attn.num_heads = lay.num_heads  # q_proj emits this rank's query heads (column slice)
    attn.num_virtual_heads = lay.num_kv_heads  # the HLC columns this rank composes
    attn.num_key_value_groups = lay.num_heads // lay.num_kv_heads
    attn.gqa_or_mqa = attn.num_key_value_groups != 1
    if not lay.kv_sharded:
        attn._tp_virtual_head = lay.kv[0]
    make_row_parallel(attn.o_proj, group)
    swap_class(attn, TensorParallelMEAAttention)
    attn._tp_group = group


def parallelize_stock_attention(attn, lay: HeadLayout, group) -> None:
    d = attn.head_dim
    attn.num_heads = lay.num_heads
    attn.num_key_value_heads = lay.num_kv_heads
    attn.num_key_value_groups = lay.num_heads // lay.num_kv_heads
    attn.gqa_or_mqa = attn.num_key_value_groups != 1
    if not lay.kv_sharded:  # K/V stay whole; this rank computes its KV head only
        for proj in (attn.k_proj, attn.v_proj):
            make_column_slice(proj, (lay.kv[0] * d, lay.kv[1] * d))
    make_row_parallel(attn.o_proj, group)
    swap_class(attn, TensorParallelGQAAttention)
    attn._tp_group = group
