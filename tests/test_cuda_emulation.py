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
# max |err| / max |ref| allowed against float64 in fp32 / fp64; in bf16 / fp16 the policy of the project: at most 2x
# the composed chain's own error in that dtype (tests/composed_lowp.py) plus half an output ulp
TOL = {"fp32": 4e-6, "fp64": 1e-13}
ULP = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}


def check_errors(res, dtype):
    """Print the case's errors (and the composed chain's, in 16-bit dtypes) and return the outputs out of bounds."""
    errs = {k: res[k] for k in OUTPUTS if k in res}
    comp = res.get("composed", {})
    print(dtype, res["case"], "heads_first" if res["heads_first"] else "bshd",
          " ".join(f"{k} {v:.2e}" + (f" (composed {comp[k]:.2e})" if k in comp else "") for k, v in errs.items()))
    assert set(errs) == set(OUTPUTS), res.get("error_message")
    if dtype in TOL:
        return {k: v for k, v in errs.items() if not v <= TOL[dtype]}
    return {k: v for k, v in errs.items() if not v <= 2 * comp[k] + ULP[dtype] / 2}
OUTPUTS = ("q", "k", "dq_phys", "dk", "dpremix", "dq_norm", "dk_norm")


@pytest.fixture(scope="module")
def emu_lib(tmp_path_factory):
    if shutil.which("g++") is None or harness.cuda_include() is None:
        pytest.skip("needs g++ and the CUDA headers (cuda_fp16.h); set CUDA_HOME")
    out = str(tmp_path_factory.mktemp("emu") / "libvha_emu.so")
    harness.build(out)
    return out


def run(lib, dtype, order=0, seed=0, cases=None, layouts=(1, 0), timeout=600, cc_major=9, schedule_seed=0, sms=4):
    cmd = [sys.executable, os.path.join(ROOT, "tests", "cuda_emu_harness.py"), "--lib", lib, "--dtype", dtype,
           "--order", str(order), "--seed", str(seed), "--layouts", *map(str, layouts), "--cc-major", str(cc_major),
           "--schedule-seed", str(schedule_seed), "--sms", str(sms)]
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
        assert res["fwd_error"] == 0 and res["bwd_error"] == 0, res["error_message"]
        assert not check_errors(res, dtype), res["case"]


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
    """bf16 at a tensor-core shape: on sm_90 forward and backward run on tensor cores (mma.sync counted by the
    emulator; the forward is one launch, queries then keys); on an emulated sm_75 the launchers keep to the SIMT
    kernels (no mma), and both are right."""
    for major in (9, 7):
        r, res = run(emu_lib, "bf16", cases=[1], layouts=[1], cc_major=major)
        assert r.returncode == 0, r.stderr[-2000:]
        x = res[0]
        print(f"sm_{major}x: forward launches {x['fwd_launches']}, mma.sync forward {x['fwd_mma']} backward "
              f"{x['bwd_mma']}")
        assert not check_errors(x, "bf16")
        assert x["fwd_launches"] == 1
        if major >= 8:
            assert x["fwd_mma"] > 0 and x["bwd_mma"] > x["fwd_mma"]  # recompute + the dq and dW GEMMs
        else:
            assert x["fwd_mma"] == 0 and x["bwd_mma"] == 0


def test_persistent_ctas_loop_over_tiles(emu_lib):
    """One emulated multiprocessor: the tensor-core kernels' persistent CTAs each take several 64-row tiles (the next
    q tile prefetched while this one is multiplied; with d = r = 256 a single q stage, restaged after each tile; with
    H_p = 3 tiles that split tokens), in
    bf16 and fp16, threads shuffled; results within the policy bound and, except the norm-weight gradients (summed per CTA, so in an order that
    depends on the grid), bitwise equal to the 4-SM run."""
    for dtype in ("bf16", "fp16"):
        _, ref = run(emu_lib, dtype, cases=[1, 7, 8], layouts=[1])
        r, res = run(emu_lib, dtype, order=2, cases=[1, 7, 8], layouts=[1], sms=1)
        assert r.returncode == 0, r.stderr[-2000:]
        for a, b in zip(res, ref):
            assert a["fwd_mma"] > 0 and a["bwd_mma"] > 0
            assert not check_errors(a, dtype), a["case"]
            same = ("q", "k", "dq_phys", "dk", "dpremix")  # the norm-weight sums are per block: grid-dependent order
            assert all(a["digests"][n] == b["digests"][n] for n in same), a["case"]


