"""Llama as a base (Llama 2 / 3.x, SmolLM2, Mistral without sliding windows): PaddleFormers' Llama classes, Qwen3's
decoder layer without the per-head q/k norms, attention biases where attention_bias says; and the variants over it.

base.py        LLAMA_BASE (the classes, the config checks)   spec.py      its tensors, and Llama-VHA's / Llama-MEA's
contract.py    config.json checks Llama adds to Qwen3's       serving.py   its exported form (genai: llama)
vha.py         Llama-VHA: config, attention, model classes, fold form
mea.py         Llama-MEA: config, attentions, model classes
gguf.py        Llama as llama.cpp's GGUF names it (tools/import_gguf.py, tools/export_gguf.py)
"""
