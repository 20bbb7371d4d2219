// Host side shared by the launchers (return cudaError_t; T: float, double, __nv_bfloat16 or __half): the
// shared-memory opt-in, grid sizing, device attributes, the tensor-core eligibility test that picks a path, and the
// launch of q_tc (forward or backward).
#pragma once

#include "tc_prologue.cuh"

namespace vha {
namespace gpu {

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

inline int device_attr(cudaDeviceAttr attr, int fallback) {  // of the current device
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) return fallback;
  return v;
}

constexpr int kMaxQtcBlocks = 1024;  // q_tc grid cap: one norm-weight partial per block in the workspace
constexpr int kQtcStagesMax = 2;

// The tensor-core path: bf16 / fp16 (mma.sync m16n8k16 needs sm_80), d in {64, 128, 256}, r % 16 == 0, every pointer
// 16-byte aligned (cp.async, 16-byte vectors) and W[g] plus one q tile within the device's shared memory.
template <typename T>
inline bool tc_eligible(const Dims& D, std::initializer_list<const void*> ptrs) {
  if (!(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value)) return false;
  if (!(D.d == 64 || D.d == 128 || D.d == 256) || D.r % 16 != 0 || D.r < 16) return false;
  if (device_attr(cudaDevAttrComputeCapabilityMajor, 0) < 8) return false;
  for (const void* p : ptrs)
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return q_tc_smem(D.r, int(D.d), 1, D.Hp) <= size_t(device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024));
}

// q_tc: persistent grid (x: 64-row tiles, y: group) sized to the CTAs the SMs hold; two q stages where they fit.
template <typename T, int DH, bool BWD>
inline cudaError_t launch_q_tc(const T* qp, const T* kin, const T* W, const T* wq, const T* wk, const T* cosp,
                               const T* sinp, const T* gqo, const T* gko, T* qo_or_gu, T* ko_or_gk, float* gw_part,
                               const Dims& D, float eps, cudaStream_t st, int* blocks) {
  const size_t optin = size_t(device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024));
  const int stages = q_tc_smem(D.r, DH, kQtcStagesMax, D.Hp) <= optin ? kQtcStagesMax : 1;
  const size_t smem = q_tc_smem(D.r, DH, stages, D.Hp);
  cudaError_t e = allow_smem(q_tc<T, DH, BWD>, smem);
  if (e != cudaSuccess) return e;
  const long sms = device_attr(cudaDevAttrMultiProcessorCount, 1);
  const long per_sm = long(optin / smem) < 1 ? 1 : long(optin / smem);
  const long tiles = (D.rows() + kTcRows - 1) / kTcRows;
  long x = (sms * per_sm + D.Hkv - 1) / D.Hkv;
  if (x > tiles) x = tiles;
  if (x > kMaxQtcBlocks / D.Hkv) x = kMaxQtcBlocks / D.Hkv;
  if (x < 1) x = 1;  // an empty batch still normalises no keys: one CTA per group, no tiles
  *blocks = int(x * D.Hkv);
  VHA_LAUNCH(dim3(unsigned(x), unsigned(D.Hkv)), kTcWarps * 32, smem, st, q_tc<T, DH, BWD>)(
      qp, kin, W, wq, wk, cosp, sinp, gqo, gko, qo_or_gu, ko_or_gk, gw_part, D, eps, stages);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace vha
