"""tools/fold.py and paddle_vha.fold: exactness against float64 oracles, stock PaddleFormers Qwen3 loading the
output, bf16 rounding, every refusal path, and IN_DIR left byte-identical."""
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import types
from fractions import Fraction

import ml_dtypes
import numpy as np
import paddle
import pytest
from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM
from paddleformers.transformers.cache_utils import DynamicCache
from safetensors import safe_open

import oracle
from _utils import config_dict, rel_err, tiny_config, to_numpy
from paddle_vha import Qwen3VHAForCausalLM
from paddle_vha.checkpoint.contract import CheckpointError
from paddle_vha.transform.fold import fold_checkpoint, fold_state_dict, plan_fold
from paddle_vha.checkpoint.safetensors_io import read_header, read_tensor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLD_PY = os.path.join(ROOT, "tools", "fold.py")


# --- helpers ---------------------------------------------------------------------------------------------------

def load_tool():
    spec = importlib.util.spec_from_file_location("fold_tool", FOLD_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_vha(path, dtype="float32", shard=None, **overrides):
    """A saved Qwen3-VHA checkpoint with non-trivial Premix / Postmix / biases; returns (cfg, model)."""
    overrides = {"vha_premix_init_alpha": 3.0, "vha_postmix_u_init_std": 0.5, "vha_postmix_v_init_std": 0.5,
                 "initializer_range": 0.2, **overrides}
    cfg = tiny_config(**overrides)
    paddle.set_default_dtype(dtype)
    try:
        model = Qwen3VHAForCausalLM(cfg)
        for name, p in model.named_parameters():
            if name.endswith(".bias") or name.endswith("norm.weight"):  # zeros / ones by default: make them count
                p.set_value((1.0 if name.endswith("norm.weight") else 0.0) + paddle.randn(p.shape).astype(p.dtype) * 0.3)
    finally:
        paddle.set_default_dtype("float32")
    model.eval()
    model.save_pretrained(str(path), **({"max_shard_size": shard} if shard else {}))
    return cfg, model


def read_state(path):
    """All tensors of a checkpoint folder as float64 numpy (bf16 through ml_dtypes), via the index."""
    index = json.load(open(os.path.join(path, "model.safetensors.index.json")))["weight_map"]
    state = {}
    for fname in sorted(set(index.values())):
        _, refs = read_header(os.path.join(path, fname))
        state.update({n: read_tensor(r).astype(np.float64) for n, r in refs.items()})
    assert set(state) == set(index)
    return state


def fold(in_dir, out_dir, **kw):
    return fold_checkpoint(plan_fold(str(in_dir), str(out_dir), **kw), progress=False)


def digest(path):
    h = hashlib.sha256()
    for f in sorted(os.listdir(path)):
        h.update(f.encode())
        h.update(open(os.path.join(path, f), "rb").read())
    return h.hexdigest()


def gqa_causal_lm(ids, state, cfg):
    """Plain Qwen3 GQA logits in float64, from the math: H query heads of width d, head j reads KV head j // (H/H_kv)."""
    B, S = ids.shape
    H, Hkv, d, eps, theta = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                             cfg["rms_norm_eps"], cfg["rope_theta"])
    pos = np.broadcast_to(np.arange(S), (B, S))
    x = state["model.embed_tokens.weight"][ids]
    causal = np.triu(np.full((S, S), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        w = lambda n: state.get(f"model.layers.{i}.{n}")  # noqa: E731
        hn = oracle.rms_norm(x, w("input_layernorm.weight"), eps)
        q = oracle.linear(hn, w("self_attn.q_proj.weight"), w("self_attn.q_proj.bias")).reshape(B, S, H, d)
        k = oracle.linear(hn, w("self_attn.k_proj.weight"), w("self_attn.k_proj.bias")).reshape(B, S, Hkv, d)
        v = oracle.linear(hn, w("self_attn.v_proj.weight"), w("self_attn.v_proj.bias")).reshape(B, S, Hkv, d)
        q = oracle.rope(oracle.rms_norm(q, w("self_attn.q_norm.weight"), eps), pos, theta)
        k = oracle.rope(oracle.rms_norm(k, w("self_attn.k_norm.weight"), eps), pos, theta)
        kv_of = np.arange(H) // (H // Hkv)  # (H,)
        scores = np.einsum("bshd,bthd->bhst", q, k[:, :, kv_of]) / np.sqrt(d) + causal  # (B, H, S, S)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        y = np.einsum("bhst,bthd->bshd", p, v[:, :, kv_of]).reshape(B, S, H * d)  # (B, S, H*d)
        x = x + oracle.linear(y, w("self_attn.o_proj.weight"), w("self_attn.o_proj.bias"))
        hn = oracle.rms_norm(x, w("post_attention_layernorm.weight"), eps)
        x = x + oracle.linear(oracle.silu(oracle.linear(hn, w("mlp.gate_proj.weight"))) * oracle.linear(hn, w("mlp.up_proj.weight")),
                              w("mlp.down_proj.weight"))
    x = oracle.rms_norm(x, state["model.norm.weight"], eps)
    return oracle.linear(x, state.get("lm_head.weight", state["model.embed_tokens.weight"]))


SHAPES = {
    "base": dict(),
    "r<d": dict(vha_q_head_dim=6, vha_postmix_rank=3),
    "bias-3layers": dict(attention_bias=True, num_hidden_layers=3),
    "odd-heads-Hkv3-tied": dict(num_attention_heads=9, num_key_value_heads=3, head_dim=10, tie_word_embeddings=True),
    "Hkv1-rank1": dict(num_attention_heads=5, num_key_value_heads=1, vha_postmix_rank=1, vha_q_head_dim=7),
    # no Premix (the research fork's kv_postmix_only): q_proj already stock, Postmix folds into o_proj
    "premix-off-bias": dict(vha_premix=False, attention_bias=True, vha_postmix_rank=3),
    "premix-off-Hkv3": dict(vha_premix=False, num_attention_heads=9, num_key_value_heads=3, head_dim=10),
}


# --- exactness -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SHAPES))
def test_fold_is_exact_in_float64(tmp_path, name):
    """VHA oracle on the VHA checkpoint == plain-GQA oracle on the folded one, to 1e-10 relative."""
    cfg, _ = make_vha(tmp_path / "vha", dtype="float64", shard="20KB" if name == "bias-3layers" else None,
                      **SHAPES[name])
    if name == "bias-3layers":
        assert len([f for f in os.listdir(tmp_path / "vha") if f.endswith(".safetensors")]) > 1, "want sharded input"
    fold(tmp_path / "vha", tmp_path / "gqa")
    raw = json.load(open(tmp_path / "gqa" / "config.json"))
    assert raw["model_type"] == "qwen3" and raw["architectures"] == ["Qwen3ForCausalLM"]
    assert raw["num_attention_heads"] == cfg.num_attention_heads and raw["head_dim"] == cfg.head_dim
    assert raw["num_key_value_heads"] == cfg.num_key_value_heads and not [k for k in raw if k.startswith("vha_")]
    vha_state, gqa_state = read_state(tmp_path / "vha"), read_state(tmp_path / "gqa")
    h, Hv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    assert gqa_state["model.layers.0.self_attn.q_proj.weight"].shape == (Hv * d, h)
    assert gqa_state["model.layers.0.self_attn.o_proj.weight"].shape == (h, Hv * d)
    assert not [n for n in gqa_state if "vha_" in n]
    c = config_dict(cfg)
    for B, S in [(1, 1), (2, 7), (3, 13)]:
        ids = np.random.randint(0, cfg.vocab_size, size=(B, S))
        ref, _ = oracle.causal_lm(ids, vha_state, c)
        got = gqa_causal_lm(ids, gqa_state, c)
        assert rel_err(got, ref, f"{name} B={B} S={S} folded GQA vs VHA (float64 oracles)") <= 1e-10


def test_state_dict_api_matches_checkpoint_fold(tmp_path):
    cfg, model = make_vha(tmp_path / "vha", dtype="float64", attention_bias=True, vha_q_head_dim=9)
    fold(tmp_path / "vha", tmp_path / "gqa")
    state = read_state(tmp_path / "vha")
    api = fold_state_dict(state, cfg)
    disk = read_state(tmp_path / "gqa")
    assert set(api) == set(disk)
    for n in disk:
        assert np.array_equal(api[n], disk[n]), n


def test_fold_math_blocks_by_hand():
    """Block j = g*H_p + i of q_proj is P[g]^T W_Q^(i); o_proj block k is sum_j M[j,k] W_O[:, j]; q bias b^(i) P[g]."""
    from paddle_vha.transform.fold import fold_o_proj, fold_q_bias, fold_q_proj

    rng = np.random.default_rng(0)
    Hkv, Hp, r, d, h, R = 2, 3, 4, 5, 7, 2
    wq, P, bq = rng.normal(size=(Hp * r, h)), rng.normal(size=(Hkv, r, d)), rng.normal(size=Hp * r)
    wo, U, V = rng.normal(size=(h, Hkv * Hp * d)), rng.normal(size=(Hkv * Hp, R)), rng.normal(size=(Hkv * Hp, R))
    fq, fb, fo = fold_q_proj(wq, P), fold_q_bias(bq, P), fold_o_proj(wo, U, V)
    M = np.eye(Hkv * Hp) + V @ U.T
    for g in range(Hkv):
        for i in range(Hp):
            j = g * Hp + i
            np.testing.assert_allclose(fq[j * d:(j + 1) * d], P[g].T @ wq[i * r:(i + 1) * r], rtol=1e-13, atol=1e-13)
            np.testing.assert_allclose(fb[j * d:(j + 1) * d], bq[i * r:(i + 1) * r] @ P[g], rtol=1e-13, atol=1e-13)
    for k in range(Hkv * Hp):
        want = sum(M[j, k] * wo[:, j * d:(j + 1) * d] for j in range(Hkv * Hp))
        np.testing.assert_allclose(fo[:, k * d:(k + 1) * d], want, rtol=1e-12, atol=1e-12)


def test_premix_off_fold_copies_q_proj_and_folds_o_proj(tmp_path):
    """Without Premix the checkpoint has no vha_premix_weight, q_proj / its bias are copied bit for bit, and o_proj
    is W_O (M (x) I_d) with M = I + V U^T."""
    cfg, _ = make_vha(tmp_path / "vha", dtype="float64", vha_premix=False, attention_bias=True)
    vha = read_state(tmp_path / "vha")
    assert not [n for n in vha if "premix" in n]
    p = "model.layers.1.self_attn."
    assert vha[p + "q_proj.weight"].shape == (cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size)
    fold(tmp_path / "vha", tmp_path / "gqa")
    gqa = read_state(tmp_path / "gqa")
    for leaf in ("q_proj.weight", "q_proj.bias", "k_proj.weight", "v_proj.weight"):
        assert np.array_equal(gqa[p + leaf], vha[p + leaf]), leaf
    M = np.eye(cfg.num_attention_heads) + vha[p + "vha_postmix_V"] @ vha[p + "vha_postmix_U"].T
    want = vha[p + "o_proj.weight"] @ np.kron(M, np.eye(cfg.head_dim))
    assert rel_err(gqa[p + "o_proj.weight"], want, "premix-off folded o_proj vs W_O (M kron I)") <= 1e-13
    api = fold_state_dict(vha, cfg)
    assert set(api) == set(gqa) and all(np.array_equal(api[n], gqa[n]) for n in gqa)


@pytest.mark.parametrize("name", ["base", "bias-3layers", "odd-heads-Hkv3-tied", "premix-off-bias"])
def test_stock_paddle_qwen3_loads_output_and_matches_fp32(tmp_path, name):
    """Stock PaddleFormers Qwen3ForCausalLM on OUT vs Qwen3VHAForCausalLM on IN, float32: <= 1e-5 relative;
    the folded model's cached decode (explicit position_ids) matches too."""
    cfg, _ = make_vha(tmp_path / "vha", shard="30KB" if name == "bias-3layers" else None, **SHAPES[name])
    fold(tmp_path / "vha", tmp_path / "gqa", max_shard_size="30KB")
    vha = Qwen3VHAForCausalLM.from_pretrained(str(tmp_path / "vha"))
    gqa = Qwen3ForCausalLM.from_pretrained(str(tmp_path / "gqa"))
    vha.eval()
    gqa.eval()
    assert type(gqa) is Qwen3ForCausalLM and gqa.config.num_attention_heads == cfg.num_attention_heads
    for B, S in [(1, 1), (2, 11)]:
        ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(B, S)))
        a, b = to_numpy(vha(ids, return_dict=True).logits), to_numpy(gqa(ids, return_dict=True).logits)
        assert rel_err(b, a, f"{name} B={B} S={S} Paddle fp32 folded vs VHA") <= 1e-5
    # cached decode on the stock model: prompt of 5, then 3 single tokens, positions passed explicitly
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 8)))
    full = to_numpy(vha(ids, return_dict=True).logits)
    cache, steps = DynamicCache(config=gqa.config), []
    for a, b in [(0, 5), (5, 6), (6, 7), (7, 8)]:
        pos = paddle.arange(a, b, dtype="int64").expand([2, b - a])
        out = gqa(ids[:, a:b], position_ids=pos, past_key_values=cache, use_cache=True, return_dict=True)
        cache = out.past_key_values
        steps.append(to_numpy(out.logits))
    assert rel_err(np.concatenate(steps, 1), full, f"{name} folded cached decode vs VHA full forward") <= 1e-5


