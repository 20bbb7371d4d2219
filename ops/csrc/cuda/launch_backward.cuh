// Backward launchers and their workspace: on tensor cores q_tc<bwd>, then the dq and dW GEMMs (gemm_tc), else
// bwd_rows, bwd_dq and bwd_dw; both end with fixed-order sums of the partials (sum_parts).
#pragma once

#include "launch_common.cuh"
#include "partial_sums.cuh"
#include "simt_backward.cuh"
#include "tc_gemm.cuh"

namespace vha {
namespace gpu {

// Backward grid of bwd_rows (one partial of the norm-weight gradients per block).
inline int rows_grid(const Dims& D) { return grid_for((D.rows() + D.tokens()) * D.Hkv, 4 * 8, 1024); }
inline long norm_parts(const Dims& D) { return rows_grid(D) > kMaxQtcBlocks ? rows_grid(D) : kMaxQtcBlocks; }

// Workspace (bytes, 256-aligned pieces, compute type): GU [rows*Hkv*d] (T on the tensor-core path), gW_part
// [chunks*Hkv*r*d], gw_part [norm_parts*2d].
template <typename T>
size_t backward_workspace_bytes(const Dims& D) {
  using C = typename Acc<T>::type;
  auto al = [](size_t b) { return (b + 255) / 256 * 256; };
  return al(D.rows() * D.Hkv * D.d * sizeof(C)) + al(dw_chunks(D) * D.Hkv * D.r * D.d * sizeof(C)) +
         al(size_t(norm_parts(D)) * 2 * D.d * sizeof(C));
}

// Tensor-core backward (bf16 / fp16): q_tc<BWD> (dL/du as T, dk, norm-weight partials), then dq = GU W^T and the
// per-chunk dW partials q_phys^T GU as tensor-core GEMMs, then fixed-order sums.
template <typename T>
cudaError_t launch_backward_tc(const T* qp, const T* kin, const T* W, const T* wq, const T* wk, const T* cosp,
                               const T* sinp, const T* gqo, const T* gko, T* gqp, T* gk, T* gW, T* gwq, T* gwk,
                               T* GU, float* gW_part, float* gw_part, const Dims& D, float eps, cudaStream_t st) {
  cudaError_t e = cudaSuccess;
  int blocks = 0;
  if (D.d == 64) e = launch_q_tc<T, 64, true>(qp, kin, W, wq, wk, cosp, sinp, gqo, gko, GU, gk, gw_part, D, eps, st, &blocks);
  if (D.d == 128) e = launch_q_tc<T, 128, true>(qp, kin, W, wq, wk, cosp, sinp, gqo, gko, GU, gk, gw_part, D, eps, st, &blocks);
  if (D.d == 256) e = launch_q_tc<T, 256, true>(qp, kin, W, wq, wk, cosp, sinp, gqo, gko, GU, gk, gw_part, D, eps, st, &blocks);
  if (e != cudaSuccess) return e;
  const size_t gsmem = size_t(2) * 2 * kGTile * sizeof(T);
  const long rows = D.rows(), r = D.r, d = D.d, K = D.Hkv * d;
  int sh = 0;
  while ((1L << sh) < d) ++sh;
  const long chunks = rows > 0 ? dw_chunks(D) : 0;
  if (rows > 0) {
    // dq_phys (rows x r) = GU (rows x Hkv*d) . W^T, W read as (n = k', k = (g, c)): one K pass, no split
    const Opnd<T> A{GU, K, 62, 0}, B{W, d, sh, r * d};
    dim3 g1(unsigned((rows + kGM - 1) / kGM * ((r + kGN - 1) / kGN)), 1, 1);
    VHA_LAUNCH(g1, 128, gsmem, st, gemm_tc<T, true, true, T>)(A, B, gqp, rows, r, K, K, 1L, 0L, 0L, 0L);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    // dW[g] (r x d) = q_phys^T (r x rows) . GU[:, g, :] (rows x d), rows split into chunks: fp32 partials
    const long per = dw_rows_per_chunk(D);
    const Opnd<T> Aq{qp, r, 62, 0}, Bg{GU, K, 62, 0};
    dim3 g2(unsigned((r + kGM - 1) / kGM * D.Hkv * ((d + kGN - 1) / kGN)), 1, unsigned(chunks));
    VHA_LAUNCH(g2, 128, gsmem, st, gemm_tc<T, false, false, float>)(Aq, Bg, gW_part, r, d, rows, per, D.Hkv, d,
                                                                    r * d, D.Hkv * r * d);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  const long nW = D.Hkv * r * d;
  VHA_LAUNCH(grid_for(nW, 256, 1024), 256, 0, st, sum_parts<T>)(gW_part, chunks, nW, gW, nW);
  VHA_LAUNCH(1, 256, 0, st, sum_parts<T>)(gw_part, long(blocks), 2 * d, gwq, d);
  VHA_LAUNCH(1, 256, 0, st, sum_parts<T>)(gw_part + d, long(blocks), 2 * d, gwk, d);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_backward(const T* qp, const T* kin, const T* W, const T* wq, const T* wk, const T* cosp,
                            const T* sinp, const T* gqo, const T* gko, T* gqp, T* gk, T* gW, T* gwq, T* gwk,
                            void* workspace, size_t ws_bytes, const Dims& D, float eps, cudaStream_t st) {
  using C = typename Acc<T>::type;
  if (ws_bytes < backward_workspace_bytes<T>(D)) return cudaErrorInvalidValue;
  auto al = [](size_t b) { return (b + 255) / 256 * 256; };
  unsigned char* p = static_cast<unsigned char*>(workspace);
  C* GU = reinterpret_cast<C*>(p);
  p += al(D.rows() * D.Hkv * D.d * sizeof(C));
  C* gW_part = reinterpret_cast<C*>(p);
  p += al(dw_chunks(D) * D.Hkv * D.r * D.d * sizeof(C));
  C* gw_part = reinterpret_cast<C*>(p);
  if constexpr (std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value) {
    if (tc_eligible<T>(D, {qp, kin, W, wq, wk, cosp, sinp, gqo, gko, gqp, gk, workspace}))
      return launch_backward_tc<T>(qp, kin, W, wq, wk, cosp, sinp, gqo, gko, gqp, gk, gW, gwq, gwk,
                                   reinterpret_cast<T*>(GU), gW_part, gw_part, D, eps, st);
  }
  cudaError_t e = cudaSuccess;
  const int threads = 128, wpb = threads / 32;
  const size_t smem1 = (size_t(wpb) * 2 * D.d + size_t(wpb) * (D.r + 2 * D.d)) * sizeof(C);
  const int g1 = rows_grid(D);
  const size_t smem2 = size_t(wpb) * D.Hkv * D.d * sizeof(C);
  if ((e = allow_smem(bwd_rows<T>, smem1)) != cudaSuccess || (e = allow_smem(bwd_dq<T>, smem2)) != cudaSuccess) return e;
  VHA_LAUNCH(g1, threads, smem1, st, bwd_rows<T>)(qp, kin, W, wq, wk, cosp, sinp, gqo, gko, gk, GU, gw_part, D, C(eps));
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  VHA_LAUNCH(grid_for(D.rows(), wpb), threads, smem2, st, bwd_dq<T>)(W, GU, gqp, D);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  const long chunks = dw_chunks(D);
  if (chunks > 0) {  // an empty batch has no rows to sum (and a zero-sized grid is not a launch): dW is then 0
    dim3 g3(unsigned((D.d + kTile - 1) / kTile), unsigned(D.Hkv * ((D.r + kTile - 1) / kTile)), unsigned(chunks));
    VHA_LAUNCH(g3, kTile * 8, 0, st, bwd_dw<T>)(qp, GU, gW_part, D, dw_rows_per_chunk(D));
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  const long nW = D.Hkv * D.r * D.d;
  VHA_LAUNCH(grid_for(nW, 256, 1024), 256, 0, st, sum_parts<T>)(gW_part, chunks, nW, gW, nW);
  VHA_LAUNCH(1, 256, 0, st, sum_parts<T>)(gw_part, long(g1), 2 * D.d, gwq, D.d);
  VHA_LAUNCH(1, 256, 0, st, sum_parts<T>)(gw_part + D.d, long(g1), 2 * D.d, gwk, D.d);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace vha
