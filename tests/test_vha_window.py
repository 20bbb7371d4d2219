"""Sliding-window layers in Qwen3-VHA (layer_types + sliding_window, optionally with their own r, R, head counts, head
width and RoPE base, upstream's swa_* options): against the float64 oracle (tests/oracle.py, from the equations), with
prompts shorter and longer than the window, cached decode across the window edge, gradients, save / load, fold."""
import json

import numpy as np
import paddle
import pytest
from paddleformers.transformers.cache_utils import DynamicCache

import oracle
from _utils import assert_clean_graph, config_dict, load_checkpoint_numpy, read_tensor_shapes, rel_err, tiny_config
from _utils import to_numpy
from family_cases import WINDOW as W
from family_cases import WINDOW_LAYERS as SWA
from family_cases import attention_gradient_errors, greedy_by_full_forwards, make_vha_model
from family_cases import saved_state as paddle_state
from paddle_vha import Qwen3VHAForCausalLM, VHAConfigError

VARIANTS = {
    # window layers with the full layers' sizes
    "plain": dict(),
    # their own r and R (both fold away), odd head counts (H_v 9 over 3 KV heads), r < d
    "own-r-R-odd-heads": dict(num_attention_heads=9, num_key_value_heads=3, vha_q_head_dim=12,
                              vha_window_q_head_dim=5, vha_window_postmix_rank=1),
    # their own head counts, head width and RoPE base (trainable; no stock-Qwen3 form)
    "own-heads-width-theta": dict(vha_window_num_attention_heads=6, vha_window_num_key_value_heads=3,
                                  vha_window_head_dim=8, vha_window_rope_theta=500.0),
    # with the gate and biases, and shared KV on every layer
    "gated-bias-shared-kv": dict(vha_gated_attention=True, attention_bias=True, vha_shared_kv=True),
}


def make_model(name, attn="eager", **extra):
    return make_vha_model({**SWA, **VARIANTS[name], **extra}, attn)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_model_matches_oracle_shorter_and_longer_than_the_window(tmp_path, name, attn):
    cfg, model = make_model(name, attn)
    model.save_pretrained(str(tmp_path))
    state, c = load_checkpoint_numpy(tmp_path), config_dict(cfg)
    for B, S in [(1, 1), (2, W - 1), (3, 13)]:  # S = 1, inside the window, a prime length well past it
        ids = np.random.randint(0, cfg.vocab_size, size=(B, S))
        got = to_numpy(model(paddle.to_tensor(ids), return_dict=True).logits)
        ref, _ = oracle.causal_lm(ids, state, c)
        assert rel_err(got, ref, f"{name} {attn} B={B} S={S}: fp32 vs float64 oracle") <= 1e-5
    # the window is real: the same tensors without it are another function
    ids = np.random.randint(0, cfg.vocab_size, size=(2, 13))
    full_c = {**c, "sliding_window": 10 ** 6}  # same layers and sizes, a window longer than the text
    ref, _ = oracle.causal_lm(ids, state, c)
    other, _ = oracle.causal_lm(ids, state, full_c)
    assert np.abs(other[:, W:] - ref[:, W:]).max() > 1e-3 * np.abs(ref).max()
    assert np.allclose(other[:, :W], ref[:, :W], rtol=0, atol=1e-12)  # identical until the window first slides


@pytest.mark.parametrize("name", list(VARIANTS))
def test_save_load_round_trip_and_on_disk_shapes(tmp_path, name):
    cfg, model = make_model(name)
    model.save_pretrained(str(tmp_path))
    raw = json.load(open(tmp_path / "config.json"))
    assert raw["layer_types"] == SWA["layer_types"] and raw["sliding_window"] == W
    shapes = read_tensor_shapes(str(tmp_path))
    for i in range(3):
        dims = cfg.layer_dims(i)
        assert (dims.window is not None) == (i != 1)
        premix = shapes[f"model.layers.{i}.self_attn.vha_premix_weight"]
        assert premix == (dims.num_kv_heads, dims.q_head_dim, dims.head_dim), (i, premix)
        assert shapes[f"model.layers.{i}.self_attn.vha_postmix_U"] == (dims.num_heads, dims.postmix_rank)
        assert shapes[f"model.layers.{i}.self_attn.q_proj.weight"] == (dims.num_physical_heads * dims.q_head_dim,
                                                                     cfg.hidden_size)
    loaded = Qwen3VHAForCausalLM.from_pretrained(str(tmp_path))
    loaded.eval()
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 9)))
    assert np.array_equal(to_numpy(loaded(ids, return_dict=True).logits), to_numpy(model(ids, return_dict=True).logits))


