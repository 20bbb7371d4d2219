"""Quantized exports (tools/export_onnx.py --weights int8 / int4): onnxruntime's MatMulNBitsQuantizer over the
validated float32 graph, its quality on held-out text bounded against the float32 graph's, q_norm / k_norm kept float
and used, the tied LM head quantized, fp16 / bf16 refused with the reason, a corrupted scale caught."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import paddle
import pytest
from onnx import numpy_helper
from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

from paddle_vha.export import onnx_export
from paddle_vha.export.errors import ExportError
from paddle_vha.export.onnx_export import export_onnx
from paddle_vha.export.quality import BOUNDS, check_quality, held_out_windows, measure_quality, teacher_forced_logits
from paddle_vha.serve.generate import generate
from paddle_vha.serve.ort_session import OrtDecoder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = 2
LINEARS = 7 * LAYERS + 1  # q, k, v, o, gate, up, down per layer, and the LM head
# what the quantized graph multiplies them by: q|k|v and gate|up merged (export/merge_matmuls.py), o, down, the head
QUANTIZED = 4 * LAYERS + 1
FUSED = dict(rotary_embedding=2 * LAYERS, skip_simplified_layer_norm=2 * LAYERS)  # q and k; the two residual adds


def make_checkpoint(path, tied=True):
    """A byte-vocabulary stock Qwen3 whose logits are peaked (so greedy choices are decisive) and whose q_norm /
    k_norm weights are far from 1 (so a graph that dropped or ignored them would show it)."""
    paddle.seed(7)
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      tie_word_embeddings=tied)
    model = Qwen3ForCausalLM(cfg)
    for n, p in model.named_parameters():
        if n.endswith("embed_tokens.weight") or n.endswith("lm_head.weight"):
            p.set_value(paddle.randn(p.shape) * 0.5)
        elif n.endswith("q_norm.weight") or n.endswith("k_norm.weight"):
            p.set_value(paddle.uniform(p.shape, min=0.3, max=2.0))
    model.save_pretrained(str(path))
    return model


def norm_weights(ckpt):
    from safetensors.numpy import load_file

    tensors = {}
    for f in os.listdir(ckpt):
        if f.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(ckpt, f)))
    return {k: v.astype(np.float32) for k, v in tensors.items() if "q_norm" in k or "k_norm" in k}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    make_checkpoint(root / "tied", tied=True)
    make_checkpoint(root / "untied", tied=False)
    return root


def _export(ckpt, out, weights, **kw):
    lines = []
    export_onnx(str(ckpt), str(out), decode_steps=4, log=lines.append, weights=weights, **kw)
    print("\n".join(lines))
    return lines, json.load(open(os.path.join(out, "export_info.json")))


def _norm_initializers(model):
    """{initializer name: array} of the float initializers read by a Mul that have the q/k-norm's width (16)."""
    inits = {t.name: t for t in model.graph.initializer}
    muls = {i for n in model.graph.node if n.op_type == "Mul" for i in n.input}
    return {k: numpy_helper.to_array(t) for k, t in inits.items()
            if k in muls and t.data_type == onnx.TensorProto.FLOAT and list(t.dims) == [16]}


@pytest.mark.parametrize("case", [("int8", "tied", "concat", False), ("int4", "untied", "buffer", True)],
                         ids=["int8-tied-concat", "int4-untied-buffer-external"])
