"""tools/export_onnx.py --attention-op fused (paddle_vha/export/fused_attention.py): every layer's attention chain
becomes one node of paddle-vha's onnxruntime library, over the float32 and the int8 cache; the fused graph's logits
are the stock graph's (float32 cache: within float32 rounding; int8: the float64 attention of the dequantized cache
is what both approximate, the fused one closer) and its greedy tokens identical over many steps, with left padding in
a batch, in both cache flavours (the buffer flavour's node also takes the step's new entries); the folder records the
op and ships the library, genai loads it, and a session that cannot get the library says so in one line."""
import json
import os

import numpy as np
import onnx
import pytest

from test_export_kv_cache import _checkpoint

from paddle_vha.export.onnx_export import export_onnx
from paddle_vha.serve.generate import generate
from paddle_vha.serve.ort_session import OrtDecoder
from paddle_vha.serve.session import ServeError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused")
    model = _checkpoint(root / "ckpt")
    out = {}
    for io in ("concat", "buffer"):
        for kv in ("fp32", "int8"):
            for op in ("stock", "fused"):
                log = []
                folder = str(root / f"{io}-{kv}-{op}")
                export_onnx(str(root / "ckpt"), folder, cache_io=io, kv_cache=kv, attention_op=op, decode_steps=4,
                            log=log.append)
                print("\n".join(log))
                out[(kv, op)] = out.get((kv, op)) or folder  # the concat flavour's, for the tests below
                out[(io, kv, op)] = folder
    return dict(root=root, model=model, out=out)


@pytest.mark.parametrize("io", ["concat", "buffer"])
@pytest.mark.parametrize("kv", ["fp32", "int8"])
def test_fused_graph_holds_one_attention_node_per_layer(exports, kv, io):
    out = exports["out"][(io, kv, "fused")]
    info = json.load(open(os.path.join(out, "export_info.json")))
    graph = onnx.load(os.path.join(out, "model.onnx"), load_external_data=False).graph
    layers = exports["model"].config.num_hidden_layers
    fused = [n for n in graph.node if n.domain == "ai.paddle_vha"]
    print(info["attention_op"], sorted({n.op_type for n in graph.node}))
    want = "DecodeAttention" + ("Buffer" if io == "buffer" else "") + ("Int8" if kv == "int8" else "")
    assert len(fused) == layers and {n.op_type for n in fused} == {want}
    assert not any(n.op_type in ("Softmax", "MatMulIntegerToFloat") for n in graph.node)
    assert info["attention_op"]["op"] == "fused" and info["attention_op"]["library"] == "libpaddle_vha_ort_ops.so"
    assert os.path.isfile(os.path.join(out, "libpaddle_vha_ort_ops.so"))  # served without a compiler
    if kv == "fp32" and io == "concat":  # genai loads the library the config names (int8, buffer: not genai's)
        cfg = json.load(open(os.path.join(out, "genai_config.json")))
        assert cfg["model"]["decoder"]["session_options"]["custom_ops_library"] == "libpaddle_vha_ort_ops.so"
    else:
        assert not os.path.exists(os.path.join(out, "genai_config.json"))
    stock = json.load(open(os.path.join(exports["out"][(io, kv, "stock")], "export_info.json")))
    assert stock["attention_op"] == {"op": "stock"}


