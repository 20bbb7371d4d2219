// A host emulator of the CUDA execution model, enough to run this project's kernels on a CPU in CI.
//
// Compiled with g++ around the unmodified kernel sources (ops/csrc/cuda/c_api.cu with -x c++ -DVHA_EMU):
// ops/csrc/cuda/device_common.cuh includes this header instead of cuda_runtime.h and takes its two hooks, VHA_LAUNCH (for
// `kernel<<<grid, block, smem, stream>>>`) and VHA_DYNAMIC_SHARED (for `extern __shared__`), plus the mma.sync body.
//
// Model: blocks run one at a time; each GPU thread of the block is a ucontext fiber with its own stack (a guard page
// below it). A fiber runs until it reaches a rendezvous point: __syncthreads (the whole block), __syncwarp,
// __shfl_xor_sync and mma.sync (the 32 lanes of its warp). The scheduler resumes runnable fibers in the order the
// launch asks for (in order, reversed, or shuffled by a seed: a missing barrier then shows up as a wrong result),
// releases a barrier when every live thread of its scope waits at it, and stops the launch with an error naming the
// block, the threads and the barriers when:
//   * threads wait at __syncthreads while others of the block have exited or wait at a warp collective (divergence),
//   * the lanes of a warp wait at different collectives, or some lanes exited (a full-mask collective needs all 32),
//   * nothing can run and nothing can be released (deadlock).
// mma.sync.m16n8k16 (bf16 / f16 inputs, f32 accumulation) is computed from the fragment layout tables of the PTX ISA
// (written from the ISA, not from the kernels): with g = lane / 4 and t = lane % 4, A's registers a0..a3 hold rows
// g, g+8, g, g+8 at k = 2t..2t+1, 2t..2t+1, 2t+8..2t+9, 2t+8..2t+9; B's b0, b1 hold k = 2t..2t+1 and 2t+8..2t+9 of
// column g; C/D's c0, c1 are row g and c2, c3 row g+8, at columns 2t, 2t+1.
// Launch checks: block size (1..1024 threads), grid limits (x < 2^31, y and z <= 65535, none 0), dynamic shared
// memory against 48 KB or the size opted in by cudaFuncSetAttribute (at most 227 KB, sm_90). Device buffers from
// emu_alloc end at a PROT_NONE page, so an out-of-bounds read past a buffer's end faults; the dynamic shared memory is
// filled with 0xCD bytes before each block, so reading it uninitialised gives garbage, not zeros.
// Race detector (built with -DVHA_EMU_RACECHECK, the kernels compiled with -fsanitize=thread but linked without
// libtsan: the __tsan_* entry points are defined below): every load and store of the kernels reaches a hook that
// ignores addresses outside shared memory (the dynamic buffer and the emu_shared section) and host code. A shadow
// record per byte of shared memory (its last writer, and up to two readers chosen so that no race is missed) holds
// the thread and the epochs of the access: the block epoch advances at each __syncthreads released (and each new
// block, which resets the shadow), a warp's epoch at each __syncwarp of that warp. Two accesses to one byte by two
// threads of a block, at least one a write, race unless a __syncthreads separated them, or both threads are in one
// warp and a __syncwarp separated them; shuffles, mma and ldmatrix do not order memory. cp.async writes count as
// writes by the issuing thread when their group is retired; ldmatrix reads as reads by the lane giving the row
// address. A race stops the run (die) naming the shared-memory offset, the block, the two threads and their access
// kinds and code addresses. Not seen: atomics (atomicAdd is not recorded) and memcpy / memset calls into libc.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(VHA_EMU_RACECHECK)
#include <cxxabi.h>
#include <dlfcn.h>
// The emulator's own functions are not instrumented (only the kernels' accesses are of interest, and the hooks must
// not call instrumented code that calls the hooks).
#define EMU_NOTSAN __attribute__((no_sanitize_thread))
#else
#define EMU_NOTSAN
#endif

// ---- the CUDA runtime surface the kernels and launchers use ----------------------------------------------------
// Types and declarations come from the toolkit's headers (cuda_fp16.h brings cuda_runtime_api.h); the functions the
// kernels call are defined below, for the emulator.
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// static shared arrays: one per kernel instantiation (blocks run one at a time), in a section of their own
#define __shared__ static __attribute__((section("emu_shared")))
#ifndef __CUDA_ARCH__
#define __CUDA_ARCH__ 900  // the device-code paths (mma) compile; their bodies come from the emulator
#endif

