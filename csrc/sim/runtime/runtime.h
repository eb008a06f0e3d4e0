// The simulator's host API: load kernel modules and dispatch their kernels on
// CPU memory with Metal's execution model.
#pragma once

#include <array>
#include <cstdint>
#include <exception>
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

// One dimension of a strided buffer: `count` elements, `stride` bytes apart.
struct Extent {
  size_t count = 0, stride = 0;
};

struct Buffer {
  void* data = nullptr;
  size_t size = 0;  // the span: bytes from `data` up to the last one the kernel may touch
  // A strided view's elements: `element` bytes at every sum of index * stride
  // over `dims`; the bytes between them are not the kernel's (copying and
  // writing back only these makes a view cost what the view holds, and
  // leaves the rest of its storage to other writers). No dims: all `size` bytes.
  size_t element = 0;
  std::vector<Extent> dims;

  // Plain bytes, every one the kernel's (a parameter struct, a contiguous span).
  static Buffer bytes(void* data, size_t size) { return Buffer{data, size, 0, {}}; }
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
  unsigned workers = 0;  // 0: all the pool's (see Limits)
  uint64_t seed = 0x5eed;
  // Stops a dispatch that runs longer (0: no limit); `timeout_source` names
  // where the limit came from, for the error message.
  double timeout_s = 0;
  const char* timeout_source = "";
  // Half subnormals read and written as zeros, as a GPU that flushes half
  // denormals does (set_flush_half_subnormals).
  bool flush_half_subnormals = false;
};

// The simulator's resource limits, from the environment when the worker pool
// starts (at the first dispatch): MPS_EXT_SIM_THREADS workers (default: the
// CPUs this process may use, at most kDefaultMaxWorkers; at most
// kMaxWorkers), each with up to 1024 fiber stacks of MPS_EXT_SIM_STACK_KB
// (kMinStackKB to kMaxStackKB, default 64). Stacks are mapped as a dispatch
// needs them; a dispatch runs on fewer workers when its stacks would
// otherwise take more than half of the process's memory-mapping limit.
constexpr unsigned kDefaultMaxWorkers = 64, kMaxWorkers = 256;
constexpr unsigned kMinStackKB = 16, kMaxStackKB = 64 * 1024;

struct Report {
  std::vector<std::string> warnings;  // divergent collectives and barriers
};

// Runs the kernel to completion; throws SimError, or what the interrupt
// check returned.
Report dispatch(const Launch& launch, const Options& options);

// Polled about every 50 ms while a dispatch runs or waits for another one: a
// non-null result stops the dispatch, which then throws it (the Python
// bindings return a pending KeyboardInterrupt). Called without locks held.
using InterruptCheck = std::exception_ptr (*)();
void set_interrupt_check(InterruptCheck check);
// What the interrupt check returns now (null when none is set), for other
// waits to poll.
std::exception_ptr poll_interrupt();

// `with mps_ext.sim.checked()` blocks; MPS_EXT_SIM_CHECK=1 in the environment
// checks every dispatch, MPS_EXT_SIM_TIMEOUT (seconds) limits each. A
// thread's dispatches follow its own innermost open block; threads with none
// (autograd runs kernels on its own threads) follow the most recently opened
// one. timeout_s 0: the environment's.
uint64_t push_checked(bool compare_schedules, double timeout_s);
void pop_checked(uint64_t token);
Options default_options();

// Whether dispatches from now on flush half subnormals (default_options);
// returns the previous setting. Off until set.
bool set_flush_half_subnormals(bool flush);

}  // namespace mtlsim
