// CUDA kernels of the fused VHA prologue (see vha_prologue_math.h for the math and vha_prologue_cpu.cc for the
// operator contract). Framework-free: included by the Paddle op glue (vha_prologue_cuda.cu) and by the extern "C"
// launcher (vha_prologue_launcher.cu) used for checks on machines without Paddle.
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

#include "vha_prologue_math.h"

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

// ---------------------------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------------------------
// Tensor-core forward for the virtual queries (bf16 / fp16, d = DH in {64, 128, 256}, r % 16 == 0).
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

// ---------------------------------------------------------------------------------------------------------------
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

// One thread's columns c, c + 1 of a row and their RoPE partners ch, ch + 1 (ch = c + d/2) in the tensor-core epilogue:
// the norm weight and the token's cos / sin there, from shared memory.
struct ColPairs {
  float w_lo[2], w_hi[2], c_lo[2], s_lo[2], c_hi[2], s_hi[2];
};
template <typename T>
__device__ __forceinline__ ColPairs load_col_pairs(const T* w, const T* cr, const T* sr, int c, int ch) {
  ColPairs p;
  load_pair(w + c, p.w_lo);
  load_pair(w + ch, p.w_hi);
  load_pair(cr + c, p.c_lo);
  load_pair(sr + c, p.s_lo);
  load_pair(cr + ch, p.c_hi);
  load_pair(sr + ch, p.s_hi);
  return p;
}
// gn = the adjoint of RoPE applied to dL/dout at those columns (dL/dout read from the staged row `orow`).
template <typename T>
__device__ __forceinline__ void rope_bwd_pairs(const ColPairs& p, const T* orow, int c, int ch, float (&gn_lo)[2],
                                               float (&gn_hi)[2]) {
  float g_lo[2], g_hi[2];
  load_pair(orow + c, g_lo);
  load_pair(orow + ch, g_hi);
#pragma unroll
  for (int e = 0; e < 2; ++e)
    rope_pair_bwd(g_lo[e], g_hi[e], p.c_lo[e], p.s_lo[e], p.c_hi[e], p.s_hi[e], &gn_lo[e], &gn_hi[e]);
}

constexpr int kTcWarps = 4;  // 64 rows per CTA in the prologue kernels, 4 warps of 16
constexpr int kSmemPad = 8;  // elements of padding per shared-memory row: rows stay 16-byte aligned, and the 8 rows of
                             // an ldmatrix fall in different banks

// Shared memory of q_tc (bytes), in the kernel's layout: W[g] (r x DH), `stages` q tiles (ROWS x r), per-warp staging
// of 16 output rows (16 x DH), the cos and sin rows of the tokens a tile touches (at most ceil(ROWS / H_p) + 1), the two
// norm weights, and per-warp fp32 sums of the norm-weight gradients (backward). Row pitches carry kSmemPad.
constexpr int kTcRows = 16 * kTcWarps;  // q rows per tile
__host__ __device__ inline int q_tc_tokens(long Hp) { return int((kTcRows + Hp - 1) / Hp + 1); }
inline size_t q_tc_smem(long r, int DH, int stages, long Hp) {
  return size_t(2) * (size_t(r) * (DH + kSmemPad) + size_t(stages) * kTcRows * (r + kSmemPad) +
                      size_t(kTcWarps) * 16 * (DH + kSmemPad) + size_t(2) * q_tc_tokens(Hp) * DH + 2 * size_t(DH)) +
         size_t(kTcWarps) * 2 * DH * sizeof(float);
}

