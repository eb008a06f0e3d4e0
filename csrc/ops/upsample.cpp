// Interpolation: validation, the dimensions and scales the kernels see,
// launch geometry, for both backends. The kernels are in
// metal/upsample.metal.
#include "ops/upsample.h"

#include <ATen/ATen.h>
#include <ATen/ops/_upsample_nearest_exact1d_backward_meta_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact1d_meta_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact2d_backward_meta_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact2d_meta_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact3d_backward_meta_dispatch.h>
#include <ATen/ops/_upsample_nearest_exact3d_meta_dispatch.h>
#include <ATen/ops/upsample_bicubic2d_backward_meta_dispatch.h>
#include <ATen/ops/upsample_bicubic2d_meta_dispatch.h>
#include <ATen/ops/upsample_bilinear2d_backward_meta_dispatch.h>
#include <ATen/ops/upsample_bilinear2d_meta_dispatch.h>
#include <ATen/ops/upsample_linear1d_backward_meta_dispatch.h>
#include <ATen/ops/upsample_linear1d_meta_dispatch.h>
#include <ATen/ops/upsample_nearest1d_backward_meta_dispatch.h>
#include <ATen/ops/upsample_nearest1d_meta_dispatch.h>
#include <ATen/ops/upsample_nearest2d_backward_meta_dispatch.h>
#include <ATen/ops/upsample_nearest2d_meta_dispatch.h>
#include <ATen/ops/upsample_nearest3d_backward_meta_dispatch.h>
#include <ATen/ops/upsample_nearest3d_meta_dispatch.h>
#include <ATen/ops/upsample_trilinear3d_backward_meta_dispatch.h>
#include <ATen/ops/upsample_trilinear3d_meta_dispatch.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>

#include "backend.h"
#include "ops/naming.h"
#include "ops/plan_helpers.h"

