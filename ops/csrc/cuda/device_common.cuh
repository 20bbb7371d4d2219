// Common device code of the fused prologue's CUDA kernels: the CUDA (or emulator) headers and the two emulator hooks,
// the problem dimensions, the compute type per storage type and its conversions, and a warp sum.
//
// Under -DVHA_EMU the host emulator of the CUDA execution model (ops/emu/cuda_emu.h) replaces the CUDA headers and
// defines VHA_LAUNCH / VHA_DYNAMIC_SHARED itself, so every kernel runs unmodified on a CPU in CI.
#pragma once

#ifdef VHA_EMU  // the host emulator of the CUDA execution model (ops/emu/cuda_emu.h): these kernels run in CI on a CPU
#include "cuda_emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
// The emulator's two hooks, here as plain CUDA: a launch, and the dynamic shared memory.
#define VHA_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#define VHA_DYNAMIC_SHARED(name) extern __shared__ unsigned char name[]
#endif

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "../prologue_math.h"

namespace vha {
namespace gpu {

struct Dims {
  long B, S, Hp, Hkv, r, d, Bc;
  int heads_first;
  __host__ __device__ long rows() const { return B * S * Hp; }
  __host__ __device__ long tokens() const { return B * S; }
  __host__ __device__ long out_off(long t, long head, long heads) const {
    const long b = t / S, s = t % S;
    return heads_first ? ((b * heads + head) * S + s) * d : ((b * S + s) * heads + head) * d;
  }
  __host__ __device__ long table_off(long t) const {
    const long b = t / S, s = t % S;
    return ((Bc == 1 ? 0 : b) * S + s) * d;
  }
};

template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

__device__ __forceinline__ float to_c(float x) { return x; }
__device__ __forceinline__ double to_c(double x) { return x; }
__device__ __forceinline__ float to_c(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_c(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_c(typename Acc<T>::type x);
template <>
__device__ __forceinline__ float from_c<float>(float x) { return x; }
template <>
__device__ __forceinline__ double from_c<double>(double x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_c<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_c<__half>(float x) { return __float2half_rn(x); }

template <typename C>
__device__ __forceinline__ C warp_sum(C v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace gpu
}  // namespace vha
