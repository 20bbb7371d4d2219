"""llama.cpp serves the folded checkpoint: its own converter (vendor/llama.cpp/convert_hf_to_gguf.py of
llama-cpp-python's source distribution) writes GGUF F32 / F16 / Q8_0, llama.cpp's quantizer (llama_model_quantize)
Q4_0 from the F32 file, and llama.cpp's greedy tokens on F32 are PaddleFormers' generate. Runs in the side
environment of tools/llama_env.sh (built here from the sdist: ~20+ min the first time, cached by pip afterwards).

The converter names a BPE tokenizer's pre-tokenizer by hashing the ids it gives a fixed text and refuses one it does
not know, so the checkpoint carries Qwen's real tokenizer, rebuilt from llama.cpp's models/ggml-vocab-qwen2.gguf
(tools/fixtures/qwen2_vocab.py); the model is a narrow Qwen3-VHA at Qwen3's 151,936-token vocabulary."""
import json
import os
import subprocess
import textwrap

import numpy as np
import paddle
import pytest
from paddleformers.transformers import Qwen3ForCausalLM

from _utils import llama_side_env, tiny_config
from paddle_vha import Qwen3VHAForCausalLM
from tools.bench_llamacpp import EXTRA_BUFTS_SWITCH, run_side

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = ["def fib(n):\n    ", "Hello world, this is", "# héllo wörld €\n"]  # multi-byte UTF-8 in the last one
NEW = 12
# teacher-forced next-token agreement with PaddleFormers and mean KL(paddle || llama.cpp) per GGUF format; measured
# 2026-12-01: F32 1.000 / 9.9e-07, F16 1.000 / 6.6e-06, Q8_0 0.917 / 2.3e-03, Q4_0 0.639 / 0.30 (36 positions)
BOUNDS = {"F32": (1.0, 1e-5), "F16": (0.9, 1e-3), "Q8_0": (0.85, 2e-2), "Q4_0": (0.5, 0.5)}


@pytest.fixture(scope="module")
def llama_env():
    return llama_side_env()


def side(python, tmp_path, script, *args, timeout=900):
    """The script's last stdout line (JSON), run in the side environment. A run llama.cpp kills with SIGSEGV is run once
    more without its extra weight buffer types (tools/bench_llamacpp.py's run_side: on an AMX Xeon llama.cpp 0.3.36
    crashed through its AMX buffers on this test's Q8_0 file, 2026-12), saying so."""
    r, retried = run_side(python, EXTRA_BUFTS_SWITCH + textwrap.dedent(script), args, timeout=timeout,
                          cwd=str(tmp_path))
    print(r.stdout[-3000:], r.stderr[-3000:], "(retried without extra buffer types)" if retried else "")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def folded_with_qwen_tokenizer(root, vocab_gguf):
    """A Qwen3-VHA at Qwen3's vocabulary with Qwen's tokenizer, folded by the library."""
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold
    from tools.fixtures.qwen3_shaped import write_tokenizer

    paddle.seed(29)
    cfg = tiny_config(vocab_size=151936, hidden_size=64, intermediate_size=128, head_dim=32,
                      vha_postmix_v_init_std=0.3, max_position_embeddings=512)
    model = Qwen3VHAForCausalLM(cfg)
    for n, p in model.named_parameters():  # a sharper distribution than init, so greedy paths are not all ties
        if n.endswith("embed_tokens.weight") or n.endswith("lm_head.weight"):
            p.set_value(paddle.randn(p.shape) * 0.5)
    model.save_pretrained(str(root / "vha"))
    write_tokenizer(str(root / "vha"), vocab_gguf=vocab_gguf)
    fold_checkpoint(plan_fold(str(root / "vha"), str(root / "folded")), progress=False)
    folded = Qwen3ForCausalLM.from_pretrained(str(root / "folded"))
    folded.eval()
    return folded


CONVERT = """
    import json, os, subprocess, sys, time
    import llama_cpp
    src, folded, out = sys.argv[1:4]
    conv = os.path.join(src, "vendor", "llama.cpp", "convert_hf_to_gguf.py")
    done = {}
    for kind in ("f32", "f16", "q8_0"):
        t = time.time()
        path = os.path.join(out, kind + ".gguf")
        r = subprocess.run([sys.executable, conv, folded, "--outfile", path, "--outtype", kind], capture_output=True,
                           text=True)
        if r.returncode != 0:
            sys.exit("convert_hf_to_gguf " + kind + ": " + r.stderr[-2000:])
        done[kind.upper()] = dict(path=path, seconds=round(time.time() - t, 1))
    t = time.time()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    path = os.path.join(out, "q4_0.gguf")
    rc = llama_cpp.llama_model_quantize(done["F32"]["path"].encode(), path.encode(), params)
    if rc != 0:
        sys.exit(f"llama_model_quantize Q4_0: {rc}")
    done["Q4_0"] = dict(path=path, seconds=round(time.time() - t, 1))
    print(json.dumps(done))
"""

