"""tools/bench_serve_cpu.py refuses a batch whose KV cache cannot fit, up front: one line with the need and its
parts, exit 2, nothing written (not even WORK)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_cache_that_cannot_fit_is_refused_before_anything_is_written(tmp_path):
    work = tmp_path / "work"
    # Qwen3-0.6B, batch 64 x 16,400 positions: 64 x 28 layers x 2 x 8 KV heads x 128 x 16,400 x 4 B = 240.8 GB
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench_serve_cpu.py"), str(work), "--batch", "64",
                        "--prompt", "16384", "--new", "16", "--cache", "buffer"], capture_output=True, text=True)
    print(r.stderr)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr[-500:])
    assert "batch 64 x 16400 positions" in lines[0] and "240.8 GB of float32 KV cache" in lines[0], lines[0]
    assert not work.exists()