namespace emu {

constexpr int kWarp = 32;
constexpr size_t kStackBytes = 128 * 1024;
enum class Wait { None, Block, Warp };
enum class Coll { None, Sync, Shfl, Mma, Ldm };

struct AsyncCopy {  // one cp.async: performed when a cp.async.wait_group retires its group, not before
  void* dst;
  const void* src;
  int bytes, src_bytes;
};

struct Lane {
  ucontext_t ctx;
  char* stack = nullptr;
  uint3 tid;
  bool done = false;
  Wait wait = Wait::None;
  Coll coll = Coll::None;
  unsigned mask = 0;
  // collective payloads
  unsigned char val[8];
  int shfl_xor = 0, val_bytes = 0;
  uint32_t a[4], b[2];
  float c[4];
  bool bf16 = false;
  const void* ldm_addr = nullptr;  // ldmatrix: this lane's row address, how many matrices, transposed or not
  int ldm_num = 0;
  bool ldm_trans = false;
  uint32_t ldm_out[4];
  std::vector<AsyncCopy> open_copies;               // cp.async issued since the last commit_group
  std::vector<std::vector<AsyncCopy>> copy_groups;  // committed, not yet waited for (oldest first)
};

struct State {
  std::vector<Lane> lanes;
  std::vector<char*> stacks;
  int cur = -1;
  ucontext_t sched;
  uint3 block_idx, block_dim, grid_dim;
  std::vector<unsigned char> dyn_smem;
  std::function<void()> body;
  cudaError_t last_error = cudaSuccess;
  std::string error;  // why the last launch failed (emu_last_error_message)
  int order = 0;      // 0 in order, 1 reversed, 2 shuffled (seed)
  unsigned seed = 0;
  int sm_count = 4;
  int cc_major = 9;  // the emulated device's compute capability (major): sm_90 unless a test says otherwise
  std::map<const void*, int> max_dyn_smem;
  long launches = 0;
};
inline State& g() {
  static State s;
  return s;
}
inline Lane& cur() { return g().lanes[g().cur]; }
}  // namespace emu
// Static __shared__ arrays are placed in their own section, so the linker's start/stop symbols bound them.
extern "C" unsigned char __start_emu_shared[] __attribute__((weak));
extern "C" unsigned char __stop_emu_shared[] __attribute__((weak));
namespace emu {
inline bool in_shared(const void* p, size_t bytes) {
  const auto* c = static_cast<const unsigned char*>(p);
  const auto& dyn = g().dyn_smem;
  if (!dyn.empty() && c >= dyn.data() && c + bytes <= dyn.data() + dyn.size()) return true;
  return __start_emu_shared != nullptr && c >= __start_emu_shared && c + bytes <= __stop_emu_shared;
}

[[noreturn]] inline void die(const std::string& msg) {  // an error inside a fiber ends the whole process loudly
  std::fprintf(stderr, "cuda_emu: %s\n", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void yield() { swapcontext(&cur().ctx, &g().sched); }

EMU_NOTSAN inline void retire(Lane& l, size_t keep);
inline void entry() {
  g().body();
  cur().copy_groups.push_back(std::move(cur().open_copies));  // a thread's copies land even if it never waits
  retire(cur(), 0);
  cur().done = true;
  cur().wait = Wait::None;
  swapcontext(&cur().ctx, &g().sched);
}

inline char* new_stack() {  // stack with a PROT_NONE guard page below it
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("out of memory for fiber stacks");
  mprotect(p, page, PROT_NONE);
  return static_cast<char*>(p) + page;
}

inline std::string where(int i) {
  const Lane& l = g().lanes[i];
  char buf[160];
  std::snprintf(buf, sizeof buf, "block (%u,%u,%u) thread (%u,%u,%u)", g().block_idx.x, g().block_idx.y,
                g().block_idx.z, l.tid.x, l.tid.y, l.tid.z);
  return buf;
}

// ---- shared-memory race detector (the state and checks; the __tsan_* hooks are at the end of this file) ----------
// Without VHA_EMU_RACECHECK every function here is an empty inline: the normal build is unchanged.
enum RaceKind : uint8_t { kRead = 0, kWrite = 1, kLdmRead = 2, kAsyncWrite = 3 };
#if defined(VHA_EMU_RACECHECK)
struct RaceRec {         // one access: b == 0 means none (block epochs start at 1)
  uint32_t b = 0, w = 0;  // block epoch, and the epoch of the thread's warp, at the access
  uint16_t lane = 0;      // linear thread index in the block (warp = lane / 32)
  uint8_t kind = 0;
  uint32_t bytes = 0;
  const void* pc = nullptr;
};
struct RaceCell {  // shadow of one byte of shared memory: the last write, and two reads of the current block epoch
  RaceRec wr, r1, r2;
};
struct RaceState {
  int lane = -1;  // the running fiber (g().cur), -1 in host code: its accesses are not checked
  uint32_t block_epoch = 0;
  uint32_t warp_epoch[32] = {};
  uintptr_t dyn_lo = 0, dyn_n = 0, st_lo = 0, st_n = 0;
  RaceCell* dyn = nullptr;
  size_t dyn_cap = 0;
  RaceCell* st = nullptr;
  const void* kernel = nullptr;
};
inline RaceState race;

EMU_NOTSAN inline void race_set_lane(int i) { race.lane = i; }
EMU_NOTSAN inline void race_kernel(const void* k) { race.kernel = k; }
EMU_NOTSAN inline void race_block_barrier() { ++race.block_epoch; }  // every thread passed it: all earlier accesses
EMU_NOTSAN inline void race_warp_barrier(int warp) { ++race.warp_epoch[warp]; }
// A new block: a new epoch (the shadow of earlier blocks is then stale, i.e. reset), and where shared memory is.
EMU_NOTSAN inline void race_block_start(const unsigned char* dyn, size_t dyn_bytes) {
  RaceState& R = race;
  ++R.block_epoch;
  for (uint32_t& w : R.warp_epoch) w = 0;
  R.dyn_lo = reinterpret_cast<uintptr_t>(dyn);
  R.dyn_n = dyn_bytes;
  if (dyn_bytes > R.dyn_cap) {
    std::free(R.dyn);
    R.dyn = static_cast<RaceCell*>(std::calloc(dyn_bytes, sizeof(RaceCell)));
    if (R.dyn == nullptr) die("out of memory for the race detector's shadow");
    R.dyn_cap = dyn_bytes;
  }
  const uintptr_t st_lo = reinterpret_cast<uintptr_t>(__start_emu_shared);  // integers: two distinct objects
  const uintptr_t st_hi = reinterpret_cast<uintptr_t>(__stop_emu_shared);
  if (R.st == nullptr && st_lo != 0 && st_hi > st_lo) {
    R.st_lo = st_lo;
    R.st_n = st_hi - st_lo;
    R.st = static_cast<RaceCell*>(std::calloc(R.st_n, sizeof(RaceCell)));
    if (R.st == nullptr) die("out of memory for the race detector's shadow");
  }
}

inline std::string race_symbol(const void* pc, bool offset) {  // "function+0x1f (lib+0x2a3f)", for addr2line
  Dl_info info;
  if (pc == nullptr || dladdr(pc, &info) == 0) return "?";
  std::string name = "?";
  if (info.dli_sname != nullptr) {
    int st = 0;
    char* dm = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &st);
    name = st == 0 && dm != nullptr ? dm : info.dli_sname;
    std::free(dm);
    const size_t paren = name.find('(');
    if (paren != std::string::npos) name.resize(paren);
  }
  if (!offset) return name;
  char buf[64];
  std::snprintf(buf, sizeof buf, "+0x%lx (lib+0x%lx)",
                info.dli_saddr ? (unsigned long)((const char*)pc - (const char*)info.dli_saddr) : 0ul,
                (unsigned long)((const char*)pc - (const char*)info.dli_fbase));
  return name + buf;
}

[[noreturn]] EMU_NOTSAN inline void race_report(const RaceRec& now, const RaceRec& before, size_t off, bool dyn) {
  race.lane = -1;  // nothing more is checked: the message is built by (instrumented) library code
  static const char* const kinds[] = {"read", "write", "ldmatrix read", "cp.async write"};
  auto who = [](const RaceRec& r) {
    const uint3 t = g().lanes[r.lane].tid;
    char buf[200];
    std::snprintf(buf, sizeof buf, "%u-byte %s by thread (%u,%u,%u) (warp %d)", r.bytes, kinds[r.kind], t.x, t.y, t.z,
                  r.lane / kWarp);
    return std::string(buf) + (r.pc ? " at " + race_symbol(r.pc, true) : std::string());
  };
  char head[200];
  std::snprintf(head, sizeof head, "race on shared memory: %s shared memory offset %zu, block (%u,%u,%u) of kernel ",
                dyn ? "dynamic" : "static (emu_shared section)", off, g().block_idx.x, g().block_idx.y,
                g().block_idx.z);
  const bool same_warp = now.lane / kWarp == before.lane / kWarp;
  die(std::string(head) + race_symbol(race.kernel, false) + ": " + who(now) + " and an earlier " + who(before) +
      (same_warp ? ", one warp, with no __syncwarp or __syncthreads between them (shuffles, mma and ldmatrix do not "
                   "order memory)"
                 : ", different warps, with no __syncthreads between them"));
}

// Whether the recorded access r and an access now by `lane` (warp w) race: same block epoch, another thread, and
// another warp or the same warp epoch.
EMU_NOTSAN inline bool race_unordered(const RaceRec& r, int lane, int w) {
  const RaceState& R = race;
  return r.b == R.block_epoch && r.lane != lane && (r.lane / kWarp != w || r.w == R.warp_epoch[w]);
}

// Keep a read: the two slots hold reads of the current block epoch such that, for any later writer, a racing read
// is among them whenever one exists: two reads of two different warps (any writer is in another warp than one of
// them) once two warps read, else the newest-epoch reads of up to two different lanes of the one warp.
EMU_NOTSAN inline void race_add_read(RaceCell& c, const RaceRec& n) {
  const uint32_t B = race.block_epoch;
  const int wn = n.lane / kWarp;
  const bool v1 = c.r1.b == B, v2 = c.r2.b == B;
  if (!v1 && !v2) {
    c.r1 = n;
    return;
  }
  RaceRec& a = v1 ? c.r1 : c.r2;  // a valid slot
  RaceRec& o = v1 ? c.r2 : c.r1;  // the other one
  if (!(v1 && v2)) {
    if (a.lane / kWarp != wn) o = n;                 // now two warps
    else if (a.lane == n.lane || a.w < n.w) a = n;   // the new read covers the old one
    else o = n;                                      // a second lane of the warp in this warp epoch
    return;
  }
  const int w1 = c.r1.lane / kWarp, w2 = c.r2.lane / kWarp;
  if (w1 != w2) {  // two warps already: keep two warps, refreshing the one of this warp
    if (w1 == wn) c.r1 = n;
    else if (w2 == wn) c.r2 = n;
    return;
  }
  if (wn != w1) c.r2 = n;  // a second warp
  else if (c.r1.lane == n.lane) c.r1 = n;
  else if (c.r2.lane == n.lane) c.r2 = n;
  else if (c.r1.w < n.w) c.r1 = n;
  else if (c.r2.w < n.w) c.r2 = n;
  // else two other lanes of this warp epoch are kept: they cover any writer
}

// An access by thread `lane` of the block to [p, p + bytes); ignored unless in shared memory.
EMU_NOTSAN inline void race_access(int lane, const void* p, size_t bytes, uint8_t kind, const void* pc) {
  RaceState& R = race;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  RaceCell* cells;
  size_t off, n;
  bool dyn;
  if (a - R.dyn_lo < R.dyn_n) {
    cells = R.dyn, off = a - R.dyn_lo, n = std::min(bytes, R.dyn_n - off), dyn = true;
  } else if (a - R.st_lo < R.st_n) {
    cells = R.st, off = a - R.st_lo, n = std::min(bytes, R.st_n - off), dyn = false;
  } else {
    return;
  }
  const int w = lane / kWarp;
  RaceRec me;
  me.b = R.block_epoch;
  me.w = R.warp_epoch[w];
  me.lane = uint16_t(lane);
  me.kind = kind;
  me.bytes = uint32_t(bytes);
  me.pc = pc;
  const bool write = kind & 1;
  for (size_t i = 0; i < n; ++i) {
    RaceCell& c = cells[off + i];
    if (race_unordered(c.wr, lane, w)) race_report(me, c.wr, off + i, dyn);
    if (write) {
      if (race_unordered(c.r1, lane, w)) race_report(me, c.r1, off + i, dyn);
      if (race_unordered(c.r2, lane, w)) race_report(me, c.r2, off + i, dyn);
      c.wr = me;
    } else {
      race_add_read(c, me);
    }
  }
}
EMU_NOTSAN __attribute__((always_inline)) inline void race_hook(const void* p, size_t bytes, uint8_t kind,
                                                                 const void* pc) {
  if (race.lane >= 0) race_access(race.lane, p, bytes, kind, pc);
}
#else
inline void race_set_lane(int) {}
inline void race_kernel(const void*) {}
inline void race_block_barrier() {}
inline void race_warp_barrier(int) {}
inline void race_block_start(const unsigned char*, size_t) {}
inline void race_access(int, const void*, size_t, uint8_t, const void*) {}
#endif

inline float bits_to_float(uint16_t h, bool bf16) {
  if (bf16) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half_raw r;
  r.x = h;
  return __half2float(__half(r));
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 for the 32 lanes of warp w (PTX ISA tables).
EMU_NOTSAN inline long& mma_count() {  // warp-level mma.sync executed since the library was loaded
  static long n = 0;
  return n;
}
EMU_NOTSAN inline void run_mma(int first) {
  ++mma_count();
  float A[16][16], B[16][8], C[16][8];
  for (int lane = 0; lane < kWarp; ++lane) {
    const Lane& l = g().lanes[first + lane];
    const int gr = lane >> 2, t = lane & 3;
    auto lo = [](uint32_t v) { return uint16_t(v & 0xffffu); };
    auto hi = [](uint32_t v) { return uint16_t(v >> 16); };
    const int arow[4] = {gr, gr + 8, gr, gr + 8}, acol[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int i = 0; i < 4; ++i) {
      A[arow[i]][acol[i]] = bits_to_float(lo(l.a[i]), l.bf16);
      A[arow[i]][acol[i] + 1] = bits_to_float(hi(l.a[i]), l.bf16);
    }
    const int brow[2] = {2 * t, 2 * t + 8};
    for (int i = 0; i < 2; ++i) {
      B[brow[i]][gr] = bits_to_float(lo(l.b[i]), l.bf16);
      B[brow[i] + 1][gr] = bits_to_float(hi(l.b[i]), l.bf16);
    }
    C[gr][2 * t] = l.c[0];
    C[gr][2 * t + 1] = l.c[1];
    C[gr + 8][2 * t] = l.c[2];
    C[gr + 8][2 * t + 1] = l.c[3];
  }
  for (int lane = 0; lane < kWarp; ++lane) {
    Lane& l = g().lanes[first + lane];
    const int gr = lane >> 2, t = lane & 3;
    const int rows[4] = {gr, gr, gr + 8, gr + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int i = 0; i < 4; ++i) {
      float acc = 0.f;
      for (int k = 0; k < 16; ++k) acc += A[rows[i]][k] * B[k][cols[i]];
      l.c[i] = C[rows[i]][cols[i]] + acc;
    }
  }
}

inline bool in_shared(const void* p, size_t bytes);

// ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16 for the 32 lanes of a warp (PTX ISA): matrix i's 8 rows of
// 8 16-bit elements start at the addresses given by lanes 8i .. 8i+7 (each 16-byte aligned, in shared memory); lane l
// receives in register i the elements (row l/4, columns 2(l%4), 2(l%4)+1) of matrix i, or with .trans the elements
// (rows 2(l%4), 2(l%4)+1, column l/4), i.e. the same positions of the transposed matrix.
EMU_NOTSAN inline void run_ldmatrix(int first, std::string& err) {
  const Lane& l0 = g().lanes[first];
  for (int lane = 0; lane < kWarp; ++lane) {
    const Lane& l = g().lanes[first + lane];
    if (l.ldm_num != l0.ldm_num || l.ldm_trans != l0.ldm_trans) {
      err = "lanes of the warp of " + where(first + lane) + " disagree on ldmatrix's shape (divergence)";
      return;
    }
    if (lane < 8 * l.ldm_num) {
      if (reinterpret_cast<uintptr_t>(l.ldm_addr) % 16 != 0 || !in_shared(l.ldm_addr, 16)) {
        err = "ldmatrix row address of " + where(first + lane) + " is not a 16-byte aligned shared-memory row";
        return;
      }
    }
  }
  for (int lane = 0; lane < 8 * l0.ldm_num; ++lane)  // each row: 16 bytes read by the lane that gave its address
    race_access(first + lane, g().lanes[first + lane].ldm_addr, 16, kLdmRead, nullptr);
  for (int lane = 0; lane < kWarp; ++lane) {
    Lane& l = g().lanes[first + lane];
    for (int i = 0; i < l0.ldm_num; ++i) {
      uint16_t e[2];
      for (int j = 0; j < 2; ++j) {
        const int row = l0.ldm_trans ? 2 * (lane % 4) + j : lane / 4, col = l0.ldm_trans ? lane / 4 : 2 * (lane % 4) + j;
        const auto* rowp = static_cast<const uint16_t*>(g().lanes[first + 8 * i + row].ldm_addr);
        e[j] = rowp[col];
      }
      l.ldm_out[i] = uint32_t(e[0]) | (uint32_t(e[1]) << 16);
    }
  }
}

// Release what can be released; returns whether anything was.
EMU_NOTSAN inline bool release(std::string& err) {
  auto& L = g().lanes;
  const int n = int(L.size());
  bool any = false;
  int at_block = 0, live = 0;
  for (auto& l : L) {
    live += !l.done;
    at_block += (!l.done && l.wait == Wait::Block);
  }
  if (at_block > 0) {
    for (int i = 0; i < n; ++i)
      if (L[i].done) {
        err = "__syncthreads waited on in the block of " + where(i) + ", which has exited (divergent barrier)";
        return false;
      }
    if (at_block == live) {
      for (auto& l : L) l.wait = Wait::None;
      race_block_barrier();
      return true;
    }
  }
  for (int w0 = 0; w0 < n; w0 += kWarp) {
    const int w1 = std::min(n, w0 + kWarp);
    int waiting = 0, done = 0;
    Coll kind = Coll::None;
    for (int i = w0; i < w1; ++i) {
      if (L[i].done) {
        ++done;
        continue;
      }
      if (L[i].wait != Wait::Warp) continue;
      if (kind != Coll::None && L[i].coll != kind) {
        err = "lanes of the warp of " + where(i) + " wait at different warp collectives (divergence)";
        return false;
      }
      kind = L[i].coll;
      ++waiting;
    }
    if (waiting == 0 || waiting + done < w1 - w0) continue;  // still running lanes: not yet
    if (done > 0 || w1 - w0 < kWarp) {
      err = "a full-mask warp collective in the warp of " + where(w0) + " while some of its lanes exited or do not exist";
      return false;
    }
    for (int i = w0; i < w1; ++i)
      if (L[i].mask != 0xffffffffu) {
        err = "warp collective with mask != 0xffffffff in " + where(i) + " (not emulated)";
        return false;
      }
    if (kind == Coll::Shfl) {
      unsigned char tmp[kWarp][8];
      for (int i = w0; i < w1; ++i) std::memcpy(tmp[i - w0], L[i].val, 8);
      for (int i = w0; i < w1; ++i) std::memcpy(L[i].val, tmp[(i - w0) ^ L[i].shfl_xor], 8);
    } else if (kind == Coll::Mma) {
      run_mma(w0);
    } else if (kind == Coll::Ldm) {
      run_ldmatrix(w0, err);
      if (!err.empty()) return false;
    } else if (kind == Coll::Sync) {
      race_warp_barrier(w0 / kWarp);  // only __syncwarp orders the warp's memory accesses
    }
    for (int i = w0; i < w1; ++i) L[i].wait = Wait::None;
    any = true;
  }
  return any;
}

EMU_NOTSAN inline void run_block(unsigned nthreads, std::mt19937& rng) {
  auto& G = g();
  race_block_start(G.dyn_smem.data(), G.dyn_smem.size());
  G.lanes.assign(nthreads, Lane());
  while (G.stacks.size() < nthreads) G.stacks.push_back(new_stack());
  for (unsigned i = 0; i < nthreads; ++i) {
    Lane& l = G.lanes[i];
    l.tid = uint3{i % G.block_dim.x, (i / G.block_dim.x) % G.block_dim.y, i / (G.block_dim.x * G.block_dim.y)};
    l.stack = G.stacks[i];
    getcontext(&l.ctx);
    l.ctx.uc_stack.ss_sp = l.stack;
    l.ctx.uc_stack.ss_size = kStackBytes;
    l.ctx.uc_link = nullptr;
    makecontext(&l.ctx, entry, 0);
  }
  std::vector<int> order(nthreads);
  for (unsigned i = 0; i < nthreads; ++i) order[i] = int(i);
  if (G.order == 1) std::reverse(order.begin(), order.end());
  for (;;) {
    if (G.order == 2) std::shuffle(order.begin(), order.end(), rng);
    bool ran = false, all_done = true;
    for (int i : order) {
      Lane& l = G.lanes[i];
      if (l.done) continue;
      all_done = false;
      if (l.wait != Wait::None) continue;
      G.cur = i;
      race_set_lane(i);
      swapcontext(&G.sched, &l.ctx);
      race_set_lane(-1);
      G.cur = -1;
      ran = true;
    }
    if (all_done) return;
    std::string err;
    const bool released = release(err);
    if (!err.empty()) die(err);
    if (!ran && !released) {
      std::string who;
      for (unsigned i = 0; i < nthreads && who.size() < 300; ++i)
        if (!G.lanes[i].done)
          who += " " + std::to_string(i) + (G.lanes[i].wait == Wait::Block ? ":__syncthreads" : ":warp-collective");
      die("deadlock in block (" + std::to_string(G.block_idx.x) + "," + std::to_string(G.block_idx.y) + "," +
          std::to_string(G.block_idx.z) + "); waiting threads:" + who);
    }
  }
}

template <typename... P>
struct Launch {
  dim3 grid, block;
  size_t smem;
  void (*kernel)(P...);
  template <typename... A>
  void operator()(A&&... args) const {
    auto& G = g();
    ++G.launches;
    const unsigned long threads = (unsigned long)block.x * block.y * block.z;
    const void* key = reinterpret_cast<const void*>(kernel);
    const int opted = G.max_dyn_smem.count(key) ? G.max_dyn_smem[key] : 48 * 1024;
    const char* bad = nullptr;
    if (threads < 1 || threads > 1024 || block.z > 64) bad = "block size";
    else if (grid.x < 1 || grid.y < 1 || grid.z < 1) bad = "an empty grid";
    else if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) bad = "grid size";
    else if (smem > size_t(opted)) bad = "dynamic shared memory above the opted-in limit";
    if (bad) {
      G.last_error = cudaErrorInvalidConfiguration;
      char buf[256];
      std::snprintf(buf, sizeof buf, "launch refused: %s (grid %u,%u,%u block %u,%u,%u smem %zu, limit %d)", bad,
                    grid.x, grid.y, grid.z, block.x, block.y, block.z, smem, opted);
      G.error = buf;
      return;
    }
    std::tuple<typename std::decay<P>::type...> frozen(std::forward<A>(args)...);  // by value, as a launch copies
    auto fn = kernel;
    G.body = [&]() { std::apply(fn, frozen); };
    G.grid_dim = uint3{grid.x, grid.y, grid.z};
    G.block_dim = uint3{block.x, block.y, block.z};
    G.dyn_smem.assign(smem + 16, 0xCD);
    race_kernel(key);
    std::mt19937 rng(G.seed + unsigned(G.launches));
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
          G.block_idx = uint3{x, y, z};
          std::fill(G.dyn_smem.begin(), G.dyn_smem.end(), (unsigned char)0xCD);
          run_block(unsigned(threads), rng);
        }
  }
};

template <typename... P>
inline Launch<P...> launch(dim3 grid, dim3 block, size_t smem, cudaStream_t, void (*fn)(P...)) {
  return Launch<P...>{grid, block, smem, fn};
}

template <typename T>
inline T shfl_xor(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "shuffle payload");
  Lane& l = cur();
  std::memcpy(l.val, &v, sizeof(T));
  l.shfl_xor = lane_mask;
  l.mask = mask;
  l.coll = Coll::Shfl;
  l.wait = Wait::Warp;
  yield();
  T out;
  std::memcpy(&out, cur().val, sizeof(T));
  return out;
}

