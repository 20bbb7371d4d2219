"""Deploying a folded (stock Qwen3 GQA) model: ONNX export with KV cache, Paddle Inference."""
