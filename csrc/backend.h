// The interface both backends implement: dispatch one kernel, by host name,
// with tensors and small parameter structs as its buffers. The op layer
// (csrc/ops) decides everything else, once, for both.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>
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

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Why `kernel` cannot run with this many threads per threadgroup (it failed
  // to compile, its pipeline allows fewer threads...), or nullopt. Failures
  // are remembered: asking again is cheap.
  virtual std::optional<std::string> unavailable(const std::string& kernel, uint32_t threads_per_threadgroup) = 0;
  virtual void dispatch(const Launch& launch) = 0;
};

// The backend for tensors on `device` (the simulator for CPU, Metal for
// MPS), or nullptr with `why` set.
Backend* backend_for(const c10::Device& device, std::string* why = nullptr);

// Runs `launch` on its tensors' device and records it for mps_ext.trace().
void dispatch(const Launch& launch);

// The Metal backend, when this build has one (macOS with an MPS-enabled torch).
Backend* metal_backend();

}  // namespace mps_ext
