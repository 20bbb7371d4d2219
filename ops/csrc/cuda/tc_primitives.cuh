// Tensor-core building blocks (sm_80+), each with its emulator branch: mma.sync m16n8k16 (bf16 / fp16 in, fp32
// accumulation), 16-byte cp.async into shared memory, ldmatrix(.trans), and 16- / 4-byte vector loads and stores with
// fp32 conversion; and the shared-memory row padding the tensor-core kernels use.
#pragma once

#include "device_common.cuh"

namespace vha {
namespace gpu {

// mma.sync m16n8k16, row.col, fp32 accumulation; the pointer argument only picks bf16 or fp16.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                          __nv_bfloat16*) {
#if defined(VHA_EMU)
  emu::mma_m16n8k16(c, a, b, /*bf16=*/true);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
  __trap();  // no bf16 mma below sm_80: the launcher never picks this path there (tc_eligible); never silent zeros
#endif
}
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], __half*) {
#if defined(VHA_EMU)
  emu::mma_m16n8k16(c, a, b, /*bf16=*/false);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
  __trap();  // as above
#endif
}

// Tensor-core building blocks (sm_80+): 16-byte asynchronous copies into shared memory, ldmatrix, 16-byte vectors.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
#if defined(__CUDA_ARCH__) && !defined(VHA_EMU)
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#else
  return uint32_t(reinterpret_cast<uintptr_t>(p));
#endif
}

// cp.async.cg of 16 bytes; `valid` false zero-fills them (src must still be a mapped address: callers pass a base).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if defined(VHA_EMU)
  emu::cp_async(dst, src, valid ? 16 : 0);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(VHA_EMU)
  emu::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>  // every committed group but the N most recent has landed (for this thread: a barrier follows)
__device__ __forceinline__ void cp_async_wait() {
#if defined(VHA_EMU)
  emu::cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ldmatrix.x4: lanes 8i..8i+7 give the 16-byte rows of 8x8 matrix i; register i receives the lane's mma fragment
// element pair of matrix i (of its transpose with TRANS).
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row) {
#if defined(VHA_EMU)
  emu::ldmatrix<4>(r, row, TRANS);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

// Eight 16-bit values as one 16-byte access (p 16-byte aligned), converted to / from fp32.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&x)[8]) {
  static_assert(sizeof(T) == 2, "16-bit types only");
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  T v[8];
  memcpy(v, &u, 16);
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] = to_c(v[j]);
}
template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&x)[8]) {
  T v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = from_c<T>(x[j]);
  uint4 u;
  memcpy(&u, v, 16);
  *reinterpret_cast<uint4*>(p) = u;
}
__device__ __forceinline__ void copy16(void* dst, const void* src) {
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
}
// Two adjacent 16-bit values of shared memory (an even column) as one 32-bit access.
template <typename T>
__device__ __forceinline__ void load_pair(const T* p, float (&x)[2]) {
  const uint32_t u = *reinterpret_cast<const uint32_t*>(p);
  T v[2];
  memcpy(v, &u, 4);
  x[0] = to_c(v[0]);
  x[1] = to_c(v[1]);
}
template <typename T>
__device__ __forceinline__ void store_pair(T* p, const float (&x)[2]) {
  const T v[2] = {from_c<T>(x[0]), from_c<T>(x[1])};
  uint32_t u;
  memcpy(&u, v, 4);
  *reinterpret_cast<uint32_t*>(p) = u;
}

constexpr int kSmemPad = 8;  // elements of padding per shared-memory row: rows stay 16-byte aligned, and the 8 rows of
                             // an ldmatrix fall in different banks

}  // namespace gpu
}  // namespace vha
