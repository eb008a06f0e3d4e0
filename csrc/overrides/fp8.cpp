// aten::_scaled_mm. torch has a CPU kernel (overridden only to test the
// routing) and no MPS kernel in 2.13-2.15; float8 tensors exist on mps from
// 2.15 on, so the mps override is registered there. What the kernels do not
// cover (e5m2, a float8 output, other recipes, invalid calls) goes to torch's
// CPU kernel: directly for CPU tensors, on copies for mps ones (torch itself
// has nothing to run them with on mps).
#include <ATen/ATen.h>
#include <ATen/ops/_scaled_mm_cpu_dispatch.h>
#include <torch/version.h>

#include "ops/fp8.h"
#include "overrides/overrides.h"

namespace mps_ext::overrides {

namespace {

std::optional<at::Tensor> on_cpu(const std::optional<at::Tensor>& t) {
  return t ? std::optional<at::Tensor>(t->cpu()) : std::nullopt;
}

at::Tensor scaled_mm(const at::Tensor& self, const at::Tensor& mat2, const at::Tensor& scale_a,
                     const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                     const std::optional<at::Tensor>& scale_result, std::optional<at::ScalarType> out_dtype,
                     bool use_fast_accum) {
  const char* op = "aten::_scaled_mm";
  // torch's default output dtype is the input's (float8): not one the kernels write.
  const at::ScalarType out = out_dtype.value_or(self.scalar_type());
  const auto why = ops::scaled_mm_unsupported(self, mat2, scale_a, scale_b, bias, out, false);
  if (!why) {
    at::Tensor result = ops::scaled_mm_kernels(self, mat2, scale_a, scale_b, bias, out);
    hit(op);
    return result;
  }
  fallback(op, *why);
  if (self.device().is_cpu())
    return at::cpu::_scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum);
  return at::cpu::_scaled_mm(self.cpu(), mat2.cpu(), scale_a.cpu(), scale_b.cpu(), on_cpu(bias), on_cpu(scale_result),
                             out_dtype, use_fast_accum)
      .to(self.device());
}

}  // namespace

void register_fp8(torch::Library& lib, c10::DeviceType device) {
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 15
  if (device == c10::DeviceType::MPS) return;  // no float8 tensors on mps
#endif
  (void)device;
  lib.impl("_scaled_mm", TORCH_FN(scaled_mm));
}

}  // namespace mps_ext::overrides