inline void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16) {
  Lane& l = cur();
  std::memcpy(l.a, a, sizeof l.a);
  std::memcpy(l.b, b, sizeof l.b);
  std::memcpy(l.c, c, sizeof l.c);
  l.bf16 = bf16;
  l.mask = 0xffffffffu;
  l.coll = Coll::Mma;
  l.wait = Wait::Warp;
  yield();
  std::memcpy(c, cur().c, sizeof cur().c);
}

template <int N>
inline void ldmatrix(uint32_t (&r)[N], const void* row_addr, bool trans) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix .x1 / .x2 / .x4");
  Lane& l = cur();
  l.ldm_addr = row_addr;
  l.ldm_num = N;
  l.ldm_trans = trans;
  l.mask = 0xffffffffu;
  l.coll = Coll::Ldm;
  l.wait = Wait::Warp;
  yield();
  for (int i = 0; i < N; ++i) r[i] = cur().ldm_out[i];
}

// cp.async.cg.shared.global [dst], [src], 16, src_bytes: copies src_bytes and zero-fills the rest of the 16 bytes.
// Deferred: the shared memory is written only when a cp.async.wait_group retires the copy's group (what a fast GPU
// may also do late); a read before the wait sees the old bytes.
inline void cp_async(void* dst, const void* src, int src_bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0 || !in_shared(dst, 16))
    die("cp.async of 16 bytes needs 16-byte aligned addresses, the destination in shared memory (" + where(g().cur) + ")");
  cur().open_copies.push_back(AsyncCopy{dst, src, 16, src_bytes});
}
inline void cp_async_commit() {
  Lane& l = cur();
  l.copy_groups.push_back(std::move(l.open_copies));
  l.open_copies.clear();
}
EMU_NOTSAN inline void retire(Lane& l, size_t keep) {
  const int lane = int(&l - g().lanes.data());
  while (l.copy_groups.size() > keep) {
    for (const AsyncCopy& c : l.copy_groups.front()) {
      race_access(lane, c.dst, size_t(c.bytes), kAsyncWrite, nullptr);  // a write by the issuing thread, now
      std::memset(c.dst, 0, size_t(c.bytes));
      if (c.src_bytes > 0) std::memcpy(c.dst, c.src, size_t(c.src_bytes));
    }
    l.copy_groups.erase(l.copy_groups.begin());
  }
}
inline void cp_async_wait(int keep) { retire(cur(), size_t(keep)); }

}  // namespace emu

