// cuda_emu.h: CUDA's execution model, emulated on one CPU thread, so that the very same .cu text
// that nvcc / NVRTC compile for a GPU can be compiled by g++ and run (and tested) without a GPU.
//
// What it teaches: what the CUDA words actually mean. A launch is a grid of thread blocks; a
// block is NUM_THREADS threads that share __shared__ memory and meet at __syncthreads(); every 32
// consecutive threads of a block form a warp whose lanes can read each other's registers with
// __shfl_xor_sync / __shfl_sync. Here each CUDA thread is a *fiber* (a function with its own
// stack that runs until it must wait for the others, then hands the CPU back). A block's 128
// fibers take turns on one OS thread; blocks run one after another.
//
// Why fibers and not one OS thread per CUDA thread: a barrier then costs a couple of context
// switches of ~10 ns (the hand-written x86-64 switch in emu_fibers.h) instead of 128 futex
// wake-ups; the project's feasibility experiment measured ~0.5 s per small launch with one OS
// thread per CUDA thread and ~7 ms with fibers. ucontext (portable, used on aarch64 and macOS)
// is ~17x slower than the hand-written switch but still fine.
//
// Files: emu_fibers.h (the fiber runtime), emu_half.h (a software __half), this file (the
// CUDA model: built-in variables, barriers, shuffles, shared memory, the launcher).
//
// What it checks, and reports instead of hanging (the launch returns an error message):
//   - deadlock: threads wait at different __syncthreads() calls, or nobody can run;
//   - divergent shuffle: lanes of one warp reach different __shfl_*_sync calls, or a partial mask;
//   - a thread exits while others wait for it at a barrier or a shuffle (or reaches a barrier
//     that an exited thread will never reach).
//
// KNOWN LIMITS, read these before trusting a green test (they are limits of emulation itself):
//   - __shared__ memory is NOT reset between blocks (it is one static array reused block after
//     block), so a kernel that reads shared memory before writing it may pass here by accident.
//   - memory-ordering bugs are invisible: fibers switch only at barriers and shuffles, so a
//     missing __syncthreads() between a write and another thread's read of global memory, or a
//     missing __threadfence(), never shows. Races *inside* a step between barriers do not exist.
//   - blocks run in a fixed order (x fastest, then y, then z), never concurrently, so a kernel
//     that depends on block order or on inter-block communication behaves differently on a GPU.
//   - arithmetic: nvcc contracts a*b+c into one fused multiply-add; g++ (here, -ffp-contract=off)
//     does not; CUDA's expf is not glibc's expf. So results are bit-exact within one runner only;
//     across runners, compare with a stated tolerance.
//   - only full-warp shuffles (mask = every live lane of the warp); no atomics, no __syncwarp.
//
// This header is never seen by nvcc or NVRTC: common.cuh includes it only #ifndef __CUDACC__.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "emu_fibers.h"  // fibers: stacks, the context switch, ASan annotations
#include "emu_half.h"    // a software __half

