#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__APPLE__)
#define MTLSIM_SYM(name) "_" #name
#define MTLSIM_HIDE(name) ".private_extern _" #name "\n"
#else
#define MTLSIM_SYM(name) #name
#define MTLSIM_HIDE(name) ".hidden " #name "\n"
#endif

#if !MTLSIM_UCONTEXT
extern "C" void mtlsim_switch(void** save_sp, void* new_sp);
extern "C" void mtlsim_trampoline();
#endif

#if !MTLSIM_UCONTEXT && defined(__x86_64__)
// System V: rbx, rbp, r12-r15 are callee-saved. A new stack starts with the
// six saved registers and a return address pointing at the trampoline, which
// calls entry(r13) with arg in r12.
asm(R"(
.text
.p2align 4
.globl )" MTLSIM_SYM(mtlsim_switch) "\n" MTLSIM_HIDE(mtlsim_switch) MTLSIM_SYM(mtlsim_switch) R"(:
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
.p2align 4
.globl )" MTLSIM_SYM(mtlsim_trampoline) "\n" MTLSIM_HIDE(mtlsim_trampoline) MTLSIM_SYM(mtlsim_trampoline) R"(:
  movq %r12, %rdi
  callq *%r13
  ud2
)");
#elif !MTLSIM_UCONTEXT && defined(__aarch64__)
// AAPCS64: x19-x28, the frame pointer x29, the link register x30 and the low
// halves of v8-v15 are callee-saved.
asm(R"(
.text
.p2align 2
.globl )" MTLSIM_SYM(mtlsim_switch) "\n" MTLSIM_HIDE(mtlsim_switch) MTLSIM_SYM(mtlsim_switch) R"(:
  sub sp, sp, #160
  stp x19, x20, [sp, #0]
  stp x21, x22, [sp, #16]
  stp x23, x24, [sp, #32]
  stp x25, x26, [sp, #48]
  stp x27, x28, [sp, #64]
  stp x29, x30, [sp, #80]
  stp d8, d9, [sp, #96]
  stp d10, d11, [sp, #112]
  stp d12, d13, [sp, #128]
  stp d14, d15, [sp, #144]
  mov x2, sp
  str x2, [x0]
  mov sp, x1
  ldp x19, x20, [sp, #0]
  ldp x21, x22, [sp, #16]
  ldp x23, x24, [sp, #32]
  ldp x25, x26, [sp, #48]
  ldp x27, x28, [sp, #64]
  ldp x29, x30, [sp, #80]
  ldp d8, d9, [sp, #96]
  ldp d10, d11, [sp, #112]
  ldp d12, d13, [sp, #128]
  ldp d14, d15, [sp, #144]
  add sp, sp, #160
  ret
.p2align 2
.globl )" MTLSIM_SYM(mtlsim_trampoline) "\n" MTLSIM_HIDE(mtlsim_trampoline) MTLSIM_SYM(mtlsim_trampoline) R"(:
  mov x0, x19
  blr x20
  brk #0
)");
#endif

namespace mtlsim {

#if MTLSIM_UCONTEXT

namespace {
// makecontext passes int arguments only; split the pointers.
void ucontext_entry(unsigned e_hi, unsigned e_lo, unsigned a_hi, unsigned a_lo) {
  auto join = [](unsigned hi, unsigned lo) { return (uintptr_t(hi) << 32) | lo; };
  auto entry = reinterpret_cast<FiberEntry>(join(e_hi, e_lo));
  entry(reinterpret_cast<void*>(join(a_hi, a_lo)));
}
}  // namespace

void make_context(Context& ctx, char* stack, size_t size, FiberEntry entry, void* arg) {
  getcontext(&ctx.uc);
  ctx.uc.uc_stack.ss_sp = stack;
  ctx.uc.uc_stack.ss_size = size;
  ctx.uc.uc_link = nullptr;
  const auto e = reinterpret_cast<uintptr_t>(entry), a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&ctx.uc, reinterpret_cast<void (*)()>(ucontext_entry), 4, unsigned(e >> 32), unsigned(e),
              unsigned(a >> 32), unsigned(a));
}

void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }

#else

void make_context(Context& ctx, char* stack, size_t size, FiberEntry entry, void* arg) {
  auto top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t(15);
  auto* frame = reinterpret_cast<void**>(top);
#if defined(__x86_64__)
  // r15 r14 r13 r12 rbx rbp ret: the trampoline starts with rsp 16-byte
  // aligned, as a call expects.
  frame -= 9;
  std::memset(frame, 0, 9 * sizeof(void*));
  frame[2] = reinterpret_cast<void*>(entry);  // r13
  frame[3] = arg;                             // r12
  frame[6] = reinterpret_cast<void*>(&mtlsim_trampoline);
#else
  frame -= 20;
  std::memset(frame, 0, 20 * sizeof(void*));
  frame[0] = arg;                             // x19
  frame[1] = reinterpret_cast<void*>(entry);  // x20
  frame[11] = reinterpret_cast<void*>(&mtlsim_trampoline);  // x30
#endif
  ctx.sp = frame;
}

void switch_context(Context& from, Context& to) { mtlsim_switch(&from.sp, to.sp); }

#endif

size_t page_size() {
  static const size_t size = size_t(sysconf(_SC_PAGESIZE));
  return size;
}

StackPool::StackPool(size_t count, size_t stack_bytes) : count_(count), guard_(page_size()) {
  const size_t page = page_size();
  stride_ = (stack_bytes + page - 1) / page * page + guard_;
  auto refuse = [&](const char* what) {
    return std::runtime_error(std::string(what) + " for " + std::to_string(count_) + " GPU-thread stacks of " +
                              std::to_string(stack_bytes / 1024) + " KiB: " + std::strerror(errno));
  };
  void* p = mmap(nullptr, count_ * stride_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANON | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw refuse("cannot map address space");
  base_ = static_cast<char*>(p);
  for (size_t i = 0; i < count_; ++i) {
    if (mprotect(base_ + i * stride_, guard_, PROT_NONE) != 0) {
      const auto error = refuse("cannot protect the guard pages (too many memory mappings?)");
      munmap(base_, count_ * stride_);
      throw error;
    }
  }
}

StackPool::~StackPool() { munmap(base_, count_ * stride_); }

long StackPool::guard_owner(const void* addr) const {
  const auto a = reinterpret_cast<uintptr_t>(addr), b = reinterpret_cast<uintptr_t>(base_);
  if (a < b || a >= b + count_ * stride_) return -1;
  return (a - b) % stride_ < guard_ ? long((a - b) / stride_) : -1;
}

}  // namespace mtlsim
