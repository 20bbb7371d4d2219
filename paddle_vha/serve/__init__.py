"""Serving a folded model on stock runtimes: onnxruntime and Paddle Inference sessions, generation loops."""
