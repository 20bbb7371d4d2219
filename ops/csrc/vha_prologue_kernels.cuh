// CUDA kernels of the fused VHA prologue (see vha_prologue_math.h for the math and vha_prologue_cpu.cc for the
// operator contract). Framework-free: included by the Paddle op glue (vha_prologue_cuda.cu) and by the extern "C"
// launcher (vha_prologue_launcher.cu) used for checks on machines without Paddle.
//
// STATUS: compiled for sm_80 / sm_90 here, never run on a GPU by this project (docs/prologue.md).
//
// Forward
//   bf16 / fp16 with d in {64, 128, 256} and r % 16 == 0: tensor cores. A CTA of 4 warps owns 64 rows of
//     q_phys ([rows = B*S*H_p, r]) and one Premix group g; W[g] is staged transposed in shared memory; each
//     warp forms its 16 x d product with mma.sync m16n8k16 (fp32 accumulation) straight from global q_phys,
//     and normalises + rotates it in registers: in the m16n8 accumulator layout a thread holds columns
//     c and c + d/2 of the same row, so RoPE is thread-local and the row norm is a 4-lane shuffle reduction.
//   other dtypes / shapes: one warp per (row, group), products in fp32 (fp64 for fp64).
//   keys: one warp per (token, KV head).
// Backward (SIMT, all dtypes): one pass recomputes u = q_phys W[g], writes dL/du (fp32 workspace) and the
//   key gradients, writing per-block partials of the norm-weight gradients; then dq_phys = sum_g dL/du W[g]^T (one
//   warp per row) and dW[g] = q_phys^T dL/du (shared-memory tiled, one partial per row chunk); sum_parts adds the
//   partials in a fixed order and casts to the parameter dtype. No floating-point atomics: bitwise deterministic.
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

