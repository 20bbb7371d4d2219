"""The extern "C" launcher (ops/csrc/cuda/c_api.cu) built with nvcc for this GPU and called on PyTorch tensors.
"""
from __future__ import annotations

import ctypes
import subprocess
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]  # the checkout

DTYPES = {"float32": (0, torch.float32), "float64": (1, torch.float64), "bfloat16": (2, torch.bfloat16),
          "float16": (3, torch.float16)}


def build_launcher(out_dir: Path) -> ctypes.CDLL:
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    so = out_dir / f"libvha_prologue_sm{arch}.so"
    cmd = ["nvcc", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
           f"-gencode=arch=compute_{arch},code=sm_{arch}", f"-I{ROOT / 'ops' / 'csrc'}",
           str(ROOT / "ops" / "csrc" / "cuda" / "c_api.cu"), "-o", str(so)]
    t0 = time.time()
    subprocess.run(cmd, check=True)
    print(f"[build] sm_{arch} launcher in {time.time() - t0:.1f} s: {so}", flush=True)
    lib = ctypes.CDLL(str(so))
    vp, L, F, I = ctypes.c_void_p, ctypes.c_long, ctypes.c_float, ctypes.c_int
    lib.vha_prologue_forward.argtypes = [I] + [vp] * 9 + [L] * 7 + [F, I, vp]
    lib.vha_prologue_forward.restype = I
    lib.vha_prologue_backward_workspace.argtypes = [I] + [L] * 6
    lib.vha_prologue_backward_workspace.restype = ctypes.c_size_t
    lib.vha_prologue_backward.argtypes = [I] + [vp] * 15 + [ctypes.c_size_t] + [L] * 7 + [F, I, vp]
    lib.vha_prologue_backward.restype = I
    return lib


def ptr(t):
    """A tensor's data pointer; the kernels index every tensor as contiguous (../ops/csrc/register_op.cc), so a
    strided view is refused here rather than read wrongly (the first GPU run's batch > 1 failures: RoPE tables built
    by np.concatenate over a broadcast kept numpy's non-C strides through torch.tensor)."""
    if t is None:
        return ctypes.c_void_p(0)
    assert t.is_contiguous(), f"the launcher takes contiguous tensors, got shape {tuple(t.shape)} strides {t.stride()}"
    return ctypes.c_void_p(t.data_ptr())


def cuda_stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def _code(t):
    return DTYPES[str(t.dtype).replace("torch.", "")][0]


class Fused:
    """The launcher on torch tensors, on torch's current stream. The *_into forms write into given buffers (no
    allocation: what the timing captures into CUDA graphs); forward / backward allocate their outputs."""

    def __init__(self, lib, stream=cuda_stream):
        self.lib = lib
        self.stream = stream  # () -> the cudaStream_t to launch on (the host emulator's tests pass a null stream)

    def forward_into(self, qp, k, W, wq, wk, cos, sin, qo, ko, eps, heads_first=False):
        B, S, Hp, r = qp.shape
        Hkv, _, d = W.shape
        rc = self.lib.vha_prologue_forward(_code(qp), ptr(qp), ptr(k), ptr(W), ptr(wq), ptr(wk), ptr(cos), ptr(sin),
                                           ptr(qo), ptr(ko), B, S, Hp, Hkv, r, d, cos.shape[0], eps,
                                           int(heads_first), self.stream())
        assert rc == 0, f"forward CUDA error {rc}"

    def forward(self, qp, k, W, wq, wk, cos, sin, eps, heads_first=False):
        B, S, Hp, r = qp.shape
        Hkv, _, d = W.shape
        shape_q = (B, Hp * Hkv, S, d) if heads_first else (B, S, Hp * Hkv, d)
        shape_k = (B, Hkv, S, d) if heads_first else (B, S, Hkv, d)
        qo = torch.empty(shape_q, dtype=qp.dtype, device=qp.device)
        ko = torch.empty(shape_k, dtype=qp.dtype, device=qp.device)
        self.forward_into(qp, k, W, wq, wk, cos, sin, qo, ko, eps, heads_first)
        return qo, ko

    def workspace(self, qp, W):
        """The backward's workspace (uint8 tensor of vha_prologue_backward_workspace bytes)."""
        B, S, Hp, r = qp.shape
        Hkv, _, d = W.shape
        ws = self.lib.vha_prologue_backward_workspace(_code(qp), B, S, Hp, Hkv, r, d)
        return torch.empty(ws, dtype=torch.uint8, device=qp.device)

    def backward_into(self, qp, k, W, wq, wk, cos, sin, gq, gk, outs, work, eps, heads_first=False):
        """outs: (d q_phys, d k, d premix, d q_norm.w, d k_norm.w), shaped like (qp, k, W, wq, wk)."""
        B, S, Hp, r = qp.shape
        Hkv, _, d = W.shape
        rc = self.lib.vha_prologue_backward(_code(qp), ptr(qp), ptr(k), ptr(W), ptr(wq), ptr(wk), ptr(cos),
                                            ptr(sin), ptr(gq), ptr(gk), *[ptr(o) for o in outs], ptr(work),
                                            work.numel(), B, S, Hp, Hkv, r, d, cos.shape[0], eps, int(heads_first),
                                            self.stream())
        assert rc == 0, f"backward CUDA error {rc}"

    def backward(self, qp, k, W, wq, wk, cos, sin, gq, gk, eps, heads_first=False):
        outs = [torch.empty_like(t) for t in (qp, k, W, wq, wk)]
        self.backward_into(qp, k, W, wq, wk, cos, sin, gq, gk, outs, self.workspace(qp, W), eps, heads_first)
        return outs
