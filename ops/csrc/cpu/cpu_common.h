// What the CPU kernels share across their per-ISA copies (cpu_kernels.inc, included by op_cpu.cc): the problem
// dimensions with the output / table offsets, the compute-type cast, and the token-parallel thread pool.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <vector>

namespace vha_cpu_common {

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

}  // namespace vha_cpu_common
