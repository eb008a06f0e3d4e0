// aten::_grouped_mm. torch 2.13 and 2.14 have only the composite kernel
// (CompositeExplicitAutograd, every device): it copies offs to the CPU (a
// synchronisation on mps) and runs one mm per group. torch 2.15 adds an MPS
// kernel. The override replaces both on mps, and the composite on cpu (to
// test the routing); invalid calls and what the kernels do not cover go to
// torch's kernel, which raises or computes. Autograd stays torch's: the
// derivative of _grouped_mm calls _grouped_mm again (2D x 2D for the weight
// gradient), which lands here too.
#include <ATen/ATen.h>
#include <ATen/ops/_grouped_mm_compositeexplicitautograd_dispatch.h>
#include <torch/version.h>
#if defined(MPS_EXT_METAL) && TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15
#include <ATen/ops/_grouped_mm_mps_dispatch.h>
#define MPS_EXT_TORCH_GROUPED_MM_MPS 1
#endif

#include "ops/grouped_mm.h"
#include "overrides/overrides.h"

namespace mps_ext::overrides {

namespace {

// torch's own kernel for the tensors' device, called directly: going through
// the dispatcher would come back here.
at::Tensor original(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs,
                    const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> out_dtype) {
#if defined(MPS_EXT_TORCH_GROUPED_MM_MPS)
  if (a.device().is_mps()) return at::mps::_grouped_mm(a, b, offs, bias, out_dtype);
#endif
  return at::compositeexplicitautograd::_grouped_mm(a, b, offs, bias, out_dtype);
}

at::Tensor grouped_mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs,
                      const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> out_dtype) {
  const char* op = "aten::_grouped_mm";
  std::optional<std::string> why;
  if (ops::grouped_mm_invalid(a, b, offs, bias, out_dtype, true)) why = "invalid arguments";
  if (!why) why = ops::grouped_mm_unsupported(a, b, offs);
  if (why) {
    const CallingTorch calling = fallback(op, *why);
    return original(a, b, offs, bias, out_dtype);
  }
  at::Tensor out = ops::grouped_mm_kernels(a, b, offs);
  hit(op);
  return out;
}

}  // namespace

void register_grouped_mm(OverrideLibrary& lib) { lib.impl("_grouped_mm", TORCH_FN(grouped_mm)); }

}  // namespace mps_ext::overrides
