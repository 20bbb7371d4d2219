"""The export at the sizes users have: a checkpoint at Qwen3-0.6B's widths (vocabulary 151,936, head_dim 128 !=
hidden / heads, untied embeddings, a real byte-level BPE tokenizer with Qwen3's special-token ids, a generation
config listing two EOS ids), exported with its weights as ONNX external data by the same code path a > 2 GB model
takes; and the cheap checks of the 2 GB decision, the up-front memory refusal and the files a runtime needs."""
from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from hostile import refused, save_stock, tree
from paddle_vha.export import memory, weights
from paddle_vha.export.onnx_export import export_onnx
from paddle_vha.serve.generate import generate
from paddle_vha.serve.ort_session import OrtDecoder
from paddle_vha.serve.paddle_inference import PaddleInferenceDecoder

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "config.json")
NEW = 6


HF_GREEDY = """
import json, sys
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
model.eval()
ids = json.loads(sys.argv[2])
with torch.no_grad():
    out = model.generate(torch.tensor([ids]), max_new_tokens=int(sys.argv[3]), do_sample=False)
print(json.dumps(out[0, len(ids):].tolist()))
"""


@pytest.fixture(scope="module")
def realistic(tmp_path_factory, hf_python):
    """A 2-layer checkpoint at Qwen3-0.6B widths, untied, bf16 on disk (1.37 GB of float32 weights); a prompt of
    its own tokenizer; and Hugging Face transformers' greedy tokens for it (torch fp32, the side environment): the
    independent reference."""
    from tokenizers import Tokenizer

    from tools.fixtures.qwen3_shaped import make_checkpoint

    root = tmp_path_factory.mktemp("q06")
    ckpt = str(root / "ckpt")
    make_checkpoint(ckpt, shape="0.6b", layers=2, untied=True)
    prompt = Tokenizer.from_file(os.path.join(ckpt, "tokenizer.json")).encode("def fibonacci(n):\n    return").ids
    (root / "hf.py").write_text(HF_GREEDY)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([hf_python, str(root / "hf.py"), ckpt, json.dumps(prompt), str(NEW)], capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return root, np.array([prompt], np.int64), np.array([json.loads(r.stdout.strip().splitlines()[-1])])


@pytest.mark.slow
@pytest.mark.parametrize("cache_io", ["concat", "buffer"])
def test_realistic_width_export_with_external_data(realistic, cache_io):
    root, prompt, want = realistic
    ckpt, out = str(root / "ckpt"), str(root / cache_io)
    try:
        _check_realistic_export(ckpt, out, cache_io, prompt, want)
    finally:
        shutil.rmtree(out, ignore_errors=True)  # 2.7 GB per flavour


def _check_realistic_export(ckpt, out, cache_io, prompt, want):
    lines = []
    val = export_onnx(ckpt, out, external_data=True, cache_io=cache_io, decode_steps=4, log=lines.append)
    print("\n".join(lines))
    assert val.max_abs <= 1e-4 and val.tokens_match and val.steps == 4
    data, graph = os.path.getsize(os.path.join(out, "model.onnx.data")), os.path.getsize(os.path.join(out, "model.onnx"))
    print(f"model.onnx {graph} B, model.onnx.data {data / 1e6:.1f} MB")
    assert graph < 1_000_000 and data >= 1_370_000_000
    for name in TOKENIZER_FILES:  # every tokenizer / generation file survives, byte for byte
        assert filecmp.cmp(os.path.join(ckpt, name), os.path.join(out, name), shallow=False), name
    for sess in (OrtDecoder.from_dir(out), PaddleInferenceDecoder(out)):
        got = generate(sess, prompt, NEW).tokens
        print(type(sess).__name__, got.tolist(), "Hugging Face:", want.tolist())
        assert np.array_equal(got, want), type(sess).__name__
    if cache_io == "concat":
        gen = json.load(open(os.path.join(ckpt, "generation_config.json")))
        genai = json.load(open(os.path.join(out, "genai_config.json")))
        assert genai["model"]["eos_token_id"] == gen["eos_token_id"] == [151645, 151643]
        assert (genai["model"]["pad_token_id"], genai["model"]["bos_token_id"]) == (151643, 151643)
        assert genai["model"]["context_length"] == 40960 and genai["model"]["decoder"]["head_size"] == 128
        assert genai["search"]["do_sample"] is False and genai["search"]["top_k"] == gen["top_k"]


def test_external_data_decision_at_the_protobuf_limit():
    limit, margin = weights.PROTOBUF_LIMIT, weights.MARGIN
    graph = 3_000_000
    assert not weights.needs_external_data(limit - margin - graph, graph)
    assert weights.needs_external_data(limit - margin - graph + 1, graph)
    qwen3_06b = 596_049_920 * 4  # float32 bytes of Qwen3-0.6B (tied): over the limit
    assert weights.needs_external_data(qwen3_06b, graph) and not weights.needs_external_data(qwen3_06b // 2, graph)


def test_automatic_switch_writes_external_data_past_the_limit(tmp_path, monkeypatch):
    """The automatic decision, on a real export: with the limit moved below this model's size the weights go to
    model.onnx.data, validated; at the real limit they stay inline."""
    src = save_stock(tmp_path / "in")
    export_onnx(src, str(tmp_path / "inline"), decode_steps=2, log=lambda m: None)
    size = os.path.getsize(tmp_path / "inline" / "model.onnx")
    assert not (tmp_path / "inline" / "model.onnx.data").exists()
    monkeypatch.setattr(weights, "PROTOBUF_LIMIT", size - 1)
    val = export_onnx(src, str(tmp_path / "ext"), decode_steps=2, log=lambda m: None)
    small = os.path.getsize(tmp_path / "ext" / "model.onnx")
    print(f"inline model.onnx {size} B; with the limit at {size - 1} B: model.onnx {small} B + model.onnx.data "
          f"{os.path.getsize(tmp_path / 'ext' / 'model.onnx.data')} B, max abs {val.max_abs:.1e}")
    assert small < size // 2 and val.tokens_match
    assert json.load(open(tmp_path / "ext" / "export_info.json"))["external_data"] == "model.onnx.data"


def test_export_refuses_up_front_when_memory_is_short(tmp_path, capsys, monkeypatch):
    from paddle_vha.cli.export_onnx import main
    from paddle_vha.export import reference

    src = save_stock(tmp_path / "in")
    monkeypatch.setattr(memory, "available_bytes", lambda: 10**8)  # 0.1 GB free + 0.1 GB held: under the base alone
    monkeypatch.setattr(memory, "resident_bytes", lambda: 10**8)

    def no_reads(*a, **k):
        raise AssertionError("a weight was read before the memory check")

    monkeypatch.setattr(reference.st, "read_tensor", no_reads)
    before = tree(tmp_path)
    line = refused(main, [src, str(tmp_path / "out")], capsys, "the export needs about")
    assert "0.2 GB (MemAvailable and this process)" in line
    assert tree(tmp_path) == before
    assert memory.export_memory_need(2 * 10**9) == int(memory.NEED_BASE + memory.NEED_FACTOR * 2e9)


def test_tokenizer_and_generation_files_survive_and_genai_is_greedy(tmp_path):
    """A real tokenizer's side files are copied as they are; genai_config takes the generation config's EOS list
    and pad / bos ids, and searches greedily as docs/deploy.md says (its sampling values kept, inert)."""
    src = save_stock(tmp_path / "in")
    gen = {"bos_token_id": 5, "eos_token_id": [7, 5], "pad_token_id": 5, "do_sample": True, "temperature": 0.6,
           "top_k": 20, "top_p": 0.95}
    side = {"generation_config.json": json.dumps(gen), "chat_template.jinja": "{{ messages }}",
            "special_tokens_map.json": json.dumps({"eos_token": "<e>"}), "tokenizer_config.json": "{}",
            "added_tokens.json": "{}"}
    for name, text in side.items():
        (tmp_path / "in" / name).write_text(text)
    export_onnx(src, str(tmp_path / "out"), decode_steps=1, log=lambda m: None)
    for name in side:
        assert (tmp_path / "out" / name).read_text() == side[name], name
    genai = json.load(open(tmp_path / "out" / "genai_config.json"))
    print(genai["model"]["eos_token_id"], genai["search"])
    assert genai["model"]["eos_token_id"] == [7, 5] and genai["model"]["pad_token_id"] == 5
    assert genai["model"]["bos_token_id"] == 5
    assert genai["search"]["do_sample"] is False
    assert (genai["search"]["temperature"], genai["search"]["top_k"], genai["search"]["top_p"]) == (0.6, 20, 0.95)
