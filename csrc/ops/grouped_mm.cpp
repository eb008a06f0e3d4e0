// Grouped matrix multiply (torch._grouped_mm): validation, kernel choice and
// launch geometry, for both backends. The kernels are in
// metal/grouped_mm.metal. Nothing here reads offs: its values stay on the
// device, so a call is one dispatch sized for the worst case.
#include "ops/grouped_mm.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>
#include <tuple>
#include <vector>

#include "backend.h"
#include "overrides/overrides.h"
#include "mps_ext/params.h"
#include "ops/fp8.h"
#include "ops/gemv.h"
#include "ops/naming.h"
#include "ops/plan_helpers.h"

namespace mps_ext::ops {

namespace {

// The decode kernel: four SIMD groups, each on its weight rows (= output
// columns; rows_per_simdgroup), or runs of 2 or 4 of them on the same rows,
// splitting K.
constexpr int64_t kDecodeSimdGroups = 4;
// A slice of K gets at least this many steps (a step is 32 lanes' chunks).
constexpr int64_t kDecodeMinStepsPerSlice = 2;
// Up to this many rows per group on average, streaming each group's weights
// once per 8 rows beats tiles.
constexpr int64_t kDecodeMaxAverageRows = 8;
constexpr int64_t kTileColumns = 32;  // kTileN in mps_ext/mma.h
constexpr uint32_t kThreads = 128;

// torch's rule for a's and b's last two dimensions (GroupedMMUtils.h).
std::optional<std::string> torch_stride_rule(const at::Tensor& t) {
  const int64_t d = t.dim() - 1, alignment = 16 / int64_t(t.element_size());
  if (t.stride(d - 1) == 1 && t.stride(d) >= std::max<int64_t>(1, t.size(d - 1)))
    return t.stride(d) % alignment == 0 ? std::nullopt : std::optional<std::string>("strides should be multiple of 16 bytes");
  if (t.stride(d) == 1 && t.stride(d - 1) >= std::max<int64_t>(1, t.size(d)))
    return t.stride(d - 1) % alignment == 0 ? std::nullopt
                                            : std::optional<std::string>("strides should be multiple of 16 bytes");
  std::ostringstream s;
  s << "Invalid strides/sizes, got " << t.strides() << " for strides and " << t.sizes() << " for sizes";
  return s.str();
}

std::string dtype_name(const at::Tensor& t) { return c10::toString(t.scalar_type()); }

// The output's sizes and strides as torch allocates it: its last dimension
// padded to 16 bytes.
struct Layout {
  std::vector<int64_t> size, stride;
};

Layout output_layout(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs) {
  const bool a2 = a.dim() == 2, b2 = b.dim() == 2;
  Layout l;
  if (a2 && b2) l.size = {offs->size(0), a.size(0), b.size(1)};
  else if (a2) l.size = {a.size(0), b.size(-1)};
  else if (b2) l.size = {a.size(1), b.size(1)};
  else l.size = {a.size(0), a.size(1), b.size(-1)};
  const int64_t alignment = 16 / int64_t(a.element_size());
  const int64_t padded = (l.size.back() + alignment - 1) / alignment * alignment;
  l.stride = {padded, 1};
  if (l.size.size() == 3) l.stride.insert(l.stride.begin(), l.size[1] * padded);
  return l;
}

struct Problem {
  GroupedMmParams params{};
  int64_t groups = 0;
};

Problem problem_of(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs,
                   const Layout& out) {
  Problem pr;
  GroupedMmParams& q = pr.params;
  const bool a2 = a.dim() == 2, b2 = b.dim() == 2;
  q.split = a2 && b2 ? kGroupedSplitK : a2 ? kGroupedSplitRows : b2 ? kGroupedSplitCols : kGroupedSplitNone;
  pr.groups = offs ? offs->size(0) : a.size(0);
  q.groups = uint32_t(pr.groups);
  q.m = uint32_t(a.size(-2));
  q.k = uint32_t(a.size(-1));
  q.n = uint32_t(b.size(-1));
  q.a_group = a2 ? 0 : uint64_t(a.stride(0));
  q.a_row = uint64_t(a.stride(-2));
  q.a_k = uint64_t(a.stride(-1));
  q.b_group = b2 ? 0 : uint64_t(b.stride(0));
  q.b_k = uint64_t(b.stride(-2));
  q.b_col = uint64_t(b.stride(-1));
  q.out_group = out.stride.size() == 3 ? uint64_t(out.stride[0]) : 0;
  q.out_row = uint64_t(out.stride[out.stride.size() - 2]);
  const auto multiple16 = [](const at::Tensor& t, int64_t stride) { return stride * t.element_size() % 16 == 0; };
  q.a_vectorized = aligned16(a) && multiple16(a, q.a_row) && multiple16(a, q.a_group);
  // b's contiguous rows: of W_g (n x k) when b is the transposed weights, of the stored (k x n) matrix otherwise.
  q.b_vectorized = aligned16(b) && multiple16(b, q.b_k == 1 ? q.b_col : q.b_k) && multiple16(b, q.b_group);
  return pr;
}

struct GroupedPlan {
  std::string kernel;
  Size3 grid, threads;
  uint32_t decode_slices = 1;
  uint32_t decode_chunks = 4;
  uint32_t stream_rows = 0;
};

// Weight rows per SIMD group of the kernel for `bucket` rows
// (rows_per_simdgroup in mps_ext/gemv.h).
int64_t rows_per_simdgroup(int64_t bucket) { return bucket == 1 ? 1 : 2; }

// The rows of a group a decode threadgroup serves when split by rows: the
// host knows m but not offs, so as many as an active group (at most min(G, m)
// are) has on average, and at least two: an expert routed two rows reads its
// weights once for both, and runs of one row take the 2-row kernel's 1-row
// branch, which on the CUDA proxy beat the 1-row kernel at every token count
// (two weight rows per SIMD group; docs/performance.md).
int64_t decode_rows(int64_t m, int64_t g) {
  const int64_t active = std::max<int64_t>(1, std::min(g, m));
  return std::max<int64_t>(2, rows_bucket((m + active - 1) / active));
}

// Decode: a pipeline for decode_rows (not split: all m rows of each group),
// one threadgroup per row of a (only those starting a run of routed rows
// work) and 4 x rows_per_simdgroup / slices columns. K is split when the SIMD
// groups with work would not fill the GPU (Backend::fill_simdgroups). `op`
// names the kernel family (grouped_mm, or fp8_grouped_mm for e4m3fn weights);
// `per_lane` is the weights a lane reads per K-step (kGroupedDecodeChunks x 16
// bytes of b's type, or kFp8GroupedDecodeBytes e4m3fn bytes).
GroupedPlan decode_plan(const Problem& pr, const char* op, at::ScalarType dtype, int64_t per_lane, Backend& backend) {
  const GroupedMmParams& q = pr.params;
  const int64_t g = pr.groups, m = q.m, n = q.n;
  const bool by_rows = q.split == kGroupedSplitRows;
  const int64_t rows = by_rows ? decode_rows(m, g) : rows_bucket(m);
  const std::string kernel = host_name(op, ("decode_m" + std::to_string(rows)).c_str(), {dtype});
  const int64_t fill = backend.fill_simdgroups(kernel, kThreads);
  const int64_t runs = by_rows ? (m + rows - 1) / rows : g * ((m + rows - 1) / rows);
  const int64_t per_simdgroup = rows_per_simdgroup(rows);
  const int64_t blocks = (n + per_simdgroup - 1) / per_simdgroup;
  const int64_t per_step = 32 * per_lane;
  const int64_t steps = (q.k + per_step - 1) / per_step;
  int64_t slices = 1;
  while (slices < kDecodeSimdGroups && runs * blocks * slices < fill &&
         steps / (2 * slices) >= kDecodeMinStepsPerSlice)
    slices *= 2;
  const int64_t columns = per_simdgroup * kDecodeSimdGroups / slices;
  return {kernel,
          {uint32_t((n + columns - 1) / columns), uint32_t(by_rows ? m : runs)},
          {kThreads},
          uint32_t(slices)};
}

// Decode for b stored (G, K, N) with N contiguous: the rows decode_plan
// would serve, 4 chunks of 16 bytes of columns per threadgroup, or 2 (twice
// the threadgroups, each K-lane reading half as many weight rows) when the
// threadgroups' SIMD groups would not reach half the fill: on the CUDA proxy
// 2 chunks ran gpt-oss's down projection for one token 1.5x faster and its
// gate_up (twice the columns) 1.1x slower (docs/performance.md).
GroupedPlan decode_kn_plan(const Problem& pr, at::ScalarType dtype, Backend& backend) {
  const GroupedMmParams& q = pr.params;
  const bool by_rows = q.split == kGroupedSplitRows;
  const int64_t rows = by_rows ? decode_rows(q.m, pr.groups) : rows_bucket(q.m);
  const std::string kernel = host_name("grouped_mm", ("decode_kn_m" + std::to_string(rows)).c_str(), {dtype});
  const int64_t threadgroup_rows = by_rows ? q.m : pr.groups * ((q.m + rows - 1) / rows);
  const int64_t per_chunk = 16 / int64_t(c10::elementSize(dtype));
  const int64_t wide = (q.n + 4 * per_chunk - 1) / (4 * per_chunk) * threadgroup_rows * kDecodeSimdGroups;
  const int64_t chunks = 2 * wide < backend.fill_simdgroups(kernel, kThreads) ? 2 : 4, columns = chunks * per_chunk;
  GroupedPlan p{kernel,
         {uint32_t((q.n + columns - 1) / columns), uint32_t(threadgroup_rows)},
         {kThreads}};
  p.decode_chunks = uint32_t(chunks);
  return p;
}

// Whether a decode kernel serves the problem: a's rows contiguous and few
// rows per group on average (the host cannot see how many each has).
bool decodes(const Problem& pr) {
  const GroupedMmParams& q = pr.params;
  const int64_t average = q.split == kGroupedSplitRows ? q.m / std::max<int64_t>(pr.groups, 1) : q.m;
  return (q.split == kGroupedSplitRows || q.split == kGroupedSplitNone) && (q.a_k == 1 || q.k == 1) &&
         average <= kDecodeMaxAverageRows;
}

// Tiles as tall as the average group (`op`: grouped_mm, or fp8_grouped_mm
// for e4m3fn weights).
GroupedPlan tiled_plan(const Problem& pr, const char* op, at::ScalarType dtype) {
  const GroupedMmParams& q = pr.params;
  const int64_t g = pr.groups, m = q.m, n = q.n;
  const int64_t average = q.split == kGroupedSplitRows ? m / std::max<int64_t>(g, 1) : m;
  const int64_t tm = average <= 16 ? 16 : average <= 32 ? 32 : 64;
  int64_t x = (n + kTileColumns - 1) / kTileColumns, y = (m + tm - 1) / tm, z = 1;
  if (q.split == kGroupedSplitRows) y += g;       // worst case: every group ends in a partial tile
  else if (q.split == kGroupedSplitCols) x += g;
  else z = g;
  return {host_name(op, ("tiled_m" + std::to_string(tm)).c_str(), {dtype}),
          {uint32_t(x), uint32_t(y), uint32_t(z)},
          {kThreads}};
}

// Decode along K when the groups' weights are row-major (b the transposed
// expert weights), along N when b is stored (G, K, N); tiles otherwise.
GroupedPlan plan(const Problem& pr, at::ScalarType dtype, Backend& backend) {
  const GroupedMmParams& q = pr.params;
  if (decodes(pr)) {
    const int64_t per_lane = kGroupedDecodeChunks * 16 / int64_t(c10::elementSize(dtype));
    if (q.b_k == 1 || q.k == 1) return decode_plan(pr, "grouped_mm", dtype, per_lane, backend);
    if (q.b_col == 1) return decode_kn_plan(pr, dtype, backend);
  }
  return tiled_plan(pr, "grouped_mm", dtype);
}

}  // namespace

std::optional<std::string> grouped_mm_invalid(const at::Tensor& a, const at::Tensor& b,
                                              const std::optional<at::Tensor>& offs,
                                              const std::optional<at::Tensor>& bias,
                                              std::optional<at::ScalarType> out_dtype, bool torch_strides) {
  if (!float_type(a.scalar_type()))
    return "Expected a (mat_a) to be Float32, BFloat16 or Float16 matrix, got " + dtype_name(a);
  if (!float_type(b.scalar_type()))
    return "Expected b (mat_b) to be Float32, BFloat16 or Float16 matrix, got " + dtype_name(b);
  if (a.dim() != 2 && a.dim() != 3) return "a (mat_a) has to be 2 or 3d";
  if (b.dim() != 2 && b.dim() != 3) return "b (mat_b) has to be 2 or 3d";
  const bool a2 = a.dim() == 2, b2 = b.dim() == 2;
  // torch does not compare them for 2D x 2D (its per-group slices then fail or not); the kernels need it.
  if (a.size(-1) != b.size(-2)) return "contraction dimension of a (mat_a) and b (mat_b) must match";
  if (torch_strides) {
    if (auto why = torch_stride_rule(a)) return "a (mat_a): " + *why;
    if (auto why = torch_stride_rule(b)) return "b (mat_b): " + *why;
  }
  if (offs.has_value() != (a2 || b2))
    return "Have to provide offsets (offs) if there is a 2d matrix, or no offset if both matrices are 3d";
  if (offs) {
    if (offs->dim() != 1) return "offs has to be 1D";
    if (offs->scalar_type() != at::kInt) return "Offsets (offs) have to be int32";
  }
  if (bias) return "Bias not supported yet";
  if (out_dtype.value_or(a.scalar_type()) != a.scalar_type())
    return "Grouped gemm output dtype (out_dtype) must match `mat_a` (a) dtype";
  if (a2 != b2 && offs->size(0) != (a2 ? b : a).size(0))
    return std::string("matrix batch sizes have to match: offs has ") + std::to_string(offs->size(0)) +
           " groups, " + (a2 ? "b" : "a") + " " + std::to_string((a2 ? b : a).size(0));
  if (!a2 && !b2 && a.size(0) != b.size(0)) return "batched dimension has to match (a and b)";
  if (a.scalar_type() != b.scalar_type())
    return "Expected a (mat_a) and b (mat_b) to have the same dtype, got " + dtype_name(a) + " and " + dtype_name(b);
  if (a.device() != b.device())
    return "Expected a (mat_a) and b (mat_b) on one device, got " + a.device().str() + " and " + b.device().str();
  return std::nullopt;
}

namespace {

// e4m3fn expert weights' scales: (G, ceil(n / block_n), ceil(k / block_k)) floats, contiguous.
struct Fp8Scales {
  at::Tensor scales;
  int64_t block_n, block_k;
};

// The streamed decode of e4m3fn experts (grouped_mm_stream in
// metal/grouped_mm.metal): a threadgroup per routed row and block of weight
// rows, a SIMD group per 32 lanes x `bytes` of K (gemv_stream_rows in
// ops/gemv.h). A lane reads 16 bytes of a row per step, or 8 where that
// leaves fewer lanes past K: Qwen3-30B-A3B's down projection (K = 768) is
// three whole SIMD groups of 8 bytes, one and a half of 16. On the CUDA proxy
// 16 bytes ran its gate_up (K = 2048) 1.05-1.25x faster than 8, and 8 its
// down 1.4-1.8x faster than 16 (docs/performance.md).
int64_t stream_bytes(int64_t k) {
  const auto past = [k](int64_t bytes) { return int64_t(gemv_stream_slices(k, bytes)) * 32 * bytes - k; };
  return past(8) < past(16) && gemv_streams(k, 8) ? 8 : 16;
}

std::string stream_kernel(int64_t k, at::ScalarType dtype) {
  return host_name("fp8_grouped_mm", ("stream" + std::to_string(stream_bytes(k))).c_str(), {dtype});
}

uint32_t stream_threads(int64_t k) { return uint32_t(32 * gemv_stream_slices(k, stream_bytes(k))); }

GroupedPlan stream_plan(const Problem& pr, at::ScalarType dtype, Backend& backend) {
  const GroupedMmParams& q = pr.params;
  GroupedPlan p{stream_kernel(q.k, dtype), {}, {stream_threads(q.k)}};
  const int64_t fill = backend.fill_simdgroups(p.kernel, p.threads.x);
  p.stream_rows = uint32_t(gemv_stream_rows(q.n, q.k, p.threads.x / 32 * int64_t(q.m), fill));
  p.grid = {ceil_div(q.n, p.stream_rows), q.m};
  return p;
}

// Whether the streamed decode serves an e4m3fn problem the decode kernels
// take: at most kStreamMaxAverageRows rows per expert on average, K within a
// threadgroup's SIMD groups, blocks along K of whole chunks, and a
// pipeline that takes the threadgroup. Each routed row reads its expert's
// weights on its own, where the decode kernel reads them once for a run of
// rows; on the CUDA proxy streaming was still 1.3-1.6x faster with two rows
// per expert on average (Qwen3-30B-A3B, 32 tokens), the second read of a
// weight row close behind the first (the rows of an expert are adjacent in
// the grid).
constexpr int64_t kStreamMaxAverageRows = 2;

bool streams(const Problem& pr, const Fp8Scales& fp8, at::ScalarType dtype, Backend& backend) {
  const GroupedMmParams& q = pr.params;
  if (q.split != kGroupedSplitRows || int64_t(q.m) > kStreamMaxAverageRows * pr.groups || !gemv_streams(q.k))
    return false;
  if (fp8.block_k < q.k && fp8.block_k % stream_bytes(q.k) != 0) return false;
  return !backend.unavailable(stream_kernel(q.k, dtype), stream_threads(q.k));
}

// The kernel for a problem: grouped_mm's choice, or for e4m3fn weights the streamed or the decode kernel
// where they serve (they scale a lane's chunk of a row at once: a block along k must hold whole chunks),
// else the tiled one.
GroupedPlan plan_for(const Problem& pr, at::ScalarType dtype, Backend& backend, const Fp8Scales* fp8) {
  if (!fp8) return plan(pr, dtype, backend);
  if (!decodes(pr)) return tiled_plan(pr, "fp8_grouped_mm", dtype);
  if (streams(pr, *fp8, dtype, backend)) return stream_plan(pr, dtype, backend);
  const bool chunked = fp8->block_k >= pr.params.k || fp8->block_k % kFp8GroupedDecodeBytes == 0;
  return chunked ? decode_plan(pr, "fp8_grouped_mm", dtype, kFp8GroupedDecodeBytes, backend)
                 : tiled_plan(pr, "fp8_grouped_mm", dtype);
}

std::optional<std::string> unsupported(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs,
                                       const Fp8Scales* fp8) {
  std::string why;
  Backend* backend = backend_for(a.device(), &why);
  if (!backend) return why;
  if (offs && offs->device() != a.device()) return "offs on another device";
  if (a.layout() != at::kStrided || b.layout() != at::kStrided || (offs && offs->layout() != at::kStrided))
    return "not strided";
  if (offs && offs->stride(0) != 1 && offs->size(0) > 1) return "offs not contiguous";
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  const Layout out = output_layout(a, b, offs);
  for (const at::Tensor* t : {&a, &b})
    for (int64_t d = 0; d < t->dim(); ++d)
      if (t->size(d) > kMax) return "size >= 2^31";
  if (out.size[0] * out.stride[0] > kMax) return "size >= 2^31";
  const Problem pr = problem_of(a, b, offs, out);
  if (pr.groups == 0) return std::nullopt;  // nothing to run
  const GroupedPlan p = plan_for(pr, a.scalar_type(), *backend, fp8);
  return backend->unavailable(p.kernel, p.threads.x);
}

at::Tensor run_kernels(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs,
                       const Fp8Scales* fp8) {
  const Layout layout = output_layout(a, b, offs);
  at::Tensor out = at::empty_strided(layout.size, layout.stride, a.options());
  Problem pr = problem_of(a, b, offs, layout);
  if (out.numel() == 0 || pr.groups == 0) return out;  // nothing to write
  const GroupedPlan p = plan_for(pr, a.scalar_type(), *backend_for(a.device()), fp8);
  pr.params.decode_slices = p.decode_slices;
  pr.params.decode_chunks = p.decode_chunks;
  pr.params.stream_rows = p.stream_rows;
  if (fp8) {
    pr.params.block_n = uint32_t(fp8->block_n);
    pr.params.block_k = uint32_t(fp8->block_k);
    pr.params.scale_cols = uint32_t(fp8->scales.size(2));
    pr.params.scale_group = uint64_t(fp8->scales.stride(0));
  }
  dispatch(Launch{p.kernel, {}, p.grid, p.threads}
               .tensor(a)
               .tensor(b)
               .tensor(offs ? *offs : a)
               .tensor(out)
               .bytes(pr.params)
               .tensor(fp8 ? fp8->scales : b));  // read by the FP8 kernel only
  return out;
}

// The experts' weights in `dtype`, for the calls the kernels do not take (torch's grouped_mm runs them):
// one dequantize launch when no block straddles two experts, else one per expert.
at::Tensor dequantized(const at::Tensor& weight, const Fp8Scales& fp8, at::ScalarType dtype) {
  const int64_t e = weight.size(0), n = weight.size(1), k = weight.size(2);
  if (n % fp8.block_n == 0)
    return fp8_dequantize(weight.reshape({e * n, k}), fp8.scales.reshape({-1, fp8.scales.size(2)}), fp8.block_n,
                          fp8.block_k, dtype)
        .view({e, n, k});
  std::vector<at::Tensor> experts;
  for (int64_t g = 0; g < e; ++g)
    experts.push_back(fp8_dequantize(weight[g], fp8.scales[g], fp8.block_n, fp8.block_k, dtype));
  return at::stack(experts);
}

}  // namespace

std::optional<std::string> grouped_mm_unsupported(const at::Tensor& a, const at::Tensor& b,
                                                  const std::optional<at::Tensor>& offs) {
  return unsupported(a, b, offs, nullptr);
}

at::Tensor grouped_mm_kernels(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs) {
  return run_kernels(a, b, offs, nullptr);
}

at::Tensor grouped_mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs,
                      std::optional<at::ScalarType> out_dtype) {
  if (auto error = grouped_mm_invalid(a, b, offs, std::nullopt, out_dtype, false))
    TORCH_CHECK(false, "mps_ext.grouped_mm: ", *error);
  return overrides::counted(
      "mps_ext::grouped_mm", grouped_mm_unsupported(a, b, offs), [&] { return grouped_mm_kernels(a, b, offs); },
      [&] { return at::_grouped_mm(a, b, offs, std::nullopt, out_dtype); });
}

