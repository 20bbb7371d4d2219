"""The fused prologue's checks that need no Paddle: the independent float64 reference, and tools/gpu_check.py's parts.

oracle.py        float64 numpy forward and vector-Jacobian product of the prologue, from the math (numpy only; imports
                 nothing from paddle_vha: the tests and the GPU check compare against it)
launcher.py      builds ops/csrc/cuda/c_api.cu with nvcc and calls it on PyTorch tensors (Fused)
torch_chain.py   the layer's composed chain in PyTorch, the baseline of the accuracy bound and the timings
accuracy.py      the GPU check's correctness part: fused and composed against the oracle on adversarial shapes
timing.py        per-call GPU time by CUDA graphs (or an eager loop), copy bandwidth, the timed shapes
roofline.py      the bytes / FLOPs model, derived columns, the short table and target lines (no GPU, no torch)

tools/gpu_check.py (run from the checkout's root) imports these as the package beside it; the tests import it the same
way (tests/conftest.py puts tools/ on the path).
"""
