"""The GPU check's bytes / FLOPs model and report: derived columns (speed-ups, GB/s, % of copy bandwidth, TFLOP/s),
the short table, the target lines, and the made-up-timings self-test of them (no GPU, no torch).
"""
from __future__ import annotations

import json


SHAPE = dict(Hp=8, Hkv=2, r=128, d=128)  # the 1.7B shape
TOKENS = [1, 16, 256, 1024, 4096, 8192, 16384]
MEASURES = ["fused_fwd", "composed_fwd", "fused_bwd", "fused_fb", "composed_fb"]  # fb: forward + backward


def model(tokens: int, Hp: int, Hkv: int, r: int, d: int, elem: int = 2, B: int = 1, Bc: int = 1) -> dict:
    """Bytes each pass must move at least once, and the backward's GEMM FLOPs (elem: bytes per element).

    inputs  = q_phys B*S*H_p*r + k B*S*H_kv*d + W H_kv*r*d + wq, wk 2*d + cos, sin 2*Bc*S*d
    outputs = q_out B*S*H_p*H_kv*d + k_out B*S*H_kv*d
    forward bytes  = elem * (inputs + outputs)                       (read each input once, write each output once)
    backward bytes = elem * (inputs + outputs + inputs - 2*Bc*S*d)   (inputs and the output gradients, sized like
                     the outputs, read once; gradients of q_phys, k, W, wq, wk written once; the fp32 workspace's
                     traffic is not counted)
    fwd+bwd bytes  = forward bytes + backward bytes
    backward GEMM FLOPs = 3 * 2*rows*r*d*H_kv, rows = B*S*H_p: recompute u = q W, dq = gu W^T, dW = q^T gu.
    """
    S = tokens
    inputs = B * S * Hp * r + B * S * Hkv * d + Hkv * r * d + 2 * d + 2 * Bc * S * d
    outputs = B * S * Hp * Hkv * d + B * S * Hkv * d
    grads = inputs - 2 * Bc * S * d
    fwd, bwd = elem * (inputs + outputs), elem * (inputs + outputs + grads)
    return dict(fwd_bytes=fwd, bwd_bytes=bwd, fb_bytes=fwd + bwd, bwd_gemm_flops=3 * 2 * B * S * Hp * r * d * Hkv)


def derive(row: dict, copy_gbps):
    """Adds speed-ups, GB/s, % of copy bandwidth and TFLOP/s to a row of *_us timings (None where unmeasured)."""
    m = model(row["tokens"], **SHAPE)
    row.update(m)

    def us(name):
        return row.get(name + "_us")

    def div(a, b):
        return a / b if a is not None and b else None

    row["fwd_speedup"] = div(us("composed_fwd"), us("fused_fwd"))
    row["fb_speedup"] = div(us("composed_fb"), us("fused_fb"))
    row["fwd_gbps"] = div(m["fwd_bytes"] / 1e3, us("fused_fwd"))  # bytes / us / 1e3 = GB/s
    row["fb_gbps"] = div(m["fb_bytes"] / 1e3, us("fused_fb"))
    row["copy_gbps"] = copy_gbps
    row["fwd_pct_copy"] = div(None if row["fwd_gbps"] is None else 100 * row["fwd_gbps"], copy_gbps)
    row["bwd_tflops"] = div(m["bwd_gemm_flops"] / 1e6, us("fused_bwd"))  # flops / us / 1e6 = TFLOP/s
    return row


def _f(x, fmt):
    return "n/a" if x is None else format(x, fmt)


def _x(x):
    return "n/a" if x is None else f"{x:.2f}x"