// ---- device-side names ------------------------------------------------------------------------------------------
#define threadIdx (::emu::cur().tid)
#define blockIdx (::emu::g().block_idx)
#define blockDim (::emu::g().block_dim)
#define gridDim (::emu::g().grid_dim)

inline void __syncthreads() {
  emu::cur().wait = emu::Wait::Block;
  emu::yield();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  emu::Lane& l = emu::cur();
  l.mask = mask;
  l.coll = emu::Coll::Sync;
  l.wait = emu::Wait::Warp;
  emu::yield();
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int = 32) {
  return emu::shfl_xor(mask, v, lane_mask);
}
template <typename T>
EMU_NOTSAN inline T atomicAdd(T* p, T v) {  // fibers switch only at rendezvous points: a plain add is atomic here
  T old = *p;
  *p = old + v;
  return old;
}
using std::max;
using std::min;

// ---- host-side runtime ---------------------------------------------------------------------------------------------
template <typename F>
inline cudaError_t cudaFuncSetAttribute(F* fn, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 227 * 1024)
    return cudaErrorInvalidValue;
  emu::g().max_dyn_smem[reinterpret_cast<const void*>(fn)] = value;
  return cudaSuccess;
}
extern "C" {
cudaError_t cudaGetDevice(int* dev) {
  *dev = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, enum cudaDeviceAttr attr, int) {
  if (attr == cudaDevAttrMultiProcessorCount) *v = emu::g().sm_count;
  else if (attr == cudaDevAttrComputeCapabilityMajor) *v = emu::g().cc_major;
  else if (attr == cudaDevAttrMaxSharedMemoryPerBlockOptin) *v = 227 * 1024;  // sm_90
  else return cudaErrorInvalidValue;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  cudaError_t e = emu::g().last_error;
  emu::g().last_error = cudaSuccess;
  return e;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  std::memset(p, v, n);
  return cudaSuccess;
}
}

