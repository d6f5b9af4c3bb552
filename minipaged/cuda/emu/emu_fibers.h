// emu_fibers.h: the fiber runtime under cuda_emu.h. A fiber is a function with its own stack
// that can stop in the middle (suspend) and later continue where it stopped (resume). One
// scheduler (the code that called launch) resumes fibers one at a time; a fiber suspends back
// to the scheduler. Nothing runs in parallel, so no locks are needed between fibers.
//
// Two ways to switch stacks:
//   - x86-64 Linux: a 14-instruction routine (emu_switch_x86 below) that saves the six
//     registers the System V ABI says a call preserves, swaps the stack pointer, and restores
//     the other fiber's six. ~10 ns.
//   - elsewhere (aarch64, macOS) or with -DEMU_FORCE_UCONTEXT: POSIX swapcontext, portable but
//     ~17x slower (it also saves the signal mask, a system call).
// Under AddressSanitizer each switch is announced with __sanitizer_start_switch_fiber /
// __sanitizer_finish_switch_fiber, or ASan would take the jump to another stack for a stack
// overflow and its fake stacks would go out of step.
//
// Stacks come from one mmap'd region with an inaccessible guard page below each stack: a fiber
// that overflows its stack faults at once instead of scribbling over its neighbour's.
#pragma once

#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 600  // macOS exposes ucontext only with this
#endif

#include <cstdint>
#include <cstdio>
#include <cstdlib>

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

namespace emu::fiber {

#if EMU_ASAN
constexpr size_t kStackSize = 512 * 1024;  // ASan's redzones make frames several times larger
#else
constexpr size_t kStackSize = 128 * 1024;
#endif

struct Context {
  void (*entry)(void*) = nullptr;  // what the fiber runs, and its argument
  void* arg = nullptr;
  void* sp = nullptr;              // saved stack pointer (fast switch)
  char* stack = nullptr;           // lowest usable address of its stack
  size_t stack_size = 0;
#if !EMU_FAST_SWITCH
  ucontext_t uc;
#endif
#if EMU_ASAN
  void* fake_stack = nullptr;
#endif
};

struct Scheduler {
  Context* cur = nullptr;     // the running fiber, or nullptr in the scheduler
  void* main_sp = nullptr;    // the scheduler's own saved state
#if !EMU_FAST_SWITCH
  ucontext_t main_uc;
#endif
#if EMU_ASAN
  const void* main_stack_bottom = nullptr;
  size_t main_stack_size = 0;
#endif
  char* region = nullptr;     // all stacks, each preceded by a guard page
  size_t region_size = 0;
  int stacks = 0;
};

inline Scheduler& sched() {
  static Scheduler s;
  return s;
}

inline size_t page_size() { return (size_t)sysconf(_SC_PAGESIZE); }

// Make sure n stacks exist; return the i-th with stack_at(i).
inline void ensure_stacks(int n) {
  Scheduler& s = sched();
  if (s.stacks >= n) return;
  if (s.region) munmap(s.region, s.region_size);
  const size_t per = kStackSize + page_size();
  s.region_size = per * (size_t)n;
  void* p = mmap(nullptr, s.region_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "emu_fibers: cannot map %zu bytes of fiber stacks\n", s.region_size);
    std::abort();
  }
  s.region = (char*)p;
  for (int i = 0; i < n; i++) mprotect(s.region + per * i, page_size(), PROT_NONE);
  s.stacks = n;
}

inline char* stack_at(int i) { return sched().region + (kStackSize + page_size()) * i + page_size(); }

#if EMU_FAST_SWITCH
// switch(save, to): push the callee-saved registers, store the stack pointer in *save, load
// `to`, pop that fiber's registers and return into it. The trampoline starts a new fiber:
// start(r12) with the Context in r12 and start's address in r13, placed by init() below.
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

// The first thing a new fiber runs. The entry must never return: it ends with
// suspend(true), and a finished fiber is never resumed.
[[noreturn]] inline void start(Context* c) {
#if EMU_ASAN
  Scheduler& s = sched();
  __sanitizer_finish_switch_fiber(nullptr, &s.main_stack_bottom, &s.main_stack_size);
#endif
  c->entry(c->arg);
  std::abort();
}

#if !EMU_FAST_SWITCH
inline void ucontext_start() { start(sched().cur); }  // makecontext passes only ints
#endif

// Prepare `c` to run entry(arg) on the given stack when it is first resumed.
inline void init(Context& c, char* stack, size_t size, void (*entry)(void*), void* arg) {
  c.entry = entry;
  c.arg = arg;
  c.stack = stack;
  c.stack_size = size;
#if EMU_ASAN
  // frames abandoned by a previous fiber on this stack (or a failed block) left poison behind
  __asan_unpoison_memory_region(stack, size);
#endif
#if EMU_FAST_SWITCH
  // The frame emu_switch_x86 pops: r15 r14 r13 r12 rbx rbp, then the return address. After
  // the `ret` the stack pointer must be 16-byte aligned, so that the trampoline's `call`
  // leaves the callee 8 bytes off alignment, as the ABI expects at a function's entry.
  uintptr_t top = ((uintptr_t)(stack + size)) & ~(uintptr_t)15;
  uint64_t* sp = (uint64_t*)(top - 72);          // 9 slots; sp % 16 == 8, sp + 56 aligned
  sp[0] = 0;                                     // r15
  sp[1] = 0;                                     // r14
  sp[2] = (uint64_t)(uintptr_t)&start;           // r13: what the trampoline calls
  sp[3] = (uint64_t)(uintptr_t)&c;               // r12: its argument
  sp[4] = 0;                                     // rbx
  sp[5] = 0;                                     // rbp
  sp[6] = (uint64_t)(uintptr_t)&emu_fiber_trampoline;  // where the first switch returns
  sp[7] = 0;
  sp[8] = 0;
  c.sp = sp;
#else
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, (void (*)())ucontext_start, 0);
#endif
}

// scheduler -> fiber; returns when the fiber suspends
inline void resume(Context& c) {
  Scheduler& s = sched();
  s.cur = &c;
#if EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, c.stack, c.stack_size);
#endif
#if EMU_FAST_SWITCH
  emu_switch_x86(&s.main_sp, c.sp);
#else
  swapcontext(&s.main_uc, &c.uc);
#endif
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  s.cur = nullptr;
}

// fiber -> scheduler; returns when the scheduler resumes this fiber (never, if `finished`)
inline void suspend(bool finished) {
  Scheduler& s = sched();
  Context* c = s.cur;
#if EMU_ASAN
  __sanitizer_start_switch_fiber(finished ? nullptr : &c->fake_stack, s.main_stack_bottom,
                                 s.main_stack_size);
#else
  (void)finished;
#endif
#if EMU_FAST_SWITCH
  emu_switch_x86(&c->sp, s.main_sp);
#else
  swapcontext(&c->uc, &s.main_uc);
#endif
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(c->fake_stack, &s.main_stack_bottom, &s.main_stack_size);
#endif
}

}  // namespace emu::fiber
