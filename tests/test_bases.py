"""The Llama and Qwen2 bases end to end, each tool on them: convert_to_vha and compress_kv (exact where the algebra
allows it, biases included), fold into stock Llama / Qwen2 read by Hugging Face's own LlamaForCausalLM /
Qwen2ForCausalLM (side environment) against the float64 oracle, export read by onnxruntime, Paddle Inference and
onnxruntime-genai (its `llama` / `qwen2` decoder), and the calculators. The layer and model oracle grids of these
families run in tests/test_family_layers.py / test_family_models.py; tensor parallelism in test_tensor_parallel.py.

Llama: no q/k norm, biases on all four projections with attention_bias (PaddleFormers' Llama needs hidden = heads x
head_dim). Qwen2: no q/k norm, q/k/v biases always, none on o_proj.
"""
import json
import os

import numpy as np
import paddle
import pytest

import oracle
from _utils import TINY, config_dict, rel_err, to_numpy
from paddle_vha.families import family, family_of

BASES = {  # config fields over TINY of each base's tests
    "llama": dict(hidden_size=64, attention_bias=True, pad_token_id=None, bos_token_id=None, eos_token_id=None),
    "qwen2": dict(),
}


def save_model(model_type: str, path, seed: int = 7, **fields):
    """A saved checkpoint of `model_type` over TINY with the base's fields and `fields`; biases and Postmix V drawn
    away from zero, so every tensor counts. Returns (config, model)."""
    base = model_type.split("_")[0]
    paddle.seed(seed)
    fam = family(model_type)
    cfg = fam.config_class(**{**TINY, **BASES[base], "tie_word_embeddings": False, **fields})
    model = fam.model_class(cfg)
    for n, p in model.named_parameters():
        if n.endswith(".bias") or n.endswith("vha_postmix_V"):
            p.set_value(paddle.randn(p.shape) * 0.5)
    model.eval()
    model.save_pretrained(str(path))
    return cfg, model


def logits(folder, ids):
    """The folder's own family's Paddle model on ids (float32), as numpy."""
    model = family_of(str(folder)).model_class.from_pretrained(str(folder), dtype="float32")
    model.eval()
    return to_numpy(model(paddle.to_tensor(ids), return_dict=True).logits)


@pytest.mark.parametrize("base", list(BASES))
def test_fold_then_convert_back_is_exact(tmp_path, base):
    """A VHA model over the base (Premix with r < d; Qwen2's q bias goes through Premix) folds into the stock base, and
    convert_to_vha with the same N and r gives the VHA model's function back: the factorization finds the folded
    query blocks' rank-r structure, biases included as one more input column."""
    from paddle_vha.transform.convert_to_vha import LayerTensors, convert_checkpoint, plan_convert
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold

    cfg, vha = save_model(f"{base}_vha", tmp_path / "vha", vha_q_head_dim=10, num_attention_heads=4,
                          num_key_value_heads=2)
    fold_checkpoint(plan_fold(str(tmp_path / "vha"), str(tmp_path / "folded")), progress=False)
    assert json.load(open(tmp_path / "folded" / "config.json"))["model_type"] == base
    plan = plan_convert(str(tmp_path / "folded"), str(tmp_path / "back"), kv_heads=2, q_head_dim=10, method="mean")
    convert_checkpoint(plan, LayerTensors(plan, "mean"), progress=False)
    assert family_of(str(tmp_path / "back")).model_type == f"{base}_vha"
    print(f"{base}: relative fit errors per layer (q, k, v): {plan.errors}")
    assert max(max(e) for e in plan.errors.values()) < 1e-6
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 11))
    want = to_numpy(vha(paddle.to_tensor(ids), return_dict=True).logits)
    assert rel_err(logits(tmp_path / "back", ids), want, f"{base}: VHA -> fold -> convert vs the VHA") <= 1e-5


