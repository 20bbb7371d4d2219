// Shared host/device math of the fused VHA prologue: Premix -> RMSNorm (q_norm / k_norm) -> rotate-half RoPE.
//
// Notation (docs/method.md): virtual head j = g*H_p + i is physical head i of a token seen through Premix
// group g: u = q_phys[i] @ W[g] (r -> d). Per row x of width d (a virtual query u or a key):
//   rstd  = 1 / sqrt(mean(x^2) + eps)
//   n[c]  = x[c] * rstd * w[c]                                (RMSNorm, Qwen3: weight after normalising)
//   out[c]     = n[c] * cos[c]     - n[c+h] * sin[c]          (c < h = d/2: rotate_half gives -x2 first)
//   out[c+h]   = n[c+h] * cos[c+h] + n[c]   * sin[c+h]
// Backward of the same row, given g = dL/dout:
//   gn[c]   = g[c] * cos[c] + g[c+h] * sin[c+h]               (RoPE is linear; its adjoint)
//   gn[c+h] = g[c+h] * cos[c+h] - g[c] * sin[c]
//   gw[c]  += gn[c] * x[c] * rstd                             (norm weight)
//   t[c]    = gn[c] * w[c],  dot = sum_c t[c] x[c]
//   gx[c]   = rstd * (t[c] - x[c] * rstd^2 * dot / d)          (RMSNorm input)
// Premix backward: gq_phys[i] += gu[g,i] @ W[g]^T and gW[g] += q_phys[i]^T gu[g,i].
//
// Everything here is inline, dependency-free and callable from host C++ and CUDA device code.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define VHA_HD __host__ __device__ __forceinline__
#else
#define VHA_HD inline
#endif

namespace vha {

// ---- scalar math on one row element (C: float or double compute type) ----

template <typename C>
VHA_HD C rms_rstd(C sum_sq, int d, C eps) {
  return C(1) / std::sqrt(sum_sq / C(d) + eps);
}

// Forward RoPE on the pair (lo = n[c], hi = n[c+h]) with the table entries at c and c+h.
template <typename C>
VHA_HD void rope_pair_fwd(C lo, C hi, C cos_lo, C sin_lo, C cos_hi, C sin_hi, C* out_lo, C* out_hi) {
  *out_lo = lo * cos_lo - hi * sin_lo;
  *out_hi = hi * cos_hi + lo * sin_hi;
}

// Adjoint of rope_pair_fwd: gradient of the normalised row from the output gradient.
template <typename C>
VHA_HD void rope_pair_bwd(C g_lo, C g_hi, C cos_lo, C sin_lo, C cos_hi, C sin_hi, C* gn_lo, C* gn_hi) {
  *gn_lo = g_lo * cos_lo + g_hi * sin_hi;
  *gn_hi = g_hi * cos_hi - g_lo * sin_lo;
}

// RMSNorm input gradient for one element: t = gn * w, dot_over_d = sum(t * x) / d.
template <typename C>
VHA_HD C rms_input_grad(C t, C x, C rstd, C dot_over_d) {
  return rstd * (t - x * (rstd * rstd) * dot_over_d);
}

// ---- 16-bit float bit conversions (round to nearest even), used where no framework type is present ----

VHA_HD float bf16_bits_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

VHA_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t(0x7fc0);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

}  // namespace vha
