"""ONNX export of a stock Qwen3 (folded) checkpoint, and generation in onnxruntime and Paddle Inference."""
import glob
import json
import os

import numpy as np
import onnx
import paddle
import pytest
from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM
from safetensors.numpy import load_file

import oracle
from _utils import TINY, assert_clean_graph, rel_err
from paddle_vha.checkpoint.contract import CheckpointError
from paddle_vha.checkpoint.fsutil import MARKER
from paddle_vha.export.decoder import io_names
from paddle_vha.export.onnx_export import ExportError, export_onnx
from paddle_vha.serve.generate import generate
from paddle_vha.serve.ort_session import OrtDecoder
from paddle_vha.serve.paddle_inference import PaddleInferenceDecoder

GQA2 = dict(TINY, num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False)


def stock_checkpoint(path, **overrides):
    cfg = Qwen3Config(**{**GQA2, **overrides})
    model = Qwen3ForCausalLM(cfg)
    if cfg.attention_bias:
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.set_value(paddle.randn(p.shape) * 0.3)
    model.eval()
    model.save_pretrained(path)
    return cfg, model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    paddle.seed(7)
    cfg, model = stock_checkpoint(str(root / "ckpt"))
    val = export_onnx(str(root / "ckpt"), str(root / "onnx"))
    return cfg, model, str(root / "ckpt"), str(root / "onnx"), val


def disk_state(path):
    out = {}
    for f in glob.glob(os.path.join(path, "*.safetensors")):
        out.update({k: v.astype(np.float64) for k, v in load_file(f).items()})
    return out


def test_export_layout_and_self_validation(exported):
    cfg, _, ckpt, out, val = exported
    print(f"export validation: prefill {val.prefill_max_abs:.2e}, {val.steps} decode steps {val.decode_max_abs:.2e}")
    assert val.max_abs <= 1e-4 and val.steps >= 16 and val.tokens_match
    assert sorted(os.listdir(out)) == [MARKER, "config.json", "export_info.json", "genai_config.json", "model.onnx", "paddle"]
    model = onnx.load(os.path.join(out, "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert {n.domain for n in model.graph.node} <= {"", "ai.onnx"}
    assert model.opset_import[0].version >= 14
    ins, outs = io_names(cfg.num_hidden_layers)
    assert [i.name for i in model.graph.input] == ins and [o.name for o in model.graph.output] == outs
    for vi in model.graph.input[3:]:
        dims = vi.type.tensor_type.shape.dim
        assert [dims[0].dim_param, dims[1].dim_value, dims[2].dim_param, dims[3].dim_value] == [
            "batch", cfg.num_key_value_heads, "past_sequence", cfg.head_dim]
    assert not [n for n in model.graph.node if n.op_type == "Identity" and n.output[0] in outs]
    info = json.load(open(os.path.join(out, "export_info.json")))
    assert info["num_key_value_heads"] == 2 and info["validation"]["decode_steps"] == val.steps
    assert_clean_graph(os.path.join(out, "model.onnx"))


def test_onnx_matches_float64_oracle_prefill_and_cached_steps(exported):
    cfg, _, ckpt, out, _ = exported
    state, ocfg = disk_state(ckpt), dict(cfg.to_dict(), rope_theta=cfg.rope_theta)
    sess = OrtDecoder.from_dir(out)
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, size=(3, 13))  # B = 3, prime S
    logits, cache = sess.prefill(ids[:, :12])
    ref, past = oracle.stock_causal_lm(ids[:, :12], state, ocfg)
    assert rel_err(logits, ref, "onnx prefill vs oracle") <= 1e-5
    logits, cache = sess.step(ids[:, 12:], cache)  # S = 1 decode with a position offset
    ref, _ = oracle.stock_causal_lm(ids[:, 12:], state, ocfg, past=past)
    assert rel_err(logits, ref, "onnx decode step vs oracle") <= 1e-5
    assert cache[0].shape == (3, cfg.num_key_value_heads, 13, cfg.head_dim)


@pytest.mark.parametrize("runtime", ["onnxruntime", "paddle_inference"])
def test_greedy_generation_matches_paddleformers_generate(exported, runtime):
    cfg, model, _, out, _ = exported
    sess = OrtDecoder.from_dir(out) if runtime == "onnxruntime" else PaddleInferenceDecoder(out)
    prompt = np.random.default_rng(5).integers(0, cfg.vocab_size, size=(2, 9))
    res = generate(sess, prompt, max_new_tokens=12)
    want, _ = model.generate(paddle.to_tensor(prompt), max_new_tokens=12, decode_strategy="greedy_search")
    print(runtime, res.tokens.tolist(), f"{res.tokens_per_second:.0f} tok/s")
    assert np.array_equal(res.tokens, want.numpy())


def test_paddle_inference_and_onnxruntime_logits_agree(exported):
    cfg, _, _, out, _ = exported
    ids = np.random.default_rng(9).integers(0, cfg.vocab_size, size=(2, 6))
    a, ca = OrtDecoder.from_dir(out).prefill(ids)
    b, cb = PaddleInferenceDecoder(out).prefill(ids)
    assert rel_err(b, a, "paddle inference vs onnxruntime prefill") <= 1e-5
    assert all(np.allclose(x, y, atol=1e-5) for x, y in zip(ca, cb))


def test_left_padded_batch_matches_unpadded_rows(exported):
    cfg, _, _, out, _ = exported
    sess = OrtDecoder.from_dir(out)
    rng = np.random.default_rng(11)
    short, long = rng.integers(0, cfg.vocab_size, size=(1, 4)), rng.integers(0, cfg.vocab_size, size=(1, 7))
    batch = np.concatenate([np.concatenate([np.zeros((1, 3), np.int64), short], 1), long])  # (2, 7), row 0 left-padded
    mask = np.array([[0, 0, 0, 1, 1, 1, 1], [1] * 7])
    res = generate(sess, batch, max_new_tokens=6, attention_mask=mask)
    alone = [generate(sess, row, max_new_tokens=6).tokens[0] for row in (short, long)]
    assert np.array_equal(res.tokens, np.stack(alone))


def test_sampling_is_seeded_and_respects_top_k(exported):
    cfg, _, _, out, _ = exported
    sess = OrtDecoder.from_dir(out)
    prompt = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(2, 5))
    a = generate(sess, prompt, 10, do_sample=True, temperature=1.5, top_k=5, seed=3).tokens
    b = generate(sess, prompt, 10, do_sample=True, temperature=1.5, top_k=5, seed=3).tokens
    c = generate(sess, prompt, 10, do_sample=True, temperature=1.5, top_k=5, seed=4).tokens
    g = generate(sess, prompt, 10).tokens
    assert np.array_equal(a, b) and not np.array_equal(a, c) and not np.array_equal(a, g)
    # top_k = 1 sampling is greedy
    assert np.array_equal(generate(sess, prompt, 10, do_sample=True, top_k=1, seed=5).tokens, g)


