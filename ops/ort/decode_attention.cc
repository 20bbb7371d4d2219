// paddle-vha's onnxruntime custom-op library: attention of new query rows over the KV cache in one node, reading each
// cached KV head once for all the query heads that share it (docs/deploy.md, "The fused attention op").
//
// Domain ai.paddle_vha, version 1:
//   DecodeAttention      (q float (B, H_kv, R, d), key float (B, H_kv, T, d), value float (B, H_kv, T, d),
//                         mask float (B or 1, 1, M, T)) -> y float (B, H_kv, R, d)
//   DecodeAttentionInt8  (q, key uint8 (B, H_kv, T, d), key_scale float (B, H_kv, T, 1), value int8 (B, H_kv, T, d),
//                         value_scale float (B, H_kv, T, 1), mask) -> y
//   DecodeAttentionBuffer[Int8]  the same inputs, then key_new, value_new float (B, H_kv, S, d): the step's new
//                         entries, attended after the cache's T positions (the buffer flavour); mask (.., M, T + S)
//   attribute scale (float): y[b, h, r] = softmax_t(scale * q[b, h, r] . k[b, h, t] + mask[b, 0, r % M, t]) . v[b, h]
//   with k = (key - 128) * key_scale, v = value * value_scale for the int8 cache (paddle_vha/export/kv_cache.py's
//   layout). R rows per KV head (the graph's G query heads x S new tokens); M divides R (M = R: a mask per row).
//
// Work is split over sequences x KV heads x slices of positions (onnxruntime's intra-op thread pool), each slice an
// online softmax (attention_kernel.inc), the slices merged per row. Instruction set: the best this CPU has
// (AVX-512, AVX2 or the x86-64 baseline, CPUID at load), or VHA_ATTENTION_ISA=baseline|avx2|avx512.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {
constexpr float kMasked = -1e8f;  // a mask value below this is a masked position (the graph's masks use -1e9)
}

#define VHA_VW 4  // SSE2: 4 floats
namespace vha_attn_baseline {
#include "attention_kernel.inc"
}  // namespace vha_attn_baseline
#undef VHA_VW

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VHA_ATTN_MULTI_ISA 1
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,popcnt")
#define VHA_VW 8
namespace vha_attn_avx2 {
#include "attention_kernel.inc"
}  // namespace vha_attn_avx2
#undef VHA_VW
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,popcnt,avx512f,avx512bw,avx512dq,avx512vl,avx512cd,prefer-vector-width=512")
#define VHA_VW 16
namespace vha_attn_avx512 {
#include "attention_kernel.inc"
}  // namespace vha_attn_avx512
#undef VHA_VW
#pragma GCC pop_options
#endif

namespace {

enum class Isa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
const char* const kIsaNames[] = {"baseline", "avx2", "avx512"};

bool cpu_has(Isa isa) {
#ifdef VHA_ATTN_MULTI_ISA
  __builtin_cpu_init();
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == Isa::kAvx2) return v3;
  if (isa == Isa::kAvx512)
    return v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return true;
#else
  return isa == Isa::kBaseline;
#endif
}

// The variant calls run: VHA_ATTENTION_ISA's, else the best this CPU has; an empty string and `error` on a bad choice.
Isa chosen_isa(std::string* error) {
  const char* e = std::getenv("VHA_ATTENTION_ISA");
  if (e != nullptr && *e != '\0' && std::strcmp(e, "auto") != 0) {
    for (int k = 0; k < 3; ++k) {
      if (std::strcmp(e, kIsaNames[k]) == 0) {
        if (cpu_has(static_cast<Isa>(k))) return static_cast<Isa>(k);
        *error = std::string("VHA_ATTENTION_ISA=") + e + ": this CPU cannot run it";
        return Isa::kBaseline;
      }
    }
    *error = std::string("VHA_ATTENTION_ISA=") + e + " is not one of auto, baseline, avx2, avx512";
    return Isa::kBaseline;
  }
  return cpu_has(Isa::kAvx512) ? Isa::kAvx512 : cpu_has(Isa::kAvx2) ? Isa::kAvx2 : Isa::kBaseline;
}