def test_quantized_export_keeps_norms_and_quantizes_every_linear(ckpts, tmp_path, case):
    from paddle_vha.export.quantize import DEFAULT_BLOCK, DEFAULT_RECIPE

    weights, tie, cache, external = case
    out = tmp_path / "onnx"
    lines, info = _export(ckpts / tie, out, weights, cache_io=cache, external_data=external)
    q = info["weights"]
    line = next(ln for ln in lines if ln.startswith("quality:"))
    assert q["format"] == weights and q["bits"] == int(weights[3:]) and q["block_size"] == DEFAULT_BLOCK[weights]
    assert q["recipe"] == DEFAULT_RECIPE[weights] and q["lm_head"] == weights and q["accuracy_level"] == 4
    assert q["tied_head_untied"] is (tie == "tied")
    # the default int4 rule puts v_proj, down_proj, the last two layers' up_proj (here: both) and the head in 8 bits:
    # v_proj then leaves the q|k|v merge, up_proj the gate|up one
    mixed = weights == "int4"
    assert q["quantized_matmuls"] == QUANTIZED + (2 * LAYERS if mixed else 0) and q["float_matmuls"] == 0, q
    assert q["quantized_matmuls_by_bits"] == ({"4": 3 * LAYERS, "8": 3 * LAYERS + 1} if mixed else {"8": QUANTIZED})
    assert q["merged_matmul_groups"] == (1 if mixed else 2) * LAYERS, q
    # the embedding is quantized too: one table with the tied head (the head's bits), its own for an untied model
    bits = 8 if (tie == "tied" or not mixed) else 4
    assert q["embedding"] == dict(bits=bits, block_size=64 if mixed and bits == 8 else DEFAULT_BLOCK[weights],
                                  shared_with_lm_head=tie == "tied", op="GatherBlockQuantized"), q["embedding"]
    assert "paddle" not in os.listdir(out) and info["paddle_program"] is None  # not asked for
    assert q["fused"] == FUSED, q
    assert os.path.isfile(out / "model.onnx.data") is external and info["external_data"] == (
        "model.onnx.data" if external else None)
    assert "MatMulNBits" in info["ops"] and info["cache_io"] == cache
    model = onnx.load(str(out / "model.onnx"))
    contrib = {(n.domain, n.op_type) for n in model.graph.node if n.domain not in ("", "ai.onnx")}
    assert contrib == {("com.microsoft", op) for op in ("MatMulNBits", "GatherBlockQuantized", "RotaryEmbedding",
                                                         "SkipSimplifiedLayerNormalization")}, contrib
    # q_norm / k_norm: present in the quantized graph, float32, the checkpoint's values, read by a Mul
    want = norm_weights(ckpts / tie)
    got = list(_norm_initializers(model).values())
    print(f"{len(want)} q/k-norm weights in the checkpoint, {len(got)} width-16 float Mul constants in the graph")
    for name, w in want.items():
        assert any(np.array_equal(w, g) for g in got), f"{name} is not in the quantized graph as it is"
    # the quality the export printed is within the format's bounds, and it is what export_info records
    assert info["weights"]["quality"]["mean_kl"] <= BOUNDS[weights][0], line
    assert info["weights"]["quality"]["decisive"] > 0 and info["weights"]["quality"]["agreement"] >= BOUNDS[weights][1]
    # our serving session runs it; genai_config.json is written for the concat flavour
    sess = OrtDecoder.from_dir(str(out))
    res = generate(sess, np.asarray([list(b"def fib(n):")]), 8, eos_token_id=-1)
    print("greedy on the quantized export:", res.tokens.tolist())
    assert res.tokens.shape == (1, 8) and 0 <= res.tokens.min() and res.tokens.max() < 256
    assert os.path.isfile(out / "genai_config.json") is (cache == "concat")


def _corrupt_scale(onnx_path, factor=4.0, which=0):
    """Multiply the scales of the `which`-th MatMulNBits by `factor`, in the file (inline weights)."""
    model = onnx.load(onnx_path)
    node = [n for n in model.graph.node if n.op_type == "MatMulNBits"][which]
    for t in model.graph.initializer:
        if t.name == node.input[2]:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(factor), t.name))
    onnx.save(model, onnx_path)
    return node.name


def test_a_corrupted_scale_fails_the_export(ckpts, tmp_path, monkeypatch):
    """The export's own quality gate: the quantizer's output with one layer's scales off by 4x (o_proj of layer 0)
    is refused, and nothing is written."""
    real = onnx_export.quantize_graph

    def broken(path, *a, **k):
        info = real(path, *a, **k)
        print("corrupted", _corrupt_scale(path, 4.0, which=1))  # layer 0: q|k|v merged, then o_proj
        return info

    monkeypatch.setattr(onnx_export, "quantize_graph", broken)
    with pytest.raises(ExportError, match="quality check failed") as e:
        _export(ckpts / "tied", tmp_path / "bad", "int8")
    print(e.value)
    assert not os.path.exists(tmp_path / "bad") and not [p for p in os.listdir(tmp_path) if "bad" in p]


