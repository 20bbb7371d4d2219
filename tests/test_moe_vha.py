"""Qwen3-MoE-VHA checkpoints (paddle_vha/moe/, paddle_vha/moe_vha/): the tensor contract and its validation from
headers, and the fold into stock Qwen3-MoE against an independent float64 oracle (tests/moe_oracle.py) and Hugging
Face transformers' Qwen3MoeForCausalLM in the side environment. Checkpoints are small numpy ones
(tests/moe_checkpoints.py: 6 experts, top-2, layer 1 dense among MoE layers 0 and 2)."""
import glob
import json
import os
import subprocess
import textwrap

import numpy as np
import pytest
from safetensors.numpy import load_file

import moe_oracle
from moe_checkpoints import MOE_VHA, make_moe_vha, moe_vha_tensors, write_checkpoint
from paddle_vha.checkpoint.contract import CheckpointError
from paddle_vha.families import family, family_of
from paddle_vha.transform.fold import FoldError, fold_checkpoint, plan_fold, verify_fold

IDS = np.random.default_rng(1).integers(0, MOE_VHA["vocab_size"], (2, 13))  # a prime-length batch


def read_folder(folder):
    out = {}
    for f in glob.glob(os.path.join(folder, "*.safetensors")):
        out.update({k: v.astype(np.float64) for k, v in load_file(f).items()})
    return out, json.load(open(os.path.join(folder, "config.json")))


def test_contract_names_experts_router_and_dense_layer(tmp_path):
    c, t = make_moe_vha(tmp_path / "in")
    fam = family_of(str(tmp_path / "in"))
    cfg = fam.validate(str(tmp_path / "in"))
    shapes = fam.tensor_shapes(cfg)
    print(f"{fam.label}: {len(shapes)} tensors, MoE layers {cfg.moe_layer_indices}")
    assert cfg.moe_layer_indices == [0, 2] and set(shapes) == set(t)
    assert shapes["model.layers.0.mlp.gate.weight"] == (6, 32)  # router [E, h]
    assert shapes["model.layers.2.mlp.experts.5.down_proj.weight"] == (32, 12)
    assert shapes["model.layers.1.mlp.gate_proj.weight"] == (40, 32)  # the dense layer's MLP
    assert not any(n.startswith("model.layers.1.mlp.experts") for n in shapes)
    stock = family("qwen3_moe").tensor_shapes(cfg)
    assert stock["model.layers.0.self_attn.q_proj.weight"] == (48, 32) and not any("vha_" in n for n in stock)


@pytest.mark.parametrize("change, match", [
    (dict(drop="model.layers.2.mlp.experts.3.up_proj.weight"), "missing.*experts.3.up_proj"),
    (dict(shape=("model.layers.0.mlp.gate.weight", (32, 6))), "mlp.gate.weight"),
    (dict(extra="model.layers.1.mlp.experts.0.gate_proj.weight"), "unexpected.*layers.1.mlp.experts"),
    (dict(config=dict(num_experts_per_tok=7)), "num_experts_per_tok=7 exceeds num_experts=6"),
    (dict(config=dict(num_experts=6.0)), "num_experts must be a positive int"),
    (dict(config=dict(mlp_only_layers=[5])), "mlp_only_layers names layer 5"),
    (dict(config=dict(norm_topk_prob="yes")), "norm_topk_prob must be a bool"),
])
def test_malformed_checkpoint_refused_in_one_line(tmp_path, change, match):
    c, t = dict(MOE_VHA, **change.get("config", {})), moe_vha_tensors(MOE_VHA)
    if "drop" in change:
        del t[change["drop"]]
    if "shape" in change:
        t[change["shape"][0]] = np.zeros(change["shape"][1])
    if "extra" in change:
        t[change["extra"]] = np.zeros((12, 32))
    folder = write_checkpoint(tmp_path / "bad", c, t)
    with pytest.raises(CheckpointError) as e:
        family_of(folder).validate(folder)
    print(e.value)
    assert "\n" not in str(e.value)
    import re
    assert re.search(match, str(e.value)), str(e.value)


def test_fold_matches_the_unfolded_oracle(tmp_path):
    c, t = make_moe_vha(tmp_path / "in")
    ref = moe_oracle.logits(IDS, t, c)
    plan = plan_fold(str(tmp_path / "in"), str(tmp_path / "out"), dtype="float64")
    fold_checkpoint(plan, progress=False)
    folded, out_cfg = read_folder(tmp_path / "out")
    assert out_cfg["model_type"] == "qwen3_moe" and out_cfg["architectures"] == ["Qwen3MoeForCausalLM"]
    assert not any(k.startswith("vha_") for k in out_cfg)
    family("qwen3_moe").validate(str(tmp_path / "out"))
    for n in ("model.layers.0.mlp.gate.weight", "model.layers.2.mlp.experts.4.down_proj.weight"):
        assert np.array_equal(folded[n], t[n]), n  # router and experts copied bit for bit
    got = moe_oracle.logits(IDS, folded, out_cfg)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    stats = verify_fold(str(tmp_path / "in"), str(tmp_path / "out"), 2, 11)
    print(f"oracle: unfolded vs folded max rel {err:.2e}; package verify (numpy) {stats}")
    assert err <= 1e-10 and stats["max_rel"] <= 1e-10


