"""Qwen3-MoE as a base (checkpoint level): stock Qwen3 attention with routed experts in place of the MLP on the MoE
layers (Hugging Face's Qwen3MoeForCausalLM names and layout), and what a Qwen3-MoE-VHA checkpoint folds into.

fields.py      the MoE fields as data (Paddle-free): defaults, one-line checks, which layers are MoE
config.py      MoEFields (the config mixin), Qwen3MoeConfig
spec.py        the routed-expert MLP's tensors, declared once; with_moe_mlp(any layer spec) -> its MoE form
base.py        QWEN3_MOE_BASE: the Base the Qwen3-MoE families name
reference.py   the forward of a Qwen3-MoE(-VHA) checkpoint in float64 numpy (fold / import --verify)

No Paddle model: PaddleFormers 1.0.0's qwen3_moe modeling imports paddlefleet, which is not on PyPI, so these families
are checkpoints only (validated, folded, imported, costed; not trained or exported here).
Registered in paddle_vha/families.py. Nothing here is imported by this __init__.
"""
