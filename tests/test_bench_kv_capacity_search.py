"""tools/bench_kv_capacity.py's search, on synthetic memory curves (peak = base + rows x growth, with allocation noise;
a runtime limit; failures): its answer must be a probed fit and a probed miss that bracket the true capacity within
1/16, found in a handful of probes, and it must never report a batch it did not probe."""
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import bench_kv_capacity as cap  # noqa: E402

GB = 1e9


def curve(base_gb, row_gb, noise_gb=0.0, limit=None, seed=0, load_gb=0.0):
    """A probe function: the peak RSS of `batch` rows (None past `limit`: a refused context), at least `load_gb` (the
    loading's transient peak, which a few rows of cache do not pass), with a fixed noise per batch (allocation
    granularity), and the list of the batches it was called with."""
    rng = np.random.default_rng(seed)
    noise = {}
    calls = []

    def run(batch, context):
        calls.append(batch)
        if limit is not None and batch > limit:
            return None
        noise.setdefault(batch, rng.uniform(-noise_gb, noise_gb))
        return {"peak_rss": (max(load_gb, base_gb + row_gb * batch) + noise[batch]) * GB}

    return run, calls


def true_capacity(base_gb, row_gb, budget_gb, limit=None):
    b = int(np.floor((budget_gb - base_gb) / row_gb))
    return min(b, limit) if limit is not None else b


@pytest.mark.parametrize("base_gb, row_gb, limit, load_gb", [
    (2.3, 0.939, None, 0),    # 1.7B shape, float32 cache at 16K: ~21 rows
    (2.3, 0.241, None, 0),    # int8 cache at 16K: ~81 rows
    (2.3, 0.0587, None, 0),   # int8 cache at 4K: ~335 rows
    (1.2, 0.0301, 256, 0),    # llama.cpp q8_0 at 4K: its 256-sequence limit comes first
    (1.2, 0.47, 256, 0),      # llama.cpp f16 at 16K: ~44 rows
    (20.5, 0.9, None, 0),     # one row fits, two do not
    (23.0, 1.0, None, 0),     # not even one row
    (3.0, 0.241, None, 3.47),  # int8 cache at 16K, the loading's peak flat over batches 1 and 2 (measured at 1.7B)
    (3.2, 0.07, None, 3.47),   # ... the first rise only part of a row (measured: 1, 2, 4 rows peak 3.47, 3.47, 3.62)
    (3.0, 0.0587, None, 3.47),  # int8 cache at 4K: flat up to batch 8
    (1.2, 0.0301, 256, 2.5),   # llama.cpp q8_0 at 4K, flat to batch 32, then its limit
])
def test_the_search_brackets_the_capacity_within_a_sixteenth_in_few_probes(base_gb, row_gb, limit, load_gb,
                                                                          monkeypatch):
    monkeypatch.setattr(cap, "available_memory_bytes", lambda: None)  # this machine's free memory plays no part
    budget = 22.0
    run, calls = curve(base_gb, row_gb, noise_gb=0.004, limit=limit, load_gb=load_gb)
    prober = cap.Prober("synthetic", run, margin=0.0, max_batch=limit)
    args = SimpleNamespace(budget_gb=budget)
    row = cap.search(prober, 4096, args, log=lambda m: None, max_batch=limit)
    truth = true_capacity(base_gb, row_gb, budget, limit)
    print(f"truth {truth}, fit {row['fit'] and row['fit'][0]}, miss {row['miss'] and row['miss'][0]}, "
          f"probes {row['probes']} ({calls}), note {row['note']}")
    assert row["probes"] == len(calls) == len(set(calls)), "every probe runs once"
    if truth < 1:
        assert row["fit"] is None and row["note"] == "one row did not fit"
        return
    fit = row["fit"][0]
    assert fit in calls and row["fit"][1] <= budget * GB and fit <= truth + 1, row  # +1: the noise at the edge
    if limit is not None and fit == limit:
        assert row["note"].startswith("the runtime's limit")
    else:
        miss = row["miss"][0]
        assert miss in calls and miss > fit and (miss - fit) <= max(1, fit // 16), row
        assert fit >= truth - max(1, truth // 16) - 1, (fit, truth)
    # a flat start adds doublings, cheap ones (together fewer rows than the last): at most two probes more
    bound = 8 if not load_gb else 10
    assert row["probes"] <= bound, f"{row['probes']} probes: the prediction should have led the search"


def test_a_probe_past_available_memory_stops_the_search_with_a_note(monkeypatch):
    """A guess the machine cannot hold is not started; the answer is the largest fit probed, and the row says why."""
    run, calls = curve(2.0, 1.0)
    monkeypatch.setattr(cap, "available_memory_bytes", lambda: 8 * GB)
    prober = cap.Prober("synthetic", run, margin=1 * GB)
    row = cap.search(prober, 4096, SimpleNamespace(budget_gb=22.0), log=lambda m: None)
    print(row, calls)
    assert calls == [1, 2] and row["fit"][0] == 2 and "not started" in row["note"]
    assert row["predicted"] == 20


def test_a_probe_killed_without_a_word_says_how_it_ended():
    """A probe the OOM killer ends writes nothing on stderr: the log line names the signal instead of '?'."""
    import subprocess

    import bench_serve_cpu

    killed = subprocess.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                            capture_output=True, text=True)
    silent = subprocess.run([sys.executable, "-c", "raise SystemExit(3)"], capture_output=True, text=True)
    loud = subprocess.run([sys.executable, "-c", "1 / 0"], capture_output=True, text=True)
    lines = [bench_serve_cpu.failure_line(r) for r in (killed, silent, loud)]
    print(lines)
    assert lines == ["killed by signal 9 (SIGKILL: out of memory?)", "exit 3, nothing on stderr",
                     "ZeroDivisionError: division by zero"]


def test_a_context_past_the_positions_is_refused_before_anything_is_written(tmp_path):
    """--contexts 40960 at the Qwen3 shape (40,960 positions; the step needs one more): one line, exit 2, no work
    folder; the default contexts all lie below the shape's positions."""
    import subprocess

    from fixtures.qwen3_shaped import qwen3_config

    work = tmp_path / "work"
    r = subprocess.run([sys.executable, cap.__file__, str(work), "--shape", "1.7b", "--contexts", "4096", "40960"],
                       capture_output=True, text=True)
    print(r.returncode, r.stderr.strip().splitlines()[-1:])
    assert r.returncode == 2 and "40960 positions" in r.stderr.strip().splitlines()[-1]
    assert not work.exists()
    for shape in ("0.6b", "1.7b"):
        assert max(cap.DEFAULT_CONTEXTS) < qwen3_config(shape)["max_position_embeddings"]
