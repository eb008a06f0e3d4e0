// The interface both backends implement: dispatch one kernel, by host name,
// with tensors and small parameter structs as its buffers. The op layer
// (csrc/ops) decides everything else, once, for both.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace mps_ext {

struct Size3 {
  uint32_t x = 1, y = 1, z = 1;
};

// One slot of the argument table: a tensor bound at its storage offset, or
// bytes (a parameter struct, passed like setBytes).
struct Arg {
  at::Tensor tensor;
  std::vector<uint8_t> bytes;
  bool is_tensor() const { return tensor.defined(); }
};

// A dispatchThreadgroups launch.
struct Launch {
  std::string kernel;  // the [[host_name]]
  std::vector<Arg> args;  // args[i] binds to [[buffer(i)]]
  Size3 threadgroups;
  Size3 threads_per_threadgroup;

  Launch& tensor(const at::Tensor& t) {
    args.push_back(Arg{t, {}});
    return *this;
  }
  template <class T>
  Launch& bytes(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "parameter structs are plain data");
    std::vector<uint8_t> b(sizeof(T));
    std::memcpy(b.data(), &value, sizeof(T));
    args.push_back(Arg{{}, std::move(b)});
    return *this;
  }
  // The device of the first tensor argument: where the launch runs.
  c10::Device device() const;
};

// A marker in a stream's work (mps_ext.Event): reached once everything
// enqueued on the stream before the record has run. Records replace each other.
class Event {
 public:
  virtual ~Event() = default;
  virtual void record(int64_t stream) = 0;
  // Work enqueued on `stream` from now on waits for the last record (no wait
  // if there was none).
  virtual void block(int64_t stream) = 0;
  virtual bool query() = 0;
  virtual void synchronize() = 0;
  // When the last record was reached, in seconds on the backend's clock (the
  // GPU's on Metal, the host's in the simulator); valid once synchronized.
  virtual double seconds() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Why `kernel` cannot run with this many threads per threadgroup (it failed
  // to compile, its pipeline allows fewer threads...), or nullopt. Failures
  // are remembered: asking again is cheap.
  virtual std::optional<std::string> unavailable(const std::string& kernel, uint32_t threads_per_threadgroup) = 0;
  // How many SIMD groups a grid of `kernel` at `threads_per_threadgroup`
  // needs to fill the GPU (gpu_fill.h): plans whose grids have fewer split
  // their work further. Metal and the simulator have one figure for every
  // kernel; a recording (recording.h) may have one per kernel, as a CUDA GPU's
  // residency depends on each kernel's registers.
  virtual int64_t fill_simdgroups(const std::string& kernel, uint32_t threads_per_threadgroup) = 0;
  // Enqueues `launch` on the calling thread's current stream. On a stream
  // other than the default it may run after this returns: the launch keeps
  // its tensors alive until then.
  virtual void dispatch(const Launch& launch) = 0;

  // Streams: 0 is the device's default stream (torch's); new_stream() hands
  // out others (from a pool, as torch does). The current stream is per thread.
  virtual int64_t new_stream() = 0;
  virtual int64_t current_stream() = 0;
  virtual void set_current_stream(int64_t stream) = 0;
  // Waits until the stream's work has run; raises the first error of a kernel
  // that ran on it asynchronously.
  virtual void synchronize(int64_t stream) = 0;
  virtual bool query(int64_t stream) = 0;
  virtual std::unique_ptr<Event> new_event() = 0;
  // The memory of `t` is not reused before the work enqueued on `stream` so
  // far has run.
  virtual void record_tensor(const at::Tensor& t, int64_t stream) = 0;
  // Work enqueued on `stream` from now on waits for the last record of the
  // torch.mps.Event whose id is `event_id` (torch's event pool).
  virtual void wait_torch_event(int64_t /*stream*/, int64_t /*event_id*/) {
    TORCH_CHECK(false, "mps_ext: torch.mps.Event belongs to the mps device, not to ", name());
  }
  // Where torch ops do not follow the current stream (the simulator, Metal
  // with torch 2.13), waits until it has run its kernels; otherwise, and on
  // the default stream, returns at once.
  virtual void before_torch_ops() = 0;
};

// The backend for tensors on `device` (the simulator for CPU, Metal for
// MPS), or nullptr with `why` set.
Backend* backend_for(const c10::Device& device, std::string* why = nullptr);

// Runs `launch` on its tensors' device and records it for mps_ext.trace().
void dispatch(const Launch& launch);

// Ops that run torch ops on their kernels' results call this in between, so
// the torch ops see the results wherever the kernels were enqueued.
void before_torch_ops(const c10::Device& device);

// The Metal backend, when this build has one (macOS with an MPS-enabled torch)
// and the GPU runs its kernels; else nullptr, and why.
Backend* metal_backend();
std::string metal_unavailable_reason();
// Elsewhere, the Metal backend of a library loaded beside this one: the
// emulated Metal of tools/metal_emu installs csrc/metal's backend here (or
// nullptr, and why).
void install_metal_backend(Backend* backend, const std::string& why);

}  // namespace mps_ext
