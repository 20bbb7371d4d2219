"""The fused prologue's CUDA kernels, run on the CPU under the host emulator of the CUDA execution model
(ops/emu/cuda_emu.h; tests/cuda_emu_harness.py), against the float64 oracle, and a mutation self-test showing that the
emulator catches a swapped mma fragment register, a removed barrier, an unmasked tail row, a wrong dW index and a
divergent __syncthreads, and
that launches are checked against the shared-memory limit."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import cuda_emu_harness as harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "ops", "csrc", "vha_prologue_kernels.cuh")
# max |err| / max |ref| allowed against float64: fp32 / fp64 arithmetic, or one rounding of each output to 16 bits
TOL = {"fp32": 4e-6, "fp64": 1e-13, "bf16": 2.0 ** -8 * 1.05, "fp16": 2.0 ** -11 * 1.05 * 2}
OUTPUTS = ("q", "k", "dq_phys", "dk", "dpremix", "dq_norm", "dk_norm")


@pytest.fixture(scope="module")
def emu_lib(tmp_path_factory):
    if shutil.which("g++") is None or harness.cuda_include() is None:
        pytest.skip("needs g++ and the CUDA headers (cuda_fp16.h); set CUDA_HOME")
    out = str(tmp_path_factory.mktemp("emu") / "libvha_emu.so")
    harness.build(out)
    return out


def run(lib, dtype, order=0, seed=0, cases=None, layouts=(1, 0), timeout=600, cc_major=9, schedule_seed=0):
    cmd = [sys.executable, os.path.join(ROOT, "tests", "cuda_emu_harness.py"), "--lib", lib, "--dtype", dtype,
           "--order", str(order), "--seed", str(seed), "--layouts", *map(str, layouts), "--cc-major", str(cc_major),
           "--schedule-seed", str(schedule_seed)]
    if cases is not None:
        cmd += ["--cases", *map(str, cases)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return r, results


@pytest.mark.parametrize("dtype,order", [("fp32", 1), ("fp64", 0), ("bf16", 2), ("fp16", 1)])
def test_kernels_match_the_oracle_under_emulation(emu_lib, dtype, order):
    """Forward and backward, both layouts, every case of the harness (S = 1 with an offset; tensor-core shapes with
    partial 64-row tiles at d = 64 / 128 / 256; r % 16 != 0; H_kv = 3; an empty batch), threads resumed in order,
    reversed or shuffled."""
    r, results = run(emu_lib, dtype, order=order, seed=7)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(results) == 2 * len(harness.CASES)
    for res in results:
        errs = {k: res[k] for k in OUTPUTS if k in res}
        print(dtype, res["case"], "heads_first" if res["heads_first"] else "bshd",
              " ".join(f"{k} {v:.2e}" for k, v in errs.items()))
        assert res["fwd_error"] == 0 and res["bwd_error"] == 0, res["error_message"]
        assert set(errs) == set(OUTPUTS)
        assert max(errs.values()) <= TOL[dtype], (res["case"], errs)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_backward_is_bitwise_deterministic(emu_lib, dtype):
    """No floating-point atomics: every output is bitwise the same whatever order the threads run in (in order,
    reversed, two shuffles), including the weight gradients summed over blocks and row chunks."""
    seen = {}
    for order, sched in ((0, 0), (1, 0), (2, 1), (2, 2)):
        r, res = run(emu_lib, dtype, order=order, schedule_seed=sched, cases=[1, 2, 3], layouts=[1])
        assert r.returncode == 0, r.stderr[-2000:]
        for x in res:
            seen.setdefault(tuple(x["case"]), []).append(x["digests"])
    for case, digests in seen.items():
        print(dtype, case, digests[0])
        assert all(dg == digests[0] for dg in digests), (case, digests)


def test_tensor_core_path_only_from_sm80(emu_lib):
    """bf16 at a tensor-core shape: on sm_90 the forward is two launches (mma kernel for the queries, SIMT for the
    keys); on an emulated sm_75 the launcher keeps to the SIMT kernel (one launch), and both are right."""
    for major, launches in ((9, 2), (7, 1)):
        r, res = run(emu_lib, "bf16", cases=[1], layouts=[1], cc_major=major)
        assert r.returncode == 0, r.stderr[-2000:]
        print(f"sm_{major}x: forward launches {res[0]['fwd_launches']}, q error {res[0]['q']:.2e}")
        assert res[0]["fwd_launches"] == launches and worst(res) <= TOL["bf16"]


def mutate(tmp_path, *pairs):
    """A copy of ops/csrc with each (old, new) text replaced once in the kernels, built for the emulator."""
    text = open(KERNELS).read()
    for old, new in zip(pairs[::2], pairs[1::2]):
        assert old in text, f"mutation anchor not found: {old!r}"
        text = text.replace(old, new, 1)
    mutated = str(tmp_path / "k")
    os.makedirs(mutated)
    with open(os.path.join(mutated, "vha_prologue_kernels.cuh"), "w") as f:
        f.write(text)
    for name in ("vha_prologue_math.h", "vha_prologue_launcher.cu"):
        shutil.copy(os.path.join(ROOT, "ops", "csrc", name), mutated)
    lib = str(tmp_path / "mutant.so")
    harness.build(lib, kernels_dir=mutated)
    return lib


def worst(results, names=OUTPUTS):
    return max(res.get(k, 0.0) for res in results for k in names)


def test_mutations_are_caught(emu_lib, tmp_path):
    """Each mutation of the kernels makes the emulated run fail: wrong numbers, a fault at a guard page, or the
    emulator's own divergence error. (The unmutated kernels pass the same runs: the test above.)"""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    tc_case = [1]  # (2, 37, 4, 2, 64, 64): tensor cores, a partial last tile

    # 1. two A-fragment registers swapped in the tensor-core forward
    lib = mutate(tmp_path / "m1", "a[1] = vb ? qb[ka] : 0u;\n      a[2] = va ? qa[ka + 4] : 0u;",
                 "a[2] = vb ? qb[ka] : 0u;\n      a[1] = va ? qa[ka + 4] : 0u;")
    r, res = run(lib, "bf16", cases=tc_case, layouts=[1])
    print("swapped fragment: q error", worst(res, ["q"]))
    assert r.returncode == 0 and worst(res, ["q"]) > 0.05

    # 2. the barrier after staging W^T in shared memory removed: threads read 0xCD bytes
    lib = mutate(tmp_path / "m2", "wt[(n0 + j) * ldw + k] = vals[j];\n  }\n  __syncthreads();",
                 "wt[(n0 + j) * ldw + k] = vals[j];\n  }")
    r, res = run(lib, "bf16", order=1, cases=tc_case, layouts=[1])
    print("removed barrier: q error", worst(res, ["q"]), r.returncode)
    assert r.returncode != 0 or not worst(res, ["q"]) <= TOL["bf16"]

    # 3. the last partial tile's second row block (rb = row0 + 8 + g) no longer masked: rows 296.. of 296 are read,
    #    and the first byte past q_phys's end is on the guard page
    lib = mutate(tmp_path / "m3", "qp + (vb ? rb : 0) * D.r", "qp + rb * D.r", "a[1] = vb ? qb[ka] : 0u;", "a[1] = qb[ka];")
    r, res = run(lib, "bf16", cases=tc_case, layouts=[1])
    print("unmasked tail: return code", r.returncode)
    assert r.returncode < 0  # killed by SIGSEGV at the guard page

    # 4. dW written transposed (k and c swapped) in the backward
    lib = mutate(tmp_path / "m4", "gW_part[((long(blockIdx.z) * D.Hkv + g) * D.r + k) * D.d + c] = acc[q];",
                 "gW_part[((long(blockIdx.z) * D.Hkv + g) * D.r + c % D.r) * D.d + k] = acc[q];")
    r, res = run(lib, "fp32", cases=[3], layouts=[1])
    print("wrong dW index: dpremix error", worst(res, ["dpremix"]), r.returncode)
    assert r.returncode != 0 or worst(res, ["dpremix"]) > 0.05

    # 5. a __syncthreads only warp 0 reaches: the emulator stops with its divergence error
    lib = mutate(tmp_path / "m5", "  __syncthreads();\n  for (long c = threadIdx.x; c < 2 * D.d; c += blockDim.x) {\n    C sum = 0;",
                 "  if (threadIdx.x < 32) __syncthreads();\n  for (long c = threadIdx.x; c < 2 * D.d; c += blockDim.x) {\n    C sum = 0;")
    r, res = run(lib, "fp32", cases=[4], layouts=[1])
    print("divergent barrier:", r.stderr.strip().splitlines()[-1:] if r.stderr else r.returncode)
    assert r.returncode != 0 and "cuda_emu:" in r.stderr and ("divergent" in r.stderr or "deadlock" in r.stderr)

    # 6. the shared-memory opt-in of the backward row kernel dropped: the 80 KB fp64 launch at d = 512 is refused
    lib = mutate(tmp_path / "m6", "if ((e = allow_smem(bwd_rows<T>, smem1)) != cudaSuccess || ", "if (")
    r, res = run(lib, "fp64", cases=[6], layouts=[1])
    print("no shared-memory opt-in:", res[0]["bwd_error"], res[0]["error_message"])
    assert res[0]["bwd_error"] == 9 and "opted-in limit" in res[0]["error_message"]


@pytest.mark.slow
def test_ptxas_reports_no_spills_for_sm90(tmp_path):
    """The compiled kernels, inspected without a GPU: ptxas -v (sm_90) reports no spill stores or loads and no stack
    frame for any kernel, and names the tensor-core forward for bf16 and fp16 at d = 64 / 128 / 256."""
    import re

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc")
    csrc = os.path.join(ROOT, "ops", "csrc")
    r = subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xptxas", "-v",
                        f"-I{csrc}", os.path.join(csrc, "vha_prologue_launcher.cu"), "-o", str(tmp_path / "k.cubin")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stdout + r.stderr
    entries = re.findall(r"Compiling entry function '(\w+)' for 'sm_90'\n(?:[^\n]*Function properties[^\n]*\n)?\s+(\d+) "
                         r"bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", said)
    print(f"{len(entries)} kernels; worst stack/spill: {max((int(a), int(b), int(c)) for _, a, b, c in entries)}")
    assert len(entries) >= 20
    for name, stack, st, ld in entries:
        assert (int(stack), int(st), int(ld)) == (0, 0, 0), name
    tc = [n for n, *_ in entries if "fwd_q_tc" in n]
    assert len(tc) == 6  # {bf16, fp16} x d in {64, 128, 256}
