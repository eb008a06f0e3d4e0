// Dropout (native_dropout and native_dropout_backward): validation, the
// generator's draw, launch geometry, for both backends. The kernels are in
// metal/dropout.metal.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

namespace mps_ext::ops {

// What the forward kernel's keep mask is a function of, with each element's
// position in memory (DropoutParams).
struct PhiloxKey {
  uint64_t seed = 0, offset = 0;
};

// One draw from the default generator of `device` (torch's CPU or MPS
// generator, under its lock): torch.manual_seed reproduces it, and every
// call gets a key of its own.
PhiloxKey draw_philox_key(const c10::Device& device);

// Why the kernels cannot compute native_dropout(input, p, train=True) on its
// device, or nullopt when they can. A p outside [0, 1] is a reason
// ("invalid arguments"): torch's op then raises its own error.
std::optional<std::string> dropout_unsupported(const at::Tensor& input, double p);

// native_dropout in training (requires !dropout_unsupported): (output,
// mask), the mask bool, both laid out as the input where it is dense,
// contiguous otherwise.
std::tuple<at::Tensor, at::Tensor> dropout_kernels(const at::Tensor& input, double p, PhiloxKey key);

// The same pass written over `self` (dropout_): its mask. A self with gaps
// or repeats goes through a contiguous copy, copied back.
at::Tensor dropout_in_place_kernels(const at::Tensor& self, double p, PhiloxKey key);

// native_dropout_backward: grad_output * mask * scale, mask bool and of
// grad_output's shape.
std::optional<std::string> dropout_backward_unsupported(const at::Tensor& grad_output, const at::Tensor& mask);
at::Tensor dropout_backward_kernels(const at::Tensor& grad_output, const at::Tensor& mask, double scale);

}  // namespace mps_ext::ops
