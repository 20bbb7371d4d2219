"""tools/export_onnx.py --kv-cache int8 (paddle_vha/export/kv_cache.py): the int8 cache's layout in the graph and the
export folder, its entries the per-token quantization of the float32 cache's, its attention the float64 oracle's over
the dequantized cache, the buffer flavour's in-place writes across a capacity growth, left padding, generation, the
quality gate (and a broken cache failing it), with int4 weights, and the refusals (16-bit caches, Paddle Inference,
sliding windows)."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import paddle
import pytest
from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

import oracle
from _utils import TINY, assert_clean_graph, break_key_scales, load_checkpoint_numpy, rel_err
from paddle_vha.export.errors import ExportError
from paddle_vha.export.kv_cache import INT8_LAYOUT, INT8_NAMES
from paddle_vha.export.onnx_export import export_onnx
from paddle_vha.serve.generate import generate
from paddle_vha.serve.ort_session import OrtDecoder
from paddle_vha.serve.session import CacheBuffers, ServeError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GQA2 = dict(TINY, num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False)


def _checkpoint(path, **overrides):
    """A stock Qwen3 (GQA-2) whose attention is peaked (q_norm / k_norm weights around 2.5) and whose logits are
    peaked (an embedding of scale 0.5), so a wrong cache moves the greedy choices."""
    paddle.seed(23)
    model = Qwen3ForCausalLM(Qwen3Config(**{**GQA2, **overrides}))
    for n, p in model.named_parameters():
        if n.endswith("q_norm.weight") or n.endswith("k_norm.weight"):
            p.set_value(paddle.uniform(p.shape, min=1.5, max=3.5))
        elif n.endswith("embed_tokens.weight") or n.endswith("lm_head.weight"):
            p.set_value(paddle.randn(p.shape) * 0.5)
    model.eval()
    model.save_pretrained(str(path))
    return model


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """{(flavour, cache): export folder}, and the checkpoint, model and config."""
    root = tmp_path_factory.mktemp("kv")
    model = _checkpoint(root / "ckpt")
    out, lines = {}, {}
    for io in ("buffer", "concat"):
        for kv in ("fp32", "int8"):
            log = []
            export_onnx(str(root / "ckpt"), str(root / f"{io}-{kv}"), cache_io=io, kv_cache=kv, decode_steps=4,
                        log=log.append)
            print("\n".join(log))
            out[(io, kv)], lines[(io, kv)] = str(root / f"{io}-{kv}"), log
    return dict(root=root, model=model, cfg=model.config, out=out, lines=lines)


def _dequantized(arrays, layers):
    """[(keys, values)] float64 in the oracle's layout (B, T, H_kv, d) from the int8 cache's tensors, in order."""
    past = []
    for i in range(layers):
        k8, ks, v8, vs = arrays[4 * i: 4 * i + 4]  # (B,H,T,d) uint8 (zero point 128), (B,H,T,1), int8, (B,H,T,1)
        past.append((((k8.astype(np.float64) - 128) * ks).transpose(0, 2, 1, 3),
                     (v8 * vs.astype(np.float64)).transpose(0, 2, 1, 3)))
    return past


def test_int8_export_folder_and_graph_layout(exports):
    cfg = exports["cfg"]
    for io in ("buffer", "concat"):
        out = exports["out"][(io, "int8")]
        info = json.load(open(os.path.join(out, "export_info.json")))
        kv = info["kv_cache"]
        print(io, {k: kv[k] for k in ("format", "bytes_per_position", "float32_bytes_per_position")}, kv["quality"])
        assert kv["format"] == "int8" and kv["names"] == list(INT8_NAMES)
        assert info["cache_names"] == [list(INT8_NAMES)] * cfg.num_hidden_layers
        # per position: 2 tensors x 2 KV heads x (16 int8 + a 4-byte scale) per layer
        assert kv["bytes_per_position"] == cfg.num_hidden_layers * 2 * 2 * (16 + 4)
        assert kv["float32_bytes_per_position"] == cfg.num_hidden_layers * 2 * 2 * 16 * 4
        assert kv["quality"]["mean_kl"] <= kv["bounds"][0] and kv["quality"]["agreement"] >= kv["bounds"][1]
        assert "MatMulIntegerToFloat" in info["ops"] and not os.path.exists(os.path.join(out, "genai_config.json"))
        assert any("genai_config.json not written: the int8 cache" in ln for ln in exports["lines"][(io, "int8")])
        assert os.path.isdir(os.path.join(out, "paddle"))
        model = onnx.load(os.path.join(out, "model.onnx"))
        onnx.checker.check_model(model)
        assert {n.domain for n in model.graph.node} <= {"", "ai.onnx", "com.microsoft"}
        assert {n.op_type for n in model.graph.node if n.domain == "com.microsoft"} == {"MatMulIntegerToFloat"}
        assert [i.name for i in model.graph.input] == info["inputs"]
        assert [o.name for o in model.graph.output] == info["outputs"]
        positions = {"buffer": ("capacity", "sequence"), "concat": ("past_sequence", "total_sequence")}[io]
        for vi, name in zip(model.graph.input[3:], [n for _ in range(cfg.num_hidden_layers) for n in INT8_NAMES]):
            dtype, layout = INT8_LAYOUT[name]
            t = vi.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in t.shape.dim]
            want = [{"batch": "batch", "kv_heads": 2, "head_dim": 16, "positions": positions[0]}.get(d, d)
                    for d in layout]
            assert vi.name.endswith("." + name) and dims == want, (vi.name, dims, want)
            assert t.elem_type == {"int8": onnx.TensorProto.INT8, "uint8": onnx.TensorProto.UINT8,
                                   "float32": onnx.TensorProto.FLOAT}[dtype]
        assert_clean_graph(os.path.join(out, "model.onnx"))


def test_int8_entries_are_the_float_cache_quantized_per_token(exports):
    """The int8 export's cache after a prefill is the fp32 export's, quantized per (token, KV head): scale = the
    largest |x| / 127, entries round(x / scale). The float entries are the same where the int8 graph's prefill
    attended in float32: every layer of the buffer flavour, the first of concat (its prefill attends to its present,
    quantized, so later layers' inputs move)."""
    cfg = exports["cfg"]
    ids = np.random.default_rng(4).integers(0, cfg.vocab_size, size=(3, 13))
    for io in ("buffer", "concat"):
        _, c32 = OrtDecoder.from_dir(exports["out"][(io, "fp32")]).prefill(ids)
        _, c8 = OrtDecoder.from_dir(exports["out"][(io, "int8")]).prefill(ids)
        f32 = c32.filled() if io == "buffer" else c32
        i8 = c8.filled() if io == "buffer" else c8
        for layer in range(cfg.num_hidden_layers if io == "buffer" else 1):
            k, v = f32[2 * layer], f32[2 * layer + 1]  # (B, H, T, d) float32
            k8, ks, v8, vs = i8[4 * layer: 4 * layer + 4]
            assert (k8.dtype, v8.dtype, k8.shape, vs.shape) == (np.uint8, np.int8, (3, 2, 13, 16), (3, 2, 13, 1))
            for x, q, s in ((k, k8.astype(np.int32) - 128, ks), (v, v8, vs)):
                want_scale = np.abs(x).max(-1, keepdims=True) / 127
                assert np.allclose(s, want_scale, rtol=1e-6), np.abs(s - want_scale).max()
                off = np.abs(q.astype(np.int32) - np.round(x / s)).max()  # ties may round either way
                err = np.abs(q * s.astype(np.float64) - x).max(-1) / s[..., 0]
                print(f"{io} layer {layer}: max |q - round(x / s)| {off}, max error / scale {err.max():.3f}")
                assert off <= 1 and err.max() <= 0.5 + 1e-3


def test_int8_attention_matches_float64_over_the_dequantized_cache(exports):
    """A decode step of the int8 export against the float64 oracle over the cache it holds (dequantized): what is
    left is its own arithmetic (queries in two 8-bit digits per row, probabilities in three: about float32's), and in
    the concat flavour the step's own token, which it attends to quantized and the oracle in float. Against the
    oracle over the float cache, the int8 cache's rounding (measured 1.6e-2 / 1.1e-2 relative)."""
    cfg = exports["cfg"]
    state, ocfg = load_checkpoint_numpy(exports["root"] / "ckpt"), dict(cfg.to_dict(), rope_theta=cfg.rope_theta)
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, size=(3, 29))  # B = 3, prime S
    _, past_f = oracle.stock_causal_lm(ids[:, :28], state, ocfg)
    exact, _ = oracle.stock_causal_lm(ids[:, 28:], state, ocfg, past=past_f)
    for io in ("buffer", "concat"):
        sess = OrtDecoder.from_dir(exports["out"][(io, "int8")])
        _, cache = sess.prefill(ids[:, :28])
        past = _dequantized(cache.filled() if io == "buffer" else cache, cfg.num_hidden_layers)
        step, _ = sess.step(ids[:, 28:], cache)
        ref, _ = oracle.stock_causal_lm(ids[:, 28:], state, ocfg, past=past)
        own = rel_err(step, ref, f"{io}: int8 step vs float64 over its dequantized cache")
        total = rel_err(step, exact, f"{io}: int8 step vs float64 over the float cache")
        # measured: buffer 4.1e-5, concat 1.1e-3 (its own token quantized); the cache's rounding 1.6e-2 / 1.1e-2
        assert own <= (1e-4 if io == "buffer" else 3e-3) and total <= 3e-2