def table_lines(rows, copy_gbps, copy_method) -> list:
    out = [f"1.7B shape (B 1, H_p 8, H_kv 2, r = d = 128), bf16; per-call GPU time; device-to-device copy "
           f"bandwidth {_f(copy_gbps, '.0f')} GB/s (read + write, {copy_method}); GB/s from model()'s bytes; "
           f"bwd TFLOP/s = 3 GEMMs of 2*rows*r*d*H_kv FLOPs over the fused backward's own time", "",
           "| tokens | fused fwd us | composed fwd us | fwd speed-up | fused fwd GB/s (% of copy) | fused fwd+bwd us "
           "| composed fwd+bwd us | fwd+bwd speed-up | bwd TFLOP/s | timing |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        methods = r.get("method", {})
        other = [n for n in MEASURES if methods.get(n, "graph") != "graph"]
        how = "graph" if not other else "; ".join(f"{n} {methods[n]}" for n in other)
        pct = "" if r.get("fwd_pct_copy") is None else f" ({r['fwd_pct_copy']:.0f}%)"
        out.append(f"| {r['tokens']} | {_f(r.get('fused_fwd_us'), '.1f')} | {_f(r.get('composed_fwd_us'), '.1f')} | "
                   f"{_x(r.get('fwd_speedup'))} | {_f(r.get('fwd_gbps'), '.0f')}{pct} | "
                   f"{_f(r.get('fused_fb_us'), '.1f')} | {_f(r.get('composed_fb_us'), '.1f')} | "
                   f"{_x(r.get('fb_speedup'))} | {_f(r.get('bwd_tflops'), '.1f')} | {how} |")
    return out


def target_lines(rows) -> list:
    big = [r for r in rows if r["tokens"] >= 4096]
    if big:
        vals = [r.get("fwd_pct_copy") for r in big]
        met = all(v is not None and v >= 75 for v in vals)
        detail = ", ".join(f"{r['tokens']}: {_f(v, '.0f')}%" for r, v in zip(big, vals))
        t1 = f"target forward >= 75% of copy bandwidth at >= 4K tokens: {'MET' if met else 'NOT MET'} ({detail})"
    else:
        t1 = "target forward >= 75% of copy bandwidth at >= 4K tokens: NOT MEASURED (no token count >= 4096 timed)"
    vals = [r.get("fb_speedup") for r in rows]
    met = bool(rows) and all(v is not None and v >= 2 for v in vals)
    detail = ", ".join(f"{r['tokens']}: {_x(v)}" for r, v in zip(rows, vals)) or "nothing timed"
    t2 = (f"target forward+backward >= 2x faster than the composed chain (every token count timed): "
          f"{'MET' if met else 'NOT MET'} ({detail})")
    return [t1, t2]


def selftest_table(tokens):
    """The bytes model, derived columns, table and target lines on made-up timings (no GPU)."""
    copy_gbps = 4000.0
    rows = []
    for i, N in enumerate(tokens):
        m = model(N, **SHAPE)
        row = dict(tokens=N, method={n: "graph" for n in MEASURES}, why={})
        row["fused_fwd_us"] = max(3.0, m["fwd_bytes"] / 1e3 / 3200)
        row["composed_fwd_us"] = 4 * row["fused_fwd_us"] + 20
        row["fused_bwd_us"] = max(8.0, m["bwd_bytes"] / 1e3 / 2000)
        row["fused_fb_us"] = row["fused_fwd_us"] + row["fused_bwd_us"]
        row["composed_fb_us"] = 2.5 * row["fused_fb_us"] + 60
        if i == 1:
            row["method"]["composed_fb"] = "loop"
            row["why"]["composed_fb"] = "capture failed: made up"
        if i == 2:
            row["fused_bwd_us"] = row["fused_fb_us"] = None
            row["method"]["fused_bwd"] = row["method"]["fused_fb"] = "failed"
        rows.append(derive(row, copy_gbps))
    m = model(1, **SHAPE)
    # 1 token: inputs 8*128 + 2*128 + 2*128*128 + 2*128 + 2*128, outputs 16*128 + 2*128 (bf16: 2 bytes each)
    assert m["fwd_bytes"] == 2 * ((1024 + 256 + 32768 + 256 + 256) + (2048 + 256)), m
    assert m["bwd_gemm_flops"] == 3 * 2 * 8 * 128 * 128 * 2, m
    json.dumps(rows)
    for line in table_lines(rows, copy_gbps, "graph") + [""] + target_lines(rows):
        print(line)
    return 0
