// Fused VHA prologue (Premix -> q_norm / k_norm -> rotate-half RoPE): Paddle custom operator, CPU kernels,
// op registration (PD_BUILD_OP / PD_BUILD_GRAD_OP). The per-element math lives in vha_prologue_math.h,
// shared with the CUDA kernels.
//
// Inputs   QPhys  [B, S, H_p, r]     physical queries
//          K      [B, S, H_kv, d]    keys
//          Premix [H_kv, r, d]       one map per KV group
//          QNormW [d], KNormW [d]    RMSNorm weights
//          Cos, Sin [Bc, S, d]       rotate-half tables (Bc = 1 or B), e.g. Qwen3RotaryEmbedding's output
// Outputs  QOut   [B, S, H_v, d]     (heads_first: [B, H_v, S, d]), virtual head j = g*H_p + i (group-major)
//          KOut   [B, S, H_kv, d]    (heads_first: [B, H_kv, S, d])
// Attrs    eps (RMSNorm epsilon), heads_first (write the attention layout directly, saving a transpose).
//
// CPU design: the rows of QPhys ([B*S*H_p, r]) are processed in blocks of ~32 rows per thread. For each
// block and group the Premix product is formed in an L1/L2-resident scratch by a register-tiled kernel
// (GCC vector extensions: 8 rows x 2 vectors of accumulators), normalised and rotated there, and written
// once. Backward recomputes the Premix product instead of saving it (so nothing but the inputs is kept),
// and fuses RoPE adjoint, RMSNorm backward and both Premix gradient products in the same pass; the weight
// gradients are accumulated per thread and reduced at the end. Compute type: float (fp32 / bf16 / fp16
// inputs, one rounding at the output) or double (fp64 inputs).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "paddle/extension.h"
#include "vha_prologue_math.h"

namespace {

template <typename C>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(64)));
  static constexpr int L = 16;
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(64)));
  static constexpr int L = 8;
};

template <typename V, typename C>
inline V vload(const C* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V, typename C>
inline void vstore(C* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// Cout[m][n] (+)= sum_k A(m, k) * B[k][n], m < MR, n < NV*L; A(m, k) = A[m*ars + k*aks].
// K is summed in chunks of kKChunk, each in fresh registers and then added to the output tile, so a long
// K (or a long running sum across calls) does not accumulate rounding error sequentially.
constexpr int kKChunk = 32;
template <typename C, int MR, int NV>
inline void micro(const C* A, long ars, long aks, const C* B, long ldb, int K, C* Cp, long ldc, bool acc) {
  using V = typename VecOf<C>::type;
  constexpr int L = VecOf<C>::L;
  for (int k0 = 0; k0 < K || (k0 == 0 && !acc); k0 += kKChunk) {
    const int k1 = std::min(K, k0 + kKChunk);
    V c[MR][NV];
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < NV; ++v) c[m][v] = V{};
    for (int k = k0; k < k1; ++k) {
      V b[NV];
      for (int v = 0; v < NV; ++v) b[v] = vload<V>(B + k * ldb + v * L);
      for (int m = 0; m < MR; ++m) {
        const C a = A[m * ars + k * aks];
        for (int v = 0; v < NV; ++v) c[m][v] += a * b[v];
      }
    }
    const bool add = acc || k0 > 0;
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < NV; ++v)
        vstore(Cp + m * ldc + v * L, add ? c[m][v] + vload<V>(Cp + m * ldc + v * L) : c[m][v]);
    if (K == 0) break;
  }
}

// Scalar tail for the columns no full vector covers.
template <typename C>
inline void micro_tail(const C* A, long ars, long aks, const C* B, long ldb, int K, C* Cp, long ldc, bool acc, int mr,
                       int nc) {
  for (int m = 0; m < mr; ++m)
    for (int n = 0; n < nc; ++n) {
      C tot = acc ? Cp[m * ldc + n] : C(0);
      for (int k0 = 0; k0 < K; k0 += kKChunk) {  // chunked like micro()
        C s = 0;
        for (int k = k0; k < std::min(K, k0 + kKChunk); ++k) s += A[m * ars + k * aks] * B[k * ldb + n];
        tot += s;
      }
      Cp[m * ldc + n] = tot;
    }
}