namespace mps_ext::ops {

namespace {

constexpr uint32_t kUpsampleThreadsPerGroup = 256;
// Along interpolated dimensions: below 2^23, (o + 0.5) is exact in float, and
// torch's two nearest-exact kernels (generic and channels-last) agree.
constexpr int64_t kUpsampleMaxInterpolatedSize = int64_t(1) << 23;
constexpr int64_t kUpsampleMaxSize = std::numeric_limits<int32_t>::max();

bool upsample_nearest(UpsampleMode mode) { return mode == kUpsampleNearest || mode == kUpsampleNearestExact; }

const char* upsample_mode_name(UpsampleMode mode) {
  return mode == kUpsampleNearest ? "nearest" : mode == kUpsampleNearestExact ? "nearest_exact"
                                              : mode == kUpsampleLinear ? "linear" : "cubic";
}

// torch's result of the call on the meta device: its shape and layout (the
// structured kernels' meta function, which their CPU and MPS kernels share),
// or nullopt where torch raises.
std::optional<at::Tensor> upsample_torch_output(const at::Tensor& self, UpsampleOp op, const UpsampleArgs& a) {
  const at::Tensor m = meta_view(self);
  const c10::IntArrayRef size = a.output_size;
  const auto& [s0, s1, s2] = a.scales;
  try {
    switch (op.mode) {
      case kUpsampleNearest:
        return op.dims == 1 ? at::meta::upsample_nearest1d(m, size, s0)
               : op.dims == 2 ? at::meta::upsample_nearest2d(m, size, s0, s1)
                              : at::meta::upsample_nearest3d(m, size, s0, s1, s2);
      case kUpsampleNearestExact:
        return op.dims == 1 ? at::meta::_upsample_nearest_exact1d(m, size, s0)
               : op.dims == 2 ? at::meta::_upsample_nearest_exact2d(m, size, s0, s1)
                              : at::meta::_upsample_nearest_exact3d(m, size, s0, s1, s2);
      case kUpsampleLinear:
        return op.dims == 1 ? at::meta::upsample_linear1d(m, size, a.align_corners, s0)
               : op.dims == 2 ? at::meta::upsample_bilinear2d(m, size, a.align_corners, s0, s1)
                              : at::meta::upsample_trilinear3d(m, size, a.align_corners, s0, s1, s2);
      case kUpsampleCubic:
        return at::meta::upsample_bicubic2d(m, size, a.align_corners, s0, s1);
    }
  } catch (const c10::Error&) {
  }
  return std::nullopt;
}

std::optional<at::Tensor> upsample_torch_grad_input(const at::Tensor& grad_output, c10::IntArrayRef input_size,
                                                    UpsampleOp op, const UpsampleArgs& a) {
  const at::Tensor m = meta_view(grad_output);
  const c10::IntArrayRef size = a.output_size;
  const auto& [s0, s1, s2] = a.scales;
  try {
    switch (op.mode) {
      case kUpsampleNearest:
        return op.dims == 1 ? at::meta::upsample_nearest1d_backward(m, size, input_size, s0)
               : op.dims == 2 ? at::meta::upsample_nearest2d_backward(m, size, input_size, s0, s1)
                              : at::meta::upsample_nearest3d_backward(m, size, input_size, s0, s1, s2);
      case kUpsampleNearestExact:
        return op.dims == 1 ? at::meta::_upsample_nearest_exact1d_backward(m, size, input_size, s0)
               : op.dims == 2 ? at::meta::_upsample_nearest_exact2d_backward(m, size, input_size, s0, s1)
                              : at::meta::_upsample_nearest_exact3d_backward(m, size, input_size, s0, s1, s2);
      case kUpsampleLinear:
        return op.dims == 1   ? at::meta::upsample_linear1d_backward(m, size, input_size, a.align_corners, s0)
               : op.dims == 2 ? at::meta::upsample_bilinear2d_backward(m, size, input_size, a.align_corners, s0, s1)
                              : at::meta::upsample_trilinear3d_backward(m, size, input_size, a.align_corners, s0,
                                                                        s1, s2);
      case kUpsampleCubic:
        return at::meta::upsample_bicubic2d_backward(m, size, input_size, a.align_corners, s0, s1);
    }
  } catch (const c10::Error&) {
  }
  return std::nullopt;
}

// The scale the kernels compute an interpolated dimension's source indices
// from, as torch's CPU kernels compute it in float: area_pixel_compute_scale
// (without align_corners compute_scales_value: the call's scale where it is
// given and positive, else in / out).
float upsample_scale(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  if (align_corners) return out > 1 ? float(in - 1) / float(out - 1) : 0.0f;
  return scale && *scale > 0 ? float(1.0 / *scale) : float(in) / float(out);
}

// Whether torch's CPU forward indexes a nearest call with nearest_idx or
// nearest_exact_idx (its channels-last kernel, which the 2-D ops also take
// for outputs of at most 128 rows and columns together) rather than with its
// generic kernel's helpers; every backward does.
bool upsample_forward_uses_nearest_idx(const at::Tensor& self, const at::Tensor& out, UpsampleOp op) {
  if (!upsample_nearest(op.mode) || op.dims == 1) return false;
  if (op.dims == 2)
    return (self.is_contiguous(at::MemoryFormat::ChannelsLast) && self.size(1) > 3) ||
           out.size(2) + out.size(3) <= 128;
  return self.is_contiguous(at::MemoryFormat::ChannelsLast3d) && self.size(1) > 3;
}

// The kernels' parameters: the op's input (`in`) and output (`out`) sizes,
// the strides of `src` (read) and `written`, or nullopt past the sizes the
// kernels index.
std::optional<UpsampleParams> upsample_params(c10::IntArrayRef in, c10::IntArrayRef out, const at::Tensor& src,
                                              const at::Tensor& written, UpsampleOp op, const UpsampleArgs& a,
                                              bool nearest_idx, bool forward) {
  const int64_t dims = op.dims;
  if (written.dim() != dims + 2 || in[0] > kUpsampleMaxSize || in[1] > kUpsampleMaxSize) return std::nullopt;
  if (written.numel() > int64_t(std::numeric_limits<uint32_t>::max()) - kUpsampleThreadsPerGroup) return std::nullopt;
  UpsampleParams p{};
  p.channels_inner = written.stride(1) < written.stride(dims + 1);
  p.repeat = kUpsampleRepeat;
  p.span = 1;
  if (forward && upsample_nearest(op.mode)) {
    // 16 bytes per thread along the written tensor's fastest dimension.
    const uint32_t per = 16 / uint32_t(written.element_size());
    p.repeat = p.channels_inner ? per : 1;
    p.span = p.channels_inner ? 1 : per;
  }
  const int64_t groups = ceil_div(written.size(1), int64_t(p.repeat));
  const int64_t spans = ceil_div(written.size(dims + 1), int64_t(p.span));
  int64_t threads = written.size(0) * groups * spans;
  for (int64_t d = 2; d < dims + 1; ++d) threads *= written.size(d);
  for (int64_t l = 0; l < dims; ++l) {
    const int64_t d = l + 2;
    if (in[d] > kUpsampleMaxInterpolatedSize || out[d] > kUpsampleMaxInterpolatedSize) return std::nullopt;
    p.src_stride[l] = uint64_t(src.stride(d));
    p.dst_stride[l] = uint32_t(written.stride(d));
    p.in_size[l] = uint32_t(in[d]);
    p.out_size[l] = uint32_t(out[d]);
    p.scale[l] = upsample_scale(in[d], out[d], a.align_corners, a.scales[l]);
  }
  p.batch_src_stride = uint64_t(src.stride(0));
  p.channel_src_stride = uint64_t(src.stride(1));
  p.batch_dst_stride = uint32_t(written.stride(0));
  p.channel_dst_stride = uint32_t(written.stride(1));
  p.channels = uint32_t(written.size(1));
  p.channel_groups = uint32_t(groups);
  p.spans = uint32_t(spans);
  p.align_corners = a.align_corners;
  p.nearest_idx = nearest_idx;
  p.threads = uint32_t(threads);
  return p;
}

// Whether every 16-byte run a nearest forward thread stores (and, along
// channels, loads) is aligned: the run's dimension dense, every other stride
// a multiple of the run, the tensors' starts aligned.
bool upsample_vectorized(const at::Tensor& src, const at::Tensor& out, const UpsampleParams& p) {
  const int64_t per = 16 / int64_t(out.element_size()), fastest = p.channels_inner ? 1 : out.dim() - 1;
  auto runs_aligned = [&](const at::Tensor& t) {
    if (t.stride(fastest) != 1 || !aligned16(t)) return false;
    for (int64_t d = 0; d < t.dim(); ++d)
      if (d != fastest && t.stride(d) % per != 0) return false;
    return true;
  };
  return out.size(fastest) % per == 0 && runs_aligned(out) && (!p.channels_inner || runs_aligned(src));
}

// The MSL type of a tensor's element size: nearest moves elements as their bytes.
const char* element_bytes_type(const at::Tensor& t) {
  const size_t es = t.element_size();
  return es == 1 ? "uchar" : es == 2 ? "ushort" : "uint";
}

// The repeat kernels' plan (metal/upsample.metal): where every interpolated dimension's output index o reads
// o >> k (torch's index arithmetic is exact there: the scale is 2^-k, or nearest_idx copies or halves), channels
// first double a row at most, a load is stored at most 64 times, and every 16-byte run stored (and its half or
// whole loaded) is aligned. Sets p's geometry to the input's positions and returns the kernel, else nullopt.
std::optional<std::string> upsample_repeat_plan(const at::Tensor& src, const at::Tensor& out, UpsampleOp op,
                                                UpsampleParams& p) {
  const int64_t dims = op.dims, es = int64_t(out.element_size()), per = 16 / es;
  uint32_t shifts[kUpsampleMaxInterpolated] = {}, copies_shift = 0;
  for (int64_t l = 0; l < dims; ++l) {
    const uint32_t in = p.in_size[l], factor = in ? p.out_size[l] / in : 0;
    if (factor == 0 || p.out_size[l] != factor * in || (factor & (factor - 1)) != 0) return std::nullopt;
    const bool halves = op.mode == kUpsampleNearest && p.nearest_idx && factor <= 2;
    if (!halves && p.scale[l] != 1.0f / float(factor)) return std::nullopt;
    while ((1u << shifts[l]) < factor) ++shifts[l];
    copies_shift += shifts[l];
  }
  const uint32_t row_shift = p.channels_inner ? 0 : shifts[dims - 1];
  if (row_shift > 1 || copies_shift - row_shift > 6) return std::nullopt;
  const bool pairs = row_shift == 1;
  const int64_t fastest = p.channels_inner ? 1 : dims + 1, loaded = pairs ? per / 2 : per;
  auto runs_aligned = [&](const at::Tensor& t, int64_t run) {
    if (t.stride(fastest) != 1 || t.size(fastest) % run != 0 || !aligned(t, uintptr_t(run * es))) return false;
    for (int64_t d = 0; d < t.dim(); ++d)
      if (d != fastest && t.size(d) > 1 && t.stride(d) % run != 0) return false;
    return true;
  };
  if (!runs_aligned(src, loaded) || !runs_aligned(out, per)) return std::nullopt;
  std::copy(std::begin(shifts), std::end(shifts), p.factor_shift);
  p.repeat = uint32_t(p.channels_inner ? per : 1);
  p.span = uint32_t(p.channels_inner ? 1 : loaded);
  p.channel_groups = uint32_t(src.size(1) / p.repeat);
  p.spans = uint32_t(src.size(dims + 1) / p.span);
  int64_t threads = src.size(0) * p.channel_groups * p.spans;
  for (int64_t d = 2; d < dims + 1; ++d) threads *= src.size(d);
  p.threads = uint32_t(threads);
  return std::string("upsample_repeat") + (pairs ? "_pairs_" : "_") + element_bytes_type(out) + "_" +
         std::to_string(dims) + "d";
}

// The forward kernel: nearest moves elements as their bytes (the MSL type of that size), linear and cubic
// compute in the tensor's type.
std::string upsample_forward_kernel(UpsampleMode mode, const at::Tensor& self, int64_t dims) {
  const char* type = upsample_nearest(mode) ? element_bytes_type(self) : metal_type(self.scalar_type());
  return std::string("upsample_") + upsample_mode_name(mode) + "_" + type + "_" + std::to_string(dims) + "d";
}

std::string upsample_backward_kernel(UpsampleMode mode, at::ScalarType t, int64_t dims) {
  return std::string("upsample_backward_") + upsample_mode_name(mode) + "_" + metal_type(t) + "_" +
         std::to_string(dims) + "d";
}

// The mode whose backward kernel computes a call's gradient: torch's bicubic
// backward copies the gradient where no interpolated size changes, whatever
// the scales (its forward interpolates them), as nearest_idx copies.
UpsampleMode upsample_backward_mode(UpsampleOp op, c10::IntArrayRef input_size, const UpsampleArgs& a) {
  const bool unchanged = input_size.size() == size_t(op.dims + 2) && input_size.slice(2).equals(a.output_size);
  return op.mode == kUpsampleCubic && unchanged ? kUpsampleNearest : op.mode;
}

void upsample_dispatch(const std::string& kernel, const at::Tensor& src, const at::Tensor& written,
                       const UpsampleParams& p) {
  dispatch(Launch{kernel, {}, {ceil_div(p.threads, kUpsampleThreadsPerGroup)}, {kUpsampleThreadsPerGroup}}
               .tensor(src)
               .tensor(written)
               .bytes(p));
}

const char* const kUpsampleTooLarge = "sizes past 2^23 along interpolated dimensions, 2^31 along others, or 2^32 "
                                      "elements";

}  // namespace

std::optional<std::string> upsample_unsupported(const at::Tensor& self, UpsampleOp op, const UpsampleArgs& args) {
  const at::ScalarType t = self.scalar_type();
  // torch's CPU nearest kernels also take uint8, and float64, whose source indices (and linear and cubic
  // weights) they compute in double: float64 is torch's.
  if (!float_type(t) && !(upsample_nearest(op.mode) && t == at::kByte))
    return std::string("dtype ") + c10::toString(t);
  const std::string kernel = upsample_forward_kernel(op.mode, self, op.dims);
  if (auto why = kernel_unsupported(self, kernel, kUpsampleThreadsPerGroup)) return why;
  const std::optional<at::Tensor> like = upsample_torch_output(self, op, args);
  if (!like) return std::string("invalid arguments");
  if (like->numel() == 0) return std::nullopt;  // nothing to launch
  if (!upsample_params(self.sizes(), like->sizes(), self, *like, op, args, false, true))
    return std::string(kUpsampleTooLarge);
  return std::nullopt;
}

at::Tensor upsample_kernels(const at::Tensor& self, UpsampleOp op, const UpsampleArgs& args) {
  const at::Tensor like = *upsample_torch_output(self, op, args);
  at::Tensor out = at::empty_strided(like.sizes(), like.strides(), self.options());
  if (out.numel() == 0) return out;
  UpsampleParams p = *upsample_params(self.sizes(), out.sizes(), self, out, op, args,
                                      upsample_forward_uses_nearest_idx(self, out, op), true);
  if (upsample_nearest(op.mode)) {
    if (const std::optional<std::string> kernel = upsample_repeat_plan(self, out, op, p)) {
      upsample_dispatch(*kernel, self, out, p);
      return out;
    }
    p.vectorized = upsample_vectorized(self, out, p);
  }
  upsample_dispatch(upsample_forward_kernel(op.mode, self, op.dims), self, out, p);
  return out;
}

std::optional<std::string> upsample_backward_unsupported(const at::Tensor& grad_output, c10::IntArrayRef input_size,
                                                         UpsampleOp op, const UpsampleArgs& args) {
  const at::ScalarType t = grad_output.scalar_type();
  if (!float_type(t)) return std::string("dtype ") + c10::toString(t);
  const std::string kernel = upsample_backward_kernel(upsample_backward_mode(op, input_size, args), t, op.dims);
  if (auto why = kernel_unsupported(grad_output, kernel, kUpsampleThreadsPerGroup)) return why;
  const std::optional<at::Tensor> like = upsample_torch_grad_input(grad_output, input_size, op, args);
  if (!like) return std::string("invalid arguments");
  if (like->numel() == 0) return std::nullopt;
  if (!upsample_params(input_size, grad_output.sizes(), grad_output, *like, op, args, true, false))
    return std::string(kUpsampleTooLarge);
  return std::nullopt;
}

at::Tensor upsample_backward_kernels(const at::Tensor& grad_output, c10::IntArrayRef input_size, UpsampleOp op,
                                     const UpsampleArgs& args) {
  const at::Tensor like = *upsample_torch_grad_input(grad_output, input_size, op, args);
  at::Tensor grad_input = at::empty_strided(like.sizes(), like.strides(), grad_output.options());
  if (grad_input.numel() == 0) return grad_input;
  const UpsampleParams p =
      *upsample_params(input_size, grad_output.sizes(), grad_output, grad_input, op, args, true, false);
  const UpsampleMode mode = upsample_backward_mode(op, input_size, args);
  upsample_dispatch(upsample_backward_kernel(mode, grad_output.scalar_type(), op.dims), grad_output, grad_input, p);
  return grad_input;
}

}  // namespace mps_ext::ops