def test_norms_are_used_and_a_wrong_scale_is_outside_the_bound(ckpts, tmp_path):
    """On one int4 export: its graph with q_norm / k_norm set to 1 (what a quantized path that dropped them computes),
    and with one scale off by 4x, each moves the logits by more than int4's KL bound; the graph as written does not
    move them at all (the measure itself is exact)."""
    out = tmp_path / "int4"
    _export(ckpts / "tied", out, "int4")
    ids, text = held_out_windows(str(ckpts / "tied"), 256)
    path = str(out / "model.onnx")
    ref = teacher_forced_logits(OrtDecoder.from_dir(str(out)), ids)
    same = measure_quality(ref, OrtDecoder.from_dir(str(out)), ids, text)
    print("unchanged:", same.line("int4"))
    assert same.mean_kl < 1e-9
    model = onnx.load(path)
    for t in model.graph.initializer:
        if t.name in _norm_initializers(model):
            t.CopyFrom(numpy_helper.from_array(np.ones(16, np.float32), t.name))
    onnx.save(model, str(tmp_path / "no_norm.onnx"))
    dropped = measure_quality(ref, OrtDecoder(str(tmp_path / "no_norm.onnx")), ids, text)
    print("q/k norms = 1:", dropped.line("int4"))
    with pytest.raises(ExportError, match="quality check failed"):
        check_quality(dropped, "int4")
    _corrupt_scale(path, 4.0, which=-1)  # the LM head's
    wrong = measure_quality(ref, OrtDecoder.from_dir(str(out)), ids, text)
    print("LM head scale x4:", wrong.line("int4"))
    with pytest.raises(ExportError, match="quality check failed"):
        check_quality(wrong, "int4")


@pytest.mark.parametrize("argv,words", [
    (["--weights", "fp16"], "no float16 MatMul"),
    (["--weights", "bf16"], "no bfloat16 kernels"),
    (["--weights", "int4", "--block-size", "48"], "Only block sizes 16, 32, 64, 128, 256"),
    (["--block-size", "32"], "takes effect with --weights int8 / int4"),
])
def test_refusals_are_one_line_and_write_nothing(ckpts, tmp_path, argv, words):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_onnx.py"), str(ckpts / "tied"), str(out),
                        *argv], capture_output=True, text=True, cwd=ROOT, timeout=300)
    print(r.stderr)
    assert r.returncode != 0 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
def test_int4_at_qwen3_0_6b_widths(tmp_path):
    """2 layers at Qwen3-0.6B widths as a hub download looks (tied head, 151,936-token BPE tokenizer, head_dim 128):
    the int4 export in the buffer flavour with external data; every Linear and the tied head quantized, q/k norms the
    checkpoint's values in float32, quality on held-out text tokenized by the checkpoint's own tokenizer, and our
    session generates from it."""
    from tools.fixtures.qwen3_shaped import make_checkpoint as shaped

    ckpt, out = tmp_path / "ckpt", tmp_path / "int4"
    shaped(str(ckpt), "0.6b", layers=2)
    lines, info = _export(ckpt, out, "int4", cache_io="buffer", external_data=True)
    q = info["weights"]
    assert q["quantized_matmuls"] == QUANTIZED + 2 * LAYERS and q["tied_head_untied"] and q["lm_head"] == "int4", q
    assert q["embedding"]["shared_with_lm_head"] and q["embedding"]["bits"] == 8, q  # the head's 8 bits (default rule)
    assert q["fused"] == FUSED and q["max_positions"] == 40960, q
    assert "checkpoint's tokenizer" in q["quality"]["text"] and q["quality"]["mean_kl"] <= BOUNDS["int4"][0]
    assert os.path.getsize(out / "model.onnx.data") > 100e6 and info["cache_io"] == "buffer"
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    muls = {i for n in model.graph.node if n.op_type == "Mul" for i in n.input}
    norms = [t for t in model.graph.initializer if t.name in muls and list(t.dims) == [128]]
    print(f"{len(norms)} width-128 Mul constants (q_norm / k_norm of 2 layers) in the int4 graph")
    assert len(norms) >= 2 * LAYERS and all(t.data_type == onnx.TensorProto.FLOAT for t in norms)
    sess = OrtDecoder.from_dir(str(out))
    res = generate(sess, np.asarray([[9707, 11, 1879]]), 4, eos_token_id=-1)
    print("int4 greedy:", res.tokens.tolist(), f"{res.tokens_per_second:.1f} tokens/s")
    assert res.tokens.shape == (1, 4)


