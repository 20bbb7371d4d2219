"""Run the fused prologue's CUDA kernels on the CPU, under ops/emu/cuda_emu.h, against the float64 oracle.

    python tests/cuda_emu_harness.py --lib LIB.so --dtype bf16 --order 1     # prints one JSON line per case

build(out_so, kernels_dir=None) compiles ops/csrc/cuda/c_api.cu with g++ (-x c++ -DVHA_EMU) around the
unmodified kernel sources (or a mutated copy of ops/csrc in kernels_dir, made by mutated_copy, for the self-tests);
build(..., race=True) adds the emulator's shared-memory race detector (such a library is passed to --lib like any
other). Each case allocates every device buffer with emu_alloc (it ends at a guard page), runs forward and backward
through the extern "C" launcher, and reports max |err| / max |ref| per output against the float64 oracle
(tools/prologue_check/oracle.py). A fault (guard page), a deadlock, a divergent barrier or a race (race-checking
build) ends the process: callers run this file as a subprocess.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.append(os.path.join(ROOT, "tools"))  # as tests/conftest.py: this file also runs as a script
from prologue_check import oracle as po  # noqa: E402

CSRC = os.path.join(ROOT, "ops", "csrc")
# The CUDA sources under ops/csrc/cuda, in the order their code reads from the common helpers to the launchers: a
# mutation's anchor text is replaced where it first occurs in this order.
KERNEL_FILES = ("device_common.cuh", "simt_forward.cuh", "tc_primitives.cuh", "tc_prologue.cuh", "tc_gemm.cuh",
                "simt_backward.cuh", "partial_sums.cuh", "launch_common.cuh", "launch_forward.cuh",
                "launch_backward.cuh")


def kernel_file(csrc: str, text: str) -> str:
    """The file of csrc/cuda (KERNEL_FILES order) where `text` first occurs; an error naming the text if none has it."""
    for name in KERNEL_FILES:
        path = os.path.join(csrc, "cuda", name)
        with open(path) as f:
            if text in f.read():
                return path
    raise AssertionError(f"mutation anchor not found in ops/csrc/cuda: {text!r}")


def mutated_copy(dest: str, edits) -> str:
    """A copy of ops/csrc at dest with each (old, new) of edits replaced once, where old first occurs; returns dest."""
    shutil.copytree(CSRC, dest)
    for old, new in edits:
        path = kernel_file(dest, old)
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.replace(old, new, 1))
    return dest


DTYPES = {"fp32": 0, "fp64": 1, "bf16": 2, "fp16": 3}
# (B, S, H_p, H_kv, r, d, position offset): decode (S = 1 with an offset), tensor-core shapes with partial 64-row
# tiles (d = 64 / 128 / 256, r % 16 == 0), r % 16 != 0 (SIMT path), H_kv = 3, an empty batch, d = 512.
CASES = [
    (1, 1, 8, 2, 128, 128, 37),
    (2, 37, 4, 2, 64, 64, 0),
    (1, 13, 3, 3, 32, 256, 5),
    (2, 9, 4, 2, 40, 128, 2),
    (1, 6, 2, 1, 16, 64, 0),
    (0, 5, 4, 2, 64, 64, 0),
    (1, 2, 2, 1, 512, 512, 0),  # wide heads: the fp64 backward needs 80 KB of shared memory (an opt-in above 48 KB)
    (1, 20, 4, 1, 256, 256, 3),  # tensor cores with one q stage: W[g] (135 KB) leaves room for one 64 x 256 q tile only
    (1, 50, 3, 2, 64, 128, 1),  # H_p = 3: 64-row tiles split tokens; a token's key row belongs to its first row's tile
]


def cuda_include() -> str | None:
    """A folder with cuda_fp16.h / cuda_bf16.h (the emulator uses the toolkit's half types on the host)."""
    cands = [os.environ.get("CUDA_HOME", "")] + sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "include", "cuda_fp16.h")):
            return os.path.join(c, "include")
    return None


