"""tools/bench_llamacpp.py's "random" context for llama.cpp's batch rows: instead of a 16K prefill (~15-40 min on 2
cores), a 512-position prefill's cache is read back (llama_state_seq_get_data), its rows tiled to the prompt's length
and set into every row (llama_state_seq_set_data). On the real SmolLM2-135M-Instruct GGUF (Llama architecture, 3 KV
heads of 64, its own Q4_1 file; fetched once, cached):

- at exactly 512 positions the tiled blob is the read-back one, so every row's first decode step must give the logits
  a real prefill of row 0 copied to the other rows gives (llama_memory_seq_cp): the parse and rebuild lose nothing;
- at 1,031 positions (prime, not a multiple of the seed) every row holds positions 0..1,030 (asserted in the side
  script) and steps to finite logits."""
import numpy as np
import pytest

from _utils import llama_side_env, smollm2_gguf_path
from tools.bench_llamacpp import LLAMA_BATCH, run_side


@pytest.fixture(scope="module")
def llama_python():
    return llama_side_env()[0]


@pytest.fixture(scope="module")
def smollm2_gguf():
    return smollm2_gguf_path()


def batch_run(python, gguf, tmp_path, monkeypatch, batch, prompt, context, kv_type, new=4):
    """(result dict, first step's logits (batch, vocabulary)) of LLAMA_BATCH in the side environment."""
    import json

    out = tmp_path / f"logits-{context}-{prompt}-{kv_type}.npy"
    monkeypatch.setenv("LLAMA_BATCH_LOGITS", str(out))
    r, _ = run_side(python, LLAMA_BATCH, [gguf, batch, prompt, new, 2, kv_type, context], timeout=600)
    print(r.stderr[-1500:])
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), np.load(out)


@pytest.mark.slow
@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_a_tiled_context_restores_exactly_and_steps_at_its_length(tmp_path, monkeypatch, llama_python, smollm2_gguf,
                                                                  kv):
    from tools.bench_llamacpp import KV_TYPES

    kv_type = KV_TYPES[kv][0]
    real, ref = batch_run(llama_python, smollm2_gguf, tmp_path, monkeypatch, 3, 512, "prompt", kv_type)
    tiled, got = batch_run(llama_python, smollm2_gguf, tmp_path, monkeypatch, 3, 512, "random", kv_type)
    err = np.abs(got.astype(np.float64) - ref)
    print(f"{kv}: 512 positions, prefilled vs restored: max |dlogit| {err.max():.3g}, mean {err.mean():.3g} "
          f"(logits up to {np.abs(ref).max():.3g}); notes: {real['note']!r} / {tiled['note']!r}")
    assert got.shape == ref.shape == (3, ref.shape[1]) and np.isfinite(ref).all()
    assert err.max() <= 1e-4 * np.abs(ref).max(), "the restored cache is not the prefilled one"
    assert "tiled" in tiled["note"] and "tiled" not in real["note"]

    longer, logits = batch_run(llama_python, smollm2_gguf, tmp_path, monkeypatch, 3, 1031, "random", kv_type, new=6)
    print(f"{kv}: step at 512 positions {tiled['step'] * 1e3:.2f} ms, at 1,031 {longer['step'] * 1e3:.2f} ms")
    assert np.isfinite(logits).all() and logits.shape == ref.shape
