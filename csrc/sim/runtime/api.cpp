#include "api.h"

#include "worker.h"

namespace mtlsim {

namespace {

// Identifies a call by the return addresses on the GPU thread's stack, so
// the same source line reached through different call paths (a helper called
// from both sides of a branch) counts as different places, as the GPU's fully
// inlined code would. Kernel modules keep frame pointers for this.
__attribute__((noinline)) uint64_t call_path(const Worker& w) {
  auto* fp = static_cast<void* const*>(__builtin_frame_address(0));
  uint64_t h = 0xcbf29ce484222325ull;
  for (int depth = 0; depth < 32 && fp && w.on_stack(fp); ++depth) {
    h = (h ^ reinterpret_cast<uintptr_t>(fp[1])) * 0x100000001b3ull;
    fp = static_cast<void* const*>(fp[0]);
  }
  return h;
}

void api_collective(CollectiveFn fn, const void* in, void* out, const Site* site) {
  Worker* w = Worker::current();
  w->collective(fn, in, out, *site, call_path(*w));
}
void api_barrier(uint32_t, const Site* site) {
  Worker* w = Worker::current();
  w->barrier(*site, call_path(*w));
}
void* api_threadgroup_alloc(uint32_t id, size_t size, size_t align, const Site* site) {
  return Worker::current()->threadgroup_alloc(id, size, align, *site);
}
void api_yield() { Worker::current()->yield(); }
const ThreadCtx* api_current() { return Worker::current()->thread(); }
void api_fail(const char* message, const Site* site) { Worker::current()->fail(message, *site); }

}  // namespace

extern const RuntimeAPI kRuntimeAPI;
constexpr RuntimeAPI kRuntimeAPI{kAbiVersion,  &api_collective, &api_barrier, &api_threadgroup_alloc,
                                 &api_yield,   &api_current,    &api_fail};

const RuntimeAPI& runtime_api() { return kRuntimeAPI; }

}  // namespace mtlsim

// Kernel modules compiled into this binary reach the runtime through this.
const mtlsim::RuntimeAPI* mtlsim_rt = &mtlsim::kRuntimeAPI;