// Cout (M x N, row stride ldc) (+)= A (M x K, strides ars/aks) @ B (K x N, row stride ldb). Small blocks only.
template <typename C>
void gemm(int M, int N, int K, const C* A, long ars, long aks, const C* B, long ldb, C* Cp, long ldc, bool acc) {
  constexpr int L = VecOf<C>::L, MR = 8;
  int n0 = 0;
  for (; n0 + 2 * L <= N; n0 += 2 * L) {  // column panels outermost: the B panel stays in L1
    int m0 = 0;
    for (; m0 + MR <= M; m0 += MR) micro<C, MR, 2>(A + m0 * ars, ars, aks, B + n0, ldb, K, Cp + m0 * ldc + n0, ldc, acc);
    for (; m0 < M; ++m0) micro<C, 1, 2>(A + m0 * ars, ars, aks, B + n0, ldb, K, Cp + m0 * ldc + n0, ldc, acc);
  }
  for (; n0 + L <= N; n0 += L) {
    int m0 = 0;
    for (; m0 + MR <= M; m0 += MR) micro<C, MR, 1>(A + m0 * ars, ars, aks, B + n0, ldb, K, Cp + m0 * ldc + n0, ldc, acc);
    for (; m0 < M; ++m0) micro<C, 1, 1>(A + m0 * ars, ars, aks, B + n0, ldb, K, Cp + m0 * ldc + n0, ldc, acc);
  }
  if (n0 < N) micro_tail(A, ars, aks, B + n0, ldb, K, Cp + n0, ldc, acc, M, N - n0);
}

template <typename C, typename T>
inline C cv(const T& x) {
  return static_cast<C>(x);
}

struct Dims {
  long B, S, Hp, Hkv, r, d, Bc;
  bool heads_first;
  long Hv() const { return Hp * Hkv; }
  // element offset of row (b, s, head) of an output with `heads` heads
  long out_off(long b, long s, long head, long heads) const {
    return heads_first ? ((b * heads + head) * S + s) * d : ((b * S + s) * heads + head) * d;
  }
  long table_off(long b, long s) const { return ((Bc == 1 ? 0 : b) * S + s) * d; }
};

int num_threads_for(long tokens) {
  long n = 0;
  if (const char* e = std::getenv("VHA_PROLOGUE_THREADS")) n = std::atol(e);
  if (n <= 0) n = std::max(1u, std::thread::hardware_concurrency());
  n = std::min(n, std::max(1L, tokens / 64));  // at least 64 tokens per thread: no threads for decode
  return int(n);
}

template <typename F>
void parallel_tokens(long tokens, int nthreads, F&& fn) {  // fn(tid, t0, t1)
  if (nthreads <= 1) {
    fn(0, 0L, tokens);
    return;
  }
  std::vector<std::thread> pool;
  const long chunk = (tokens + nthreads - 1) / nthreads;
  for (int t = 0; t < nthreads; ++t) {
    const long t0 = t * chunk, t1 = std::min(tokens, t0 + chunk);
    if (t0 >= t1) break;
    pool.emplace_back([&, t, t0, t1] { fn(t, t0, t1); });
  }
  for (auto& th : pool) th.join();
}

// Normalise + rotate one row x (compute type) and write it.
template <typename T, typename C>
inline void norm_rope_row(const C* x, const C* w, const T* cosr, const T* sinr, T* out, int d, C eps) {
  const int h = d / 2;
  C ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int c = 0; c < d; ++c) ss += x[c] * x[c];
  const C rs = vha::rms_rstd(ss, d, eps);
#pragma omp simd
  for (int c = 0; c < h; ++c) {
    C lo, hi;
    vha::rope_pair_fwd(x[c] * rs * w[c], x[c + h] * rs * w[c + h], cv<C>(cosr[c]), cv<C>(sinr[c]), cv<C>(cosr[c + h]),
                       cv<C>(sinr[c + h]), &lo, &hi);
    out[c] = T(lo);
    out[c + h] = T(hi);
  }
}

// Backward of norm_rope_row: writes gx (compute type), accumulates the norm-weight gradient into gw.
template <typename T, typename C>
inline void norm_rope_row_bwd(const C* x, const C* w, const T* cosr, const T* sinr, const T* g, C* gx, C* gw, int d,
                              C eps) {
  const int h = d / 2;
  C ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int c = 0; c < d; ++c) ss += x[c] * x[c];
  const C rs = vha::rms_rstd(ss, d, eps);
  C dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int c = 0; c < h; ++c) {
    C gl, gh;
    vha::rope_pair_bwd(cv<C>(g[c]), cv<C>(g[c + h]), cv<C>(cosr[c]), cv<C>(sinr[c]), cv<C>(cosr[c + h]),
                       cv<C>(sinr[c + h]), &gl, &gh);
    gw[c] += gl * x[c] * rs;
    gw[c + h] += gh * x[c + h] * rs;
    const C tl = gl * w[c], th = gh * w[c + h];
    gx[c] = tl;
    gx[c + h] = th;
    dot += tl * x[c] + th * x[c + h];
  }
  const C dd = dot / C(d);
