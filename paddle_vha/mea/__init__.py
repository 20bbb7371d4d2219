"""Multi-head Explicit Attention (MEA) for PaddleFormers' Qwen3: HLC over K/V heads, head norm, KV compression.

See docs/mea.md. Submodules: config, attention, modeling, checkpoint, compress (stock Qwen3 -> MEA by SVD),
serving (the multi-query serving form).
"""
