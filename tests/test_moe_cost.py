"""The calculators (paddle_vha/accounting.py, tools/kv_calc.py, tools/flops.py) on the paper's MoE model: the 30B-A3B
(48 virtual heads over 2 KV heads, Postmix rank 12, against its GQA-4 baseline). The seed gives the attention only;
the rest of configs/paper-moe/ is Qwen3-30B-A3B's published shape (48 layers, hidden 2048, head_dim 128, 128 experts,
top-8, expert width 768), whose totals these tests check against the name: ~30B weights, ~3B active."""
import json
import os
import subprocess
import sys

from paddle_vha.accounting import active_weights, forward_flops_per_token, kv_bytes_per_token, model_weights, resolve_models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VHA = os.path.join(ROOT, "configs", "paper-moe", "qwen3-30b-a3b-vha.json")
GQA4 = os.path.join(ROOT, "configs", "paper-moe", "qwen3-30b-a3b-gqa4.json")


def test_30b_a3b_against_the_papers_statements():
    trained, folded = resolve_models(VHA)
    gqa4, = resolve_models(GQA4)
    kv = {a.label: kv_bytes_per_token(a, all_layers=True) for a in (trained, folded, gqa4)}
    w, act = model_weights(gqa4)["total"], active_weights(gqa4)["total"]
    print(f"KV bytes/token bf16: {kv}; GQA-4 weights {w / 1e9:.2f} B, active {act / 1e9:.2f} B; VHA folded "
          f"{model_weights(folded)['total'] / 1e9:.2f} B / {active_weights(folded)['total'] / 1e9:.2f} B; forward "
          f"GFLOPs/token VHA {forward_flops_per_token(trained)['total'] / 1e9:.2f}, folded "
          f"{forward_flops_per_token(folded)['total'] / 1e9:.2f}, GQA-4 {forward_flops_per_token(gqa4)['total'] / 1e9:.2f}")
    assert trained.num_heads // trained.num_kv_heads == 24  # "the largest group in the paper is 24"
    assert trained.vha_postmix_rank == 12  # "12 at 30B-A3B"
    assert kv[trained.label] == kv[folded.label] == 48 * 2 * 2 * 128 * 2  # 48 KB per token in bf16
    assert kv[gqa4.label] == 2 * kv[trained.label]  # half of GQA-4's cache ("a quarter to half of GQA's")
    assert 30.0e9 < w < 31.0e9 and 3.0e9 < act < 3.6e9  # "30B-A3B"
    # the MLP FLOPs are the active experts': 8 of 128 experts plus the router, per MoE layer
    mlp = forward_flops_per_token(gqa4)["mlp"]
    assert mlp == 48 * (2 * 3 * 2048 * 768 * 8 + 2 * 2048 * 128)


def test_tools_print_moe_rows():
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "tools/flops.py", VHA, "--json"], capture_output=True, text=True, cwd=ROOT,
                       env=env)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    rows = rows if isinstance(rows, list) else rows[next(iter(rows))]
    print(rows[0]["variant"], rows[0]["model_weights"], rows[0]["active_weights"])
    assert rows[0]["active_weights"] < rows[0]["model_weights"] / 8
    r = subprocess.run([sys.executable, "tools/kv_calc.py", VHA, GQA4], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "48 KB" in r.stdout and "96 KB" in r.stdout, r.stdout[-2000:]