#pragma omp simd
  for (int c = 0; c < d; ++c) gx[c] = vha::rms_input_grad(gx[c], x[c], rs, dd);
}

constexpr int kRowsPerBlock = 32;  // Premix rows (token x physical head) per block
constexpr int kBlocksPerSuper = 8;  // backward: blocks per super-block (K of the dW GEMM)

template <typename T, typename C>
void prologue_fwd(const T* qp, const T* kin, const T* W, const T* wq, const T* wk, const T* cosp, const T* sinp, T* qo,
                  T* ko, const Dims& D, C eps) {
  const long N = D.B * D.S, Hp = D.Hp, Hkv = D.Hkv, r = D.r, d = D.d, Hv = D.Hv();
  std::vector<C> Wc(Hkv * r * d), wqc(d), wkc(d);
  for (long i = 0; i < Hkv * r * d; ++i) Wc[i] = cv<C>(W[i]);
  for (long c = 0; c < d; ++c) wqc[c] = cv<C>(wq[c]), wkc[c] = cv<C>(wk[c]);
  const long tb = std::max(1L, kRowsPerBlock / Hp);  // tokens per block
  parallel_tokens(N, num_threads_for(N), [&](int, long t0, long t1) {
    std::vector<C> A(tb * Hp * r), U(tb * Hp * d), xk(d);
    for (long ta = t0; ta < t1; ta += tb) {
      const long nt = std::min(tb, t1 - ta), M = nt * Hp;
      const T* src = qp + ta * Hp * r;  // (nt*H_p, r) rows, contiguous
      for (long i = 0; i < M * r; ++i) A[i] = cv<C>(src[i]);
      for (long g = 0; g < Hkv; ++g) {
        gemm<C>(int(M), int(d), int(r), A.data(), r, 1, Wc.data() + g * r * d, d, U.data(), d, false);  // (M, d)
        for (long m = 0; m < M; ++m) {
          const long t = ta + m / Hp, i = m % Hp, b = t / D.S, s = t % D.S;
          norm_rope_row<T, C>(U.data() + m * d, wqc.data(), cosp + D.table_off(b, s), sinp + D.table_off(b, s),
                              qo + D.out_off(b, s, g * Hp + i, Hv), int(d), eps);
        }
      }
      for (long t = ta; t < ta + nt; ++t) {
        const long b = t / D.S, s = t % D.S;
        for (long g = 0; g < Hkv; ++g) {
          const T* kr = kin + (t * Hkv + g) * d;
          for (long c = 0; c < d; ++c) xk[c] = cv<C>(kr[c]);
          norm_rope_row<T, C>(xk.data(), wkc.data(), cosp + D.table_off(b, s), sinp + D.table_off(b, s),
                              ko + D.out_off(b, s, g, Hkv), int(d), eps);
        }
      }
    }
  });
}