// ---- keys of tokens [t0, t1) for KV head g: RMSNorm + RoPE in 16-byte vectors, cos / sin from shared memory (row t
// - t_lo of tabs / tabs + tab_stride). L = DH/16 lanes per row, each with 8 columns of the first half and their RoPE
// partners; 32/L rows per warp, the CTA's warps one after another. Backward: dk, and the k_norm weight-gradient terms
// summed over the warp's rows into gw_warp (lanes < L write, columns c0.. and DH/2 + c0..).
template <typename T, int DH, bool BWD>
__device__ void key_rows(const T* kin, const T* wks, const T* tabs, int tab_stride, long t_lo, long t0, long t1,
                         long g, const T* gko, T* out, float* gw_warp, const Dims& D, float eps) {
  constexpr int L = DH / 16, RPW = 32 / L, H = DH / 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, c0 = (lane % L) * 8;
  float w_lo[8], w_hi[8], gw[16];
  load8(wks + c0, w_lo);
  load8(wks + H + c0, w_hi);
#pragma unroll
  for (int j = 0; j < 16; ++j) gw[j] = 0.f;
  for (long base = t0 + long(warp) * RPW; base < t1; base += long(kTcWarps) * RPW) {  // uniform over the warp
    const long t = base + lane / L;
    const bool ok = t < t1;
    const long kr = t * D.Hkv + g;  // row of k: [B, S, H_kv, d]
    float lo[8], hi[8], cl[8], sl[8], ch[8], sh[8], ss = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) lo[j] = hi[j] = cl[j] = sl[j] = ch[j] = sh[j] = 0.f;
    if (ok) {
      load8(kin + kr * DH + c0, lo);
      load8(kin + kr * DH + H + c0, hi);
      const T* cr = tabs + (t - t_lo) * DH;
      load8(cr + c0, cl);
      load8(cr + tab_stride + c0, sl);
      load8(cr + H + c0, ch);
      load8(cr + tab_stride + H + c0, sh);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += lo[j] * lo[j] + hi[j] * hi[j];
#pragma unroll
    for (int o = 1; o < L; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);  // the L lanes of this row
    const float rs = rms_rstd(ss, DH, eps);
    T* dst = out + (BWD ? kr * DH : D.out_off(t, g, D.Hkv));
    if constexpr (!BWD) {
      float ol[8], oh[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        rope_pair_fwd(lo[j] * rs * w_lo[j], hi[j] * rs * w_hi[j], cl[j], sl[j], ch[j], sh[j], &ol[j], &oh[j]);
      if (ok) {
        store8(dst + c0, ol);
        store8(dst + H + c0, oh);
      }
    } else {
      float gl[8], gh[8], dot = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) gl[j] = gh[j] = 0.f;
      if (ok && gko != nullptr) {
        float go_l[8], go_h[8];
        const T* g_out = gko + D.out_off(t, g, D.Hkv);
        load8(g_out + c0, go_l);
        load8(g_out + H + c0, go_h);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          float a, b;
          rope_pair_bwd(go_l[j], go_h[j], cl[j], sl[j], ch[j], sh[j], &a, &b);
          gw[j] += a * lo[j] * rs;
          gw[8 + j] += b * hi[j] * rs;
          gl[j] = a * w_lo[j];
          gh[j] = b * w_hi[j];
          dot += gl[j] * lo[j] + gh[j] * hi[j];
        }
      }
#pragma unroll
      for (int o = 1; o < L; o <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      float xl[8], xh[8];  // k output not in the loss (gko null): dk = 0
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        xl[j] = rms_input_grad(gl[j], lo[j], rs, dot / float(DH));
        xh[j] = rms_input_grad(gh[j], hi[j], rs, dot / float(DH));
      }
      if (ok) {
        store8(dst + c0, xl);
        store8(dst + H + c0, xh);
      }
    }
  }
  if constexpr (BWD) {  // the warp's sums, over the lanes with the same columns, added to the warp's row of gw_warp
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      float v = gw[j];
#pragma unroll
      for (int o = L; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane < L) gw_warp[j < 8 ? c0 + j : H + c0 + j - 8] += v;
    }
  }
}