template <typename K, typename V>
void slice(Isa isa, const float* q, int R, int d, float scale, const K* k, const float* ks, const V* v,
           const float* vs, const float* mask, int M, long mstride, long T, long t0, long t1, bool skip, float* m,
           float* l, float* acc, float* work) {
#ifdef VHA_ATTN_MULTI_ISA
  if (isa == Isa::kAvx512)
    return vha_attn_avx512::attend_slice(q, R, d, scale, k, ks, v, vs, mask, M, mstride, T, t0, t1, skip, m, l, acc,
                                         work);
  if (isa == Isa::kAvx2)
    return vha_attn_avx2::attend_slice(q, R, d, scale, k, ks, v, vs, mask, M, mstride, T, t0, t1, skip, m, l, acc,
                                       work);
#endif
  vha_attn_baseline::attend_slice(q, R, d, scale, k, ks, v, vs, mask, M, mstride, T, t0, t1, skip, m, l, acc, work);
}

struct Job {
  Isa isa;
  const float* q;
  const void* k;
  const float* ks;
  const void* v;
  const float* vs;
  const float* kn = nullptr;  // the step's new entries (buffer flavour): float (B, H, S, d), or none (S = 0)
  const float* vn = nullptr;
  const float* mask;
  float* y;
  long B, H, R, d, T, S = 0, M, mask_batches, slices, buffer_slices, slice_len;
  float scale;
  bool int8;
  std::vector<float> m, l, acc;  // per (sequence, head, slice): R maxima, R sums, R x d outputs
  std::vector<float> work;       // per task: the kernel's scratch

  long work_floats() const { return R * 32 + 32 * d + R; }  // scores, a tile as floats, R row flags (bytes)

  void run_slice(long task, bool skip) {
    const long bh = task / slices, c = task % slices, b = bh / H;
    const long mstride = T + S;  // the mask's columns: the cache's positions, then the new entries'
    const float* qh = q + bh * R * d;
    const float* mk = mask + (mask_batches == 1 ? 0 : b) * M * mstride;
    float* mm = m.data() + task * R;
    float* ll = l.data() + task * R;
    float* aa = acc.data() + task * R * d;
    float* w = work.data() + task * work_floats();
    if (c == buffer_slices) {  // the new entries, float32 (their mask columns after the cache's)
      slice(isa, qh, R, d, scale, kn + bh * S * d, static_cast<const float*>(nullptr), vn + bh * S * d,
            static_cast<const float*>(nullptr), mk + T, M, mstride, S, 0, S, skip, mm, ll, aa, w);
      return;
    }
    const long t0 = c * slice_len, t1 = std::min(T, t0 + slice_len);
    if (int8)
      slice(isa, qh, R, d, scale, static_cast<const uint8_t*>(k) + bh * T * d, ks + bh * T,
            static_cast<const int8_t*>(v) + bh * T * d, vs + bh * T, mk, M, mstride, T, t0, t1, skip, mm, ll, aa, w);
    else
      slice(isa, qh, R, d, scale, static_cast<const float*>(k) + bh * T * d, static_cast<const float*>(nullptr),
            static_cast<const float*>(v) + bh * T * d, static_cast<const float*>(nullptr), mk, M, mstride, T, t0, t1,
            skip, mm, ll, aa, w);
  }

  void finish(long bh) {  // merge the slices; rows that met only masked tiles are recomputed without skipping
    const long base = bh * slices;
    bool blind = false;
    for (long r = 0; r < R && !blind; ++r) {
      bool seen = false;
      for (long c = 0; c < slices; ++c) seen |= m[(base + c) * R + r] != -__builtin_inff();
      blind = !seen;
    }
    if (blind)
      for (long c = 0; c < slices; ++c) run_slice(base + c, false);
    vha_attn_baseline::merge_slices(static_cast<int>(slices), static_cast<int>(R), static_cast<int>(d),
                                    m.data() + base * R, l.data() + base * R, acc.data() + base * R * d,
                                    y + bh * R * d);
  }
};