def test_buffer_writes_in_place_across_a_capacity_growth(exports):
    """The int8 buffer flavour grown from 64 to 128 positions mid-generation gives what one allocated at 256 from the
    start gives (the growth copies each tensor along its positions axis, 2, as for the float32 cache); its entries are
    written in place; the concat flavour, which attends to its step's own tokens quantized
    where the buffer flavour attends to them in float32, stays close."""
    cfg = exports["cfg"]
    buffer, concat = (OrtDecoder.from_dir(exports["out"][(io, "int8")]) for io in ("buffer", "concat"))
    ids = np.random.default_rng(6).integers(0, cfg.vocab_size, size=(2, 60))
    a, ca = concat.prefill(ids)
    b, cb = buffer.prefill(ids)
    w, cw = buffer.run(ids, buffer.empty_cache(2, 256))
    assert isinstance(cb, CacheBuffers) and cb.capacity == 64 and cb.length == 60 and cw.capacity == 256
    assert [s.axis for s in cb.slots[:4]] == [2, 2, 2, 2]
    grown = float(np.abs(b - w).max())
    flavours = float(np.abs(a - b).max())
    for _ in range(8):
        nxt = b[:, -1].argmax(-1)[:, None]
        a, ca = concat.step(nxt, ca)
        b, cb = buffer.step(nxt, cb)
        w, cw = buffer.step(nxt, cw)
        grown, flavours = max(grown, float(np.abs(b - w).max())), max(flavours, float(np.abs(a - b).max()))
        assert all(np.array_equal(x, y) for x, y in zip(cb.filled(), cw.filled())), "the same entries in both"
    print(f"int8 buffer, grown vs allocated once: max abs logit diff {grown:.2e}; buffer vs concat flavour: "
          f"{flavours:.2e}; capacity {cb.capacity}")
    # the two flavours differ as either differs from the float32 cache (the gate's max abs logit difference)
    gate = max(json.load(open(os.path.join(exports["out"][(io, "int8")], "export_info.json")))["kv_cache"]["quality"][
        "max_abs"] for io in ("buffer", "concat"))
    assert cb.capacity == 128 and cb.length == 68 and cw.capacity == 256 and grown <= 1e-5 and flavours <= 2 * gate
    assert cb.nbytes == 68 * 2 * cfg.num_hidden_layers * 2 * 2 * (16 + 4)
    k8 = cb.buffers[0]  # layer 0's keys (B, H, capacity, d): positions 68.. untouched (zeros)
    assert k8.shape == (2, 2, 128, 16) and not k8[:, :, 68:].any() and k8[:, :, :68].all()