// ---- the virtual queries on tensor cores (bf16 / fp16, d = DH in {64, 128, 256}, r % 16 == 0), forward or backward.
// A CTA owns group g = blockIdx.y and 64-row tiles of q_phys (rows = B*S*H_p) in a persistent loop; warp w the tile's
// rows 16w .. 16w+15. Global memory is read with 16-byte cp.async only: W[g] (r x DH) and the norm weights once, each
// q tile (64 x r) while the previous one is multiplied (stages = 2), and per tile the cos / sin rows of the tokens it
// touches (each row of a token reads them from shared memory: once per token and group from global memory). W[g] is
// the mma B operand through ldmatrix.trans, the q tile the A operand through ldmatrix. In the m16n8 accumulator a
// thread holds columns c, c + 1 and (DH/2 on) their RoPE partners of rows gid and gid + 8, so RoPE is thread-local and
// a row's norm is a 4-lane shuffle sum.
// Forward: normalise + rotate; each warp stages its 16 output rows in shared memory and writes them in 16-byte stores.
// Backward: dL/dout of the tile's rows is staged with cp.async while u = q_phys W[g] is recomputed; dL/du goes out in
// 16-byte stores to GU ([rows, H_kv, DH], T: the operand of the dq and dW GEMMs that follow); the q_norm weight
// gradient is summed per thread in registers (DH <= 128) or per warp in shared memory, then per block in a fixed order
// (gw_part row blockIdx.y * gridDim.x + blockIdx.x: q half, k half).
// Keys: the tile also does key rows (t, g) of the tokens whose first query row is in it (every token exactly once),
// with the tables already in shared memory: one launch in all.
template <typename T, int DH, bool BWD>
__global__ void __launch_bounds__(kTcWarps * 32)
    q_tc(const T* qp, const T* kin, const T* W, const T* wq, const T* wk, const T* cosp, const T* sinp, const T* gqo,
         const T* gko, T* qo_or_gu, T* ko_or_gk, float* gw_part, Dims D, float eps, int stages) {
  VHA_DYNAMIC_SHARED(smem_raw);
  constexpr int NT = DH / 8, HT = NT / 2, LDW = DH + kSmemPad, ROWS = kTcRows;
  // q_norm weight-gradient sums: in registers across tiles up to DH = 128; at DH = 256 those 64 registers next to the
  // 128 accumulators spill, so each row's terms are summed over the 8 lanes of a column (shuffles) and added to the
  // warp's sums in shared memory instead
  constexpr bool GW_REGS = DH <= 128;
  const int r = int(D.r), ldq = r + kSmemPad, max_tok = q_tc_tokens(D.Hp);
  T* ws = reinterpret_cast<T*>(smem_raw);    // [r][LDW]: W[g]
  T* qs = ws + size_t(r) * LDW;              // [stages][ROWS][ldq]: q_phys tiles
  T* os = qs + size_t(stages) * ROWS * ldq;  // [warps][16][LDW]: this warp's output rows (backward: dL/dout first)
  T* tabs = os + size_t(kTcWarps) * 16 * LDW;  // [2][max_tok][DH]: cos, then sin, of the tile's tokens
  T* wqs = tabs + size_t(2) * max_tok * DH;    // [DH]: q_norm weight, then [DH] k_norm weight
  T* wks = wqs + DH;
  float* gw_acc = reinterpret_cast<float*>(wks + DH);  // [warps][2 * DH]: per-warp q_norm / k_norm gradient sums
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane >> 2, tig = lane & 3;
  T* my_os = os + size_t(warp) * 16 * LDW;
  float* my_gw = gw_acc + warp * 2 * DH;
  const long g = blockIdx.y, rows = D.rows(), n_tiles = (rows + ROWS - 1) / ROWS;
  const T* Wg = W + g * D.r * DH;
  const int heads = int(D.Hp * D.Hkv);

  auto stage_q = [&](long tile, int buf) {  // 64 x r: r/8 chunks of 16 bytes per row; rows past the end zero-filled
    for (int v = tid; v < ROWS * (r / 8); v += blockDim.x) {
      const int rr = v / (r / 8), kc = (v % (r / 8)) * 8;
      const long row = tile * ROWS + rr;
      cp_async16(qs + (size_t(buf) * ROWS + rr) * ldq + kc, row < rows ? qp + row * D.r + kc : qp, row < rows);
    }
  };
  for (int v = tid; v < r * (DH / 8); v += blockDim.x) {
    const int k = v / (DH / 8), c = (v % (DH / 8)) * 8;
    cp_async16(ws + size_t(k) * LDW + c, Wg + size_t(k) * DH + c, true);
  }
  for (int v = tid; v < 2 * (DH / 8); v += blockDim.x) {
    const int c = (v % (DH / 8)) * 8;
    cp_async16(v < DH / 8 ? wqs + c : wks + c, v < DH / 8 ? wq + c : wk + c, true);
  }
  if (blockIdx.x < n_tiles) stage_q(blockIdx.x, 0);
  cp_async_commit();
  if (BWD) {
    for (int c = lane; c < 2 * DH; c += 32) my_gw[c] = 0.f;
  }

  float gwq[NT][2];  // backward, DH <= 128: this thread's q_norm weight-gradient sums, columns nt*8 + 2*tig + e
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) gwq[nt][0] = gwq[nt][1] = 0.f;

  int buf = 0;
  for (long tile = blockIdx.x; tile < n_tiles; tile += gridDim.x, buf ^= (stages - 1)) {
    const long row0 = tile * ROWS + warp * 16;
    const long next = tile + gridDim.x;
    const long r_first = tile * ROWS, r_last = min(rows, r_first + ROWS) - 1;
    const long t_lo = r_first / D.Hp, n_tok = r_last / D.Hp - t_lo + 1;  // tokens the tile's rows belong to
    if (stages == 2 && next < n_tiles) stage_q(next, buf ^ 1);
    cp_async_commit();
    for (int v = tid; v < 2 * n_tok * (DH / 8); v += blockDim.x) {  // cos and sin rows of those tokens
      const int which = v / int(n_tok * (DH / 8)), rem = v % int(n_tok * (DH / 8));
      const int tt = rem / (DH / 8), c = (rem % (DH / 8)) * 8;
      cp_async16(tabs + (size_t(which) * max_tok + tt) * DH + c, (which ? sinp : cosp) + D.table_off(t_lo + tt) + c,
                 true);
    }
    if (BWD) {  // this warp's 16 rows of dL/dout, into its output staging
      for (int v = lane; v < 16 * (DH / 8); v += 32) {
        const int rr = v / (DH / 8), c = (v % (DH / 8)) * 8;
        const long row = row0 + rr;
        const bool ok = row < rows;
        const long t = ok ? row / D.Hp : 0, i = ok ? row % D.Hp : 0;
        cp_async16(my_os + rr * LDW + c, gqo + D.out_off(t, g * D.Hp + i, heads) + c, ok);
      }
    }
    cp_async_commit();
    cp_async_wait<2>();  // W, the norm weights and this tile's q have landed (the tables, dL/dout and the next tile's
    __syncthreads();     // q may still be in flight)

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    const T* qw = qs + (size_t(buf) * ROWS + warp * 16) * ldq;
    for (int k0 = 0; k0 < r; k0 += 16) {
      uint32_t a[4];
      ldsm_x4<false>(a, qw + (lane & 15) * ldq + k0 + (lane >> 4) * 8);
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        uint32_t b[4];  // b[0..1]: n-tile nt, b[2..3]: n-tile nt + 1
        ldsm_x4<true>(b, ws + size_t(k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDW + nt * 8 + (lane >> 4) * 8);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        mma_16816(acc[nt], a, b0, static_cast<T*>(nullptr));
        mma_16816(acc[nt + 1], a, b1, static_cast<T*>(nullptr));
      }
    }
    cp_async_wait<0>();  // the tables (and dL/dout) have landed
    __syncthreads();

    // Epilogue. acc[nt][2*half + e]: row gid + 8*half of the warp's 16, column nt*8 + 2*tig + e.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int rloc = gid + 8 * half;
      const long row = row0 + rloc;
      float ss = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        ss += acc[nt][2 * half] * acc[nt][2 * half] + acc[nt][2 * half + 1] * acc[nt][2 * half + 1];
      ss += __shfl_xor_sync(0xffffffffu, ss, 1);
      ss += __shfl_xor_sync(0xffffffffu, ss, 2);  // the 4 lanes of a quad hold one row
      const float rs = rms_rstd(ss, DH, eps);
      const long t = (row < rows ? row : r_last) / D.Hp;  // a row past the end: any staged token (never stored)
      const T* cr = tabs + (t - t_lo) * DH;
      const T* sr = cr + size_t(max_tok) * DH;
      T* orow = my_os + rloc * LDW;
      float dot = 0.f;
#pragma unroll
      for (int nt = 0; nt < HT; ++nt) {
        const int c = nt * 8 + tig * 2, ch = c + DH / 2;
        const ColPairs p = load_col_pairs(wqs, cr, sr, c, ch);
        if constexpr (!BWD) {
          float lo[2], hi[2];
#pragma unroll
          for (int e = 0; e < 2; ++e)
            rope_pair_fwd(acc[nt][2 * half + e] * rs * p.w_lo[e], acc[nt + HT][2 * half + e] * rs * p.w_hi[e],
                          p.c_lo[e], p.s_lo[e], p.c_hi[e], p.s_hi[e], &lo[e], &hi[e]);
          store_pair(orow + c, lo);
          store_pair(orow + ch, hi);
        } else {  // pass 1: gradients of the norm weight, and the row's dot = sum_c (gn w)[c] u[c]
          float gn_lo[2], gn_hi[2];
          rope_bwd_pairs(p, orow, c, ch, gn_lo, gn_hi);  // dL/dout zero-filled past the last row
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float gnl = gn_lo[e], gnh = gn_hi[e];
            const float ul = acc[nt][2 * half + e], uh = acc[nt + HT][2 * half + e];
            if (GW_REGS) {
              gwq[nt][e] += gnl * ul * rs;
              gwq[nt + HT][e] += gnh * uh * rs;
            } else {  // summed over the 8 lanes of this column pair now, added to the warp's sums in shared memory
              float vl = gnl * ul * rs, vh = gnh * uh * rs;
#pragma unroll
              for (int o = 4; o < 32; o <<= 1) {
                vl += __shfl_xor_sync(0xffffffffu, vl, o);
                vh += __shfl_xor_sync(0xffffffffu, vh, o);
              }
              if (gid == 0) {
                my_gw[c + e] += vl;
                my_gw[ch + e] += vh;
              }
            }
            dot += gnl * p.w_lo[e] * ul + gnh * p.w_hi[e] * uh;
          }
        }
      }
      if constexpr (BWD) {  // pass 2: dL/du, written over dL/dout (each thread rewrites only the pairs it read)
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
#pragma unroll
        for (int nt = 0; nt < HT; ++nt) {
          const int c = nt * 8 + tig * 2, ch = c + DH / 2;
          const ColPairs p = load_col_pairs(wqs, cr, sr, c, ch);
          float gn_lo[2], gn_hi[2], xl[2], xh[2];
          rope_bwd_pairs(p, orow, c, ch, gn_lo, gn_hi);
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            xl[e] = rms_input_grad(gn_lo[e] * p.w_lo[e], acc[nt][2 * half + e], rs, dot / float(DH));
            xh[e] = rms_input_grad(gn_hi[e] * p.w_hi[e], acc[nt + HT][2 * half + e], rs, dot / float(DH));
          }
          store_pair(orow + c, xl);
          store_pair(orow + ch, xh);
        }
      }
    }
    __syncwarp();  // the warp's 16 staged rows are complete: 16-byte stores, 8 columns per lane per step
    for (int v = lane; v < 16 * (DH / 8); v += 32) {
      const int rr = v / (DH / 8), c = (v % (DH / 8)) * 8;
      const long row = row0 + rr;
      if (row >= rows) continue;
      const long t = row / D.Hp, i = row % D.Hp;
      T* dst = BWD ? qo_or_gu + (row * D.Hkv + g) * DH + c : qo_or_gu + D.out_off(t, g * D.Hp + i, heads) + c;
      copy16(dst, my_os + rr * LDW + c);
    }
    // key rows (t, g) of the tokens whose first query row is in this tile, tables still in shared memory
    key_rows<T, DH, BWD>(kin, wks, tabs, max_tok * DH, t_lo, (r_first + D.Hp - 1) / D.Hp,
                         (r_last + 1 + D.Hp - 1) / D.Hp, g, gko, ko_or_gk, my_gw + DH, D, eps);
    if (stages == 1 && next < n_tiles) {
      __syncthreads();  // every warp is done with the single q buffer
      stage_q(next, 0);
      cp_async_commit();
    }
    __syncthreads();  // q buffer, tables and output staging free for the next tile
  }
  cp_async_wait<0>();  // nothing in flight into shared memory (a CTA without q tiles still staged W)

  if constexpr (BWD) {  // block sums of the norm-weight gradients, in a fixed order: lanes, then warps
    if (GW_REGS) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = gwq[nt][e];
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          v += __shfl_xor_sync(0xffffffffu, v, 8);
          v += __shfl_xor_sync(0xffffffffu, v, 16);  // the 8 lanes of one tig
          if (gid == 0) my_gw[nt * 8 + tig * 2 + e] = v;
        }
    }
    __syncthreads();
    float* part = gw_part + (long(blockIdx.y) * gridDim.x + blockIdx.x) * 2 * DH;
    for (int c = tid; c < 2 * DH; c += blockDim.x) {
      float s = 0.f;
      for (int w2 = 0; w2 < kTcWarps; ++w2) s += gw_acc[w2 * 2 * DH + c];
      part[c] = s;
    }
  }
}