# --- dtypes ----------------------------------------------------------------------------------------------------

def exact_bf16(x: float) -> float:
    """Nearest bfloat16 to x (ties to even), by exact rational arithmetic over the two bracketing values."""
    lo = float(np.array([x], np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)[0])
    cands = set()
    for c in (lo,):
        b = np.array([c], ml_dtypes.bfloat16)
        cands |= {c, float(np.nextafter(b, np.array([np.inf], ml_dtypes.bfloat16)).astype(np.float64)[0]),
                  float(np.nextafter(b, np.array([-np.inf], ml_dtypes.bfloat16)).astype(np.float64)[0])}
    fx = Fraction(x)
    best = min(cands, key=lambda c: (abs(Fraction(c) - fx),
                                     int(np.array([c], ml_dtypes.bfloat16).view(np.uint16)[0]) & 1))
    return best


def test_float64_to_bfloat16_rounds_once():
    from paddle_vha.checkpoint.safetensors_io import cast

    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.normal(size=3000) * 10.0 ** rng.integers(-30, 30, size=3000),
                         [1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-30), 1 + 2**-8, 1 + 3 * 2**-8, 0.0, -0.0]])
    got = cast(xs, "BF16").astype(np.float64)
    want = np.array([exact_bf16(float(x)) for x in xs])
    bad = np.flatnonzero(got != want)
    print(f"float64 -> bfloat16: {len(bad)} of {len(xs)} differ from exact rounding")
    assert not len(bad), (xs[bad[:3]], got[bad[:3]], want[bad[:3]])
    assert got[-6] == 1 + 2**-7  # ml_dtypes alone (via float32) gives 1.0 here