def mutate(tmp_path, *pairs):
    """A copy of ops/csrc with each (old, new) text replaced once in the kernels, built for the emulator."""
    mutated = harness.mutated_copy(str(tmp_path / "k"), list(zip(pairs[::2], pairs[1::2])))
    lib = str(tmp_path / "mutant.so")
    harness.build(lib, kernels_dir=mutated)
    return lib


def build_mutants(tmp_path, specs):
    """{name: (old, new, ...)} -> {name: library}, built two at a time (each build is ~6 s of g++)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(mutate, tmp_path / name, *pairs) for name, pairs in specs.items()}
        return {name: f.result() for name, f in futures.items()}


def worst(results, names=OUTPUTS):
    return max(res.get(k, 0.0) for res in results for k in names)


def test_mutations_are_caught(emu_lib, tmp_path):
    """Each mutation of the kernels makes the emulated run fail: wrong numbers, a fault at a guard page, or the
    emulator's own divergence / launch error. (The unmutated kernels pass the same runs: the tests above.) Barriers
    whose removal leaves the numbers right in every emulated order are the race detector's part
    (tests/test_cuda_emu_races.py)."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    tc_case = [1]  # (2, 37, 4, 2, 64, 64): tensor cores, a partial last tile
    libs = build_mutants(tmp_path, {  # (old text, new text) in the kernels
        "m1": ("const uint32_t b0[2] = {b[0], b[1]}", "const uint32_t b0[2] = {b[1], b[0]}"),
        "m2": ("from_c<O>(acc[i][j][e]);\n  __syncthreads();", "from_c<O>(acc[i][j][e]);"),
        "m3": ("row < rows ? qp + row * D.r + kc : qp, row < rows);", "qp + row * D.r + kc, true);"),
        "m4": ("gW_part[((long(blockIdx.z) * D.Hkv + g) * D.r + k) * D.d + c] = acc[q];",
               "gW_part[((long(blockIdx.z) * D.Hkv + g) * D.r + c % D.r) * D.d + k] = acc[q];"),
        "m5": ("  __syncthreads();\n  for (long c = threadIdx.x; c < 2 * D.d; c += blockDim.x) {\n    C sum = 0;",
               "  if (threadIdx.x < 32) __syncthreads();\n  for (long c = threadIdx.x; c < 2 * D.d; c += blockDim.x) {\n    C sum = 0;"),
        "m6": ("if ((e = allow_smem(bwd_rows<T>, smem1)) != cudaSuccess || ", "if ("),
        "m7": ("ldsm_x4<true>(b[j], bs", "ldsm_x4<false>(b[j], bs"),
    })

    # 1. the two B-fragment registers of an mma swapped in the tensor-core query kernel
    lib = libs["m1"]
    r, res = run(lib, "bf16", cases=tc_case, layouts=[1])
    print("swapped fragment: q error", worst(res, ["q"]))
    assert r.returncode == 0 and worst(res, ["q"]) > 0.05

    # 2. the barrier between the GEMM epilogue's shared-memory writes and its 16-byte reads removed
    lib = libs["m2"]
    r, res = run(lib, "bf16", order=1, cases=tc_case, layouts=[1])
    print("removed barrier: dq_phys / dpremix error", worst(res, ["dq_phys"]), worst(res, ["dpremix"]), r.returncode)
    assert r.returncode != 0 or worst(res, ["dq_phys", "dpremix"]) > 0.05

    # 3. the q tile's rows past the end (row 296.. of 296) no longer masked: the copy reads the guard page
    lib = libs["m3"]
    r, res = run(lib, "bf16", cases=tc_case, layouts=[1])
    print("unmasked tail: return code", r.returncode)
    assert r.returncode < 0  # killed by SIGSEGV at the guard page

    # 4. dW written transposed (k and c swapped) in the SIMT backward
    lib = libs["m4"]
    r, res = run(lib, "fp32", cases=[3], layouts=[1])
    print("wrong dW index: dpremix error", worst(res, ["dpremix"]), r.returncode)
    assert r.returncode != 0 or worst(res, ["dpremix"]) > 0.05

    # 5. a __syncthreads only warp 0 reaches: the emulator stops with its divergence error
    lib = libs["m5"]
    r, res = run(lib, "fp32", cases=[4], layouts=[1])
    print("divergent barrier:", r.stderr.strip().splitlines()[-1:] if r.stderr else r.returncode)
    assert r.returncode != 0 and "cuda_emu:" in r.stderr and ("divergent" in r.stderr or "deadlock" in r.stderr)

    # 6. the shared-memory opt-in of the backward row kernel dropped: the 80 KB fp64 launch at d = 512 is refused
    lib = libs["m6"]
    r, res = run(lib, "fp64", cases=[6], layouts=[1])
    print("no shared-memory opt-in:", res[0]["bwd_error"], res[0]["error_message"])
    assert res[0]["bwd_error"] == 9 and "opted-in limit" in res[0]["error_message"]

    # 7. ldmatrix without .trans for the dW GEMM's B operand (GU stored [row][column]): dW wrong
    lib = libs["m7"]
    r, res = run(lib, "bf16", cases=tc_case, layouts=[1])
    print("ldmatrix without .trans: dpremix error", worst(res, ["dpremix"]), "dq_phys error", worst(res, ["dq_phys"]))
    assert r.returncode == 0 and worst(res, ["dpremix"]) > 0.05 and worst(res, ["dq_phys"]) <= 0.01


