"""What both families take from PaddleFormers' Qwen3 (paddle_vha/vha, paddle_vha/mea build on it).

modeling.py    builders with another layer / backbone, cache positions, contract-checked save and load
contract.py    the stock tensor names and shapes (a folded VHA checkpoint is exactly this)
functional.py  Qwen3's math on plain tensors (RMSNorm, RoPE, grouped attention, SwiGLU) for exported graphs
serving.py     a stock GQA layer in the exported decoder
tp_plan.py     the tensor-parallel plan of a stock GQA layer
"""
