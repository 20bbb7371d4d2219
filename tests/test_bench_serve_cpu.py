"""tools/bench_serve_cpu.py refuses a batch whose KV cache cannot fit, up front: one line with the need and its
parts, exit 2, nothing written (not even WORK)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("kv_heads, gb", [(None, "60.2"), ("8", "240.8")])
def test_a_cache_that_cannot_fit_is_refused_before_anything_is_written(tmp_path, kv_heads, gb):
    """The default written checkpoint has the folded Qwen3-VHA's 2 KV heads; --kv-heads 8 is stock Qwen3-0.6B."""
    work = tmp_path / "work"
    # Qwen3-0.6B, batch 64 x 16,400 positions: 64 x 28 layers x 2 x KV heads x 128 x 16,400 x 4 B = 60.2 GB for the
    # 2 KV heads of a folded VHA, 240.8 GB for stock Qwen3's 8
    extra = ["--kv-heads", kv_heads] if kv_heads else []
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench_serve_cpu.py"), str(work), "--batch", "64",
                        "--prompt", "16384", "--new", "16", "--cache", "buffer", *extra], capture_output=True, text=True)
    print(r.stderr)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr[-500:])
    assert "batch 64 x 16400 positions" in lines[0] and f"{gb} GB of float32 KV cache" in lines[0], lines[0]
    assert not work.exists()


@pytest.mark.slow
def test_prepare_only_writes_the_exports_and_a_later_run_reuses_them(tmp_path):
    """--prepare-only at Qwen3-0.6B widths (1 layer: vocabulary 151,936, head_dim 128 != hidden / heads) writes the
    checkpoint, the float32 export and the int4 copy, nothing half-written, and times nothing; a second run reuses them
    (no export line) and prints our int4 row."""
    work = tmp_path / "work"
    base = [sys.executable, os.path.join(ROOT, "tools", "bench_serve_cpu.py"), str(work), "--layers", "1",
            "--formats", "int4", "--no-genai", "--no-hf", "--llama-formats"]
    r = subprocess.run(base + ["--prepare-only"], capture_output=True, text=True)
    print(r.stderr[-2000:])
    assert r.returncode == 0, r.stderr[-1000:]
    assert sorted(os.listdir(work)) == ["checkpoint", "fp32", "int4"], os.listdir(work)
    assert os.path.isfile(work / "int4" / "export_info.json") and "tokens/s" not in r.stdout
    r = subprocess.run(base + ["--prompt", "5", "--new", "3"], capture_output=True, text=True)
    print(r.stdout, r.stderr[-1500:])
    assert r.returncode == 0, r.stderr[-1000:]
    assert "export" not in r.stderr and "quantized in" not in r.stderr, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("ours int4"))
    assert "failed" not in row and float(row.split("|")[1]) > 0, row


def test_a_llama_cpp_run_killed_by_sigsegv_is_run_again_without_extra_buffer_types():
    """tools/bench_llamacpp.py's run_side (the bench's and tests/test_llamacpp_client.py's way into the side env): a
    script that dies of SIGSEGV while LLAMA_EXTRA_BUFTS is unset (as llama.cpp 0.3.36 did through its AMX buffers on an
    AMX Xeon) is run once more with it at 0, and says so; a script that fails otherwise is not re-run."""
    sys.path.insert(0, ROOT)
    from tools.bench_llamacpp import EXTRA_BUFTS_SWITCH, run_side

    crash_unless_off = ("import os, signal, sys\nif os.environ.get('LLAMA_EXTRA_BUFTS') != '0':\n"
                        "    os.kill(os.getpid(), signal.SIGSEGV)\nprint('ran', sys.argv[1])\n")
    said = []
    r, retried = run_side(sys.executable, crash_unless_off, ["x"], log=said.append)
    assert (r.returncode, r.stdout.strip(), retried) == (0, "ran x", True), (r.returncode, r.stderr[-500:])
    assert len(said) == 1 and "SIGSEGV" in said[0], said
    said.clear()
    r, retried = run_side(sys.executable, "import sys; sys.exit(3)", [], log=said.append)
    assert (r.returncode, retried, said) == (3, False, [])
    assert "use_extra_bufts = False" in EXTRA_BUFTS_SWITCH  # the switch the side scripts put first