def test_bfloat16_output(tmp_path):
    """--dtype bfloat16 from fp32: folded tensors are the float64 fold rounded once; copies are plain casts;
    stock Paddle Qwen3 loads it; the function stays within bf16 storage error."""
    cfg, _ = make_vha(tmp_path / "vha", vha_q_head_dim=6, attention_bias=True)
    fold(tmp_path / "vha", tmp_path / "gqa", dtype="bfloat16")
    raw = json.load(open(tmp_path / "gqa" / "config.json"))
    assert raw["torch_dtype"] == "bfloat16"
    shard = [f for f in os.listdir(tmp_path / "gqa") if f.endswith(".safetensors")][0]
    _, refs = read_header(str(tmp_path / "gqa" / shard))
    assert {r.dtype for r in refs.values()} == {"BF16"}
    vha_state, gqa_state = read_state(tmp_path / "vha"), read_state(tmp_path / "gqa")
    p = "model.layers.1.self_attn."
    Hp, r = cfg.num_attention_heads // cfg.num_key_value_heads, cfg.vha_q_head_dim
    wq, P = vha_state[p + "q_proj.weight"].reshape(Hp, r, -1), vha_state[p + "vha_premix_weight"]
    want = np.concatenate([P[g].T @ wq[i] for g in range(cfg.num_key_value_heads) for i in range(Hp)])
    want_bf16 = np.array([exact_bf16(float(x)) for x in want.reshape(-1)]).reshape(want.shape)
    assert np.array_equal(gqa_state[p + "q_proj.weight"], want_bf16)
    emb = vha_state["model.embed_tokens.weight"].astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    assert np.array_equal(gqa_state["model.embed_tokens.weight"], emb)
    ids = np.random.randint(0, cfg.vocab_size, size=(2, 9))
    ref, _ = oracle.causal_lm(ids, vha_state, config_dict(cfg))
    err = rel_err(gqa_causal_lm(ids, gqa_state, config_dict(cfg)), ref, "bf16 folded vs fp32 VHA (oracles)")
    assert err < 5e-2
    gqa = Qwen3ForCausalLM.from_pretrained(str(tmp_path / "gqa"), dtype="bfloat16")
    assert gqa.model.layers[0].self_attn.q_proj.weight.dtype == paddle.bfloat16


