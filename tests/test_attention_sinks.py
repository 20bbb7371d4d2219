"""Attention sinks on sliding-window layers (window_attention_sinks; upstream's add_swa_attention_sink_bias): a learned
logit s_j per virtual head adds exp(s_j) to head j's softmax denominator and no value. Against the float64 oracle
(tests/oracle.py, written from that equation): the sink column on its own (eager and sdpa backends), the model with
prompts shorter and longer than the window, cached decode across the window edge, gradients, save / load, config."""
import numpy as np
import paddle
import pytest
from paddleformers.transformers.cache_utils import DynamicCache

import oracle
from _utils import config_dict, load_checkpoint_numpy, read_tensor_shapes, rel_err, tiny_config, to_numpy
from family_cases import WINDOW as W
from family_cases import WINDOW_LAYERS, attention_gradient_errors, greedy_by_full_forwards, make_vha_model
from family_cases import saved_state as on_disk
from paddle_vha import Qwen3VHAForCausalLM, VHAConfigError
from paddle_vha.qwen3.modeling import attention_core

SWA = dict(WINDOW_LAYERS, window_attention_sinks=True)

VARIANTS = {
    "plain": dict(),
    # odd head counts, r < d, window layers with their own r and R
    "odd-heads-r<d": dict(num_attention_heads=9, num_key_value_heads=3, vha_q_head_dim=12, vha_window_q_head_dim=5,
                          vha_window_postmix_rank=1),
    # window layers with their own head counts: one sink per window virtual head (6)
    "own-window-heads": dict(vha_window_num_attention_heads=6, vha_window_num_key_value_heads=3, vha_window_head_dim=8,
                             vha_window_rope_theta=500.0),
    # shared KV (one K = V projection), the gate and biases
    "shared-kv-gated-bias": dict(vha_shared_kv=True, vha_gated_attention=True, attention_bias=True),
    # no Premix (the fork's kv_postmix_only)
    "premix-off": dict(vha_premix=False),
}


def make_model(name, attn="eager", **extra):
    return make_vha_model({**SWA, **VARIANTS[name], **extra}, attn)


