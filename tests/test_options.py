"""Every option of every tool says when it takes effect, and one given where it cannot is refused in one line before
any work (paddle_vha/cli/options, paddle_vha/train/option_effects.py); docs/reliability.md prints the whole table."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os

import pytest

from hostile import ROOT, refused, tree


def test_every_option_of_every_tool_says_when_it_takes_effect():
    """Each paddle_vha/cli module (every console script) has a TAKES_EFFECT entry for exactly its parser's options;
    tools/train.py's table names exactly the fields of its three argument dataclasses (PaddleFormers' included: a
    PaddleFormers upgrade that adds one fails here until it is classified)."""
    from paddle_vha.cli.options import option_strings, tool_modules
    from paddle_vha.train.arguments import DataArguments, ModelArguments, VHATrainingArguments
    from paddle_vha.train.option_effects import TAKES_EFFECT

    for name in tool_modules():
        if name == "train":
            fields = {f.name for c in (ModelArguments, DataArguments, VHATrainingArguments)
                      for f in dataclasses.fields(c)}
            assert set(TAKES_EFFECT) == fields, (sorted(fields - set(TAKES_EFFECT)), sorted(set(TAKES_EFFECT) - fields))
            continue
        mod = importlib.import_module(f"paddle_vha.cli.{name}")
        options = set(option_strings(mod.build_parser()))
        print(f"{name}: {len(options)} options")
        assert options == set(mod.TAKES_EFFECT), (name, options ^ set(mod.TAKES_EFFECT))


def test_the_docs_hold_the_audit_table_as_the_code_has_it():
    from paddle_vha.cli.options import audit_markdown

    with open(os.path.join(ROOT, "docs", "reliability.md"), encoding="utf-8") as f:
        text = f.read()
    table = audit_markdown()
    print(f"{len(table.splitlines()) - 2} rows")
    assert table in text, "docs/reliability.md's options audit differs from paddle_vha.cli.options.audit_markdown()"


def test_given_options_are_what_argv_sets():
    from paddle_vha.cli.options import given_options

    p = argparse.ArgumentParser()
    p.add_argument("pos")
    p.add_argument("--flag", action="store_true")
    p.add_argument("--n", type=int, default=3)
    p.add_argument("--many", action="append")
    p.add_argument("--opt", nargs="?", const=4, default=None)
    assert given_options(p, ["x"]) == {"pos"}
    assert given_options(p, ["x", "--n", "3", "--many", "a", "--opt"]) == {"pos", "n", "many", "opt"}
    assert given_options(p, ["x", "--fl"]) == {"pos", "flag"}  # an abbreviation argparse takes
    assert p.parse_args(["x"]).n == 3  # the defaults are back


# (tool, argv after the inputs, words): each refused at parse time, before its inputs are read (they do not exist)
INERT = [
    ("export_onnx", ["--float-lm-head"], "--float-lm-head has no effect in this run: it takes effect with --weights"),
    ("export_onnx", ["--max-kl", "0.5"], "--max-kl has no effect in this run"),
    ("export_onnx", ["--weights", "fp32", "--min-agreement", "0.5"], "--min-agreement has no effect in this run"),
    ("generate", ["--prompt-ids", "1", "--seed", "3"],
     "--seed has no effect in this run: it takes effect with --sample"),
    ("generate", ["--prompt-ids", "1", "--top-k", "3"], "--top-k has no effect in this run"),
    ("generate", ["--prompt-ids", "1", "--chat"], "--chat has no effect in this run: it takes effect with --prompt"),
    ("fold", ["--verify-len", "8"], "--verify-len has no effect in this run: it takes effect with --verify"),
    ("fold", ["--dry-run", "--verify-tol", "1e-3"], "--verify-tol has no effect in this run"),
    ("import_fleet", ["--verify-tol", "1e-3"], "--verify-tol has no effect in this run"),
    ("convert_to_vha", ["--kv-heads", "2", "--refine-lr", "1e-2"], "--refine-lr has no effect in this run"),
    ("convert_to_vha", ["--kv-heads", "2", "--refine-tokens", "64"], "--refine-tokens has no effect in this run"),
    ("convert_to_vha", ["--kv-heads", "2", "--method", "svd", "--no-compare", "--calib-tokens", "64"],
     "--calib-tokens has no effect in this run"),
    ("convert_to_vha", ["--kv-heads", "2", "--method", "svd", "--no-compare", "--eval-batches", "0", "--eval-len",
                        "64"],
     "--eval-len has no effect in this run"),
    ("compress_kv", ["--kv-heads", "2", "--eval-batches", "0", "--calib-data", "x.txt"],
     "--calib-data has no effect in this run"),
    ("compress_kv", ["--kv-heads", "2", "--eval-batches", "0", "--pass-tokens", "64"], "--pass-tokens has no effect"),
    ("flops", ["--breakdown", "--json"], "--breakdown has no effect in this run: it takes effect with the tables"),
    ("kv_calc", ["CONFIG.json", "--mea-kv-heads", "4"], "--mea-kv-heads has no effect in this run"),
]


@pytest.mark.parametrize("tool,argv,words", INERT, ids=[f"{t}-{k}" for k, (t, _, _) in enumerate(INERT)])
def test_an_option_that_cannot_take_effect_is_refused(tmp_path, capsys, monkeypatch, tool, argv, words):
    mod = importlib.import_module(f"paddle_vha.cli.{tool}")
    monkeypatch.chdir(tmp_path)
    inputs = {"export_onnx": ["IN", "OUT"], "generate": ["EXPORT"], "fold": ["IN", "OUT"],
              "import_fleet": ["IN", "OUT"], "convert_to_vha": ["IN", "OUT"], "compress_kv": ["IN", "OUT"],
              "flops": [], "kv_calc": []}[tool]
    before = tree(tmp_path)
    refused(mod.main, inputs + argv, capsys, words)
    assert tree(tmp_path) == before


def test_pretrain_data_options_for_inputs_it_does_not_have(tmp_path, capsys):
    from paddle_vha.cli import make_pretrain_data

    (tmp_path / "a.txt").write_text("hello")
    before = tree(tmp_path)
    out = str(tmp_path / "d" / "corpus")
    refused(make_pretrain_data.main, [str(tmp_path / "a.txt"), "--bytes", "--out", out, "--field", "body"], capsys,
            "--field has no effect in this run: it takes effect with a .jsonl input")
    refused(make_pretrain_data.main, [str(tmp_path / "a.txt"), "--bytes", "--out", out, "--corpus-mb", "2"], capsys,
            "--corpus-mb has no effect in this run: it takes effect with the stdlib input")
    assert tree(tmp_path) == before


def test_build_ops_digest_takes_no_build_options(capsys):
    from paddle_vha.cli import build_ops

    refused(build_ops.main, ["--digest", "--force"], capsys,
            "--force has no effect in this run: it takes effect unless")
