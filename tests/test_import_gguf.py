"""tools/import_gguf.py on synthetic GGUF files (written here with the gguf package's writer, tests/gguf_synth.py):
every weight type against a float64 dequantization written from the block layouts, Llama's q / k row order, the
config / tokenizer / generation files, and the refusals (one line, exit 2, nothing written, the input untouched).
The checks against Hugging Face and llama.cpp themselves are in tests/test_gguf_clients.py."""
import hashlib
import json
import os

import numpy as np
import pytest

from gguf_synth import CHATML, bpe_vocab, llama_cpp_order, quantize, write_model
from paddle_vha.checkpoint.folder import CheckpointFolder
from paddle_vha.cli.import_gguf import main

SMALL = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96)


def run(capsys, *argv):
    """(exit status, stdout, stderr) of the command."""
    try:
        code = main([str(a) for a in argv] + ["--no-progress"])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def tensors(folder) -> dict:
    ck = CheckpointFolder.open(str(folder))
    return {n: ck.read(n) for n in ck.tensors}


def digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_each_type_matches_the_block_layout_oracle(tmp_path, capsys, qtype):
    """Every weight equals the float64 dequantization of its blocks (rounded once to float32: exact for these types),
    Llama's q / k rows back in Hugging Face's order."""
    src = tmp_path / f"m-{qtype}.gguf"
    truth = write_model(str(src), "llama", qtype=qtype, **SMALL)
    code, out, err = run(capsys, src, tmp_path / "out")
    assert code == 0, err
    got = tensors(tmp_path / "out")
    assert set(got) == set(truth)
    worst = max(float(np.abs(got[n].astype(np.float64) - truth[n]).max()) for n in truth)
    print(f"{qtype}: max |import - float64 oracle| over {len(truth)} tensors = {worst:.3e}")
    for n, t in truth.items():
        assert got[n].dtype == np.float32
        np.testing.assert_array_equal(got[n], t.astype(np.float32), err_msg=n)
    said = json.loads((tmp_path / "out" / "gguf_import.json").read_text())
    assert said["on_a_quantization_grid"] == (qtype.startswith("Q"))
    assert (qtype in said["tensor_types"])
    if qtype.startswith("Q"):
        assert f"quantized, mostly {qtype}" in out and "re-quantizing them is not lossless" in out
    else:
        assert "re-quantizing them is not lossless" not in out


