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
// switches of ~10 ns (a hand-written x86-64 switch below) instead of 128 futex wake-ups; one OS
// thread per CUDA thread measured ~0.5 s per small launch, fibers ~7 ms. ucontext (portable,
// used on aarch64 and macOS) is ~17x slower than the hand-written switch but still fine.
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

#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 600  // macOS exposes ucontext only with this
#endif

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__linux__) && !defined(EMU_FORCE_UCONTEXT)
#define EMU_FAST_SWITCH 1
#else
#define EMU_FAST_SWITCH 0
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifndef EMU_ASAN
#define EMU_ASAN 0
#endif
#if EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

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

// ---------------------------------------------------------------------------------------------
// A software __half: IEEE binary16 stored as its 16 bits, converted with round-to-nearest-even
// exactly as the GPU's cvt.rn.f16.f32 does (tests compare it with NumPy's float16 on every
// half value and on many floats).
struct __half {
  uint16_t __x;
};

inline float __half2float(__half h) {
  const uint32_t sign = (uint32_t)(h.__x & 0x8000u) << 16;
  uint32_t exp = (h.__x >> 10) & 0x1fu;
  uint32_t mant = h.__x & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf or NaN: keep the payload
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal: re-bias the exponent 15 -> 127
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal half: normalise it, every one is a normal float
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      exp--;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline __half __float2half(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
  const uint32_t absb = bits & 0x7fffffffu;
  __half h;
  if (absb >= 0x7f800000u) {  // inf, or NaN (kept quiet and non-zero)
    h.__x = sign | (absb > 0x7f800000u ? (uint16_t)(0x7e00u | ((absb >> 13) & 0x3ffu))
                                       : (uint16_t)0x7c00u);
    return h;
  }
  if (absb >= 0x477ff000u) {  // rounds to >= 65520: overflows to inf
    h.__x = sign | 0x7c00u;
    return h;
  }
  if (absb < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (absb < 0x33000000u) {  // below half of the smallest subnormal (2^-25): rounds to 0
      h.__x = sign;
      return h;
    }
    const uint32_t e = absb >> 23;
    const uint32_t m = (absb & 0x7fffffu) | 0x800000u;  // with the implicit 1
    const uint32_t shift = 126u - e;                      // 14..24 bits to drop
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u))) r++;
    h.__x = sign | (uint16_t)r;
    return h;
  }
  // normal: drop 13 mantissa bits with round-to-nearest-even; a carry may bump the exponent
  uint32_t r = absb - 0x38000000u;  // re-bias 127 -> 15 (in place, exponent field)
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
  h.__x = sign | (uint16_t)r;
  return h;
}

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
  void* sp = nullptr;          // saved stack pointer (fast switch)
  char* stack = nullptr;       // lowest usable address of its stack
  size_t stack_size = 0;
#if !EMU_FAST_SWITCH
  ucontext_t ctx;
#endif
#if EMU_ASAN
  void* fake_stack = nullptr;
#endif
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
  // the scheduler's own context
  void* main_sp = nullptr;
#if !EMU_FAST_SWITCH
  ucontext_t main_ctx;
#endif
#if EMU_ASAN
  const void* main_stack_bottom = nullptr;
  size_t main_stack_size = 0;
#endif
  // stacks: one mmap'd region, a guard page below each stack (an overflow faults, never
  // silently scribbles over the neighbour's stack)
  char* stack_region = nullptr;
  size_t stack_region_size = 0;
  int stacks = 0;
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

#if EMU_ASAN
constexpr size_t kStackSize = 512 * 1024;  // ASan's redzones make frames several times larger
#else
constexpr size_t kStackSize = 128 * 1024;
#endif

inline size_t page_size() { return (size_t)sysconf(_SC_PAGESIZE); }

inline void ensure_stacks(int n) {
  Runtime& r = rt();
  if (r.stacks >= n) return;
  if (r.stack_region) munmap(r.stack_region, r.stack_region_size);
  const size_t per = kStackSize + page_size();
  r.stack_region_size = per * (size_t)n;
  void* p = mmap(nullptr, r.stack_region_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "cuda_emu: cannot map %zu bytes of fiber stacks\n", r.stack_region_size);
    std::abort();
  }
  r.stack_region = (char*)p;
  for (int i = 0; i < n; i++) mprotect(r.stack_region + per * i, page_size(), PROT_NONE);
  r.stacks = n;
}

