"""Shared-KV VHA (vha_shared_kv): one projection is both keys and values, the output is rotated back by the query's
angle, the cache holds one tensor per layer. Against the float64 oracle (tests/oracle.py, from the equations).

Its layer grid (forward and gradients against the oracle) is the "skv-" cases of the Qwen3-VHA family in
tests/family_cases.py, run by tests/test_family_layers.py."""
import numpy as np
import paddle
import pytest
from paddleformers.transformers.cache_utils import DynamicCache

import oracle
from _utils import attention_tensors, config_dict, load_checkpoint_numpy, read_tensor_shapes, rel_err, tiny_config
from _utils import to_numpy, validate_vha_checkpoint
from family_cases import CASES, greedy_by_full_forwards, randomize_postmix
from paddle_vha import Qwen3VHAAttention, Qwen3VHAForCausalLM, VHAConfigError
from paddle_vha.checkpoint.contract import CheckpointError
from test_checkpoint import _rewrite_tensors
from test_family_layers import build_layer
from test_family_layers import make_layer as make_family_layer
from test_family_layers import run_layer
from test_vha_layer import oracle_layer


def make_layer(B, S, h_v, h_kv, d, r, gated, bias, fused=False):
    return build_layer("qwen3_vha", Qwen3VHAAttention, dict(
        num_attention_heads=h_v, num_key_value_heads=h_kv, head_dim=d, vha_q_head_dim=r, vha_gated_attention=gated,
        attention_bias=bias, vha_postmix_v_init_std=0.3, vha_shared_kv=True, vha_fused_prologue=fused), B, S)


SKV_CASES = [c for c in CASES["qwen3_vha"].layers if CASES["qwen3_vha"].layers[c].fields.get("vha_shared_kv")]


@pytest.mark.parametrize("case", SKV_CASES)
def test_layer_has_no_k_or_v_projection(case):
    """The shared-KV cases of the family grid (tests/family_cases.py; their oracle checks: tests/test_family_layers.py)
    build one projection for both: no k_proj, no v_proj."""
    cfg, attn, _ = make_family_layer("qwen3_vha", case)
    assert cfg.vha_shared_kv is True
    assert not hasattr(attn, "k_proj") and not hasattr(attn, "v_proj")


def test_inverse_rope_is_what_makes_it_shared_kv():
    """Without the rotation back, the output differs from the oracle: the oracle (and the layer) use it."""
    cfg, attn, x = make_layer(2, 9, 4, 2, 16, 16, False, False)
    tensors = attention_tensors(attn)
    ref = oracle_layer(cfg, tensors, to_numpy(x))
    c = dict(config_dict(cfg))
    B, S = 2, 9
    plain = dict(tensors)
    plain["k_proj.weight"] = plain["v_proj.weight"] = plain.pop("shared_kv_proj.weight")
    c["vha_shared_kv"] = False  # K = x W_S rotated, V = x W_S unrotated: not the same function
    other = oracle.vha_attention(to_numpy(x), plain, c, np.broadcast_to(np.arange(S), (B, S)))[0]
    assert np.abs(other - ref).max() > 1e-3 * np.abs(ref).max()


def test_fused_prologue_serves_the_shared_keys():
    from paddle_vha.kernels.dispatch import fused_unavailable_reason

    if fused_unavailable_reason() is not None:
        pytest.skip(f"fused prologue unavailable: {fused_unavailable_reason()}")
    cfg, attn, x = make_layer(2, 11, 4, 2, 16, 12, True, True)
    composed = to_numpy(run_layer(cfg, attn, x))
    cfg.vha_fused_prologue = True
    fused = to_numpy(run_layer(cfg, attn, x))
    ref = oracle_layer(cfg, attention_tensors(attn), to_numpy(x))
    assert rel_err(fused, ref, "fused prologue, shared KV, vs oracle") <= 1e-5
    assert rel_err(fused, composed, "fused vs composed") <= 1e-5


MODEL_GRID = {
    "base": dict(),
    "r<d-gated-bias-3layers": dict(vha_q_head_dim=9, vha_gated_attention=True, attention_bias=True, num_hidden_layers=3),
    "Hkv1-oddheads-tied": dict(num_attention_heads=3, num_key_value_heads=1, tie_word_embeddings=True),
}


