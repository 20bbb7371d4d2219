"""Attention sinks on sliding-window layers: a learned sink logit per query head (docs/method.md, "Attention sinks"),
and Qwen3 with sinks (model_type qwen3_sinks), what a Qwen3-VHA with window_attention_sinks folds into: stock Qwen3
attention plus the sinks, so stock Qwen3 runtimes (Hugging Face's Qwen3, onnxruntime-genai's qwen3) cannot serve it.

spec.py        `self_attn.sinks`, declared once (Qwen3-VHA's spec uses it too; served as a graph constant), and this
               family's tensors (served as stock GQA: paddle_vha/qwen3/serving.py GQA)
config.py      Qwen3SinksConfig                   attention.py  Qwen3SinksAttention
modeling.py    Qwen3SinksModel / ForCausalLM      tp_plan.py    tensor-parallel plan (data)
cost.py        the cost model's fields

Registered in paddle_vha/families.py.
"""
