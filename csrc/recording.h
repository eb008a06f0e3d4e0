// Launch recording (mps_ext.sim.record_launches): while a recording is open,
// the launches the ops make on CPU tensors are kept instead of run, so that
// another executor runs the host's own plans (tools/cuda_check replays them
// on CUDA; Recording.replay runs them in the simulator). Plans are sized by
// the recording's fill policy: a CUDA GPU's SMs x each kernel's resident
// warps, where the simulator has one figure for every kernel.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"

namespace mps_ext::recording {

// Backend::fill_simdgroups for a recording.
using FillPolicy = std::function<int64_t(const std::string& kernel, uint32_t threads_per_threadgroup)>;
// The most threads per threadgroup a kernel's pipeline takes where the
// recording will run (a translated kernel's launch bound on CUDA), as a Metal
// pipeline's maxTotalThreadsPerThreadgroup: plans that need more fall back
// (Backend::unavailable).
using ThreadLimit = std::function<int64_t(const std::string& kernel)>;

// Opens the calling thread's recording (one at a time per thread; other
// threads' launches run as ever); plans are sized by `fill`, or by the
// simulator's setting when there is none, and limited by `max_threads`
// besides the simulator's limits.
void begin(std::optional<FillPolicy> fill, std::optional<ThreadLimit> max_threads);
// Closes it: the launches, in order.
std::vector<Launch> end();
// The backend CPU tensors have on this thread while its recording is open, else nullptr.
Backend* active();

}  // namespace mps_ext::recording