class _Core:
    """What attention_core reads from a layer."""

    def __init__(self, attn, groups):
        from types import SimpleNamespace

        self.config = SimpleNamespace(_attn_implementation=attn)
        self.num_key_value_groups, self.training, self.attention_dropout, self.scaling = groups, False, 0.0, 0.25


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("B,S,T", [(1, 1, 1), (2, 1, 6), (3, 5, 5), (2, 3, 7)])
def test_sink_column_is_the_sink_equation(attn, B, S, T):
    """attention_core with sinks vs softmax_with_sink in float64 numpy: the extra key column is exact (S = 1 decode,
    S = T prefill, S < T chunked over a cache), with the causal mask built when none is given and with a window mask.
    Float64 in; the eager backend's softmax is float32 (PaddleFormers'), sdpa's float64."""
    paddle.set_default_dtype("float64")
    try:
        H, H_kv, d = 4, 2, 16
        q, k, v = paddle.randn([B, H, S, d]), paddle.randn([B, H_kv, T, d]), paddle.randn([B, H_kv, T, d])
        sinks = paddle.randn([H]) * 2
        pos = np.arange(T - S, T)[:, None]
        for window in (None, 3):
            hidden = np.arange(T)[None, :] > pos
            if window:
                hidden |= np.arange(T)[None, :] <= pos - window
            mask = None if window is None else paddle.to_tensor(np.where(hidden, -np.inf, 0.0)[None, None])
            out, _ = attention_core(_Core(attn, H // H_kv), q, k, v, mask, None, sinks)
            got = to_numpy(out).reshape(B, S, H, d)
            qn, kn, vn, sn = (to_numpy(t) for t in (q, k, v, sinks))
            ref = np.empty((B, S, H, d))
            for j in range(H):
                scores = np.einsum("bsd,btd->bst", qn[:, j], kn[:, j // 2]) * 0.25
                w = oracle.softmax_with_sink(np.where(hidden, -np.inf, scores), sn[j])
                ref[:, :, j] = np.einsum("bst,btd->bsd", w, vn[:, j // 2])
            tol = 1e-6 if attn == "eager" else 1e-12  # PaddleFormers' eager backend takes its softmax in float32
            assert rel_err(got, ref, f"{attn} B={B} S={S} T={T} window={window}: sink column vs equation") <= tol
    finally:
        paddle.set_default_dtype("float32")


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_model_matches_oracle_and_the_sinks_count(tmp_path, name, attn):
    cfg, model = make_model(name, attn)
    model.save_pretrained(str(tmp_path))
    state, c = load_checkpoint_numpy(tmp_path), config_dict(cfg)
    for B, S in [(1, 1), (2, W - 1), (3, 13)]:  # S = 1, inside the window, a prime length well past it
        ids = np.random.randint(0, cfg.vocab_size, size=(B, S))
        got = to_numpy(model(paddle.to_tensor(ids), return_dict=True).logits)
        ref, _ = oracle.causal_lm(ids, state, c)
        assert rel_err(got, ref, f"{name} {attn} B={B} S={S}: fp32 vs float64 oracle") <= 1e-5
    no_sinks = {n: t for n, t in state.items() if not n.endswith(".sinks")}
    other, _ = oracle.causal_lm(ids, no_sinks, c)
    gap = np.abs(other - ref).max() / np.abs(ref).max()
    print(f"{name}: the same tensors without sinks differ by {gap:.3e} (relative)")
    assert gap > 1e-2


@pytest.mark.parametrize("name", ["plain", "own-window-heads"])
def test_sinks_on_disk_per_window_virtual_head_and_round_trip(tmp_path, name):
    cfg, model = make_model(name)
    model.save_pretrained(str(tmp_path))
    shapes = read_tensor_shapes(str(tmp_path))
    sinks = {n: s for n, s in shapes.items() if n.endswith("self_attn.sinks")}
    assert sinks == {f"model.layers.{i}.self_attn.sinks": (cfg.layer_dims(i).num_heads,) for i in (0, 2)}, sinks
    loaded = Qwen3VHAForCausalLM.from_pretrained(str(tmp_path))
    loaded.eval()
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 9)))
    assert np.array_equal(to_numpy(loaded(ids, return_dict=True).logits), to_numpy(model(ids, return_dict=True).logits))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["plain", "own-window-heads", "shared-kv-gated-bias"])
def test_cached_decode_across_the_window(name, attn):
    """A 3-token prompt, a 2-token chunk, then one token at a time past the window's edge (the sliding cache keeps
    W - 1 positions): every step against the oracle's full forward."""
    cfg, model = make_model(name, attn)
    B, n = 2, 11
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(B, n)))
    ref, _ = oracle.causal_lm(ids.numpy(), on_disk(model), config_dict(cfg))
    cache = DynamicCache(config=cfg)
    for a, b in [(0, 3), (3, 5)] + [(t, t + 1) for t in range(5, n)]:
        pos = paddle.arange(a, b, dtype="int64").expand([B, b - a])
        out = model(ids[:, a:b], position_ids=pos, past_key_values=cache, use_cache=True, return_dict=True)
        cache = out.past_key_values
        assert rel_err(to_numpy(out.logits), ref[:, a:b], f"{name} {attn}: cached {a}:{b} vs oracle") <= 1e-5
    assert [int(layer.keys.shape[2]) for layer in cache.layers] == [W - 1, n, W - 1]


def test_generate_matches_full_forwards():
    cfg, model = make_model("odd-heads-r<d")
    prompt = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 5)))
    gen, _ = model.generate(prompt, max_new_tokens=8, decode_strategy="greedy_search", use_cache=True)
    assert np.array_equal(gen.numpy(), greedy_by_full_forwards(model, prompt, 8))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["plain", "shared-kv-gated-bias"])
def test_gradients_match_oracle_finite_differences(name, attn):
    """fp32 autograd through the whole model (the sinks included) vs central differences of the float64 oracle, one
    random direction per attention tensor."""
    cfg, model = make_model(name, attn)
    errors = attention_gradient_errors(model, cfg, np.random.randint(0, cfg.vocab_size, size=(2, 7)))
    assert sum(n.endswith(".sinks") for n in errors) == 2
    worst = max(errors.values())
    assert worst <= 2e-4, {n: e for n, e in errors.items() if e > 2e-4}
    print(f"{name} {attn}: worst attention-gradient rel err {worst:.2e}")


