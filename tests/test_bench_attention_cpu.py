"""tools/bench_attention_cpu.py: every formulation it times computes the same attention (or the same two products) as
its float64 reference, at an odd batch, a prime context and Qwen3's head_dim 128 over 2 cached heads; a head count
that is not a multiple of the cached heads is refused in one line."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "bench_attention_cpu.py")


def test_every_formulation_agrees_with_the_float64_reference():
    r = subprocess.run([sys.executable, TOOL, "--batch", "3", "--context", "127", "--heads", "16", "--kv-heads", "2",
                        "--head-dim", "128", "--repeats", "2"], capture_output=True, text=True, timeout=300)
    print(r.stdout, r.stderr[-2000:])
    assert r.returncode == 0, r.stderr[-1000:]
    rows = {line.split("|")[0].strip(): line for line in r.stdout.splitlines() if line.count("|") == 4}
    rows.pop("formulation")
    assert sorted(rows) == sorted(["buffer-flavour graph", "its two cache MatMuls", "keys stored (d, T)",
                                   "GroupQueryAttention", "numpy matmul"]), rows
    for name, line in rows.items():
        err = float(re.search(r"([0-9.]+e[-+][0-9]+)\s*$", line).group(1))
        # float32 against float64: outputs are convex mixes of unit-variance values (bound 1e-5); the products are sums
        # of 128 (scores) or 128 (probability x value) terms of unit size (bound 1e-4)
        assert err < (1e-4 if "products" in line else 1e-5), (name, err)


def test_heads_not_a_multiple_of_kv_heads_is_refused():
    r = subprocess.run([sys.executable, TOOL, "--heads", "5", "--kv-heads", "2"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "not a multiple" in r.stderr.strip().splitlines()[-1], r.stderr