// ---- the kernels' hooks ----------------------------------------------------------------------------------------------
#define VHA_LAUNCH(grid, block, smem, stream, ...) ::emu::launch(grid, block, smem, stream, __VA_ARGS__)
#define VHA_DYNAMIC_SHARED(name) unsigned char* name = ::emu::g().dyn_smem.data()

// ---- what the test harness calls (ctypes) ---------------------------------------------------------------------------
extern "C" {
// A device buffer: `bytes` that end exactly at a PROT_NONE page (reads past the end fault).
void* emu_alloc(size_t bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t body = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, body + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  mprotect(static_cast<char*>(p) + body, page, PROT_NONE);
  return static_cast<char*>(p) + body - bytes;
}
void emu_set_schedule(int order, unsigned seed, int sm_count) {
  emu::g().order = order;
  emu::g().seed = seed;
  emu::g().sm_count = sm_count;
}
const char* emu_last_error_message() { return emu::g().error.c_str(); }
void emu_set_compute_capability(int major) { emu::g().cc_major = major; }
long emu_launch_count() { return emu::g().launches; }
long emu_mma_count() { return emu::mma_count(); }
}

// ---- the race detector's hooks: the entry points GCC's -fsanitize=thread instrumentation calls --------------------
// Defined here, not by libtsan (the library is linked without it); hidden, so the kernels call them directly.
#if defined(VHA_EMU_RACECHECK)
#define EMU_HOOK extern "C" EMU_NOTSAN __attribute__((visibility("hidden"))) void
#define EMU_TSAN_RW(n)                                                                                              \
  EMU_HOOK __tsan_read##n(void* p) { emu::race_hook(p, n, emu::kRead, __builtin_return_address(0)); }             \
  EMU_HOOK __tsan_write##n(void* p) { emu::race_hook(p, n, emu::kWrite, __builtin_return_address(0)); }           \
  EMU_HOOK __tsan_unaligned_read##n(void* p) { emu::race_hook(p, n, emu::kRead, __builtin_return_address(0)); }   \
  EMU_HOOK __tsan_unaligned_write##n(void* p) { emu::race_hook(p, n, emu::kWrite, __builtin_return_address(0)); } \
  EMU_HOOK __tsan_volatile_read##n(void* p) { emu::race_hook(p, n, emu::kRead, __builtin_return_address(0)); }    \
  EMU_HOOK __tsan_volatile_write##n(void* p) { emu::race_hook(p, n, emu::kWrite, __builtin_return_address(0)); }
