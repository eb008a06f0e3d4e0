// aten::constant_pad_nd (F.pad's constant mode), reflection_pad{1,2,3}d and
// replication_pad{1,2,3}d with their backward. On mps these are MPSGraph's
// padTensor in torch 2.13 and 2.14 (replication_pad1d aside): it writes the
// fill value over a 5-D input whose frames hold 65,536 elements or more, and
// keeps driver memory for every call and shape. Below autograd: torch's
// derivatives call these ops again (constant_pad_nd's backward is a
// constant_pad_nd that crops), so backward runs the kernels too.
#include <ATen/ATen.h>
#include <ATen/ops/constant_pad_nd_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/reflection_pad1d_backward_cpu_dispatch.h>
#include <ATen/ops/reflection_pad1d_cpu_dispatch.h>
#include <ATen/ops/reflection_pad2d_backward_cpu_dispatch.h>
#include <ATen/ops/reflection_pad2d_cpu_dispatch.h>
#include <ATen/ops/reflection_pad3d_backward_cpu_dispatch.h>
#include <ATen/ops/reflection_pad3d_cpu_dispatch.h>
#include <ATen/ops/replication_pad1d_backward_cpu_dispatch.h>
#include <ATen/ops/replication_pad1d_cpu_dispatch.h>
#include <ATen/ops/replication_pad2d_backward_cpu_dispatch.h>
#include <ATen/ops/replication_pad2d_cpu_dispatch.h>
#include <ATen/ops/replication_pad3d_backward_cpu_dispatch.h>
#include <ATen/ops/replication_pad3d_cpu_dispatch.h>
#if defined(MPS_EXT_METAL)
#include <ATen/ops/constant_pad_nd_mps_dispatch.h>
#include <ATen/ops/reflection_pad1d_backward_mps_dispatch.h>
#include <ATen/ops/reflection_pad1d_mps_dispatch.h>
#include <ATen/ops/reflection_pad2d_backward_mps_dispatch.h>
#include <ATen/ops/reflection_pad2d_mps_dispatch.h>
#include <ATen/ops/reflection_pad3d_backward_mps_dispatch.h>
#include <ATen/ops/reflection_pad3d_mps_dispatch.h>
#include <ATen/ops/replication_pad1d_backward_mps_dispatch.h>
#include <ATen/ops/replication_pad1d_mps_dispatch.h>
#include <ATen/ops/replication_pad2d_backward_mps_dispatch.h>
#include <ATen/ops/replication_pad2d_mps_dispatch.h>
#include <ATen/ops/replication_pad3d_backward_mps_dispatch.h>
#include <ATen/ops/replication_pad3d_mps_dispatch.h>
#endif

#include "ops/pad.h"
#include "overrides/overrides.h"

namespace mps_ext::overrides {

namespace {

using Forward = at::Tensor (*)(const at::Tensor&, c10::IntArrayRef);
using Backward = at::Tensor (*)(const at::Tensor&, const at::Tensor&, c10::IntArrayRef);

// torch's own kernels of one reflection or replication op, by device: called
// directly, since the dispatcher would come back here.
struct TorchPad {
  Forward cpu, mps;
  Backward cpu_backward, mps_backward;
};

#if defined(MPS_EXT_METAL)
#define MPS_EXT_TORCH_PAD(op) \
  TorchPad { &at::cpu::op, &at::mps::op, &at::cpu::op##_backward, &at::mps::op##_backward }
#else
#define MPS_EXT_TORCH_PAD(op) \
  TorchPad { &at::cpu::op, &at::cpu::op, &at::cpu::op##_backward, &at::cpu::op##_backward }
#endif

at::Tensor original_constant(const at::Tensor& self, c10::IntArrayRef pad, const at::Scalar& value) {
#if defined(MPS_EXT_METAL)
  if (self.device().is_mps()) return at::mps::constant_pad_nd(self, pad, value);
#endif
  return at::compositeexplicitautograd::constant_pad_nd(self, pad, value);
}

at::Tensor constant_pad_nd(const at::Tensor& self, c10::IntArrayRef pad, const at::Scalar& value) {
  const ops::PadOp op{kPadConstant};
  if (auto why = ops::pad_unsupported(self, pad, op)) {
    const CallingTorch calling = fallback("aten::constant_pad_nd", *why);
    return original_constant(self, pad, value);
  }
  at::Tensor out = ops::pad_kernels(self, pad, op, value);
  hit("aten::constant_pad_nd");
  return out;
}

// reflection_pad<N>d / replication_pad<N>d and their backward, one
// instantiation per op: the name is the statistics' key.
template <PadMode Mode, int64_t N, const char* Name, const char* BackwardName, const TorchPad& Torch>
struct Padding {
  static at::Tensor forward(const at::Tensor& self, c10::IntArrayRef padding) {
    if (auto why = ops::pad_unsupported(self, padding, {Mode, N})) {
      const CallingTorch calling = fallback(Name, *why);
      return (self.device().is_mps() ? Torch.mps : Torch.cpu)(self, padding);
    }
    at::Tensor out = ops::pad_kernels(self, padding, {Mode, N}, 0);
    hit(Name);
    return out;
  }
  static at::Tensor backward(const at::Tensor& grad_output, const at::Tensor& self, c10::IntArrayRef padding) {
    if (auto why = ops::pad_backward_unsupported(grad_output, self, padding, {Mode, N})) {
      const CallingTorch calling = fallback(BackwardName, *why);
      return (self.device().is_mps() ? Torch.mps_backward : Torch.cpu_backward)(grad_output, self, padding);
    }
    at::Tensor grad_input = ops::pad_backward_kernels(grad_output, self, padding, {Mode, N});
    hit(BackwardName);
    return grad_input;
  }
};

#define MPS_EXT_PADDING(op, Mode, N)                                                               \
  constexpr char op##_name[] = "aten::" #op;                                                       \
  constexpr char op##_backward_name[] = "aten::" #op "_backward";                                  \
  const TorchPad op##_torch = MPS_EXT_TORCH_PAD(op);                                               \
  using op##_impl = Padding<Mode, N, op##_name, op##_backward_name, op##_torch>;

MPS_EXT_PADDING(reflection_pad1d, kPadReflect, 1)
MPS_EXT_PADDING(reflection_pad2d, kPadReflect, 2)
MPS_EXT_PADDING(reflection_pad3d, kPadReflect, 3)
MPS_EXT_PADDING(replication_pad1d, kPadReplicate, 1)
MPS_EXT_PADDING(replication_pad2d, kPadReplicate, 2)
MPS_EXT_PADDING(replication_pad3d, kPadReplicate, 3)

}  // namespace

void register_pad(OverrideLibrary& lib) {
  lib.impl("constant_pad_nd", TORCH_FN(constant_pad_nd));
#define MPS_EXT_REGISTER_PADDING(op)                               \
  lib.impl(#op, TORCH_FN(op##_impl::forward));                     \
  lib.impl(#op "_backward", TORCH_FN(op##_impl::backward));
  MPS_EXT_REGISTER_PADDING(reflection_pad1d)
  MPS_EXT_REGISTER_PADDING(reflection_pad2d)
  MPS_EXT_REGISTER_PADDING(reflection_pad3d)
  MPS_EXT_REGISTER_PADDING(replication_pad1d)
  MPS_EXT_REGISTER_PADDING(replication_pad2d)
  MPS_EXT_REGISTER_PADDING(replication_pad3d)
#undef MPS_EXT_REGISTER_PADDING
}

}  // namespace mps_ext::overrides
