// Tensor-core GEMM of the backward (gemm_tc: C = A B, bf16 / fp16 in, fp32 accumulation): dq = dL/du W^T and the
// per-chunk dW partials q_phys^T dL/du, with cp.async double buffering, ldmatrix(.trans) and 16-byte stores.
#pragma once

#include "tc_primitives.cuh"

namespace vha {
namespace gpu {

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

}  // namespace gpu
}  // namespace vha
