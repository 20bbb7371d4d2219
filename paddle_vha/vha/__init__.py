"""Qwen3-VHA: Virtual Head Attention for PaddleFormers' Qwen3 (docs/method.md).

config.py      Qwen3VHAConfig                      attention.py  Qwen3VHAAttention: Premix, Postmix (the equations)
modeling.py    Qwen3VHAModel / ForCausalLM         spec.py       its tensors, declared once
cost.py        the cost model's formulas           fold_rules.py its fold roles: Premix -> q_proj, Postmix -> o_proj
                                                   tp_plan.py    tensor-parallel plan (data)
fleet_config.py      upstream PaddleFleet config names -> ours (Qwen3VHAConfig calls it)
fleet_import.py      upstream checkpoints -> this contract (tools/import_fleet.py)
fleet_reference.py   upstream's forward in float64 numpy, for import_fleet --verify

Registered in paddle_vha/families.py. Nothing here is imported by this __init__ (Paddle loads on first use).
"""
