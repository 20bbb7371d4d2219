"""Qwen3-MoE-VHA: Virtual Head Attention (paddle_vha/vha/) on the Qwen3-MoE base (paddle_vha/moe/), checkpoint level:
the paper's MoE models (8B-A1B, 30B-A3B) as upstream PaddleFleet trains them.

config.py      Qwen3MoeVHAConfig: Qwen3VHAConfig's fields + the MoE fields; fold_refusal (what has no stock form)
spec.py        its tensors: VHA_LAYER's attention, the MoE base's routed experts

Fold (paddle_vha/transform/fold.py) absorbs Premix / Postmix exactly as for dense VHA and copies the router and the
experts: the output is a stock `qwen3_moe` checkpoint. Registered in paddle_vha/families.py.
"""