def test_generation_left_padding_and_the_generate_tool(exports, tmp_path):
    cfg = exports["cfg"]
    rng = np.random.default_rng(12)
    short, long = rng.integers(0, cfg.vocab_size, size=(1, 4)), rng.integers(0, cfg.vocab_size, size=(1, 7))
    batch = np.concatenate([np.concatenate([np.zeros((1, 3), np.int64), short], 1), long])
    mask = np.array([[0, 0, 0, 1, 1, 1, 1], [1] * 7])
    prompt = rng.integers(0, cfg.vocab_size, size=(2, 7))
    want, _ = exports["model"].generate(paddle.to_tensor(prompt), max_new_tokens=10, decode_strategy="greedy_search")
    for io in ("buffer", "concat"):
        sess = OrtDecoder.from_dir(exports["out"][(io, "int8")])
        res = generate(sess, batch, max_new_tokens=6, attention_mask=mask)
        alone = [generate(sess, row, max_new_tokens=6).tokens[0] for row in (short, long)]
        assert np.array_equal(res.tokens, np.stack(alone)), io
        got = generate(sess, prompt, 10).tokens
        print(io, "int8 cache greedy", got.tolist(), "PaddleFormers", want.numpy().tolist())
        assert (got == want.numpy()).mean() >= 0.9  # a peaked toy model: its greedy path survives int8
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "generate.py"), exports["out"][("buffer", "int8")],
                        "--prompt-ids", "1,2,3", "--max-new-tokens", "5"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-1000:]
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "generate.py"), exports["out"][("buffer", "int8")],
                        "--runtime", "paddle", "--prompt-ids", "1,2,3"], capture_output=True, text=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "int8" in lines[0] and "Paddle Inference" in lines[0], r.stderr


def test_paddle_inference_refuses_an_int8_cache_folder(exports):
    from paddle_vha.serve.paddle_inference import PaddleInferenceDecoder

    with pytest.raises(ServeError, match="keeps the KV cache in int8"):
        PaddleInferenceDecoder(exports["out"][("concat", "int8")])


