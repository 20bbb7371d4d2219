"""tools/convert_to_vha.py --refine-steps and paddle_vha.transform.refine: layer-wise refinement after the fit.

A layer run alone (the captured mask and RoPE tables) is the layer inside the model: refining a model against itself
with no steps reproduces the model's own final hidden states and reports zero error. Refinement lowers every
layer's held-out output error and the logit KL of a merged conversion; where the conversion is exact already (KV heads
kept with --premix off, a folded VHA converted back) it writes the same bytes as without it. One run at Qwen3-0.6B
widths (2 layers) shows it streams."""
import os
import re

import numpy as np
import pytest

from test_convert import SHAPE, kl_table, run_tool, stock  # noqa: F401  (fixture)

LAYER_LINE = re.compile(r"layer +(\d+): held-out rel MSE ([0-9.e+-]+) -> ([0-9.e+-]+) \(calibration ([0-9.e+-]+) -> "
                        r"([0-9.e+-]+); (exact already|\d+ steps)")


def weights_digest(path):
    """sha256 of a folder's files but its hidden marker (.paddle_vha_output names the folder and time)."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(n for n in os.listdir(path) if not n.startswith(".")):
        h.update(f.encode() + open(os.path.join(path, f), "rb").read())
    return h.hexdigest()


def layer_errors(stdout):
    """[(layer, before, after, fit before, fit after, steps text)] the tool printed."""
    return [(int(a), float(b), float(c), float(d), float(e), f) for a, b, c, d, e, f in LAYER_LINE.findall(stdout)]


def test_a_layer_run_alone_is_the_layer_inside_the_model(stock):  # noqa: F811
    """refine_layers of the source against itself, 0 steps: every error 0 and the student stream after the last
    layer, through the final norm, equals layerwise.final_hidden of the whole model (same float32 math)."""
    import paddle
    from paddleformers.transformers import Qwen3ForCausalLM

    from paddle_vha.transform import layerwise as lw
    from paddle_vha.transform.refine import RefineSettings, refine_layers

    w = lw.folder_weights(stock, Qwen3ForCausalLM)
    ids = np.random.default_rng(0).integers(0, SHAPE["vocab_size"], size=(6, 24))
    _, reports = refine_layers(w, w, ids[:4], ids[4:], RefineSettings(0), lambda n: None, "/nonexistent", log=None)
    assert [r.before for r in reports] == [0.0] * SHAPE["num_hidden_layers"], reports
    assert all(r.steps == 0 for r in reports)
    # the stream itself, against the model's own forward
    from paddle_vha.transform import refine as rf

    t_model = lw._lazy_model(w)
    call = rf._LayerCall(t_model)
    h = lw._gather_rows(w, ids[:4])
    for i, layer in enumerate(t_model.model.layers):
        rf._load(layer, w, i)
        h = rf._apply(call, layer, h, 2)
        rf._free(layer)
    with paddle.no_grad():
        normed = t_model.model.norm(paddle.to_tensor(h)).numpy()
    want = lw.final_hidden(w, [ids[:4]])
    rel = np.abs(normed - want).max() / np.abs(want).max()
    print(f"layers run alone vs the model's forward: max rel diff {rel:.3e}")
    assert rel < 1e-6


def test_refinement_lowers_every_layers_error_and_the_kl(tmp_path, stock):  # noqa: F811
    """GQA-4 -> VHA with 2 KV heads (svd): every layer's held-out error drops, the calibration error never rises
    (the best point is kept), and the written model's KL is below the closed-form fit's."""
    out = str(tmp_path / "refined")
    r = run_tool(stock, out, "--kv-heads", "2", "--method", "svd", "--refine-steps", "60", "--refine-tokens", "1024",
                 "--no-compare", "--no-progress", "--eval-len", "32", "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    rows = layer_errors(r.stdout)
    assert [row[0] for row in rows] == list(range(SHAPE["num_hidden_layers"])), r.stdout
    for layer, before, after, fit_before, fit_after, steps in rows:
        print(f"layer {layer}: held-out {before:.4e} -> {after:.4e}, calibration {fit_before:.4e} -> {fit_after:.4e}")
        assert steps == "60 steps" and after < 0.95 * before and fit_after <= fit_before
    fit_kl = float(re.search(r"svd \(fit\)\s+KL ([0-9.e+-]+)", r.stdout).group(1))
    kl = kl_table(r.stdout)["svd"]
    print(f"KL closed-form fit {fit_kl:.4e} -> refined {kl:.4e}")
    assert kl < 0.7 * fit_kl


@pytest.mark.parametrize("case", ["kv-kept", "fold"])
def test_refinement_is_a_no_op_when_the_conversion_is_exact(tmp_path, stock, case):  # noqa: F811
    """KV heads kept with --premix off, or a folded VHA converted back: every layer's error is ~0, nothing is
    trained, and the written folder is byte-identical to the one written without --refine-steps."""
    src = stock
    args = ["--kv-heads", "4", "--premix", "off"]
    if case == "fold":
        import paddle

        from _utils import tiny_config
        from paddle_vha import Qwen3VHAForCausalLM
        from paddle_vha.transform.fold import fold_checkpoint, plan_fold

        paddle.seed(3)
        cfg = tiny_config(num_attention_heads=6, num_key_value_heads=2, head_dim=16, vha_q_head_dim=8,
                          vha_postmix_rank=2, vocab_size=256, vha_premix_init_alpha=3.0, vha_postmix_u_init_std=0.5,
                          vha_postmix_v_init_std=0.5, initializer_range=0.2)
        vha_dir, src = str(tmp_path / "vha"), str(tmp_path / "folded")
        Qwen3VHAForCausalLM(cfg).save_pretrained(vha_dir)
        fold_checkpoint(plan_fold(vha_dir, src), progress=False)
        args = ["--kv-heads", "2", "--q-head-dim", "8", "--postmix-rank", "2"]
    common = [*args, "--no-compare", "--no-progress", "--eval-len", "32", "--eval-batches", "1"]
    plain, refined = str(tmp_path / "plain"), str(tmp_path / "refined")
    assert run_tool(src, plain, *common).returncode == 0
    r = run_tool(src, refined, *common, "--refine-steps", "40", "--refine-tokens", "512")
    assert r.returncode == 0, r.stderr
    rows = layer_errors(r.stdout)
    print(rows)
    assert rows and all(row[5] == "exact already" and row[3] < 1e-10 for row in rows)
    assert weights_digest(plain) == weights_digest(refined)
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".refine-")]  # the spilled layers are gone


@pytest.mark.slow
def test_refinement_at_qwen3_06b_widths(tmp_path):
    """A 2-layer Qwen3-0.6B-shaped checkpoint (hidden 1024, 16 heads over 8 KV heads, head_dim 128, vocabulary
    151,936, bf16, random weights) -> 2 KV heads, refined for a few steps: both layers' calibration errors drop by
    more than 10% (the held-out ones are printed: a few steps on 256 tokens of a random model generalise little) and
    the folder is written (bf16, a valid Qwen3-VHA)."""
    from _utils import validate_vha_checkpoint
    from tools.fixtures.qwen3_shaped import make_checkpoint

    src, out = str(tmp_path / "q06"), str(tmp_path / "refined")
    make_checkpoint(src, "0.6b", layers=2)
    r = run_tool(src, out, "--kv-heads", "2", "--refine-steps", "5", "--refine-tokens", "256", "--refine-lr",
                 "3e-4", "--no-compare", "--no-progress", "--eval-len", "64", "--eval-batches", "0")
    assert r.returncode == 0, r.stderr
    rows = layer_errors(r.stdout)
    print(rows)
    assert len(rows) == 2 and all(fit_after < 0.9 * fit_before for _, _, _, fit_before, fit_after, _ in rows)
    validate_vha_checkpoint(out)


def test_refinement_is_bounded_and_its_work_said_before_it_starts(tmp_path, stock, capsys):  # noqa: F811
    """--refine-steps 10**9 ran until killed, with no word of the work ahead: now refused over MAX_STEPS in one line,
    and every run with --refine-steps prints the work (FLOPs, a time at this machine's measured GEMM rate) after the
    plan, --dry-run included. The FLOPs are linear in the steps: each step is one batch's forward and backward."""
    from paddle_vha.cli.convert_to_vha import main

    with pytest.raises(SystemExit) as e:
        main([stock, str(tmp_path / "x"), "--kv-heads", "2", "--refine-steps", str(10**9), "--dry-run"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    print(last)
    assert e.value.code == 2 and f"--refine-steps {10**9}: at most 100,000 per layer" in last
    flops = {}
    for steps in (100, 200, 300):
        r = run_tool(stock, str(tmp_path / "x"), "--kv-heads", "2", "--refine-steps", str(steps), "--dry-run",
                     "--eval-len", "32")
        assert r.returncode == 0, r.stderr
        out = r.stdout
        line = next(ln for ln in out.splitlines() if ln.startswith("refinement:"))
        print(line)
        assert out.index(line) < out.index("dry run: nothing written")
        assert f"{steps:,} steps x {SHAPE['num_hidden_layers']} layers" in line and "GFLOP/s measured now" in line
        flops[steps] = float(re.search(r"about ([0-9.e+-]+) TFLOP", line).group(1))
    assert flops[100] < flops[200] < flops[300]
    assert abs((flops[300] - flops[200]) - (flops[200] - flops[100])) <= 0.02 * (flops[300] - flops[200])
    assert not (tmp_path / "x").exists()


def test_refinement_says_the_tokens_it_fits_on(tmp_path, stock):  # noqa: F811
    """--refine-tokens 1 fits on whole batches of 4 windows of --eval-len tokens: the line says 128 (4 x 32), not
    "1 calibration tokens"."""
    r = run_tool(stock, str(tmp_path / "out"), "--kv-heads", "2", "--refine-steps", "1", "--refine-tokens", "1",
                 "--no-compare", "--no-progress", "--eval-len", "32", "--eval-batches", "0")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("refinement: each layer"))
    print(line)
    assert "on 128 calibration tokens (4 windows of 32; 128 held out)" in line