@pytest.mark.parametrize("base", list(BASES))
def test_premix_off_at_the_same_kv_heads_is_exact_and_merging_heads_is_not(tmp_path, base):
    """convert_to_vha --premix off keeping the KV heads is the stock model plus an identity Postmix (its biases copied);
    merging 4 KV heads into 2 averages weights and biases alike (each new head's rows and bias are the group's
    means, checked here from the definition)."""
    from paddle_vha.checkpoint.folder import CheckpointFolder
    from paddle_vha.checkpoint.safetensors_io import read_tensor
    from paddle_vha.transform.convert_to_vha import LayerTensors, convert_checkpoint, plan_convert

    cfg, stock = save_model(base, tmp_path / "stock", num_attention_heads=4, num_key_value_heads=4)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 9))
    want = to_numpy(stock(paddle.to_tensor(ids), return_dict=True).logits)
    for n in (4, 2):
        out = tmp_path / f"n{n}"
        plan = plan_convert(str(tmp_path / "stock"), str(out), kv_heads=n, premix="off", method="mean")
        convert_checkpoint(plan, LayerTensors(plan, "mean"), progress=False)
        got = logits(out, ids)
        if n == 4:
            assert rel_err(got, want, f"{base}: premix off, 4 KV heads kept") <= 1e-6
            continue
        src, dst = CheckpointFolder.open(str(tmp_path / "stock")), CheckpointFolder.open(str(out))
        d = cfg.head_dim
        for leaf in ("k_proj.weight", "k_proj.bias", "v_proj.bias"):
            name = f"model.layers.0.self_attn.{leaf}"
            if name not in src.tensors:
                continue
            old = read_tensor(src.tensors[name]).astype(np.float64).reshape(2, 2, d, -1)  # (new head, old in it)
            new = read_tensor(dst.tensors[name]).astype(np.float64).reshape(2, d, -1)
            np.testing.assert_allclose(new, old.mean(axis=1), rtol=1e-6, atol=1e-7)
        print(f"{base}: 4 -> 2 KV heads, max |logit diff| {np.abs(got - want).max():.3f}")
        assert np.abs(got - want).max() > 1e-3  # a real approximation, not a copy


@pytest.mark.parametrize("base", list(BASES))
def test_compress_kv_is_exact_at_the_original_heads(tmp_path, base):
    """compress_kv keeping every KV head (N = H_kv) reproduces the stock model through HLC (biases through the SVD)."""
    from paddle_vha.transform.compress_kv import compress_checkpoint, plan_compress

    cfg, stock = save_model(base, tmp_path / "stock", num_attention_heads=4, num_key_value_heads=4)
    plan = plan_compress(str(tmp_path / "stock"), str(tmp_path / "mea"), kv_heads=4)
    compress_checkpoint(plan, progress=False)
    assert family_of(str(tmp_path / "mea")).model_type == f"{base}_mea"
    ids = np.random.default_rng(2).integers(0, cfg.vocab_size, (2, 9))
    want = to_numpy(stock(paddle.to_tensor(ids), return_dict=True).logits)
    assert rel_err(logits(tmp_path / "mea", ids), want, f"{base}: compress_kv N = H_kv vs the stock model") <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("base", list(BASES))
def test_hugging_face_reads_the_fold(tmp_path, hf_python, base):
    """The fold of a VHA over the base is a stock checkpoint Hugging Face's own LlamaForCausalLM / Qwen2ForCausalLM
    loads, and its logits (full and cached decode) are the float64 oracle's of the VHA checkpoint."""
    from test_fold_hf import run_hf
    from test_fold import read_state
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold

    cfg, _ = save_model(f"{base}_vha", tmp_path / "vha", vha_q_head_dim=12, tie_word_embeddings=True)
    fold_checkpoint(plan_fold(str(tmp_path / "vha"), str(tmp_path / "folded"), dtype="float64"), progress=False)
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 11))
    ref, _ = oracle.causal_lm(ids, read_state(tmp_path / "vha"), config_dict(cfg))
    hf = run_hf(hf_python, tmp_path / "folded", ids, tmp_path, ("float64",))["float64"]
    e_full = rel_err(hf["full"], ref, f"{base}: Hugging Face float64 on the fold vs the VHA float64 oracle")
    e_cached = rel_err(hf["cached"], ref, f"{base}: Hugging Face cached decode vs the oracle")
    assert e_full <= 1e-6 and e_cached <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("base", list(BASES))
