// Long-row softmax: one threadgroup per row. Each thread keeps an online
// (max, sum) over its float4 chunks, the SIMD groups combine theirs with simd
// reductions, and one barrier-separated exchange through threadgroup memory
// combines the SIMD groups. A second sweep writes exp(x - max) / sum.
#include <metal_stdlib>
using namespace metal;

struct SoftmaxParams {
  uint rows;
  uint cols;
};

// Online softmax state: running max and the sum of exp(x - max).
struct Partial {
  float m;
  float s;
};

inline Partial combine(Partial a, Partial b) {
  const float m = max(a.m, b.m);
  if (m == -INFINITY) return Partial{m, 0.0f};
  return Partial{m, a.s * exp(a.m - m) + b.s * exp(b.m - m)};
}

inline Partial add(Partial p, float x) {
  if (x > p.m) {
    const float s = p.m == -INFINITY ? 0.0f : p.s * exp(p.m - x);
    return Partial{x, s + 1.0f};
  }
  if (x == -INFINITY) return p;
  return Partial{p.m, p.s + exp(x - p.m)};  // NaN x makes the sum NaN
}

inline Partial simd_combine(Partial p) {
  const float m = simd_max(p.m);
  const float s = m == -INFINITY ? 0.0f : simd_sum(p.s * exp(p.m - m));
  return Partial{m, s};
}

template <typename T>
kernel void softmax_rows(device const T* x [[buffer(0)]], device T* y [[buffer(1)]],
                         constant SoftmaxParams& p [[buffer(2)]],
                         uint row [[threadgroup_position_in_grid]],
                         uint tid [[thread_position_in_threadgroup]],
                         uint threads [[threads_per_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]],
                         uint sg [[simdgroup_index_in_threadgroup]],
                         uint simdgroups [[simdgroups_per_threadgroup]]) {
  threadgroup float shared_m[32];
  threadgroup float shared_s[32];
  if (row >= p.rows) return;
  device const T* in = x + ulong(row) * p.cols;
  device T* out = y + ulong(row) * p.cols;
  // float4 loads need 16-byte aligned rows; other widths take the scalar path.
  const bool vectorized = p.cols % 4 == 0;
  const uint vec_cols = vectorized ? p.cols / 4 : 0;

  Partial acc{-INFINITY, 0.0f};
  for (uint i = tid; i < vec_cols; i += threads) {
    const float4 v = float4(reinterpret_cast<device const vec<T, 4>*>(in)[i]);
    acc = add(add(add(add(acc, v.x), v.y), v.z), v.w);
  }
  for (uint i = vec_cols * 4 + tid; i < p.cols; i += threads) acc = add(acc, float(in[i]));
  // NaN must win over everything, as in torch.
  bool nan_seen = isnan(acc.m) || isnan(acc.s);
  acc = simd_combine(acc);
  nan_seen = simd_any(nan_seen);
  if (lane == 0) {
    shared_m[sg] = nan_seen ? NAN : acc.m;
    shared_s[sg] = acc.s;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  Partial total{-INFINITY, 0.0f};
  bool any_nan = false;
  for (uint i = 0; i < simdgroups; ++i) {
    any_nan |= isnan(shared_m[i]);
    total = combine(total, Partial{shared_m[i], shared_s[i]});
  }
  // A row of -inf has no mass: 0/0 gives NaN, as torch does.
  const float m = any_nan ? NAN : total.m;
  const float inv = 1.0f / total.s;

  for (uint i = tid; i < vec_cols; i += threads) {
    const float4 v = float4(reinterpret_cast<device const vec<T, 4>*>(in)[i]);
    reinterpret_cast<device vec<T, 4>*>(out)[i] = vec<T, 4>(exp(v - m) * inv);
  }
  for (uint i = vec_cols * 4 + tid; i < p.cols; i += threads) out[i] = T(exp(float(in[i]) - m) * inv);
}

#define INSTANTIATE(T)                                                                             \
  template [[host_name("softmax_" #T)]] kernel void softmax_rows<T>(                               \
      device const T* x [[buffer(0)]], device T* y [[buffer(1)]],                                  \
      constant SoftmaxParams& p [[buffer(2)]], uint row [[threadgroup_position_in_grid]],          \
      uint tid [[thread_position_in_threadgroup]], uint threads [[threads_per_threadgroup]],       \
      uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],         \
      uint simdgroups [[simdgroups_per_threadgroup]]);

INSTANTIATE(float)
INSTANTIATE(half)
INSTANTIATE(bfloat)
