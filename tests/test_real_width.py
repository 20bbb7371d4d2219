"""A checkpoint at the widths users bring, through every product command: convert -> fold -> export -> generate.

The input is what a hub download of Qwen3-0.6B looks like (tools/fixtures/qwen3_shaped.py: hidden 1024, 16 query /
8 KV heads, head_dim 128 != hidden / heads, vocabulary 151,936, sharded bf16 safetensors, a byte-level BPE tokenizer
with special tokens at Qwen3's ids, a chat template, generation_config.json with two EOS ids), cut to 2 layers with
untied embeddings (1.37 GB of float32 weights). Each stage runs the command a user types. The export writes its
weights as ONNX external data (--external-data: the code path a > 2 GB model takes automatically), in both cache
flavours. The outcome is checked by the programs that read it: Hugging Face transformers (side environment) on the
fold is the independent reference whose greedy tokens tools/generate.py (onnxruntime, text and ids), our onnxruntime
session and Paddle Inference must reproduce from the exports.
"""
import filecmp
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tools.fixtures.qwen3_shaped import SPECIAL_TOKENS, make_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
              "chat_template.jinja")
PROMPT = "def fibonacci(n):\n    return"
NEW = 6

pytestmark = pytest.mark.slow


def run_tool(name, *args):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", name + ".py"), *map(str, args)],
                       capture_output=True, text=True, cwd=ROOT, timeout=1200)
    print(f"$ {name} {' '.join(map(str, args))}\n{r.stdout[-2500:]}\n{r.stderr[-2500:]}")
    assert r.returncode == 0, r.stderr[-2000:]
    return r


HF_GREEDY = """
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, prompt, new = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok(prompt)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=0)
    new_ids = out[0, len(ids):].tolist()
    print(json.dumps(dict(ids=ids, new=new_ids, text=tok.decode(new_ids, skip_special_tokens=True))))
"""


@pytest.fixture(scope="module")
def stages(tmp_path_factory, request):
    """The folders every stage wrote (src: the user's checkpoint, vha, folded, onnx) and Hugging Face's greedy
    continuation of PROMPT on the fold. The side env (hf_python) is asked for after the stages, not before: on a
    clean clone it may still be installing (by .ci/run or the other worker), and the stages need none of it."""
    root = tmp_path_factory.mktemp("real-width")
    d = {k: root / k for k in ("src", "vha", "folded", "onnx")}
    make_checkpoint(str(d["src"]), "0.6b", layers=2, untied=True, dtype="bfloat16", max_shard_bytes=400 << 20)
    d["convert_log"] = run_tool("convert_to_vha", d["src"], d["vha"], "--kv-heads", 2, "--method", "svd",
                                "--no-compare", "--eval-batches", 1, "--no-progress").stdout
    run_tool("fold", d["vha"], d["folded"], "--verify", 1, "--no-progress")
    d["export_log"] = run_tool("export_onnx", d["folded"], d["onnx"], "--decode-steps", 4, "--external-data").stdout
    (root / "hf.py").write_text(textwrap.dedent(HF_GREEDY))
    hf_python = request.getfixturevalue("hf_python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([hf_python, str(root / "hf.py"), str(d["folded"]), PROMPT, str(NEW)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    d["hf"] = json.loads(r.stdout.strip().splitlines()[-1])
    return d


def test_the_input_is_real_shaped_and_converted_with_its_tokenizer(stages):
    cfg = json.load(open(stages["src"] / "config.json"))
    index = json.load(open(stages["src"] / "model.safetensors.index.json"))
    assert cfg["vocab_size"] == 151936 and cfg["head_dim"] == 128 != cfg["hidden_size"] // cfg["num_attention_heads"]
    assert len(set(index["weight_map"].values())) > 1, "sharded, as hub checkpoints are"
    assert "tokenized with the checkpoint's tokenizer" in stages["convert_log"]
    assert max(stages["hf"]["ids"]) < min(SPECIAL_TOKENS.values()), "a BPE encoding of plain text"


@pytest.mark.parametrize("stage", ["vha", "folded", "onnx"])
def test_tokenizer_and_generation_files_survive(stages, stage):
    have = set(os.listdir(stages[stage]))
    print(stage, sorted(have))
    for name in SIDE_FILES:
        assert name in have, f"{stage} lost {name}"
        assert filecmp.cmp(stages[stage] / name, stages["src"] / name, shallow=False), name


def test_fold_is_a_stock_gqa2_qwen3_and_the_export_holds_external_data(stages):
    cfg = json.load(open(stages["folded"] / "config.json"))
    assert cfg["model_type"] == "qwen3" and cfg["num_key_value_heads"] == 2 and cfg.get("use_cache", True)
    assert (cfg["num_attention_heads"], cfg["head_dim"], cfg["vocab_size"]) == (16, 128, 151936)
    onnx_dir = stages["onnx"]
    graph, data = os.path.getsize(onnx_dir / "model.onnx"), os.path.getsize(onnx_dir / "model.onnx.data")
    print(f"model.onnx {graph} B, model.onnx.data {data / 1e6:.1f} MB")
    assert graph < 1_000_000 and data > 1_000_000_000
    genai = json.load(open(onnx_dir / "genai_config.json"))
    gen = json.load(open(stages["src"] / "generation_config.json"))
    assert genai["model"]["eos_token_id"] == gen["eos_token_id"] and genai["model"]["decoder"]["head_size"] == 128


def _generated_ids(stdout: str):
    return [int(t) for t in stdout.strip().splitlines()[0].split("] ", 1)[1].split(",")]


def test_generate_reproduces_hugging_face_from_ids_and_from_text(stages):
    hf = stages["hf"]
    ours = run_tool("generate", stages["onnx"], "--prompt-ids", ",".join(map(str, hf["ids"])),
                    "--max-new-tokens", NEW, "--ignore-eos")
    print("HF:", hf["new"], "ours:", _generated_ids(ours.stdout))
    assert _generated_ids(ours.stdout) == hf["new"], "onnxruntime on the export = Hugging Face on the fold"
    text = run_tool("generate", stages["onnx"], "--prompt", PROMPT, "--max-new-tokens", NEW, "--ignore-eos")
    assert text.stdout.startswith(f"[0] {PROMPT}"), text.stdout
    shown = text.stdout[len(f"[0] {PROMPT}"):]
    print("HF text:", repr(hf["text"]), "ours:", repr(shown))
    assert shown == hf["text"] + "\n", "the prompt is encoded and the output decoded with the checkpoint's tokenizer"


def test_buffer_flavour_on_onnxruntime_and_paddle_inference(stages, tmp_path):
    from paddle_vha.export.onnx_export import export_onnx
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.serve.paddle_inference import PaddleInferenceDecoder

    out = str(tmp_path / "buffer")
    val = export_onnx(str(stages["folded"]), out, external_data=True, cache_io="buffer", decode_steps=4,
                      log=print)
    assert val.max_abs <= 1e-4 and val.tokens_match
    prompt, want = np.array([stages["hf"]["ids"]]), np.array([stages["hf"]["new"]])
    for sess in (OrtDecoder.from_dir(out), PaddleInferenceDecoder(out), PaddleInferenceDecoder(str(stages["onnx"]))):
        got = generate(sess, prompt, NEW).tokens
        print(type(sess).__name__, got.tolist(), "Hugging Face:", want.tolist())
        assert np.array_equal(got, want), type(sess).__name__