@pytest.mark.parametrize("broken", ["dropped key scale", "value scales on the keys"])
def test_a_broken_cache_fails_the_quality_gate(exports, tmp_path, monkeypatch, broken):
    """The gate sees a cache whose attention drops the keys' scales, or reads the values' scales where the keys'
    belong (scales of the right shape on the wrong tensor): ExportError, nothing written."""
    from paddle_vha.export import kv_cache, onnx_export

    rewrite = kv_cache.quantize_cache

    def broken_rewrite(path, plan):
        info = rewrite(path, plan)
        model = onnx.load(path)
        assert break_key_scales(model, broken), "no key scales found in the rewritten graph"
        onnx.save(model, path)
        return info

    monkeypatch.setattr(onnx_export, "quantize_cache", broken_rewrite)
    out = tmp_path / "out"
    with pytest.raises(ExportError, match="quality check failed: the int8 KV cache") as e:
        export_onnx(str(exports["root"] / "ckpt"), str(out), cache_io="buffer", kv_cache="int8", decode_steps=2)
    print(broken, "->", e.value)
    assert not out.exists() and sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_quantized_weights_with_an_int8_cache(exports, tmp_path, weights):
    """The cache's rewrite after MatMulNBits' (its gate then measures the cache alone, on the quantized weights). The
    peaked toy model loses more to int4 weights than the export's int4 bound allows (KL 0.44): bounded at 1 nat here."""
    lines = []
    export_onnx(str(exports["root"] / "ckpt"), str(tmp_path / "q"), cache_io="buffer", weights=weights,
                kv_cache="int8", decode_steps=2, log=lines.append, quality_bounds=(1.0, 0.5))
    info = json.load(open(tmp_path / "q" / "export_info.json"))
    print("\n".join(lines))
    assert info["weights"]["format"] == weights and info["kv_cache"]["format"] == "int8"
    assert {"MatMulNBits", "MatMulIntegerToFloat"} <= set(info["ops"])
    sess = OrtDecoder.from_dir(str(tmp_path / "q"))
    res = generate(sess, np.array([[1, 2, 3]]), 6)
    assert res.tokens.shape == (1, 6)
    assert_clean_graph(str(tmp_path / "q" / "model.onnx"))


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "int4"])
def test_cli_refuses_other_cache_formats_before_anything(tmp_path, fmt):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_onnx.py"), str(tmp_path / "missing"),
                        str(out), "--kv-cache", fmt], capture_output=True, text=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and not out.exists(), r.stderr
    if fmt == "int4":  # not a choice at all: argparse's own usage error
        assert "invalid choice" in r.stderr
    else:
        assert len(lines) == 1 and "refused" in lines[0] and "float16" in lines[0], r.stderr


def test_sliding_window_and_shared_kv_are_refused(tmp_path):
    from paddle_vha.shared_kv.config import Qwen3SharedKVConfig
    from paddle_vha.shared_kv.modeling import Qwen3SharedKVForCausalLM

    paddle.seed(2)
    Qwen3ForCausalLM(Qwen3Config(**{**GQA2, "sliding_window": 4, "use_sliding_window": True,
                                    "layer_types": ["sliding_attention", "full_attention"]})).save_pretrained(
        str(tmp_path / "win"))
    Qwen3SharedKVForCausalLM(Qwen3SharedKVConfig(**GQA2)).save_pretrained(str(tmp_path / "skv"))
    for name, needle in (("win", "sliding-window layers"), ("skv", "not a key and a value")):
        with pytest.raises(ExportError, match=needle):
            export_onnx(str(tmp_path / name), str(tmp_path / f"{name}-out"), kv_cache="int8")
        assert not (tmp_path / f"{name}-out").exists()


def test_generate_sizes_the_int8_cache_for_its_memory_check(exports, capsys, monkeypatch):
    """tools/generate.py's up-front memory check counts the int8 cache's bytes (2 layers x 2 x 2 heads x (16 + 4) =
    160 a position, against float32's 512): with 8,000 bytes available, 23 positions of the float32 cache (11,776)
    are refused and the int8 cache's (3,680) run."""
    import paddle_vha.machine as machine
    from paddle_vha.cli.generate import main
    from paddle_vha.export.kv_cache import cache_bytes_per_position

    assert [cache_bytes_per_position(kv, [(2, 16)] * 2) for kv in ("int8", "fp32")] == [160, 512]
    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 8000)
    argv = ["--prompt-ids", "1,2,3", "--max-new-tokens", "20"]
    with pytest.raises(SystemExit) as e:
        main([exports["out"][("buffer", "fp32")], *argv])
    assert e.value.code == 2 and "KV cache" in capsys.readouterr().err
    assert main([exports["out"][("buffer", "int8")], *argv]) in (0, None)