// x (m, k) rows sorted by expert, weight (G, n, k) e4m3fn, offs (G,) the experts' row ends.
at::Tensor fp8_grouped_mm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                          const at::Tensor& offs, at::OptionalIntArrayRef block_size,
                          std::optional<at::ScalarType> out_dtype) {
  const char* op = "fp8_grouped_mm";
  TORCH_CHECK_TYPE(float_type(x.scalar_type()), op, ": x must be float32, float16 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK_TYPE(weight.scalar_type() == at::kFloat8_e4m3fn || weight.scalar_type() == at::kByte, op,
                   ": weight must be float8_e4m3fn (or uint8 holding e4m3fn bits), got ", weight.scalar_type());
  TORCH_CHECK_TYPE(float_type(weight_scale.scalar_type()), op, ": weight_scale must be a float tensor, got ",
                   weight_scale.scalar_type());
  TORCH_CHECK_TYPE(offs.scalar_type() == at::kInt, op, ": offs must be int32, got ", offs.scalar_type());
  TORCH_CHECK_TYPE(out_dtype.value_or(x.scalar_type()) == x.scalar_type(), op, ": out_dtype must be x's dtype (",
                   x.scalar_type(), "), got ", *out_dtype);
  TORCH_CHECK_VALUE(x.dim() == 2, op, ": x must be 2-D (rows, in_features), got ", x.sizes());
  TORCH_CHECK_VALUE(weight.dim() == 3, op, ": weight must be 3-D (experts, out_features, in_features), got ",
                    weight.sizes());
  const int64_t e = weight.size(0), n = weight.size(1), k = weight.size(2);
  TORCH_CHECK_VALUE(x.size(1) == k, op, ": x's last dimension (", x.size(1), ") must equal weight's in_features (",
                    k, ")");
  TORCH_CHECK_VALUE(offs.dim() == 1 && offs.size(0) == e, op, ": offs must have shape (", e,
                    ",), one row end per expert, got ", offs.sizes());
  int64_t block_n = 1, block_k = std::max<int64_t>(k, 1);
  if (block_size) {
    std::tie(block_n, block_k) = fp8_block_size(op, *block_size);
    const int64_t rows = (n + block_n - 1) / block_n, cols = (k + block_k - 1) / block_k;
    TORCH_CHECK_VALUE(weight_scale.dim() == 3 && weight_scale.size(0) == e && weight_scale.size(1) == rows &&
                          weight_scale.size(2) == cols,
                      op, ": weight_scale must have shape (", e, ", ", rows, ", ", cols, ") for block_size ",
                      *block_size, ", got ", weight_scale.sizes());
  } else {
    const bool per_expert = weight_scale.numel() == e && weight_scale.dim() >= 1 && weight_scale.size(0) == e &&
                            (weight_scale.dim() == 1 || (weight_scale.dim() == 3 && weight_scale.size(1) == 1));
    const bool per_channel = (weight_scale.dim() == 2 || (weight_scale.dim() == 3 && weight_scale.size(2) == 1)) &&
                             weight_scale.size(0) == e && weight_scale.size(1) == n;
    TORCH_CHECK_VALUE(per_expert || per_channel, op, ": weight_scale must have shape (", e, ",), (", e, ", 1, 1), (",
                      e, ", ", n, ") or (", e, ", ", n, ", 1) without block_size, got ", weight_scale.sizes());
    if (per_expert && !per_channel) block_n = std::max<int64_t>(n, 1);
  }
  for (const at::Tensor* t : {&weight, &weight_scale, &offs})
    TORCH_CHECK(t->device() == x.device(), op, ": all tensors must be on ", x.device(), ", got one on ",
                t->device());

  if (x.size(0) == 0 || n == 0 || k == 0) return at::zeros({x.size(0), n}, x.options());
  // The kernels read rows of x and of each expert's weight contiguously.
  const at::Tensor a = x.stride(1) == 1 ? x : x.contiguous();
  const at::Tensor w = bytes_of(weight.stride(2) == 1 && weight.stride(1) >= k ? weight : weight.contiguous());
  const Fp8Scales fp8{weight_scale.to(at::kFloat).contiguous().view({e, (n + block_n - 1) / block_n, -1}),
                      std::min(block_n, n), std::min(block_k, k)};
  const at::Tensor b = w.transpose(1, 2);
  return overrides::counted(
      "mps_ext::fp8_grouped_mm", unsupported(a, b, offs, &fp8), [&] { return run_kernels(a, b, offs, &fp8); },
      [&] { return at::_grouped_mm(a, dequantized(w, fp8, x.scalar_type()).transpose(1, 2), offs, std::nullopt,
                                   std::nullopt); });
}

}  // namespace mps_ext::ops

TORCH_LIBRARY_FRAGMENT(mps_ext, m) {
  m.def("grouped_mm(Tensor a, Tensor b, Tensor? offs=None, ScalarType? out_dtype=None) -> Tensor");
  m.def("fp8_grouped_mm(Tensor x, Tensor weight, Tensor weight_scale, Tensor offs, int[]? block_size=None, "
        "ScalarType? out_dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(mps_ext, CPU, m) {
  m.impl("grouped_mm", TORCH_FN(mps_ext::ops::grouped_mm));
  m.impl("fp8_grouped_mm", TORCH_FN(mps_ext::ops::fp8_grouped_mm));
}

TORCH_LIBRARY_IMPL(mps_ext, MPS, m) {
  m.impl("grouped_mm", TORCH_FN(mps_ext::ops::grouped_mm));
  m.impl("fp8_grouped_mm", TORCH_FN(mps_ext::ops::fp8_grouped_mm));
}
