"""The rewrites a quantized export gets before quantization (paddle_vha/export/merge_matmuls.py: q|k|v and gate|up as
one MatMul each; paddle_vha/export/fuse_contrib.py: onnxruntime's RotaryEmbedding and SkipSimplifiedLayerNormalization),
applied here to a validated float32 export so that nothing but the rewrite differs: onnxruntime's logits and new cache
positions from the rewritten graph against the export's own graph, at a left-padded prefill (batch 2, prime length 7,
odd head counts) and at single-token steps past it, in both cache flavours and for each RoPE the export writes. The
allowed difference is tied to the export's own float32 error: at most 2x what its validation measured against Paddle
(plus float32 rounding of the logits' size). A RoPE whose angles depend on the length (dynamic NTK) or are scaled after
the cos / sin (YaRN's attention factor) keeps its chain: the rewrite must not take it."""
import json
import os

import numpy as np
import onnx
import paddle
import pytest
from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

from paddle_vha.export.fuse_contrib import fuse_contrib_ops
from paddle_vha.export.merge_matmuls import merge_sibling_matmuls
from paddle_vha.export.onnx_export import export_onnx
from paddle_vha.export.quantize import load_inline
from paddle_vha.serve.ort_session import OrtDecoder

LAYERS = 2
ROPES = {"default": None, "linear": {"rope_type": "linear", "factor": 2.0}, "dynamic": {"type": "dynamic", "factor": 2.0},
         "yarn": {"rope_type": "yarn", "factor": 2.0}}
FUSED_ROPE = {"default": True, "linear": True, "dynamic": False, "yarn": False}


def _checkpoint(path, rope):
    paddle.seed(3)
    cfg = Qwen3Config(vocab_size=256, hidden_size=48, intermediate_size=80, num_hidden_layers=LAYERS,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                      tie_word_embeddings=True, rope_scaling=ROPES[rope])
    model = Qwen3ForCausalLM(cfg)
    for n, p in model.named_parameters():
        if n.endswith("q_norm.weight") or n.endswith("k_norm.weight"):
            p.set_value(paddle.uniform(p.shape, min=0.3, max=2.0))
    model.save_pretrained(str(path))


def _rewritten(src_dir, dst, max_positions):
    model = load_inline(os.path.join(src_dir, "model.onnx"))
    merged = merge_sibling_matmuls(model)
    fused = fuse_contrib_ops(model, max_positions)
    onnx.save_model(model, dst)
    return merged, fused, model


def _calls(sess, steps=3):
    """Logits and new cache positions of a left-padded prefill and `steps` single-token steps (a fixed token stream)."""
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 256, size=(2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[1, :3] = 0  # row 1: 3 positions of left padding
    logits, cache = sess.prefill(ids, mask)
    outs = [logits] + [c.copy() for c in (cache.filled() if hasattr(cache, "filled") else cache)]
    for k in range(steps):
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
        logits, cache = sess.step(rng.integers(0, 256, size=(2, 1)), cache, mask)
        outs.append(logits)
    outs += [c.copy() for c in (cache.filled() if hasattr(cache, "filled") else cache)]
    return outs


@pytest.mark.parametrize("cache_io", ["concat", "buffer"])
@pytest.mark.parametrize("rope", list(ROPES))
def test_rewritten_graph_gives_the_exports_outputs(tmp_path, rope, cache_io):
    ckpt, out = tmp_path / "ckpt", tmp_path / "onnx"
    _checkpoint(ckpt, rope)
    val = export_onnx(str(ckpt), str(out), decode_steps=2, log=lambda m: None, cache_io=cache_io)
    info = json.load(open(out / "export_info.json"))
    merged, fused, model = _rewritten(str(out), str(tmp_path / "fused.onnx"), info["context_length"])
    ops = sorted({n.op_type for n in model.graph.node if n.domain == "com.microsoft"})
    print(f"{rope} / {cache_io}: merged {merged} groups, fused {fused}, contrib ops {ops}")
    assert merged == 2 * LAYERS, merged  # q|k|v and gate|up in each layer
    assert fused["skip_simplified_layer_norm"] == 2 * LAYERS, fused  # the attention and MLP residual adds
    assert fused["rotary_embedding"] == (2 * LAYERS if FUSED_ROPE[rope] else 0), fused
    ref = OrtDecoder.from_dir(str(out))
    new = OrtDecoder(str(tmp_path / "fused.onnx"))
    new.cache_windows, new.cache_io = ref.cache_windows, ref.cache_io
    a, b = _calls(ref), _calls(new)
    own = val.max_abs  # the export's float32 graph against Paddle
    scale = max(float(np.abs(x).max()) for x in a)
    worst = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
    mean = float(np.mean([np.abs(x - y).mean() for x, y in zip(a, b)]))
    bound = 2 * own + 4 * np.finfo(np.float32).eps * scale
    print(f"  rewritten vs export: max {worst:.2e}, mean {mean:.2e}; the export vs Paddle {own:.2e}; bound {bound:.2e}")
    assert all(x.shape == y.shape for x, y in zip(a, b))
    assert worst <= bound


def test_positions_past_the_tables_are_the_models_limit(tmp_path):
    """The rotary tables hold max_positions rows (the export passes the model's context length): a position inside
    gives the unfused graph's logits, and the tables' size is what the export recorded."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "onnx"
    _checkpoint(ckpt, "default")
    export_onnx(str(ckpt), str(out), decode_steps=2, log=lambda m: None)
    _, fused, model = _rewritten(str(out), str(tmp_path / "fused.onnx"), 64)
    tables = [t for t in model.graph.initializer if t.name.startswith("fused.rope.")]
    print("rotary tables:", [(t.name, list(t.dims)) for t in tables])
    assert {tuple(t.dims) for t in tables} == {(64, 8)} and len(tables) == 2  # cos and sin, (positions, head_dim / 2)
    ref, new = OrtDecoder.from_dir(str(out)), OrtDecoder(str(tmp_path / "fused.onnx"))
    new.cache_windows, new.cache_io = ref.cache_windows, ref.cache_io
    ids = np.arange(60)[None] % 256  # positions 0..59, inside the 64 rows
    d = float(np.abs(ref.prefill(ids)[0] - new.prefill(ids)[0]).max())
    print(f"60 positions: max difference {d:.2e}")
    assert d < 1e-4
