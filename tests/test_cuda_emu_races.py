"""The emulator's shared-memory race detector (ops/emu/cuda_emu.h, built with -DVHA_EMU_RACECHECK: the kernels are
compiled with GCC's -fsanitize=thread instrumentation and linked against the emulator's own __tsan_* hooks).

1. The project's kernels, unmodified, run under the race checker without a report and still match the float64
   oracle (SIMT kernels in fp32; the tensor-core kernels, with cp.async and ldmatrix, in bf16).
2. Removing a barrier from a SIMT kernel makes the run stop with the detector's race message.
3. The detector on its own, with a tiny kernel written here: ordered and unordered pairs of accesses, by two warps and
   within one warp, in dynamic and static shared memory, cp.async writes, ldmatrix reads and atomics.
"""
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import cuda_emu_harness as harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "ops", "csrc")
# max |err| / max |ref| against float64, as in test_cuda_emulation.py
TOL = {"fp32": 4e-6}
OUTPUTS = ("q", "k", "dq_phys", "dk", "dpremix", "dq_norm", "dk_norm")


def need_toolchain():
    if shutil.which("g++") is None or harness.cuda_include() is None:
        pytest.skip("needs g++ and the CUDA headers (cuda_fp16.h); set CUDA_HOME")


def race_checking(lib) -> int:
    r = subprocess.run([sys.executable, "-c", f"import ctypes; print(ctypes.CDLL({lib!r}).emu_race_checking())"],
                       capture_output=True, text=True, timeout=60)
    return int(r.stdout.strip() or -1)


