// aten::upsample_nearest{1,2,3}d, _upsample_nearest_exact{1,2,3}d,
// upsample_linear1d, upsample_bilinear2d, upsample_trilinear3d and
// upsample_bicubic2d (F.interpolate's nearest, nearest-exact, linear,
// bilinear, trilinear and bicubic modes, nn.Upsample) with their backward.
// Below autograd: torch's derivatives call the backward ops, and forward-mode
// AD the forward ops on the tangent, so both run the kernels.
#include <ATen/ATen.h>
#include <ATen/ops/_upsample_nearest_exact1d_backward_cpu_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact1d_cpu_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact2d_backward_cpu_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact2d_cpu_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact3d_backward_cpu_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact3d_cpu_dispatch.h>
#include <ATen/ops/upsample_bicubic2d_backward_cpu_dispatch.h>
#include <ATen/ops/upsample_bicubic2d_cpu_dispatch.h>
#include <ATen/ops/upsample_bilinear2d_backward_cpu_dispatch.h>
#include <ATen/ops/upsample_bilinear2d_cpu_dispatch.h>
#include <ATen/ops/upsample_linear1d_backward_cpu_dispatch.h>
#include <ATen/ops/upsample_linear1d_cpu_dispatch.h>
#include <ATen/ops/upsample_nearest1d_backward_cpu_dispatch.h>
#include <ATen/ops/upsample_nearest1d_cpu_dispatch.h>
#include <ATen/ops/upsample_nearest2d_backward_cpu_dispatch.h>
#include <ATen/ops/upsample_nearest2d_cpu_dispatch.h>
#include <ATen/ops/upsample_nearest3d_backward_cpu_dispatch.h>
#include <ATen/ops/upsample_nearest3d_cpu_dispatch.h>
#include <ATen/ops/upsample_trilinear3d_backward_cpu_dispatch.h>
#include <ATen/ops/upsample_trilinear3d_cpu_dispatch.h>
#if defined(MPS_EXT_METAL)
#include <ATen/ops/_upsample_nearest_exact1d_backward_mps_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact1d_mps_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact2d_backward_mps_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact2d_mps_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact3d_backward_mps_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact3d_mps_dispatch.h>
#include <ATen/ops/upsample_bicubic2d_backward_mps_dispatch.h>
#include <ATen/ops/upsample_bicubic2d_mps_dispatch.h>
#include <ATen/ops/upsample_bilinear2d_backward_mps_dispatch.h>
#include <ATen/ops/upsample_bilinear2d_mps_dispatch.h>
#include <ATen/ops/upsample_linear1d_backward_mps_dispatch.h>
#include <ATen/ops/upsample_linear1d_mps_dispatch.h>
#include <ATen/ops/upsample_nearest1d_backward_mps_dispatch.h>
#include <ATen/ops/upsample_nearest1d_mps_dispatch.h>
#include <ATen/ops/upsample_nearest2d_backward_mps_dispatch.h>
#include <ATen/ops/upsample_nearest2d_mps_dispatch.h>
#include <ATen/ops/upsample_nearest3d_backward_mps_dispatch.h>
#include <ATen/ops/upsample_nearest3d_mps_dispatch.h>
#include <ATen/ops/upsample_trilinear3d_backward_mps_dispatch.h>
#include <ATen/ops/upsample_trilinear3d_mps_dispatch.h>
#endif

#include <type_traits>
#include <optional>

#include "ops/upsample.h"
#include "overrides/overrides.h"

