// Tensor-core prologue kernel q_tc<T, DH, BWD> (bf16 / fp16, d = DH in {64, 128, 256}, r % 16 == 0), forward and
// backward in one template: Premix on mma.sync, RMSNorm + RoPE (or their adjoints) in registers, the key rows of the
// tile's tokens (key_rows), and its shared-memory size (q_tc_smem), which the launcher needs.
#pragma once

#include "tc_primitives.cuh"

namespace vha {
namespace gpu {

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

}  // namespace gpu
}  // namespace vha
