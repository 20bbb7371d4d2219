// CUDA side of the fused VHA prologue, the one header its users include (see ../prologue_math.h for the math and
// ../register_op.cc for the operator contract): launch_forward, launch_backward, backward_workspace_bytes.
// Framework-free: included by the Paddle op glue (op_cuda.cu) and by the extern "C" entry points (c_api.cu) used for
// checks on machines without Paddle.
//
// STATUS: compiled for sm_80 / sm_90 here and run in CI under the host emulator (ops/emu/cuda_emu.h,
// tests/test_cuda_emulation.py, tests/test_cuda_emu_races.py); never run on a GPU by this project (docs/prologue.md).
//
// Tensor-core path (bf16 / fp16, d in {64, 128, 256}, r % 16 == 0, 16-byte aligned pointers, sm_80+):
//   forward  q_tc<fwd>: one launch. Per CTA a Premix group g and 64-row tiles of q_phys ([rows = B*S*H_p, r]) in a
//            persistent loop: W[g] and the q tiles (double-buffered) staged with 16-byte cp.async, read with ldmatrix,
//            multiplied with mma.sync m16n8k16 (fp32 accumulation); RMSNorm + RoPE in registers (a thread holds
//            columns c, c + 1 and their RoPE partners of two rows); each warp writes its 16 rows through shared memory
//            in 16-byte stores. Then the CTA's share of the key rows, in 16-byte vectors.
//   backward q_tc<bwd> recomputes u = q_phys W[g] the same way, stages dL/dout with cp.async, and writes dL/du (T) in
//            16-byte stores, dk, and per-block norm-weight partials; then dq = dL/du W^T and dW = q_phys^T dL/du as
//            tensor-core GEMMs (gemm_tc: cp.async double buffering, ldmatrix(.trans), 16-byte stores), dW as per-chunk
//            fp32 partials; sum_parts adds every partial in a fixed order.
// SIMT path (fp32 / fp64, other shapes, below sm_80): fwd_simt (one warp per (row, group) or key row); backward
//   bwd_rows (dL/du in fp32/fp64, dk, norm-weight partials per block), bwd_dq (one warp per row), bwd_dw (shared-memory
//   tiles, one partial per row chunk), sum_parts.
// No floating-point atomics anywhere: every output is bitwise deterministic.
//
// Files, one job each: device_common.cuh (headers, emulator hooks, Dims, conversions), simt_forward.cuh,
// simt_backward.cuh, tc_primitives.cuh (mma / ldmatrix / cp.async wrappers), tc_prologue.cuh (q_tc, both passes),
// tc_gemm.cuh, partial_sums.cuh, launch_common.cuh (path choice), launch_forward.cuh, launch_backward.cuh.
#pragma once

#include "launch_backward.cuh"
#include "launch_forward.cuh"
