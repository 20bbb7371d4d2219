"""tools/export_gguf.py's refusals that come before any llama.cpp tool runs (no side environment needed): one line,
exit 2, nothing written. The tokenizer check and the export itself: tests/test_gguf_clients.py."""
import json
import os

import pytest

from paddle_vha.cli.export_gguf import main


def run(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def folder(path, model_type):
    os.makedirs(path)
    (path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return path


@pytest.mark.parametrize("model_type,said", [
    ("qwen3_vha", "Qwen3-VHA is not an architecture llama.cpp runs (llama, qwen2, qwen3); fold it first"),
    ("qwen3_mea", "Qwen3-MEA is not an architecture llama.cpp runs (llama, qwen2, qwen3); serve it with "
                  "python tools/export_onnx.py"),
    ("gpt2", "model_type 'gpt2' is not one llama.cpp's converter is run for here (llama, qwen2, qwen3)"),
])
def test_not_an_architecture_llamacpp_runs(tmp_path, capsys, model_type, said):
    src = folder(tmp_path / "in", model_type)
    code, out, err = run(capsys, src, tmp_path / "x.gguf", "--type", "f16")
    assert code == 2 and err.count("\n") == 1 and said in err, err
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_output_rules(tmp_path, capsys):
    src = tmp_path / "in"
    os.makedirs(src)
    (src / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"model.norm.weight": np.ones(4, np.float32)}, str(src / "model.safetensors"))
    os.makedirs(tmp_path / "dir.gguf")
    for out, said in ((src / "x.gguf", "must be a different folder from FOLDED"),
                      (tmp_path / "x.bin", "should end in .gguf"),
                      (tmp_path / "dir.gguf", "exists and is not a regular file")):
        code, _, err = run(capsys, src, out, "--type", "q4_0")
        assert code == 2 and err.count("\n") == 1 and said in err, err
    (tmp_path / "old.gguf").write_bytes(b"GGUF")
    code, _, err = run(capsys, src, tmp_path / "old.gguf", "--type", "q4_0")
    assert code == 2 and "already exists (pass --force" in err
    assert (tmp_path / "old.gguf").read_bytes() == b"GGUF"
    assert sorted(os.listdir(src)) == ["config.json", "model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["dir.gguf", "in", "old.gguf"]
    code, _, err = run(capsys, tmp_path / "nowhere", tmp_path / "y.gguf", "--type", "f32")
    assert code == 2 and "not a directory" in err
    code, _, err = run(capsys, src, tmp_path / "y.gguf", "--type", "q5_k")
    assert code == 2 and "invalid choice: 'q5_k'" in err
