// softmax / log_softmax: validation, kernel choice and launch geometry, for
// both backends. The kernels are in metal/softmax.metal.
#include "ops/softmax.h"

#include <ATen/ATen.h>
#include <ATen/WrapDimUtils.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend.h"
#include "overrides/overrides.h"
#include "mps_ext/params.h"
#include "ops/naming.h"
#include "ops/plan_helpers.h"

namespace mps_ext::ops {

namespace {

// Rows up to this length are held by the lanes of a SIMD group (at most 32
// lanes x 4 elements), eight SIMD groups per threadgroup; up to kBlockCols, a
// threadgroup's (1024 x 4).
constexpr int64_t kSimdCols = 128, kBlockCols = 4096;
constexpr uint32_t kSimdGroupsPerThreadgroup = 8;
// Longer rows: chunks of 256 threads x 8 elements, one threadgroup each.
constexpr uint32_t kSplitThreads = 256, kChunk = kSplitThreads * 8;
constexpr uint32_t kStridedThreads = 256;
// The strided kernel runs one thread per column; with fewer columns than
// this it cannot fill a GPU, so the reduced dimension is moved last instead.
constexpr int64_t kMinStridedColumns = 1024;

struct Step {
  std::string kernel;
  Size3 grid, threads;
};

// How a softmax of this shape runs: which kernels, with which geometry.
struct SoftmaxPlan {
  int64_t dim;        // wrapped
  bool move_dim_last;  // run on input.movedim(dim, -1) and move it back
  SoftmaxParams params{};
  std::vector<Step> steps;
};

SoftmaxPlan plan(const at::Tensor& input, int64_t dim, at::ScalarType out_dtype, bool log) {
  SoftmaxPlan p;
  p.dim = c10::maybe_wrap_dim(dim, input.dim());
  const int64_t cols = input.dim() ? input.size(p.dim) : 1;
  int64_t inner = 1;
  for (int64_t k = p.dim + 1; k < input.dim(); ++k) inner *= input.size(k);
  const int64_t outer = cols * inner != 0 ? input.numel() / (cols * inner) : 0;
  p.move_dim_last = inner != 1 && outer * inner < kMinStridedColumns;
  if (p.move_dim_last) inner = 1;
  if (input.numel() == 0) return p;

  const char* op = log ? "log_softmax" : "softmax";
  const at::ScalarType in_dtype = input.scalar_type();
  SoftmaxParams& q = p.params;
  q.cols = uint32_t(cols);
  q.inner = uint32_t(inner);
  if (inner != 1) {
    q.rows = uint32_t(outer * inner);
    p.steps.push_back({host_name(op, "strided", {in_dtype, out_dtype}), {ceil_div(q.rows, kStridedThreads)},
                       {kStridedThreads}});
    return p;
  }
  q.rows = uint32_t(input.numel() / cols);
  if (cols <= kSimdCols) {
    // Lanes per row: the least power of two holding cols at 4 per lane (the kernel's `width`).
    int64_t width = 1;
    while (width * 4 < cols) width *= 2;
    p.steps.push_back({host_name(op, "simd", {in_dtype, out_dtype}),
                       {ceil_div(q.rows, kSimdGroupsPerThreadgroup * (32 / width))},
                       {32 * kSimdGroupsPerThreadgroup}});
    return p;
  }
  if (cols <= kBlockCols) {
    const uint32_t threads = std::clamp<uint32_t>(ceil_div(ceil_div(cols, 4), 32) * 32, 32, 1024);
    p.steps.push_back({host_name(op, "block", {in_dtype, out_dtype}), {q.rows}, {threads}});
    return p;
  }
  q.chunk = kChunk;
  q.chunks = ceil_div(cols, kChunk);
  p.steps.push_back({host_name("softmax", "partials", {in_dtype}), {q.chunks, q.rows}, {kSplitThreads}});
  p.steps.push_back({host_name(op, "finalize", {in_dtype, out_dtype}), {q.chunks, q.rows}, {kSplitThreads}});
  return p;
}

}  // namespace

std::optional<std::string> softmax_unsupported(const at::Tensor& input, int64_t dim, at::ScalarType out_dtype,
                                               bool log) {
  std::string why;
  Backend* backend = backend_for(input.device(), &why);
  if (!backend) return why;
  if (!float_type(input.scalar_type())) return std::string("dtype ") + c10::toString(input.scalar_type());
  if (out_dtype != input.scalar_type() && !(out_dtype == at::kFloat && input.scalar_type() != at::kFloat))
    return std::string("output dtype ") + c10::toString(out_dtype) + " from " + c10::toString(input.scalar_type());
  if (input.numel() > std::numeric_limits<int32_t>::max()) return "more than 2^31 elements";
  for (const Step& s : plan(input, dim, out_dtype, log).steps)
    if (auto reason = backend->unavailable(s.kernel, s.threads.x * s.threads.y * s.threads.z)) return reason;
  return std::nullopt;
}

at::Tensor softmax_kernels(const at::Tensor& self, int64_t dim, at::ScalarType out_dtype, bool log) {
  SoftmaxPlan p = plan(self, dim, out_dtype, log);
  if (p.move_dim_last) {
    const at::Tensor moved = self.movedim(p.dim, -1);
    const at::Tensor out = softmax_kernels(moved, -1, out_dtype, log).movedim(-1, p.dim);
    before_torch_ops(out.device());  // the copy reads what the kernels wrote
    return out.contiguous();
  }
  const at::Tensor input = self.contiguous();
  at::Tensor out = at::empty(input.sizes(), input.options().dtype(out_dtype));
  if (p.steps.empty()) return out;
  // 4-wide loads need rows that start 4-element aligned (the output is new:
  // aligned). What counts is the address: a CPU tensor's storage may itself
  // start misaligned (numpy views); an MPS buffer's contents are page-aligned,
  // so there the byte offset is the address modulo the vector size.
  const uintptr_t address = input.is_cpu() ? reinterpret_cast<uintptr_t>(input.const_data_ptr())
                                           : uintptr_t(input.storage_offset()) * input.element_size();
  p.params.vectorized =
      p.params.inner == 1 && p.params.cols % 4 == 0 && address % (4 * input.element_size()) == 0;
  if (p.steps.size() == 1) {
    const Step& s = p.steps[0];
    dispatch(Launch{s.kernel, {}, s.grid, s.threads}.tensor(input).tensor(out).bytes(p.params));
    return out;
  }
  const at::Tensor partials =
      at::empty({int64_t(p.params.rows), int64_t(p.params.chunks), 2}, input.options().dtype(at::kFloat));
  dispatch(Launch{p.steps[0].kernel, {}, p.steps[0].grid, p.steps[0].threads}.tensor(input).tensor(partials).bytes(
      p.params));
  dispatch(Launch{p.steps[1].kernel, {}, p.steps[1].grid, p.steps[1].threads}
               .tensor(input)
               .tensor(partials)
               .tensor(out)
               .bytes(p.params));
  return out;
}

namespace {

at::Tensor softmax_common(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype, bool log) {
  // torch casts to `dtype` first; half/bfloat16 to float happens in the kernel.
  at::Tensor input = self;
  at::ScalarType out = dtype.value_or(self.scalar_type());
  if (dtype && !(out == at::kFloat && (self.scalar_type() == at::kHalf || self.scalar_type() == at::kBFloat16)))
    input = self.to(out);
  return overrides::counted(
      log ? "mps_ext::log_softmax" : "mps_ext::softmax", softmax_unsupported(input, dim, out, log),
      [&] { return softmax_kernels(input, dim, out, log); },
      [&] { return log ? at::log_softmax(self, dim, dtype) : at::softmax(self, dim, dtype); });
}

}  // namespace

at::Tensor softmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return softmax_common(self, dim, dtype, false);
}

at::Tensor log_softmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return softmax_common(self, dim, dtype, true);
}

}  // namespace mps_ext::ops