def test_export_serves_in_onnxruntime_paddle_inference_and_genai(tmp_path, hf_python, base):
    """The folded stock model exports (self-validated), onnxruntime and Paddle Inference decode the same greedy tokens
    as PaddleFormers' own generate, and onnxruntime-genai runs it through its own decoder type for the base."""
    from test_clients import GENAI, NEW, PROMPTS, run_side
    from paddle_vha.export.onnx_export import export_onnx
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.serve.paddle_inference import PaddleInferenceDecoder
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold

    cfg, _ = save_model(f"{base}_vha", tmp_path / "vha", vocab_size=256)
    fold_checkpoint(plan_fold(str(tmp_path / "vha"), str(tmp_path / "folded")), progress=False)
    folded = family_of(str(tmp_path / "folded")).model_class.from_pretrained(str(tmp_path / "folded"))
    folded.eval()
    lines = []
    val = export_onnx(str(tmp_path / "folded"), str(tmp_path / "onnx"), decode_steps=8, log=lines.append)
    print("\n".join(lines))
    assert val.tokens_match and val.max_abs <= 1e-4
    genai = json.load(open(tmp_path / "onnx" / "genai_config.json"))
    assert genai["model"]["type"] == base
    prompt = np.random.default_rng(5).integers(0, 256, size=(2, 9))
    want, _ = folded.generate(paddle.to_tensor(prompt), max_new_tokens=NEW, decode_strategy="greedy_search")
    for sess in (OrtDecoder.from_dir(str(tmp_path / "onnx")), PaddleInferenceDecoder(str(tmp_path / "onnx"))):
        got = generate(sess, prompt, max_new_tokens=NEW).tokens
        print(type(sess).__name__, got.tolist())
        assert np.array_equal(got, want.numpy())
    got = run_side(hf_python, tmp_path, GENAI, tmp_path / "onnx", json.dumps(PROMPTS), NEW)
    for text, g in zip(PROMPTS, got):
        ids = list(text.encode("utf-8"))
        ours, _ = folded.generate(paddle.to_tensor([ids]), max_new_tokens=len(g["new"]), decode_strategy="greedy_search")
        print(repr(text), "genai", g["new"], "paddle", ours.numpy()[0].tolist())
        assert g["ids"] == ids and g["new"] == ours.numpy()[0].tolist()


def test_calculators_count_what_each_base_declares():
    """Parameter counts per attention layer follow the base's spec: Qwen3 has q/k norms, Llama and Qwen2 do not;
    Qwen2's biases sit on q/k/v only. Checked against a built model of each base."""
    from paddle_vha.accounting import arch_from_config, attention_parameters_per_layer

    for model_type in ("qwen3", "llama", "qwen2"):
        fam = family(model_type)
        fields = {**TINY, **(BASES.get(model_type) or dict(attention_bias=True)), "tie_word_embeddings": False}
        model = fam.model_class(fam.config_class(**fields))
        built = sum(int(np.prod(p.shape)) for n, p in model.named_parameters() if ".layers.0.self_attn." in n)
        counted = attention_parameters_per_layer(arch_from_config({**fields, "model_type": model_type}))["total"]
        print(f"{model_type}: built {built:,} attention parameters per layer, counted {counted:,}")
        assert counted == built