// ---------------------------------------------------------------------------------------------
// The context switch. switch_to(save, to): store the callee-saved registers and the stack
// pointer of the running code in *save, load those of `to`, and return into it. The System V
// ABI says a called function may clobber every other register, so these six plus rsp are the
// whole state of a suspended function.
#if EMU_FAST_SWITCH
extern "C" void emu_switch_x86(void** save_sp, void* to_sp);
extern "C" void emu_fiber_trampoline();
#ifndef EMU_NO_SWITCH_DEFINITION  // a library built from several files defines it in one
asm(R"(
.text
.globl emu_switch_x86
.hidden emu_switch_x86
.type emu_switch_x86,@function
emu_switch_x86:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch_x86,.-emu_switch_x86

.globl emu_fiber_trampoline
.hidden emu_fiber_trampoline
.type emu_fiber_trampoline,@function
emu_fiber_trampoline:
    movq %r12, %rdi
    callq *%r13
    ud2
.size emu_fiber_trampoline,.-emu_fiber_trampoline
)");
#endif
#endif

[[noreturn]] inline void fiber_main(Fiber* f);

// scheduler -> fiber
inline void resume(Fiber* f) {
  Runtime& r = rt();
  r.cur = f;
#if EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f->stack, f->stack_size);
#endif
#if EMU_FAST_SWITCH
  emu_switch_x86(&r.main_sp, f->sp);
#else
  swapcontext(&r.main_ctx, &f->ctx);
#endif
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  r.cur = nullptr;
}

// fiber -> scheduler (the fiber will be resumed later, unless `finished`)
inline void yield_to_scheduler(bool finished) {
  Runtime& r = rt();
  Fiber* f = r.cur;
#if EMU_ASAN
  __sanitizer_start_switch_fiber(finished ? nullptr : &f->fake_stack, r.main_stack_bottom,
                                 r.main_stack_size);
#endif
#if EMU_FAST_SWITCH
  emu_switch_x86(&f->sp, r.main_sp);
#else
  swapcontext(&f->ctx, &r.main_ctx);
#endif
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(f->fake_stack, &r.main_stack_bottom, &r.main_stack_size);
#endif
}

#if !EMU_FAST_SWITCH
inline Fiber* g_starting = nullptr;  // makecontext passes only ints; hand the fiber over here
inline void ucontext_entry() { fiber_main(g_starting); }
#endif

inline void init_fiber(Fiber& f, char* stack, size_t size) {
  f.stack = stack;
  f.stack_size = size;
#if EMU_FAST_SWITCH
  // Build the frame that emu_switch_x86 pops: r15 r14 r13 r12 rbx rbp, then the return address
  // (the trampoline, which calls fiber_main(r12) via r13). After the `ret` the stack pointer
  // must be 16-byte aligned so that the trampoline's `call` leaves the callee 8 off alignment,
  // as the ABI expects.
  uintptr_t top = ((uintptr_t)(stack + size)) & ~(uintptr_t)15;
  uint64_t* sp = (uint64_t*)(top - 72);  // 9 slots; sp % 16 == 8, so sp + 56 is aligned
  sp[0] = 0;                             // r15
  sp[1] = 0;                             // r14
  sp[2] = (uint64_t)(uintptr_t)&fiber_main;  // r13: what the trampoline calls
  sp[3] = (uint64_t)(uintptr_t)&f;           // r12: its argument
  sp[4] = 0;                                 // rbx
  sp[5] = 0;                                 // rbp
  sp[6] = (uint64_t)(uintptr_t)&emu_fiber_trampoline;  // return address of the first switch
  sp[7] = 0;
  sp[8] = 0;
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = stack;
  f.ctx.uc_stack.ss_size = size;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, (void (*)())ucontext_entry, 0);
#endif
}

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
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &r.main_stack_bottom, &r.main_stack_size);
#endif
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
  const size_t per = kStackSize + page_size();
  for (int i = 0; i < n; i++) {
    Fiber& f = r.fibers[i];
    f.state = State::Runnable;
    f.file = nullptr;
    f.line = 0;
    char* stack = r.stack_region + per * i + page_size();
#if EMU_ASAN
    // frames abandoned by the previous block (or a failed one) left poison behind
    __asan_unpoison_memory_region(stack, kStackSize);
#endif
    init_fiber(f, stack, kStackSize);
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
#if !EMU_FAST_SWITCH
      g_starting = &f;
#endif
      resume(&f);
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
  ensure_stacks((int)nthreads);
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
