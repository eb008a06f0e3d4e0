#include "api.h"

#include "worker.h"

namespace mtlsim {

namespace {

void api_collective(CollectiveFn fn, const void* in, void* out, const Site* site) {
  Worker::current()->collective(fn, in, out, *site);
}
void api_barrier(uint32_t, const Site* site) { Worker::current()->barrier(*site); }
void* api_threadgroup_alloc(uint32_t id, size_t size, size_t align, const Site* site) {
  return Worker::current()->threadgroup_alloc(id, size, align, *site);
}
void api_yield() { Worker::current()->yield(); }
const ThreadCtx* api_current() { return Worker::current()->current_thread(); }
void api_fail(const char* message, const Site* site) { Worker::current()->fail(message, *site); }
void api_log(const LogMessage* message, const Site* site) { Worker::current()->log(*message, *site); }

}  // namespace

extern const RuntimeAPI kRuntimeAPI;
constexpr RuntimeAPI kRuntimeAPI{kAbiVersion, &api_collective, &api_barrier, &api_threadgroup_alloc,
                                 &api_yield,  &api_current,    &api_fail,    &api_log};

const RuntimeAPI& runtime_api() { return kRuntimeAPI; }

}  // namespace mtlsim

// Kernel modules compiled into this binary reach the runtime through this.
const mtlsim::RuntimeAPI* mtlsim_rt = &mtlsim::kRuntimeAPI;