def test_bias_and_tied_embeddings_export(tmp_path):
    paddle.seed(3)
    stock_checkpoint(str(tmp_path / "ckpt"), attention_bias=True, tie_word_embeddings=True, num_attention_heads=3,
                     num_key_value_heads=1)
    val = export_onnx(str(tmp_path / "ckpt"), str(tmp_path / "onnx"), decode_steps=16)
    assert val.max_abs <= 1e-4


def _listing(path):
    return sorted(os.listdir(path))


@pytest.mark.parametrize("case", ["vha-input", "exists", "opset", "tolerance", "missing-tensor"])
def test_export_refusals_leave_nothing_behind(tmp_path, case):
    paddle.seed(1)
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    stock_checkpoint(ckpt)
    kwargs, err = {}, ExportError
    if case == "vha-input":
        cfg = json.load(open(os.path.join(ckpt, "config.json")))
        json.dump(dict(cfg, model_type="qwen3_vha"), open(os.path.join(ckpt, "config.json"), "w"))
        err, needle = CheckpointError, "fold it first"
    elif case == "exists":
        os.makedirs(out)
        needle = "already exists (pass --force"
    elif case == "opset":
        kwargs, needle = dict(opset=13), "opset 13 < 14"
    elif case == "tolerance":
        kwargs, needle = dict(tolerance=0.0, decode_steps=1), "validation failed"
    else:
        idx = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))
        del idx["weight_map"]["model.layers.1.mlp.up_proj.weight"]
        json.dump(idx, open(os.path.join(ckpt, "model.safetensors.index.json"), "w"))
        err, needle = CheckpointError, "missing tensors: model.layers.1.mlp.up_proj.weight"
    before = _listing(tmp_path)
    with pytest.raises(err, match=needle.replace("(", r"\(")):
        export_onnx(ckpt, out, **kwargs)
    assert _listing(tmp_path) == before, "a failed export must leave no output or temp folder"


