// Decode-time linear (GEMV): validation, kernel choice and launch geometry,
// for both backends. The kernels are in metal/gemv.metal.
#include "ops/gemv.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "backend.h"
#include "overrides/overrides.h"
#include "mps_ext/params.h"
#include "ops/naming.h"
#include "ops/plan_helpers.h"

namespace mps_ext::ops {

namespace {

// Four SIMD groups per threadgroup for the dense kernel.
constexpr uint32_t kDenseSimdGroups = 4;
// A slice of K gets at least this many steps, and a threadgroup at most
// kGemvMaxSlices slices.
constexpr int64_t kMinStepsPerSlice = 2;

// 16-byte chunks of each weight row a lane reads per step (chunks_per_lane
// in metal/gemv.metal).
int64_t chunks_per_lane(int64_t bucket) { return bucket == 1 ? 2 : 1; }

struct GemvPlan {
  std::string kernel;
  Size3 grid, threads;
};

// Threadgroups of kDenseSimdGroups SIMD groups, each on its own `blocks` of rows.
GemvGeometry dense_geometry(int64_t blocks) {
  return {1, {uint32_t((blocks + kDenseSimdGroups - 1) / kDenseSimdGroups)}, {32 * kDenseSimdGroups}};
}

// W stored k-major (gemv_t): a threadgroup per 32 lanes x 16 bytes of
// columns, with as many SIMD groups splitting the rows of W as fill the GPU
// (at most kGemvTMaxSlices, and no more than there are rows).
GemvPlan plan_k_major(int64_t m, int64_t n, int64_t k, at::ScalarType dtype, Backend& backend) {
  const std::string kernel = host_name("gemv", ("t_m" + std::to_string(rows_bucket(m))).c_str(), {dtype});
  const int64_t columns = 32 * (16 / int64_t(c10::elementSize(dtype)));
  const int64_t blocks = (n + columns - 1) / columns;
  const int64_t fill = backend.fill_simdgroups(kernel, 32 * kGemvTMaxSlices);
  int64_t slices = std::clamp<int64_t>(std::min(fill / blocks, k), 1, kGemvTMaxSlices);
  while (slices > 1 && backend.unavailable(kernel, uint32_t(32 * slices))) slices /= 2;
  return {kernel, {uint32_t(blocks)}, {uint32_t(32 * slices)}};
}

// The kernel and geometry for these sizes. Rows of W per SIMD group: for one
// row of x, one when that many SIMD groups fill the GPU (most resident), two
// otherwise (more loads in flight each); two for 2-4 rows of x, four for
// 5-8 (metal/gemv.metal says why).
GemvPlan plan(int64_t m, int64_t n, int64_t k, at::ScalarType dtype, Backend& backend, bool k_major) {
  if (k_major) return plan_k_major(m, n, k, dtype, backend);
  const int64_t bucket = rows_bucket(m);
  const std::string one_row = host_name("gemv", "dense_m1_r1", {dtype});
  const int64_t rows = bucket == 8 ? 4
                       : bucket == 1 && n >= backend.fill_simdgroups(one_row, 32 * kDenseSimdGroups) ? 1
                                                                                                       : 2;
  const int64_t per_step = 32 * (16 / int64_t(c10::elementSize(dtype))) * chunks_per_lane(bucket);
  const std::string tile = "m" + std::to_string(bucket) + "_r" + std::to_string(rows);
  const std::string split = host_name("gemv", ("splitk_" + tile).c_str(), {dtype});
  // One row per SIMD group only where those fill the GPU, so never split (there is no such split kernel).
  const GemvGeometry g =
      rows == 1 ? dense_geometry(n) : gemv_geometry(n, (k + per_step - 1) / per_step, rows, backend, split);
  return {g.slices > 1 ? split : host_name("gemv", ("dense_" + tile).c_str(), {dtype}), g.grid, g.threads};
}

// Whether the kernels read W (n x k) k-major (gemv_t): its rows strided,
// its columns contiguous (a (k x n) row-major matrix seen transposed).
bool k_major(const at::Tensor& weight) {
  return weight.stride(1) != 1 && weight.size(1) != 1 && (weight.stride(0) == 1 || weight.size(0) == 1);
}

// x as (m, k) rows with unit stride along k.
at::Tensor rows_of(const at::Tensor& input, int64_t k) {
  at::Tensor x = input.reshape({-1, k});
  return x.stride(1) == 1 || k == 1 ? x : x.contiguous();
}

}  // namespace

constexpr int64_t kStreamMinBlockBytes = 16384;
static_assert(kGemvStreamMaxRows * kGemvStreamMaxSlices <= kGemvStreamPartials, "the partials fit the kernel's array");
static_assert(kGemvStreamMaxRows <= 32, "a SIMD group's threads finish a threadgroup's rows");

int64_t gemv_stream_rows(int64_t n, int64_t k, int64_t simdgroups_per_block, int64_t fill) {
  const int64_t least = std::clamp<int64_t>((kStreamMinBlockBytes / std::max<int64_t>(k, 1) + 3) / 4 * 4, 4,
                                            int64_t(kGemvStreamMaxRows));
  int64_t rows = kGemvStreamMaxRows;
  while (rows > least && ceil_div(n, rows) * simdgroups_per_block * 10 < fill * 9) rows -= 4;
  return rows;
}

GemvGeometry gemv_geometry(int64_t n, int64_t steps, int64_t rows_per_simdgroup, Backend& backend,
                           const std::string& split_kernel) {
  const int64_t blocks = (n + rows_per_simdgroup - 1) / rows_per_simdgroup;
  // Split only when that at least doubles the SIMD groups: a grid just short
  // of the fill runs best dense.
  const int64_t fill = backend.fill_simdgroups(split_kernel, 32 * kDenseSimdGroups);
  int64_t slices = std::min({int64_t(kGemvMaxSlices), fill / blocks, steps / kMinStepsPerSlice});
  if (slices >= 2) {
    while (slices > 2 && backend.unavailable(split_kernel, uint32_t(32 * slices))) slices /= 2;
    return {slices, {uint32_t(blocks)}, {uint32_t(32 * slices)}};
  }
  return dense_geometry(blocks);
}

std::optional<std::string> gemv_unsupported(const at::Tensor& input, const at::Tensor& weight,
                                            const std::optional<at::Tensor>& bias) {
  std::string why;
  Backend* backend = backend_for(input.device(), &why);
  if (!backend) return why;
  if (!float_type(input.scalar_type())) return std::string("dtype ") + c10::toString(input.scalar_type());
  const bool has_bias = bias && bias->defined();
  if (weight.scalar_type() != input.scalar_type() || (has_bias && bias->scalar_type() != input.scalar_type()))
    return "mixed dtypes";
  if (weight.device() != input.device() || (has_bias && bias->device() != input.device())) return "mixed devices";
  if (input.layout() != at::kStrided || weight.layout() != at::kStrided || (has_bias && bias->layout() != at::kStrided))
    return "not strided";
  if (weight.dim() != 2 || input.dim() < 1) return "weight not 2-D";
  const int64_t n = weight.size(0), k = weight.size(1);
  if (input.size(-1) != k) return "shape mismatch";
  if (has_bias && (bias->dim() != 1 || bias->size(0) != n)) return "bias not 1-D of out_features";
  if (input.numel() == 0 || n == 0) return "empty";
  const int64_t m = input.numel() / k;
  if (m > kGemvMaxRows) return "rows > 8";
  const bool transposed = k_major(weight);
  if (weight.stride(1) != 1 && k != 1 && !transposed) return "weight neither row- nor column-major";
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (n > kMax || k > kMax) return "size >= 2^31";
  const GemvPlan p = plan(m, n, k, input.scalar_type(), *backend, transposed);
  if (auto reason = backend->unavailable(p.kernel, p.threads.x * p.threads.y * p.threads.z)) return reason;
  return std::nullopt;
}

at::Tensor gemv(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const int64_t n = weight.size(0), k = weight.size(1);
  const at::Tensor x = rows_of(input, k);
  const int64_t m = x.size(0);
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end() - 1);
  shape.push_back(n);
  at::Tensor y = at::empty({m, n}, input.options());

