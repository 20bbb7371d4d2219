"""Llama as a base (Llama 3.x, SmolLM2, Mistral without sliding windows): Qwen3 without the q / k norms.

gguf.py        Llama as llama.cpp's GGUF names it (tools/import_gguf.py)
"""