def test_external_data_export(tmp_path):
    """Models over 2 GB keep weights in model.onnx.data; forced here on a small model."""
    paddle.seed(4)
    cfg, model = stock_checkpoint(str(tmp_path / "ckpt"))
    val = export_onnx(str(tmp_path / "ckpt"), str(tmp_path / "onnx"), decode_steps=16, external_data=True)
    assert val.max_abs <= 1e-4
    files = sorted(os.listdir(tmp_path / "onnx"))
    assert "model.onnx.data" in files
    assert_clean_graph(str(tmp_path / "onnx" / "model.onnx"))
    assert os.path.getsize(tmp_path / "onnx" / "model.onnx") < 50_000 < os.path.getsize(tmp_path / "onnx" / "model.onnx.data")
    prompt = np.random.default_rng(2).integers(0, cfg.vocab_size, size=(1, 5))
    want, _ = model.generate(paddle.to_tensor(prompt), max_new_tokens=6, decode_strategy="greedy_search")
    assert np.array_equal(generate(OrtDecoder.from_dir(str(tmp_path / "onnx")), prompt, 6).tokens, want.numpy())


def test_folded_vha_serves_like_paddleformers_generate(tmp_path):
    """The real pipeline: a Qwen3-VHA checkpoint, folded, exported; both runtimes generate what PaddleFormers'
    own generate does on the folded model (loaded through a symlink view, so the folder stays untouched)."""
    from _utils import tiny_config

    from paddle_vha import Qwen3VHAForCausalLM
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold
    from paddle_vha.checkpoint.fsutil import linked_view

    paddle.seed(21)
    cfg = tiny_config(num_attention_heads=6, num_key_value_heads=2, vha_q_head_dim=12, vha_postmix_v_init_std=0.3)
    Qwen3VHAForCausalLM(cfg).save_pretrained(str(tmp_path / "vha"))
    fold_checkpoint(plan_fold(str(tmp_path / "vha"), str(tmp_path / "folded")), progress=False)
    export_onnx(str(tmp_path / "folded"), str(tmp_path / "onnx"))
    folded = Qwen3ForCausalLM.from_pretrained(linked_view(str(tmp_path / "folded"), str(tmp_path / "view")))
    folded.eval()
    prompt = np.random.default_rng(8).integers(0, cfg.vocab_size, size=(2, 7))
    want, _ = folded.generate(paddle.to_tensor(prompt), max_new_tokens=10, decode_strategy="greedy_search")
    for sess in (OrtDecoder.from_dir(str(tmp_path / "onnx")), PaddleInferenceDecoder(str(tmp_path / "onnx"))):
        got = generate(sess, prompt, 10).tokens
        print(type(sess).__name__, got.tolist())
        assert np.array_equal(got, want.numpy())


def _mea_checkpoint(path, **overrides):
    from _utils import TINY

    from paddle_vha import Qwen3MEAConfig, Qwen3MEAForCausalLM

    cfg = Qwen3MEAConfig(**{**TINY, "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2,
                            "mea_kv_heads": 3, "mea_layers": [0, 2], "mea_stock_kv_heads": 6,
                            "mea_k_norm_position": "before_hlc", **overrides})
    model = Qwen3MEAForCausalLM(cfg)
    for name, p in model.named_parameters():  # HLC coefficients and head norm away from their initial values
        if "mea_" in name:
            p.set_value((1.0 if "mea_norm" in name else 0.0) + paddle.randn(p.shape) * 0.4)
    model.eval()
    model.save_pretrained(path)
    return cfg, model


