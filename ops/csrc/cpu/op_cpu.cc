// CPU entries of the fused VHA prologue (Premix -> q_norm / k_norm -> rotate-half RoPE): the per-ISA copies of the
// kernels, the CPUID dispatch, the variant report, and the Paddle-facing forward / backward (prologue_op.h) that
// register_op.cc routes CPU tensors to. The per-element math lives in ../prologue_math.h, shared with the CUDA kernels.
//
// CPU design: the rows of QPhys ([B*S*H_p, r]) are processed in blocks of ~32 rows per thread. For each
// block and group the Premix product is formed in an L1/L2-resident scratch by a register-tiled kernel
// (GCC vector extensions, a tile sized per instruction set: cpu_kernels.inc, compiled for the
// x86-64 baseline, AVX2 and AVX-512 and picked at run time by CPUID), normalised and rotated there, and written
// once. Backward recomputes the Premix product instead of saving it (so nothing but the inputs is kept),
// and fuses RoPE adjoint, RMSNorm backward and both Premix gradient products in the same pass; the weight
// gradients are accumulated per thread and reduced at the end. Compute type: float (fp32 / bf16 / fp16
// inputs, one rounding at the output) or double (fp64 inputs).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "paddle/extension.h"
#include "../prologue_math.h"
#include "../prologue_op.h"
#include "cpu_common.h"

// ---- the kernels, once per instruction set (cpu_kernels.inc) ----
// The translation unit is compiled for the portable x86-64 baseline (ops/build.py: -march=x86-64, no
// -march=native); the AVX2 and AVX-512 copies get their instructions from `#pragma GCC target` regions and run
// only after a CPUID check (select_isa), so the library loads and runs on any x86-64 CPU.

// Register tiles (rows x vectors; see cpu_kernels.inc), overridable with -D for tuning (VHA_OPS_CFLAGS).
#ifndef VHA_TILE_BASELINE
#define VHA_TILE_BASELINE 4, 2
#endif
#ifndef VHA_TILE_AVX2
#define VHA_TILE_AVX2 6, 2
#endif
#ifndef VHA_TILE_AVX512
#define VHA_TILE_AVX512 8, 2
#endif
#define VHA_TILE_MR(mr, nv) mr
#define VHA_TILE_NV(mr, nv) nv
#define VHA_TILE_MR_(t) VHA_TILE_MR(t)
#define VHA_TILE_NV_(t) VHA_TILE_NV(t)

#define VHA_VEC_BYTES 16  // baseline: SSE2 on x86-64 (NEON etc. elsewhere), 16 registers, no FMA
#define VHA_MR VHA_TILE_MR_(VHA_TILE_BASELINE)
#define VHA_NV VHA_TILE_NV_(VHA_TILE_BASELINE)
namespace vha_cpu_baseline {
using namespace vha_cpu_common;
#include "cpu_kernels.inc"
}  // namespace vha_cpu_baseline
#undef VHA_VEC_BYTES
#undef VHA_MR
#undef VHA_NV

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VHA_CPU_MULTI_ISA 1
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,popcnt")  // x86-64-v3
#define VHA_VEC_BYTES 32  // 16 ymm registers
#define VHA_MR VHA_TILE_MR_(VHA_TILE_AVX2)
#define VHA_NV VHA_TILE_NV_(VHA_TILE_AVX2)
namespace vha_cpu_avx2 {
using namespace vha_cpu_common;
#include "cpu_kernels.inc"
}  // namespace vha_cpu_avx2
#undef VHA_VEC_BYTES
#undef VHA_MR
#undef VHA_NV
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,popcnt,avx512f,avx512bw,avx512dq,avx512vl,avx512cd,prefer-vector-width=512")  // x86-64-v4
#define VHA_VEC_BYTES 64  // 32 zmm registers
#define VHA_MR VHA_TILE_MR_(VHA_TILE_AVX512)
#define VHA_NV VHA_TILE_NV_(VHA_TILE_AVX512)
namespace vha_cpu_avx512 {
using namespace vha_cpu_common;
#include "cpu_kernels.inc"
}  // namespace vha_cpu_avx512
#undef VHA_VEC_BYTES
#undef VHA_MR
#undef VHA_NV
#pragma GCC pop_options
#endif

