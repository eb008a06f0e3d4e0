// aten::_scaled_mm and aten::_scaled_mm_v2 (F.scaled_mm). torch has CPU
// kernels for both (overridden only to test the routing); on mps, torch runs
// kernels on float8 tensors from 2.15 on, which has a native _scaled_mm_v2
// and no _scaled_mm, so the mps overrides are registered there only. What the
// kernels do not cover (the fnuz formats, block-wise recipes, invalid calls)
// goes to torch: its kernel for the device, or for _scaled_mm on mps
// (torch has none) its CPU kernel on copies.
#include <ATen/ATen.h>
#include <ATen/ops/_scaled_mm_cpu_dispatch.h>
#include <torch/version.h>
// Every supported torch (2.13-2.15) has a CPU _scaled_mm_v2; torch 2.11, which
// the CUDA check's GPU machine builds mps_ext against, has none to override.
#if __has_include(<ATen/ops/_scaled_mm_v2_cpu_dispatch.h>)
#include <ATen/ops/_scaled_mm_v2_cpu_dispatch.h>
#define MPS_EXT_CPU_SCALED_MM_V2 1
#endif
#if defined(MPS_EXT_METAL) && TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15
#include <ATen/ops/_scaled_mm_v2_mps_dispatch.h>
#define MPS_EXT_MPS_SCALED_MM_V2 1
#endif

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
  // torch's default output dtype is the input's (float8); it applies scale_result only to an output dtype given.
  const at::ScalarType out = out_dtype.value_or(self.scalar_type());
  const std::optional<at::Tensor> result_scale = out_dtype ? scale_result : std::nullopt;
  const auto why = ops::scaled_mm_unsupported(self, mat2, scale_a, scale_b, bias, out, false, result_scale);
  if (!why) {
    at::Tensor result = ops::scaled_mm_kernels(self, mat2, scale_a, scale_b, bias, out, result_scale);
    hit(op);
    return result;
  }
  const CallingTorch calling = fallback(op, *why);
  if (self.device().is_cpu())
    return at::cpu::_scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum);
  return at::cpu::_scaled_mm(self.cpu(), mat2.cpu(), scale_a.cpu(), scale_b.cpu(), on_cpu(bias), on_cpu(scale_result),
                             out_dtype, use_fast_accum)
      .to(self.device());
}

#if defined(MPS_EXT_CPU_SCALED_MM_V2)
// The scale lists' type in _scaled_mm_v2's C++ signature.
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 14
using ScaleList = at::TensorList;
#else
using ScaleList = const at::ITensorListRef&;
#endif

// F.scaled_mm's ScalingType and SwizzleType values the kernels implement.
constexpr int64_t kTensorWise = 0, kRowWise = 1, kNoSwizzle = 0;

// Why the kernels do not run this _scaled_mm_v2 call, or nullopt.
std::optional<std::string> v2_unsupported(const at::Tensor& self, const at::Tensor& mat2, ScaleList scale_a,
                                          at::IntArrayRef recipe_a, at::IntArrayRef swizzle_a, ScaleList scale_b,
                                          at::IntArrayRef recipe_b, at::IntArrayRef swizzle_b,
                                          const std::optional<at::Tensor>& bias,
                                          std::optional<at::ScalarType> out_dtype,
                                          at::IntArrayRef contraction_dim) {
  if (scale_a.size() != 1 || scale_b.size() != 1 || recipe_a.size() != 1 || recipe_b.size() != 1 ||
      recipe_a[0] != recipe_b[0] || (recipe_a[0] != kTensorWise && recipe_a[0] != kRowWise))
    return "scaling recipe (only tensor-wise or row-wise for both)";
  for (at::IntArrayRef swizzle : {swizzle_a, swizzle_b})
    for (int64_t z : swizzle)
      if (z != kNoSwizzle) return "swizzled scales";
  if (!contraction_dim.empty()) return "contraction_dim";
  if (!out_dtype) return "no output dtype";
  // Checked against torch's CPU kernel for _scaled_mm only.
  if (self.scalar_type() != at::kFloat8_e4m3fn || mat2.scalar_type() != at::kFloat8_e4m3fn ||
      at::isFloat8Type(*out_dtype))
    return "float8 formats other than e4m3fn operands with a float output";
  if (bias && bias->scalar_type() != *out_dtype) return "bias dtype differs from the output's";
  return ops::scaled_mm_unsupported(self, mat2, *scale_a.begin(), *scale_b.begin(), bias, *out_dtype, false);
}

at::Tensor scaled_mm_v2(const at::Tensor& self, const at::Tensor& mat2, ScaleList scale_a, at::IntArrayRef recipe_a,
                        at::IntArrayRef swizzle_a, ScaleList scale_b, at::IntArrayRef recipe_b,
                        at::IntArrayRef swizzle_b, const std::optional<at::Tensor>& bias,
                        std::optional<at::ScalarType> out_dtype, at::IntArrayRef contraction_dim,
                        bool use_fast_accum) {
  const char* op = "aten::_scaled_mm_v2";
  const auto why = v2_unsupported(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias,
                                  out_dtype, contraction_dim);
  if (!why) {
    at::Tensor result = ops::scaled_mm_kernels(self, mat2, *scale_a.begin(), *scale_b.begin(), bias, *out_dtype);
    hit(op);
    return result;
  }
  const CallingTorch calling = fallback(op, *why);
#if defined(MPS_EXT_MPS_SCALED_MM_V2)
  if (self.device().is_mps())
    return at::mps::_scaled_mm_v2(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias,
                                  out_dtype, contraction_dim, use_fast_accum);
#endif
  return at::cpu::_scaled_mm_v2(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias,
                                out_dtype, contraction_dim, use_fast_accum);
}
#endif

}  // namespace

void register_fp8(OverrideLibrary& lib, c10::DeviceType device) {
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 15
  if (device == c10::DeviceType::MPS) return;  // mps_ext keeps e4m3fn there as uint8 bits
#endif
  (void)device;
  lib.impl("_scaled_mm", TORCH_FN(scaled_mm));
#if defined(MPS_EXT_CPU_SCALED_MM_V2)
  lib.impl("_scaled_mm_v2", TORCH_FN(scaled_mm_v2));
#endif
}

}  // namespace mps_ext::overrides