def test_mea_exports_in_the_multiquery_serving_form(tmp_path):
    """Qwen3-MEA (before_hlc) exports with one wide KV head per MEA layer; both runtimes match PaddleFormers."""
    paddle.seed(13)
    cfg, model = _mea_checkpoint(str(tmp_path / "mea"))
    val = export_onnx(str(tmp_path / "mea"), str(tmp_path / "onnx"))
    assert val.max_abs <= 1e-4 and val.tokens_match
    assert_clean_graph(str(tmp_path / "onnx" / "model.onnx"))
    assert not (tmp_path / "onnx" / "genai_config.json").exists()  # one wide head per MEA layer: not genai's layout
    m = onnx.load(str(tmp_path / "onnx" / "model.onnx"))
    n_p, d = cfg.num_key_value_heads, cfg.head_dim
    shapes = [(vi.type.tensor_type.shape.dim[1].dim_value, vi.type.tensor_type.shape.dim[3].dim_value)
              for vi in m.graph.input[3::2]]  # keys of layers 0, 1, 2
    assert shapes == [(1, n_p * d), (cfg.mea_stock_kv_heads, d), (1, n_p * d)]  # MEA, stock, MEA
    prompt = np.random.default_rng(4).integers(0, cfg.vocab_size, size=(2, 6))
    want, _ = model.generate(paddle.to_tensor(prompt), max_new_tokens=8, decode_strategy="greedy_search")
    for sess in (OrtDecoder.from_dir(str(tmp_path / "onnx")), PaddleInferenceDecoder(str(tmp_path / "onnx"))):
        res = generate(sess, prompt, 8)
        assert np.array_equal(res.tokens, want.numpy()), type(sess).__name__
    # cached bytes per token of an MEA layer: n_p heads of d, as the direct form stores
    _, cache = OrtDecoder.from_dir(str(tmp_path / "onnx")).prefill(prompt)
    assert cache[0].shape[1] * cache[0].shape[3] == n_p * d and cache[2].shape[1] * cache[2].shape[3] == 6 * d


def test_mea_after_hlc_is_refused_for_export(tmp_path):
    paddle.seed(14)
    _mea_checkpoint(str(tmp_path / "mea"), mea_k_norm_position="after_hlc")
    with pytest.raises(CheckpointError, match="needs 'before_hlc'"):
        export_onnx(str(tmp_path / "mea"), str(tmp_path / "onnx"))
    assert not os.path.exists(tmp_path / "onnx")


# --- the buffer flavour (tools/export_onnx.py --cache buffer) --------------------------------------------------------

def _buffer_case(root, family):
    """A checkpoint of `family` and its two exports (concat, buffer)."""
    paddle.seed(41)
    if family == "stock":
        cfg, model = stock_checkpoint(str(root / "ckpt"), attention_bias=True)
    elif family == "mea":
        cfg, model = _mea_checkpoint(str(root / "ckpt"))
    else:  # Qwen3 shared-KV, what shared-KV VHA folds into
        from paddle_vha.shared_kv.config import Qwen3SharedKVConfig
        from paddle_vha.shared_kv.modeling import Qwen3SharedKVForCausalLM

        cfg = Qwen3SharedKVConfig(**{**TINY, "num_attention_heads": 6, "num_key_value_heads": 2})
        model = Qwen3SharedKVForCausalLM(cfg)
        model.eval()
        model.save_pretrained(str(root / "ckpt"))
    lines = []
    vals = {io: export_onnx(str(root / "ckpt"), str(root / io), cache_io=io, log=lines.append)
            for io in ("concat", "buffer")}
    return cfg, model, vals, lines


@pytest.mark.parametrize("family", ["stock", "shared-kv", "mea"])
def test_buffer_flavour_serves_like_the_concat_export_and_paddleformers(tmp_path, family):
    from paddle_vha.serve.session import CacheBuffers

    cfg, model, vals, lines = _buffer_case(tmp_path, family)
    assert vals["buffer"].max_abs <= 1e-4 and vals["buffer"].tokens_match
    info = json.load(open(tmp_path / "buffer" / "export_info.json"))
    assert info["cache_io"] == "buffer" and info["outputs"][1].startswith("new.0.")
    assert not (tmp_path / "buffer" / "genai_config.json").exists()
    assert any("buffer flavour's cache interface" in ln for ln in lines)
    assert_clean_graph(str(tmp_path / "buffer" / "model.onnx"))
    # step by step against the concat export, across a capacity growth (64 -> 128 positions)
    concat, buffer = OrtDecoder.from_dir(str(tmp_path / "concat")), OrtDecoder.from_dir(str(tmp_path / "buffer"))
    assert buffer.cache_io == "buffer"
    rng = np.random.default_rng(6)
    ids = rng.integers(0, cfg.vocab_size, size=(2, 60))
    a, ca = concat.prefill(ids)
    b, cb = buffer.prefill(ids)
    assert isinstance(cb, CacheBuffers) and cb.capacity == 64 and cb.length == 60
    worst = float(np.abs(a - b).max())
    for step in range(8):
        nxt = a[:, -1].argmax(-1)[:, None]
        a, ca = concat.step(nxt, ca)
        b, cb = buffer.step(nxt, cb)
        worst = max(worst, float(np.abs(a - b).max()))
        assert all(x.shape == y.shape and np.abs(x - y).max() <= 1e-5 for x, y in zip(ca, cb.filled())), \
            "the buffers hold what present holds"
    print(f"{family}: buffer vs concat flavour, prefill 60 + 8 steps: max abs logit diff {worst:.2e}; capacity "
          f"{cb.capacity}")
    assert worst <= 1e-5 and cb.capacity == 128 and cb.length == 68
    # greedy generation on both runtimes = PaddleFormers' own
    prompt = rng.integers(0, cfg.vocab_size, size=(2, 7))
    want, _ = model.generate(paddle.to_tensor(prompt), max_new_tokens=10, decode_strategy="greedy_search")
    for sess in (buffer, PaddleInferenceDecoder(str(tmp_path / "buffer"))):
        assert sess.cache_io == "buffer"
        assert np.array_equal(generate(sess, prompt, 10).tokens, want.numpy()), type(sess).__name__


