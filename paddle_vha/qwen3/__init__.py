"""What both families take from PaddleFormers' Qwen3 (paddle_vha/vha, paddle_vha/mea build on it).

base.py        PaddleFormers' dense Qwen3 as the base every family's classes derive from (paddle_vha/modeling/)
spec.py        the stock tensors, declared once (a folded VHA checkpoint is exactly these)
contract.py    config.json checks every Qwen3 family runs first
modeling.py    attention core, shared K = V cache, RoPE tables per layer, cache-continuing positions
functional.py  Qwen3's math on plain tensors (RMSNorm, RoPE, grouped attention, SwiGLU) for exported graphs
serving.py     Serving (a family's layers in the exported decoder, as data), the stock GQA form
tp_plan.py     the tensor-parallel plan of a stock GQA layer
"""
