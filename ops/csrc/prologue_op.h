// The entries behind the vha_prologue operator (registered in register_op.cc): the CPU kernels (cpu/op_cpu.cc) and,
// in a build with -DVHA_WITH_CUDA, the CUDA kernels (cuda/op_cuda.cu). Each takes the operator's inputs and attributes
// as registered and returns its outputs (forward: QOut, KOut; backward: the five input gradients).
#pragma once

#include <cstdint>
#include <vector>

#include "paddle/extension.h"

namespace vha {

// Output shape of a tensor with H heads: [B, H, S, d] with heads_first (the attention layout), else [B, S, H, d].
inline std::vector<int64_t> out_shape(int64_t B, int64_t S, int64_t H, int64_t d, bool heads_first) {
  return heads_first ? std::vector<int64_t>{B, H, S, d} : std::vector<int64_t>{B, S, H, d};
}

}  // namespace vha

std::vector<paddle::Tensor> vha_prologue_cpu_forward(const paddle::Tensor& q_phys, const paddle::Tensor& k,
                                                     const paddle::Tensor& premix, const paddle::Tensor& wq,
                                                     const paddle::Tensor& wk, const paddle::Tensor& cos,
                                                     const paddle::Tensor& sin, float eps, bool heads_first);
std::vector<paddle::Tensor> vha_prologue_cpu_backward(const paddle::Tensor& q_phys, const paddle::Tensor& k,
                                                      const paddle::Tensor& premix, const paddle::Tensor& wq,
                                                      const paddle::Tensor& wk, const paddle::Tensor& cos,
                                                      const paddle::Tensor& sin, const paddle::Tensor& gq,
                                                      const paddle::Tensor& gk, float eps, bool heads_first);
#ifdef VHA_WITH_CUDA
std::vector<paddle::Tensor> vha_prologue_cuda_forward(const paddle::Tensor& q_phys, const paddle::Tensor& k,
                                                      const paddle::Tensor& premix, const paddle::Tensor& wq,
                                                      const paddle::Tensor& wk, const paddle::Tensor& cos,
                                                      const paddle::Tensor& sin, float eps, bool heads_first);
std::vector<paddle::Tensor> vha_prologue_cuda_backward(const paddle::Tensor& q_phys, const paddle::Tensor& k,
                                                       const paddle::Tensor& premix, const paddle::Tensor& wq,
                                                       const paddle::Tensor& wk, const paddle::Tensor& cos,
                                                       const paddle::Tensor& sin, const paddle::Tensor& gq,
                                                       const paddle::Tensor& gk, float eps, bool heads_first);
#endif
