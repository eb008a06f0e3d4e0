// Scaled dot-product attention: validation, the views the kernels read,
// kernel choice and launch geometry, for both backends. The kernels are in
// metal/attention.metal.
#include "ops/attention.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <variant>
#include <vector>

#include "backend.h"
#include "mps_ext/params.h"
#include "overrides/overrides.h"
#include "ops/naming.h"
#include "ops/plan_helpers.h"

namespace mps_ext::ops {

namespace {

// Query rows the decode kernels take; longer queries are prefill.
constexpr int64_t kDecodeMaxQueryRows = 8;
constexpr int64_t kMaxHeadDim = 256;
// The backward kernels' head dims (D 32 to 128) and keys per threadgroup (kBackwardTile in the kernels).
constexpr int64_t kMaxBackwardHeadDim = 128;
constexpr int64_t kBackwardKeys = 32;
constexpr uint32_t kSimdGroups = 4;
// The prefill kernel's threadgroup: a SIMD group per 8 rows of its block.
constexpr uint32_t kPrefillThreads = kAttentionPrefillRows / 8 * 32;
// A run of keys gives each SIMD group at least this many: shorter runs spend
// more on the merge than they gain in parallelism.
constexpr int64_t kMinKeysPerSimdGroup = 16;

// The call seen as the kernels read it: q (batch, query heads, rows, dim),
// k and v (batch, KV heads, keys, dim), the mask (batch, query heads, rows,
// keys), every batch dimension broadcast and merged into one (stride 0
// where broadcast), the last dimension contiguous.
struct Views {
  at::Tensor q, k, v;
  std::optional<at::Tensor> mask;
  std::optional<at::Tensor> sinks;  // float32, one per output head
  int64_t group = 1;               // query heads per KV head
  std::vector<int64_t> out_shape;  // torch's output shape
  std::vector<int64_t> batch;      // the broadcast batch dimensions merged into q's, k's and v's first
};

bool broadcastable(int64_t a, int64_t b) { return a == b || a == 1 || b == 1; }

// `t` with leading dimensions of size 1 up to `rank`.
at::Tensor with_rank(at::Tensor t, int64_t rank) {
  while (t.dim() < rank) t = t.unsqueeze(0);
  return t;
}

// `t` with its heads (a single one broadcast) `heads`.
at::Tensor with_heads(const at::Tensor& t, int64_t heads) {
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  sizes[sizes.size() - 3] = heads;
  return t.expand(sizes);
}

// (batch..., heads, seq, dim) as (batch, heads, seq, dim), batch the product
// of `batch` (a view unless the batch dimensions' strides cannot merge), the
// last dimension contiguous.
at::Tensor merged(const at::Tensor& t, const std::vector<int64_t>& batch) {
  std::vector<int64_t> expanded(batch);
  expanded.insert(expanded.end(), t.sizes().end() - 3, t.sizes().end());
  int64_t n = 1;
  for (int64_t b : batch) n *= b;
  at::Tensor m = t.expand(expanded).reshape({n, t.size(-3), t.size(-2), t.size(-1)});
  return m.stride(-1) == 1 || m.size(-1) == 1 ? m : m.contiguous();
}

std::variant<Views, std::string> views_of(const AttentionArgs& a) {
  const at::Tensor &q = a.query, &k = a.key, &v = a.value;
  const int64_t given = std::max({q.dim(), k.dim(), v.dim()});
  if (q.dim() < 2 || k.dim() < 2 || v.dim() < 2) return std::string("invalid arguments");
  const int64_t rank = std::max<int64_t>(given, 3);
  const at::Tensor q4 = with_rank(q, rank), k4 = with_rank(k, rank), v4 = with_rank(v, rank);
  std::vector<int64_t> batch;
  for (int64_t d = 0; d < rank - 3; ++d) {
    const int64_t qs = q4.size(d), ks = k4.size(d), vs = v4.size(d);
    if (!broadcastable(qs, ks) || !broadcastable(qs, vs) || !broadcastable(ks, vs))
      return std::string("invalid arguments");
    batch.push_back(std::max({qs, ks, vs}));
  }
  const int64_t hq = q4.size(-3), hv = v4.size(-3);
  int64_t hk = k4.size(-3);
  const int64_t rows = q4.size(-2), keys = k4.size(-2), dim = q4.size(-1), v_dim = v4.size(-1);
  if (v4.size(-2) != keys || k4.size(-1) != dim) return std::string("invalid arguments");
  // torch repeats K/V heads for GQA only where they divide the query's; otherwise heads broadcast.
  if (a.enable_gqa && (hq % hk || hq % hv)) return std::string("invalid arguments");
  if (hk != hv && hk != 1 && hv != 1) return std::string("key and value head counts differ");
  hk = std::max(hk, hv);  // a single K or V head broadcasts over the other's
  Views w;
  int64_t out_heads = hq;
  if (hk == 1) {
    w.group = hq;  // every query head reads the one KV head
  } else if (hq == 1 && !a.enable_gqa) {
    out_heads = hk;  // the query broadcasts over the heads
  } else if (hq % hk == 0 && (a.enable_gqa || hq == hk)) {
    w.group = hq / hk;
  } else {
    return std::string("invalid arguments");
  }
  w.batch = batch;
  w.q = merged(q4, batch);
  if (out_heads != hq) w.q = w.q.expand({w.q.size(0), out_heads, rows, dim});
  w.k = merged(with_heads(k4, hk), batch);
  w.v = merged(with_heads(v4, hk), batch);

  w.out_shape = batch;
  for (int64_t s : {out_heads, rows, v_dim}) w.out_shape.push_back(s);
  w.out_shape.erase(w.out_shape.begin(), w.out_shape.end() - given);

  if (a.attn_mask) {
    const at::Tensor& m = *a.attn_mask;
    const at::ScalarType t = m.scalar_type();
    if (t != at::kBool && t != at::kFloat && t != q.scalar_type()) return std::string("invalid arguments");
    if (m.device() != q.device() || m.layout() != at::kStrided) return std::string("invalid arguments");
    std::vector<int64_t> full(batch);
    for (int64_t s : {out_heads, rows, keys}) full.push_back(s);
    if (m.dim() > int64_t(full.size())) return std::string("invalid arguments");
    for (int64_t d = 1; d <= m.dim(); ++d)
      if (m.size(-d) != 1 && m.size(-d) != full[full.size() - d]) return std::string("invalid arguments");
    w.mask = merged(with_rank(m, int64_t(full.size())).expand(full), batch);
  }
  if (a.sinks) {
    if (a.sinks->numel() != out_heads || a.sinks->device() != q.device()) return std::string("invalid arguments");
    const at::Tensor sinks = a.sinks->reshape({out_heads});
    w.sinks = sinks.scalar_type() == at::kFloat ? sinks.contiguous() : sinks.to(at::kFloat).contiguous();
  }
  return w;
}

// Elements per lane of a head-dim slice: the kernels' E.
int64_t per_lane(int64_t dim) { return dim <= 64 ? 2 : dim <= 128 ? 4 : dim <= 192 ? 6 : 8; }

// Whether `t`'s rows (its last dimension, `e` elements per lane) load in the
// kernel's 2- or 4-element vectors: every lane's slice whole, every row and
// slice aligned to the vector.
bool vectorizable(const at::Tensor& t, int64_t e) {
  const int64_t width = e % 4 == 0 ? 4 : 2;
  if (t.size(-1) % e) return false;
  for (int64_t d = 0; d < 3; ++d)
    if (t.stride(d) % width) return false;
  const uintptr_t base = t.is_cpu() ? reinterpret_cast<uintptr_t>(t.storage().data()) : 0;
  return (base + uintptr_t(t.storage_offset()) * t.element_size()) % (width * t.element_size()) == 0;
}

AttentionMask mask_kind(const std::optional<at::Tensor>& mask) {
  if (!mask) return kAttentionMaskNone;
  switch (mask->scalar_type()) {
    case at::kBool: return kAttentionMaskBool;
    case at::kFloat: return kAttentionMaskFloat;
    case at::kHalf: return kAttentionMaskHalf;
    default: return kAttentionMaskBfloat;
  }
}

struct Plan {
  std::string kernel, merge;  // merge: only where the decode kernel's keys are split over several runs
  Size3 grid, threadgroup;
  AttentionParams params{};
};

// The smallest prefill head dim (its kernels' D) that holds `dim`.
int64_t prefill_dim(int64_t dim) {
  for (int64_t d : {32, 64, 96, 128, 160, 192}) if (dim <= d) return d;
  return kMaxHeadDim;
}

// What every kernel reads of the call; splits as one run.
AttentionParams params_of(const Views& w, const AttentionArgs& a) {
  AttentionParams q{};
  for (int64_t d = 0; d < 3; ++d) {
    q.q_stride[d] = uint64_t(w.q.stride(d));
    q.k_stride[d] = uint64_t(w.k.stride(d));
    q.v_stride[d] = uint64_t(w.v.stride(d));
  }
  if (w.mask)
    for (int64_t d = 0; d < 4; ++d) q.mask_stride[d] = uint64_t(w.mask->stride(d));
  q.kv_heads = uint32_t(w.k.size(1));
  q.group = uint32_t(w.group);
  q.q_len = uint32_t(w.q.size(2));
  q.key_len = uint32_t(w.k.size(2));
  q.qk_dim = uint32_t(w.q.size(-1));
  q.v_dim = uint32_t(w.v.size(-1));
  q.splits = 1;
  q.keys_per_split = q.key_len;
  q.mask = mask_kind(w.mask);
  q.causal = a.is_causal;
  q.window = uint32_t(a.window);
  // The first row's position less the window, past the first key.
  q.key_first = uint32_t(std::max<int64_t>(a.window ? w.k.size(2) - w.q.size(2) + 1 - a.window : 0, 0));
  q.key_first = std::min(q.key_first, q.key_len);
  q.sinks = w.sinks.has_value();
  q.softcap = float(a.softcap);
  // torch's default scale: 1 / sqrt of the query's head dim.
  q.scale = float(a.scale.value_or(1.0 / std::sqrt(double(w.q.size(-1)))));
  return q;
}

bool is_prefill(const Views& w) { return w.q.size(2) > kDecodeMaxQueryRows; }

// The prefill kernel's name for these views; `stage` "prefill" or a backward kernel's.
std::string prefill_kernel(const Views& w, const std::string& stage) {
  const int64_t dim = prefill_dim(std::max(w.q.size(-1), w.v.size(-1)));
  return "attention_" + stage + "_" + metal_type(w.q.scalar_type()) + "_d" + std::to_string(dim);
}

// training: the prefill kernel for any query length, writing the log-sum-exp.
Plan plan(const Views& w, const AttentionArgs& a, Backend& backend, bool training = false) {
  Plan p;
  p.params = params_of(w, a);
  AttentionParams& q = p.params;
  const std::string type = metal_type(w.q.scalar_type());
  const int64_t batch = w.q.size(0), kv_heads = w.k.size(1), keys = w.k.size(2) - q.key_first;
  if (is_prefill(w) || training) {
    q.lse = training;
    const int64_t blocks = (w.q.size(2) + kAttentionPrefillRows - 1) / kAttentionPrefillRows;
    p.kernel = prefill_kernel(w, "prefill");
    p.grid = {uint32_t(blocks), uint32_t(kv_heads * w.group), uint32_t(batch)};
    p.threadgroup = {kPrefillThreads};
    return p;
  }
  const int64_t rows_per_head = w.group * w.q.size(2), e = per_lane(std::max(w.q.size(-1), w.v.size(-1)));
  const int64_t rows = rows_bucket(std::min<int64_t>(rows_per_head, kAttentionMaxRows));
  const std::string tile = "_e" + std::to_string(e);
  p.kernel = "attention_decode_" + type + tile + "_r" + std::to_string(rows);
  p.merge = "attention_merge_" + type + tile;
  // Split the keys over as many threadgroups as fill the GPU, each run long enough to be worth a merge.
  const int64_t blocks = (rows_per_head + rows - 1) / rows, threadgroups = batch * kv_heads * blocks;
  const int64_t fill = backend.fill_simdgroups(p.kernel, 32 * kSimdGroups);
  const int64_t wanted = (fill + threadgroups * kSimdGroups - 1) / (threadgroups * kSimdGroups);
  int64_t splits =
      std::clamp<int64_t>(std::min(wanted, keys / (kSimdGroups * kMinKeysPerSimdGroup)), 1, std::max<int64_t>(keys, 1));
  const int64_t per_split = (keys + splits - 1) / splits;
  splits = (keys + per_split - 1) / per_split;
  q.splits = uint32_t(splits);
  q.keys_per_split = uint32_t(per_split);
  q.vectorized = (vectorizable(w.q, e) ? kAttentionVecQ : 0) | (vectorizable(w.k, e) ? kAttentionVecK : 0) |
                 (vectorizable(w.v, e) ? kAttentionVecV : 0);
  p.grid = {uint32_t(splits), uint32_t(blocks), uint32_t(batch * kv_heads)};
  p.threadgroup = {32 * kSimdGroups};
  return p;
}

// A launch of `kernel` with what every attention kernel reads first: q, k, v
// and the mask (q bound in its slot when there is none; never read).
Launch reading(const Views& w, std::string kernel, Size3 grid, Size3 threadgroup) {
  Launch launch{std::move(kernel), {}, grid, threadgroup};
  launch.tensor(w.q).tensor(w.k).tensor(w.v).tensor(w.mask ? *w.mask : w.q);
  return launch;
}

// The prefill kernel's launch; `stats` takes each row's log-sum-exp where the
// plan says so (training), else it is bound to `out` and never written.
void dispatch_prefill(const Views& w, const Plan& p, const at::Tensor& out, const at::Tensor& stats) {
  dispatch(reading(w, p.kernel, p.grid, p.threadgroup)
               .tensor(out)
               .bytes(p.params)
               .tensor(w.sinks ? *w.sinks : w.q)
               .tensor(stats));
}

}  // namespace

std::optional<std::string> attention_unsupported(const AttentionArgs& a) {
  const at::Tensor &q = a.query, &k = a.key, &v = a.value;
  std::string why;
  Backend* backend = backend_for(q.device(), &why);
  if (!backend) return why;
  if (q.layout() != at::kStrided || k.layout() != at::kStrided || v.layout() != at::kStrided)
    return std::string("not strided");
  if (k.device() != q.device() || v.device() != q.device()) return std::string("invalid arguments");
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type())
    return std::string("invalid arguments");
  if (!float_type(q.scalar_type())) return std::string("dtype ") + c10::toString(q.scalar_type());
  if (a.dropout_p != 0.0) return std::string("dropout");
  auto views = views_of(a);
  if (auto* reason = std::get_if<std::string>(&views)) return *reason;
  const Views& w = std::get<Views>(views);
  if (w.q.size(-1) > kMaxHeadDim || w.v.size(-1) > kMaxHeadDim) return std::string("head dim > 256");
  for (const at::Tensor& t : {w.q, w.k, w.v})
    for (int64_t s : t.sizes())
      if (s > std::numeric_limits<int32_t>::max()) return std::string("sizes past 2^31");
  if (w.q.size(0) * w.k.size(1) > std::numeric_limits<int32_t>::max()) return std::string("sizes past 2^31");
  int64_t numel = 1;
  for (int64_t s : w.out_shape) numel *= s;
  if (numel == 0 || w.k.size(2) == 0) return std::nullopt;  // nothing to launch
  const Plan p = plan(w, a, *backend);
  if (auto reason = backend->unavailable(p.kernel, p.threadgroup.x)) return reason;
  if (p.params.splits > 1)
    if (auto reason = backend->unavailable(p.merge, 32 * kAttentionMergeSimdGroups)) return reason;
  return std::nullopt;
}