namespace {
using namespace vha_cpu_common;

enum class Isa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
const char* const kIsaNames[] = {"baseline", "avx2", "avx512"};

bool cpu_has(Isa isa) {
#ifdef VHA_CPU_MULTI_ISA
  __builtin_cpu_init();
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                  __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c");
  switch (isa) {
    case Isa::kBaseline: return true;
    case Isa::kAvx2: return v3;
    case Isa::kAvx512:
      return v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512cd");
  }
  return false;
#else
  return isa == Isa::kBaseline;
#endif
}

// The variant a call runs: the best this CPU has, or VHA_PROLOGUE_ISA (baseline / avx2 / avx512 / auto, read per
// call) when set. Forcing a variant the CPU or the build lacks is an error, never a silent fallback.
Isa select_isa() {
  const char* e = std::getenv("VHA_PROLOGUE_ISA");
  if (e != nullptr && *e != '\0' && std::strcmp(e, "auto") != 0) {
    for (int i = 0; i < 3; ++i)
      if (std::strcmp(e, kIsaNames[i]) == 0) {
        PD_CHECK(cpu_has(Isa(i)), "vha_prologue: VHA_PROLOGUE_ISA=", e,
                 " but this CPU (or this build) has no such kernel variant");
        return Isa(i);
      }
    PD_THROW("vha_prologue: VHA_PROLOGUE_ISA=", e, " is not one of auto, baseline, avx2, avx512");
  }
  if (cpu_has(Isa::kAvx512)) return Isa::kAvx512;
  if (cpu_has(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kBaseline;
}

template <typename T, typename C, typename... Args>
void run_fwd(Args&&... args) {
  switch (select_isa()) {
#ifdef VHA_CPU_MULTI_ISA
    case Isa::kAvx512: return vha_cpu_avx512::prologue_fwd<T, C>(args...);
    case Isa::kAvx2: return vha_cpu_avx2::prologue_fwd<T, C>(args...);
#endif
    default: return vha_cpu_baseline::prologue_fwd<T, C>(args...);
  }
}

template <typename T, typename C, typename... Args>
void run_bwd(Args&&... args) {
  switch (select_isa()) {
#ifdef VHA_CPU_MULTI_ISA
    case Isa::kAvx512: return vha_cpu_avx512::prologue_bwd<T, C>(args...);
    case Isa::kAvx2: return vha_cpu_avx2::prologue_bwd<T, C>(args...);
#endif
    default: return vha_cpu_baseline::prologue_bwd<T, C>(args...);
  }
}

Dims make_dims(const paddle::Tensor& q_phys, const paddle::Tensor& k, const paddle::Tensor& premix,
               const paddle::Tensor& wq, const paddle::Tensor& wk, const paddle::Tensor& cos, const paddle::Tensor& sin,
               bool heads_first) {
  auto qs = q_phys.shape(), ks = k.shape(), ps = premix.shape(), cs = cos.shape();
  PD_CHECK(qs.size() == 4, "vha_prologue: q_phys must be [B, S, H_p, r]");
  PD_CHECK(ks.size() == 4, "vha_prologue: k must be [B, S, H_kv, d]");
  PD_CHECK(ps.size() == 3, "vha_prologue: premix must be [H_kv, r, d]");
  Dims D{qs[0], qs[1], qs[2], ks[2], qs[3], ks[3], 1, heads_first};
  PD_CHECK(ks[0] == D.B && ks[1] == D.S, "vha_prologue: q_phys and k disagree on (B, S)");
  PD_CHECK(ps[0] == D.Hkv && ps[1] == D.r && ps[2] == D.d, "vha_prologue: premix must be [H_kv, r, d] = [", D.Hkv,
           ", ", D.r, ", ", D.d, "]");
  PD_CHECK(D.d % 2 == 0, "vha_prologue: head_dim must be even (RoPE)");
  PD_CHECK(wq.numel() == D.d && wk.numel() == D.d, "vha_prologue: norm weights must have head_dim elements");
  PD_CHECK(cs.size() == 3 && cs[1] == D.S && cs[2] == D.d && (cs[0] == 1 || cs[0] == D.B),
           "vha_prologue: cos must be [B or 1, S, d]");
  PD_CHECK(sin.shape() == cs, "vha_prologue: sin must have cos's shape");
  D.Bc = cs[0];
  const auto dt = q_phys.dtype();
  for (const paddle::Tensor* t : {&k, &premix, &wq, &wk, &cos, &sin})
    PD_CHECK(t->dtype() == dt, "vha_prologue: all inputs must share q_phys's dtype");
  return D;
}

}  // namespace

// For paddle_vha.kernels.cpu_variant (ctypes) and tools/bench_prologue.py: the CPU kernel variant a call would run now
// ("baseline", "avx2" or "avx512"), or "error: <why>" when VHA_PROLOGUE_ISA asks for one that cannot run; and the
// variants this CPU can run, best first, comma-separated.
extern "C" __attribute__((visibility("default"))) const char* vha_prologue_cpu_variant() {
  static thread_local std::string said;
  try {
    said = kIsaNames[int(select_isa())];
  } catch (const std::exception& e) {
    said = std::string("error: ") + e.what();
  }
  return said.c_str();
}

extern "C" __attribute__((visibility("default"))) const char* vha_prologue_cpu_variants() {
  static const std::string all = [] {
    std::string s;
    for (int i = 2; i >= 0; --i)
      if (cpu_has(Isa(i))) s += std::string(s.empty() ? "" : ",") + kIsaNames[i];
    return s;
  }();
  return all.c_str();
}

#define VHA_DISPATCH(DT, ...)                                                        \
  switch (DT) {                                                                      \
    case paddle::DataType::FLOAT32: {                                                \
      using T = float;                                                               \
      using C = float;                                                               \
      __VA_ARGS__;                                                                   \
      break;                                                                         \
    }                                                                                \
    case paddle::DataType::FLOAT64: {                                                \
      using T = double;                                                              \
      using C = double;                                                              \
      __VA_ARGS__;                                                                   \
      break;                                                                         \
    }                                                                                \
    case paddle::DataType::BFLOAT16: {                                               \
      using T = paddle::bfloat16;                                                    \
      using C = float;                                                               \
      __VA_ARGS__;                                                                   \
      break;                                                                         \
    }                                                                                \
    case paddle::DataType::FLOAT16: {                                                \
      using T = paddle::float16;                                                     \
      using C = float;                                                               \
      __VA_ARGS__;                                                                   \
      break;                                                                         \
    }                                                                                \
    default:                                                                         \
      PD_THROW("vha_prologue: unsupported dtype (float32, float64, bfloat16, float16)"); \
  }

// CPU forward: contiguous inputs, shape checks, then the kernel variant select_isa picks, in the input dtype.
std::vector<paddle::Tensor> vha_prologue_cpu_forward(const paddle::Tensor& q_phys_in, const paddle::Tensor& k_in,
                                                     const paddle::Tensor& premix_in, const paddle::Tensor& wq_in,
                                                     const paddle::Tensor& wk_in, const paddle::Tensor& cos_in,
                                                     const paddle::Tensor& sin_in, float eps, bool heads_first) {
  const auto q_phys = q_phys_in.contiguous(), k = k_in.contiguous(), premix = premix_in.contiguous(),
             wq = wq_in.contiguous(), wk = wk_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const Dims D = make_dims(q_phys, k, premix, wq, wk, cos, sin, heads_first);
  auto qo = paddle::empty(vha::out_shape(D.B, D.S, D.Hv(), D.d, heads_first), q_phys.dtype(), q_phys.place());
  auto ko = paddle::empty(vha::out_shape(D.B, D.S, D.Hkv, D.d, heads_first), q_phys.dtype(), q_phys.place());
  VHA_DISPATCH(q_phys.dtype(), run_fwd<T, C>(q_phys.data<T>(), k.data<T>(), premix.data<T>(), wq.data<T>(),
                                                  wk.data<T>(), cos.data<T>(), sin.data<T>(), qo.data<T>(),
                                                  ko.data<T>(), D, C(eps)));
  return {qo, ko};
}

// CPU backward: as the forward, plus zeros for an output gradient that did not reach the loss.
std::vector<paddle::Tensor> vha_prologue_cpu_backward(const paddle::Tensor& q_phys_in, const paddle::Tensor& k_in,
                                                      const paddle::Tensor& premix_in, const paddle::Tensor& wq_in,
                                                      const paddle::Tensor& wk_in, const paddle::Tensor& cos_in,
                                                      const paddle::Tensor& sin_in, const paddle::Tensor& gq_in,
                                                      const paddle::Tensor& gk_in, float eps, bool heads_first) {
  const auto q_phys = q_phys_in.contiguous(), k = k_in.contiguous(), premix = premix_in.contiguous(),
             wq = wq_in.contiguous(), wk = wk_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const Dims D = make_dims(q_phys, k, premix, wq, wk, cos, sin, heads_first);
  // A missing output gradient (an output that did not reach the loss) counts as zero.
  paddle::Tensor gq = gq_in.initialized() ? gq_in.contiguous()
                                          : paddle::zeros(vha::out_shape(D.B, D.S, D.Hv(), D.d, heads_first),
                                                          q_phys.dtype(), q_phys.place());
  const bool have_gk = gk_in.initialized();
  paddle::Tensor gk = have_gk ? gk_in.contiguous() : gk_in;
  auto gqp = paddle::empty(q_phys.shape(), q_phys.dtype(), q_phys.place());
  auto gkk = paddle::empty(k.shape(), k.dtype(), k.place());
  auto gW = paddle::empty(premix.shape(), premix.dtype(), premix.place());
  auto gwq = paddle::empty(wq.shape(), wq.dtype(), wq.place());
  auto gwk = paddle::empty(wk.shape(), wk.dtype(), wk.place());
  VHA_DISPATCH(q_phys.dtype(),
               run_bwd<T, C>(q_phys.data<T>(), k.data<T>(), premix.data<T>(), wq.data<T>(), wk.data<T>(),
                                  cos.data<T>(), sin.data<T>(), gq.data<T>(), have_gk ? gk.data<T>() : nullptr,
                                  gqp.data<T>(), gkk.data<T>(), gW.data<T>(), gwq.data<T>(), gwk.data<T>(), D,
                                  C(eps)));
  return {gqp, gkk, gW, gwq, gwk};
}