@pytest.mark.slow
def test_qwen2_at_real_width_converts_folds_and_exports(tmp_path):
    """A Qwen2 at Qwen3-0.6B's widths as a hub download looks (tools/fixtures/qwen3_shaped.py --arch qwen2, 1 layer:
    vocabulary 151,936, head_dim 128 != hidden / heads, q/k/v biases, bf16 shards, a BPE tokenizer): convert_to_vha
    --premix off to 2 KV heads, fold back (--verify exact) and export; the export self-validates, carries the
    tokenizer, and names genai's qwen2 decoder."""
    from tools.fixtures.qwen3_shaped import make_checkpoint
    from paddle_vha.cli import convert_to_vha, export_onnx, fold

    src = str(tmp_path / "qwen2")
    make_checkpoint(src, "0.6b", layers=1, arch="qwen2")
    vha, folded, onnx = (str(tmp_path / n) for n in ("vha", "folded", "onnx"))
    assert convert_to_vha.main([src, vha, "--kv-heads", "2", "--premix", "off", "--eval-batches", "0",
                                "--no-progress"]) == 0
    assert family_of(vha).model_type == "qwen2_vha"
    assert fold.main([vha, folded, "--verify", "--no-progress"]) == 0
    assert export_onnx.main([folded, onnx, "--decode-steps", "4"]) == 0
    info = json.load(open(os.path.join(onnx, "export_info.json")))
    genai = json.load(open(os.path.join(onnx, "genai_config.json")))
    print(json.dumps(info)[:400])
    assert genai["model"]["type"] == "qwen2" and genai["model"]["decoder"]["head_size"] == 128
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(onnx))


@pytest.mark.parametrize("base", list(BASES))
def test_qwen3_only_options_are_refused_in_one_line(base, tmp_path):
    """Shared-KV, sliding-window layers and sinks fold into Qwen3 shared-KV / Qwen3 with sinks, which exist over Qwen3
    only: over Llama and Qwen2 each is refused when the config is built, in one line; the fused prologue (Premix +
    q/k RMSNorm + RoPE) has no q/k norm to run; a Llama whose heads x head_dim is not its hidden size is refused by
    the checkpoint contract before PaddleFormers' assertion."""
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.vha.config import VHAConfigError

    fam = family(f"{base}_vha")
    fields = {**TINY, **BASES[base]}
    window = dict(sliding_window=4, use_sliding_window=True, layer_types=["sliding_attention", "full_attention"])
    for extra, needle in ((dict(vha_shared_kv=True), "vha_shared_kv=true: "),
                          (window, "sliding-window layers (layer_types): "),
                          (dict(window, window_attention_sinks=True), "sliding-window layers (layer_types): ")):
        with pytest.raises(VHAConfigError) as e:
            fam.config_class(**fields, **extra)
        print(e.value)
        assert needle in str(e.value) and "folds into stock" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(VHAConfigError, match="has no q/k norm"):
        fam.model_class(fam.config_class(**fields, vha_fused_prologue=True))
    if base == "llama":
        save_model("llama", tmp_path / "m")
        cfg = json.load(open(tmp_path / "m" / "config.json"))
        cfg["head_dim"] = 8
        json.dump(cfg, open(tmp_path / "m" / "config.json", "w"))
        with pytest.raises(CheckpointError, match=r"num_attention_heads 4 x head_dim 8 = 32 differs from hidden_size 64"):
            family("llama").validate(str(tmp_path / "m"))


def test_regrouping_moves_qwen2s_biases_with_their_heads(tmp_path):
    """Permuting a Qwen2's KV heads (the query heads following, as --regroup does) with their q/k/v biases leaves the
    float64 oracle's logits unchanged; leaving the biases in place does not."""
    from test_fold import read_state
    from paddle_vha.transform import regroup as rg

    cfg, _ = save_model("qwen2", tmp_path / "m", num_attention_heads=6, num_key_value_heads=3)
    state, c = read_state(tmp_path / "m"), config_dict(cfg)
    order, h, kv, d = [2, 0, 1], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    moved, weights_only = dict(state), dict(state)
    for i in range(cfg.num_hidden_layers):
        for t in rg.PERMUTED:
            name = f"model.layers.{i}.self_attn.{t}"
            moved[name] = rg.permute_heads(name, state[name], order, h, kv, d)
            if t.endswith(".weight"):
                weights_only[name] = moved[name]
    ids = np.random.default_rng(4).integers(0, cfg.vocab_size, (2, 7))
    ref = oracle.stock_causal_lm(ids, state, c)[0]
    assert rel_err(oracle.stock_causal_lm(ids, moved, c)[0], ref, "qwen2: heads and biases permuted") <= 1e-12
    assert np.abs(oracle.stock_causal_lm(ids, weights_only, c)[0] - ref).max() > 1e-3