// ---- C = A B on tensor cores (bf16 / fp16 in, fp32 accumulation): the dq and dW GEMMs of the backward.
// An operand is addressed as (outer, inner) with `inner` its contiguous index: A is (m, k) when A_K (k contiguous)
// and (k, m) otherwise; B is (n, k) when B_K and (k, n) otherwise. Inner indices split into groups of 2^grp_shift,
// each group grp_stride elements on (dq's B = W: K runs over (g, c), and W[g] are r x d apart).
template <typename T>
struct Opnd {
  const T* p;
  long ld;
  int grp_shift;
  long grp_stride;
  __device__ const T* at(long outer, long inner) const {
    return p + (inner >> grp_shift) * grp_stride + outer * ld + (inner & ((1L << grp_shift) - 1));
  }
};
constexpr int kGM = 64, kGN = 64, kGK = 32;  // CTA tile; 4 warps of 32 x 32; K in steps of 32, double-buffered
constexpr int kGTile = 64 * (kGK + kSmemPad);  // elements of one staged operand tile (either orientation fits)

// Stage an operand tile: rows of 16-byte chunks along the contiguous index; chunks past the ends zero-filled.
// K_INNER: (64 outer-mn x 32 k) stored [mn][k]; else (32 k x 64 mn) stored [k][mn]. n_mn % 8 == 0 when !K_INNER and
// k_end % 8 == 0 when K_INNER (so a chunk is all in or all out).
template <typename T, bool K_INNER>
__device__ __forceinline__ void stage_operand(T* s, const Opnd<T>& op, long mn0, long n_mn, long k0, long k_end) {
  for (int v = threadIdx.x; v < 256; v += blockDim.x) {
    if (K_INNER) {
      const int o = v / 4, kc = (v % 4) * 8;
      const bool ok = mn0 + o < n_mn && k0 + kc < k_end;
      cp_async16(s + o * (kGK + kSmemPad) + kc, ok ? op.at(mn0 + o, k0 + kc) : op.p, ok);
    } else {
      const int kk = v / 8, oc = (v % 8) * 8;
      const bool ok = k0 + kk < k_end && mn0 + oc < n_mn;
      cp_async16(s + kk * (kGM + kSmemPad) + oc, ok ? op.at(k0 + kk, mn0 + oc) : op.p, ok);
    }
  }
}

