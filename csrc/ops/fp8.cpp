// FP8 (e4m3fn): quantize/dequantize, scaled_mm and fp8_linear: validation,
// kernel choice and launch geometry, for both backends. The kernels are in
// metal/fp8.metal.
#include "ops/fp8.h"

#include <ATen/ATen.h>
#include <ATen/ops/_scaled_mm_cpu_dispatch.h>
#include <torch/library.h>
#include <torch/version.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "backend.h"
#include "overrides/overrides.h"
#include "mps_ext/params.h"
#include "ops/gemv.h"
#include "ops/naming.h"
#include "ops/plan_helpers.h"

namespace mps_ext::ops {

namespace {

constexpr uint32_t kAmaxThreads = 256, kTileThreads = 128, kTile = 32;
constexpr int64_t kAmaxElementsPerGroup = 16384;  // what one amax threadgroup reduces at most
constexpr int64_t kMaxU32 = std::numeric_limits<uint32_t>::max();

// Rows of w per SIMD group of fp8_gemv, and K per step of one (32 lanes x 16
// bytes x fp8_chunks_per_lane): fp8_rows_per_simdgroup and
// fp8_chunks_per_lane in metal/fp8.metal.
int64_t gemv_rows_per_simdgroup(int64_t m) { return m <= 1 ? 1 : m <= 2 ? 4 : 2; }
int64_t gemv_step(int64_t m) { return 512 * (m <= 1 ? 2 : 1); }

bool fp8_bits(const at::Tensor& t) { return t.scalar_type() == at::kFloat8_e4m3fn || t.scalar_type() == at::kByte; }
bool fp8_type(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2; }
bool fnuz_type(at::ScalarType t) { return t == at::kFloat8_e4m3fnuz || t == at::kFloat8_e5m2fnuz; }

void check_fp8(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK_TYPE(fp8_bits(t), op, ": ", arg, " must be float8_e4m3fn (or uint8 holding e4m3fn bits), got ",
                   t.scalar_type());
}

void check_backend(const char* op, const c10::Device& device, const std::string& kernel, uint32_t threads) {
  std::string why;
  Backend* backend = backend_for(device, &why);
  TORCH_CHECK(backend, op, ": ", why);
  const auto reason = backend->unavailable(kernel, threads);
  TORCH_CHECK(!reason, op, ": kernel ", kernel, " cannot run: ", *reason);
}

Fp8BlockParams block_params(const at::Tensor& t, int64_t block_rows, int64_t block_cols) {
  Fp8BlockParams p{};
  p.rows = uint32_t(t.size(0));
  p.cols = uint32_t(t.size(1));
  p.block_rows = uint32_t(std::min<int64_t>(block_rows, std::max<int64_t>(t.size(0), 1)));
  p.block_cols = uint32_t(std::min<int64_t>(block_cols, std::max<int64_t>(t.size(1), 1)));
  p.scale_cols = ceil_div(p.cols, p.block_cols);
  return p;
}

void check_blocks(const char* op, const at::Tensor& t, int64_t block_rows, int64_t block_cols) {
  TORCH_CHECK_VALUE(t.dim() == 2, op, ": expected a 2-D tensor, got ", t.dim(), "-D");
  TORCH_CHECK_VALUE(block_rows > 0 && block_cols > 0, op, ": block sizes must be positive, got (", block_rows, ", ",
                    block_cols, ")");
  TORCH_CHECK(t.numel() <= std::numeric_limits<int32_t>::max(), op, ": more than 2^31 elements");
}

}  // namespace

at::ScalarType fp8_storage_dtype(const c10::Device& device) {
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 15
  if (device.is_mps()) return at::kByte;
#endif
  (void)device;
  return at::kFloat8_e4m3fn;
}

std::pair<int64_t, int64_t> fp8_block_size(const char* op, at::IntArrayRef block_size) {
  TORCH_CHECK_VALUE(block_size.size() == 2 && block_size[0] > 0 && block_size[1] > 0, op,
                    ": block_size must be two positive ints (block_n, block_k), got ", block_size);
  return {block_size[0], block_size[1]};
}

// ------------------------------------------------------------------ quantize

std::tuple<at::Tensor, at::Tensor> fp8_quantize(const at::Tensor& x, int64_t block_rows, int64_t block_cols) {
  const char* op = "fp8.quantize";
  check_blocks(op, x, block_rows, block_cols);
  TORCH_CHECK_TYPE(float_type(x.scalar_type()), op, ": x must be float32, float16 or bfloat16, got ", x.scalar_type());
  const at::Tensor input = x.contiguous();
  Fp8BlockParams p = block_params(input, block_rows, block_cols);
  const int64_t scale_rows = x.size(0) ? ceil_div(x.size(0), p.block_rows) : 0;
  at::Tensor q = at::empty(input.sizes(), input.options().dtype(fp8_storage_dtype(x.device())));
  at::Tensor scale = at::empty({scale_rows, x.size(1) ? int64_t(p.scale_cols) : 0}, input.options().dtype(at::kFloat));
  if (input.numel() == 0) return {q, scale};
  const std::string amax_kernel = host_name("fp8", "amax", {x.scalar_type()});
  const std::string quantize_kernel = host_name("fp8", "quantize", {x.scalar_type()});
  check_backend(op, x.device(), amax_kernel, kAmaxThreads);
  check_backend(op, x.device(), quantize_kernel, 256);
  const int64_t width = std::min<int64_t>(p.block_cols, p.cols);
  p.rows_per_group = uint32_t(std::clamp<int64_t>(kAmaxElementsPerGroup / width, 1, p.block_rows));
  const at::Tensor amax = at::zeros({scale.numel()}, input.options().dtype(at::kInt));
  dispatch(Launch{amax_kernel, {}, {p.scale_cols, uint32_t(scale_rows), ceil_div(p.block_rows, p.rows_per_group)},
                  {kAmaxThreads}}
               .tensor(input)
               .tensor(amax)
               .bytes(p));
  dispatch(Launch{quantize_kernel, {}, {ceil_div(p.cols, 64), ceil_div(p.rows, 4)}, {64, 4}}
               .tensor(input)
               .tensor(amax)
               .tensor(bytes_of(q))
               .tensor(scale)
               .bytes(p));
  return {q, scale};
}

at::Tensor fp8_dequantize(const at::Tensor& q, const at::Tensor& scale, int64_t block_rows, int64_t block_cols,
                          at::ScalarType dtype) {
  const char* op = "fp8.dequantize";
  check_blocks(op, q, block_rows, block_cols);
  check_fp8(q, op, "q");
  TORCH_CHECK_TYPE(float_type(dtype), op, ": dtype must be float32, float16 or bfloat16, got ", dtype);
  TORCH_CHECK_TYPE(float_type(scale.scalar_type()), op, ": scale must be a float tensor, got ", scale.scalar_type());
  const Fp8BlockParams p = block_params(q, block_rows, block_cols);
  const int64_t scale_rows = q.size(0) ? ceil_div(q.size(0), p.block_rows) : 0;
  // The exact grid: a transposed grid has the right count but scales the wrong blocks.
  const int64_t scale_cols = q.size(1) ? p.scale_cols : 0;
  TORCH_CHECK_VALUE(scale.dim() == 2 && scale.size(0) == scale_rows && scale.size(1) == scale_cols, op,
                    ": scale must have shape (", scale_rows, ", ", scale_cols, ") for q of shape ", q.sizes(),
                    " and blocks of (", block_rows, ", ", block_cols, "), got ", scale.sizes());
  TORCH_CHECK(scale.device() == q.device(), op, ": scale is on ", scale.device(), ", q on ", q.device());
  at::Tensor out = at::empty(q.sizes(), q.options().dtype(dtype));
  if (q.numel() == 0) return out;
  const std::string kernel = host_name("fp8", "dequantize", {dtype});
  check_backend(op, q.device(), kernel, 256);
  dispatch(Launch{kernel, {}, {ceil_div(p.cols, 64), ceil_div(p.rows, 4)}, {64, 4}}
               .tensor(bytes_of(q.contiguous()))
               .tensor(scale.to(at::kFloat).contiguous())
               .tensor(out)
               .bytes(p));
  return out;
}

// -------------------------------------------------------------------- matmul

namespace {

// out = a @ w^T with w (n x k) e4m3fn bytes (row stride w.stride(0)), scales
// of w per (block_n x block_k) block (w_scale: ceil(n/block_n) x
// ceil(k/block_k) floats, contiguous), optional a scales (fp8 a) and float bias.
void run_matmul(const char* op, const at::Tensor& a, const at::Tensor& w, const std::optional<at::Tensor>& a_scale,
                const at::Tensor& w_scale, int64_t block_n, int64_t block_k, const std::optional<at::Tensor>& bias,
                at::Tensor& out) {
  const int64_t m = a.size(0), n = w.size(0), k = w.size(1);
  TORCH_CHECK(m <= kMaxU32 && n <= kMaxU32 && k <= kMaxU32, op, ": sizes beyond 2^32");
  Fp8MatmulParams p{};
  p.m = uint32_t(m);
  p.n = uint32_t(n);
  p.k = uint32_t(k);
  p.a_stride = uint64_t(a.stride(0));
  p.w_stride = uint64_t(w.stride(0));
  p.out_stride = uint64_t(out.stride(0));
  p.has_a_scale = a_scale.has_value();
  p.a_scale_stride = a_scale && a_scale->numel() > 1 ? 1 : 0;
  p.block_n = uint32_t(std::min(block_n, n));
  p.block_k = uint32_t(std::min(block_k, k));
  p.scale_cols = ceil_div(k, p.block_k);
  p.scale_in_epilogue = block_k >= k;
  p.has_bias = bias.has_value();
  const int64_t a_size = a.element_size();
  p.a_vectorized = (a.stride(0) * a_size) % 16 == 0 && (a.storage_offset() * a_size) % 16 == 0;
  p.w_vectorized = w.stride(0) % 16 == 0 && w.storage_offset() % 16 == 0;
  p.a_e5m2 = a.scalar_type() == at::kFloat8_e5m2;
  p.w_e5m2 = w.scalar_type() == at::kFloat8_e5m2;

  const bool few_rows = m <= kGemvMaxRows && (p.scale_in_epilogue || p.block_k % 16 == 0);
  const bool fp8_a = fp8_bits(a) || a.scalar_type() == at::kFloat8_e5m2;
  const auto kernel_of = [&](const std::string& variant) {
    return fp8_a ? host_name("scaled_mm", variant.c_str(), {at::kFloat8_e4m3fn, out.scalar_type()})
                 : host_name("fp8_linear", variant.c_str(), {a.scalar_type()});
  };
  std::string why;
  Backend* backend = backend_for(a.device(), &why);
  TORCH_CHECK(backend, op, ": ", why);
  std::string kernel = kernel_of("tiled");
  Size3 grid{ceil_div(n, kTile), ceil_div(m, kTile)}, threads{kTileThreads};
  p.gemv_slices = 1;
  // One row of a streams w past it where a threadgroup can hold a SIMD group per chunk of K.
  const Size3 stream_threads{uint32_t(32 * gemv_stream_slices(k))};
  if (few_rows && m <= 1 && gemv_streams(k) && !backend->unavailable(kernel_of("gemv_stream"), stream_threads.x)) {
    kernel = kernel_of("gemv_stream");
    threads = stream_threads;
    p.stream_rows = uint32_t(gemv_stream_rows(n, k, threads.x / 32, backend->fill_simdgroups(kernel, threads.x)));
    grid = Size3{ceil_div(n, p.stream_rows)};
  } else if (few_rows) {
    // The gemv kernels are built for 1, 2, 4 or 8 rows of a (mps_ext/gemv.h).
    kernel = kernel_of("gemv_m" + std::to_string(m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8));
    const GemvGeometry g =
        gemv_geometry(n, (k + gemv_step(m) - 1) / gemv_step(m), gemv_rows_per_simdgroup(m), *backend, kernel);
    p.gemv_slices = uint32_t(g.slices);
    grid = g.grid;
    threads = g.threads;
  }
  check_backend(op, a.device(), kernel, threads.x);
  dispatch(Launch{kernel, {}, grid, threads}
               .tensor(fp8_a ? bytes_of(a) : a)
               .tensor(bytes_of(w))
               .tensor(a_scale ? *a_scale : w_scale)  // not read without a scales
               .tensor(w_scale)
               .tensor(bias ? *bias : w_scale)  // not read without a bias
               .tensor(out)
               .bytes(p));
}

// A 2-D tensor whose rows are contiguous (stride(1) == 1), copied if not.
at::Tensor rows_contiguous(const at::Tensor& t) {
  return t.stride(1) == 1 && t.stride(0) >= std::max<int64_t>(t.size(1), 1) ? t : t.contiguous();
}

}  // namespace

std::optional<std::string> scaled_mm_unsupported(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                                                 const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                                                 at::ScalarType out, bool bits_ok,
                                                 const std::optional<at::Tensor>& scale_result) {
  if (a.dim() != 2 || b.dim() != 2) return "a and b must be matrices";
  if (a.size(1) != b.size(0)) return "a and b shapes cannot be multiplied";
  const auto fp8 = [&](const at::Tensor& t) {
    return fp8_type(t.scalar_type()) || (bits_ok && t.scalar_type() == at::kByte);
  };
  if (!fp8(a) || !fp8(b)) {
    const bool fnuz = fnuz_type(a.scalar_type()) || fnuz_type(b.scalar_type());
    return std::string("dtypes ") + c10::toString(a.scalar_type()) + " x " + c10::toString(b.scalar_type()) +
           (fnuz ? " (the fnuz formats are not implemented)" : "");
  }
  if (scale_a.scalar_type() != at::kFloat || scale_b.scalar_type() != at::kFloat) return "scales must be float32";
  const bool tensorwise = scale_a.numel() == 1 && scale_b.numel() == 1;
  const bool rowwise = scale_a.dim() == 2 && scale_a.size(0) == a.size(0) && scale_a.size(1) == 1 &&
                       scale_a.is_contiguous() && scale_b.dim() == 2 && scale_b.size(0) == 1 &&
                       scale_b.size(1) == b.size(1) && scale_b.is_contiguous();
  if (!tensorwise && !rowwise) return "scaling recipe (only tensor-wise or row-wise for both)";
  if (bias && bias->numel() != b.size(1)) return "bias size";
  if (!float_type(out) && !fp8_type(out))
    return std::string("output dtype ") + c10::toString(out) +
           (fnuz_type(out) ? " (the fnuz formats are not implemented)" : "");
  if (out == at::kFloat8_e5m2 && fp8_storage_dtype(a.device()) != at::kFloat8_e4m3fn)
    return "float8_e5m2 outputs on this device (torch cannot hold float8 there)";
  if (fp8_type(out) && scale_result && (scale_result->numel() != 1 || scale_result->device() != a.device()))
    return "scale_result (one value on the operands' device)";
  for (const at::Tensor* t : {&a, &b, &scale_a, &scale_b})
    if (t->device() != a.device()) return "tensors on different devices";
  if (bias && bias->device() != a.device()) return "tensors on different devices";
  std::string why;
  Backend* backend = backend_for(a.device(), &why);
  if (!backend) return why;
  return std::nullopt;
}

namespace {

// torch._scaled_mm's float8 output of a float result x: x * (1 / scale_result), converted as torch converts
// (e4m3fn in fp8_storage_dtype: uint8 bits where the device holds no float8).
at::Tensor encode_fp8(const at::Tensor& x, at::ScalarType out, const std::optional<at::Tensor>& scale_result) {
  const at::ScalarType dtype = out == at::kFloat8_e4m3fn ? fp8_storage_dtype(x.device()) : out;
  at::Tensor result = at::empty(x.sizes(), x.options().dtype(dtype));
  if (x.numel() == 0) return result;
  const std::string kernel = host_name("scaled_mm", "encode", {out});
  check_backend("scaled_mm", x.device(), kernel, 256);
  Fp8BlockParams p{};
  p.rows = uint32_t(x.size(0));
  p.cols = uint32_t(x.size(1));
  const at::Tensor scale = scale_result ? scale_result->to(at::kFloat).reshape({1}).contiguous()
                                        : at::ones({1}, x.options().dtype(at::kFloat));
  dispatch(Launch{kernel, {}, {ceil_div(p.cols, 64), ceil_div(p.rows, 4)}, {64, 4}}
               .tensor(x)
               .tensor(scale)
               .tensor(bytes_of(result))
               .bytes(p));
  return result;
}

}  // namespace

at::Tensor scaled_mm_kernels(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                             const at::Tensor& scale_b, const std::optional<at::Tensor>& bias, at::ScalarType out,
                             const std::optional<at::Tensor>& scale_result) {
  // A float8 output is the float32 result, then converted as torch converts it.
  if (fp8_type(out)) return encode_fp8(scaled_mm_kernels(a, b, scale_a, scale_b, bias, at::kFloat), out, scale_result);
  at::Tensor result = at::empty({a.size(0), b.size(1)}, a.options().dtype(out));
  if (result.numel() == 0) return result;
  if (a.size(1) == 0) {  // no products: bias or zeros
    result.zero_();
    return bias ? result.add_(*bias) : result;
  }
  // b (k x n) column-major is w = b^T (n x k) row-major: the layout of a Linear weight.
  const at::Tensor w = rows_contiguous(b.t());
  const std::optional<at::Tensor> bias_f = bias ? std::optional<at::Tensor>(bias->to(at::kFloat).contiguous().view(-1))
                                                : std::nullopt;
  const at::Tensor w_scale = scale_b.contiguous().view({scale_b.numel() == 1 ? 1 : b.size(1), 1});
  run_matmul("scaled_mm", rows_contiguous(a), w, scale_a.contiguous(), w_scale, scale_b.numel() == 1 ? b.size(1) : 1,
             a.size(1), bias_f, result);
  return result;
}

at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a, const at::Tensor& scale_b,
                     const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> out_dtype,
                     const std::optional<at::Tensor>& scale_result) {
  const at::ScalarType out = out_dtype.value_or(at::kBFloat16);
  const auto why = scaled_mm_unsupported(a, b, scale_a, scale_b, bias, out, true, scale_result);
  const auto as_fp8 = [](const at::Tensor& t) { return t.scalar_type() == at::kByte ? t.view(at::kFloat8_e4m3fn) : t; };
  if (!why || a.device().is_cpu())
    return overrides::counted(
        "mps_ext::scaled_mm", why, [&] { return scaled_mm_kernels(a, b, scale_a, scale_b, bias, out, scale_result); },
        [&] { return at::cpu::_scaled_mm(as_fp8(a), as_fp8(b), scale_a, scale_b, bias, scale_result, out); });
  // No torch kernel to hand this to: torch's error types (shapes, recipes) or not implemented.
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "scaled_mm: a and b must be matrices that can "
              "be multiplied, got ", a.sizes(), " and ", b.sizes());
  TORCH_CHECK_VALUE(*why != "scales must be float32" && why->rfind("scaling recipe", 0) != 0,
                    "scaled_mm: invalid scaling configuration: ", *why, " (scale_a ", scale_a.sizes(), " ",
                    scale_a.scalar_type(), ", scale_b ", scale_b.sizes(), " ", scale_b.scalar_type(), ")");
  TORCH_CHECK_NOT_IMPLEMENTED(false, "scaled_mm on ", a.device(), ": ", *why);
}

