"""Qwen2 / Qwen2.5 as a base: Llama with q / k / v biases.

gguf.py        Qwen2 as llama.cpp's GGUF names it (tools/import_gguf.py)
"""