void run_task(void* data, size_t task) { static_cast<Job*>(data)->run_slice(static_cast<long>(task), true); }
void run_finish(void* data, size_t bh) { static_cast<Job*>(data)->finish(static_cast<long>(bh)); }

const char* op_name(bool int8, bool fresh) {
  return fresh ? (int8 ? "DecodeAttentionBufferInt8" : "DecodeAttentionBuffer")
               : (int8 ? "DecodeAttentionInt8" : "DecodeAttention");
}

// kInt8: the cache is the int8 layout (key uint8 + key_scale, value int8 + value_scale); kNew: two more inputs, the
// step's new entries in float32 (the buffer flavour attends its buffer and them, its mask covering both)
template <bool kInt8, bool kNew>
struct Kernel {
  float scale;
  Kernel(const OrtApi& api, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo ki(info);
    scale = ki.GetAttribute<float>("scale");
    (void)api;
  }

  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const int n_base = kInt8 ? 6 : 4;
    auto q = ctx.GetInput(0);
    auto key = ctx.GetInput(1);
    auto ks = kInt8 ? ctx.GetInput(2) : Ort::ConstValue(nullptr);
    auto value = ctx.GetInput(kInt8 ? 3 : 2);
    auto vs = kInt8 ? ctx.GetInput(4) : Ort::ConstValue(nullptr);
    auto mask = ctx.GetInput(n_base - 1);
    const auto qs = q.GetTensorTypeAndShapeInfo().GetShape();
    const auto cs = key.GetTensorTypeAndShapeInfo().GetShape();
    const auto ms = mask.GetTensorTypeAndShapeInfo().GetShape();
    const std::string op = op_name(kInt8, kNew);
    auto bad = [&](const std::string& what) { throw Ort::Exception(op + ": " + what, ORT_INVALID_ARGUMENT); };
    if (qs.size() != 4 || cs.size() != 4 || ms.size() != 4) bad("q, key and mask must be 4-D");
    if (cs[0] != qs[0] || cs[1] != qs[1] || cs[3] != qs[3]) bad("key must be (B, H_kv, T, d) of q's B, H_kv and d");
    if (value.GetTensorTypeAndShapeInfo().GetShape() != cs) bad("value must have key's shape");
    int64_t S = 0;
    Ort::ConstValue kn(nullptr), vn(nullptr);
    if (kNew) {
      kn = ctx.GetInput(n_base);
      vn = ctx.GetInput(n_base + 1);
      const auto ns = kn.GetTensorTypeAndShapeInfo().GetShape();
      if (ns.size() != 4 || ns[0] != qs[0] || ns[1] != qs[1] || ns[3] != qs[3] ||
          vn.GetTensorTypeAndShapeInfo().GetShape() != ns)
        bad("key_new and value_new must be (B, H_kv, S, d) of q's B, H_kv and d");
      S = ns[2];
    }
    if (ms[3] != cs[2] + S || (ms[0] != 1 && ms[0] != qs[0]) || ms[1] != 1 || ms[2] < 1 || qs[2] % ms[2] != 0)
      bad(kNew ? "mask must be (B or 1, 1, M, T + S) with M dividing q's rows"
               : "mask must be (B or 1, 1, M, T) with M dividing q's rows");
    if (kInt8) {
      const std::vector<int64_t> want{cs[0], cs[1], cs[2], 1};
      if (ks.GetTensorTypeAndShapeInfo().GetShape() != want || vs.GetTensorTypeAndShapeInfo().GetShape() != want)
        bad("key_scale and value_scale must be (B, H_kv, T, 1)");
    }
    std::string error;
    Job job;
    job.isa = chosen_isa(&error);
    if (!error.empty()) bad(error);
    job.B = qs[0], job.H = qs[1], job.R = qs[2], job.d = qs[3], job.T = cs[2], job.S = S, job.M = ms[2];
    job.mask_batches = ms[0];
    job.scale = scale;
    job.int8 = kInt8;
    auto out = ctx.GetOutput(0, qs.data(), qs.size());
    job.y = out.GetTensorMutableData<float>();
    if (job.B * job.H * job.R * job.d == 0) return;
    job.q = q.GetTensorData<float>();
    job.mask = mask.GetTensorData<float>();
    if (kInt8) {
      job.k = key.GetTensorData<uint8_t>();
      job.v = value.GetTensorData<int8_t>();
      job.ks = ks.GetTensorData<float>();
      job.vs = vs.GetTensorData<float>();
    } else {
      job.k = key.GetTensorData<float>();
      job.v = value.GetTensorData<float>();
      job.ks = job.vs = nullptr;
    }
    if (S > 0) {
      job.kn = kn.GetTensorData<float>();
      job.vn = vn.GetTensorData<float>();
    }
    if (job.T + S == 0) {  // nothing to attend: the stock graph's MatMul over no positions gives zeros too
      std::memset(job.y, 0, sizeof(float) * job.B * job.H * job.R * job.d);
      return;
    }
    // slices: enough tasks to occupy the pool at batch 1, each at least 512 positions (a slice's fixed cost) and at
    // most 1,024 (each slice sums its positions' float32 terms in order; the merge adds the slices' sums); the new
    // entries, if any, one more slice
    const long bh = job.B * job.H;
    const long want_tasks = 64;
    long per = (job.T + std::max(1L, want_tasks / bh) - 1) / std::max(1L, want_tasks / bh);
    per = std::min(std::max(per, 512L), 1024L);
    job.slice_len = per;
    job.buffer_slices = (job.T + per - 1) / per;
    job.slices = job.buffer_slices + (S > 0 ? 1 : 0);
    const long tasks = bh * job.slices;
    job.m.assign(tasks * job.R, 0.0f);
    job.l.assign(tasks * job.R, 0.0f);
    job.acc.assign(tasks * job.R * job.d, 0.0f);
    job.work.assign(tasks * job.work_floats(), 0.0f);
    ctx.ParallelFor(run_task, static_cast<size_t>(tasks), 0, &job);
    ctx.ParallelFor(run_finish, static_cast<size_t>(bh), 0, &job);
  }
};

