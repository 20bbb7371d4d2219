"""The export at the sizes users have: the 2 GB decision, the up-front memory refusal and the files a runtime needs.
The realistic-width export itself (0.6B widths, external data, both cache flavours, onnxruntime and Paddle Inference
against Hugging Face's greedy tokens) runs in tests/test_real_width.py, on the fold of a converted checkpoint."""
from __future__ import annotations

import json
import os

import pytest

from hostile import refused, save_stock, tree
from paddle_vha.export import memory, weights
from paddle_vha.export.onnx_export import export_onnx


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
