// Paddle glue for the CUDA kernels (launch.cuh): the GPU entries of the vha_prologue operator registered in
// ../register_op.cc (declared in ../prologue_op.h). Built only when Paddle is compiled with CUDA (ops/build.py).
// STATUS: compiled for sm_80 / sm_90, never run on a GPU by this project (docs/prologue.md).
#include <vector>

#include "paddle/extension.h"
#include "../prologue_op.h"
#include "launch.cuh"

namespace {

vha::gpu::Dims gpu_dims(const paddle::Tensor& q_phys, const paddle::Tensor& k, const paddle::Tensor& premix,
                        const paddle::Tensor& wq, const paddle::Tensor& wk, const paddle::Tensor& cos,
                        const paddle::Tensor& sin, bool heads_first) {
  // The same checks as the CPU entry (../cpu/op_cpu.cc make_dims), plus one device for every input.
  for (const paddle::Tensor* t : {&k, &premix, &wq, &wk, &cos, &sin}) {
    PD_CHECK(t->dtype() == q_phys.dtype(), "vha_prologue: all inputs must share q_phys's dtype");
    PD_CHECK(t->place() == q_phys.place(), "vha_prologue: all inputs must be on q_phys's device");
  }
  auto qs = q_phys.shape(), ks = k.shape(), ps = premix.shape(), cs = cos.shape();
  PD_CHECK(qs.size() == 4 && ks.size() == 4 && ps.size() == 3 && cs.size() == 3, "vha_prologue: bad ranks");
  PD_CHECK(wq.numel() == ks[3] && wk.numel() == ks[3], "vha_prologue: norm weights must have head_dim elements");
  PD_CHECK(sin.shape() == cs, "vha_prologue: sin must have cos's shape");
  PD_CHECK(ps[0] == ks[2] && ps[1] == qs[3] && ps[2] == ks[3], "vha_prologue: premix must be [H_kv, r, d]");
  PD_CHECK(ks[0] == qs[0] && ks[1] == qs[1], "vha_prologue: q_phys and k disagree on (B, S)");
  PD_CHECK(ks[3] % 2 == 0, "vha_prologue: head_dim must be even (RoPE)");
  PD_CHECK(cs[1] == qs[1] && cs[2] == ks[3] && (cs[0] == 1 || cs[0] == qs[0]), "vha_prologue: cos must be [B or 1, S, d]");
  return vha::gpu::Dims{qs[0], qs[1], qs[2], ks[2], qs[3], ks[3], cs[0], heads_first ? 1 : 0};
}

std::vector<int64_t> oshape(int64_t B, int64_t S, int64_t H, int64_t d, bool hf) {
  return hf ? std::vector<int64_t>{B, H, S, d} : std::vector<int64_t>{B, S, H, d};
}

template <typename PT, typename T>
const T* cp(const paddle::Tensor& t) {
  return reinterpret_cast<const T*>(t.data<PT>());
}
template <typename PT, typename T>
T* mp(paddle::Tensor& t) {
  return reinterpret_cast<T*>(t.data<PT>());
}

}  // namespace

#define VHA_GPU_DISPATCH(DT, ...)                                   \
  switch (DT) {                                                     \
    case paddle::DataType::FLOAT32: {                               \
      using PT = float;                                             \
      using T = float;                                              \
      __VA_ARGS__;                                                  \
      break;                                                        \
    }                                                               \
    case paddle::DataType::FLOAT64: {                               \
      using PT = double;                                            \
      using T = double;                                             \
      __VA_ARGS__;                                                  \
      break;                                                        \
    }                                                               \
    case paddle::DataType::BFLOAT16: {                              \
      using PT = paddle::bfloat16;                                  \
      using T = __nv_bfloat16;                                      \
      __VA_ARGS__;                                                  \
      break;                                                        \
    }                                                               \
    case paddle::DataType::FLOAT16: {                               \
      using PT = paddle::float16;                                   \
      using T = __half;                                             \
      __VA_ARGS__;                                                  \
      break;                                                        \
    }                                                               \
    default:                                                        \
      PD_THROW("vha_prologue: unsupported dtype on GPU");            \
  }

