"""tools/bench_attention_cpu.py: every formulation it times computes the same attention (or the same two products) as
its float64 reference, at an odd batch, a prime context and Qwen3's head_dim 128 over 2 cached heads, with a sink
token holding half of each row's probability; the int8 cache's graph (the export's) within its designed precision,
and the cheaper digit counts measurably worse; a head count that is not a multiple of the cached heads is refused in
one line."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "bench_attention_cpu.py")


def test_every_formulation_agrees_with_the_float64_reference():
    r = subprocess.run([sys.executable, TOOL, "--batch", "3", "--context", "127", "--heads", "16", "--kv-heads", "2",
                        "--head-dim", "128", "--repeats", "2"], capture_output=True, text=True, timeout=300)
    print(r.stdout, r.stderr[-2000:])
    assert r.returncode == 0, r.stderr[-1000:]
    rows = {}
    for line in r.stdout.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) == 7 and cells[0] != "formulation":
            rows[(cells[0], cells[1])] = (float(cells[5].split()[-1]),
                                          None if cells[6] == "-" else float(cells[6]))
    assert sorted(rows) == sorted([
        ("buffer-flavour graph", "fp32"), ("its two cache MatMuls", "fp32"), ("keys stored (d, T)", "fp32"),
        ("GroupQueryAttention", "fp32"), ("numpy matmul", "fp32"), ("int8 cache graph", "int8"),
        ("its two int8 MatMuls", "int8"), ("probabilities in 1 digit", "int8"), ("probabilities in 2 digits", "int8"),
        ("queries in 1 digit", "int8"), ("int8 keys, float32 values", "int8"), ("int8 cast, float MatMul", "int8"),
        ("GroupQueryAttention, int8", "int8"), ("fused DecodeAttention", "fp32"),
        ("fused DecodeAttentionInt8", "int8")]), rows
    for (name, cache), (err, err_float) in rows.items():
        if name.startswith(("its two", "keys stored", "numpy", "int8 cast")):  # products, relative: float32 rounding
            assert err < 1e-5, (name, err)
        elif cache == "fp32" or name in ("GroupQueryAttention, int8", "fused DecodeAttentionInt8"):  # float32
            # arithmetic over its own cache (the fused int8 node dequantizes it exactly)
            assert err < 1e-5, (name, err)  # outputs are convex mixes of values of unit variance around an offset
    graph, graph_float = rows[("int8 cache graph", "int8")]
    # the export's graph: its own arithmetic (queries in two 8-bit digits, probabilities in three) near float32; the
    # int8 cache's rounding (per token and head, 8 bits) is what moves it from the float cache
    assert graph < 1e-3 and graph_float < 5e-2 and rows[("int8 keys, float32 values", "int8")][0] < 1e-3
    for cheaper in ("probabilities in 1 digit", "queries in 1 digit"):  # what the extra digits buy: 10x at least
        assert rows[(cheaper, "int8")][0] > 10 * graph, (cheaper, rows[(cheaper, "int8")], graph)


def test_heads_not_a_multiple_of_kv_heads_is_refused():
    r = subprocess.run([sys.executable, TOOL, "--heads", "5", "--kv-heads", "2"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "not a multiple" in r.stderr.strip().splitlines()[-1], r.stderr