@pytest.mark.parametrize("io", ["concat", "buffer"])
@pytest.mark.parametrize("kv", ["fp32", "int8"])
def test_fused_logits_and_greedy_tokens_match_the_stock_graph(exports, kv, io):
    rng = np.random.default_rng(5)
    vocab = exports["model"].config.vocab_size
    prompt = rng.integers(0, vocab, (3, 11))
    mask = np.ones_like(prompt)
    mask[1, :4] = 0  # left padding in the batch
    runs = {}
    for op in ("stock", "fused"):
        s = OrtDecoder.from_dir(exports["out"][(io, kv, op)], threads=1)
        logits, _ = s.prefill(prompt, mask)
        runs[op] = (logits, generate(s, prompt, 48, attention_mask=mask).tokens)
    (ls, ts), (lf, tf) = runs["stock"], runs["fused"]
    err = float(np.abs(lf - ls).max() / np.abs(ls).max())
    same = float((ts == tf).mean())
    print(f"{io} {kv}: prefill logits max |fused - stock| / max |stock| {err:.2e}; greedy tokens equal {same:.3f}")
    if kv == "fp32":  # the same float32 attention: the same tokens
        assert err < 1e-5 and np.array_equal(ts, tf)
        return
    # int8: the stock graph multiplies 8-bit digits of the queries and probabilities (kv_cache.py), the fused op
    # dequantizes the cache exactly; a free-running greedy path parts at the first near-tie, so compare both on the
    # stock one's path (teacher-forced: prompt + its tokens in one prefill through the int8 present)
    seq = np.concatenate([prompt, ts], 1)
    full = np.concatenate([mask, np.ones_like(ts)], 1)
    a = OrtDecoder.from_dir(exports["out"][(io, kv, "stock")], threads=1).prefill(seq, full)[0]
    b = OrtDecoder.from_dir(exports["out"][(io, kv, "fused")], threads=1).prefill(seq, full)[0]
    f = OrtDecoder.from_dir(exports["out"][(io, "fp32", "stock")], threads=1).prefill(seq, full)[0]  # float cache
    live = full.astype(bool)
    err = float(np.abs(a - b)[live].max() / np.abs(a[live]).max())
    agree = float((a.argmax(-1) == b.argmax(-1))[live].mean())
    off = {k: float(np.abs(x - f)[live].mean()) for k, x in (("stock", a), ("fused", b))}
    print(f"int8, teacher-forced over {live.sum()} positions: logits {err:.2e}, argmax agreement {agree:.4f}; mean "
          f"|logit - float32 cache's|: stock {off['stock']:.3e}, fused {off['fused']:.3e}")
    assert err < 1e-2 and agree >= 0.97
    # exact dequantization: no farther from the float cache (the buffer flavour's prefill reads no int8 entry: both
    # are the float cache's there, up to float32 rounding)
    assert off["fused"] <= 1.05 * off["stock"] + 1e-5


def test_a_session_without_the_library_says_so_in_one_line(exports, monkeypatch, tmp_path):
    import shutil

    from paddle_vha.serve import ort_ops

    def unavailable():
        raise ort_ops.OrtOpsUnavailable("building paddle-vha's onnxruntime op library failed: g++: not found")

    bare = tmp_path / "bare"  # the folder without its copy of the library, on a machine that cannot build one
    shutil.copytree(exports["out"][("fp32", "fused")], bare)
    os.remove(bare / "libpaddle_vha_ort_ops.so")
    monkeypatch.setattr(ort_ops, "library_path", unavailable)
    with pytest.raises(ServeError, match="exported with --attention-op fused and needs paddle-vha's onnxruntime op "
                                         "library: building .* g\\+\\+: not found"):
        OrtDecoder.from_dir(str(bare))
    assert OrtDecoder.from_dir(exports["out"][("fp32", "fused")]) is not None  # its own copy needs no build
    import onnxruntime as ort

    with pytest.raises(Exception, match="DecodeAttention"):  # stock onnxruntime alone: its own refusal names the op
        ort.InferenceSession(os.path.join(exports["out"][("fp32", "fused")], "model.onnx"),
                             providers=["CPUExecutionProvider"])


@pytest.mark.slow
def test_onnxruntime_genai_runs_the_fused_export(exports, hf_python, tmp_path):
    """onnxruntime-genai 0.18 (side environment) loads the fused graph through genai_config.json's
    session_options.custom_ops_library: its greedy tokens are our session's on the same graph."""
    from test_clients import run_side

    code = """
    import json, sys
    import numpy as np
    import onnxruntime_genai as og
    model = og.Model(sys.argv[1])
    params = og.GeneratorParams(model)
    prompt = json.loads(sys.argv[2])
    params.set_search_options(max_length=len(prompt) + 24, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([prompt], np.int32))
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    print(json.dumps(out))
"""
    folder = exports["out"][("fp32", "fused")]
    prompt = [5, 17, 3, 88, 41, 2, 9, 60, 33, 21, 7]
    got = run_side(hf_python, tmp_path, code, folder, json.dumps(prompt))
    ours = generate(OrtDecoder.from_dir(folder), np.asarray([prompt]), 24, eos_token_id=-1).tokens[0].tolist()
    print("genai", got, "ours", ours)
    assert got == ours[:len(got)] and len(got) >= 1