at::Tensor attention_kernels(const AttentionArgs& a) {
  const Views w = std::get<Views>(views_of(a));
  // torch gives rows that attend no key 0, and so every row when there are no keys.
  if (w.k.size(2) == 0) return at::zeros(w.out_shape, a.query.options());
  at::Tensor out = at::empty(w.out_shape, a.query.options());
  if (out.numel() == 0) return out;
  const Plan p = plan(w, a, *backend_for(a.query.device()));
  if (is_prefill(w)) {
    dispatch_prefill(w, p, out, out);
    return out;
  }
  const int64_t out_rows = out.numel() / w.v.size(-1), splits = p.params.splits;
  const at::TensorOptions floats = a.query.options().dtype(at::kFloat);
  // One run writes the output itself; the partials' slots are bound to it (never touched).
  const at::Tensor partial_out = splits > 1 ? at::empty({out_rows, splits, w.v.size(-1)}, floats) : out;
  const at::Tensor partial_stats = splits > 1 ? at::empty({out_rows, splits, 2}, floats) : out;
  dispatch(reading(w, p.kernel, p.grid, p.threadgroup)
               .tensor(out)
               .tensor(partial_out)
               .tensor(partial_stats)
               .bytes(p.params)
               .tensor(w.sinks ? *w.sinks : w.q));
  if (splits > 1)
    dispatch(Launch{p.merge, {}, {uint32_t(out_rows)}, {32 * kAttentionMergeSimdGroups}}
                 .tensor(partial_out)
                 .tensor(partial_stats)
                 .tensor(out)
                 .bytes(p.params)
                 .tensor(w.sinks ? *w.sinks : w.q));
  return out;
}

