"""Mixed precision by role (paddle_vha/export/quant_plan.py) and the quantized export's up-front refusals: the rule's
roles get 8 bits and nothing else does, a rule that cannot be read and a calibration text that is empty, binary,
missing or not UTF-8 are refused in one line before any work, nothing written."""
import os
import subprocess
import sys

import pytest

from paddle_vha.export.quant_plan import MIXED_DEFAULT, RuleError, bits_for, parse_rule, role_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = 6
SOURCES = {f"w{i}_{r}": f"model.layers.{i}.{'self_attn' if r in ('q_proj', 'k_proj', 'v_proj', 'o_proj') else 'mlp'}"
           f".{r}.weight" for i in range(LAYERS)
           for r in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}
SOURCES.update({"emb": "model.embed_tokens.weight", "head": "lm_head.weight (tied: the embedding)",
                "norm": "model.norm.weight"})


def test_roles():
    assert role_of("model.layers.3.mlp.down_proj.weight").name == "down_proj"
    assert role_of("model.layers.3.mlp.down_proj.weight").layer == 3
    assert role_of("lm_head.weight").name == "lm_head" and role_of("model.norm.weight") is None


def test_the_rule_gives_its_roles_8_bits_and_nothing_else():
    bits = bits_for(SOURCES, 4, parse_rule(MIXED_DEFAULT), LAYERS)
    eight = sorted(k for k, b in bits.items() if b == 8)
    want = sorted([f"w{i}_v_proj" for i in range(LAYERS)] + [f"w{i}_down_proj" for i in range(LAYERS)]
                  + [f"w{LAYERS - 2}_up_proj", f"w{LAYERS - 1}_up_proj", "head"])
    print(len(eight), "8-bit weights:", eight)
    assert eight == want
    assert "norm" not in bits and bits["emb"] == 4  # the embedding follows the head only when they share a table
    assert set(bits_for(SOURCES, 8, parse_rule(MIXED_DEFAULT), LAYERS).values()) == {8}  # int8: all 8 bits
    spans = bits_for(SOURCES, 4, parse_rule(["down_proj@1-2", "q_proj@-1-"]), LAYERS)
    assert sorted(k for k, b in spans.items() if b == 8) == ["w1_down_proj", "w2_down_proj", f"w{LAYERS - 1}_q_proj"]


@pytest.mark.parametrize("rule", ["v_projj", "down_proj@x", "lm_head@0-3", "down_proj@1-2-3"])
def test_unreadable_rules_are_refused(rule):
    with pytest.raises(RuleError) as e:
        parse_rule([rule])
    print(e.value)
    assert rule in str(e.value) and "\n" not in str(e.value)


def _cli(tmp_path, *extra):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_onnx.py"), str(tmp_path / "no-ckpt"),
                        str(out), "--weights", "int4", *map(str, extra)], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    print(r.returncode, r.stderr.strip()[-500:])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    return r.stderr


def test_calibration_text_refusals(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "binary.txt").write_bytes(b"ab\0cd" * 100)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 100)
    assert "no text in it" in _cli(tmp_path, "--calibration-text", tmp_path / "empty.txt")
    assert "binary file" in _cli(tmp_path, "--calibration-text", tmp_path / "binary.txt")
    assert "not UTF-8" in _cli(tmp_path, "--calibration-text", tmp_path / "latin1.txt")
    assert "no such file" in _cli(tmp_path, "--calibration-text", tmp_path / "missing.txt")
    (tmp_path / "folder").mkdir()
    assert "a folder, not a text file" in _cli(tmp_path, "--calibration-text", tmp_path / "folder")
    assert "unknown role 'vproj'" in _cli(tmp_path, "--mixed", "vproj,down_proj")


def test_a_too_short_calibration_text_is_refused_by_the_tokenizer_count(tmp_path):
    """A readable file too short for one window is refused with its token count (read through the model's
    tokenizer: a byte-level toy here)."""
    from paddle_vha.export.errors import ExportError
    from paddle_vha.export.quality import gate_text

    (tmp_path / "short.txt").write_text("just a few words")
    with pytest.raises(ExportError) as e:
        gate_text(str(tmp_path), 256, str(tmp_path / "short.txt"))
    print(e.value)
    assert "--calibration-text" in str(e.value) and "tokens, fewer than" in str(e.value)


def _graph_of_roles(tmp_path):
    """An ONNX graph x @ W_i for one weight of each layer role (two layers) and a head, with export_info-style
    sources: what quantize_graph reads the rule against."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, sources, x = [], [], {}, "x"
    for i in range(2):
        for r in ("q_proj", "v_proj", "down_proj"):
            name = f"w{i}{r}"
            inits.append(numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), name))
            sources[name] = f"model.layers.{i}.{'mlp' if r == 'down_proj' else 'self_attn'}.{r}.weight"
            nodes.append(helper.make_node("MatMul", [x, name], [name + ".out"], name=name + ".mm"))
            x = name + ".out"
    inits.append(numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "head"))
    sources["head"] = "lm_head.weight"
    nodes.append(helper.make_node("MatMul", [x, "head"], ["logits"], name="head.mm"))
    g = helper.make_graph(nodes, "roles", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 32])], inits)
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path, sources


def _bits_by_source(path, sources):
    import onnx

    model = onnx.load(path)
    out = {}
    for n in model.graph.node:
        if n.op_type == "MatMulNBits":
            weight = n.input[1].rsplit("_Q", 1)[0]
            out[sources[weight]] = next(a.i for a in n.attribute if a.name == "bits")
    return out


def check_rule_is_applied(path, sources):
    from paddle_vha.export.quantize import QuantSpec, quantize_graph

    quantize_graph(path, QuantSpec("int4", 32, "asym", mixed=("v_proj", "down_proj@-1-", "lm_head")),
                   sources=sources)
    got = _bits_by_source(path, sources)
    print(got)
    eight = sorted(s for s, b in got.items() if b == 8)
    assert eight == ["lm_head.weight", "model.layers.0.self_attn.v_proj.weight", "model.layers.1.mlp.down_proj.weight",
                     "model.layers.1.self_attn.v_proj.weight"], eight
    assert len(got) == 7 and all(b == 4 for s, b in got.items() if s not in eight)


def test_the_written_graph_follows_the_rule(tmp_path):
    check_rule_is_applied(*_graph_of_roles(tmp_path))


def test_a_sensitivity_choice_ignored_fails(tmp_path, monkeypatch):
    """Planted fault: the quantizer ignoring the rule (every weight in the base bits) fails the check above."""
    from paddle_vha.export import quantize

    real = quantize.bits_for
    monkeypatch.setattr(quantize, "bits_for", lambda sources, base, rule, layers: real(sources, base, (), layers))
    with pytest.raises(AssertionError):
        check_rule_is_applied(*_graph_of_roles(tmp_path))