def test_buffer_flavour_left_padding_and_refusals(tmp_path):
    from _utils import tiny_config

    from paddle_vha import Qwen3VHAForCausalLM
    from paddle_vha.export.onnx_export import ExportError
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold

    cfg, model, _, _ = _buffer_case(tmp_path, "stock")
    sess = OrtDecoder.from_dir(str(tmp_path / "buffer"))
    rng = np.random.default_rng(12)
    short, long = rng.integers(0, cfg.vocab_size, size=(1, 4)), rng.integers(0, cfg.vocab_size, size=(1, 7))
    batch = np.concatenate([np.concatenate([np.zeros((1, 3), np.int64), short], 1), long])
    mask = np.array([[0, 0, 0, 1, 1, 1, 1], [1] * 7])
    res = generate(sess, batch, max_new_tokens=6, attention_mask=mask)
    alone = [generate(sess, row, max_new_tokens=6).tokens[0] for row in (short, long)]
    assert np.array_equal(res.tokens, np.stack(alone))
    # windows: refused with one line, nothing written
    wcfg = tiny_config(sliding_window=4, use_sliding_window=True, layer_types=["sliding_attention", "full_attention"])
    Qwen3VHAForCausalLM(wcfg).save_pretrained(str(tmp_path / "wvha"))
    fold_checkpoint(plan_fold(str(tmp_path / "wvha"), str(tmp_path / "wgqa")), progress=False)
    with pytest.raises(ExportError, match="the buffer flavour .* is not offered for sliding-window layers"):
        export_onnx(str(tmp_path / "wgqa"), str(tmp_path / "wout"), cache_io="buffer")
    assert not (tmp_path / "wout").exists()


def test_validation_bound_scales_with_the_logits(tmp_path):
    """The self-validation's bound is per unit of logit: a model whose logits reach the hundreds (its embedding and
    head scaled up, as a real model's reach tens) exports, while its float32 rounding already exceeds a fixed 1e-4;
    the bound, the logit scale and the difference are recorded in export_info.json."""
    paddle.seed(11)
    cfg = Qwen3Config(**dict(TINY, num_hidden_layers=4, tie_word_embeddings=False))
    model = Qwen3ForCausalLM(cfg)
    for n, p in model.named_parameters():
        if n.endswith("lm_head.weight") or n.endswith("embed_tokens.weight"):
            p.set_value(paddle.randn(p.shape) * 40.0)
    model.save_pretrained(str(tmp_path / "in"))
    val = export_onnx(str(tmp_path / "in"), str(tmp_path / "out"), decode_steps=4, log=print)
    info = json.load(open(tmp_path / "out" / "export_info.json"))["validation"]
    print(f"max |logit| {val.logit_scale:.1f}, max abs diff {val.max_abs:.2e}, bound {val.bound(1e-4):.2e}")
    assert val.logit_scale > 100 and val.max_abs > 1e-4  # a fixed 1e-4 would have refused this export
    assert val.max_abs <= val.bound(1e-4) and val.tokens_match
    assert info["bound"] == pytest.approx(1e-4 * val.logit_scale) and info["logit_scale"] == val.logit_scale