def _two_matmuls(k=80, n1=48, n2=40):
    """X (B, k) @ W1 (k, n1) @ W2 (n1, n2): K = 80 is not a multiple of 32 (the quantizer pads the last block)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(5)
    w1, w2 = rng.standard_normal((k, n1)).astype(np.float32), rng.standard_normal((n1, n2)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"),
         helper.make_node("MatMul", ["h", "w2"], ["logits"], name="second")], "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", k])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", n2])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("weights,block,chunk", [("int8", 32, None), ("int4", 16, None), ("int4", 128, 3 * 80 * 4)])
def test_node_by_node_quantization_is_the_quantizers(tmp_path, monkeypatch, weights, block, chunk):
    """export/quantize.quantize_matmuls (each weight read from the data file alone, quantized in a graph of its own)
    writes what onnxruntime's MatMulNBitsQuantizer.process writes over the whole graph in memory: the same nodes and
    attributes, the same packed blocks and scales byte for byte, the same outputs in onnxruntime; also when a weight
    is quantized 3 columns at a time (the LM head's way)."""
    import onnxruntime as ort
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from paddle_vha.export.lazy_weights import LazyWeights
    from paddle_vha.export.node_edit import drop_unread_initializers
    from paddle_vha.export import quantize
    from paddle_vha.export.quantize import ACCURACY_LEVEL, BITS, node_quantizer, quantize_matmuls

    if chunk:
        monkeypatch.setattr(quantize, "CHUNK_BYTES", chunk)

    ref = MatMulNBitsQuantizer(_two_matmuls(), bits=BITS[weights], block_size=block, is_symmetric=True,
                               accuracy_level=ACCURACY_LEVEL)
    ref.process()
    ref = ref.model.model
    onnx.save_model(_two_matmuls(), str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data",
                    size_threshold=0)
    ours = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    store = LazyWeights(ours, str(tmp_path))
    assert len(quantize_matmuls(ours, store, node_quantizer(weights, block))) == 2
    drop_unread_initializers(ours.graph)
    store.materialize()
    node = lambda n: (n.op_type, n.domain, list(n.input), list(n.output), sorted(  # noqa: E731
        (a.name, onnx.helper.get_attribute_value(a)) for a in n.attribute))
    assert [node(n) for n in ours.graph.node] == [node(n) for n in ref.graph.node]
    got = {t.name: numpy_helper.to_array(t) for t in ours.graph.initializer}
    want = {t.name: numpy_helper.to_array(t) for t in ref.graph.initializer}
    assert sorted(got) == sorted(want), sorted(got)
    assert all(got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]) for k in want)
    assert {(o.domain, o.version) for o in ours.opset_import} >= {("com.microsoft", 1)}
    x = np.random.default_rng(6).standard_normal((3, 80)).astype(np.float32)
    run = lambda m: ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]  # noqa: E731
    a, b = run(ours), run(ref)
    print(f"{weights} block {block}: {len(got)} initializers identical; outputs max abs diff {np.abs(a - b).max():.1e}")
    assert np.array_equal(a, b)


