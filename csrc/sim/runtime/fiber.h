// Cooperative execution contexts for GPU threads.
//
// A switch saves only the callee-saved registers (the compiler already saved
// the rest around the call) and does not touch the floating-point control
// state, which all GPU threads share. x86-64 and aarch64 use a few lines of
// assembly; other CPUs fall back to ucontext, which is ~10x slower.
#pragma once

#include <cstddef>

// Define MTLSIM_UCONTEXT=1 to force the portable fallback (its test does).
#ifndef MTLSIM_UCONTEXT
#if defined(__x86_64__) || defined(__aarch64__)
#define MTLSIM_UCONTEXT 0
#else
#define MTLSIM_UCONTEXT 1
#endif
#endif
#if MTLSIM_UCONTEXT
#include <ucontext.h>
#endif

namespace mtlsim {

struct Context {
#if MTLSIM_UCONTEXT
  ucontext_t uc;
#else
  void* sp = nullptr;
#endif
};

using FiberEntry = void (*)(void* arg);

// Prepares `ctx` so that the first switch to it calls entry(arg) on the stack
// [stack, stack + size). entry must never return.
void make_context(Context& ctx, char* stack, size_t size, FiberEntry entry, void* arg);

// Saves the running context into `from` and resumes `to`.
void switch_context(Context& from, Context& to);

// Fiber stacks with a guard page below each, so an overflow faults instead of
// silently corrupting the neighbouring stack. One mapping whose guard pages
// split it into 2 * count + 1 areas (vm.max_map_count bounds them on Linux);
// address space only: pages are committed when a fiber touches them. Throws
// std::runtime_error when the system refuses.
class StackPool {
 public:
  StackPool(size_t count, size_t stack_bytes);
  ~StackPool();
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;

  size_t count() const { return count_; }
  char* stack(size_t i) const { return base_ + i * stride_ + guard_; }
  size_t stack_bytes() const { return stride_ - guard_; }
  // Which stack's guard page `addr` falls in, or -1.
  long guard_owner(const void* addr) const;

 private:
  char* base_ = nullptr;
  size_t count_, stride_, guard_;
};

size_t page_size();

}  // namespace mtlsim
