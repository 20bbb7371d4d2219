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