def test_block_sizes_are_the_quantizers_and_refused_before_any_work(ckpts, tmp_path):
    """--block-size is tried on onnxruntime's own block quantizer up front: 4096 (a power of two >= 16, which the old
    check passed) is refused in one line in seconds, before the float32 export (it died inside MatMulNBitsQuantizer
    after building and validating the whole export: minutes at 1.7B). BLOCK_SIZES, the help's list, is what the
    backend takes."""
    import time

    out = tmp_path / "out"
    start = time.time()
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_onnx.py"), str(ckpts / "tied"), str(out),
                        "--weights", "int4", "--block-size", "4096"], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    print(f"{time.time() - start:.1f} s, rc {r.returncode}: {r.stderr.strip()[-600:]}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "--block-size 4096" in r.stderr and "Only block sizes 16, 32, 64, 128, 256" in r.stderr
    assert "exported" not in r.stdout and not out.exists() and sorted(os.listdir(tmp_path)) == []

    from paddle_vha.export.quantize import BLOCK_SIZES, check_weights

    took = {}
    for b in (8, 16, 32, 48, 64, 128, 256, 512, 4096):
        try:
            check_weights("int4", b)
            took[b] = True
        except ExportError as e:
            took[b] = False
            assert "Only block sizes" in str(e) and "\n" not in str(e), e
    print(took)
    assert sorted(b for b, ok in took.items() if ok) == list(BLOCK_SIZES)


@pytest.mark.parametrize("positions", [32, 8])
def test_quantized_export_of_a_short_context_model(tmp_path, positions):
    """A checkpoint serving fewer positions than the quality check's 48-token windows: the windows shrink to its
    positions (it crashed in onnxruntime's fused rotary: position 32 out of range, and at 8 'Updating cos_cache ...
    not supported'); the float32 export of it always worked."""
    from hostile import edit_config

    make_checkpoint(tmp_path / "ckpt")
    edit_config(str(tmp_path / "ckpt"), max_position_embeddings=positions)
    _, info = _export(tmp_path / "ckpt", tmp_path / "out", "int8")
    q = info["weights"]["quality"]
    assert q["positions"] == 2 * min(48, positions) and info["max_position_embeddings"] == positions, q
    assert q["mean_kl"] <= BOUNDS["int8"][0]


def test_the_quality_gate_can_be_passed_knowingly(ckpts, tmp_path, monkeypatch, capsys):
    """An export the gate refuses (one o_proj's scales x 4, as above) passes with --max-kl / --min-agreement naming
    the bounds; the quality line says so, and export_info.json records the bounds used and who set them. Without
    them the refusal names the options."""
    from paddle_vha.cli.export_onnx import main

    real = onnx_export.quantize_graph

    def broken(path, *a, **k):
        info = real(path, *a, **k)
        _corrupt_scale(path, 4.0, which=1)
        return info

    monkeypatch.setattr(onnx_export, "quantize_graph", broken)
    base = [str(ckpts / "tied"), str(tmp_path / "out"), "--weights", "int8", "--decode-steps", "2"]
    with pytest.raises(SystemExit) as e:
        main(base)
    err = capsys.readouterr().err.strip().splitlines()
    print(err[-1])
    assert e.value.code == 2 and "quality check failed" in err[-1] and "--max-kl" in err[-1]
    assert not (tmp_path / "out").exists()
    assert main(base + ["--max-kl", "100", "--min-agreement", "0"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("quality:"))
    print(line)
    assert "accepted knowingly: --max-kl 100 and --min-agreement 0 replace the int8 gate's bounds" in line
    w = json.load(open(tmp_path / "out" / "export_info.json"))["weights"]
    assert w["bounds"] == [100.0, 0.0] and "--max-kl 100" in w["bounds_set_by_user"]
    assert w["quality"]["mean_kl"] > BOUNDS["int8"][0]


def test_one_block_size_recommendation_and_the_default_follows_it():
    """docs/deploy.md states one block-size recommendation, and the export's default, its --help and README follow
    it (the flag defaulted to 32, deploy.md's table called 32 "the smallest quality cost", README promoted 128)."""
    import re

    from paddle_vha.cli.export_onnx import build_parser
    from paddle_vha.export.quantize import DEFAULT_BLOCK

    docs = open(os.path.join(ROOT, "docs", "deploy.md"), encoding="utf-8").read()
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    said = re.findall(r"\*\*The block size: (\d+), the export's default\*\*", docs)
    print("recommended:", said, "default:", DEFAULT_BLOCK)
    assert said == [str(DEFAULT_BLOCK["int4"])] and DEFAULT_BLOCK["int8"] == DEFAULT_BLOCK["int4"]
    assert "int4 at the smallest quality cost" not in docs
    assert f"default {DEFAULT_BLOCK['int4']}" in " ".join(build_parser().format_help().split())
    assert re.findall(r"the int4 default \(block (\d+)", readme) == [str(DEFAULT_BLOCK["int4"])]


@pytest.mark.parametrize("tied", ["tied", "untied"])
def test_calibration_skips_the_head_product_and_measures_the_same(ckpts, tmp_path, monkeypatch, tied):
    """The calibration probe gives the LM head a (K, 1) stand-in weight (its (B, S, V) product was most of the time at
    a 151,936-token vocabulary): every activation statistic, the head's own input included, is the one the whole graph
    gives, and the probe's logits are one column wide."""
    from paddle_vha.export import calibration

    out = tmp_path / "fp32"
    _export(ckpts / tied, out, "fp32")
    ids = np.random.default_rng(3).integers(0, 200, (3, 17))
    seen = []
    real_stub = calibration._stub_head

    def spy(graph):
        real_stub(graph)
        seen.append([t for t in graph.initializer if t.name.endswith(".calibration_stub")])

    monkeypatch.setattr(calibration, "_stub_head", spy)
    stubbed = calibration.activation_importance(str(out / "model.onnx"), ids, [None] * 2, "concat")
    monkeypatch.setattr(calibration, "_stub_head", lambda graph: None)
    whole = calibration.activation_importance(str(out / "model.onnx"), ids, [None] * 2, "concat")
    assert len(seen) == 1 and len(seen[0]) == 1 and list(seen[0][0].dims)[1] == 1, seen
    assert set(stubbed) == set(whole) and len(whole) >= 5
    for name in whole:
        np.testing.assert_array_equal(stubbed[name], whole[name], err_msg=name)
    print(f"{tied}: {len(whole)} activation statistics identical with the head stubbed ({seen[0][0].dims})")