def build(out_so: str, kernels_dir: str | None = None, extra=(), race: bool = False, source: str | None = None) -> None:
    """Compile the launcher (or `source`, a .cu file that includes cuda_emu.h) into out_so for the emulator.

    race=True builds the shared-memory race detector (cuda_emu.h, VHA_EMU_RACECHECK): the source is compiled with
    GCC's -fsanitize=thread instrumentation (compile step only), then linked without libtsan, whose entry points the
    emulator defines; out_so's emu_race_checking() then returns 1."""
    inc = cuda_include()
    if inc is None:
        raise RuntimeError("no CUDA headers (cuda_fp16.h) found: set CUDA_HOME")
    src = kernels_dir or CSRC  # quoted includes look beside the including file first: a copy builds from itself
    source = source or os.path.join(src, "cuda", "c_api.cu")
    flags = ["-x", "c++", "-std=c++17", "-O1", "-fPIC", "-DVHA_EMU", f"-I{os.path.join(ROOT, 'ops', 'emu')}",
             f"-I{src}", f"-I{inc}", *extra]
    if not race:
        steps = [["g++", *flags, "-shared", source, "-o", out_so]]
    else:
        obj = out_so + ".o"
        steps = [["g++", *flags, "-DVHA_EMU_RACECHECK", "-fsanitize=thread", "-c", source, "-o", obj],
                 ["g++", "-shared", "-Wl,-z,defs", obj, "-o", out_so]]  # -z defs: a missing __tsan_* hook fails here
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("emulator build failed:\n" + " ".join(cmd) + "\n" + r.stderr[-4000:])


class Emu:
    def __init__(self, lib: str):
        self.lib = ctypes.CDLL(lib)
        self.lib.emu_alloc.restype = ctypes.c_void_p
        self.lib.emu_alloc.argtypes = [ctypes.c_size_t]
        self.lib.emu_last_error_message.restype = ctypes.c_char_p
        self.lib.vha_prologue_backward_workspace.restype = ctypes.c_size_t
        self.lib.vha_prologue_backward_workspace.argtypes = [ctypes.c_int] + [ctypes.c_long] * 6

    def schedule(self, order: int, seed: int = 0, sms: int = 4):
        self.lib.emu_set_schedule(ctypes.c_int(order), ctypes.c_uint(seed), ctypes.c_int(sms))

    def put(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a)
        p = self.lib.emu_alloc(max(a.nbytes, 1))
        if a.nbytes:
            ctypes.memmove(p, a.ctypes.data, a.nbytes)
        return p

    def empty(self, shape, dt) -> tuple:
        n = int(np.prod(shape)) * np.dtype(dt).itemsize
        return self.lib.emu_alloc(max(n, 1)), shape, dt

    @staticmethod
    def get(buf) -> np.ndarray:
        p, shape, dt = buf
        out = np.empty(shape, dt)
        if out.nbytes:
            ctypes.memmove(out.ctypes.data, p, out.nbytes)
        return out


def np_dtype(name):
    if name == "bf16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return {"fp32": np.float32, "fp64": np.float64, "fp16": np.float16}[name]