@pytest.mark.parametrize("prompt", [2, 7], ids=["prompt<W", "prompt>W"])
@pytest.mark.parametrize("name", ["plain", "own-heads-width-theta", "gated-bias-shared-kv"])
def test_cached_decode_across_the_window(name, prompt):
    """A prompt, a 2-token chunk, then one token at a time past the window's edge; PaddleFormers' sliding cache layers
    keep W - 1 positions and its mask spans the whole past (paddle_vha.qwen3.modeling.attention_core keeps the mask's
    last columns)."""
    cfg, model = make_model(name)
    B, T = 2, 7
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(B, prompt + T)))
    full = to_numpy(model(ids, return_dict=True).logits)
    state = paddle_state(model)
    ref, _ = oracle.causal_lm(ids.numpy(), state, config_dict(cfg))
    assert rel_err(full, ref, "full forward vs oracle") <= 1e-5
    cache = DynamicCache(config=cfg)
    for a, b in [(0, prompt), (prompt, prompt + 2)] + [(t, t + 1) for t in range(prompt + 2, prompt + T)]:
        pos = paddle.arange(a, b, dtype="int64").expand([B, b - a])
        out = model(ids[:, a:b], position_ids=pos, past_key_values=cache, use_cache=True, return_dict=True)
        cache = out.past_key_values
        assert rel_err(to_numpy(out.logits), ref[:, a:b], f"{name}: cached {a}:{b} vs oracle") <= 1e-5
    kept = [int(layer.keys.shape[2]) for layer in cache.layers]
    assert kept == [W - 1, prompt + T, W - 1], kept  # the window layers hold W - 1 positions


def test_generate_past_the_window_matches_full_forwards():
    cfg, model = make_model("own-r-R-odd-heads")
    prompt = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 5)))
    gen, _ = model.generate(prompt, max_new_tokens=8, decode_strategy="greedy_search", use_cache=True)
    assert np.array_equal(gen.numpy(), greedy_by_full_forwards(model, prompt, 8))


@pytest.mark.parametrize("name", ["own-r-R-odd-heads", "own-heads-width-theta"])
def test_gradients_match_oracle_finite_differences(name):
    """Paddle's fp32 autograd through the whole model vs central differences of the float64 oracle, one random
    direction per tensor."""
    cfg, model = make_model(name)
    errors = attention_gradient_errors(model, cfg, np.random.randint(0, cfg.vocab_size, size=(2, 9)))
    worst = max(errors.values())
    assert worst <= 2e-4, {n: e for n, e in errors.items() if e > 2e-4}
    print(f"{name}: worst attention-gradient rel err {worst:.2e}")


