// aten::_softmax and aten::_log_softmax. Below autograd: torch's backward
// formulas and kernels keep working.
#include <ATen/ATen.h>
#include <ATen/ops/_log_softmax_cpu_dispatch.h>
#include <ATen/ops/_softmax_cpu_dispatch.h>
#if defined(MPS_EXT_METAL)
#include <ATen/ops/_log_softmax_mps_dispatch.h>
#include <ATen/ops/_softmax_mps_dispatch.h>
#endif

#include "ops/softmax.h"
#include "overrides/overrides.h"

namespace mps_ext::overrides {

namespace {

// torch's own kernel for the tensor's device, called directly: going
// through the dispatcher would come back here.
at::Tensor original(const at::Tensor& self, int64_t dim, bool half_to_float, bool log) {
#if defined(MPS_EXT_METAL)
  if (self.device().is_mps())
    return log ? at::mps::_log_softmax(self, dim, half_to_float) : at::mps::_softmax(self, dim, half_to_float);
#endif
  return log ? at::cpu::_log_softmax(self, dim, half_to_float) : at::cpu::_softmax(self, dim, half_to_float);
}

at::Tensor run(const at::Tensor& self, int64_t dim, bool half_to_float, bool log) {
  const char* op = log ? "aten::_log_softmax" : "aten::_softmax";
  // torch's CPU and MPS kernels reject half_to_float (only CUDA's composite
  // asks for it): let torch give its answer.
  std::optional<std::string> why = half_to_float ? std::optional<std::string>("half_to_float")
                                                 : ops::softmax_unsupported(self, dim, self.scalar_type(), log);
  if (why) {
    const CallingTorch calling = fallback(op, *why);
    return original(self, dim, half_to_float, log);
  }
  at::Tensor out = ops::softmax_kernels(self, dim, self.scalar_type(), log);
  hit(op);
  return out;
}

at::Tensor softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  return run(self, dim, half_to_float, false);
}

at::Tensor log_softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  return run(self, dim, half_to_float, true);
}

}  // namespace

void register_softmax(OverrideLibrary& lib) {
  lib.impl("_softmax", TORCH_FN(softmax));
  lib.impl("_log_softmax", TORCH_FN(log_softmax));
}

}  // namespace mps_ext::overrides