std::optional<std::string> attention_training_unsupported(const AttentionArgs& a) {
  if (auto why = attention_unsupported(a)) return why;
  if (a.attn_mask && a.attn_mask->requires_grad()) return std::string("a mask that needs a derivative");
  for (const at::Tensor* t : {&a.query, &a.key, &a.value})
    if (t->_fw_grad(/*level=*/0).defined()) return std::string("forward-mode derivatives");
  if (a.query.key_set().has(c10::DispatchKey::Python)) return std::string("tensor subclass or tracing");
  const Views w = std::get<Views>(views_of(a));
  if (std::max(w.q.size(-1), w.v.size(-1)) > kMaxBackwardHeadDim) return std::string("backward head dim > 128");
  Backend& backend = *backend_for(a.query.device());
  for (const char* stage : {"prefill", "backward_dq", "backward_dkv"})
    if (auto reason = backend.unavailable(prefill_kernel(w, stage), kPrefillThreads)) return reason;
  return std::nullopt;
}

std::tuple<at::Tensor, at::Tensor> attention_training_forward(const AttentionArgs& a) {
  const Views w = std::get<Views>(views_of(a));
  const at::TensorOptions floats = a.query.options().dtype(at::kFloat);
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < w.out_shape.size(); ++d) rows *= w.out_shape[d];
  if (w.k.size(2) == 0 || rows == 0)
    return {at::zeros(w.out_shape, a.query.options()),
            at::full({rows, 2}, -std::numeric_limits<float>::infinity(), floats)};
  at::Tensor out = at::empty(w.out_shape, a.query.options()), stats = at::empty({rows, 2}, floats);
  dispatch_prefill(w, plan(w, a, *backend_for(a.query.device()), /*training=*/true), out, stats);
  return {out, stats};
}

