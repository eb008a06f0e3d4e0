// Padding: validation, the dimensions the kernels see, launch geometry, for
// both backends. The kernels are in metal/pad.metal.
#include "ops/pad.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "backend.h"
#include "ops/naming.h"
#include "ops/plan_helpers.h"

namespace mps_ext::ops {

namespace {

constexpr uint32_t kPadThreadsPerGroup = 256;
constexpr int64_t kPadMaxSize = std::numeric_limits<int32_t>::max();

const char* pad_mode_name(PadMode mode) {
  return mode == kPadConstant ? "constant" : mode == kPadReflect ? "reflect" : "replicate";
}

// The padded shape of `self`, and each dimension's padding before it (0 for
// those not padded), or nullopt where torch rejects the arguments.
struct PadShape {
  std::vector<int64_t> out, before;
};

std::optional<PadShape> pad_shape(const at::Tensor& self, c10::IntArrayRef pad, PadOp op) {
  const int64_t rank = self.dim(), padded = int64_t(pad.size()) / 2;
  if (pad.size() % 2 || padded > rank) return std::nullopt;
  if (op.mode != kPadConstant) {
    // torch's reflection_pad<N>d / replication_pad<N>d: N padded dimensions of an (N + 1)-D input, or an
    // (N + 2)-D batch of them (the batch may be empty, nothing else).
    if (padded != op.dims || (rank != op.dims + 1 && rank != op.dims + 2)) return std::nullopt;
    for (int64_t d = rank - op.dims - 1; d < rank; ++d)
      if (self.size(d) == 0) return std::nullopt;
  }
  PadShape s{std::vector<int64_t>(self.sizes().begin(), self.sizes().end()), std::vector<int64_t>(rank, 0)};
  for (int64_t k = 0; k < padded; ++k) {
    const int64_t d = rank - 1 - k, before = pad[2 * k], after = pad[2 * k + 1], in = self.size(d);
    const int64_t out = in + before + after;
    // constant_pad_nd crops before it pads: the input narrowed by the negative pads must exist.
    if (op.mode == kPadConstant ? out < 0 || in + std::min<int64_t>(before, 0) + std::min<int64_t>(after, 0) < 0
                                : out < 1)
      return std::nullopt;
    if (op.mode == kPadReflect && (before >= in || after >= in)) return std::nullopt;
    s.out[d] = out;
    s.before[d] = before;
  }
  return s;
}

// The output torch's CPU kernel makes: a crop alone (constant, no pad
// positive) is torch's narrow().clone(), laid out as the narrowed view; the
// rest follow the input's suggested memory format (channels-last stays so).
// On `device`: the meta device gives the layout without memory.
at::Tensor pad_output(const at::Tensor& self, const PadShape& s, PadOp op, c10::Device device) {
  bool crop_only = op.mode == kPadConstant;
  for (int64_t d = 0; d < self.dim(); ++d)
    crop_only = crop_only && s.before[d] <= 0 && s.out[d] - self.size(d) - s.before[d] <= 0;
  const at::TensorOptions options = self.options().device(device);
  if (crop_only) {
    at::Tensor view = meta_view(self);
    for (int64_t d = 0; d < self.dim(); ++d) view = view.narrow(d, -s.before[d], s.out[d]);
    return at::empty_strided(view.sizes(), at::empty_like(view).strides(), options);
  }
  return at::empty(s.out, options.memory_format(self.suggest_memory_format()));
}

// The kernels' dimensions: those of `written` (the output forward, the
// input's gradient backward) in its memory order, outermost first, without
// the ones of size 1 that are not padded, and with each run of unpadded
// dimensions that `src` also holds contiguously merged into one.
struct KernelDims {
  std::vector<int64_t> in, out, before, src_stride;
};

std::optional<KernelDims> kernel_dims(const at::Tensor& self, const PadShape& s, const at::Tensor& src,
                                      const at::Tensor& written) {
  const std::optional<std::vector<int64_t>> order = dense_order(written);
  if (!order) return std::nullopt;
  KernelDims k;
  for (int64_t d : *order) {
    const int64_t in = self.size(d), out = s.out[d], before = s.before[d];
    const bool unpadded = before == 0 && in == out;
    if (unpadded && in == 1) continue;
    const bool merges = unpadded && !k.in.empty() && k.before.back() == 0 && k.in.back() == k.out.back() &&
                        k.src_stride.back() == src.stride(d) * in;
    if (merges) {
      k.in.back() *= in;
      k.out.back() *= in;
      k.src_stride.back() = src.stride(d);
      continue;
    }
    k.in.push_back(in);
    k.out.push_back(out);
    k.before.push_back(before);
    k.src_stride.push_back(src.stride(d));
  }
  if (k.in.empty()) k = KernelDims{{1}, {1}, {0}, {1}};
  if (k.in.size() > kPadMaxDims) return std::nullopt;
  for (size_t d = 0; d < k.in.size(); ++d)
    if (k.in[d] > kPadMaxSize || k.out[d] > kPadMaxSize) return std::nullopt;
  return k;
}

PadParams params_of(const KernelDims& k) {
  PadParams p{};
  p.dims = uint32_t(k.in.size());
  for (size_t d = 0; d < k.in.size(); ++d) {
    p.src_stride[d] = uint64_t(k.src_stride[d]);
    p.in_size[d] = uint32_t(k.in[d]);
    p.out_size[d] = uint32_t(k.out[d]);
    p.before[d] = int32_t(k.before[d]);
  }
  return p;
}

// The kernels' threads (the 16-byte chunks of the written tensor, of `sizes`), or 0 past what a 32-bit grid, and
// the kernels' 32-bit row index, hold.
uint32_t chunk_threads(const std::vector<int64_t>& sizes, int64_t element_size) {
  const int64_t per = 16 / element_size;
  const int64_t numel = std::accumulate(sizes.begin(), sizes.end(), int64_t(1), std::multiplies<int64_t>());
  const int64_t threads = (numel + per - 1) / per, limit = int64_t(std::numeric_limits<uint32_t>::max());
  return threads > limit - kPadThreadsPerGroup || numel / sizes.back() > limit ? 0 : uint32_t(threads);
}

// A kernel's name for an element size: the MSL type of that size (the kernels move bytes).
std::string forward_kernel(PadMode mode, int64_t element_size) {
  const char* type = element_size == 1 ? "uchar" : element_size == 2 ? "ushort" : element_size == 4 ? "uint"
                     : element_size == 8 ? "ulong" : "uint4";
  return std::string("pad_") + pad_mode_name(mode) + "_" + type;
}

bool pads_dtype(at::ScalarType t, PadMode mode) {
  if (mode == kPadConstant) return true;
  // torch's CPU reflection and replication kernels: every type but bool, float8 and the unsigned ones past uint8.
  return t != at::kBool && !at::isFloat8Type(t) && t != at::kUInt16 && t != at::kUInt32 && t != at::kUInt64;
}

bool differentiates(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kComplexFloat;
}

}  // namespace

std::optional<std::string> pad_unsupported(const at::Tensor& self, c10::IntArrayRef pad, PadOp op) {
  const int64_t es = int64_t(self.element_size());
  if (auto why = kernel_unsupported(self, forward_kernel(op.mode, es), kPadThreadsPerGroup)) return why;
  if (es > 16 || 16 % es) return std::string("element size");
  if (!pads_dtype(self.scalar_type(), op.mode)) return std::string("dtype ") + c10::toString(self.scalar_type());
  const std::optional<PadShape> s = pad_shape(self, pad, op);
  if (!s) return std::string("invalid arguments");
  const at::Tensor like = pad_output(self, *s, op, at::kMeta);
  if (like.numel() == 0) return std::nullopt;  // nothing to launch
  const std::optional<KernelDims> k = kernel_dims(self, *s, self, like);
  if (!k) return std::string("more than ") + std::to_string(kPadMaxDims) + " dimensions or sizes past 2^31";
  if (!chunk_threads(k->out, es)) return std::string("more than 2^32 chunks");
  return std::nullopt;
}

at::Tensor pad_kernels(const at::Tensor& self, c10::IntArrayRef pad, PadOp op, const c10::Scalar& value) {
  const PadShape s = *pad_shape(self, pad, op);
  at::Tensor out = pad_output(self, s, op, self.device());
  // torch fills with the value as fill_ casts it (and raises where it does: 300 into uint8).
  const at::Tensor fill = at::empty({1}, self.options().device(at::kCPU)).fill_(value);
  if (out.numel() == 0) return out;
  const KernelDims k = *kernel_dims(self, s, self, out);
  PadParams p = params_of(k);
  std::memcpy(p.fill, fill.data_ptr(), size_t(fill.element_size()));
  const int64_t es = int64_t(self.element_size()), per = 16 / es;
  p.out_numel = uint64_t(out.numel());
  p.threads = chunk_threads(k.out, es);
  bool strides16 = k.src_stride.back() == 1;
  for (size_t d = 0; d + 1 < k.in.size(); ++d) strides16 = strides16 && k.src_stride[d] % per == 0;
  p.src_vectorized = self.numel() && strides16 && aligned16(self);
  p.out_vectorized = aligned16(out);
  // An empty input is never read (every output element is the fill): the output stands in for it.
  dispatch(Launch{forward_kernel(op.mode, es), {}, {ceil_div(p.threads, kPadThreadsPerGroup)}, {kPadThreadsPerGroup}}
               .tensor(self.numel() ? self : out)
               .tensor(out)
               .bytes(p));
  return out;
}

std::optional<std::string> pad_backward_unsupported(const at::Tensor& grad_output, const at::Tensor& self,
                                                    c10::IntArrayRef pad, PadOp op) {
  const at::ScalarType t = self.scalar_type();
  if (!differentiates(t)) return std::string("dtype ") + c10::toString(t);
  const std::string kernel = std::string("pad_backward_") + pad_mode_name(op.mode) + "_" + metal_type(t);
  if (auto why = kernel_unsupported(self, kernel, kPadThreadsPerGroup)) return why;
  if (grad_output.device() != self.device()) return std::string("tensors on different devices");
  if (grad_output.scalar_type() != t || grad_output.layout() != at::kStrided) return std::string("invalid arguments");
  const std::optional<PadShape> s = pad_shape(self, pad, op);
  if (!s || grad_output.sizes() != c10::IntArrayRef(s->out)) return std::string("invalid arguments");
  if (self.numel() == 0) return std::nullopt;  // nothing to launch
  if (!kernel_dims(self, *s, grad_output, at::empty_like(meta_view(self), self.suggest_memory_format())))
    return std::string("more than ") + std::to_string(kPadMaxDims) + " dimensions or sizes past 2^31";
  // The kernel's element indices are 32-bit.
  if (self.numel() > int64_t(std::numeric_limits<uint32_t>::max()) - 16) return std::string("more than 2^32 elements");
  return std::nullopt;
}

at::Tensor pad_backward_kernels(const at::Tensor& grad_output, const at::Tensor& self, c10::IntArrayRef pad,
                                PadOp op) {
  const PadShape s = *pad_shape(self, pad, op);
  at::Tensor grad_input = at::empty_like(self, self.suggest_memory_format());
  if (grad_input.numel() == 0) return grad_input;
  const KernelDims k = *kernel_dims(self, s, grad_output, grad_input);
  PadParams p = params_of(k);
  p.out_numel = uint64_t(grad_input.numel());
  p.threads = chunk_threads(k.in, int64_t(self.element_size()));
  p.src_vectorized = grad_output.numel() && k.src_stride.back() == 1 && aligned16(grad_output);
  p.out_vectorized = aligned16(grad_input);
  const std::string kernel =
      std::string("pad_backward_") + pad_mode_name(op.mode) + "_" + metal_type(self.scalar_type());
  dispatch(Launch{kernel, {}, {ceil_div(p.threads, kPadThreadsPerGroup)}, {kPadThreadsPerGroup}}
               .tensor(grad_output.numel() ? grad_output : grad_input)
               .tensor(grad_input)
               .bytes(p));
  return grad_input;
}

}  // namespace mps_ext::ops