def test_oracle_quantizer_is_the_layout_it_says():
    """The test's own block writer against hand-made blocks (so the oracle is not checked only by the import)."""
    x = np.zeros((1, 32))
    x[0, 0], x[0, 17] = 7.0, -7.0
    raw, deq = quantize(x, "Q4_0")
    assert raw.shape == (1, 18)
    assert np.frombuffer(raw[0, :2].tobytes(), np.float16)[0] == 1.0  # d = 7 / 7
    # byte 0: q[0] = 15 (low nibble), q[16] = 8 (a zero, high nibble); byte 1: q[1] = 8, q[17] = 1
    assert raw[0, 2] == (8 << 4 | 15) and raw[0, 3] == (1 << 4 | 8)
    assert deq[0, 0] == 7.0 and deq[0, 17] == -7.0
    raw, deq = quantize(np.arange(32, dtype=np.float64)[None], "Q4_1")
    assert np.frombuffer(raw[0, 2:4].tobytes(), np.float16)[0] == 0.0  # m = min
    raw, deq = quantize(np.full((1, 32), -2.0), "Q8_0")
    assert raw.shape == (1, 34) and np.all(raw[0, 2:].view(np.int8) == -127)
    x = np.zeros((1, 32))
    x[0, 3], x[0, 20] = 15.0, -15.0
    raw, deq = quantize(x, "Q5_0")  # d = 1: q[3] = 31, q[20] = 1 (5th bit clear), the rest 16 (5th bit set)
    assert raw.shape == (1, 22) and deq[0, 3] == 15.0 and deq[0, 20] == -15.0
    qh = int(np.frombuffer(raw[0, 2:6].tobytes(), "<u4")[0])
    assert qh == 0xFFFFFFFF & ~(1 << 20)
    w = np.arange(8)[:, None] * np.ones((1, 3))
    assert llama_cpp_order(w, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_llama_files_and_config(tmp_path, capsys):
    src = tmp_path / "llama.gguf"
    write_model(str(src), "llama", context=384, theta=123456.0, eps=1e-5, **SMALL)
    code, out, err = run(capsys, src, tmp_path / "out")
    assert code == 0, err
    assert "checked against this project's Llama contract: OK" in out
    out_dir = tmp_path / "out"
    cfg = json.loads((out_dir / "config.json").read_text())
    want = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=96,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=268,
                max_position_embeddings=384, rope_theta=123456.0, tie_word_embeddings=True, attention_bias=False,
                bos_token_id=1, eos_token_id=0, hidden_act="silu", rope_scaling=None)
    assert {k: cfg.get(k) for k in want} == want
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5, rel=1e-6)
    assert "lm_head.weight" not in tensors(out_dir)  # tied: no output.weight in the file
    gen = json.loads((out_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [0, 2]  # the file's EOS and ChatML's end of turn, <|im_end|>, found by rendering
    tok_cfg = json.loads((out_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] == CHATML and tok_cfg["eos_token"] == "<|endoftext|>"
    assert tok_cfg["bos_token"] == "<|im_start|>"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    tokens, _, _ = bpe_vocab()
    enc = tok.encode("hello world<|im_end|>")
    print("tokens:", enc.tokens)
    assert enc.tokens == ["hello", "Ġworld", "<|im_end|>"]
    assert enc.ids == [tokens.index("hello"), tokens.index("Ġworld"), 2]  # no BOS: add_bos_token false
    assert tok.decode(enc.ids, skip_special_tokens=False) == "hello world<|im_end|>"


def test_qwen2_bias_untied_and_qwen3_realistic_width(tmp_path, capsys):
    """Qwen2: biases required, no row reordering, untied head. Qwen3 at Qwen3's vocabulary (151,936) with head_dim 128
    != hidden / heads and q / k norms."""
    src = tmp_path / "qwen2.gguf"
    truth = write_model(str(src), "qwen2", bias=True, tied=False, qtype="Q8_0", **SMALL)
    code, out, err = run(capsys, src, tmp_path / "q2")
    assert code == 0, err
    got = tensors(tmp_path / "q2")
    assert set(got) == set(truth) and "lm_head.weight" in got and "model.layers.1.self_attn.k_proj.bias" in got
    for n, t in truth.items():
        np.testing.assert_array_equal(got[n], t.astype(np.float32), err_msg=n)
    assert "checked against this project's Qwen2 contract: OK" in out
    cfg = json.loads((tmp_path / "q2" / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["attention_bias"] is True and cfg["tie_word_embeddings"] is False

    src = tmp_path / "qwen3.gguf"
    truth = write_model(str(src), "qwen3", layers=2, hidden=64, heads=2, kv_heads=1, head_dim=128, inter=96,
                        vocab=151936, qk_norm=True, qtype="F16", tokenizer=False)
    code, out, err = run(capsys, src, tmp_path / "q3", "--dtype", "bfloat16")
    assert code == 0, err
    assert "no tokenizer files are written" in out
    ck = CheckpointFolder.open(str(tmp_path / "q3"))
    assert ck.tensors["model.embed_tokens.weight"].shape == (151936, 64)
    assert ck.tensors["model.layers.0.self_attn.q_proj.weight"].shape == (256, 64)
    assert ck.tensors["model.layers.0.self_attn.q_norm.weight"].shape == (128,)
    assert {r.dtype for r in ck.tensors.values()} == {"BF16"}
    for n, t in truth.items():  # F16 -> float32 -> bfloat16: one rounding of the float16 value
        from ml_dtypes import bfloat16

        np.testing.assert_array_equal(ck.read(n), t.astype(np.float32).astype(bfloat16), err_msg=n)
    cfg = json.loads((tmp_path / "q3" / "config.json").read_text())
    assert cfg["head_dim"] == 128 and cfg["model_type"] == "qwen3" and cfg["torch_dtype"] == "bfloat16"
    from paddle_vha.families import family_of

    family_of(str(tmp_path / "q3")).validate(str(tmp_path / "q3"))  # the project's Qwen3 contract takes it


def llama31_divisors(head_dim, theta, factor=8.0, low=1.0, high=4.0, original=8192):
    """Llama 3.1's RoPE scaling as the divisor of each frequency (its published rule, restated here)."""
    out = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * np.pi * theta ** (i / head_dim)
        if wavelength < original / high:
            out.append(1.0)
        elif wavelength > original / low:
            out.append(factor)
        else:
            s = (original / wavelength - low) / (high - low)
            out.append(1 / ((1 - s) / factor + s))
    return np.asarray(out)


@pytest.mark.parametrize("factor,high,original", [(8.0, 4.0, 8192), (32.0, 4.0, 8192), (16.0, 2.0, 4096)])
def test_llama31_rope_scaling_read_back(tmp_path, capsys, factor, high, original):
    """rope_freqs.weight (the divisors llama.cpp's converter stores for a llama3 rope_scaling) becomes config.json's
    rope_scaling again; it is not written as a weight."""
    src = tmp_path / "l31.gguf"
    dims = dict(SMALL, head_dim=128, heads=2, kv_heads=1)
    divisors = llama31_divisors(128, 500000.0, factor, 1.0, high, original)
    write_model(str(src), "llama", theta=500000.0, extra={"rope_freqs.weight": divisors}, **dims)
    code, out, err = run(capsys, src, tmp_path / "out")
    assert code == 0, err
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    print(cfg["rope_scaling"])
    assert cfg["rope_scaling"]["rope_type"] == "llama3" and cfg["rope_scaling"]["factor"] == factor
    assert cfg["rope_scaling"]["high_freq_factor"] == high
    assert cfg["rope_scaling"]["original_max_position_embeddings"] == original
    assert cfg["rope_scaling"]["low_freq_factor"] == 1.0
    assert not any("rope" in n for n in tensors(tmp_path / "out"))
    bad = tmp_path / "bad.gguf"
    write_model(str(bad), "llama", theta=500000.0, extra={"rope_freqs.weight": np.linspace(1, 3, 64) ** 2}, **dims)
    code, out, err = run(capsys, bad, tmp_path / "out2")
    assert code == 2 and "rope_freqs.weight is not a Llama 3.1-style RoPE scaling" in err


def test_dry_run_writes_nothing(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    write_model(str(src), "llama", qtype="Q4_1", **SMALL)
    code, out, err = run(capsys, src, tmp_path / "out", "--dry-run")
    assert code == 0, err
    assert "dry run: nothing written" in out and "Q4_1" in out and "rows reordered" in out
    assert sorted(os.listdir(tmp_path)) == ["m.gguf"]


def _refused(tmp_path, capsys, src, *extra, out_name="out", match=""):
    before = sorted(os.listdir(tmp_path))
    sums = {f: digest(tmp_path / f) for f in before if (tmp_path / f).is_file()}
    code, out, err = run(capsys, src, tmp_path / out_name, *extra)
    lines = err.strip().splitlines()
    print(err.strip())
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], err
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, no temporary left
    assert {f: digest(tmp_path / f) for f in sums} == sums  # inputs untouched
    return lines[0]


def test_refusals(tmp_path, capsys):
    good = tmp_path / "good.gguf"
    write_model(str(good), "llama", **SMALL)
    data = good.read_bytes()

    bad = tmp_path / "gemma.gguf"
    write_model(str(bad), "gemma", **SMALL)
    _refused(tmp_path, capsys, bad, match="GGUF architecture 'gemma' is not one of llama, qwen2, qwen3")

    iq = tmp_path / "iq.gguf"
    write_model(str(iq), "llama", type_of={"blk.1.ffn_up.weight": "IQ4_NL"}, **SMALL)
    _refused(tmp_path, capsys, iq, match="tensor blk.1.ffn_up.weight is IQ4_NL")

    for cut in (len(data) - 100, len(data) // 2, 40, 3):
        short = tmp_path / f"short{cut}.gguf"
        short.write_bytes(data[:cut])
        _refused(tmp_path, capsys, short, match="GGUF file" if cut > 3 else "not a GGUF file")

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\x00" * 4096)
    _refused(tmp_path, capsys, junk, match="not a GGUF file")

    missing = tmp_path / "missing.gguf"
    write_model(str(missing), "llama", skip=("blk.1.ffn_up.weight",), **SMALL)
    _refused(tmp_path, capsys, missing, match="missing tensors: blk.1.ffn_up.weight")

    wrong = tmp_path / "wrong.gguf"
    write_model(str(wrong), "llama", meta={"llama.feed_forward_length": 128}, **SMALL)
    _refused(tmp_path, capsys, wrong, match="mis-shaped tensors")

    nometa = tmp_path / "nometa.gguf"
    write_model(str(nometa), "llama", meta={"llama.block_count": None}, **SMALL)
    _refused(tmp_path, capsys, nometa, match="metadata llama.block_count is missing")

    partial = tmp_path / "partial.gguf"
    write_model(str(partial), "llama", meta={"llama.rope.dimension_count": 8}, **SMALL)
    _refused(tmp_path, capsys, partial, match="partial RoPE")

    nobias = tmp_path / "nobias.gguf"
    write_model(str(nobias), "qwen2", **SMALL)
    _refused(tmp_path, capsys, nobias, match="missing tensors: blk.0.attn_k.bias")

    _refused(tmp_path, capsys, tmp_path / "absent.gguf", match="it is missing")
    _refused(tmp_path, capsys, good, out_name="good.gguf", match="neither inside the other")  # OUT is the input
    os.makedirs(tmp_path / "taken")
    _refused(tmp_path, capsys, good, out_name="taken", match="already exists (pass --force")
    os.rmdir(tmp_path / "taken")
    _refused(tmp_path, capsys, good, out_name=".", match="neither inside the other")  # OUT holds the input
    _refused(tmp_path, capsys, good, "--max-shard-size", "lots", match="--max-shard-size")


def test_bad_dtype_is_a_usage_error(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    write_model(str(src), "llama", **SMALL)
    code, out, err = run(capsys, src, tmp_path / "out", "--dtype", "float64")
    assert code == 2 and "invalid choice: 'float64'" in err
    assert not (tmp_path / "out").exists()


# Round 4 (docs/reliability.md): metadata the file gets wrong, each refused in one line naming it, before anything is
# written. Before the fix the first eight were imported with exit 0 (and refused later by export), the next two were
# tracebacks, the chat template was dropped while the import said "chat template yes", the integer tokens gave a
# three-line dump of the tokenizers library, the odd head_dim failed in a reshape, and the block count built 900
# million expected names (MemoryError after a minute at 6+ GB).
HOSTILE = {
    "eps zero": ({"llama.attention.layer_norm_rms_epsilon": 0.0},
                 "rms_norm_eps must be a positive finite number, got 0.0 (metadata llama.attention.layer_norm_rms_"),
    "eps negative": ({"llama.attention.layer_norm_rms_epsilon": -1e-6}, "rms_norm_eps must be a positive finite"),
    "eps NaN": ({"llama.attention.layer_norm_rms_epsilon": float("nan")}, "rms_norm_eps must be a positive finite"),
    "theta zero": ({"llama.rope.freq_base": 0.0}, "rope_theta must be a positive finite number, got 0.0 (metadata "
                                                  "llama.rope.freq_base)"),
    "theta negative": ({"llama.rope.freq_base": -5.0}, "rope_theta must be a positive finite number"),
    "theta NaN": ({"llama.rope.freq_base": float("nan")}, "rope_theta must be a positive finite number, got nan"),
    "factor negative": ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": -2.0},
                        "factor must be a finite number >= 1, got -2.0 (metadata llama.rope.scaling.*)"),
    "factor NaN": ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": float("nan")},
                   "factor must be a finite number >= 1, got nan"),
    "factor string": ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": "two"},
                      "metadata llama.rope.scaling.factor = 'two' is a string, not a number"),
    "yarn without factor": ({"llama.rope.scaling.type": "yarn"},
                            "llama.rope.scaling.type is 'yarn' but llama.rope.scaling.factor is missing"),
    "chat template integer": ({"tokenizer.chat_template": 7},
                              "metadata tokenizer.chat_template = 7 is an integer, not a string"),
    "tokens integers": ({"tokenizer.ggml.tokens": list(range(268))},
                        "metadata tokenizer.ggml.tokens holds an integer (0), not a list of strings"),
    "merges integers": ({"tokenizer.ggml.merges": [1, 2]}, "tokenizer.ggml.merges holds an integer"),
    "add_bos string": ({"tokenizer.ggml.add_bos_token": "yes"}, "add_bos_token = 'yes' is a string, not true or"),
    "block_count 1e8": ({"llama.block_count": 100_000_000},
                        "llama.block_count = 100000000, but the file holds tensors of layers 0..1 only"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_metadata_is_refused_before_anything_is_written(tmp_path, capsys, case):
    import resource
    import time

    meta, said = HOSTILE[case]
    src = tmp_path / "m.gguf"
    write_model(str(src), "llama", meta=meta, **SMALL)
    t0, rss0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _refused(tmp_path, capsys, src, match=said)
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"{case}: refused in {time.perf_counter() - t0:.2f} s, peak RSS grew {grew:.0f} MB")
    assert time.perf_counter() - t0 < 20 and grew < 500


def test_odd_head_dim_llama_is_refused_in_the_plan(tmp_path, capsys):
    src = tmp_path / "m.gguf"
    write_model(str(src), "llama", **{**SMALL, "head_dim": 15})
    _refused(tmp_path, capsys, src, "--dry-run", match="head_dim 15 is odd: llama.cpp stores a Llama head's q / k rows")
    qwen = tmp_path / "q.gguf"  # Qwen3's rows are Hugging Face's: an odd head_dim is not this refusal
    write_model(str(qwen), "qwen3", qk_norm=True, **{**SMALL, "head_dim": 15})
    code, out, err = run(capsys, qwen, tmp_path / "q-out", "--dry-run")
    assert "is odd" not in err, err


# Round 4's fuzz test (tests/test_fuzz_inputs.py) found these; each is kept here as a named case.
def _vocab_with(i, token):
    tokens = bpe_vocab()[0]
    tokens[i] = token
    return tokens


FUZZ_FOUND = {
    "merge outside the vocabulary": ({"tokenizer.ggml.merges": ["h e", "h q"]},
                                     "tokenizer.ggml.merges[1] = 'h q': 'hq' is not a token of the vocabulary"),
    "token twice": ({"tokenizer.ggml.tokens": _vocab_with(100, bpe_vocab()[0][60])},
                    "holds " + repr(bpe_vocab()[0][60]) + " twice (ids 60 and 100)"),
}


@pytest.mark.parametrize("case", list(FUZZ_FOUND))
def test_fuzz_findings_are_refused_in_the_plan(tmp_path, capsys, case):
    """Before the fix: a traceback from the tokenizers library after the plan ("Error while initializing BPE: Token
    `hq` out of vocabulary"); the duplicated token was imported with a hole in tokenizer.json's vocabulary."""
    meta, said = FUZZ_FOUND[case]
    src = tmp_path / "m.gguf"
    write_model(str(src), "llama", meta=meta, **SMALL)
    _refused(tmp_path, capsys, src, match=said)


def test_a_nan_block_scale_is_one_line(tmp_path, capsys):
    """A Q8_0 block whose fp16 scale is NaN: refused naming the tensor, and nothing else on stderr (numpy's
    RuntimeWarning from the dequantization made it two lines)."""
    import gguf

    src = tmp_path / "m.gguf"
    write_model(str(src), "llama", qtype="Q8_0", **SMALL)
    t = next(t for t in gguf.GGUFReader(str(src)).tensors if t.name == "blk.0.attn_k.weight")
    data = bytearray(src.read_bytes())
    data[int(t.data_offset):int(t.data_offset) + 2] = np.float16(np.nan).tobytes()
    src.write_bytes(bytes(data))
    _refused(tmp_path, capsys, src, match="model.layers.0.self_attn.k_proj.weight: 32 non-finite value(s)")


@pytest.mark.parametrize("field,new", [("tokenizer.ggml.token_type item type", 9),  # an i32 array read as arrays
                                       ("general.architecture type", 9),  # a string read as an array
                                       ("tensor_count", 2 ** 40), ("blk.0.attn_q.weight n_dims", 7)])
def test_a_header_count_the_file_cannot_hold_is_refused_before_the_reader(tmp_path, capsys, field, new):
    """Round 4's fuzz test: the gguf package's reader turned such headers into 3.5-4 GB and more than 30 s (it builds
    a view per item before it finds the end of the file). checkpoint/gguf_header.py walks the header first, each
    count against the bytes left."""
    import resource
    import struct
    import time

    import fuzz_inputs as fz

    src = tmp_path / "m.gguf"
    write_model(str(src), "llama", **SMALL)
    data = bytearray(src.read_bytes())
    f = next(f for f in fz.gguf_fields(bytes(data)) if f.label == field)
    struct.pack_into(f.fmt, data, f.at, new)
    src.write_bytes(bytes(data))
    t0, rss0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    line = _refused(tmp_path, capsys, src, match="truncated or malformed GGUF file")
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"{field} -> {new}: {time.perf_counter() - t0:.2f} s, peak RSS +{grew:.0f} MB: {line}")
    assert time.perf_counter() - t0 < 5 and grew < 200
