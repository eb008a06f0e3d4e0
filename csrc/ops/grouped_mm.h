#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace mps_ext::ops {

// What torch._grouped_mm would raise for these arguments (its checks and
// messages, which name the argument), or nullopt. `torch_strides` applies
// torch's layout rule (one of the last two dimensions unit-stride, the other
// a multiple of 16 bytes); the kernels themselves take any strides.
std::optional<std::string> grouped_mm_invalid(const at::Tensor& a, const at::Tensor& b,
                                              const std::optional<at::Tensor>& offs,
                                              const std::optional<at::Tensor>& bias,
                                              std::optional<at::ScalarType> out_dtype, bool torch_strides);

// Why the kernels cannot run these valid arguments on their device (a
// category, for override statistics), or nullopt when they can.
std::optional<std::string> grouped_mm_unsupported(const at::Tensor& a, const at::Tensor& b,
                                                  const std::optional<at::Tensor>& offs);

// Runs the kernels (requires neither of the above): one dispatch, offs read
// on the device. The output has torch's shape and strides; positions past
// offs[-1] are left as allocated, as torch leaves them.
at::Tensor grouped_mm_kernels(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs);

// mps_ext::grouped_mm: torch._grouped_mm semantics without its stride rule;
// invalid arguments raise torch's error, what the kernels do not cover goes
// to torch.
at::Tensor grouped_mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs,
                      std::optional<at::ScalarType> out_dtype);

// mps_ext::fp8_grouped_mm: grouped_mm(x, (weight * weight_scale).transpose(1, 2), offs) for e4m3fn expert
// weights (G, n, k) with per-channel or block scales per expert, the weights kept in FP8. Few rows per
// expert run the decode kernel on the FP8 bytes, more the tiled kernel, which decodes them into its tiles.
at::Tensor fp8_grouped_mm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                          const at::Tensor& offs, at::OptionalIntArrayRef block_size,
                          std::optional<at::ScalarType> out_dtype);

}  // namespace mps_ext::ops