def test_config_field_and_refusals():
    cfg = tiny_config(**SWA)
    assert [cfg.has_sinks(i) for i in range(3)] == [True, False, True]
    assert tiny_config(**{**SWA, "window_attention_sinks": False}).has_sinks(0) is False
    with pytest.raises(VHAConfigError, match="window_attention_sinks is set but no layer is a sliding-window layer"):
        tiny_config(window_attention_sinks=True)
    with pytest.raises(VHAConfigError, match="window_attention_sinks must be a bool"):
        tiny_config(**{**SWA, "window_attention_sinks": "yes"})
    with pytest.raises(VHAConfigError, match="softmax_type='learnable': a sink on every layer"):
        tiny_config(**SWA, softmax_type="learnable")


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.parametrize("t", [2, 4])
def test_tensor_parallel_sinks_equal_one_process(tmp_path, t):
    """t = 2 (KV heads split) and t = 4 (replicated): the sinks split with the virtual heads; logits, loss, every
    gradient (the sinks' gathered), 3 optimizer steps and cached decode against the single-process model, fp32 and
    float64 (tests/tp/tp_worker.py, cases window-sinks*; the checks of tests/test_tensor_parallel.py)."""
    from test_tensor_parallel import check_tp_results, launch

    cases = ["window-sinks", "window-sinks-fp64"]
    results = launch(t, str(tmp_path), ",".join(cases))
    results.pop("out_dir", None)
    check_tp_results(t, cases, results)