template <bool kInt8, bool kNew>
struct Op : Ort::CustomOpBase<Op<kInt8, kNew>, Kernel<kInt8, kNew>> {
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const { return new Kernel<kInt8, kNew>(api, info); }
  const char* GetName() const { return op_name(kInt8, kNew); }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return (kInt8 ? 6 : 4) + (kNew ? 2 : 0); }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    if (kInt8 && i == 1) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    if (kInt8 && i == 3) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

Op<false, false> g_float_op;
Op<true, false> g_int8_op;
Op<false, true> g_float_buffer_op;
Op<true, true> g_int8_buffer_op;
std::mutex g_mutex;
std::vector<Ort::CustomOpDomain> g_domains;

}  // namespace

extern "C" {

// onnxruntime's entry point for SessionOptions.register_custom_ops_library(path).
__attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options,
                                                                     const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  try {
    std::lock_guard<std::mutex> lock(g_mutex);
    Ort::CustomOpDomain domain{"ai.paddle_vha"};
    domain.Add(&g_float_op);
    domain.Add(&g_int8_op);
    domain.Add(&g_float_buffer_op);
    domain.Add(&g_int8_buffer_op);
    Ort::UnownedSessionOptions(options).Add(domain);
    g_domains.push_back(std::move(domain));  // must outlive every session that uses it
  } catch (const std::exception& e) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, e.what());
  }
  return nullptr;
}

// The instruction set calls run now ("avx512", "avx2", "baseline"), or "error: <why>" (read through ctypes).
__attribute__((visibility("default"))) const char* vha_attention_isa() {
  static thread_local std::string said;
  std::string error;
  const Isa isa = chosen_isa(&error);
  said = error.empty() ? kIsaNames[static_cast<int>(isa)] : "error: " + error;
  return said.c_str();
}
}
