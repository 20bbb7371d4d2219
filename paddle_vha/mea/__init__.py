"""Qwen3-MEA: Multi-head Explicit Attention for PaddleFormers' Qwen3 (docs/mea.md).

HLC over the K/V heads, a per-head norm, and KV compression of a pretrained Qwen3.

config.py      Qwen3MEAConfig                      layers.py     which layers are MEA (the one mea_layers reader)
functional.py  HLC, head norm, multi-query form    attention.py  Qwen3MEAAttention (+ the stock-KV layer)
modeling.py    Qwen3MEAModel / ForCausalLM         spec.py       its tensors, declared once        
compress.py    stock Qwen3 -> Qwen3-MEA (SVD)      serving.py    the layers in the exported decoder
tp_plan.py     tensor-parallel plan (data)         cost.py       the cost model's fields

Registered in paddle_vha/families.py. Nothing here is imported by this __init__ (Paddle loads on first use).
"""
