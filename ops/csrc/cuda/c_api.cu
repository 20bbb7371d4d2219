// extern "C" entry points over the CUDA launchers (launch.cuh), for checks on machines without Paddle
// (tools/gpu_check.py builds this file alone with nvcc into a shared library and calls it through ctypes on PyTorch
// tensors; tests/cuda_emu_harness.py builds it with g++ for the host emulator).
//
// dtype codes: 0 float32, 1 float64, 2 bfloat16, 3 float16. All pointers are device pointers to contiguous
// tensors laid out as in ../register_op.cc; `stream` is a cudaStream_t (0 = default stream).
// Return value: a cudaError_t (0 = success).
#include "launch.cuh"

using vha::gpu::Dims;

namespace {
Dims dims(long B, long S, long Hp, long Hkv, long r, long d, long Bc, int heads_first) {
  return Dims{B, S, Hp, Hkv, r, d, Bc, heads_first};
}
}  // namespace

extern "C" {

int vha_prologue_forward(int dtype, const void* qp, const void* k, const void* W, const void* wq, const void* wk,
                         const void* cosp, const void* sinp, void* qo, void* ko, long B, long S, long Hp, long Hkv,
                         long r, long d, long Bc, float eps, int heads_first, void* stream) {
  const Dims D = dims(B, S, Hp, Hkv, r, d, Bc, heads_first);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#define VHA_FWD(T)                                                                                               \
  return int(vha::gpu::launch_forward<T>(                                                                        \
      static_cast<const T*>(qp), static_cast<const T*>(k), static_cast<const T*>(W), static_cast<const T*>(wq),  \
      static_cast<const T*>(wk), static_cast<const T*>(cosp), static_cast<const T*>(sinp), static_cast<T*>(qo), \
      static_cast<T*>(ko), D, eps, st))
  switch (dtype) {
    case 0: VHA_FWD(float);
    case 1: VHA_FWD(double);
    case 2: VHA_FWD(__nv_bfloat16);
    case 3: VHA_FWD(__half);
  }
#undef VHA_FWD
  return int(cudaErrorInvalidValue);
}

size_t vha_prologue_backward_workspace(int dtype, long B, long S, long Hp, long Hkv, long r, long d) {
  const Dims D = dims(B, S, Hp, Hkv, r, d, 1, 1);
  return dtype == 1 ? vha::gpu::backward_workspace_bytes<double>(D) : vha::gpu::backward_workspace_bytes<float>(D);
}

// gk_out may be null-equivalent only through gk == nullptr (k output not in the loss): then dk = 0.
int vha_prologue_backward(int dtype, const void* qp, const void* k, const void* W, const void* wq, const void* wk,
                          const void* cosp, const void* sinp, const void* gq, const void* gk, void* gqp, void* gk_out,
                          void* gW, void* gwq, void* gwk, void* workspace, size_t ws_bytes, long B, long S, long Hp,
                          long Hkv, long r, long d, long Bc, float eps, int heads_first, void* stream) {
  const Dims D = dims(B, S, Hp, Hkv, r, d, Bc, heads_first);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#define VHA_BWD(T)                                                                                                \
  return int(vha::gpu::launch_backward<T>(                                                                        \
      static_cast<const T*>(qp), static_cast<const T*>(k), static_cast<const T*>(W), static_cast<const T*>(wq),   \
      static_cast<const T*>(wk), static_cast<const T*>(cosp), static_cast<const T*>(sinp),                        \
      static_cast<const T*>(gq), static_cast<const T*>(gk), static_cast<T*>(gqp), static_cast<T*>(gk_out),        \
      static_cast<T*>(gW), static_cast<T*>(gwq), static_cast<T*>(gwk), workspace, ws_bytes, D, eps, st))
  switch (dtype) {
    case 0: VHA_BWD(float);
    case 1: VHA_BWD(double);
    case 2: VHA_BWD(__nv_bfloat16);
    case 3: VHA_BWD(__half);
  }
#undef VHA_BWD
  return int(cudaErrorInvalidValue);
}

}  // extern "C"