RUN = """
    import json, os, sys
    import numpy as np
    import gguf
    from llama_cpp import Llama
    path, prompts, new, forced_path = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    logits_dir = sys.argv[5]  # each run's logits as .npy (36 x 151,936 as JSON numbers was ~113 MB a format)
    forced = json.load(open(forced_path))
    meta = gguf.GGUFReader(path)
    pre = bytes(meta.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    types = sorted({t.tensor_type.name for t in meta.tensors})
    llm = Llama(model_path=path, n_ctx=256, n_threads=2, logits_all=True, verbose=False, seed=0)
    out = []
    for text, seq in zip(prompts, forced):
        ids = llm.tokenize(text.encode(), add_bos=False, special=False)
        llm.reset()
        llm.eval(ids)
        greedy = []
        for _ in range(new):
            greedy.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([greedy[-1]])
        llm.reset()
        llm.eval(seq)  # the prompt and PaddleFormers' greedy tokens: llama.cpp's logits at each position
        logits = np.asarray(llm.scores[len(ids) - 1:len(seq) - 1], np.float64)
        saved = os.path.join(logits_dir, os.path.basename(path) + f".{len(out)}.npy")
        np.save(saved, logits)
        out.append(dict(ids=[int(i) for i in ids], greedy=greedy, logits=saved))
    print(json.dumps(dict(pre=pre, types=types, runs=out)))
"""


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.slow
def test_llamacpp_serves_the_folded_checkpoint(tmp_path, llama_env):
    python, src = llama_env
    vocab = os.path.join(src, "vendor", "llama.cpp", "models", "ggml-vocab-qwen2.gguf")
    folded = folded_with_qwen_tokenizer(tmp_path, vocab)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp_path / "folded" / "tokenizer.json"))
    (tmp_path / "gguf").mkdir()
    made = side(python, tmp_path, CONVERT, src, tmp_path / "folded", tmp_path / "gguf")
    print({k: v["seconds"] for k, v in made.items()}, "s per GGUF file")
    forced, want_logits = [], []
    for text in PROMPTS:
        ids = tok.encode(text).ids
        out, _ = folded.generate(paddle.to_tensor(np.asarray([ids])), max_new_tokens=NEW,
                                 decode_strategy="greedy_search")
        seq = ids + out.numpy()[0].tolist()
        forced.append(seq)
        with paddle.no_grad():
            logits = folded(paddle.to_tensor(np.asarray([seq])))[0].astype("float64").numpy()[0]  # (S, V)
        want_logits.append(logits[len(ids) - 1:len(seq) - 1])
    (tmp_path / "forced.json").write_text(json.dumps(forced))
    for fmt, (min_agree, max_kl) in BOUNDS.items():
        got = side(python, tmp_path, RUN, made[fmt]["path"], json.dumps(PROMPTS), NEW, tmp_path / "forced.json",
                   tmp_path / "gguf")
        assert got["pre"] == "qwen2", got["pre"]  # the converter recognised the tokenizer
        agree, kls = [], []
        for text, seq, ref, run in zip(PROMPTS, forced, want_logits, got["runs"]):
            n = len(run["ids"])
            assert run["ids"] == seq[:n], f"llama.cpp's tokenizer: {run['ids']} != {seq[:n]} for {text!r}"
            lg = np.load(run["logits"])
            p_ref, p_got = log_softmax(ref), log_softmax(lg)
            kls.append(float((np.exp(p_ref) * (p_ref - p_got)).sum(-1).mean()))
            agree.append(float((lg.argmax(-1) == ref.argmax(-1)).mean()))
            print(fmt, got["types"], repr(text), "llama.cpp", run["greedy"], "paddle", seq[n:])
            if fmt == "F32":
                assert run["greedy"] == seq[n:], "llama.cpp's greedy tokens on F32 are PaddleFormers'"
        print(f"{fmt}: next-token agreement {np.mean(agree):.3f}, mean KL {np.mean(kls):.2e} "
              f"(bounds >= {min_agree}, <= {max_kl})")
        assert np.mean(agree) >= min_agree and np.mean(kls) <= max_kl, fmt
