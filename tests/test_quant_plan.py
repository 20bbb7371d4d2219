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
