// SIMT backward (fp32 / fp64, other shapes, below sm_80): bwd_rows (dL/du, dk, norm-weight partials per block),
// bwd_dq (one warp per row) and bwd_dw (shared-memory tiles, one dW partial per row chunk).
#pragma once

#include "device_common.cuh"

namespace vha {
namespace gpu {

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

}  // namespace gpu
}  // namespace vha