template <typename T, typename C>
void prologue_bwd(const T* qp, const T* kin, const T* W, const T* wq, const T* wk, const T* cosp, const T* sinp,
                  const T* gqo, const T* gko, T* gqp, T* gk, T* gW, T* gwq, T* gwk, const Dims& D, C eps) {
  const long N = D.B * D.S, Hp = D.Hp, Hkv = D.Hkv, r = D.r, d = D.d, Hv = D.Hv();
  std::vector<C> Wc(Hkv * r * d), WTc(Hkv * d * r), wqc(d), wkc(d);
  for (long g = 0; g < Hkv; ++g)
    for (long k = 0; k < r; ++k)
      for (long c = 0; c < d; ++c) {
        const C v = cv<C>(W[(g * r + k) * d + c]);
        Wc[(g * r + k) * d + c] = v;
        WTc[(g * d + c) * r + k] = v;  // W[g]^T: (d, r)
      }
  for (long c = 0; c < d; ++c) wqc[c] = cv<C>(wq[c]), wkc[c] = cv<C>(wk[c]);
  const int nth = num_threads_for(N);
  // Weight gradients (gW: H_kv*r*d, g q_norm: d, g k_norm: d) are sums over every row. Each super-block's partial
  // is formed fresh, added to a per-thread level-2 sum that is folded into level 3 every kFold super-blocks, and the
  // threads' totals are added at the end: the rounding error grows with about log(rows), not rows.
  const long acc_len = Hkv * r * d + 2 * d;
  constexpr int kFold = 32;
  std::vector<std::vector<C>> totals(nth, std::vector<C>(acc_len, C(0)));
  const long tb = std::max(1L, kRowsPerBlock / Hp);  // tokens per block (~32 rows: U, GU rows stay in L1)
  const long sb = tb * kBlocksPerSuper;               // tokens per super-block (~256 rows: the dW GEMM's K)
  parallel_tokens(N, nth, [&](int tid, long t0, long t1) {
    std::vector<C> P(acc_len), L2(acc_len, C(0));
    C* L3 = totals[tid].data();
    C* gWblk = P.data();
    C* gwq_blk = gWblk + Hkv * r * d;
    C* gwk_blk = gwq_blk + d;
    long nsuper = 0;
    std::vector<C> A(sb * Hp * r), U(tb * Hp * d), GU(Hkv * sb * Hp * d), GQ(tb * Hp * r), xk(d), gx(d);
    for (long ts = t0; ts < t1; ts += sb) {
      const long nts = std::min(sb, t1 - ts), Ms = nts * Hp;
      const T* src = qp + ts * Hp * r;  // (Ms, r) rows of the super-block
      for (long i = 0; i < Ms * r; ++i) A[i] = cv<C>(src[i]);
      std::fill(gwq_blk, gwq_blk + 2 * d, C(0));
      for (long ta = ts; ta < ts + nts; ta += tb) {
        const long nt = std::min(tb, ts + nts - ta), M = nt * Hp, m0 = (ta - ts) * Hp;
        const C* Ab = A.data() + m0 * r;  // this block's rows
        std::fill(GQ.begin(), GQ.begin() + M * r, C(0));
        for (long g = 0; g < Hkv; ++g) {
          C* GUb = GU.data() + (g * sb * Hp + m0) * d;  // (M, d) rows of dL/du for group g
          gemm<C>(int(M), int(d), int(r), Ab, r, 1, Wc.data() + g * r * d, d, U.data(), d, false);  // recompute u
          for (long m = 0; m < M; ++m) {
            const long t = ta + m / Hp, i = m % Hp, b = t / D.S, s = t % D.S;
            norm_rope_row_bwd<T, C>(U.data() + m * d, wqc.data(), cosp + D.table_off(b, s),
                                    sinp + D.table_off(b, s), gqo + D.out_off(b, s, g * Hp + i, Hv), GUb + m * d,
                                    gwq_blk, int(d), eps);
          }
          // gq_phys (M, r) += GU (M, d) @ W[g]^T (d, r)
          gemm<C>(int(M), int(r), int(d), GUb, d, 1, WTc.data() + g * d * r, r, GQ.data(), r, true);
        }
        T* dst = gqp + ta * Hp * r;
        for (long i = 0; i < M * r; ++i) dst[i] = T(GQ[i]);
        for (long t = ta; t < ta + nt; ++t) {
          const long b = t / D.S, s = t % D.S;
          for (long g = 0; g < Hkv; ++g) {
            const T* kr = kin + (t * Hkv + g) * d;
            T* gkr = gk + (t * Hkv + g) * d;
            if (gko == nullptr) {
              for (long c = 0; c < d; ++c) gkr[c] = T(C(0));
              continue;
            }
            for (long c = 0; c < d; ++c) xk[c] = cv<C>(kr[c]);
            norm_rope_row_bwd<T, C>(xk.data(), wkc.data(), cosp + D.table_off(b, s), sinp + D.table_off(b, s),
                                    gko + D.out_off(b, s, g, Hkv), gx.data(), gwk_blk, int(d), eps);
            for (long c = 0; c < d; ++c) gkr[c] = T(gx[c]);
          }
        }
      }
      // gW[g] (r, d) = A^T (r, Ms) @ GU[g] (Ms, d) for this super-block
      for (long g = 0; g < Hkv; ++g)
        gemm<C>(int(r), int(d), int(Ms), A.data(), 1, r, GU.data() + g * sb * Hp * d, d, gWblk + g * r * d, d, false);
#pragma omp simd
      for (long i = 0; i < acc_len; ++i) L2[i] += P[i];
      if (++nsuper % kFold == 0) {
#pragma omp simd
        for (long i = 0; i < acc_len; ++i) L3[i] += L2[i], L2[i] = C(0);
      }
    }
    for (long i = 0; i < acc_len; ++i) L3[i] += L2[i];
  });
  for (int t = 1; t < nth; ++t)
    for (long i = 0; i < acc_len; ++i) totals[0][i] += totals[t][i];
  const C* tot = totals[0].data();
  for (long i = 0; i < Hkv * r * d; ++i) gW[i] = T(tot[i]);
  for (long c = 0; c < d; ++c) gwq[c] = T(tot[Hkv * r * d + c]), gwk[c] = T(tot[Hkv * r * d + d + c]);
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

std::vector<int64_t> out_shape(int64_t B, int64_t S, int64_t H, int64_t d, bool heads_first) {
  return heads_first ? std::vector<int64_t>{B, H, S, d} : std::vector<int64_t>{B, S, H, d};
}

}  // namespace

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

