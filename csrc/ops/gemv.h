#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "backend.h"

namespace mps_ext::ops {

// The most rows of x (leading dimensions of the input flattened) the GEMV
// kernels take; more rows are a matrix product, torch's business.
constexpr int64_t kGemvMaxRows = 8;

// How a decode GEMV (metal/gemv.metal, metal/fp8.metal) covers n rows of W:
// one SIMD group per block of rows_per_simdgroup rows over all of K, four per
// threadgroup (slices == 1), or, when that would leave the GPU short of SIMD
// groups (Backend::fill_simdgroups), `slices` SIMD groups of one threadgroup
// per block, each on every slices-th step of K (a step is the K range one
// SIMD group reads of its rows at once: steps = ceil(k / step)).
// `split_kernel` is the kernel that would run split, which the backend may
// limit to fewer threads per threadgroup.
struct GemvGeometry {
  int64_t slices;
  Size3 grid, threads;
};
GemvGeometry gemv_geometry(int64_t n, int64_t steps, int64_t rows_per_simdgroup, Backend& backend,
                           const std::string& split_kernel);

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
