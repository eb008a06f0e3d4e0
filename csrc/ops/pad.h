// Padding (constant_pad_nd, reflection_pad{1,2,3}d, replication_pad{1,2,3}d
// and their backward): validation, the dimensions the kernels see, launch
// geometry, for both backends. The kernels are in metal/pad.metal.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <optional>
#include <string>

#include "mps_ext/params.h"

namespace mps_ext::ops {

// What a pad op asks: its mode, and for reflect and replicate the number of
// trailing dimensions it pads (1, 2 or 3: the op's name); constant pads the
// last pad.size() / 2.
struct PadOp {
  PadMode mode;
  int64_t dims = 0;
};

// Why the kernels cannot pad `self` by `pad` (torch's order: the last
// dimension's before and after first) on its device, or nullopt when they
// can. Arguments torch rejects are a reason too ("invalid arguments"):
// torch's op then raises its own error.
std::optional<std::string> pad_unsupported(const at::Tensor& self, c10::IntArrayRef pad, PadOp op);

// Runs the kernels (requires !pad_unsupported): the op's result, laid out as
// torch's CPU kernel lays it out.
at::Tensor pad_kernels(const at::Tensor& self, c10::IntArrayRef pad, PadOp op, const c10::Scalar& value);

// The same for reflect and replicate backward: the gradient of `self` from
// that of the padded output.
std::optional<std::string> pad_backward_unsupported(const at::Tensor& grad_output, const at::Tensor& self,
                                                    c10::IntArrayRef pad, PadOp op);
at::Tensor pad_backward_kernels(const at::Tensor& grad_output, const at::Tensor& self, c10::IntArrayRef pad,
                                PadOp op);

}  // namespace mps_ext::ops
