// The vha_prologue operator's one registration with Paddle (PD_BUILD_OP / PD_BUILD_GRAD_OP), its shape and dtype
// inference, and the routing of each call to the CPU kernels (cpu/op_cpu.cc) or, in a CUDA build, the CUDA kernels
// (cuda/op_cuda.cu); both entries are declared in prologue_op.h.
//
// Inputs   QPhys  [B, S, H_p, r]     physical queries
//          K      [B, S, H_kv, d]    keys
//          Premix [H_kv, r, d]       one map per KV group
//          QNormW [d], KNormW [d]    RMSNorm weights
//          Cos, Sin [Bc, S, d]       rotate-half tables (Bc = 1 or B), e.g. Qwen3RotaryEmbedding's output
// Outputs  QOut   [B, S, H_v, d]     (heads_first: [B, H_v, S, d]), virtual head j = g*H_p + i (group-major)
//          KOut   [B, S, H_kv, d]    (heads_first: [B, H_kv, S, d])
// Attrs    eps (RMSNorm epsilon), heads_first (write the attention layout directly, saving a transpose).
#include <vector>

#include "paddle/extension.h"
#include "prologue_op.h"

std::vector<paddle::Tensor> VhaPrologueForward(const paddle::Tensor& q_phys_in, const paddle::Tensor& k_in,
                                               const paddle::Tensor& premix_in, const paddle::Tensor& wq_in,
                                               const paddle::Tensor& wk_in, const paddle::Tensor& cos_in,
                                               const paddle::Tensor& sin_in, float eps, bool heads_first) {
#ifdef VHA_WITH_CUDA
  if (q_phys_in.is_gpu())
    return vha_prologue_cuda_forward(q_phys_in, k_in, premix_in, wq_in, wk_in, cos_in, sin_in, eps, heads_first);
#endif
  PD_CHECK(q_phys_in.is_cpu(), "vha_prologue: this build has CPU kernels only");
  return vha_prologue_cpu_forward(q_phys_in, k_in, premix_in, wq_in, wk_in, cos_in, sin_in, eps, heads_first);
}

std::vector<paddle::Tensor> VhaPrologueBackward(const paddle::Tensor& q_phys_in, const paddle::Tensor& k_in,
                                                const paddle::Tensor& premix_in, const paddle::Tensor& wq_in,
                                                const paddle::Tensor& wk_in, const paddle::Tensor& cos_in,
                                                const paddle::Tensor& sin_in, const paddle::Tensor& gq_in,
                                                const paddle::Tensor& gk_in, float eps, bool heads_first) {
#ifdef VHA_WITH_CUDA
  if (q_phys_in.is_gpu())
    return vha_prologue_cuda_backward(q_phys_in, k_in, premix_in, wq_in, wk_in, cos_in, sin_in, gq_in, gk_in, eps,
                                      heads_first);
#endif
  PD_CHECK(q_phys_in.is_cpu(), "vha_prologue: this build has CPU kernels only");
  return vha_prologue_cpu_backward(q_phys_in, k_in, premix_in, wq_in, wk_in, cos_in, sin_in, gq_in, gk_in, eps,
                                   heads_first);
}

std::vector<std::vector<int64_t>> VhaPrologueInferShape(const std::vector<int64_t>& qs, const std::vector<int64_t>& ks,
                                                        const std::vector<int64_t>& ps, const std::vector<int64_t>&,
                                                        const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                        const std::vector<int64_t>&, float, bool heads_first) {
  const int64_t hv = (qs[2] < 0 || ps[0] < 0) ? -1 : qs[2] * ps[0];
  return {vha::out_shape(qs[0], qs[1], hv, ks[3], heads_first),
          vha::out_shape(ks[0], ks[1], ks[2], ks[3], heads_first)};
}

std::vector<paddle::DataType> VhaPrologueInferDtype(const paddle::DataType& q, const paddle::DataType&,
                                                    const paddle::DataType&, const paddle::DataType&,
                                                    const paddle::DataType&, const paddle::DataType&,
                                                    const paddle::DataType&) {
  return {q, q};
}

PD_BUILD_OP(vha_prologue)
    .Inputs({"QPhys", "K", "Premix", "QNormW", "KNormW", "Cos", "Sin"})
    .Outputs({"QOut", "KOut"})
    .Attrs({"eps: float", "heads_first: bool"})
    .SetKernelFn(PD_KERNEL(VhaPrologueForward))
    .SetInferShapeFn(PD_INFER_SHAPE(VhaPrologueInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(VhaPrologueInferDtype));

PD_BUILD_GRAD_OP(vha_prologue)
    .Inputs({"QPhys", "K", "Premix", "QNormW", "KNormW", "Cos", "Sin", paddle::Grad("QOut"), paddle::Grad("KOut")})
    .Outputs({paddle::Grad("QPhys"), paddle::Grad("K"), paddle::Grad("Premix"), paddle::Grad("QNormW"),
              paddle::Grad("KNormW")})
    .Attrs({"eps: float", "heads_first: bool"})
    .SetKernelFn(PD_KERNEL(VhaPrologueBackward));