namespace mps_ext::overrides {

namespace {

using Scale = std::optional<double>;

// The arguments after the output size (forward) or the input size
// (backward): align_corners for linear and cubic, then one scale per
// interpolated dimension.
template <class... Scales>
ops::UpsampleArgs upsample_args(c10::IntArrayRef output_size, Scales... scales) {
  static_assert((std::is_same_v<Scales, Scale> && ...), "nearest ops take only scales");
  return {output_size, false, {scales...}};
}

template <class... Scales>
ops::UpsampleArgs upsample_args(c10::IntArrayRef output_size, bool align_corners, Scales... scales) {
  static_assert((std::is_same_v<Scales, Scale> && ...), "linear and cubic ops take align_corners, then scales");
  return {output_size, align_corners, {scales...}};
}

// One op's override, its signature that of torch's kernels `Cpu` and `Mps`
// (called directly where the kernels do not cover a call: the dispatcher
// would come back here). `Name` is the statistics' key.
template <const char* Name, UpsampleMode Mode, int64_t Dims, auto Cpu, auto Mps, class Signature = decltype(Cpu)>
struct UpsampleForward;

template <const char* Name, UpsampleMode Mode, int64_t Dims, auto Cpu, auto Mps, class... Rest>
struct UpsampleForward<Name, Mode, Dims, Cpu, Mps, at::Tensor (*)(const at::Tensor&, c10::IntArrayRef, Rest...)> {
  static at::Tensor call(const at::Tensor& self, c10::IntArrayRef output_size, Rest... rest) {
    const ops::UpsampleArgs args = upsample_args(output_size, rest...);
    if (auto why = ops::upsample_unsupported(self, {Mode, Dims}, args)) {
      const CallingTorch calling = fallback(Name, *why);
      return (self.device().is_mps() ? Mps : Cpu)(self, output_size, rest...);
    }
    at::Tensor out = ops::upsample_kernels(self, {Mode, Dims}, args);
    hit(Name);
    return out;
  }
};

template <const char* Name, UpsampleMode Mode, int64_t Dims, auto Cpu, auto Mps, class Signature = decltype(Cpu)>
struct UpsampleBackward;

template <const char* Name, UpsampleMode Mode, int64_t Dims, auto Cpu, auto Mps, class... Rest>
struct UpsampleBackward<Name, Mode, Dims, Cpu, Mps,
                        at::Tensor (*)(const at::Tensor&, c10::IntArrayRef, c10::IntArrayRef, Rest...)> {
  static at::Tensor call(const at::Tensor& grad_output, c10::IntArrayRef output_size, c10::IntArrayRef input_size,
                         Rest... rest) {
    const ops::UpsampleArgs args = upsample_args(output_size, rest...);
    if (auto why = ops::upsample_backward_unsupported(grad_output, input_size, {Mode, Dims}, args)) {
      const CallingTorch calling = fallback(Name, *why);
      return (grad_output.device().is_mps() ? Mps : Cpu)(grad_output, output_size, input_size, rest...);
    }
    at::Tensor grad_input = ops::upsample_backward_kernels(grad_output, input_size, {Mode, Dims}, args);
    hit(Name);
    return grad_input;
  }
};

#if defined(MPS_EXT_METAL)
#define MPS_EXT_TORCH_MPS(op) &at::mps::op
#else
#define MPS_EXT_TORCH_MPS(op) &at::cpu::op
#endif

#define MPS_EXT_UPSAMPLING(op, Mode, N)                                                                \
  constexpr char op##_name[] = "aten::" #op;                                                           \
  constexpr char op##_backward_name[] = "aten::" #op "_backward";                                      \
  using op##_forward = UpsampleForward<op##_name, Mode, N, &at::cpu::op, MPS_EXT_TORCH_MPS(op)>;       \
  using op##_backward = UpsampleBackward<op##_backward_name, Mode, N, &at::cpu::op##_backward,         \
                                         MPS_EXT_TORCH_MPS(op##_backward)>;

MPS_EXT_UPSAMPLING(upsample_nearest1d, kUpsampleNearest, 1)
MPS_EXT_UPSAMPLING(upsample_nearest2d, kUpsampleNearest, 2)
MPS_EXT_UPSAMPLING(upsample_nearest3d, kUpsampleNearest, 3)
MPS_EXT_UPSAMPLING(_upsample_nearest_exact1d, kUpsampleNearestExact, 1)
MPS_EXT_UPSAMPLING(_upsample_nearest_exact2d, kUpsampleNearestExact, 2)
MPS_EXT_UPSAMPLING(_upsample_nearest_exact3d, kUpsampleNearestExact, 3)
MPS_EXT_UPSAMPLING(upsample_linear1d, kUpsampleLinear, 1)
MPS_EXT_UPSAMPLING(upsample_bilinear2d, kUpsampleLinear, 2)
MPS_EXT_UPSAMPLING(upsample_trilinear3d, kUpsampleLinear, 3)
MPS_EXT_UPSAMPLING(upsample_bicubic2d, kUpsampleCubic, 2)

}  // namespace

void register_upsample(OverrideLibrary& lib) {
#define MPS_EXT_REGISTER_UPSAMPLING(op)                  \
  lib.impl(#op, TORCH_FN(op##_forward::call));           \
  lib.impl(#op "_backward", TORCH_FN(op##_backward::call));
  MPS_EXT_REGISTER_UPSAMPLING(upsample_nearest1d)
  MPS_EXT_REGISTER_UPSAMPLING(upsample_nearest2d)
  MPS_EXT_REGISTER_UPSAMPLING(upsample_nearest3d)
  MPS_EXT_REGISTER_UPSAMPLING(_upsample_nearest_exact1d)
  MPS_EXT_REGISTER_UPSAMPLING(_upsample_nearest_exact2d)
  MPS_EXT_REGISTER_UPSAMPLING(_upsample_nearest_exact3d)
  MPS_EXT_REGISTER_UPSAMPLING(upsample_linear1d)
  MPS_EXT_REGISTER_UPSAMPLING(upsample_bilinear2d)
  MPS_EXT_REGISTER_UPSAMPLING(upsample_trilinear3d)
  MPS_EXT_REGISTER_UPSAMPLING(upsample_bicubic2d)
#undef MPS_EXT_REGISTER_UPSAMPLING
}

}  // namespace mps_ext::overrides