# --- fold: Qwen3 with sinks --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def folded(tmp_path_factory):
    import os
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("sinks-fold")
    paddle.seed(31)
    cfg, model = make_model("odd-heads-r<d")
    model.save_pretrained(str(root / "vha"))
    r = subprocess.run([sys.executable, "tools/fold.py", str(root / "vha"), str(root / "folded"), "--verify", "2",
                        "--no-progress"], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(r.stdout, r.stderr[-1500:])
    assert r.returncode == 0, r.stderr[-2000:]
    return cfg, model, root, r.stdout


def test_fold_keeps_the_sinks_and_is_exact_in_float64(folded):
    from paddle_vha.families import family_of
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold

    cfg, model, root, stdout = folded
    notes = [ln for ln in stdout.splitlines() if "note: window_attention_sinks" in ln]
    assert len(notes) == 1 and "not stock Qwen3" in notes[0] and "qwen3_sinks" in notes[0], stdout
    verify = [ln for ln in stdout.splitlines() if ln.startswith("verify")]
    assert verify and verify[0].endswith("-> OK"), verify
    fam = family_of(str(root / "folded"))
    assert fam.model_type == "qwen3_sinks"
    folded_cfg = fam.validate(str(root / "folded"))
    assert folded_cfg.window_attention_sinks is True and folded_cfg.num_attention_heads == cfg.num_attention_heads
    fold_checkpoint(plan_fold(str(root / "vha"), str(root / "folded64"), dtype="float64"), progress=False)
    state_v, state_f = load_checkpoint_numpy(root / "vha"), load_checkpoint_numpy(root / "folded64")
    assert not any("vha_" in n for n in state_f)
    for i in (0, 2):  # one sink per folded (= virtual) head, copied
        n = f"model.layers.{i}.self_attn.sinks"
        assert np.array_equal(state_f[n], state_v[n]) and state_f[n].shape == (cfg.num_attention_heads,)
    c = config_dict(cfg)
    for B, S in [(1, 1), (2, 13), (3, 7)]:
        ids = np.random.randint(0, cfg.vocab_size, size=(B, S))
        ref, _ = oracle.causal_lm(ids, state_v, c)
        got, _ = oracle.stock_causal_lm(ids, state_f, c)
        assert rel_err(got, ref, f"B={B} S={S}: folded Qwen3-with-sinks vs VHA (float64 oracles)") <= 1e-10
    # the folded model in Paddle (fp32) against the oracle of the folded float64 tensors
    loaded = fam.model_class.from_pretrained(str(root / "folded"))
    loaded.eval()
    ids = np.random.randint(0, cfg.vocab_size, size=(2, 11))
    got = to_numpy(loaded(paddle.to_tensor(ids), return_dict=True).logits)
    ref, _ = oracle.causal_lm(ids, state_v, c)
    assert rel_err(got, ref, "folded model (Paddle fp32) vs VHA oracle") <= 1e-5


def test_shared_kv_with_sinks_folds_into_qwen3_shared_kv_with_sinks_and_exports(tmp_path):
    """A shared-KV VHA with sinks folds into Qwen3 shared-KV keeping the sinks (exact in float64), whose export carries
    them: onnxruntime generates, past the window, what the VHA model generates."""
    from paddle_vha.export.onnx_export import export_onnx
    from paddle_vha.families import family_of
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold

    cfg, model = make_model("shared-kv-gated-bias", vha_gated_attention=False)
    model.save_pretrained(str(tmp_path / "vha"))
    plan = plan_fold(str(tmp_path / "vha"), str(tmp_path / "folded64"), dtype="float64")
    assert len(plan.notes) == 1 and "qwen3_shared_kv" in plan.notes[0] and "window_attention_sinks" in plan.notes[0]
    fold_checkpoint(plan, progress=False)
    fam = family_of(str(tmp_path / "folded64"))
    assert fam.model_type == "qwen3_shared_kv" and fam.validate(str(tmp_path / "folded64")).window_attention_sinks
    state_v, state_f = load_checkpoint_numpy(tmp_path / "vha"), load_checkpoint_numpy(tmp_path / "folded64")
    ids = np.random.randint(0, cfg.vocab_size, size=(2, 13))
    ref, _ = oracle.causal_lm(ids, state_v, config_dict(cfg))
    got, _ = oracle.stock_causal_lm(ids, state_f, config_dict(cfg))
    assert rel_err(got, ref, "folded shared-KV with sinks vs shared-KV VHA (float64 oracles)") <= 1e-10
    fold_checkpoint(plan_fold(str(tmp_path / "vha"), str(tmp_path / "folded")), progress=False)
    val = export_onnx(str(tmp_path / "folded"), str(tmp_path / "onnx"), log=print)
    assert val.max_abs <= 1e-4 and val.tokens_match
    model.eval()
    prompt = np.random.randint(0, cfg.vocab_size, size=(2, 6))
    want, _ = model.generate(paddle.to_tensor(prompt), max_new_tokens=10, decode_strategy="greedy_search",
                             use_cache=True)
    got = generate(OrtDecoder.from_dir(str(tmp_path / "onnx")), prompt, 10)
    assert np.array_equal(got.tokens, want.numpy())


# --- export: the sink in the ONNX graph ------------------------------------------------------------------------------

def test_export_carries_the_sinks_and_serves_like_paddleformers(folded):
    """The folded Qwen3-with-sinks checkpoint exported to ONNX (the sinks a graph constant of each window layer's
    softmax), validated against Paddle by the export itself; onnxruntime and Paddle Inference generate, past the
    window, what PaddleFormers-built Qwen3SinksForCausalLM generates (and the VHA model it was folded from); genai is
    refused naming the field."""
    import json
    import os

    import onnx

    from paddle_vha.export.onnx_export import export_onnx
    from paddle_vha.families import family_of
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.serve.paddle_inference import PaddleInferenceDecoder

    cfg, model, root, _ = folded
    logs = []
    val = export_onnx(str(root / "folded"), str(root / "onnx"), log=logs.append)
    print("\n".join(logs))
    print(f"export validation: max abs {val.max_abs:.3e}, tokens match {val.tokens_match}")
    assert val.max_abs <= 1e-4 and val.tokens_match
    genai = [ln for ln in logs if "genai_config.json not written" in ln]
    assert len(genai) == 1 and "window_attention_sinks" in genai[0], logs
    assert not os.path.exists(os.path.join(root, "onnx", "genai_config.json"))
    info = json.load(open(os.path.join(root, "onnx", "export_info.json")))
    assert info["model_type"] == "qwen3_sinks"
    graph = onnx.load(os.path.join(root, "onnx", "model.onnx"), load_external_data=False).graph
    sinks = np.asarray(load_checkpoint_numpy(root / "folded")["model.layers.0.self_attn.sinks"], np.float32)
    consts = [onnx.numpy_helper.to_array(t) for t in graph.initializer if list(t.dims) == [cfg.num_attention_heads]]
    assert any(np.array_equal(c, sinks) for c in consts), "layer 0's sinks are a constant of the graph"
    folded_model = family_of(str(root / "folded")).model_class.from_pretrained(str(root / "folded"))
    folded_model.eval()
    prompt = np.random.randint(0, cfg.vocab_size, size=(2, 6))
    want, _ = folded_model.generate(paddle.to_tensor(prompt), max_new_tokens=10, decode_strategy="greedy_search",
                                    use_cache=True)
    trained, _ = model.generate(paddle.to_tensor(prompt), max_new_tokens=10, decode_strategy="greedy_search",
                                use_cache=True)
    assert np.array_equal(want.numpy(), trained.numpy()), "the folded model generates what the VHA model does"
    for session in (OrtDecoder.from_dir(str(root / "onnx")), PaddleInferenceDecoder(str(root / "onnx"))):
        got = generate(session, prompt, 10)
        print(type(session).__name__, got.tokens.tolist())
        assert np.array_equal(got.tokens, want.numpy()), type(session).__name__