def test_refusals():
    with pytest.raises(VHAConfigError, match="sliding_window is None"):
        tiny_config(layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(VHAConfigError, match="vha_window_q_head_dim is set but no layer is a sliding-window layer"):
        tiny_config(vha_window_q_head_dim=4)
    with pytest.raises(VHAConfigError, match=r"vha_window_num_attention_heads \(virtual heads H_v=5\) must be divisible"):
        tiny_config(**SWA, vha_window_num_attention_heads=5)
    with pytest.raises(VHAConfigError, match=r"vha_window_q_head_dim \(r\) must be an int with 1 <= r <= head_dim=8"):
        tiny_config(**SWA, vha_window_head_dim=8, vha_window_q_head_dim=9)
    with pytest.raises(VHAConfigError, match="vha_window_rope_theta must be None or a positive number"):
        tiny_config(**SWA, vha_window_rope_theta=-1.0)


def test_fold_keeps_the_windows_and_refuses_own_sizes(tmp_path):
    from paddle_vha.transform.fold import FoldError, fold_checkpoint, plan_fold

    cfg, model = make_model("own-r-R-odd-heads")
    model.save_pretrained(str(tmp_path / "vha"))
    fold_checkpoint(plan_fold(str(tmp_path / "vha"), str(tmp_path / "gqa"), dtype="float64"), progress=False)
    raw = json.load(open(tmp_path / "gqa" / "config.json"))
    assert raw["model_type"] == "qwen3" and raw["layer_types"] == SWA["layer_types"] and raw["sliding_window"] == W
    assert raw["use_sliding_window"] is True and not [k for k in raw if k.startswith("vha_")]
    ids = np.random.randint(0, cfg.vocab_size, size=(2, 11))
    ref, _ = oracle.causal_lm(ids, load_checkpoint_numpy(tmp_path / "vha"), config_dict(cfg))
    got, _ = oracle.stock_causal_lm(ids, load_checkpoint_numpy(tmp_path / "gqa"), raw)
    assert rel_err(got, ref, "folded (stock GQA oracle) vs VHA oracle, windows") <= 1e-10

    cfg, model = make_model("own-heads-width-theta")
    model.save_pretrained(str(tmp_path / "own"))
    with pytest.raises(FoldError, match="sliding-window layer 0 has 6 heads over 3 KV heads of width 8 .*refusing"):
        plan_fold(str(tmp_path / "own"), str(tmp_path / "never"))
    assert not (tmp_path / "never").exists()


# --- accounting ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(VARIANTS))
def test_calculators_count_window_layers(name):
    """kv_calc's bytes are what a real PaddleFormers cache holds below and past the window; the attention weights
    are the model's own; the attention FLOPs count the keys the oracle's windowed mask lets each query see."""
    from paddle_vha.accounting import arch_from_config, forward_flops_per_token, kv_cache_bytes, model_weights

    cfg, model = make_model(name)
    arch = arch_from_config(cfg.to_dict())
    assert (arch.num_window_layers, arch.sliding_window) == (2, W)
    for ctx in (1, W - 1, W, 11):
        out = model(paddle.to_tensor(np.arange(ctx).reshape(1, ctx)), use_cache=True, return_dict=True)
        held = sum(int(l.keys.numel()) + int(l.values.numel()) for l in out.past_key_values.layers) * 4
        print(f"{name}: {ctx} tokens, cache holds {held} B, kv_cache_bytes {kv_cache_bytes(arch, ctx, 4):.0f} B")
        assert held == kv_cache_bytes(arch, ctx, 4)
    weights = sum(int(p.size) for n, p in model.named_parameters()
                  if "self_attn" in n and (n.endswith("proj.weight") or ".vha_" in n))
    assert model_weights(arch)["attention"] == weights
    S = 11
    for causal in (False, True):
        f = forward_flops_per_token(arch, seq_len=S, causal=causal)["attention"]
        want = 0.0
        for i in range(3):  # 2 (QK^T) + 2 (AV) FLOPs per visible key, head and dim
            h_v, _, d, _, _ = oracle.layer_sizes(config_dict(cfg), i)
            visible = ~oracle.causal_mask(np.arange(S)[None], S, oracle.layer_window(config_dict(cfg), i))[0]  # (S, S)
            keys = visible.sum() / S if causal else visible[-1].sum()  # averaged over queries, or the last query's
            if causal and oracle.layer_window(config_dict(cfg), i) is None:
                keys = S / 2  # full layers: the calculators' documented S/2 convention (the article's)
            want += 4 * keys * h_v * d
        assert f == pytest.approx(want, rel=1e-12), (causal, f, want)


def test_kv_calc_caps_the_window_layers(tmp_path):
    import subprocess
    import sys

    cfg, model = make_model("own-r-R-odd-heads")
    model.save_pretrained(str(tmp_path))
    r = subprocess.run([sys.executable, "tools/kv_calc.py", str(tmp_path), "--context", "100", "--dtype", "fp32",
                        "--json"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)
    per_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * 4  # K and V, fp32
    assert rows[0]["total_bytes"] == per_layer * (100 + 2 * (W - 1))  # 1 full layer x 100 + 2 window layers x 3
    assert rows[0]["window_layers"] == 2 and rows[0]["sliding_window"] == W


# --- fold -> export -> serve ---------------------------------------------------------------------------------------

ROOT = __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__)))


@pytest.fixture(scope="module", params=["own-r-R-odd-heads", "shared-kv"])
def exported(request, tmp_path_factory):
    """A windowed VHA checkpoint folded (stock Qwen3, or Qwen3 shared-KV) and exported; the export validates itself
    over a decode that crosses the window."""
    from paddle_vha.export.onnx_export import export_onnx
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold

    root = tmp_path_factory.mktemp("win-" + request.param)
    paddle.seed(5)
    cfg, model = (make_model("own-r-R-odd-heads") if request.param == "own-r-R-odd-heads"
                  else make_model("gated-bias-shared-kv", vha_gated_attention=False))
    model.save_pretrained(str(root / "vha"))
    fold_checkpoint(plan_fold(str(root / "vha"), str(root / "folded")), progress=False)
    lines = []
    val = export_onnx(str(root / "folded"), str(root / "onnx"), log=lines.append)
    print("\n".join(lines))
    return cfg, model, root, val, lines