AttentionGradients attention_training_backward(const AttentionArgs& a, const at::Tensor& out, const at::Tensor& stats,
                                               const at::Tensor& grad_out) {
  const Views w = std::get<Views>(views_of(a));
  const int64_t n = w.q.size(0), heads = w.q.size(1), rows = w.q.size(2), kv_heads = w.k.size(1),
                keys = w.k.size(2);
  const at::ScalarType type = a.query.scalar_type();
  const at::Tensor dout = grad_out.to(type).contiguous();
  // delta_i = dout_i . out_i, beside the forward's log-sum-exp.
  const at::Tensor delta = (dout.to(at::kFloat) * out.to(at::kFloat)).sum(-1).reshape({-1});
  const at::Tensor row_stats = at::stack({stats.select(1, 0), delta}, 1).contiguous();
  at::Tensor dq = at::zeros({n, heads, rows, w.q.size(3)}, a.query.options());
  at::Tensor dk = at::zeros({n, kv_heads, keys, w.k.size(3)}, a.query.options());
  at::Tensor dv = at::zeros({n, kv_heads, keys, w.v.size(3)}, a.query.options());
  if (keys && rows && n && heads) {
    AttentionParams params = plan(w, a, *backend_for(a.query.device()), /*training=*/true).params;
    const uint32_t row_blocks = uint32_t((rows + kAttentionPrefillRows - 1) / kAttentionPrefillRows);
    dispatch(reading(w, prefill_kernel(w, "backward_dq"), {row_blocks, uint32_t(heads), uint32_t(n)}, {kPrefillThreads})
                 .tensor(dout)
                 .tensor(row_stats)
                 .tensor(dq)
                 .bytes(params));
    const uint32_t key_blocks = uint32_t((keys + kBackwardKeys - 1) / kBackwardKeys);
    dispatch(reading(w, prefill_kernel(w, "backward_dkv"), {key_blocks, uint32_t(kv_heads), uint32_t(n)},
                     {kPrefillThreads})
                 .tensor(dout)
                 .tensor(row_stats)
                 .tensor(dk)
                 .tensor(dv)
                 .bytes(params));
  }
  // Back to the inputs' shapes: summed over what broadcast (batch dimensions, a single K/V or query head).
  auto to_input = [&](const at::Tensor& g, const at::Tensor& input) {
    std::vector<int64_t> full(w.batch);
    full.insert(full.end(), g.sizes().end() - 3, g.sizes().end());
    return at::sum_to(g.view(full), input.sizes());
  };
  AttentionGradients grads{to_input(dq, a.query), to_input(dk, a.key), to_input(dv, a.value), {}};
  if (a.sinks) {
    // The sink's column: d sink_h = -sum over rows of p_sink delta, p_sink = exp(sink_h - lse).
    const at::Tensor lse = stats.select(1, 0).view({n, heads, rows}), d = delta.view({n, heads, rows});
    const at::Tensor sink = w.sinks->view({1, heads, 1});
    grads.sinks = (-(at::exp(sink - lse) * d).sum(at::IntArrayRef{0, 2})).reshape(a.sinks->sizes()).to(a.sinks->scalar_type());
  }
  return grads;
}

