// The simulator's host API: load kernel modules and dispatch their kernels on
// CPU memory with Metal's execution model.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "mtlsim/abi.h"

namespace mtlsim {

// A kernel error, a check failure, or an invalid dispatch.
class SimError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Module {
  std::string name;  // the .metal file or library it came from
  const ModuleInfo* info;
  const KernelInfo* find(const std::string& host_name) const;
};

// Modules compiled into this binary register their init functions at load.
const Module& builtin_module(const std::string& name, ModuleInitFn init);
// A module compiled to a shared library at run time; loaded once per path.
const Module& load_module(const std::string& path);

struct Buffer {
  void* data = nullptr;
  size_t size = 0;  // bytes the kernel may touch from `data`
};

struct Launch {
  const Module* module = nullptr;
  const KernelInfo* kernel = nullptr;
  std::array<Buffer, kMaxBufferSlots> buffers{};
  std::array<size_t, kMaxBufferSlots> threadgroup_lengths{};
  // dispatchThreads: grid counts threads and edge threadgroups may be partial;
  // dispatchThreadgroups: grid counts threadgroups.
  bool grid_in_threads = true;
  Dim3 grid{1, 1, 1};
  Dim3 threadgroup{1, 1, 1};
};

struct Options {
  // Poisoned threadgroup memory under several schedules, guard pages around
  // every buffer: see checked.cpp.
  bool checked = false;
  // Checked mode requires identical results under every schedule; kernels
  // whose results legitimately depend on thread order (atomic counters
  // handing out slots, float atomics) run under one schedule instead.
  bool compare_schedules = true;
  unsigned workers = 0;  // 0: MPS_EXT_SIM_THREADS or the CPU count
  uint64_t seed = 0x5eed;
};

struct Report {
  std::vector<std::string> warnings;  // divergent collectives and barriers
};

// Runs the kernel to completion; throws SimError.
Report dispatch(const Launch& launch, const Options& options);

// `with mps_ext.sim.checked()` blocks (the innermost decides
// compare_schedules); MPS_EXT_SIM_CHECK=1 in the environment checks every
// dispatch. Process-wide, because autograd runs kernels on its own threads.
void push_checked(bool compare_schedules);
void pop_checked();
Options default_options();

}  // namespace mtlsim
