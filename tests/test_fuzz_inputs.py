"""Fuzz tests of the file readers, as trusted file-format readers have them: seeded mutations of a valid input
(tests/fuzz_inputs.py), each run in a child process (tests/fuzz_child.py) through the code that reads it. Every case
must end in a one-line refusal with nothing written, or in a result that passes the project's own checks; within a
time and a memory bound per case.

- GGUF: tools/import_gguf.py's main on a valid synthetic GGUF (Llama, Q8_0 weights, a byte-level BPE tokenizer and a
  chat template) mutated field by field from its own layout: counts, string lengths, value / item / tensor types,
  dims, offsets, metadata values, bytes of keys and strings, bit flips, spans copied over others, truncation.
- A checkpoint folder (that GGUF imported): config.json, tokenizer.json, generation_config.json and the safetensors
  header mutated value by value, read as export_gguf, the families' contract, the tokenizer codec and generate's
  defaults read them.

The number of cases: PADDLE_VHA_FUZZ_CASES (default below, sized for the suite's time); the seed is fixed, so a
failure names its case, and `python tests/fuzz_child.py ...` reruns it alone.
"""
import collections
import json
import os
import subprocess
import sys

import pytest

from gguf_synth import write_model

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20261207
CASES = {"gguf": 2000, "folder": 1500}
CASE_SECONDS = 30  # fuzz_child.CASE_SECONDS: a longer case is reported as a hang there
CASE_PEAK_MB = 1500  # a case's peak RSS (the child with paddle and transformers imported is ~500 MB)


def cases(kind: str) -> int:
    return int(os.environ.get("PADDLE_VHA_FUZZ_CASES", CASES[kind]))


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    """(valid GGUF, the folder it imports to)."""
    from paddle_vha.cli.import_gguf import main

    root = tmp_path_factory.mktemp("fuzz-valid")
    gguf = root / "valid.gguf"
    write_model(str(gguf), "llama", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96, qtype="Q8_0")
    assert main([str(gguf), str(root / "folder"), "--no-progress"]) == 0
    return str(gguf), str(root / "folder")


def run_child(kind, valid_input, work, n):
    r = subprocess.run([sys.executable, os.path.join(HERE, "fuzz_child.py"), kind, str(SEED), "0", str(n), str(work),
                        valid_input], capture_output=True, text=True, timeout=CASE_SECONDS * n + 600)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def report(kind, results):
    by = collections.Counter(r["status"] for r in results)
    slowest = max(results, key=lambda r: r["seconds"])
    biggest = max(results, key=lambda r: r["peak_mb"])
    print(f"{kind}: {len(results)} cases: {dict(by)}; slowest {slowest['seconds']:.2f} s (case {slowest['case']}: "
          f"{slowest['what']}); largest peak RSS {biggest['peak_mb']:.0f} MB (case {biggest['case']})")
    refusals = collections.Counter(r["detail"].split(": ", 2)[-1][:60] for r in results if r["status"] == "refused")
    for text, k in refusals.most_common(12):
        print(f"  {k:5d} x {text}")
    bad = [r for r in results if r["status"] == "bad" or r["seconds"] > CASE_SECONDS or r["peak_mb"] > CASE_PEAK_MB]
    for r in bad[:20]:
        print(f"  BAD case {r['case']} ({r['what']}): {r['detail']} [{r['seconds']} s, {r['peak_mb']} MB]")
    return bad


def fuzz(kind, valid_input, tmp_path, what):
    """Run `kind`'s cases: each ends cleanly, and both ends (refused, and read / imported) are reached, so the
    mutations are neither all fatal nor idle."""
    n = cases(kind)
    results = run_child(kind, valid_input, tmp_path, n)
    bad = report(kind, results)
    assert len(results) == n
    assert not bad, f"{len(bad)} of {n} mutated {what} did not end cleanly (first: case {bad[0]['case']})"
    statuses = {r["status"] for r in results}
    assert statuses == {"refused", "ok"}, statuses


@pytest.mark.slow
def test_mutated_gguf_files_are_refused_in_one_line_or_imported_whole(valid, tmp_path):
    fuzz("gguf", valid[0], tmp_path, "GGUF files")


@pytest.mark.slow
def test_mutated_checkpoint_folders_are_refused_in_one_line_or_read(valid, tmp_path):
    fuzz("folder", valid[1], tmp_path, "folders")