namespace {

std::optional<at::Tensor> defined(const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; }

using Optional = const std::optional<at::Tensor>&;

// mps_ext::_scaled_dot_product_attention_training: (out, stats).
std::tuple<at::Tensor, at::Tensor> training_forward(const at::Tensor& query, const at::Tensor& key,
                                                    const at::Tensor& value, Optional attn_mask, bool is_causal,
                                                    std::optional<double> scale, bool enable_gqa, Optional sinks,
                                                    int64_t window, double softcap) {
  const AttentionArgs a{query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa, sinks, window, softcap};
  if (auto why = attention_training_unsupported(a)) TORCH_CHECK(false, "mps_ext attention training: ", *why);
  return attention_training_forward(a);
}

// mps_ext::_scaled_dot_product_attention_training_backward: (dq, dk, dv, dsinks).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> training_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& out, const at::Tensor& stats, Optional attn_mask, bool is_causal, std::optional<double> scale,
    bool enable_gqa, Optional sinks, int64_t window, double softcap) {
  const AttentionArgs a{query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa, sinks, window, softcap};
  if (auto why = attention_training_unsupported(a)) TORCH_CHECK(false, "mps_ext attention training: ", *why);
  AttentionGradients g = attention_training_backward(a, out, stats, grad_out);
  return {g.query, g.key, g.value, g.sinks};
}