// grid: x = M tiles x batches x N tiles (N tiles fastest, then batches: the CTAs that share an A tile run side by
// side, and L2 serves its repeats), z = K splits (K range [z * k_split, min(K, (z + 1) * k_split))).
// Batch b reads B at B.p + b * b_batch; split z and batch b write out + z * out_split + b * out_batch, (M x N, row
// stride N), in 16-byte stores through shared memory. O: T (the gradient itself) or float (a partial).
template <typename T, bool A_K, bool B_K, typename O>
__global__ void __launch_bounds__(128) gemm_tc(Opnd<T> A, Opnd<T> B, O* out, long M, long N, long K, long k_split,
                                               long batches, long b_batch, long out_batch, long out_split) {
  VHA_DYNAMIC_SHARED(smem_raw);
  T* sm = reinterpret_cast<T*>(smem_raw);  // [2 stages][A tile, B tile]
  const long n_tn = (N + kGN - 1) / kGN, per_m = n_tn * batches, bx = blockIdx.x;
  const long batch = (bx % per_m) / n_tn;
  const long m0 = (bx / per_m) * kGM, n0 = (bx % n_tn) * kGN;
  const long kb = long(blockIdx.z) * k_split, ke = min(K, kb + k_split);
  B.p += batch * b_batch;
  out += blockIdx.z * out_split + batch * out_batch;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane >> 2, tig = lane & 3;
  const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  const int nk = int((ke - kb + kGK - 1) / kGK);
  auto stage = [&](int kt, int buf) {
    stage_operand<T, A_K>(sm + buf * 2 * kGTile, A, m0, M, kb + long(kt) * kGK, ke);
    stage_operand<T, B_K>(sm + buf * 2 * kGTile + kGTile, B, n0, N, kb + long(kt) * kGK, ke);
  };
  if (nk > 0) stage(0, 0);
  cp_async_commit();
  for (int kt = 0; kt < nk; ++kt) {
    if (kt + 1 < nk) stage(kt + 1, (kt + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();  // tile kt has landed
    __syncthreads();
    const T* as = sm + (kt & 1) * 2 * kGTile;
    const T* bs = as + kGTile;
#pragma unroll
    for (int kk = 0; kk < kGK; kk += 16) {
      uint32_t a[2][4], b[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int mm = wm + 16 * i;
        if (A_K)
          ldsm_x4<false>(a[i], as + (mm + (lane & 15)) * (kGK + kSmemPad) + kk + (lane >> 4) * 8);
        else
          ldsm_x4<true>(a[i], as + (kk + (lane & 7) + (lane >> 4) * 8) * (kGM + kSmemPad) + mm + ((lane >> 3) & 1) * 8);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // n-tiles 2j and 2j + 1 of the warp's four
        const int nn = wn + 16 * j;
        if (B_K)
          ldsm_x4<false>(b[j], bs + (nn + (lane & 7) + (lane >> 4) * 8) * (kGK + kSmemPad) + kk + ((lane >> 3) & 1) * 8);
        else
          ldsm_x4<true>(b[j], bs + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * (kGN + kSmemPad) + nn + (lane >> 4) * 8);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t bb[2] = {b[j / 2][2 * (j % 2)], b[j / 2][2 * (j % 2) + 1]};
          mma_16816(acc[i][j], a[i], bb, static_cast<T*>(nullptr));
        }
    }
    __syncthreads();  // the buffer is restaged by the next iteration
  }

  // Epilogue through shared memory (the staging buffers are free): then 16-byte row-contiguous stores.
  cp_async_wait<0>();
  constexpr int LDC = kGN + 16 / int(sizeof(O));
  O* cs = reinterpret_cast<O*>(smem_raw);  // [64][LDC]
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        cs[(wm + 16 * i + gid + 8 * (e >> 1)) * LDC + wn + 8 * j + 2 * tig + (e & 1)] = from_c<O>(acc[i][j][e]);
  __syncthreads();
  constexpr int V = 16 / int(sizeof(O));  // elements per 16-byte store
  for (int v = threadIdx.x; v < kGM * (kGN / V); v += blockDim.x) {
    const int rr = v / (kGN / V), cc = (v % (kGN / V)) * V;
    if (m0 + rr < M && n0 + cc < N) copy16(out + (m0 + rr) * N + n0 + cc, cs + rr * LDC + cc);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Backward pass 1: one warp per task as in fwd_simt. q tasks write dL/du (fp32/fp64 workspace GU, layout
// [rows, Hkv, d]); k tasks write dk. Norm-weight gradients: each warp sums its own in shared memory (a lane owns its
// columns: no atomics), the block adds its warps in order and writes one partial per block (gw_part, [grid, 2d]);
// sum_parts adds the blocks in a fixed order. Deterministic: no floating-point atomics anywhere in the backward.
template <typename T>
__global__ void bwd_rows(const T* qp, const T* kin, const T* W, const T* wq, const T* wk, const T* cosp,
                         const T* sinp, const T* gqo, const T* gko, T* gk, typename Acc<T>::type* GU,
                         typename Acc<T>::type* gw_part, Dims D, typename Acc<T>::type eps) {
  using C = typename Acc<T>::type;
  VHA_DYNAMIC_SHARED(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wpb = blockDim.x / 32;
  C* gw_warps = reinterpret_cast<C*>(smem_raw);  // [wpb, 2d]: per-warp sums for q_norm and k_norm weights
  C* gw_blk = gw_warps + warp * 2 * D.d;
  C* buf = gw_warps + wpb * 2 * D.d + warp * (D.r + 2 * D.d);
  C* qrow = buf;
  C* u = buf + D.r;
  C* gx = u + D.d;
  for (long c = lane; c < 2 * D.d; c += 32) gw_blk[c] = 0;
  __syncwarp();
  const long q_tasks = D.rows() * D.Hkv, n_tasks = q_tasks + D.tokens() * D.Hkv;
  const int d = int(D.d), h = d / 2;
  for (long task = long(blockIdx.x) * wpb + warp; task < n_tasks; task += long(gridDim.x) * wpb) {
    const bool is_q = task < q_tasks;
    long t, out_off;
    const T* w;
    C* gw;
    if (is_q) {
      const long row = task / D.Hkv, g = task % D.Hkv, i = row % D.Hp;
      t = row / D.Hp;
      for (long k = lane; k < D.r; k += 32) qrow[k] = to_c(qp[row * D.r + k]);
      __syncwarp();
      const T* Wg = W + g * D.r * D.d;
      for (int c = lane; c < d; c += 32) {
        C acc = 0;
        for (long k = 0; k < D.r; ++k) acc += qrow[k] * C(to_c(Wg[k * D.d + c]));
        u[c] = acc;
      }
      out_off = D.out_off(t, g * D.Hp + i, D.Hp * D.Hkv);
      w = wq;
      gw = gw_blk;
    } else {
      const long kt = task - q_tasks, g = kt % D.Hkv;
      t = kt / D.Hkv;
      for (int c = lane; c < d; c += 32) u[c] = to_c(kin[kt * D.d + c]);
      out_off = D.out_off(t, g, D.Hkv);
      w = wk;
      gw = gw_blk + d;
      if (gko == nullptr) {  // k output did not reach the loss
        for (int c = lane; c < d; c += 32) gk[kt * D.d + c] = from_c<T>(C(0));
        __syncwarp();
        continue;
      }
    }
    __syncwarp();
    const T* g_out = (is_q ? gqo : gko) + out_off;
    const T* cr = cosp + D.table_off(t);
    const T* sr = sinp + D.table_off(t);
    C ss = 0;
    for (int c = lane; c < d; c += 32) ss += u[c] * u[c];
    const C rs = rms_rstd(warp_sum(ss), d, eps);
    C dot = 0;
    for (int c = lane; c < h; c += 32) {
      C gl, gh;
      rope_pair_bwd(C(to_c(g_out[c])), C(to_c(g_out[c + h])), C(to_c(cr[c])), C(to_c(sr[c])), C(to_c(cr[c + h])),
                    C(to_c(sr[c + h])), &gl, &gh);
      gw[c] += gl * u[c] * rs;  // column c belongs to this lane of this warp
      gw[c + h] += gh * u[c + h] * rs;
      const C tl = gl * C(to_c(w[c])), th = gh * C(to_c(w[c + h]));
      gx[c] = tl;
      gx[c + h] = th;
      dot += tl * u[c] + th * u[c + h];
    }
    const C dd = warp_sum(dot) / C(d);
    __syncwarp();
    for (int c = lane; c < d; c += 32) {
      const C v = rms_input_grad(gx[c], u[c], rs, dd);
      if (is_q)
        GU[task * D.d + c] = v;  // task = row*Hkv + g
      else
        gk[(task - q_tasks) * D.d + c] = from_c<T>(v);
    }
    __syncwarp();
  }
  __syncthreads();
  for (long c = threadIdx.x; c < 2 * D.d; c += blockDim.x) {
    C sum = 0;
    for (int w2 = 0; w2 < wpb; ++w2) sum += gw_warps[w2 * 2 * D.d + c];
    gw_part[blockIdx.x * 2 * D.d + c] = sum;
  }
}

// Backward pass 2: dq_phys[row, k] = sum_g sum_c GU[row, g, c] W[g, k, c]; one warp per row.
template <typename T>
__global__ void bwd_dq(const T* W, const typename Acc<T>::type* GU, T* gqp, Dims D) {
  using C = typename Acc<T>::type;
  VHA_DYNAMIC_SHARED(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wpb = blockDim.x / 32;
  C* gu = reinterpret_cast<C*>(smem_raw) + warp * D.Hkv * D.d;
  for (long row = long(blockIdx.x) * wpb + warp; row < D.rows(); row += long(gridDim.x) * wpb) {
    for (long c = lane; c < D.Hkv * D.d; c += 32) gu[c] = GU[row * D.Hkv * D.d + c];
    __syncwarp();
    for (long k = lane; k < D.r; k += 32) {
      C acc = 0;
      for (long g = 0; g < D.Hkv; ++g) {
        const T* wrow = W + (g * D.r + k) * D.d;
        for (long c = 0; c < D.d; ++c) acc += gu[g * D.d + c] * C(to_c(wrow[c]));
      }
      gqp[row * D.r + k] = from_c<T>(acc);
    }
    __syncwarp();
  }
}

// Backward pass 3: dW[g] (r x d) = q_phys^T (r x rows) GU[:, g, :] (rows x d), 32 x 32 output tiles, rows split
// into chunks across blockIdx.z; each chunk writes its partial (gW_part, [chunks, Hkv, r, d]) and sum_parts adds the
// chunks in a fixed order. Within a chunk every 32-row tile is summed in fresh registers and then added, so the
// sequential part of the sum is chunk / 32 terms long, not chunk.
constexpr int kTile = 32, kRowsChunk = 1024, kMaxChunks = 256;
inline long dw_rows_per_chunk(const Dims& D) {  // at least kRowsChunk; at most kMaxChunks chunks
  long per = (D.rows() + kMaxChunks - 1) / kMaxChunks;
  per = (per + kTile - 1) / kTile * kTile;
  return per > kRowsChunk ? per : kRowsChunk;
}
inline long dw_chunks(const Dims& D) { return (D.rows() + dw_rows_per_chunk(D) - 1) / dw_rows_per_chunk(D); }
template <typename T>
__global__ void bwd_dw(const T* qp, const typename Acc<T>::type* GU, typename Acc<T>::type* gW_part, Dims D,
                       long rows_per_chunk) {
  using C = typename Acc<T>::type;
  __shared__ C sa[kTile][kTile + 1];  // [row][k]
  __shared__ C sb[kTile][kTile + 1];  // [row][c]
  const long g = blockIdx.y / ((D.r + kTile - 1) / kTile);
  const long k0 = (blockIdx.y % ((D.r + kTile - 1) / kTile)) * kTile;
  const long c0 = long(blockIdx.x) * kTile;
  const long rbeg = long(blockIdx.z) * rows_per_chunk, rend = min(D.rows(), rbeg + rows_per_chunk);
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;  // 32 x 8 threads, 4 outputs each
  C acc[4] = {0, 0, 0, 0};
  for (long rb = rbeg; rb < rend; rb += kTile) {
    for (int j = ty; j < kTile; j += blockDim.x / kTile) {
      const long row = rb + j;
      sa[j][tx] = (row < rend && k0 + tx < D.r) ? C(to_c(qp[row * D.r + k0 + tx])) : C(0);
      sb[j][tx] = (row < rend && c0 + tx < D.d) ? GU[(row * D.Hkv + g) * D.d + c0 + tx] : C(0);
    }
    __syncthreads();
    C tile[4] = {0, 0, 0, 0};
#pragma unroll 4
    for (int j = 0; j < kTile; ++j) {
      const C b = sb[j][tx];
#pragma unroll
      for (int q = 0; q < 4; ++q) tile[q] += sa[j][ty + q * 8] * b;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[q] += tile[q];
    __syncthreads();
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const long k = k0 + ty + q * 8, c = c0 + tx;
    if (k < D.r && c < D.d) gW_part[((long(blockIdx.z) * D.Hkv + g) * D.r + k) * D.d + c] = acc[q];
  }
}

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

// ---------------------------------------------------------------------------------------------------------------
// Host launchers (return cudaError_t). T: float, double, __nv_bfloat16 or __half.

// Dynamic shared memory above the 48 KB default needs an opt-in per kernel (and fails where the device has less).
template <typename K>
inline cudaError_t allow_smem(K* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

inline int grid_for(long tasks, int per_block, int cap = 65535 * 4) {
  long g = (tasks + per_block - 1) / per_block;
  return int(g < 1 ? 1 : (g > cap ? cap : g));
}

inline int device_attr(cudaDeviceAttr attr, int fallback) {  // of the current device
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) return fallback;
  return v;
}

constexpr int kMaxQtcBlocks = 1024;  // q_tc grid cap: one norm-weight partial per block in the workspace
constexpr int kQtcStagesMax = 2;

// The tensor-core path: bf16 / fp16 (mma.sync m16n8k16 needs sm_80), d in {64, 128, 256}, r % 16 == 0, every pointer
// 16-byte aligned (cp.async, 16-byte vectors) and W[g] plus one q tile within the device's shared memory.
template <typename T>
inline bool tc_eligible(const Dims& D, std::initializer_list<const void*> ptrs) {
  if (!(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value)) return false;
  if (!(D.d == 64 || D.d == 128 || D.d == 256) || D.r % 16 != 0 || D.r < 16) return false;
  if (device_attr(cudaDevAttrComputeCapabilityMajor, 0) < 8) return false;
  for (const void* p : ptrs)
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return q_tc_smem(D.r, int(D.d), 1, D.Hp) <= size_t(device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024));
}

// q_tc: persistent grid (x: 64-row tiles, y: group) sized to the CTAs the SMs hold; two q stages where they fit.
template <typename T, int DH, bool BWD>
inline cudaError_t launch_q_tc(const T* qp, const T* kin, const T* W, const T* wq, const T* wk, const T* cosp,
                               const T* sinp, const T* gqo, const T* gko, T* qo_or_gu, T* ko_or_gk, float* gw_part,
                               const Dims& D, float eps, cudaStream_t st, int* blocks) {
  const size_t optin = size_t(device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024));
  const int stages = q_tc_smem(D.r, DH, kQtcStagesMax, D.Hp) <= optin ? kQtcStagesMax : 1;
  const size_t smem = q_tc_smem(D.r, DH, stages, D.Hp);
  cudaError_t e = allow_smem(q_tc<T, DH, BWD>, smem);
  if (e != cudaSuccess) return e;
  const long sms = device_attr(cudaDevAttrMultiProcessorCount, 1);
  const long per_sm = long(optin / smem) < 1 ? 1 : long(optin / smem);
  const long tiles = (D.rows() + kTcRows - 1) / kTcRows;
  long x = (sms * per_sm + D.Hkv - 1) / D.Hkv;
  if (x > tiles) x = tiles;
  if (x > kMaxQtcBlocks / D.Hkv) x = kMaxQtcBlocks / D.Hkv;
  if (x < 1) x = 1;  // an empty batch still normalises no keys: one CTA per group, no tiles
  *blocks = int(x * D.Hkv);
  VHA_LAUNCH(dim3(unsigned(x), unsigned(D.Hkv)), kTcWarps * 32, smem, st, q_tc<T, DH, BWD>)(
      qp, kin, W, wq, wk, cosp, sinp, gqo, gko, qo_or_gu, ko_or_gk, gw_part, D, eps, stages);
  return cudaGetLastError();
}

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
