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


@pytest.mark.parametrize("via", ["flag", "env"])
def test_a_side_python_that_does_not_exist_is_one_line(tmp_path, capsys, monkeypatch, via):
    """Round 4: --llama-python / $LLAMA_PYTHON naming a missing file was a FileNotFoundError traceback from Popen."""
    src = tmp_path / "in"
    os.makedirs(src)
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    from safetensors.numpy import save_file
    import numpy as np

    save_file({"model.norm.weight": np.ones(4, np.float32)}, str(src / "model.safetensors"))
    missing, sdist = tmp_path / "no-python", tmp_path / "sdist"
    os.makedirs(sdist)
    if via == "flag":
        extra = ["--llama-python", missing, "--llama-src", sdist]
    else:
        monkeypatch.setenv("LLAMA_PYTHON", str(missing))
        monkeypatch.setenv("LLAMA_SRC", str(sdist))
        extra = []
    code, out, err = run(capsys, src, tmp_path / "x.gguf", "--type", "f32", *extra)
    print(err)
    said = "--llama-python" if via == "flag" else "$LLAMA_PYTHON"
    assert code == 2 and err.count("\n") == 1 and f"{said} {missing}: no such file" in err, err
    assert sorted(os.listdir(tmp_path)) == ["in", "sdist"]


# A stand-in for llama.cpp's converter (fault injection: the real one is run by tests/test_gguf_clients.py): its
# --vocab-only run writes a vocabulary GGUF as the real one does, its full run writes a file llama.cpp cannot load.
STAND_IN_CONVERTER = """
import sys
import gguf
out = sys.argv[sys.argv.index("--outfile") + 1]
if "--vocab-only" in sys.argv:
    w = gguf.GGUFWriter(out, "llama")
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "default")
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
else:
    open(out, "wb").write(b"GGUF" + bytes(60))
"""


def test_a_file_llamacpp_cannot_run_is_never_put_in_place_nor_announced(tmp_path, capsys):
    """Round 4: the command printed "wrote X.gguf: 0.0 MB" and then refused with the temporary path, which no longer
    existed. The smoke check now runs on the temporary file before it is put in place; its refusal names OUT."""
    import sys

    from gguf_synth import write_model
    from paddle_vha.cli.import_gguf import main as import_main

    write_model(str(tmp_path / "m.gguf"), "llama", layers=1, hidden=32, heads=2, kv_heads=1, head_dim=16, inter=64)
    assert import_main([str(tmp_path / "m.gguf"), str(tmp_path / "in"), "--no-progress"]) == 0
    sdist = tmp_path / "sdist" / "vendor" / "llama.cpp"
    os.makedirs(sdist)
    (sdist / "convert_hf_to_gguf.py").write_text(STAND_IN_CONVERTER)
    capsys.readouterr()
    code, out, err = run(capsys, tmp_path / "in", tmp_path / "x.gguf", "--type", "f32", "--no-progress",
                         "--llama-python", sys.executable, "--llama-src", tmp_path / "sdist")
    print(out, err)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'x.gguf'}: llama.cpp could not "
                                                                 "run the file"), err
    assert ".tmp" not in err and "wrote" not in out and "nothing written" in err
    assert sorted(os.listdir(tmp_path)) == ["in", "m.gguf", "sdist"]


def test_a_model_type_that_is_not_a_string_is_one_line(tmp_path, capsys):
    """Round 4's fuzz test: model_type [1, 2] was a TypeError (unhashable list) from the registry lookup."""
    src = folder(tmp_path / "in", [1, 2])
    code, out, err = run(capsys, src, tmp_path / "x.gguf", "--type", "f16")
    assert code == 2 and err.count("\n") == 1 and "model_type must be a string, got [1, 2]" in err, err
