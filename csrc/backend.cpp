#include "backend.h"

#include <atomic>
#include <mutex>
#include <string>

#include "recording.h"
#include "sim/sim_backend.h"
#include "trace.h"

namespace mps_ext {

c10::Device Launch::device() const {
  for (const Arg& a : args)
    if (a.is_tensor()) return a.tensor.device();
  TORCH_CHECK(false, "kernel launch '", kernel, "' has no tensor argument");
}

#if !defined(MPS_EXT_METAL)
namespace {
std::atomic<Backend*> installed_metal{nullptr};
std::mutex installed_mu;
std::string installed_why = "this build has no Metal backend (it is built on macOS with an MPS-enabled torch)";
}  // namespace

Backend* metal_backend() { return installed_metal.load(); }
std::string metal_unavailable_reason() {
  std::lock_guard<std::mutex> lock(installed_mu);
  return installed_metal.load() ? std::string() : installed_why;
}
void install_metal_backend(Backend* backend, const std::string& why) {
  std::lock_guard<std::mutex> lock(installed_mu);
  installed_why = why;
  installed_metal.store(backend);
}
#endif

Backend* backend_for(const c10::Device& device, std::string* why) {
  std::string reason;
  Backend* backend = nullptr;
  if (device.is_cpu()) {
    backend = recording::active();
    if (!backend) backend = &sim_backend();
  } else if (device.is_mps()) {
    backend = metal_backend();
    if (!backend) reason = "no Metal backend: " + metal_unavailable_reason();
  } else {
    reason = "mps_ext kernels run on cpu (simulator) or mps tensors, not " + device.str();
  }
  if (why) *why = reason;
  return backend;
}

void dispatch(const Launch& launch) {
  const c10::Device device = launch.device();
  std::string why;
  Backend* backend = backend_for(device, &why);
  TORCH_CHECK(backend, "mps_ext: ", why);
  for (const Arg& a : launch.args) {
    if (!a.is_tensor()) continue;
    TORCH_CHECK(a.tensor.device() == device, "kernel '", launch.kernel, "': all tensors must be on ", device,
                ", got one on ", a.tensor.device());
    // Kernels read memory as stored: the dispatcher resolves these bits before any op runs
    // (overrides/overrides.h); one reaching here would be a silently wrong result.
    TORCH_INTERNAL_ASSERT(!a.tensor.is_conj() && !a.tensor.is_neg(), "kernel '", launch.kernel,
                          "': a tensor with a lazy conjugate or negative bit");
  }
  backend->dispatch(launch);
  trace::record({launch.kernel, launch.threadgroups, launch.threads_per_threadgroup, backend->name()});
}

void before_torch_ops(const c10::Device& device) {
  if (Backend* backend = backend_for(device)) backend->before_torch_ops();
}

}  // namespace mps_ext
