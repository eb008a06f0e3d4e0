// Interpolation (upsample_nearest{1,2,3}d, _upsample_nearest_exact{1,2,3}d,
// upsample_linear1d, upsample_bilinear2d, upsample_trilinear3d,
// upsample_bicubic2d and their backward): validation, the dimensions and
// scales the kernels see, launch geometry, for both backends. The kernels are
// in metal/upsample.metal.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string>

#include "mps_ext/params.h"

namespace mps_ext::ops {

// What an upsample op asks: its mode, and the number of trailing dimensions
// it interpolates (1, 2 or 3: the op's name).
struct UpsampleOp {
  UpsampleMode mode;
  int64_t dims;
};

// A call's arguments but its tensors: the interpolated dimensions' output
// size, align_corners (linear and cubic), and each interpolated dimension's
// scale where the call gives one, outermost first (scales_d, scales_h,
// scales_w; those past op.dims unused).
struct UpsampleArgs {
  c10::IntArrayRef output_size;
  bool align_corners = false;
  std::array<std::optional<double>, 3> scales{};
};

// Why the kernels cannot compute the op on `self` on its device, or nullopt
// when they can. Arguments torch rejects are a reason too ("invalid
// arguments"): torch's op then raises its own error.
std::optional<std::string> upsample_unsupported(const at::Tensor& self, UpsampleOp op, const UpsampleArgs& args);

// Runs the kernels (requires !upsample_unsupported): the op's result, laid
// out as torch's CPU kernel lays it out.
at::Tensor upsample_kernels(const at::Tensor& self, UpsampleOp op, const UpsampleArgs& args);

// The same for the backward ops: the gradient of the op's input, of size
// `input_size`, from that of its output.
std::optional<std::string> upsample_backward_unsupported(const at::Tensor& grad_output, c10::IntArrayRef input_size,
                                                         UpsampleOp op, const UpsampleArgs& args);
at::Tensor upsample_backward_kernels(const at::Tensor& grad_output, c10::IntArrayRef input_size, UpsampleOp op,
                                     const UpsampleArgs& args);

}  // namespace mps_ext::ops