// ---------------------------------------------------------------- fp8_linear

at::Tensor fp8_linear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& weight_scale,
                      const std::optional<at::Tensor>& bias, at::OptionalIntArrayRef block_size) {
  const char* op = "fp8_linear";
  TORCH_CHECK_TYPE(float_type(input.scalar_type()), op, ": input must be float32, float16 or bfloat16, got ",
                   input.scalar_type());
  check_fp8(weight, op, "weight");
  TORCH_CHECK_VALUE(weight.dim() == 2, op, ": weight must be 2-D (out_features, in_features), got ", weight.sizes());
  TORCH_CHECK_VALUE(input.dim() >= 1, op, ": input must have at least one dimension");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(input.size(-1) == k, op, ": input's last dimension (", input.size(-1),
              ") must equal weight's in_features (", k, ")");
  TORCH_CHECK_TYPE(float_type(weight_scale.scalar_type()) || at::isFloat8Type(weight_scale.scalar_type()), op,
                   ": weight_scale must be a float tensor, got ", weight_scale.scalar_type());
  int64_t block_n = n, block_k = k;
  if (block_size) {
    std::tie(block_n, block_k) = fp8_block_size(op, *block_size);
    const int64_t rows = (n + block_n - 1) / block_n, cols = (k + block_k - 1) / block_k;
    TORCH_CHECK_VALUE(weight_scale.dim() == 2 && weight_scale.size(0) == rows && weight_scale.size(1) == cols, op,
                      ": weight_scale must have shape (", rows, ", ", cols, ") for block_size ", *block_size,
                      ", got ", weight_scale.sizes());
  } else if (weight_scale.numel() != 1) {
    const bool per_row = (weight_scale.dim() == 1 && weight_scale.size(0) == n) ||
                         (weight_scale.dim() == 2 && weight_scale.size(0) == n && weight_scale.size(1) == 1);
    TORCH_CHECK_VALUE(per_row, op, ": weight_scale must have shape (), (", n, ",) or (", n,
                      ", 1) without block_size, got ", weight_scale.sizes());
    block_n = 1;
  }
  if (bias)
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == n, op, ": bias must have shape (", n, ",), got ",
                      bias->sizes());
  for (const at::Tensor* t : {&weight, &weight_scale})
    TORCH_CHECK(t->device() == input.device(), op, ": all tensors must be on ", input.device(), ", got one on ",
                t->device());
  TORCH_CHECK(!bias || bias->device() == input.device(), op, ": bias is on ", bias->device());

  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().end());
  shape.back() = n;
  const at::Tensor a = input.reshape({c10::multiply_integers(shape.begin(), shape.end() - 1), k});
  at::Tensor out = at::empty({a.size(0), n}, input.options());
  if (out.numel() == 0) return out.view(shape);
  if (k == 0) {
    out.zero_();
    if (bias) out.add_(*bias);
    return out.view(shape);
  }
  const at::Tensor scales = weight_scale.to(at::kFloat).contiguous().view({(n + block_n - 1) / block_n, -1});
  const std::optional<at::Tensor> bias_f = bias ? std::optional<at::Tensor>(bias->to(at::kFloat).contiguous())
                                                : std::nullopt;
  run_matmul(op, rows_contiguous(a), rows_contiguous(weight), std::nullopt, scales, block_n, block_k, bias_f, out);
  return out.view(shape);
}

}  // namespace mps_ext::ops

