"""tools/gpu_check.py's correctness harness (tools/prologue_check/accuracy.py + launcher.py) run on this CPU: the same
check() the H200 runs, over CPU PyTorch tensors (the Hugging Face side environment's torch), against the launcher
built for the host emulator (ops/emu/cuda_emu.h). The first GPU run (2026-12-04) failed every batch > 1 shape because
the harness handed the kernels a strided RoPE table; this runs the harness itself in CI so such a bug shows here."""
import os
import shutil
import subprocess
import textwrap

import pytest

import cuda_emu_harness as harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent(r"""
    import ctypes, json, sys
    sys.path[:0] = [sys.argv[2]]
    import numpy as np, torch
    from prologue_check import launcher as L
    from prologue_check.accuracy import check
    lib = ctypes.CDLL(sys.argv[1])
    lib.emu_set_schedule(ctypes.c_int(2), ctypes.c_uint(3), ctypes.c_int(4))  # threads shuffled, 4 SMs
    lib.emu_set_compute_capability(ctypes.c_int(9))
    vp, Lg, F, I = ctypes.c_void_p, ctypes.c_long, ctypes.c_float, ctypes.c_int
    lib.vha_prologue_forward.argtypes = [I] + [vp] * 9 + [Lg] * 7 + [F, I, vp]
    lib.vha_prologue_backward_workspace.argtypes = [I] + [Lg] * 6
    lib.vha_prologue_backward_workspace.restype = ctypes.c_size_t
    lib.vha_prologue_backward.argtypes = [I] + [vp] * 15 + [ctypes.c_size_t] + [Lg] * 7 + [F, I, vp]
    fused = L.Fused(lib, stream=lambda: ctypes.c_void_p(0))
    shapes = [tuple(s) for s in json.loads(sys.argv[3])]
    results = []
    ok = check(fused, results, device="cpu", shapes=shapes)
    # the launcher refuses a strided tensor (what the first GPU run was given) instead of reading it as contiguous
    B, S, Hp, Hkv, r, d = 2, 5, 2, 1, 16, 64
    t = lambda *s: torch.randn(*s, dtype=torch.float32)
    cos = t(S, B, d).transpose(0, 1)  # (B, S, d), not contiguous
    try:
        fused.forward(t(B, S, Hp, r), t(B, S, Hkv, d), t(Hkv, r, d), t(d), t(d), cos, cos.clone(), 1e-6)
        refused = ""
    except AssertionError as e:
        refused = str(e)
    print(json.dumps(dict(ok=ok, refused=refused, rows=[
        dict(shape=x["shape"], dtype=x["dtype"], out=x["out"], fused=x["fused"], composed=x["composed"], ok=x["ok"])
        for x in results])))
""")

# batch > 1 with per-row RoPE tables (Bc = B), prime S, H_kv = 1 / 2 / 3, r < d, a decode row with an offset
SHAPES = [(1, 1, 8, 2, 128, 128, 37), (2, 13, 4, 1, 64, 64, 0), (3, 7, 4, 2, 40, 64, 5), (1, 5, 3, 3, 8, 8, 2)]


@pytest.mark.slow
def test_gpu_check_harness_passes_on_the_emulator(tmp_path, hf_python):
    if shutil.which("g++") is None or harness.cuda_include() is None:
        pytest.skip("needs g++ and the CUDA headers (cuda_fp16.h); set CUDA_HOME")
    lib = str(tmp_path / "libvha_emu.so")
    harness.build(lib)
    (tmp_path / "run.py").write_text(SCRIPT)
    import json

    r = subprocess.run([hf_python, str(tmp_path / "run.py"), lib, os.path.join(ROOT, "tools"), json.dumps(SHAPES)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    worst = {}
    for row in out["rows"]:
        key = (row["dtype"], row["out"])
        worst[key] = max(worst.get(key, 0.0), row["fused"])
    for (dt, o), e in sorted(worst.items()):
        print(f"{dt:9s} {o:10s} max rel err {e:.2e}")
    bad = [row for row in out["rows"] if not row["ok"]]
    assert len(out["rows"]) == len(SHAPES) * 4 * 7
    assert out["ok"] and not bad, bad[:5]
    assert "contiguous" in out["refused"], out["refused"]