// Two adjacent 16-bit values (4-byte aligned: an even column of a row whose length is even) as one 32-bit access.
template <typename T>
__device__ __forceinline__ void load_pair(const T* p, float (&x)[2]) {
  static_assert(sizeof(T) == 2, "16-bit types only");
  const uint32_t u = *reinterpret_cast<const uint32_t*>(p);
  const uint16_t h[2] = {uint16_t(u & 0xffffu), uint16_t(u >> 16)};
  T v[2];
  memcpy(v, h, 4);
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

constexpr int kTcWarps = 4;            // 64 rows per CTA
constexpr int kSmemPad = 8;            // elements of padding per staged W^T row (bank-conflict avoidance)

// Requires rows of q_phys 4-byte aligned pairs: r even (r % 16 == 0 checked by the launcher).
template <typename T, int DH>
__global__ void __launch_bounds__(kTcWarps * 32) fwd_q_tc(const T* qp, const T* W, const T* wq, const T* cosp,
                                                          const T* sinp, T* qo, Dims D, float eps) {
  VHA_DYNAMIC_SHARED(smem_raw);
  T* wt = reinterpret_cast<T*>(smem_raw);  // (DH, r + pad): W[g]^T, so B fragments read k-pairs contiguously
  const int r = int(D.r), ldw = r + kSmemPad;
  const long g = blockIdx.y;
  const T* Wg = W + g * D.r * DH;
  for (int v = threadIdx.x; v < r * DH / 8; v += blockDim.x) {
    const int idx = v * 8, k = idx / DH, n0 = idx % DH;  // columns n0 .. n0+7 of row k: one 16-byte global load
    const uint4 q = *reinterpret_cast<const uint4*>(Wg + idx);
    T vals[8];
    memcpy(vals, &q, 16);
#pragma unroll
    for (int j = 0; j < 8; ++j) wt[(n0 + j) * ldw + k] = vals[j];
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane >> 2, tig = lane & 3;
  const long rows = D.rows(), n_tiles = (rows + 16 * kTcWarps - 1) / (16 * kTcWarps);
  // persistent CTAs: W[g] is staged once and reused over many 64-row tiles
  for (long tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    const long row0 = (tile * kTcWarps + warp) * 16;
    if (row0 >= rows) continue;
    const long ra = row0 + gid, rb = row0 + gid + 8;  // this thread's two rows
    const bool va = ra < rows, vb = rb < rows;
    const uint32_t* qa = reinterpret_cast<const uint32_t*>(qp + (va ? ra : 0) * D.r);
    const uint32_t* qb = reinterpret_cast<const uint32_t*>(qp + (vb ? rb : 0) * D.r);

    constexpr int NT = DH / 8;  // n-tiles of 8 columns
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;

    for (int k0 = 0; k0 < r; k0 += 16) {
      uint32_t a[4];
      const int ka = (k0 + tig * 2) / 2;  // in 32-bit words (pairs)
      a[0] = va ? qa[ka] : 0u;
      a[1] = vb ? qb[ka] : 0u;
      a[2] = va ? qa[ka + 4] : 0u;
      a[3] = vb ? qb[ka + 4] : 0u;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const T* bcol = wt + (nt * 8 + gid) * ldw + k0 + tig * 2;
        uint32_t b[2];
        b[0] = *reinterpret_cast<const uint32_t*>(bcol);
        b[1] = *reinterpret_cast<const uint32_t*>(bcol + 8);
        mma_16816(acc[nt], a, b, static_cast<T*>(nullptr));
      }
    }

    // Epilogue. acc[nt][0..1]: row ra, columns nt*8 + tig*2 + {0,1}; acc[nt][2..3]: row rb, same columns.
    constexpr int HT = NT / 2;  // column c in tile nt has its RoPE partner c + DH/2 in tile nt + HT
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const long row = half ? rb : ra;
      float ss = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        ss += acc[nt][2 * half] * acc[nt][2 * half] + acc[nt][2 * half + 1] * acc[nt][2 * half + 1];
      ss += __shfl_xor_sync(0xffffffffu, ss, 1);
      ss += __shfl_xor_sync(0xffffffffu, ss, 2);  // the 4 lanes of a quad hold one row
      if (!(half ? vb : va)) continue;
      const float rs = rms_rstd(ss, DH, eps);
      const long t = row / D.Hp, i = row % D.Hp;
      const T* cr = cosp + D.table_off(t);
      const T* sr = sinp + D.table_off(t);
      T* out = qo + D.out_off(t, g * D.Hp + i, D.Hp * D.Hkv);
#pragma unroll
      for (int nt = 0; nt < HT; ++nt) {
        // this thread's columns c, c + 1 and their RoPE partners: every table and output access is one 32-bit pair
        const int c = nt * 8 + tig * 2, ch = c + DH / 2;
        float w_lo[2], w_hi[2], c_lo[2], s_lo[2], c_hi[2], s_hi[2], lo[2], hi[2];
        load_pair(wq + c, w_lo);
        load_pair(wq + ch, w_hi);
        load_pair(cr + c, c_lo);
        load_pair(sr + c, s_lo);
        load_pair(cr + ch, c_hi);
        load_pair(sr + ch, s_hi);
#pragma unroll
        for (int e = 0; e < 2; ++e)
          rope_pair_fwd(acc[nt][2 * half + e] * rs * w_lo[e], acc[nt + HT][2 * half + e] * rs * w_hi[e], c_lo[e],
                        s_lo[e], c_hi[e], s_hi[e], &lo[e], &hi[e]);
        store_pair(out + c, lo);
        store_pair(out + ch, hi);
      }
    }
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

inline int device_major() {  // compute capability of the current device (0 if it cannot be read)
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return 0;
  return major;
}

template <typename T>
inline bool tc_eligible(const Dims& D) {
  return false;
}
template <>
inline bool tc_eligible<__nv_bfloat16>(const Dims& D) {  // mma.sync m16n8k16 with bf16 / f16 needs sm_80
  return (D.d == 64 || D.d == 128 || D.d == 256) && D.r % 16 == 0 && device_major() >= 8;
}
template <>
inline bool tc_eligible<__half>(const Dims& D) {
  return tc_eligible<__nv_bfloat16>(D);
}

template <typename T, int DH>
inline cudaError_t launch_fwd_q_tc(const T* qp, const T* W, const T* wq, const T* cosp, const T* sinp, T* qo,
                                   const Dims& D, float eps, cudaStream_t st) {
  const size_t smem = size_t(DH) * (D.r + kSmemPad) * sizeof(T);
  cudaError_t e = cudaFuncSetAttribute(fwd_q_tc<T, DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  int dev = 0, sms = 132;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const long tiles = (D.rows() + 16 * kTcWarps - 1) / (16 * kTcWarps);
  const long per_group = (4L * sms + D.Hkv - 1) / D.Hkv;  // ~4 CTAs per SM in all
  dim3 grid(unsigned(tiles < per_group ? tiles : per_group), unsigned(D.Hkv));
  VHA_LAUNCH(grid, kTcWarps * 32, smem, st, fwd_q_tc<T, DH>)(qp, W, wq, cosp, sinp, qo, D, eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_forward(const T* qp, const T* kin, const T* W, const T* wq, const T* wk, const T* cosp,
                           const T* sinp, T* qo, T* ko, const Dims& D, float eps, cudaStream_t st) {
  using C = typename Acc<T>::type;
  const int threads = 128, wpb = threads / 32;
  const long q_tasks = D.rows() * D.Hkv, k_tasks = D.tokens() * D.Hkv;
  const size_t smem = size_t(wpb) * (D.r + D.d) * sizeof(C);
  long first = 0, n = q_tasks + k_tasks;
  if constexpr (std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value) {
    if (tc_eligible<T>(D) && D.rows() > 0) {
      cudaError_t e = cudaSuccess;
      if (D.d == 64) e = launch_fwd_q_tc<T, 64>(qp, W, wq, cosp, sinp, qo, D, eps, st);
      if (D.d == 128) e = launch_fwd_q_tc<T, 128>(qp, W, wq, cosp, sinp, qo, D, eps, st);
      if (D.d == 256) e = launch_fwd_q_tc<T, 256>(qp, W, wq, cosp, sinp, qo, D, eps, st);
      if (e != cudaSuccess) return e;
      first = q_tasks;  // the SIMT kernel then does the keys only
      n = k_tasks;
    }
  }
  if (n > 0) {
    cudaError_t e = allow_smem(fwd_simt<T>, smem);
    if (e != cudaSuccess) return e;
    VHA_LAUNCH(grid_for(n, wpb), threads, smem, st, fwd_simt<T>)(qp, kin, W, wq, wk, cosp, sinp, qo, ko, D, C(eps), first, n);
  }
  return cudaGetLastError();
}

// Backward grid of bwd_rows (one partial of the norm-weight gradients per block).
inline int rows_grid(const Dims& D) { return grid_for((D.rows() + D.tokens()) * D.Hkv, 4 * 8, 1024); }

// Workspace (bytes, 256-aligned pieces, compute type): GU [rows*Hkv*d], gW_part [chunks*Hkv*r*d], gw_part [grid*2d].
template <typename T>
size_t backward_workspace_bytes(const Dims& D) {
  using C = typename Acc<T>::type;
  auto al = [](size_t b) { return (b + 255) / 256 * 256; };
  return al(D.rows() * D.Hkv * D.d * sizeof(C)) + al(dw_chunks(D) * D.Hkv * D.r * D.d * sizeof(C)) +
         al(size_t(rows_grid(D)) * 2 * D.d * sizeof(C));
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