def test_bfloat16_input_auto_dtype(tmp_path):
    cfg, _ = make_vha(tmp_path / "vha", dtype="bfloat16")
    fold(tmp_path / "vha", tmp_path / "gqa")  # auto: the input's dtype
    assert json.load(open(tmp_path / "gqa" / "config.json"))["torch_dtype"] == "bfloat16"
    vha_state, gqa_state = read_state(tmp_path / "vha"), read_state(tmp_path / "gqa")
    for n in ("model.layers.0.mlp.up_proj.weight", "model.embed_tokens.weight", "model.layers.1.self_attn.k_norm.weight"):
        assert np.array_equal(vha_state[n], gqa_state[n]), n  # copies are bit-exact
    ids = np.random.randint(0, cfg.vocab_size, size=(1, 8))
    ref, _ = oracle.causal_lm(ids, vha_state, config_dict(cfg))
    assert rel_err(gqa_causal_lm(ids, gqa_state, config_dict(cfg)), ref, "bf16 in/out, oracles") < 5e-2


def test_sharded_output_and_reference_reader(tmp_path):
    """Small --max-shard-size gives several shards and an index; the safetensors library reads them back."""
    cfg, _ = make_vha(tmp_path / "vha", num_hidden_layers=3)
    fold(tmp_path / "vha", tmp_path / "gqa", max_shard_size="20KB")
    files = sorted(f for f in os.listdir(tmp_path / "gqa") if f.endswith(".safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.load(open(tmp_path / "gqa" / "model.safetensors.index.json"))
    mine = read_state(tmp_path / "gqa")
    total = 0
    for f in files:
        with safe_open(str(tmp_path / "gqa" / f), framework="numpy") as sf:
            for n in sf.keys():
                a = sf.get_tensor(n)
                total += a.nbytes
                assert index["weight_map"][n] == f and np.array_equal(a.astype(np.float64), mine[n])
    assert total == index["metadata"]["total_size"] and len(index["weight_map"]) == len(mine)


# --- files, safety, refusals -----------------------------------------------------------------------------------

def test_tokenizer_files_copied_and_loader_cache_not(tmp_path):
    make_vha(tmp_path / "vha")
    extra = {"generation_config.json": '{"do_sample": false}', "tokenizer.json": '{"x": 1}',
             "tokenizer_config.json": "{}", "flex-ckpt.auto_generated.metadata": "stale", "saved_signal_0": ""}
    for f, text in extra.items():
        (tmp_path / "vha" / f).write_text(text)
    fold(tmp_path / "vha", tmp_path / "gqa")
    out = set(os.listdir(tmp_path / "gqa"))
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "gqa" / f).read_bytes() == (tmp_path / "vha" / f).read_bytes()
    assert "flex-ckpt.auto_generated.metadata" not in out and "saved_signal_0" not in out


def _rewrite(path, fn):
    from safetensors.numpy import load_file, save_file

    (shard,) = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    tensors = load_file(os.path.join(path, shard))
    fn(tensors)
    save_file(tensors, os.path.join(path, shard))
    index = os.path.join(path, "model.safetensors.index.json")
    meta = json.load(open(index))
    meta["weight_map"] = {k: shard for k in tensors}
    json.dump(meta, open(index, "w"))


def _config(path, **changes):
    raw = json.load(open(os.path.join(path, "config.json")))
    raw.update(changes)
    json.dump(raw, open(os.path.join(path, "config.json"), "w"))


def _stock_qwen3(path):
    model = Qwen3ForCausalLM(Qwen3Config(**{k: v for k, v in config_dict(tiny_config()).items()
                                           if not k.startswith("vha_") and k not in ("model_type", "architectures")}))
    model.save_pretrained(str(path))


P0 = "model.layers.0.self_attn."
REFUSALS = {
    "gated": (dict(vha_gated_attention=True), None, "Postmix cannot cross the sigmoid gate"),
    "stock-qwen3": (None, _stock_qwen3, "not a Qwen3-VHA checkpoint"),
    "missing-tensor": ({}, lambda p: _rewrite(p, lambda t: t.pop(P0 + "vha_postmix_V")),
                       "missing tensors: " + P0 + "vha_postmix_V"),
    "extra-tensor": ({}, lambda p: _rewrite(p, lambda t: t.update({P0 + "gate_proj.weight": np.zeros((64, 48), np.float32)})),
                     "unexpected tensors: " + P0 + "gate_proj.weight"),
    "mis-shaped": ({}, lambda p: _rewrite(p, lambda t: t.update({P0 + "o_proj.weight": np.zeros((48, 60), np.float32)})),
                   "mis-shaped tensors: " + P0 + "o_proj.weight [48, 60] (expected [48, 64])"),
    "indivisible-heads": ({}, lambda p: _config(p, num_attention_heads=5), "divisible"),
    "bad-rank": ({}, lambda p: _config(p, vha_postmix_rank=0), "vha_postmix_rank"),
    "int-tensor": ({}, lambda p: _rewrite(p, lambda t: t.update({P0 + "q_norm.weight": np.ones(16, np.int32)})),
                   "non-floating tensors: " + P0 + "q_norm.weight"),
    "no-config": ({}, lambda p: os.remove(os.path.join(p, "config.json")), "config.json: missing"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_one_line_nonzero_nothing_written(tmp_path, capsys, case):
    overrides, breaker, needle = REFUSALS[case]
    src = tmp_path / "in"
    if overrides is not None:
        make_vha(src, **overrides)
    if breaker is not None:
        breaker(str(src))
    before = digest(src)
    tool = load_tool()
    with pytest.raises(SystemExit) as e:
        tool.main([str(src), str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    print(err)
    assert e.value.code == 2 and needle in err and "\n" not in err and err.startswith("error: ")
    assert sorted(os.listdir(tmp_path)) == ["in"], "nothing may be written on refusal"
    assert digest(src) == before


def test_existing_out_dir_needs_force_and_same_dir_is_refused(tmp_path, capsys):
    make_vha(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    tool = load_tool()
    with pytest.raises(SystemExit) as e:
        tool.main([str(tmp_path / "in"), str(out), "--no-progress"])
    assert e.value.code == 2 and "already exists (pass --force" in capsys.readouterr().err
    assert os.listdir(out) == ["keep.txt"]
    for target in (tmp_path / "in", tmp_path / "in" / "sub"):
        with pytest.raises(SystemExit) as e:
            tool.main([str(tmp_path / "in"), str(target), "--force", "--no-progress"])
        assert e.value.code == 2 and "OUT_DIR must be a different folder" in capsys.readouterr().err
    # --force replaces only a folder this project wrote (issue 17): a user's folder is refused and kept as it was
    with pytest.raises(SystemExit) as e:
        tool.main([str(tmp_path / "in"), str(out), "--force", "--no-progress"])
    assert e.value.code == 2 and "was not written by paddle-vha" in capsys.readouterr().err
    assert os.listdir(out) == ["keep.txt"]
    os.remove(out / "keep.txt")
    os.rmdir(out)
    assert tool.main([str(tmp_path / "in"), str(out), "--no-progress"]) == 0
    (out / "keep.txt").write_text("old")
    assert tool.main([str(tmp_path / "in"), str(out), "--force", "--no-progress"]) == 0  # its own output: replaced
    assert "keep.txt" not in os.listdir(out) and "config.json" in os.listdir(out)
    assert sorted(os.listdir(tmp_path)) == ["in", "out"], "no temporary folders left behind"


def test_dry_run_prints_plan_writes_nothing(tmp_path, capsys):
    make_vha(tmp_path / "in", vha_q_head_dim=6)
    before = digest(tmp_path / "in")
    assert load_tool().main([str(tmp_path / "in"), str(tmp_path / "out"), "--dry-run"]) == 0
    text = capsys.readouterr().out
    print(text)
    assert "model.layers.{i}.self_attn.q_proj.weight" in text and "[12, 48] float32 -> [64, 48] float32" in text
    assert "fold Postmix" in text and "absorbed" in text and "dry run: nothing written" in text
    assert sorted(os.listdir(tmp_path)) == ["in"] and digest(tmp_path / "in") == before


def test_failure_midway_leaves_nothing(tmp_path):
    make_vha(tmp_path / "in")
    plan = plan_fold(str(tmp_path / "in"), str(tmp_path / "out"))
    seen = []

    def boom(entry):
        seen.append(entry.name)
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fold_checkpoint(plan, progress=False, on_tensor=boom)
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_state_dict_api_refuses_gated():
    with pytest.raises(CheckpointError, match="Postmix cannot cross the sigmoid gate"):
        fold_state_dict({}, types.SimpleNamespace(vha_gated_attention=True))


def test_cli_fold_and_verify_leave_in_dir_unchanged(tmp_path):
    """The real command line: fold + --verify; IN_DIR byte-identical after both, OUT_DIR has no loader cache."""
    make_vha(tmp_path / "in", vha_q_head_dim=12, attention_bias=True)
    before = digest(tmp_path / "in")
    res = subprocess.run([sys.executable, FOLD_PY, str(tmp_path / "in"), str(tmp_path / "out"), "--verify", "2",
                          "--no-progress"], capture_output=True, text=True, timeout=300)
    print(res.stdout, res.stderr)
    assert res.returncode == 0, res.stderr
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("verify")][0]
    assert line.endswith("-> OK") and "mean KL" in line
    assert digest(tmp_path / "in") == before, "IN_DIR must be byte-identical after fold and --verify"
    assert not [f for f in os.listdir(tmp_path / "out") if f.endswith(".metadata")]
    assert sorted(os.listdir(tmp_path)) == ["in", "out"]


def test_cli_help():
    res = subprocess.run([sys.executable, FOLD_PY, "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "--dry-run" in res.stdout and "--verify" in res.stdout and "--force" in res.stdout


def test_small_chunks_and_float16_output(tmp_path):
    """Copies streamed in many small row blocks are bit-identical to one-block copies; float16 output is the
    float64 fold rounded once (numpy's float64 -> float16 conversion rounds directly)."""
    cfg, _ = make_vha(tmp_path / "vha", attention_bias=True)
    fold_checkpoint(plan_fold(str(tmp_path / "vha"), str(tmp_path / "a")), progress=False)
    fold_checkpoint(plan_fold(str(tmp_path / "vha"), str(tmp_path / "b")), progress=False, chunk_bytes=500)
    a, b = read_state(tmp_path / "a"), read_state(tmp_path / "b")
    assert all(np.array_equal(a[n], b[n]) for n in a)
    fold_checkpoint(plan_fold(str(tmp_path / "vha"), str(tmp_path / "h"), dtype="float16"), progress=False)
    h = read_state(tmp_path / "h")
    assert np.array([1 + 2**-11 + 2**-40]).astype(np.float16)[0] == 1 + 2**-10  # the premise: no double rounding
    exact = fold_state_dict(read_state(tmp_path / "vha"), cfg)
    for n in h:
        assert np.array_equal(h[n], np.asarray(exact[n], np.float64).astype(np.float16).astype(np.float64)), n
    assert json.load(open(tmp_path / "h" / "config.json"))["torch_dtype"] == "float16"


def test_bfloat16_widening_is_exact():
    from paddle_vha.checkpoint.safetensors_io import to_float64

    x = np.random.default_rng(1).normal(size=20000) * 10.0 ** np.random.default_rng(2).integers(-35, 35, size=20000)
    b = np.concatenate([x, [np.inf, -np.inf, 0.0, -0.0, 1e-40]]).astype(np.float32).astype(ml_dtypes.bfloat16)
    assert np.array_equal(to_float64(b), b.astype(np.float64))
