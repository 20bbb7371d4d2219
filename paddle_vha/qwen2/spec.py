"""Qwen2's tensors, declared once: Llama's decoder layer (paddle_vha/llama/spec.py) with q_proj, k_proj and v_proj
biases always and no o_proj bias (Qwen2 has no attention_bias field: its biases are fixed), and the variants' tensors
over it. Pure Python."""
from __future__ import annotations

from ..llama.spec import LLAMA, LLAMA_LAYER
from ..mea.spec import mea_layers, mea_model_spec
from ..qwen3.spec import stock_sizes
from ..spec.params import ModelSpec
from ..vha.spec import vha_layer, vha_model_spec

__all__ = ["qwen2_sizes", "QWEN2_LAYER", "QWEN2", "QWEN2_VHA_LAYER", "QWEN2_VHA", "QWEN2_MEA_LAYER",
           "QWEN2_MEA_STOCK_LAYER", "QWEN2_MEA"]


def qwen2_sizes(cfg, layer_idx: int, kv_heads: int = None):
    """Stock sizes (paddle_vha/qwen3/spec.py) with Qwen2's fixed biases: on the query, key and value projections, not
    on o_proj."""
    s = stock_sizes(cfg, layer_idx, kv_heads)
    s.bias, s.o_bias = True, False
    return s


QWEN2_LAYER = LLAMA_LAYER.replace("qwen2", sizes=qwen2_sizes)
QWEN2 = ModelSpec(top=LLAMA.top, top_sizes=LLAMA.top_sizes, layer=lambda cfg, i: QWEN2_LAYER)
QWEN2_VHA_LAYER = vha_layer(QWEN2_LAYER)
QWEN2_VHA = vha_model_spec(QWEN2, QWEN2_VHA_LAYER)
QWEN2_MEA_LAYER, QWEN2_MEA_STOCK_LAYER = mea_layers(QWEN2_LAYER)
QWEN2_MEA = mea_model_spec(QWEN2, QWEN2_MEA_LAYER, QWEN2_MEA_STOCK_LAYER)
