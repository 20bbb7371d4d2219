#!/usr/bin/env python
"""What the fused prologue's CUDA kernels compile to, without a GPU: per kernel registers, spills, shared memory
(ptxas -v), and from the SASS (nvdisasm) the tensor-core instructions, ldmatrix, cp.async and the widths of global loads
and stores; then roofline tables at the 1.7B shape, per pass and per kernel (bytes, FLOPs, predicted time on an H200).

    bash tools/env.sh python tools/sass_report.py            # sm_90
    bash tools/env.sh python tools/sass_report.py --arch sm_80 --json report.json

nvdisasm comes from the pinned PyPI package nvidia-cuda-nvdisasm (13.5.37, in requirements.txt), found in this
interpreter's environment, on PATH or at $NVDISASM; without it only the ptxas columns are printed.
Roofline inputs (stated, not measured here): H200 HBM3e 4.8 TB/s, dense bf16 tensor-core peak 989 TFLOP/s.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "ops", "csrc")
HBM_BYTES_PER_S, TC_FLOP_PER_S = 4.8e12, 989e12


def find_nvdisasm():
    env = os.environ.get("NVDISASM")
    if env and os.path.isfile(env):
        return env
    found = shutil.which("nvdisasm")
    if found:
        return found
    import sysconfig

    purelib = sysconfig.get_paths()["purelib"]  # a pip-installed nvidia-cuda-nvdisasm in this interpreter's environment
    hits = glob.glob(os.path.join(purelib, "nvidia", "cu*", "bin", "nvdisasm"))
    return hits[0] if hits else None


def short(mangled: str) -> str:
    """e.g. q_tc<bf16,128,bwd>, gemm_tc<fp16,dW>, bwd_rows<fp32>."""
    m = re.search(r"gpu\d+(\w+?)I", mangled)
    name = m.group(1) if m else mangled
    tags = []
    for tag, dt in (("13__nv_bfloat16", "bf16"), ("6__half", "fp16"), ("If", "fp32"), ("Id", "fp64")):
        if tag in mangled:
            tags.append(dt)
            break
    dh = re.search(r"Li(\d+)E", mangled)
    if dh:
        tags.append(dh.group(1))
    if name == "q_tc":
        tags.append("bwd" if "Lb1E" in mangled else "fwd")
    if name == "gemm_tc":  # <T, A_K, B_K, O>: dq has k-contiguous operands and a T output, dW neither and fp32 partials
        tags.append("dq" if "Lb1ELb1E" in mangled else "dW")
    return name + "<" + ",".join(tags) + ">"


def sass_counts(s: str) -> dict:
    """Instruction counts of one kernel's SASS: tensor-core MMAs, global loads / stores by width, cp.async
    (LDGSTS: global -> shared, never through registers) by width, and ldmatrix."""
    def widths(op):
        return [len(re.findall(rf"\b{op}\.E(?:\.U16|\.S16)\b", s)),
                len(re.findall(rf"\b{op}\.E(?:\.CONSTANT)?\s", s)),
                len(re.findall(rf"\b{op}\.E\.64\b", s)),
                len(re.findall(rf"\b{op}\.E\.128\b", s))]
    return {"hmma": len(re.findall(r"\bHMMA\b", s)), "ldg": widths("LDG"), "stg": widths("STG"),
            "ldgsts_128": len(re.findall(r"\bLDGSTS\.E(?:\.BYPASS)?\.128\b", s)),
            "ldgsts_narrow": len(re.findall(r"\bLDGSTS\.E(?:\.BYPASS)?(?:\.64)?\s", s)),
            "ldsm": len(re.findall(r"\bLDSM\b", s))}


HP, HKV, D, R, E = 8, 2, 128, 128, 2  # the 1.7B shape, bf16


def pass_bytes(n: int):
    """Forward bytes, backward bytes (each input read once, each output written once) and the Premix FLOPs at n tokens."""
    fwd_b = E * n * (HP * R + HKV * D + 2 * D + HP * HKV * D + HKV * D)  # q_phys, k, cos, sin in; q, k out
    bwd_b = fwd_b + E * n * (HP * HKV * D + HKV * D + HP * R + HKV * D)  # + dq, dk in; dq_phys, dk out
    return fwd_b, bwd_b, 2.0 * n * HP * R * HKV * D


def kernel_traffic(n: int):
    """(kernel, bytes, FLOPs) of each launch of the tensor-core forward and backward at n tokens (ops/csrc: q_tc reads
    the tables once per token and KV group; the backward's dL/du (T) and fp32 dW partials go through the workspace)."""
    rows, flop = n * HP, 2.0 * n * HP * R * HKV * D
    w = HKV * R * D * E
    tables = HKV * n * 2 * D * E
    q, k, qo, ko, gu = rows * R * E, n * HKV * D * E, rows * HKV * D * E, n * HKV * D * E, rows * HKV * D * E
    per = max(1024, -(-(-(-rows // 256)) // 32) * 32)  # ops/csrc dw_rows_per_chunk
    chunks = -(-rows // per)
    parts = chunks * HKV * R * D * 4
    return [("q_tc fwd", q + w + k + tables + qo + ko, flop),
            ("q_tc bwd", q + w + k + tables + qo + ko + gu + k, flop),  # reads dL/dq, dL/dk; writes dL/du, dk
            ("gemm_tc dq", gu + w + q, flop),
            ("gemm_tc dW", q + gu + parts, flop),
            ("sum_parts dW", parts + w, 0.0)]


def roof_row(n, name, b, f):
    tb, tf = b / HBM_BYTES_PER_S * 1e6, f / TC_FLOP_PER_S * 1e6
    return (f"| {n} | {name} | {b / 1e6:.1f} | {f / 1e9:.2f} | {tb:.1f} | {tf:.1f} | "
            f"{'bandwidth' if tb >= tf else 'compute'} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--json", metavar="PATH", help="also write the per-kernel table as JSON (tests read it)")
    args = ap.parse_args(argv)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("error: nvcc not found on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        r = subprocess.run([nvcc, "-cubin", f"-arch={args.arch}", "-O3", "-std=c++17", "--expt-relaxed-constexpr",
                            "-Xptxas", "-v", f"-I{CSRC}", os.path.join(CSRC, "cuda", "c_api.cu"), "-o", cubin],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print("error: nvcc failed: " + r.stderr.strip().splitlines()[-1], file=sys.stderr)
            return 2
        info = {}
        for m in re.finditer(r"Compiling entry function '(\w+)'.*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
                             r"(\d+) bytes spill loads\nptxas info\s+: Used (\d+) registers[^\n]*?(?:, (\d+) bytes smem)?\n",
                             r.stdout + r.stderr, re.S):
            info[m.group(1)] = dict(stack=int(m.group(2)), spill=int(m.group(3)) + int(m.group(4)), regs=int(m.group(5)),
                                    smem=int(m.group(6) or 0))
        nvd = find_nvdisasm()
        sass = {}
        if nvd:
            text = subprocess.run([nvd, "-c", cubin], capture_output=True, text=True).stdout
            for part in re.split(r"\n(?=\s*\.text\.)", text):
                m = re.match(r"\s*\.text\.(\w+):", part)
                if m:
                    sass[m.group(1)] = part
    print(f"# {len(info)} kernels for {args.arch}; nvdisasm: {nvd or 'not found (ptxas columns only)'}")
    head = "| kernel | regs | spill B | static smem B |"
    if sass:
        head += (" HMMA | LDSM | cp.async 128-bit / narrower | global loads 16/32/64/128-bit |"
                 " global stores 16/32/64/128-bit |")
    print(head)
    print("| --- " * (head.count("|") - 1) + "|")
    report = {}
    for name in sorted(info, key=short):
        i = dict(info[name])
        row = f"| {short(name)} | {i['regs']} | {i['spill']} | {i['smem']} |"
        if sass:
            c = sass_counts(sass.get(name, ""))
            i.update(c)
            row += (f" {c['hmma']} | {c['ldsm']} | {c['ldgsts_128']} / {c['ldgsts_narrow']} | "
                    f"{'/'.join(map(str, c['ldg']))} | {'/'.join(map(str, c['stg']))} |")
        report[short(name)] = i
        print(row)
    if args.json:  # written to a temporary name beside it, then renamed: never half-written
        import json

        try:
            tmp = args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"arch": args.arch, "nvdisasm": bool(sass), "kernels": report}, f, indent=1)
            os.replace(tmp, args.json)
        except OSError as e:
            print(f"error: cannot write --json {args.json}: {e.strerror}", file=sys.stderr)
            return 2

    # Roofline at the 1.7B shape (H_p 8, H_kv 2, r = d = 128), bf16: what must move and what must be computed.
    print("\n# roofline, 1.7B shape, bf16: bytes that must move (read inputs + write outputs once), Premix FLOPs")
    print("| tokens | pass | MB moved | GFLOP | at 4.8 TB/s µs | at 989 TFLOP/s µs | bound |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for n in (1024, 4096, 16384):
        fwd_b, bwd_b, fl = pass_bytes(n)
        for name, b, f in (("fwd", fwd_b, fl), ("fwd+bwd", fwd_b + bwd_b, 3 * fl)):
            print(roof_row(n, name, b, f))
    print("\n# per kernel of the tensor-core path (bf16, 1.7B shape): each kernel's global reads + writes counted once "
          "(repeats served by L2 not counted), workspace round trips included")
    print("| tokens | kernel | MB moved | GFLOP | at 4.8 TB/s µs | at 989 TFLOP/s µs | bound |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for n in (1024, 4096, 16384):
        total_b = total_f = 0.0
        for name, b, f in kernel_traffic(n):
            total_b, total_f = total_b + b, total_f + f
            print(roof_row(n, name, b, f))
        print(roof_row(n, "**all, fwd+bwd**", total_b, total_f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
