// Fixed-order sums of per-block / per-chunk partials (sum_parts): the last step of both backwards, and why no
// floating-point atomic appears anywhere (every gradient is bitwise deterministic).
#pragma once

#include "device_common.cuh"

namespace vha {
namespace gpu {

// out[i] = sum over p < n_parts of parts[p * stride + i], in a fixed order (16 parts at a time, then those sums), cast
// to the parameter dtype once. n_parts = 0 gives zeros.
template <typename T>
__global__ void sum_parts(const typename Acc<T>::type* parts, long n_parts, long stride, T* out, long n) {
  using C = typename Acc<T>::type;
  for (long i = long(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    C total = 0;
    for (long p0 = 0; p0 < n_parts; p0 += 16) {
      C s = 0;
      for (long p = p0; p < n_parts && p < p0 + 16; ++p) s += parts[p * stride + i];
      total += s;
    }
    out[i] = from_c<T>(total);
  }
}

}  // namespace gpu
}  // namespace vha
