// Forward launcher: q_tc<fwd> in one launch where the tensor-core path is eligible, else fwd_simt.
#pragma once

#include "launch_common.cuh"
#include "simt_forward.cuh"

namespace vha {
namespace gpu {

template <typename T>
cudaError_t launch_forward(const T* qp, const T* kin, const T* W, const T* wq, const T* wk, const T* cosp,
                           const T* sinp, T* qo, T* ko, const Dims& D, float eps, cudaStream_t st) {
  using C = typename Acc<T>::type;
  if (D.tokens() == 0) return cudaSuccess;  // nothing to write (and a zero-sized grid is not a launch)
  if constexpr (std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value) {
    if (tc_eligible<T>(D, {qp, kin, W, wq, wk, cosp, sinp, qo, ko})) {  // one launch: queries, then keys
      int blocks = 0;
      if (D.d == 64) return launch_q_tc<T, 64, false>(qp, kin, W, wq, wk, cosp, sinp, nullptr, nullptr, qo, ko, nullptr, D, eps, st, &blocks);
      if (D.d == 128) return launch_q_tc<T, 128, false>(qp, kin, W, wq, wk, cosp, sinp, nullptr, nullptr, qo, ko, nullptr, D, eps, st, &blocks);
      return launch_q_tc<T, 256, false>(qp, kin, W, wq, wk, cosp, sinp, nullptr, nullptr, qo, ko, nullptr, D, eps, st, &blocks);
    }
  }
  const int threads = 128, wpb = threads / 32;
  const long n = (D.rows() + D.tokens()) * D.Hkv;
  const size_t smem = size_t(wpb) * (D.r + D.d) * sizeof(C);
  cudaError_t e = allow_smem(fwd_simt<T>, smem);
  if (e != cudaSuccess) return e;
  VHA_LAUNCH(grid_for(n, wpb), threads, smem, st, fwd_simt<T>)(qp, kin, W, wq, wk, cosp, sinp, qo, ko, D, C(eps), 0L, n);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace vha