def run(lib, dtype, cases, order=0, layouts=(1, 0), timeout=300, sms=4):
    cmd = [sys.executable, os.path.join(ROOT, "tests", "cuda_emu_harness.py"), "--lib", lib, "--dtype", dtype,
           "--order", str(order), "--seed", "3", "--layouts", *map(str, layouts), "--cases", *map(str, cases),
           "--sms", str(sms)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return r, [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.fixture(scope="module")
def race_lib(tmp_path_factory):
    need_toolchain()
    out = str(tmp_path_factory.mktemp("race") / "libvha_emu_race.so")
    harness.build(out, race=True)
    return out


# ---- 1. the unmodified kernels -----------------------------------------------------------------------------------
# fp32: SIMT forward and backward (decode, partial tiles, r % 16 != 0, r = 16). bf16 at tensor-core shapes
# (d = 64 / 128 / 256 with r % 16 == 0: cp.async, ldmatrix, mma) and the SIMT fallback (r = 40), threads shuffled.
# bf16 on one emulated SM: persistent CTAs loop over several tiles (q prefetch into the other buffer, tables and dL/dout
# restaged per tile; case 7 with a single q stage).
@pytest.mark.parametrize("dtype,order,cases,sms", [("fp32", 1, [0, 1, 3, 4], 4), ("bf16", 2, [0, 1, 2, 3, 4, 5], 4),
                                                   ("bf16", 2, [1, 7, 8], 1)])
def test_kernels_have_no_shared_memory_races(race_lib, dtype, order, cases, sms):
    assert race_checking(race_lib) == 1
    r, results = run(race_lib, dtype, cases, order=order, sms=sms)
    print(f"{dtype}: return code {r.returncode}, stderr {last_line(r.stderr)!r}")
    assert r.returncode == 0 and "race" not in r.stderr, r.stderr[-3000:]
    assert len(results) == 2 * len(cases)
    for res in results:
        errs = {k: res[k] for k in OUTPUTS if k in res}
        print(dtype, res["case"], "heads_first" if res["heads_first"] else "bshd", f"launches {res['fwd_launches']}",
              " ".join(f"{k} {v:.1e}" for k, v in errs.items()))
        assert res["fwd_error"] == 0 and res["bwd_error"] == 0, res["error_message"]
        assert set(errs) == set(OUTPUTS), res["error_message"]
        # fp32: arithmetic error; bf16: at most 2x the composed chain's own error plus half an ulp (the policy)
        bound = {k: TOL["fp32"] if dtype == "fp32" else 2 * res["composed"][k] + 2.0 ** -9 for k in errs}
        assert all(errs[k] <= bound[k] for k in errs), (res["case"], errs, bound)


# ---- 2. a removed barrier is reported ------------------------------------------------------------------------------
def mutated_csrc(dest, kernel, old, new):
    """A copy of ops/csrc with `old` replaced by `new` once, inside the body of the kernel `kernel`."""
    shutil.copytree(CSRC, dest)
    path = harness.kernel_file(dest, f" {kernel}(")
    with open(path) as f:
        text = f.read()
    start = text.find(f" {kernel}(")
    assert start >= 0, f"kernel {kernel} not found"
    end = text.find("\n}\n", start)
    at = text.find(old, start)
    assert 0 <= at < end, f"mutation anchor not found in {kernel}: {old!r}"
    with open(path, "w") as f:
        f.write(text[:at] + new + text[at + len(old):])
    return dest


MUTATIONS = {
    # the block barrier before the warps' per-warp partials are summed: threads read other warps' partials
    "bwd_rows: __syncthreads before the block sum": (
        "bwd_rows", "  __syncthreads();\n  for (long c = threadIdx.x; c < 2 * D.d; c += blockDim.x) {",
        "  for (long c = threadIdx.x; c < 2 * D.d; c += blockDim.x) {", "different warps"),
    # the warp barrier after a warp stages its q row: lanes read the row other lanes write
    "fwd_simt: __syncwarp after staging the q row": (
        "fwd_simt", "qrow[k] = to_c(qp[row * D.r + k]);\n      __syncwarp();", "qrow[k] = to_c(qp[row * D.r + k]);",
        "one warp"),
    # tensor cores: the block barrier after the cp.async wait: warps read (ldmatrix) W rows other threads copied
    "q_tc: __syncthreads after cp.async.wait_group": (
        "q_tc", "cp_async_wait<2>();  // W, the norm weights and this tile's q have landed (the tables, dL/dout and the "
        "next tile's\n    __syncthreads();", "cp_async_wait<2>();  //", "cp.async write"),
    # the GEMM's barrier at the end of a K step: the next step's cp.async (or the epilogue's staging) overwrites
    # shared memory that ldmatrix of other lanes still reads
    "gemm_tc: __syncthreads before a buffer is restaged": (
        "gemm_tc", "    __syncthreads();  // the buffer is restaged by the next iteration\n", "", "ldmatrix read"),
}
CASE_OF = {"bwd_rows": ("fp32", 4), "fwd_simt": ("fp32", 4), "q_tc": ("bf16", 1), "gemm_tc": ("bf16", 1)}


def test_removed_barriers_are_reported(tmp_path):
    """Each mutant (built with the race checker, both at once) stops with "cuda_emu: race on shared memory" naming
    the mutated kernel, the two threads and how they should have been ordered."""
    need_toolchain()
    libs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {}
        for i, (name, (kernel, old, new, _)) in enumerate(MUTATIONS.items()):
            src = mutated_csrc(str(tmp_path / f"m{i}"), kernel, old, new)
            libs[name] = str(tmp_path / f"mutant{i}.so")
            futures[name] = pool.submit(harness.build, libs[name], kernels_dir=src, race=True)
        for f in futures.values():
            f.result()
    for name, (kernel, _, _, how) in MUTATIONS.items():
        dtype, case = CASE_OF[kernel]
        r, _ = run(libs[name], dtype, [case], layouts=[1])
        msg = last_line(r.stderr)
        print(f"{name}: return code {r.returncode}\n  {msg}")
        assert r.returncode != 0 and msg.startswith("cuda_emu: race on shared memory"), r.stderr[-2000:]
        assert kernel in msg and how in msg and "thread (" in msg and "block (" in msg, msg


# ---- 3. the detector on a kernel of its own ------------------------------------------------------------------------
PROBE = textwrap.dedent("""\
    #include "cuda_emu.h"

    // 64 threads (two warps), 256 bytes of dynamic shared memory; each thread writes what it read to out[t].
    __global__ void probe(int mode, const int* src, int* out) {
      VHA_DYNAMIC_SHARED(smem);
      int* s = reinterpret_cast<int*>(smem);
      __shared__ int st[64];
      const int t = threadIdx.x;
      int v = 0;
      switch (mode) {
        case 0:  // thread 0 writes, __syncthreads, thread 40 (warp 1) reads
          if (t == 0) s[0] = 42;
          __syncthreads();
          if (t == 40) v = s[0];
          break;
        case 1:  // the same without the barrier
          if (t == 0) s[0] = 42;
          if (t == 40) v = s[0];
          break;
        case 2:  // lanes 3 and 7 of warp 0, __syncwarp between
          if (t == 3) s[1] = 7;
          __syncwarp();
          if (t == 7) v = s[1];
          break;
        case 3:  // the same with a shuffle instead of __syncwarp
          if (t == 3) s[1] = 7;
          v = __shfl_xor_sync(0xffffffffu, t, 1);
          if (t == 7) v = s[1];
          break;
        case 4:  // __syncwarp between two warps
          if (t == 3) s[1] = 7;
          __syncwarp();
          if (t == 40) v = s[1];
          break;
        case 5:  // every thread reads, __syncthreads, one writes
          v = s[2];
          __syncthreads();
          if (t == 5) s[2] = 1;
          break;
        case 6:  // every thread reads, __syncwarp, one writes: warp 1's reads are unordered
          v = s[2];
          __syncwarp();
          if (t == 5) s[2] = 1;
          break;
        case 7:  // static __shared__: thread 2 writes, thread 40 reads, no barrier
          if (t == 2) st[10] = 1;
          if (t == 40) v = st[10];
          break;
        case 8:  // cp.async by thread 0, waited for after the barrier: lands unordered with thread 40's read
        case 9:  // waited for before the barrier
          if (t == 0) {
            emu::cp_async(s + 4, src, 16);
            emu::cp_async_commit();
            if (mode == 9) emu::cp_async_wait(0);
          }
          __syncthreads();
          if (t == 0 && mode == 8) emu::cp_async_wait(0);
          if (t == 40) v = s[4];
          break;
        case 10:  // warp 1 writes 8 rows of 16 bytes that warp 0 reads with ldmatrix, no barrier
        case 11:  // with a __syncthreads between
          if (t >= 32) s[16 + (t - 32)] = t;
          if (mode == 11) __syncthreads();
          if (t < 32) {
            uint32_t r[1];
            emu::ldmatrix<1>(r, smem + 64 + 16 * (t % 8), false);
            v = int(r[0]);
          }
          break;
        case 12:  // every thread atomicAdds to one counter between two barriers
          if (t == 0) s[3] = 0;
          __syncthreads();
          atomicAdd(s + 3, 1);
          __syncthreads();
          v = s[3];
          break;
      }
      out[t] = v;
    }

    extern "C" int probe_launch(int mode, const int* src, int* out) {
      VHA_LAUNCH(dim3(1), dim3(64), 256, 0, probe)(mode, src, out);
      return int(cudaGetLastError());
    }
    """)

RUN_PROBE = textwrap.dedent("""\
    import ctypes, json, sys
    lib = ctypes.CDLL(sys.argv[1])
    lib.emu_alloc.restype = ctypes.c_void_p
    src, out = lib.emu_alloc(64), lib.emu_alloc(256)
    ctypes.memmove(src, (ctypes.c_int * 16)(*range(100, 116)), 64)
    e = lib.probe_launch(int(sys.argv[2]), ctypes.c_void_p(src), ctypes.c_void_p(out))
    print(json.dumps({"error": e, "out": list((ctypes.c_int * 64).from_address(out))}))
    """)

# mode -> (None: no report, and out[thread] == value) or (text the race message contains)
PROBES = {
    "write-barrier-read, two warps": (0, None, (40, 42)),
    "write-read, two warps, no barrier": (1, "4-byte read by thread (40,0,0) (warp 1)", "write by thread (0,0,0)"),
    "write-syncwarp-read, one warp": (2, None, (7, 7)),
    "write-shuffle-read, one warp": (3, "read by thread (7,0,0)", "one warp"),
    "write-syncwarp-read, two warps": (4, "read by thread (40,0,0)", "different warps"),
    "reads-barrier-write": (5, None, (0, -842150451)),  # 0xCDCDCDCD: the uninitialised shared memory
    "reads-syncwarp-write": (6, "write by thread (5,0,0) (warp 0)", "read by thread (63,0,0) (warp 1)"),
    "static shared, two warps, no barrier": (7, "static (emu_shared section) shared memory offset 40", "thread (2,0,0)"),
    "cp.async waited for after the barrier": (8, "cp.async write by thread (0,0,0)", "read by thread (40,0,0)"),
    "cp.async waited for before the barrier": (9, None, (40, 100)),
    "ldmatrix of rows another warp wrote": (10, "ldmatrix read by thread (0,0,0)", "write by thread (32,0,0) (warp 1)"),
    "ldmatrix after a barrier": (11, None, (0, 32)),  # row 0 = s[16..19]: its first 16-bit element is thread 32's
    "atomicAdd to one counter": (12, None, (63, 64)),
}


@pytest.fixture(scope="module")
def probe_lib(tmp_path_factory):
    need_toolchain()
    d = tmp_path_factory.mktemp("probe")
    src = d / "probe.cu"
    src.write_text(PROBE)
    out = str(d / "probe.so")
    harness.build(out, kernels_dir=str(d), race=True, source=str(src))
    return out


@pytest.mark.parametrize("name", list(PROBES))
def test_race_detector_on_a_probe_kernel(probe_lib, name):
    mode, expect, detail = PROBES[name]
    r = subprocess.run([sys.executable, "-c", RUN_PROBE, probe_lib, str(mode)], capture_output=True, text=True,
                       timeout=60)
    msg = last_line(r.stderr)
    print(f"{name} (mode {mode}): return code {r.returncode}; {msg or last_line(r.stdout)[:120]}")
    if expect is None:
        assert r.returncode == 0 and "race" not in r.stderr, r.stderr[-2000:]
        res = json.loads(last_line(r.stdout))
        thread, value = detail
        assert res["error"] == 0 and res["out"][thread] == value, res
    else:
        assert r.returncode != 0 and msg.startswith("cuda_emu: race on shared memory"), (r.stdout, r.stderr[-2000:])
        assert "block (0,0,0) of kernel probe" in msg and expect in msg and detail in msg, msg