def rel(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if ref.size == 0:
        return 0.0 if got.size == 0 else float("inf")
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def run_case(emu: Emu, dtype: str, case, heads_first: int, seed: int = 0) -> dict:
    B, S, hp, hkv, r, d, off = case
    dt = np_dtype(dtype)
    rng = np.random.default_rng(seed)
    eps = 1e-6
    cast = lambda x: np.asarray(x, np.float64).astype(dt)  # noqa: E731 - inputs exactly representable in dt
    q_phys = cast(rng.normal(size=(B, S, hp, r)))
    k = cast(2.0 * rng.normal(size=(B, S, hkv, d)) + 0.5)
    W = cast(np.eye(r, d)[None] + 0.2 * rng.normal(size=(hkv, r, d)))
    wq, wk = cast(1 + 0.3 * rng.normal(size=d)), cast(1 + 0.3 * rng.normal(size=d))
    positions = np.arange(off, off + S)
    inv = 1.0 / (10000.0 ** (np.arange(0, d, 2) / d))
    ang = np.concatenate([positions[:, None] * inv[None]] * 2, axis=-1)[None]  # (1, S, d)
    cos, sin = cast(np.cos(ang)), cast(np.sin(ang))
    gq = cast(rng.normal(size=(B, S, hp * hkv, d)))
    gk = cast(rng.normal(size=(B, S, hkv, d)))
    f64 = [np.asarray(x, np.float64) for x in (q_phys, k, W, wq, wk, cos, sin)]
    ref_q, ref_k = po.forward(*f64, eps)
    ref_g = po.vjp(*f64, eps, np.asarray(gq, np.float64), np.asarray(gk, np.float64))

    lay = (lambda x: np.transpose(x, (0, 2, 1, 3))) if heads_first else (lambda x: x)  # (B,S,H,d) -> layout
    code = DTYPES[dtype]
    ptr = [emu.put(x) for x in (q_phys, k, W, wq, wk, cos, sin)]
    qo = emu.empty(lay(np.empty((B, S, hp * hkv, d))).shape, dt)
    ko = emu.empty(lay(np.empty((B, S, hkv, d))).shape, dt)
    L = emu.lib
    dims = [ctypes.c_long(v) for v in (B, S, hp, hkv, r, d, 1)]
    before, mma_before = L.emu_launch_count(), L.emu_mma_count()
    e = L.vha_prologue_forward(code, *[ctypes.c_void_p(p) for p in ptr], ctypes.c_void_p(qo[0]), ctypes.c_void_p(ko[0]),
                               *dims, ctypes.c_float(eps), ctypes.c_int(heads_first), ctypes.c_void_p(0))
    out = {"case": list(case), "dtype": dtype, "heads_first": heads_first, "fwd_error": int(e),
           "fwd_launches": int(L.emu_launch_count() - before), "fwd_mma": int(L.emu_mma_count() - mma_before),
           "error_message": L.emu_last_error_message().decode()}
    if e != 0:
        return out
    out["q"] = rel(Emu.get(qo), lay(ref_q))
    out["k"] = rel(Emu.get(ko), lay(ref_k))
    ws_bytes = L.vha_prologue_backward_workspace(code, B, S, hp, hkv, r, d)
    ws = L.emu_alloc(max(ws_bytes, 1))
    gqp, gkk = emu.empty(q_phys.shape, dt), emu.empty(k.shape, dt)
    gW, gwq, gwk = emu.empty(W.shape, dt), emu.empty(wq.shape, dt), emu.empty(wk.shape, dt)
    gptr = [emu.put(lay(gq)), emu.put(lay(gk))]
    e = L.vha_prologue_backward(code, *[ctypes.c_void_p(p) for p in ptr + gptr],
                                *[ctypes.c_void_p(b[0]) for b in (gqp, gkk, gW, gwq, gwk)], ctypes.c_void_p(ws),
                                ctypes.c_size_t(ws_bytes), *dims, ctypes.c_float(eps), ctypes.c_int(heads_first),
                                ctypes.c_void_p(0))
    out["bwd_error"] = int(e)
    out["bwd_mma"] = int(L.emu_mma_count() - mma_before) - out["fwd_mma"]
    out["error_message"] = L.emu_last_error_message().decode()
    if e != 0:
        return out
    import hashlib

    digests = {}
    for name, buf, ref in zip(["dq_phys", "dk", "dpremix", "dq_norm", "dk_norm"], (gqp, gkk, gW, gwq, gwk), ref_g):
        got = Emu.get(buf)
        out[name] = rel(got, ref)
        digests[name] = hashlib.sha256(got.tobytes()).hexdigest()[:16]
    for name, buf in (("q", qo), ("k", ko)):
        digests[name] = hashlib.sha256(Emu.get(buf).tobytes()).hexdigest()[:16]
    out["digests"] = digests
    if dtype in ("bf16", "fp16"):  # the yardstick of the tolerance: the composed chain's own error in this dtype
        import composed_lowp

        (cq, ck), cg = composed_lowp.forward_and_vjp(q_phys, k, W, wq, wk, cos, sin, eps, gq, gk, dt)
        out["composed"] = {name: rel(c, ref) for name, c, ref in
                           zip(("q", "k", "dq_phys", "dk", "dpremix", "dq_norm", "dk_norm"), (cq, ck, *cg),
                               (ref_q, ref_k, *ref_g))}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--dtype", choices=list(DTYPES), required=True)
    ap.add_argument("--order", type=int, default=0, help="0 in order, 1 reversed, 2 shuffled")
    ap.add_argument("--seed", type=int, default=0, help="input data seed")
    ap.add_argument("--schedule-seed", type=int, default=0, help="seed of the shuffled thread order")
    ap.add_argument("--cases", type=int, nargs="*", help="indices into CASES (default all)")
    ap.add_argument("--layouts", type=int, nargs="*", default=[1, 0])
    ap.add_argument("--cc-major", type=int, default=9, help="emulated compute capability (major)")
    ap.add_argument("--sms", type=int, default=4, help="emulated multiprocessors (fewer: more tiles per persistent CTA)")
    args = ap.parse_args(argv)
    emu = Emu(args.lib)
    emu.schedule(args.order, args.schedule_seed, args.sms)
    emu.lib.emu_set_compute_capability(ctypes.c_int(args.cc_major))
    for i in (args.cases if args.cases is not None else range(len(CASES))):
        for hf in args.layouts:
            print(json.dumps(run_case(emu, args.dtype, CASES[i], hf, seed=args.seed)), flush=True)


if __name__ == "__main__":
    main()