// ---------------------------------------------------------------------------------------------
// The CUDA keywords. On the CPU a __global__ / __device__ function is an ordinary function;
// __shared__ storage is a static variable: one copy, seen by all fibers of the running block.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
#define __align__(n) alignas(n)

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  dim3() = default;
  dim3(unsigned int x_, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;

// The math functions CUDA device code calls (expf, fmaxf, ...) are glibc's, from <cmath>: not
// bit-identical to CUDA's (see the limits above).

namespace emu {

// ---------------------------------------------------------------------------------------------
// Fibers. Each CUDA thread of the running block is one Fiber: its own stack, its saved stack
// pointer, and what it is waiting for.
enum class State : int { Runnable, AtBarrier, AtShuffle, Done };

struct Fiber {
  dim3 tid;              // threadIdx
  int linear = 0;        // threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)
  State state = State::Runnable;
  const char* file = nullptr;  // where it waits (a __syncthreads() or a shuffle call site)
  int line = 0;
  fiber::Context ctx;          // its stack and saved registers (emu_fibers.h)
};

// One warp's meeting point for shuffles: every live lane deposits its value and where it wants
// to read from; the last lane to arrive computes all 32 results.
struct WarpShuffle {
  int arrived = 0;
  const char* file = nullptr;
  int line = 0;
  uint64_t value[32];
  int src[32];
  uint64_t result[32];
};

struct TraceEvent {  // what the lesson prints: who did what, in the order it happened
  int block_x, block_y, block_z;
  int thread;
  int line;
  long long value;
  const char* what;
};

struct Runtime {
  std::vector<Fiber> fibers;
  std::vector<WarpShuffle> warps;
  Fiber* cur = nullptr;
  dim3 block_idx, block_dim, grid_dim;
  int live = 0;           // threads of this block that have not returned
  int at_barrier = 0;     // how many of them wait at the current __syncthreads()
  const char* bar_file = nullptr;
  int bar_line = 0;
  bool failed = false;
  std::string error;
  void (*body)(void*) = nullptr;  // the kernel call, type-erased
  void* body_arg = nullptr;
  // the dynamic shared memory of the running launch (extern __shared__ on a GPU)
  std::vector<unsigned char> dyn_smem;
  // tracing (off unless trace_capacity > 0)
  std::vector<TraceEvent> trace;
  size_t trace_capacity = 0;
};

inline Runtime& rt() {
  static Runtime r;
  return r;
}
inline std::mutex& launch_mutex() {  // launches run one at a time (the statics are shared)
  static std::mutex m;
  return m;
}

[[noreturn]] inline void fiber_main(Fiber* f);

// fiber -> scheduler (the fiber will be resumed later, unless `finished`)
inline void yield_to_scheduler(bool finished) { fiber::suspend(finished); }

inline std::string where(const char* file, int line) {
  const char* base = file ? std::strrchr(file, '/') : nullptr;
  return std::string(base ? base + 1 : (file ? file : "?")) + ":" + std::to_string(line);
}

inline std::string block_name() {
  const Runtime& r = rt();
  return "block (" + std::to_string(r.block_idx.x) + "," + std::to_string(r.block_idx.y) + "," +
         std::to_string(r.block_idx.z) + ")";
}

// Report a bug in the kernel: remember the first message, stop this block. The fiber that found
// it goes back to the scheduler and is never resumed (its stack is simply abandoned: kernel code
// owns no resources that would need unwinding).
[[noreturn]] inline void fail(const std::string& msg) {
  Runtime& r = rt();
  if (!r.failed) {
    r.failed = true;
    r.error = block_name() + ": " + msg;
  }
  yield_to_scheduler(true);
  std::abort();  // unreachable: a failed block is never resumed
}

inline void trace(int line, const char* what, long long value) {
  Runtime& r = rt();
  if (r.trace.size() >= r.trace_capacity) return;
  r.trace.push_back(TraceEvent{(int)r.block_idx.x, (int)r.block_idx.y, (int)r.block_idx.z,
                               r.cur ? r.cur->linear : -1, line, value, what});
}

inline void release_barrier() {
  Runtime& r = rt();
  for (Fiber& f : r.fibers)
    if (f.state == State::AtBarrier) f.state = State::Runnable;
  r.at_barrier = 0;
  r.bar_file = nullptr;
}

// __syncthreads(): wait until every thread of the block is here, at this very call.
inline void syncthreads(const char* file, int line) {
  Runtime& r = rt();
  Fiber* f = r.cur;
  if (r.live < (int)r.fibers.size()) {
    for (const Fiber& g : r.fibers)
      if (g.state == State::Done)
        fail("thread " + std::to_string(f->linear) + " reached __syncthreads() at " +
             where(file, line) + " but thread " + std::to_string(g.linear) +
             " has already exited and will never arrive (a barrier inside divergent code)");
  }
  if (r.at_barrier > 0 && (r.bar_line != line || std::strcmp(r.bar_file, file) != 0)) {
    int other = -1;
    for (const Fiber& g : r.fibers)
      if (g.state == State::AtBarrier) other = g.linear;
    fail("deadlock: thread " + std::to_string(f->linear) + " waits at __syncthreads() at " +
         where(file, line) + " while thread " + std::to_string(other) + " waits at " +
         where(r.bar_file, r.bar_line) + " (threads waiting at different barriers)");
  }
  r.bar_file = file;
  r.bar_line = line;
  if (r.trace_capacity && f->linear % 32 == 0) trace(line, "__syncthreads()", 0);
  if (++r.at_barrier == r.live) {  // the last one in opens the barrier and carries on
    release_barrier();
    return;
  }
  f->state = State::AtBarrier;
  f->file = file;
  f->line = line;
  yield_to_scheduler(false);
}

inline int lanes_in_warp(int warp) {
  const int n = (int)rt().fibers.size();
  return (n - warp * 32) < 32 ? (n - warp * 32) : 32;
}

// The shuffle exchange, for any value of at most 8 bytes: deposit, wait for the whole warp,
// read the value of lane `src` (which the last lane to arrive has already fetched).
template <typename T>
inline T shuffle(const char* file, int line, unsigned mask, T var, int src_lane, bool is_xor,
                 int width) {
  static_assert(sizeof(T) <= 8, "emulated shuffles carry at most 8 bytes");
  Runtime& r = rt();
  Fiber* f = r.cur;
  const int warp = f->linear / 32, lane = f->linear % 32;
  const int nlanes = lanes_in_warp(warp);
  const unsigned full = nlanes == 32 ? 0xffffffffu : ((1u << nlanes) - 1u);
  if (mask != full) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%x", mask);
    fail("thread " + std::to_string(f->linear) + ": shuffle at " + where(file, line) +
         " with mask " + hex + "; the emulation supports only full-warp shuffles (every lane of "
         "warp " + std::to_string(warp) + " taking part)");
  }
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
    fail("shuffle width " + std::to_string(width) + " at " + where(file, line) +
         " is not a power of two in [1, 32]");
  for (int l = 0; l < nlanes; l++)
    if (r.fibers[warp * 32 + l].state == State::Done)
      fail("lane " + std::to_string(lane) + " of warp " + std::to_string(warp) +
           " reached the shuffle at " + where(file, line) + " but lane " + std::to_string(l) +
           " has already exited (a shuffle inside divergent code)");
  WarpShuffle& w = r.warps[warp];
  if (w.arrived > 0 && (w.line != line || std::strcmp(w.file, file) != 0)) {
    int other = -1;
    for (int l = 0; l < nlanes; l++)
      if (r.fibers[warp * 32 + l].state == State::AtShuffle) other = l;
    fail("divergent shuffle in warp " + std::to_string(warp) + ": lane " + std::to_string(lane) +
         " is at " + where(file, line) + " while lane " + std::to_string(other) + " waits at " +
         where(w.file, w.line));
  }
  w.file = file;
  w.line = line;
  if (r.trace_capacity && lane == 0) trace(line, is_xor ? "__shfl_xor_sync" : "__shfl_sync", src_lane);
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  w.value[lane] = bits;
  const int seg = (lane / width) * width;
  int src = is_xor ? (lane ^ src_lane) : seg + (src_lane & (width - 1));
  if (src < seg || src >= seg + width || src >= nlanes) src = lane;  // CUDA: out of segment -> own
  w.src[lane] = src;
  if (++w.arrived == nlanes) {
    for (int l = 0; l < nlanes; l++) w.result[l] = w.value[w.src[l]];
    w.arrived = 0;
    for (int l = 0; l < nlanes; l++) {
      Fiber& g = r.fibers[warp * 32 + l];
      if (g.state == State::AtShuffle) g.state = State::Runnable;
    }
  } else {
    f->state = State::AtShuffle;
    f->file = file;
    f->line = line;
    yield_to_scheduler(false);
  }
  T out;
  std::memcpy(&out, &w.result[lane], sizeof(T));
  return out;
}

template <typename T>
inline T shfl_xor(const char* file, int line, unsigned mask, T var, int lane_mask, int width = 32) {
  return shuffle(file, line, mask, var, lane_mask, true, width);
}
template <typename T>
inline T shfl(const char* file, int line, unsigned mask, T var, int src_lane, int width = 32) {
  return shuffle(file, line, mask, var, src_lane, false, width);
}

[[noreturn]] inline void fiber_main(Fiber* f) {
  Runtime& r = rt();
  r.body(r.body_arg);
  f->state = State::Done;
  r.live--;
  // a thread that returns while others wait for it is a bug (see the header comment)
  for (const Fiber& g : r.fibers) {
    if (g.state == State::AtBarrier)
      fail("thread " + std::to_string(f->linear) + " exited while thread " +
           std::to_string(g.linear) + " waits at __syncthreads() at " + where(g.file, g.line));
    if (g.state == State::AtShuffle && g.linear / 32 == f->linear / 32)
      fail("lane " + std::to_string(f->linear % 32) + " of warp " + std::to_string(f->linear / 32) +
           " exited while lane " + std::to_string(g.linear % 32) + " waits at the shuffle at " +
           where(g.file, g.line));
  }
  yield_to_scheduler(true);
  std::abort();
}

// Run one block: all fibers round-robin until all are done, or a bug is found.
inline bool run_block() {
  Runtime& r = rt();
  const int n = (int)r.fibers.size();
  for (int i = 0; i < n; i++) {
    Fiber& f = r.fibers[i];
    f.state = State::Runnable;
    f.file = nullptr;
    f.line = 0;
    fiber::init(f.ctx, fiber::stack_at(i), fiber::kStackSize,
                [](void* p) { fiber_main(static_cast<Fiber*>(p)); }, &f);
  }
  for (WarpShuffle& w : r.warps) w.arrived = 0;
  r.live = n;
  r.at_barrier = 0;
  r.bar_file = nullptr;
  for (;;) {
    bool ran = false;
    for (int i = 0; i < n && !r.failed; i++) {
      Fiber& f = r.fibers[i];
      if (f.state != State::Runnable) continue;
      ran = true;
r.cur = &f;
      fiber::resume(f.ctx);
      r.cur = nullptr;
    }
    if (r.failed) return false;
    if (r.live == 0) return true;
    if (!ran) {  // nobody can move: a deadlock; say who waits where, grouped by call site
      std::vector<std::pair<std::string, std::vector<int>>> sites;
      for (const Fiber& f : r.fibers) {
        if (f.state == State::Done) continue;
        const std::string what =
            (f.state == State::AtBarrier ? "__syncthreads() at " : "a shuffle at ") +
            where(f.file, f.line);
        size_t k = 0;
        while (k < sites.size() && sites[k].first != what) k++;
        if (k == sites.size()) sites.push_back({what, {}});
        sites[k].second.push_back(f.linear);
      }
      std::string msg = "deadlock: no thread can proceed;";
      for (const auto& [what, ids] : sites) {
        msg += " " + std::to_string(ids.size()) + " thread(s) wait at " + what + " (threads " +
               std::to_string(ids.front()) + ".." + std::to_string(ids.back()) + ");";
      }
      r.failed = true;
      r.error = block_name() + ": " + msg;
      return false;
    }
  }
}

// Launch `body` (a callable that calls the kernel) on a grid of blocks of threads.
// Returns 0, or 1 with the reason in error_message().
template <typename F>
int launch(dim3 grid, dim3 block, size_t dynamic_smem_bytes, F&& body) {
  std::lock_guard<std::mutex> lock(launch_mutex());
  Runtime& r = rt();
  r.failed = false;
  r.error.clear();
  const long long nthreads = (long long)block.x * block.y * block.z;
  if (nthreads < 1 || nthreads > 1024) {
    r.failed = true;
    r.error = "blockDim has " + std::to_string(nthreads) + " threads; CUDA allows 1 to 1024";
    return 1;
  }
  // CUDA's grid limits (every GPU since compute capability 3.0): x up to 2^31 - 1, y and z up
  // to 65535. A launch beyond them fails on a GPU, so it fails here too.
  if (grid.x < 1 || grid.x > 2147483647u || grid.y < 1 || grid.y > 65535 || grid.z < 1 ||
      grid.z > 65535) {
    r.failed = true;
    r.error = "gridDim (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " +
              std::to_string(grid.z) + ") is outside CUDA's limits (x <= 2^31-1, y, z <= 65535)";
    return 1;
  }
  fiber::ensure_stacks((int)nthreads);
  r.fibers.assign((size_t)nthreads, Fiber{});
  r.warps.assign((size_t)((nthreads + 31) / 32), WarpShuffle{});
  for (unsigned z = 0, i = 0; z < block.z; z++)
    for (unsigned y = 0; y < block.y; y++)
      for (unsigned x = 0; x < block.x; x++, i++) {
        r.fibers[i].tid = dim3(x, y, z);
        r.fibers[i].linear = (int)i;
      }
  r.dyn_smem.assign(dynamic_smem_bytes + 16, 0);
  using Body = typename std::remove_reference<F>::type;
  r.body = [](void* p) { (*static_cast<Body*>(p))(); };
  r.body_arg = (void*)&body;
  r.block_dim = block;
  r.grid_dim = grid;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        r.block_idx = dim3(x, y, z);
        if (!run_block()) return 1;
      }
  return 0;
}

inline const char* error_message() { return rt().error.c_str(); }

}  // namespace emu

// The built-in variables: per fiber (threadIdx) or per block (the rest).
#define threadIdx (::emu::rt().cur->tid)
#define blockIdx (::emu::rt().block_idx)
#define blockDim (::emu::rt().block_dim)
#define gridDim (::emu::rt().grid_dim)
#define warpSize 32

#define __syncthreads() ::emu::syncthreads(__FILE__, __LINE__)
#define __shfl_xor_sync(...) ::emu::shfl_xor(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_sync(...) ::emu::shfl(__FILE__, __LINE__, __VA_ARGS__)

// extern __shared__ (dynamic shared memory, sized at launch) cannot be spelled on the CPU; the
// kernels say MP_DYNAMIC_SHARED(name) instead, defined for both compilers in common.cuh.
#define EMU_DYNAMIC_SHARED(name) unsigned char* name = ::emu::rt().dyn_smem.data()
#define EMU_TRACE(what, value) ::emu::trace(__LINE__, (what), (long long)(value))