std::vector<paddle::Tensor> VhaPrologueForward(const paddle::Tensor& q_phys_in, const paddle::Tensor& k_in,
                                               const paddle::Tensor& premix_in, const paddle::Tensor& wq_in,
                                               const paddle::Tensor& wk_in, const paddle::Tensor& cos_in,
                                               const paddle::Tensor& sin_in, float eps, bool heads_first) {
#ifdef VHA_WITH_CUDA
  if (q_phys_in.is_gpu())
    return vha_prologue_cuda_forward(q_phys_in, k_in, premix_in, wq_in, wk_in, cos_in, sin_in, eps, heads_first);
#endif
  PD_CHECK(q_phys_in.is_cpu(), "vha_prologue: this build has CPU kernels only");
  const auto q_phys = q_phys_in.contiguous(), k = k_in.contiguous(), premix = premix_in.contiguous(),
             wq = wq_in.contiguous(), wk = wk_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const Dims D = make_dims(q_phys, k, premix, wq, wk, cos, sin, heads_first);
  auto qo = paddle::empty(out_shape(D.B, D.S, D.Hv(), D.d, heads_first), q_phys.dtype(), q_phys.place());
  auto ko = paddle::empty(out_shape(D.B, D.S, D.Hkv, D.d, heads_first), q_phys.dtype(), q_phys.place());
  VHA_DISPATCH(q_phys.dtype(), prologue_fwd<T, C>(q_phys.data<T>(), k.data<T>(), premix.data<T>(), wq.data<T>(),
                                                  wk.data<T>(), cos.data<T>(), sin.data<T>(), qo.data<T>(),
                                                  ko.data<T>(), D, C(eps)));
  return {qo, ko};
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
  const auto q_phys = q_phys_in.contiguous(), k = k_in.contiguous(), premix = premix_in.contiguous(),
             wq = wq_in.contiguous(), wk = wk_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const Dims D = make_dims(q_phys, k, premix, wq, wk, cos, sin, heads_first);
  // A missing output gradient (an output that did not reach the loss) counts as zero.
  paddle::Tensor gq = gq_in.initialized() ? gq_in.contiguous()
                                          : paddle::zeros(out_shape(D.B, D.S, D.Hv(), D.d, heads_first),
                                                          q_phys.dtype(), q_phys.place());
  const bool have_gk = gk_in.initialized();
  paddle::Tensor gk = have_gk ? gk_in.contiguous() : gk_in;
  auto gqp = paddle::empty(q_phys.shape(), q_phys.dtype(), q_phys.place());
  auto gkk = paddle::empty(k.shape(), k.dtype(), k.place());
  auto gW = paddle::empty(premix.shape(), premix.dtype(), premix.place());
  auto gwq = paddle::empty(wq.shape(), wq.dtype(), wq.place());
  auto gwk = paddle::empty(wk.shape(), wk.dtype(), wk.place());
  VHA_DISPATCH(q_phys.dtype(),
               prologue_bwd<T, C>(q_phys.data<T>(), k.data<T>(), premix.data<T>(), wq.data<T>(), wk.data<T>(),
                                  cos.data<T>(), sin.data<T>(), gq.data<T>(), have_gk ? gk.data<T>() : nullptr,
                                  gqp.data<T>(), gkk.data<T>(), gW.data<T>(), gwq.data<T>(), gwk.data<T>(), D,
                                  C(eps)));
  return {gqp, gkk, gW, gwq, gwk};
}

std::vector<std::vector<int64_t>> VhaPrologueInferShape(const std::vector<int64_t>& qs, const std::vector<int64_t>& ks,
                                                        const std::vector<int64_t>& ps, const std::vector<int64_t>&,
                                                        const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                        const std::vector<int64_t>&, float, bool heads_first) {
  const int64_t hv = (qs[2] < 0 || ps[0] < 0) ? -1 : qs[2] * ps[0];
  return {out_shape(qs[0], qs[1], hv, ks[3], heads_first), out_shape(ks[0], ks[1], ks[2], ks[3], heads_first)};
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
