"""Qwen2 / Qwen2.5 as a base: PaddleFormers' Qwen2 classes, Llama's decoder layer (no per-head q/k norms) with biases on
q_proj, k_proj and v_proj (none on o_proj); and the variants over it.

base.py        QWEN2_BASE                         spec.py      its tensors, and Qwen2-VHA's / Qwen2-MEA's
config.py      Qwen2Config with head_dim           contract.py  config.json checks Qwen2 adds to Qwen3's
serving.py     its exported form (genai: qwen2)   vha.py, mea.py  the variants: config, attention, model classes
gguf.py        Qwen2 as llama.cpp's GGUF names it (tools/import_gguf.py, tools/export_gguf.py)
"""