def test_export_validates_across_the_window(exported):
    cfg, _, root, val, lines = exported
    assert val.max_abs <= 1e-4 and val.tokens_match and val.steps == 16
    assert any("the decode crosses the sliding window (4)" in ln for ln in lines)
    assert any("genai_config.json not written: " in ln for ln in lines)  # genai's cache grows on every layer
    assert not (root / "onnx" / "genai_config.json").exists()
    info = json.load(open(root / "onnx" / "export_info.json"))
    assert info["cache_windows"] == [W, None, W]
    assert_clean_graph(str(root / "onnx" / "model.onnx"))


def test_window_cache_stops_growing_and_generation_matches_paddle(exported):
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.serve.paddle_inference import PaddleInferenceDecoder

    cfg, model, root, _, _ = exported
    prompt = np.random.randint(0, cfg.vocab_size, size=(2, 6))
    want, _ = model.generate(paddle.to_tensor(prompt), max_new_tokens=12, decode_strategy="greedy_search", use_cache=True)
    assert np.array_equal(want.numpy(), greedy_by_full_forwards(model, paddle.to_tensor(prompt), 12))  # no cache
    for session in (OrtDecoder.from_dir(str(root / "onnx")), PaddleInferenceDecoder(str(root / "onnx"))):
        got = generate(session, prompt, 12)
        assert np.array_equal(got.tokens, want.numpy()), type(session).__name__
        mask = np.ones((2, 6), np.int64)
        logits, cache = session.prefill(prompt, mask)
        held = []
        for t in range(10):
            n_per_layer = len(cache) // cfg.num_hidden_layers
            lengths = [c.shape[2] for c in cache[::n_per_layer]]
            assert lengths == [min(6 + t, W - 1), 6 + t, min(6 + t, W - 1)], lengths
            held.append(sum(c.nbytes for c in cache))
            mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
            logits, cache = session.step(logits[:, -1].argmax(-1)[:, None].astype(np.int64), cache, mask)
        growth = set(np.diff(held))
        full_layer = sum(c.nbytes for c in cache[n_per_layer:2 * n_per_layer]) // cache[n_per_layer].shape[2]
        print(type(session).__name__, "cache bytes per step:", held, "growth", growth)
        assert growth == {full_layer}, "past the window only the full layer grows"


def test_left_padded_batch_and_the_past_length(exported):
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.serve.session import ServeError

    cfg, _, root, _, _ = exported
    sess = OrtDecoder.from_dir(str(root / "onnx"))
    rng = np.random.default_rng(11)
    short, long = rng.integers(0, cfg.vocab_size, size=(1, 2)), rng.integers(0, cfg.vocab_size, size=(1, 7))
    batch = np.concatenate([np.concatenate([np.zeros((1, 5), np.int64), short], 1), long])  # row 0 left-padded
    mask = np.array([[0] * 5 + [1] * 2, [1] * 7])
    res = generate(sess, batch, max_new_tokens=6, attention_mask=mask)
    alone = [generate(sess, row, max_new_tokens=6).tokens[0] for row in (short, long)]
    assert np.array_equal(res.tokens, np.stack(alone))
    # without a mask the full layer's cache tells the past length; with windows everywhere nothing does
    logits, cache = sess.prefill(long)
    a, _ = sess.step(np.array([[1]]), cache)
    b, _ = sess.step(np.array([[1]]), cache, np.ones((1, 8), np.int64))
    assert np.array_equal(a, b)
    sess.cache_windows = [W] * len(sess.cache_windows)
    with pytest.raises(ServeError, match="every layer has a sliding window.*pass attention_mask"):
        sess.step(np.array([[1]]), cache)


def test_paddleformers_stock_window_cache_bug_is_pinned():
    """PaddleFormers 1.0's own Qwen3ForCausalLM decodes window layers with the wrong mask columns once the cache
    passes the window (docs/method.md); ours keeps the right ones. If an upgrade fixes theirs, this fails: drop the
    note and this test."""
    from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

    from _utils import TINY

    cfg = Qwen3Config(**{**TINY, "sliding_window": 3, "use_sliding_window": True,
                         "layer_types": ["full_attention", "sliding_attention"]})
    cfg._attn_implementation = "eager"
    stock = Qwen3ForCausalLM(cfg)
    stock.eval()
    B, P = 2, 5
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, (B, P + 1)))
    full = to_numpy(stock(ids, return_dict=True).logits)
    cache = DynamicCache(config=cfg)
    cache = stock(ids[:, :P], past_key_values=cache, use_cache=True, return_dict=True).past_key_values
    pos = paddle.full([B, 1], P, dtype="int64")
    step = to_numpy(stock(ids[:, P:], position_ids=pos, past_key_values=cache, use_cache=True, return_dict=True).logits)
    assert rel_err(step, full[:, P:], "PaddleFormers stock Qwen3, cached step past the window") > 1e-2