@pytest.mark.parametrize("name", list(MODEL_GRID))
def test_model_matches_oracle_from_checkpoint_and_round_trips(tmp_path, name):
    cfg = tiny_config(vha_shared_kv=True, **MODEL_GRID[name])
    model = Qwen3VHAForCausalLM(cfg)
    model.eval()
    randomize_postmix(model)
    model.save_pretrained(tmp_path)
    assert validate_vha_checkpoint(str(tmp_path)).vha_shared_kv is True
    shapes = read_tensor_shapes(str(tmp_path))
    assert "model.layers.0.self_attn.shared_kv_proj.weight" in shapes and not any("k_proj" in n for n in shapes)
    assert shapes["model.layers.0.self_attn.shared_kv_proj.weight"] == (cfg.num_key_value_heads * cfg.head_dim,
                                                                      cfg.hidden_size)  # [out, in] on disk
    ids = np.random.randint(0, cfg.vocab_size, size=(2, 13))
    logits = to_numpy(model(paddle.to_tensor(ids), return_dict=True).logits)
    ref, _ = oracle.causal_lm(ids, load_checkpoint_numpy(tmp_path), config_dict(cfg))
    assert rel_err(logits, ref, f"{name}: logits vs oracle") <= 1e-5
    loaded = Qwen3VHAForCausalLM.from_pretrained(str(tmp_path))
    loaded.eval()
    assert np.array_equal(to_numpy(loaded(paddle.to_tensor(ids), return_dict=True).logits), logits)


def test_cached_decode_and_one_tensor_per_layer():
    cfg = tiny_config(vha_shared_kv=True, vha_gated_attention=True)
    model = Qwen3VHAForCausalLM(cfg)
    model.eval()
    randomize_postmix(model)
    B, P, T = 2, 7, 5
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(B, P + T)))
    full = to_numpy(model(ids, return_dict=True).logits)
    cache = DynamicCache(config=cfg)
    for a, b in [(0, P), (P, P + 2)] + [(t, t + 1) for t in range(P + 2, P + T)]:
        pos = paddle.arange(a, b, dtype="int64").expand([B, b - a])
        out = model(ids[:, a:b], position_ids=pos, past_key_values=cache, use_cache=True, return_dict=True)
        cache = out.past_key_values
        assert rel_err(to_numpy(out.logits), full[:, a:b], f"cached {a}:{b} vs full forward") <= 1e-5
    # the real cache objects: one (B, H_kv, T, d) tensor per layer, nothing in the value slot
    plain = Qwen3VHAForCausalLM(tiny_config(vha_gated_attention=True))
    plain_cache = plain(ids, use_cache=True, return_dict=True).past_key_values
    nbytes = lambda c: sum(int(l.keys.numel()) * l.keys.element_size() + int(l.values.numel()) * l.values.element_size()  # noqa: E731
                           for l in c.layers)
    for layer in cache.layers:
        assert list(layer.keys.shape) == [B, cfg.num_key_value_heads, P + T, cfg.head_dim]
        assert int(layer.values.numel()) == 0
    print(f"cache bytes: shared KV {nbytes(cache)}, VHA {nbytes(plain_cache)}")
    assert 2 * nbytes(cache) == nbytes(plain_cache)


def test_generate_matches_full_forwards():
    cfg = tiny_config(vha_shared_kv=True, num_hidden_layers=3)
    model = Qwen3VHAForCausalLM(cfg)
    model.eval()
    randomize_postmix(model)
    prompt = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 5)))
    gen, _ = model.generate(prompt, max_new_tokens=8, decode_strategy="greedy_search", use_cache=True)
    assert np.array_equal(gen.numpy(), greedy_by_full_forwards(model, prompt, 8))


def test_refusals(tmp_path):
    with pytest.raises(VHAConfigError, match="vha_shared_kv must be a bool"):
        tiny_config(vha_shared_kv="yes")
    model = Qwen3VHAForCausalLM(tiny_config(vha_shared_kv=True))
    model.save_pretrained(tmp_path)
    _rewrite_tensors(str(tmp_path), lambda t: t.update({"model.layers.0.self_attn.k_proj.weight":
                                                        t["model.layers.0.self_attn.shared_kv_proj.weight"]}))
    with pytest.raises(CheckpointError, match="unexpected tensors: model.layers.0.self_attn.k_proj.weight"):
        Qwen3VHAForCausalLM.from_pretrained(str(tmp_path))


def test_calculators_count_the_shared_tensor():
    """kv_calc / flops: 0.5 KB per token per layer at the Qwen3-1.7B shape in bf16 (the issue's figure, half of VHA's
    1 KB, an eighth of GQA-8's 4 KB), and the bytes a real cache holds."""
    from paddle_vha.accounting import arch_from_config, attention_parameters_per_layer, kv_bytes_per_token, paper_variants

    v = {a.label: a for a in paper_variants("1.7b")}
    assert kv_bytes_per_token(v["VHA shared-KV (trained)"], 2) == 512 == kv_bytes_per_token(v["VHA shared-KV (folded)"], 2)
    assert kv_bytes_per_token(v["VHA (trained)"], 2) == 1024 and kv_bytes_per_token(v["GQA-8"], 2) == 4096
    cfg = tiny_config(vha_shared_kv=True, attention_bias=True, vha_q_head_dim=12)
    model = Qwen3VHAForCausalLM(cfg)
    arch = arch_from_config(cfg.to_dict())
    assert arch.shared_kv
    layer = dict(model.model.layers[0].self_attn.named_parameters())
    assert attention_parameters_per_layer(arch)["total"] == sum(p.size for p in layer.values())
    cache = model(paddle.to_tensor(np.arange(5).reshape(1, 5)), use_cache=True, return_dict=True).past_key_values
    held = sum(int(l.keys.numel()) + int(l.values.numel()) for l in cache.layers) * 4
    assert held == kv_bytes_per_token(arch, 4, all_layers=True) * 5