@pytest.mark.slow
def test_compiled_kernels_no_spills_128bit_traffic_and_tensor_cores_in_the_backward(tmp_path):
    """The compiled kernels, inspected without a GPU (tools/sass_report.py: ptxas -v and nvdisasm, sm_90): no kernel has
    a stack frame or spills; the tensor-core kernels read global memory only in 128 bits (cp.async into shared memory,
    the key rows in 16-byte vectors) and write their outputs only in 128-bit stores (the backward's one 32-bit store is
    its per-block norm-weight partial); and the backward runs on tensor cores: HMMA in the recompute kernel and in the
    dq and dW GEMMs."""
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc")
    out = tmp_path / "sass.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "sass_report.py"), "--json", str(out)],
                       capture_output=True, text=True, timeout=900)
    print(r.stdout[-6000:])
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.load(open(out))
    k = rep["kernels"]
    assert len(k) >= 30
    for name, i in k.items():
        assert (i["stack"], i["spill"]) == (0, 0), name
    tc = [n for n in k if n.startswith("q_tc<")]
    gemm = [n for n in k if n.startswith("gemm_tc<")]
    assert len(tc) == 12 and len(gemm) == 4  # {bf16, fp16} x d {64, 128, 256} x {fwd, bwd}; {bf16, fp16} x {dq, dW}
    if not rep["nvdisasm"]:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm): SASS not inspected")
    for n in tc + gemm:
        i = k[n]
        assert i["ldgsts_128"] > 0 and i["ldgsts_narrow"] == 0, n  # staging: 16-byte cp.async only
        assert i["ldg"][:3] == [0, 0, 0], n  # the rest (keys, dL/dk) in 128-bit loads: nothing narrower
        assert i["stg"][0] == 0 and i["stg"][2] == 0 and i["stg"][3] > 0, n  # 128-bit stores, no 16-/64-bit
        assert i["hmma"] > 0 and i["ldsm"] > 0, n  # tensor cores fed by ldmatrix, forward and backward
    for n in gemm + [n for n in tc if n.endswith(",fwd>")]:
        assert k[n]["stg"][1] == 0, n  # every output store is 128-bit
    for n in gemm:
        assert k[n]["ldg"] == [0, 0, 0, 0], n  # operands reach the GEMM only through cp.async