auto training_forward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mps_ext::_scaled_dot_product_attention_training", "")
                             .typed<decltype(training_forward)>();
  return op;
}

auto training_backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mps_ext::_scaled_dot_product_attention_training_backward", "")
                             .typed<decltype(training_backward)>();
  return op;
}

// The kernels' forward and backward as autograd sees them: the log-sum-exp
// saved, the probabilities recomputed in the backward.
struct AttentionFunction : public torch::autograd::Function<AttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& query, const at::Tensor& key,
                            const at::Tensor& value, const std::optional<at::Tensor>& mask,
                            const std::optional<at::Tensor>& sinks, bool is_causal, std::optional<double> scale,
                            bool enable_gqa, int64_t window, double softcap, const std::string& op) {
    auto [out, stats] =
        training_forward_op().call(query, key, value, mask, is_causal, scale, enable_gqa, sinks, window, softcap);
    overrides::hit(op.c_str());
    ctx->save_for_backward({query, key, value, mask.value_or(at::Tensor()), sinks.value_or(at::Tensor()), out, stats});
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["enable_gqa"] = enable_gqa;
    ctx->saved_data["window"] = window;
    ctx->saved_data["softcap"] = softcap;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "mps_ext attention: the backward of its Metal kernels is not differentiable (double backward); "
                "call the attention with torch's math (mps_ext.overrides.disable()) for higher derivatives");
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor grad = grads[0].defined() ? grads[0] : at::zeros_like(saved[5]);
    auto [dq, dk, dv, dsinks] = training_backward_op().call(
        grad, saved[0], saved[1], saved[2], saved[5], saved[6], defined(saved[3]), ctx->saved_data["is_causal"].toBool(),
        ctx->saved_data["scale"].toOptional<double>(), ctx->saved_data["enable_gqa"].toBool(), defined(saved[4]),
        ctx->saved_data["window"].toInt(), ctx->saved_data["softcap"].toDouble());
    return {dq,          dk,          dv,          at::Tensor(), dsinks,     at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor attention_differentiable(const AttentionArgs& a, const char* op) {
  return AttentionFunction::apply(a.query, a.key, a.value, a.attn_mask, a.sinks, a.is_causal, a.scale, a.enable_gqa,
                                  a.window, a.softcap, std::string(op));
}

at::Tensor attention_reference(const AttentionArgs& a) {
  const at::Tensor& q = a.query;
  if (!a.sinks && !a.window && !a.softcap)
    return at::scaled_dot_product_attention(q, a.key, a.value, a.attn_mask, a.dropout_p, a.is_causal, a.scale,
                                            a.enable_gqa);
  at::Tensor k = a.key, v = a.value;
  if (a.enable_gqa) {
    k = k.repeat_interleave(q.size(-3) / k.size(-3), -3);
    v = v.repeat_interleave(q.size(-3) / v.size(-3), -3);
  }
  const int64_t rows = q.size(-2), keys = k.size(-2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * a.scale.value_or(1.0 / std::sqrt(double(q.size(-1))));
  if (a.softcap) scores = at::tanh(scores / a.softcap) * a.softcap;
  const at::TensorOptions longs = q.options().dtype(at::kLong);
  const at::Tensor row = at::arange(rows, longs).unsqueeze(1), key = at::arange(keys, longs);
  at::Tensor excluded = at::zeros({rows, keys}, q.options().dtype(at::kBool));
  if (a.is_causal) excluded = key > row;
  if (a.window) {
    const at::Tensor pos = row + (keys - rows);
    excluded = excluded.logical_or(key > pos).logical_or(key <= pos - a.window);
  }
  scores = scores.masked_fill(excluded, -std::numeric_limits<double>::infinity());
  if (a.attn_mask) {
    const at::Tensor& m = *a.attn_mask;
    scores = m.scalar_type() == at::kBool ? scores.masked_fill(m.logical_not(), -std::numeric_limits<double>::infinity())
                                          : scores + m;
  }
  if (a.sinks) {
    std::vector<int64_t> column(scores.sizes().begin(), scores.sizes().end());
    column.back() = 1;
    const at::Tensor sink = a.sinks->to(scores.scalar_type()).reshape({-1, 1, 1}).expand(column);
    scores = at::cat({scores, sink}, -1);
  }
  at::Tensor probs = at::_safe_softmax(scores, -1);  // a row that attends no key: 0
  if (a.sinks) probs = probs.narrow(-1, 0, keys);
  if (a.dropout_p > 0.0) probs = at::dropout(probs, a.dropout_p, /*train=*/true);
  return at::matmul(probs, v);
}

bool attention_needs_derivative(const AttentionArgs& a, bool subclasses) {
  auto needs = [subclasses](const at::Tensor& t) {
    return (at::GradMode::is_enabled() && t.requires_grad()) || t._fw_grad(/*level=*/0).defined() ||
           (subclasses && t.key_set().has(c10::DispatchKey::Python));
  };
  return needs(a.query) || needs(a.key) || needs(a.value) || (a.attn_mask && needs(*a.attn_mask)) ||
         (a.sinks && needs(*a.sinks));
}

namespace {

constexpr char kOp[] = "mps_ext::scaled_dot_product_attention";

AttentionArgs op_args(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                      const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                      std::optional<double> scale, bool enable_gqa, const std::optional<at::Tensor>& sinks,
                      int64_t window, double softcap) {
  TORCH_CHECK(window >= 0, "mps_ext.scaled_dot_product_attention: window must be a number of keys (>= 1), got ",
              window);
  TORCH_CHECK(!sinks || (sinks->dim() == 1 && at::isFloatingType(sinks->scalar_type())),
              "mps_ext.scaled_dot_product_attention: sinks must be a 1-D floating tensor of one logit per query "
              "head, got ", sinks ? sinks->sizes() : at::IntArrayRef{}, " ",
              sinks ? c10::toString(sinks->scalar_type()) : "");
  TORCH_CHECK(!sinks || sinks->numel() == query.size(-3), "mps_ext.scaled_dot_product_attention: sinks must hold ",
              "one logit per query head (", query.size(-3), "), got ", sinks ? sinks->numel() : 0);
  TORCH_CHECK(softcap >= 0.0 && std::isfinite(softcap),
              "mps_ext.scaled_dot_product_attention: softcap must be a finite logit cap (> 0, or 0 for none), got ",
              softcap);
  return AttentionArgs{query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, sinks, window, softcap};
}

at::Tensor attention_op(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                        const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                        std::optional<double> scale, bool enable_gqa, const std::optional<at::Tensor>& sinks,
                        int64_t window, double softcap) {
  const AttentionArgs a = op_args(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, sinks,
                                  window, softcap);
  return overrides::counted(kOp, attention_unsupported(a), [&] { return attention_kernels(a); },
                            [&] { return attention_reference(a); });
}

// Autograd: a call that needs a derivative runs the training kernels, or
// else torch's math (differentiable ops); any other goes on to the kernels.
at::Tensor attention_op_autograd(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                 const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                                 std::optional<double> scale, bool enable_gqa,
                                 const std::optional<at::Tensor>& sinks, int64_t window, double softcap) {
  const AttentionArgs a = op_args(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, sinks,
                                  window, softcap);
  // Tensor subclasses without a derivative to take (torch.compile's fake tensors) go on to the op's own
  // kernels, or its fake: a compiled graph keeps the op whole.
  if (attention_needs_derivative(a, /*subclasses=*/false)) {
    const std::optional<std::string> why =
        a.dropout_p != 0.0 ? std::optional<std::string>("dropout") : attention_training_unsupported(a);
    if (!why) return attention_differentiable(a, kOp);
    const overrides::CallingTorch calling = overrides::fallback(kOp, "autograd: " + *why);
    return attention_reference(a);
  }
  at::AutoDispatchBelowADInplaceOrView below;
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mps_ext::scaled_dot_product_attention", "")
                             .typed<decltype(attention_op)>();
  return op.call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, sinks, window, softcap);
}

}  // namespace

}  // namespace mps_ext::ops