# --- fold -> Qwen3 shared-KV -> export -> serve ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def folded(tmp_path_factory):
    """A shared-KV VHA checkpoint (r < d, biases, 3 layers), folded by the real command line, and exported."""
    import subprocess
    import sys

    from paddle_vha.export.onnx_export import export_onnx

    root = tmp_path_factory.mktemp("skv")
    paddle.seed(21)
    cfg = tiny_config(vha_shared_kv=True, vha_q_head_dim=12, attention_bias=True, num_hidden_layers=3)
    model = Qwen3VHAForCausalLM(cfg)
    randomize_postmix(model)
    model.save_pretrained(str(root / "vha"))
    r = subprocess.run([sys.executable, "tools/fold.py", str(root / "vha"), str(root / "folded"), "--verify", "2",
                        "--no-progress"], capture_output=True, text=True, cwd=__import__("os").path.dirname(
                            __import__("os").path.dirname(__import__("os").path.abspath(__file__))))
    print(r.stdout, r.stderr[-1500:])
    assert r.returncode == 0, r.stderr[-2000:]
    val = export_onnx(str(root / "folded"), str(root / "onnx"), log=print)
    return cfg, model, root, r.stdout, val


def test_fold_says_it_is_not_stock_and_is_exact(folded):
    from paddle_vha.families import family_of

    cfg, model, root, stdout, _ = folded
    notes = [ln for ln in stdout.splitlines() if "note: vha_shared_kv" in ln]
    assert len(notes) == 1 and "not stock Qwen3" in notes[0] and "qwen3_shared_kv" in notes[0]
    verify = [ln for ln in stdout.splitlines() if ln.startswith("verify")]
    assert verify and verify[0].endswith("-> OK")
    fam = family_of(str(root / "folded"))
    assert fam.model_type == "qwen3_shared_kv"
    fam.validate(str(root / "folded"))
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold

    # the fold's own exactness: float64 output, so the only rounding left is float64's
    fold_checkpoint(plan_fold(str(root / "vha"), str(root / "folded64"), dtype="float64"), progress=False)
    state_v, state_f = load_checkpoint_numpy(root / "vha"), load_checkpoint_numpy(root / "folded64")
    assert "model.layers.0.self_attn.shared_kv_proj.weight" in state_f and not any("vha_" in n for n in state_f)
    c = config_dict(cfg)
    for B, S in [(1, 1), (2, 13)]:
        ids = np.random.randint(0, cfg.vocab_size, size=(B, S))
        ref, _ = oracle.causal_lm(ids, state_v, c)
        got, _ = oracle.stock_causal_lm(ids, state_f, c)  # the folded tensors through the shared-KV GQA oracle
        assert rel_err(got, ref, f"B={B} S={S}: folded shared-KV vs shared-KV VHA (float64 oracles)") <= 1e-10


def test_exported_decoder_caches_one_tensor_and_serves_like_paddleformers(folded):
    import json
    import os

    from paddle_vha.families import family_of
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.serve.paddle_inference import PaddleInferenceDecoder

    cfg, model, root, _, val = folded
    assert val.max_abs <= 1e-4 and val.tokens_match
    info = json.load(open(os.path.join(root, "onnx", "export_info.json")))
    assert info["model_type"] == "qwen3_shared_kv"
    assert not os.path.exists(os.path.join(root, "onnx", "genai_config.json"))  # genai needs key and value tensors
    assert info["inputs"][3:] == [f"past_key_values.{i}.key" for i in range(cfg.num_hidden_layers)]
    assert info["outputs"][1:] == [f"present.{i}.key" for i in range(cfg.num_hidden_layers)]
    folded_model = family_of(str(root / "folded")).model_class.from_pretrained(str(root / "folded"))
    folded_model.eval()
    model.eval()
    prompt = np.random.randint(0, cfg.vocab_size, size=(2, 6))
    want, _ = folded_model.generate(paddle.to_tensor(prompt), max_new_tokens=12, decode_strategy="greedy_search",
                                    use_cache=True)
    trained, _ = model.generate(paddle.to_tensor(prompt), max_new_tokens=12, decode_strategy="greedy_search",
                                use_cache=True)
    assert np.array_equal(want.numpy(), trained.numpy()), "the folded model generates what the VHA model does"
    for session in (OrtDecoder.from_dir(str(root / "onnx")), PaddleInferenceDecoder(str(root / "onnx"))):
        got = generate(session, prompt, 12)
        print(type(session).__name__, got.tokens.tolist())
        assert np.array_equal(got.tokens, want.numpy()), type(session).__name__
        cache = session.prefill(prompt)[1]
        assert len(cache) == cfg.num_hidden_layers and all(c.shape == (2, cfg.num_key_value_heads, 6, cfg.head_dim)
                                                           for c in cache)