EMU_TSAN_RW(1)
EMU_TSAN_RW(2)
EMU_TSAN_RW(4)
EMU_TSAN_RW(8)
EMU_TSAN_RW(16)
#undef EMU_TSAN_RW
EMU_HOOK __tsan_read_range(void* p, size_t n) { emu::race_hook(p, n, emu::kRead, __builtin_return_address(0)); }
EMU_HOOK __tsan_write_range(void* p, size_t n) { emu::race_hook(p, n, emu::kWrite, __builtin_return_address(0)); }
EMU_HOOK __tsan_init() {}
EMU_HOOK __tsan_func_entry(void*) {}
EMU_HOOK __tsan_func_exit() {}
EMU_HOOK __tsan_vptr_update(void**, void*) {}
EMU_HOOK __tsan_vptr_read(void**) {}
EMU_HOOK __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
EMU_HOOK __tsan_atomic_signal_fence(int) {}
#undef EMU_HOOK
// Atomics of host-side library code (e.g. the guard of a function-local static): performed, not recorded.
#define EMU_TSAN_ATOMIC(n, T)                                                                                        \
  extern "C" EMU_NOTSAN __attribute__((visibility("hidden"))) T __tsan_atomic##n##_load(const volatile T* a, int) { \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                                     \
  }                                                                                                                  \
  extern "C" EMU_NOTSAN __attribute__((visibility("hidden"))) void __tsan_atomic##n##_store(volatile T* a, T v,     \
                                                                                           int) {                   \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                                        \
  }                                                                                                                  \
  extern "C" EMU_NOTSAN __attribute__((visibility("hidden"))) T __tsan_atomic##n##_exchange(volatile T* a, T v,     \
                                                                                           int) {                   \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                                              \
  }                                                                                                                  \
  extern "C" EMU_NOTSAN __attribute__((visibility("hidden"))) T __tsan_atomic##n##_fetch_add(volatile T* a, T v,    \
                                                                                            int) {                  \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                                               \
  }                                                                                                                  \
  extern "C" EMU_NOTSAN __attribute__((visibility("hidden"))) T __tsan_atomic##n##_fetch_sub(volatile T* a, T v,    \
                                                                                            int) {                  \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                                               \
  }                                                                                                                  \
  extern "C" EMU_NOTSAN __attribute__((visibility("hidden"))) int __tsan_atomic##n##_compare_exchange_strong(       \
      volatile T* a, T* c, T v, int, int) {                                                                          \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                          \
  }                                                                                                                  \
  extern "C" EMU_NOTSAN __attribute__((visibility("hidden"))) T __tsan_atomic##n##_compare_exchange_val(            \
      volatile T* a, T c, T v, int, int) {                                                                           \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                                \
    return c;                                                                                                        \
  }
EMU_TSAN_ATOMIC(8, uint8_t)
EMU_TSAN_ATOMIC(16, uint16_t)
EMU_TSAN_ATOMIC(32, uint32_t)
EMU_TSAN_ATOMIC(64, uint64_t)
#undef EMU_TSAN_ATOMIC
extern "C" int emu_race_checking() { return 1; }
#else
extern "C" int emu_race_checking() { return 0; }
#endif