// The training forward and backward, as ops of their own (autograd's
// Function calls them; the self-test calls them directly on the GPU).
TORCH_LIBRARY_FRAGMENT(mps_ext, m) {
  m.def("scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
        "float dropout_p=0.0, bool is_causal=False, float? scale=None, bool enable_gqa=False, *, "
        "Tensor? sinks=None, int window=0, float softcap=0.0) -> Tensor");
  m.def("_scaled_dot_product_attention_training(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
        "bool is_causal, float? scale, bool enable_gqa, Tensor? sinks, int window, float softcap) -> (Tensor, Tensor)");
  m.def("_scaled_dot_product_attention_training_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
        "Tensor out, Tensor stats, Tensor? attn_mask, bool is_causal, float? scale, bool enable_gqa, Tensor? sinks, "
        "int window, float softcap) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mps_ext, CPU, m) {
  m.impl("scaled_dot_product_attention", TORCH_FN(mps_ext::ops::attention_op));
  m.impl("_scaled_dot_product_attention_training", TORCH_FN(mps_ext::ops::training_forward));
  m.impl("_scaled_dot_product_attention_training_backward", TORCH_FN(mps_ext::ops::training_backward));
}

TORCH_LIBRARY_IMPL(mps_ext, MPS, m) {
  m.impl("scaled_dot_product_attention", TORCH_FN(mps_ext::ops::attention_op));
  m.impl("_scaled_dot_product_attention_training", TORCH_FN(mps_ext::ops::training_forward));
  m.impl("_scaled_dot_product_attention_training_backward", TORCH_FN(mps_ext::ops::training_backward));
}

TORCH_LIBRARY_IMPL(mps_ext, Autograd, m) {
  m.impl("scaled_dot_product_attention", TORCH_FN(mps_ext::ops::attention_op_autograd));
}
