"""Attention sinks on sliding-window layers: a learned sink logit per query head (docs/method.md, "Attention sinks").

spec.py        the one declaration of the `self_attn.sinks` tensor every family with sinks uses (Qwen3-VHA's window
               layers, and Qwen3 with sinks, what such a Qwen3-VHA folds into)
"""
