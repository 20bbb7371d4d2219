"""Qwen3 shared-KV: stock Qwen3 attention with one shared K = V projection and the output rotated back by the query's
angle. It is what a shared-KV Qwen3-VHA checkpoint folds into (tools/fold.py): Premix and Postmix absorbed into
q_proj and o_proj exactly as for plain VHA, but K = V and the inverse RoPE remain, so it is not stock Qwen3.

config.py      Qwen3SharedKVConfig                 attention.py  Qwen3SharedKVAttention
modeling.py    Qwen3SharedKVModel / ForCausalLM    spec.py       its tensors, declared once        
serving.py     its layers in the exported decoder  tp_plan.py    tensor-parallel plan (data)
cost.py        the cost model's fields

Registered in paddle_vha/families.py; docs/fold.md ("Shared KV") and docs/deploy.md describe it.
"""
