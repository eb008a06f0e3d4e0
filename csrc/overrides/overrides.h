// Overrides of aten ops: registered at a device's dispatch key through a
// torch::Library this extension owns (destroying it restores torch's
// kernels), with per-op statistics of what ran.
#pragma once

#include <c10/core/DeviceType.h>
#include <torch/library.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mps_ext::overrides {

void enable(c10::DeviceType device);
void disable(c10::DeviceType device);
bool is_enabled(c10::DeviceType device);
// The aten ops (overload names) whose kernels the device's overrides replace;
// empty while they are off. torch.compile keeps these ops whole for the
// dispatcher to run (mps_ext/_compile.py).
std::vector<std::string> overridden_ops(c10::DeviceType device);

// Held while torch's own op runs a call that an override or one of
// mps_ext's ops left to it: what that op reaches through the dispatcher (a
// linear's decomposition into mm) belongs to the call already counted, so it
// is not counted again, and goes to torch's kernels too (inside_torch_call):
// a call left to torch is torch's, bit for bit.
class CallingTorch {
 public:
  CallingTorch();
  ~CallingTorch();
  CallingTorch(const CallingTorch&) = delete;
  CallingTorch& operator=(const CallingTorch&) = delete;
};

// Called by every override and by mps_ext's own ops (counted as
// "mps_ext::<op>"): the kernels ran, or the call goes to torch's op, for
// `reason`; hold what fallback returns while torch's op runs. A call that
// autograd's backward makes is counted as "<op> (backward)".
void hit(const char* op);
bool inside_torch_call();
[[nodiscard]] CallingTorch fallback(const char* op, const std::string& reason);

// One of mps_ext's own ops, counted as "mps_ext::<name>" like an override's
// call: `kernels()` when `why` is empty, else `torch_op()`.
template <class Kernels, class TorchOp>
auto counted(const char* op, const std::optional<std::string>& why, Kernels&& kernels, TorchOp&& torch_op) {
  if (why) {
    const CallingTorch calling = fallback(op, *why);
    return torch_op();
  }
  auto out = kernels();
  hit(op);
  return out;
}

struct OpStats {
  int64_t hits = 0;
  int64_t fallbacks = 0;
  std::map<std::string, int64_t> reasons;
};
std::map<std::string, OpStats> stats();
void reset_stats();

// One device's overrides: each kernel at the device's dispatch key, and, at
// torch's Conjugate and Negative keys, the resolution of those lazy bits on
// its inputs. torch resolves them for most ops itself but lets some through
// to kernels that read the bits (mm, addmm, linalg_solve_triangular...);
// the Metal kernels read memory as stored, so every overridden op gets
// resolved inputs, whatever torch's list holds.
class OverrideLibrary {
 public:
  explicit OverrideLibrary(c10::DispatchKey key);
  template <class Func>
  void impl(const char* name, Func&& func) {
    device_.impl(name, std::forward<Func>(func));
    ops_.emplace_back(name);
    conjugate_.impl(name, resolving_lazy_bits());
    negative_.impl(name, resolving_lazy_bits());
  }
  // A kernel at the device's Autograd key, where torch's derivative of an op
  // given a device kernel does not cover what its decomposition did.
  void impl_autograd(const char* name, torch::CppFunction&& func) { autograd_.impl(name, std::move(func)); }
  const std::vector<std::string>& ops() const { return ops_; }

 private:
  static torch::CppFunction resolving_lazy_bits();
  torch::Library device_, conjugate_, negative_, autograd_;
  std::vector<std::string> ops_;
};

// Each op family adds its overrides here (overrides/<family>.cpp).
void register_softmax(OverrideLibrary& lib);
// Some need to know the device (a derivative torch has for one key only).
void register_linear(OverrideLibrary& lib, c10::DeviceType device);
void register_linalg(OverrideLibrary& lib);
void register_fp8(OverrideLibrary& lib, c10::DeviceType device);
void register_grouped_mm(OverrideLibrary& lib);
void register_pad(OverrideLibrary& lib);
void register_upsample(OverrideLibrary& lib);
void register_dropout(OverrideLibrary& lib);
void register_attention(OverrideLibrary& lib, c10::DeviceType device);

}  // namespace mps_ext::overrides
