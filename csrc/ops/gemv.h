#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace mps_ext::ops {

// The most rows of x (leading dimensions of the input flattened) the GEMV
// kernels take; more rows are a matrix product, torch's business.
constexpr int64_t kGemvMaxRows = 8;

// Why the GEMV kernels cannot compute input @ weight.T (+ bias) on the
// input's device (a category, for override statistics: dtype, shape, layout,
// row count, or a kernel the backend cannot run), or nullopt when they can.
// Never raises: invalid arguments are reasons too.
std::optional<std::string> gemv_unsupported(const at::Tensor& input, const at::Tensor& weight,
                                            const std::optional<at::Tensor>& bias);

// Runs the kernels (requires !gemv_unsupported): F.linear's result, shape
// input.shape[:-1] + (weight.size(0),).
at::Tensor gemv(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

// mps_ext::linear: F.linear semantics; mismatched arguments raise naming the
// argument, what the kernels do not cover goes to torch.
at::Tensor linear(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

}  // namespace mps_ext::ops
