"""The checkpoint transforms at Qwen3-0.6B widths (tools/fixtures/qwen3_shaped.py, 2 layers: vocabulary 151,936,
head_dim 128 != hidden / heads, tied embeddings, bf16 shards, a trained BPE tokenizer with Qwen3's special ids).

Calibration and the KL read text tokenized with the checkpoint's tokenizer (checked against the tokenizers package
directly), the layer-by-layer forward and blocked KL equal a whole-model forward's logits compared in full
(paddle_vha.evaluate.compare_logits, independent of the blocks), tokenizer and generation files survive, and a
machine without the memory a transform needs refuses it up front in one line."""
import json
import os

import numpy as np
import pytest

from tools.fixtures.qwen3_shaped import make_checkpoint

SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
              "generation_config.json")


@pytest.fixture(scope="module")
def shaped(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("shaped") / "qwen3-0.6b-2l")
    make_checkpoint(path, "0.6b", layers=2)
    return path


def _calib_file(tmp_path) -> str:
    import json as js
    import sysconfig

    root = sysconfig.get_paths()["stdlib"]
    docs = [open(os.path.join(root, f), encoding="utf-8").read() for f in ("argparse.py", "textwrap.py")]
    path = str(tmp_path / "calib.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(js.dumps({"text": d}) + "\n")
    return path


def test_text_is_tokenized_with_the_checkpoints_tokenizer(shaped, tmp_path):
    """--calib-data FILE.jsonl: the ids are the tokenizers package's own encoding of the file's texts (not bytes),
    the last tenth held out; no tokenizer.json at a 151,936 vocabulary: one line, no byte fallback."""
    from tokenizers import Tokenizer

    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.transform.text import load_text

    calib = _calib_file(tmp_path)
    text = load_text(shaped, 151936, calib, CheckpointError)
    tok = Tokenizer.from_file(os.path.join(shaped, "tokenizer.json"))
    docs = [json.loads(line)["text"] for line in open(calib, encoding="utf-8")]
    want = np.concatenate([tok.encode(d, add_special_tokens=False).ids for d in docs])
    got = np.concatenate([text.train, text.val])
    print(f"{len(got)} tokens, max id {got.max()}, {len(text.val)} held out; "
          f"{len(''.join(docs).encode())} bytes of text")
    assert np.array_equal(got, want) and got.max() > 255 and len(got) < 0.6 * len("".join(docs).encode())
    assert len(text.val) == len(got) - int(len(got) * 0.9)
    assert "tokenized with the checkpoint's tokenizer" in text.describe(10, "train")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(open(os.path.join(shaped, "config.json")).read())
    with pytest.raises(CheckpointError, match="no tokenizer.json, and its 151936-token vocabulary is not byte-level"):
        load_text(str(bare), 151936, None, CheckpointError)


@pytest.mark.slow
def test_layerwise_kl_equals_the_whole_model_comparison(shaped, tmp_path):
    """A converted model (--kv-heads 2) against the original at full width: the blocked, layer-by-layer statistics
    equal compare_logits on both models' whole logits from from_pretrained (PaddleFormers' own loader)."""
    import paddle
    from paddleformers.transformers import Qwen3ForCausalLM

    from paddle_vha import Qwen3VHAForCausalLM
    from paddle_vha.evaluate import compare_logits
    from paddle_vha.transform import convert_to_vha as cv
    from paddle_vha.transform import layerwise as lw

    plan = cv.plan_convert(shaped, str(tmp_path / "vha"), 2, method="svd")
    tensors = cv.LayerTensors(plan, "svd")
    ids = np.random.default_rng(0).integers(0, 151936, size=(2, 24))
    ref, cand = lw.folder_weights(shaped, Qwen3ForCausalLM), cv.candidate_weights(plan, tensors)
    got = lw.logit_stats(ref, lw.final_hidden(ref, [ids]), cand, lw.final_hidden(cand, [ids]))
    cv.convert_checkpoint(plan, cv.LayerTensors(plan, "svd"), progress=False)

    def whole(cls, path):
        model = cls.from_pretrained(path, dtype="float32")
        model.eval()
        with paddle.no_grad():
            return model(paddle.to_tensor(ids), return_dict=True).logits.astype("float64").numpy()

    want = compare_logits(whole(Qwen3ForCausalLM, shaped), whole(Qwen3VHAForCausalLM, plan.out_dir))
    print(f"layerwise {got}\nwhole     {want}")
    assert got["nonfinite"] == "" and np.isfinite(got["mean_kl"]) and got["mean_kl"] > 0
    assert abs(got["mean_kl"] - want["mean_kl"]) <= 1e-4 * want["mean_kl"]
    assert abs(got["max_rel"] - want["max_rel"]) <= 1e-4 * want["max_rel"]
    for f in SIDE_FILES:
        assert open(os.path.join(shaped, f), "rb").read() == open(os.path.join(plan.out_dir, f), "rb").read(), f


@pytest.mark.slow
def test_calibrated_conversion_at_realistic_width(shaped, tmp_path, capsys):
    """The command line: --method calibrated on a --calib-data file says what it calibrated on, reports a finite KL,
    and keeps the tokenizer, chat template and generation config."""
    from paddle_vha.cli import convert_to_vha

    calib, out = _calib_file(tmp_path), str(tmp_path / "out")
    assert convert_to_vha.main([shaped, out, "--kv-heads", "2", "--method", "calibrated", "--calib-data", calib,
                                "--calib-tokens", "1024", "--eval-batches", "1", "--eval-len", "64", "--no-compare",
                                "--no-progress"]) == 0
    said = capsys.readouterr().out
    print(said)
    assert (f"calibration: E[x x^T] of 2 attention inputs over 1024 tokens of {calib}, tokenized with the "
            "checkpoint's tokenizer") in said
    assert f"on 256 held-out tokens of {calib}, tokenized with the checkpoint's tokenizer" in said
    kl = float(said.split("calibrated KL ")[1].split()[0])
    assert 0 < kl < 5, kl
    assert "memory: needs about" in said
    for f in SIDE_FILES:
        assert open(os.path.join(shaped, f), "rb").read() == open(os.path.join(out, f), "rb").read(), f


def test_refused_up_front_when_memory_is_short(shaped, tmp_path, capsys, monkeypatch):
    """MemAvailable below the need: one line, exit 2, nothing written, before any tensor is read (convert, compress,
    fold's plan path through run_transform)."""
    from paddle_vha.cli import compress_kv, convert_to_vha
    from paddle_vha.transform import memory

    monkeypatch.setattr(memory, "mem_available", lambda: 100 << 20)
    for main, extra in ((convert_to_vha.main, ["--kv-heads", "2"]), (compress_kv.main, ["--kv-heads", "4"])):
        out = str(tmp_path / "out")
        with pytest.raises(SystemExit) as e:
            main([shaped, out, "--no-progress", *extra])
        err = capsys.readouterr().err.strip()
        print(err)
        assert e.value.code == 2 and "\n" not in err and "needs about" in err and "MemAvailable is 100 MB" in err
        assert not os.path.exists(out) and os.listdir(tmp_path) == []


def test_merge_keeps_side_files_and_refuses_when_memory_is_short(tmp_path, capsys, monkeypatch):
    """merge_tp_checkpoint copies the save's tokenizer / generation files, and refuses up front (one line, nothing
    written) when MemAvailable is below 3 x its largest tensor + 200 MB."""
    from test_output_folders import fake_shards

    from paddle_vha.cli.merge_tp_checkpoint import main
    from paddle_vha.parallel.tp_shards import merge_need
    from paddle_vha.transform import memory

    shards = fake_shards(tmp_path / "shards")
    for f in ("tokenizer.json", "generation_config.json", "chat_template.jinja"):
        (tmp_path / "shards" / f).write_text(f"{{\"{f}\": 1}}")
    monkeypatch.setattr(memory, "mem_available", lambda: merge_need(shards) - 1)
    with pytest.raises(SystemExit) as e:
        main([shards, str(tmp_path / "short")])
    err = capsys.readouterr().err.strip()
    print(err)
    # run alone, the first PaddleFormers import logs its own warnings to stderr first; ours is the one error line
    ours = [line for line in err.splitlines() if line.startswith("error:")]
    assert e.value.code == 2 and len(ours) == 1 and err.endswith(ours[0]) and "needs about" in ours[0]
    assert not os.path.exists(tmp_path / "short")
    monkeypatch.setattr(memory, "mem_available", lambda: merge_need(shards))
    assert main([shards, str(tmp_path / "merged")]) == 0
    for f in ("tokenizer.json", "generation_config.json", "chat_template.jinja"):
        assert (tmp_path / "merged" / f).read_text() == (tmp_path / "shards" / f).read_text()
