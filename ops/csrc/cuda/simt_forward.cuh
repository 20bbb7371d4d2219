// SIMT forward (fp32 / fp64, shapes the tensor cores do not take, GPUs below sm_80): fwd_simt, one warp per
// (query row, group) or key row, and the row epilogue RMSNorm -> RoPE it shares with nothing else.
#pragma once

#include "device_common.cuh"

namespace vha {
namespace gpu {

// Row epilogue shared by the SIMT kernels: u (d values, shared memory, compute type) -> RMSNorm -> RoPE -> out.
template <typename T, typename C>
__device__ void norm_rope_store(const C* u, const T* w, const T* cosr, const T* sinr, T* out, int d, C eps, int lane) {
  C ss = 0;
  for (int c = lane; c < d; c += 32) ss += u[c] * u[c];
  const C rs = rms_rstd(warp_sum(ss), d, eps);
  const int h = d / 2;
  for (int c = lane; c < h; c += 32) {
    C lo, hi;
    rope_pair_fwd(u[c] * rs * to_c(w[c]), u[c + h] * rs * to_c(w[c + h]), C(to_c(cosr[c])), C(to_c(sinr[c])),
                  C(to_c(cosr[c + h])), C(to_c(sinr[c + h])), &lo, &hi);
    out[c] = from_c<T>(lo);
    out[c + h] = from_c<T>(hi);
  }
}

// One warp per task: tasks [0, rows*Hkv) are (q row, group), then [rows*Hkv, +tokens*Hkv) are key rows.
// Shared memory per warp: r + d compute-type values.
template <typename T>
__global__ void fwd_simt(const T* qp, const T* kin, const T* W, const T* wq, const T* wk, const T* cosp,
                         const T* sinp, T* qo, T* ko, Dims D, typename Acc<T>::type eps, long first_task,
                         long n_tasks) {
  using C = typename Acc<T>::type;
  VHA_DYNAMIC_SHARED(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wpb = blockDim.x / 32;
  C* buf = reinterpret_cast<C*>(smem_raw) + warp * (D.r + D.d);
  C* qrow = buf;
  C* u = buf + D.r;
  const long q_tasks = D.rows() * D.Hkv;
  for (long task = first_task + long(blockIdx.x) * wpb + warp; task < first_task + n_tasks;
       task += long(gridDim.x) * wpb) {
    if (task < q_tasks) {
      const long row = task / D.Hkv, g = task % D.Hkv, t = row / D.Hp, i = row % D.Hp;
      for (long k = lane; k < D.r; k += 32) qrow[k] = to_c(qp[row * D.r + k]);
      __syncwarp();
      const T* Wg = W + g * D.r * D.d;
      for (long c = lane; c < D.d; c += 32) {
        C acc = 0;
        for (long k = 0; k < D.r; ++k) acc += qrow[k] * C(to_c(Wg[k * D.d + c]));
        u[c] = acc;
      }
      __syncwarp();
      norm_rope_store<T, C>(u, wq, cosp + D.table_off(t), sinp + D.table_off(t),
                            qo + D.out_off(t, g * D.Hp + i, D.Hp * D.Hkv), int(D.d), eps, lane);
    } else {
      const long kt = task - q_tasks, t = kt / D.Hkv, g = kt % D.Hkv;
      for (long c = lane; c < D.d; c += 32) u[c] = to_c(kin[kt * D.d + c]);
      __syncwarp();
      norm_rope_store<T, C>(u, wk, cosp + D.table_off(t), sinp + D.table_off(t), ko + D.out_off(t, g, D.Hkv),
                            int(D.d), eps, lane);
    }
    __syncwarp();
  }
}

}  // namespace gpu
}  // namespace vha
