#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>

namespace mps_ext::ops {

// e4m3fn tensors are float8_e4m3fn where the device holds that dtype, and
// uint8 holding the same bits elsewhere (mps before torch 2.15). Every op
// takes either.
at::ScalarType fp8_storage_dtype(const c10::Device& device);

// block_size of a block-scaled weight as (block_n, block_k), checked: two
// positive ints, or a ValueError naming `op`'s argument.
std::pair<int64_t, int64_t> fp8_block_size(const char* op, at::IntArrayRef block_size);

// x (2-D) / scale rounded to e4m3fn, scale = amax / 448 of each
// block_rows x block_cols block (1 for an all-zero block); returns (q, scale
// of shape (ceil(rows / block_rows), ceil(cols / block_cols))).
std::tuple<at::Tensor, at::Tensor> fp8_quantize(const at::Tensor& x, int64_t block_rows, int64_t block_cols);

// q (2-D e4m3fn) * scale of its block, in `dtype`.
at::Tensor fp8_dequantize(const at::Tensor& q, const at::Tensor& scale, int64_t block_rows, int64_t block_cols,
                          at::ScalarType dtype);

// Why the kernels cannot compute torch._scaled_mm(a, b, scale_a, scale_b,
// bias, scale_result, out_dtype=out) (a recipe, dtype or shape they do not
// cover, or one torch rejects), or nullopt. `bits_ok`: uint8 a/b count as
// e4m3fn. Operands e4m3fn or e5m2; outputs float32, float16, bfloat16,
// e4m3fn or e5m2 (scale_result divides float8 outputs).
std::optional<std::string> scaled_mm_unsupported(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                                                 const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                                                 at::ScalarType out, bool bits_ok,
                                                 const std::optional<at::Tensor>& scale_result = std::nullopt);

// Runs the kernels (requires !scaled_mm_unsupported).
at::Tensor scaled_mm_kernels(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                             const at::Tensor& scale_b, const std::optional<at::Tensor>& bias, at::ScalarType out,
                             const std::optional<at::Tensor>& scale_result = std::nullopt);

// mps_ext::scaled_mm: torch._scaled_mm semantics, out_dtype bfloat16 by
// default; uint8 a/b hold e4m3fn bits. What the kernels do not cover goes to
// torch on the CPU and raises torch's error type on mps.
at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a, const at::Tensor& scale_b,
                     const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> out_dtype,
                     const std::optional<at::Tensor>& scale_result);

// mps_ext::fp8_linear: F.linear(input, weight * weight_scale, bias) for an
// e4m3fn weight (n x k) with one scale, one per row, or one per block_size
// block, in input's dtype (float32, float16, bfloat16).
at::Tensor fp8_linear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& weight_scale,
                      const std::optional<at::Tensor>& bias, at::OptionalIntArrayRef block_size);

}  // namespace mps_ext::ops
