// softmax / log_softmax: validation, kernel choice and launch geometry, for
// both backends. The kernels are in metal/softmax.metal.
#include "ops/softmax.h"

#include <ATen/ATen.h>
#include <ATen/WrapDimUtils.h>

#include <algorithm>
#include <limits>

#include "backend.h"
#include "mps_ext/params.h"
#include "ops/naming.h"

namespace mps_ext::ops {

namespace {

// Rows up to this length stay in registers: 1024 threads x 4 elements.
constexpr int64_t kBlockCols = 4096;
// Longer rows: chunks of 256 threads x 8 elements, one threadgroup each.
constexpr uint32_t kSplitThreads = 256, kChunk = kSplitThreads * 8;
constexpr uint32_t kStridedThreads = 256;

uint32_t ceil_div(int64_t a, int64_t b) { return uint32_t((a + b - 1) / b); }

bool supported_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

}  // namespace

std::optional<std::string> softmax_unsupported(const at::Tensor& input, at::ScalarType out_dtype) {
  if (!input.device().is_cpu() && !input.device().is_mps()) return "device " + input.device().str();
  if (input.device().is_mps() && !metal_backend()) return "built without the Metal backend";
  if (!supported_dtype(input.scalar_type())) return std::string("dtype ") + c10::toString(input.scalar_type());
  if (out_dtype != input.scalar_type() && !(out_dtype == at::kFloat && input.scalar_type() != at::kFloat))
    return std::string("output dtype ") + c10::toString(out_dtype) + " from " + c10::toString(input.scalar_type());
  if (input.numel() > std::numeric_limits<int32_t>::max()) return "more than 2^31 elements";
  return std::nullopt;
}

at::Tensor softmax_kernels(const at::Tensor& self, int64_t dim, at::ScalarType out_dtype, bool log) {
  const int64_t d = c10::maybe_wrap_dim(dim, self.dim());
  const at::Tensor input = self.contiguous();
  at::Tensor out = at::empty(input.sizes(), input.options().dtype(out_dtype));
  if (input.numel() == 0) return out;

  const int64_t cols = input.dim() ? input.size(d) : 1;
  int64_t inner = 1;
  for (int64_t k = d + 1; k < input.dim(); ++k) inner *= input.size(k);
  const int64_t outer = input.numel() / (cols * inner);
  const char* op = log ? "log_softmax" : "softmax";
  const at::ScalarType in_dtype = input.scalar_type();

  SoftmaxParams p{};
  p.cols = uint32_t(cols);
  p.inner = uint32_t(inner);
  if (inner != 1) {
    p.rows = uint32_t(outer * inner);
    Launch l{host_name(op, "strided", {in_dtype, out_dtype}), {}, {ceil_div(p.rows, kStridedThreads)},
             {kStridedThreads}};
    dispatch(l.tensor(input).tensor(out).bytes(p));
    return out;
  }
  p.rows = uint32_t(outer);
  // 4-wide loads need rows that start 4-element aligned.
  p.vectorized = cols % 4 == 0 && input.storage_offset() % 4 == 0;
  if (cols <= kBlockCols) {
    const uint32_t threads = std::clamp<uint32_t>(ceil_div(ceil_div(cols, 4), 32) * 32, 32, 1024);
    Launch l{host_name(op, "block", {in_dtype, out_dtype}), {}, {p.rows}, {threads}};
    dispatch(l.tensor(input).tensor(out).bytes(p));
    return out;
  }
  p.chunk = kChunk;
  p.chunks = ceil_div(cols, kChunk);
  at::Tensor partials = at::empty({outer, int64_t(p.chunks), 2}, input.options().dtype(at::kFloat));
  Launch pass1{host_name("softmax", "partials", {in_dtype}), {}, {p.chunks, p.rows}, {kSplitThreads}};
  dispatch(pass1.tensor(input).tensor(partials).bytes(p));
  Launch pass2{host_name(op, "finalize", {in_dtype, out_dtype}), {}, {p.chunks, p.rows}, {kSplitThreads}};
  dispatch(pass2.tensor(input).tensor(partials).tensor(out).bytes(p));
  return out;
}

namespace {

at::Tensor softmax_common(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype, bool log) {
  // torch casts to `dtype` first; half/bfloat16 to float happens in the kernel.
  at::Tensor input = self;
  at::ScalarType out = dtype.value_or(self.scalar_type());
  if (dtype && !(out == at::kFloat && (self.scalar_type() == at::kHalf || self.scalar_type() == at::kBFloat16)))
    input = self.to(out);
  if (softmax_unsupported(input, out)) return log ? at::log_softmax(self, dim, dtype) : at::softmax(self, dim, dtype);
  return softmax_kernels(input, dim, out, log);
}

}  // namespace

at::Tensor softmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return softmax_common(self, dim, dtype, false);
}

at::Tensor log_softmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return softmax_common(self, dim, dtype, true);
}

}  // namespace mps_ext::ops