TORCH_LIBRARY_FRAGMENT(mps_ext, m) {
  m.def("fp8_quantize(Tensor x, int block_rows, int block_cols) -> (Tensor, Tensor)");
  m.def("fp8_dequantize(Tensor q, Tensor scale, int block_rows, int block_cols, ScalarType dtype) -> Tensor");
  m.def("scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias=None, "
        "ScalarType? out_dtype=None, Tensor? scale_result=None) -> Tensor");
  m.def("fp8_linear(Tensor input, Tensor weight, Tensor weight_scale, Tensor? bias=None, "
        "int[]? block_size=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(mps_ext, CPU, m) {
  m.impl("fp8_quantize", TORCH_FN(mps_ext::ops::fp8_quantize));
  m.impl("fp8_dequantize", TORCH_FN(mps_ext::ops::fp8_dequantize));
  m.impl("scaled_mm", TORCH_FN(mps_ext::ops::scaled_mm));
  m.impl("fp8_linear", TORCH_FN(mps_ext::ops::fp8_linear));
}

TORCH_LIBRARY_IMPL(mps_ext, MPS, m) {
  m.impl("fp8_quantize", TORCH_FN(mps_ext::ops::fp8_quantize));
  m.impl("fp8_dequantize", TORCH_FN(mps_ext::ops::fp8_dequantize));
  m.impl("scaled_mm", TORCH_FN(mps_ext::ops::scaled_mm));
  m.impl("fp8_linear", TORCH_FN(mps_ext::ops::fp8_linear));
}