@pytest.mark.parametrize("over, match", [
    (dict(vha_shared_kv=True), "vha_shared_kv=true.*stock Qwen3-MoE has no form"),
    (dict(sliding_window=4, use_sliding_window=True, layer_types=["sliding_attention", "full_attention",
                                                                  "full_attention"]), "sliding-window layers \\[0\\]"),
    (dict(moe_shared_expert_intermediate_size=16), "a shared expert"),
    (dict(vha_gated_attention=True), "Postmix cannot cross the sigmoid gate"),
])
def test_fold_refuses_what_stock_qwen3_moe_cannot_hold(tmp_path, over, match):
    folder = write_checkpoint(tmp_path / "in", dict(MOE_VHA, **over), moe_vha_tensors(MOE_VHA))
    with pytest.raises(FoldError, match=match) as e:
        plan_fold(folder, str(tmp_path / "out"))
    print(e.value)
    assert "\n" not in str(e.value) and not os.path.exists(tmp_path / "out")


HF_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np, torch
    from transformers import AutoModelForCausalLM, Qwen3MoeForCausalLM

    ckpt, ids_path, out_path = sys.argv[1:4]
    model, info = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float64, output_loading_info=True)
    assert type(model) is Qwen3MoeForCausalLM, type(model)
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(np.load(ids_path))).logits
    json.dump({k: sorted(map(str, v)) for k, v in info.items()}, open(out_path + ".json", "w"))
    np.save(out_path, logits.double().numpy())
    """
)


@pytest.mark.slow
def test_hf_qwen3_moe_loads_fold_and_matches_oracle(tmp_path, hf_python):
    """Hugging Face's Qwen3MoeForCausalLM (float64) loads the folded checkpoint with no missing or unexpected keys and
    matches the float64 oracle of the unfolded MoE-VHA model (HF's router softmax runs in float32: <= 1e-6 rel)."""
    c, t = make_moe_vha(tmp_path / "in")
    margin = moe_oracle.topk_margin(IDS, t, c)
    ref = moe_oracle.logits(IDS, t, c)
    fold_checkpoint(plan_fold(str(tmp_path / "in"), str(tmp_path / "out"), dtype="float64"), progress=False)
    np.save(tmp_path / "ids.npy", IDS)
    (tmp_path / "hf_run.py").write_text(HF_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    res = subprocess.run([hf_python, str(tmp_path / "hf_run.py"), str(tmp_path / "out"), str(tmp_path / "ids.npy"),
                          str(tmp_path / "hf_out.npy")], capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    info = json.load(open(tmp_path / "hf_out.npy.json"))
    got = np.load(tmp_path / "hf_out.npy")
    err = np.abs(got - ref).max() / np.abs(ref).max()
    print(f"HF Qwen3MoeForCausalLM float64 vs oracle: max rel {err:.2e} on {IDS.shape}; top-k relative margin "
          f"{margin:.1e}; loading info {info}")
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == []
    assert err <= 1e-6


@pytest.mark.parametrize("folded", [False, True], ids=["moe-vha", "folded-qwen3-moe"])
def test_export_refuses_moe_in_one_line(tmp_path, folded):
    """tools/export_onnx.py on a MoE checkpoint: exit 2 and one line naming why (no routed experts in the exported
    decoder), nothing written."""
    import sys
    make_moe_vha(tmp_path / "in")
    src = tmp_path / "in"
    if folded:
        fold_checkpoint(plan_fold(str(src), str(tmp_path / "out")), progress=False)
        src = tmp_path / "out"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "tools/export_onnx.py", str(src), str(tmp_path / "onnx")], capture_output=True,
                       text=True, cwd=root)
    print(r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "no routed experts" in lines[0]
    assert not os.path.exists(tmp_path / "onnx")


def test_training_a_moe_family_is_refused_in_one_line():
    from paddle_vha.train.errors import TrainError
    from paddle_vha.train.run_model import model_family

    for model_type in ("qwen3_moe_vha", "qwen3_moe"):
        with pytest.raises(TrainError, match="has no Paddle model here: PaddleFormers 1.0.0's qwen3_moe") as e:
            model_family(model_type)
        print(e.value)
        assert "\n" not in str(e.value)
