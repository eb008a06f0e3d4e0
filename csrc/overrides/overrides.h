// Overrides of aten ops: registered at a device's dispatch key through a
// torch::Library this extension owns (destroying it restores torch's
// kernels), with per-op statistics of what ran.
#pragma once

#include <c10/core/DeviceType.h>
#include <torch/library.h>

#include <cstdint>
#include <map>
#include <string>

namespace mps_ext::overrides {

void enable(c10::DeviceType device);
void disable(c10::DeviceType device);
bool is_enabled(c10::DeviceType device);

// Called by every override: the kernels ran, or torch's kernel with why.
// A call autograd's backward makes is counted as "<op> (backward)".
void hit(const char* op);
void fallback(const char* op, const std::string& reason);

// Held while an override runs torch's own kernel: what that kernel reaches
// through the dispatcher (a linear's decomposition into mm) belongs to the
// call already counted, so it is not counted again.
class CallingTorch {
 public:
  CallingTorch();
  ~CallingTorch();
  CallingTorch(const CallingTorch&) = delete;
  CallingTorch& operator=(const CallingTorch&) = delete;
};

struct OpStats {
  int64_t hits = 0;
  int64_t fallbacks = 0;
  std::map<std::string, int64_t> reasons;
};
std::map<std::string, OpStats> stats();
void reset_stats();

// Each op family adds its overrides here (overrides/<family>.cpp).
void register_softmax(torch::Library& lib);
// Some need to know the device (a derivative torch has for one key only).
void register_linear(torch::Library& lib, c10::DeviceType device);
void register_linalg(torch::Library& lib);
void register_fp8(torch::Library& lib, c10::DeviceType device);
void register_grouped_mm(torch::Library& lib);

}  // namespace mps_ext::overrides