std::vector<paddle::Tensor> vha_prologue_cuda_forward(const paddle::Tensor& q_in, const paddle::Tensor& k_in,
                                                      const paddle::Tensor& p_in, const paddle::Tensor& wq_in,
                                                      const paddle::Tensor& wk_in, const paddle::Tensor& c_in,
                                                      const paddle::Tensor& s_in, float eps, bool heads_first) {
  const auto q = q_in.contiguous(), k = k_in.contiguous(), W = p_in.contiguous(), wq = wq_in.contiguous(),
             wk = wk_in.contiguous(), cs = c_in.contiguous(), sn = s_in.contiguous();
  const auto D = gpu_dims(q, k, W, wq, wk, cs, sn, heads_first);
  auto qo = paddle::empty(oshape(D.B, D.S, D.Hp * D.Hkv, D.d, heads_first), q.dtype(), q.place());
  auto ko = paddle::empty(oshape(D.B, D.S, D.Hkv, D.d, heads_first), q.dtype(), q.place());
  cudaStream_t st = q.stream();
  cudaError_t e = cudaSuccess;
  VHA_GPU_DISPATCH(q.dtype(), e = vha::gpu::launch_forward<T>(
                                  cp<PT, T>(q), cp<PT, T>(k), cp<PT, T>(W), cp<PT, T>(wq), cp<PT, T>(wk),
                                  cp<PT, T>(cs), cp<PT, T>(sn), mp<PT, T>(qo), mp<PT, T>(ko), D, eps, st));
  PD_CHECK(e == cudaSuccess, "vha_prologue forward CUDA error: ", cudaGetErrorString(e));
  return {qo, ko};
}

std::vector<paddle::Tensor> vha_prologue_cuda_backward(const paddle::Tensor& q_in, const paddle::Tensor& k_in,
                                                       const paddle::Tensor& p_in, const paddle::Tensor& wq_in,
                                                       const paddle::Tensor& wk_in, const paddle::Tensor& c_in,
                                                       const paddle::Tensor& s_in, const paddle::Tensor& gq_in,
                                                       const paddle::Tensor& gk_in, float eps, bool heads_first) {
  const auto q = q_in.contiguous(), k = k_in.contiguous(), W = p_in.contiguous(), wq = wq_in.contiguous(),
             wk = wk_in.contiguous(), cs = c_in.contiguous(), sn = s_in.contiguous();
  const auto D = gpu_dims(q, k, W, wq, wk, cs, sn, heads_first);
  paddle::Tensor gq = gq_in.initialized()
                          ? gq_in.contiguous()
                          : paddle::zeros(oshape(D.B, D.S, D.Hp * D.Hkv, D.d, heads_first), q.dtype(), q.place());
  const bool have_gk = gk_in.initialized();
  paddle::Tensor gk = have_gk ? gk_in.contiguous() : gk_in;
  auto gqp = paddle::empty(q.shape(), q.dtype(), q.place());
  auto gkk = paddle::empty(k.shape(), k.dtype(), k.place());
  auto gW = paddle::empty(W.shape(), W.dtype(), W.place());
  auto gwq = paddle::empty(wq.shape(), wq.dtype(), wq.place());
  auto gwk = paddle::empty(wk.shape(), wk.dtype(), wk.place());
  const size_t ws = q.dtype() == paddle::DataType::FLOAT64 ? vha::gpu::backward_workspace_bytes<double>(D)
                                                            : vha::gpu::backward_workspace_bytes<float>(D);
  auto work = paddle::empty({int64_t(ws)}, paddle::DataType::UINT8, q.place());
  cudaStream_t st = q.stream();
  cudaError_t e = cudaSuccess;
  VHA_GPU_DISPATCH(q.dtype(), e = vha::gpu::launch_backward<T>(
                                  cp<PT, T>(q), cp<PT, T>(k), cp<PT, T>(W), cp<PT, T>(wq), cp<PT, T>(wk),
                                  cp<PT, T>(cs), cp<PT, T>(sn), cp<PT, T>(gq), have_gk ? cp<PT, T>(gk) : nullptr,
                                  mp<PT, T>(gqp), mp<PT, T>(gkk), mp<PT, T>(gW), mp<PT, T>(gwq), mp<PT, T>(gwk),
                                  work.data<uint8_t>(), ws, D, eps, st));
  PD_CHECK(e == cudaSuccess, "vha_prologue backward CUDA error: ", cudaGetErrorString(e));
  return {gqp, gkk, gW, gwq, gwk};
}
