"""Hugging Face transformers (PyTorch, CPU) loads the folded checkpoint and matches the VHA model.

HF's torch models do not import next to PaddleFormers 1.0.0 (docs/install.md), so the HF side runs in its own
environment, `.venv-hf` (tools/hf_env.sh creates it; ~35 s the first time, instant afterwards), in a subprocess.
"""
import json
import os
import subprocess
import textwrap

import numpy as np
import paddle
import pytest

import oracle
from _utils import config_dict, rel_err, to_numpy
from paddle_vha import Qwen3VHAForCausalLM
from paddle_vha.transform.fold import fold_checkpoint, plan_fold
from test_fold import make_vha, read_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HF_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np, torch
    from transformers import AutoModelForCausalLM
    from transformers.cache_utils import DynamicCache

    ckpt, ids_path, out_dir, dtypes = sys.argv[1:5]
    architecture = json.load(open(os.path.join(ckpt, "config.json")))["architectures"][0]
    for dtype in dtypes.split(","):  # every dtype from one process: importing torch + transformers is ~11 s of CPU
        torch_dtype = {"float64": torch.float64, "float32": torch.float32}[dtype]
        model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=torch_dtype, attn_implementation="sdpa")
        assert type(model).__name__ == architecture, type(model)  # Hugging Face's own class for the stock model
        model.eval()
        ids = torch.from_numpy(np.load(ids_path))
        with torch.no_grad():
            full = model(ids).logits
            # cached decode: a prompt, then one token at a time, positions passed explicitly
            cache, steps, B, S = DynamicCache(config=model.config), [], ids.shape[0], ids.shape[1]
            for a, b in [(0, S - 3), (S - 3, S - 2), (S - 2, S - 1), (S - 1, S)]:
                pos = torch.arange(a, b).expand(B, b - a)
                out = model(ids[:, a:b], position_ids=pos, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                steps.append(out.logits)
        np.savez(os.path.join(out_dir, f"hf_out_{dtype}.npz"), full=full.double().numpy(),
                 cached=torch.cat(steps, 1).double().numpy(),
                 heads=np.array([model.config.num_attention_heads, model.config.num_key_value_heads]),
                 kept=np.array([layer.keys.shape[2] for layer in cache.layers]),
                 layer_types=np.array(getattr(model.config, "layer_types", None) or []))
    """
)


def run_hf(hf_python, ckpt, ids, tmp_path, dtypes):
    """Hugging Face's outputs on ckpt in each of dtypes, from one side-env process: {dtype: npz}."""
    np.save(tmp_path / "ids.npy", ids)
    (tmp_path / "hf_run.py").write_text(HF_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    res = subprocess.run([hf_python, str(tmp_path / "hf_run.py"), str(ckpt), str(tmp_path / "ids.npy"),
                          str(tmp_path), ",".join(dtypes)], capture_output=True, text=True, timeout=600,
                         cwd=str(tmp_path), env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return {dtype: np.load(tmp_path / f"hf_out_{dtype}.npz") for dtype in dtypes}


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["fp32-bias-r<d", "odd-heads-tied", "bf16", "windows-own-r-R", "premix-off"])
def test_hf_transformers_loads_fold_and_matches(tmp_path, hf_python, variant):
    overrides = {
        "fp32-bias-r<d": dict(attention_bias=True, vha_q_head_dim=10, num_hidden_layers=3),
        "odd-heads-tied": dict(num_attention_heads=9, num_key_value_heads=3, head_dim=10, tie_word_embeddings=True),
        "bf16": dict(),
        # sliding-window layers 0 and 2 (window 4 < the 11-token prompts; HF's cache keeps the window's positions),
        # with their own r and R, which fold away
        "windows-own-r-R": dict(sliding_window=4, use_sliding_window=True, num_hidden_layers=3,
                                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                vha_q_head_dim=12, vha_window_q_head_dim=6, vha_window_postmix_rank=1),
        # no Premix (the research fork's kv_postmix_only): GQA heads kept, Postmix folded into o_proj
        "premix-off": dict(vha_premix=False, attention_bias=True, num_attention_heads=6, num_key_value_heads=2),
    }[variant]
    cfg, _ = make_vha(tmp_path / "vha", **overrides)
    # float64 output for the exactness check (fold math in float64, no rounding); bf16 for the storage case
    out_dtype = "bfloat16" if variant == "bf16" else "float64"
    fold_checkpoint(plan_fold(str(tmp_path / "vha"), str(tmp_path / "gqa"), dtype=out_dtype, max_shard_size="40KB"),
                    progress=False)
    raw = json.load(open(tmp_path / "gqa" / "config.json"))
    assert raw["model_type"] == "qwen3" and not [k for k in raw if k.startswith("vha_")]
    ids = np.random.randint(0, cfg.vocab_size, size=(2, 11))

    # references: the float64 VHA oracle on the VHA checkpoint, and the Paddle VHA model in float32
    ref64, _ = oracle.causal_lm(ids, read_state(tmp_path / "vha"), config_dict(cfg))
    vha = Qwen3VHAForCausalLM.from_pretrained(str(tmp_path / "vha"))
    vha.eval()
    ref32 = to_numpy(vha(paddle.to_tensor(ids), return_dict=True).logits)

    hf64, hf32 = run_hf(hf_python, tmp_path / "gqa", ids, tmp_path, ("float64", "float32")).values()
    assert list(hf64["heads"]) == [cfg.num_attention_heads, cfg.num_key_value_heads]
    if variant.startswith("windows"):
        assert list(hf64["layer_types"]) == ["sliding_attention", "full_attention", "sliding_attention"]
        assert list(hf64["kept"])[1] == 11 and max(hf64["kept"][[0, 2]]) < 11, hf64["kept"]  # HF trims the windows
    e_full = rel_err(hf64["full"], ref64, f"{variant}: HF torch float64 (folded) vs VHA float64 oracle")
    e_cached = rel_err(hf64["cached"], ref64, f"{variant}: HF cached decode float64 vs VHA float64 oracle")
    e32 = rel_err(hf32["full"], ref32, f"{variant}: HF torch float32 (folded) vs Paddle VHA float32")
    if variant == "bf16":  # folded weights rounded once to bf16: storage error, not fold error
        assert e_full < 5e-2 and e_cached < 5e-2 and e32 < 5e-2
    else:
        # HF's Qwen3 runs RMSNorm and the RoPE angles in float32 even in a float64 model
        # (modeling_qwen3.py: `.to(torch.float32)`, "Force float32"), so float32 round-off is its floor;
        # the fold's own 1e-10 exactness is checked with float64 oracles in test_fold.py.
        assert e_full <= 1e-6 and e_cached <= 1e-6 and e32 <= 1e-5