  GemvParams q{};
  q.n = uint32_t(n);
  q.k = uint32_t(k);
  q.m = uint32_t(m);
  // Between W's n rows, or for gemv_t between its k rows.
  const bool transposed = k_major(weight);
  q.w_stride = uint64_t(transposed ? weight.stride(1) : n == 1 ? k : weight.stride(0));
  q.x_stride = uint64_t(m == 1 ? k : x.stride(0));
  q.y_stride = uint64_t(n);
  const int64_t es = int64_t(input.element_size());
  q.w_vectorized = aligned16(weight) && ((transposed ? k : n) == 1 || q.w_stride * es % 16 == 0);
  q.x_vectorized = aligned16(x) && (m == 1 || q.x_stride * es % 16 == 0);
  at::Tensor b = weight;  // bound in the bias slot when there is none; never read
  if (bias && bias->defined()) {
    q.has_bias = 1;
    b = bias->stride(0) == 1 ? *bias : bias->contiguous();
  }
  const GemvPlan p = plan(m, n, k, input.scalar_type(), *backend_for(input.device()), transposed);
  dispatch(Launch{p.kernel, {}, p.grid, p.threads}.tensor(weight).tensor(x).tensor(b).tensor(y).bytes(q));
  return y.view(shape);
}

at::Tensor linear(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const bool has_bias = bias && bias->defined();
  TORCH_CHECK(input.dim() >= 1 && weight.dim() >= 1, "mps_ext.linear: input and weight must be at least 1-D, got ",
              input.dim(), "-D input and ", weight.dim(), "-D weight");
  TORCH_CHECK(weight.scalar_type() == input.scalar_type(), "mps_ext.linear: weight (", weight.scalar_type(),
              ") must have the dtype of input (", input.scalar_type(), ")");
  TORCH_CHECK(!has_bias || bias->scalar_type() == input.scalar_type(), "mps_ext.linear: bias (",
              bias->scalar_type(), ") must have the dtype of input (", input.scalar_type(), ")");
  TORCH_CHECK(weight.device() == input.device() && (!has_bias || bias->device() == input.device()),
              "mps_ext.linear: input, weight and bias must be on one device, got input on ", input.device(),
              " and weight on ", weight.device());
  if (weight.dim() == 2)
    TORCH_CHECK(input.size(-1) == weight.size(1), "mps_ext.linear: input's last dimension (", input.size(-1),
                ") must equal weight's in_features (weight.size(1) = ", weight.size(1), "); input ", input.sizes(),
                ", weight ", weight.sizes());
  return overrides::counted(
      "mps_ext::linear", gemv_unsupported(input, weight, bias), [&] { return gemv(input, weight, bias); },
      [&] { return at::linear(input, weight, bias); });
}

}  // namespace mps_ext::ops

TORCH_LIBRARY_FRAGMENT(mps_ext, m) { m.def("linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor"); }

TORCH_LIBRARY_IMPL(mps_ext, CPU, m) { m.impl("linear", TORCH_FN(mps_ext::ops::linear)); }

TORCH_LIBRARY_IMPL(mps_ext, MPS, m) { m.impl("linear", TORCH_FN(mps_ext::ops::linear)); }
