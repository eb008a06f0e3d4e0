#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "backend.h"
#include "mps_ext/params.h"

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

// The streamed decode GEMV (gemv_stream in mps_ext/gemv.h: fp8_linear's and
// scaled_mm's for one row of a, fp8_grouped_mm's for one routed row per
// expert): a SIMD group per 32 lanes x `bytes` e4m3fn bytes of K (its slice),
// so K up to kGemvStreamMaxSlices of them, holds its part of the row in
// registers while a block of weight rows streams past. gemv_stream_rows: the
// rows of a block (a multiple of 4: the kernels take them two or four at a time),
// 32, or fewer in steps of 4 until the grid holds at least 90% of the SIMD
// groups that fill the GPU, but never fewer than 16 KB of weights (rows of k
// bytes); `simdgroups_per_block` is what one block of rows costs (the slices,
// times the rows of x that each read the block on their own). Each
// threadgroup loads its row once per SIMD group and sums its partials once,
// so fewer, larger threadgroups cost less where they still fill the GPU; on
// the CUDA proxy 32 rows ran lm_head 6% faster than 64 and 5% faster than 16,
// a grid just short of the fill (Llama's down_proj: 128 threadgroups of 28
// SIMD groups for 132 resident) 12% faster than twice as many of half the
// rows, and Qwen3-30B-A3B's down experts at one token (K = 768) 8% faster in
// blocks of 24 rows than of the 12 the fill alone gives.
inline int64_t gemv_stream_slices(int64_t k, int64_t bytes = 16) {
  return std::max<int64_t>(1, (k + 32 * bytes - 1) / (32 * bytes));
}
inline bool gemv_streams(int64_t k, int64_t bytes = 16) { return gemv_stream_slices(k, bytes) <= kGemvStreamMaxSlices; }
int64_t gemv_stream_rows(int64_t n, int64_t k, int64_t simdgroups_per_block, int64_t fill);

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
