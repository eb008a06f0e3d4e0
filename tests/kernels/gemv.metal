// y = W x + bias for a row-major W (N x K): one SIMD group per output row,
// four-wide loads along K with float accumulation, reduced with simd_sum.
#include <metal_stdlib>
using namespace metal;

struct GemvParams {
  uint n;
  uint k;
  uint has_bias;
};

template <typename T>
kernel void gemv(device const T* w [[buffer(0)]], device const T* x [[buffer(1)]],
                 device const T* bias [[buffer(2)]], device T* y [[buffer(3)]],
                 constant GemvParams& p [[buffer(4)]],
                 uint group [[threadgroup_position_in_grid]],
                 uint sg [[simdgroup_index_in_threadgroup]],
                 uint simdgroups [[simdgroups_per_threadgroup]],
                 uint lane [[thread_index_in_simdgroup]]) {
  const uint row = group * simdgroups + sg;
  if (row >= p.n) return;  // whole SIMD groups leave together: no collective is split
  device const T* wr = w + ulong(row) * p.k;
  float acc = 0.0f;
  // Rows start 16-byte aligned only when K is a multiple of 4.
  const uint k4 = p.k % 4 == 0 ? p.k / 4 : 0;
  for (uint i = lane; i < k4; i += 32) {
    const float4 a = float4(reinterpret_cast<device const vec<T, 4>*>(wr)[i]);
    const float4 b = float4(reinterpret_cast<device const vec<T, 4>*>(x)[i]);
    acc += dot(a, b);
  }
  for (uint i = k4 * 4 + lane; i < p.k; i += 32) acc += float(wr[i]) * float(x[i]);
  acc = simd_sum(acc);
  if (lane == 0) {
    // Bias is added in float before the one rounding to T.
    y[row] = T(p.has_bias ? acc + float(bias[row]) : acc);
  }
}

#define INSTANTIATE_GEMV(T)                                                                        \
  template [[host_name("gemv_" #T)]] kernel void gemv<T>(                                          \
      device const T* w [[buffer(0)]], device const T* x [[buffer(1)]],                            \
      device const T* bias [[buffer(2)]], device T* y [[buffer(3)]],                               \
      constant GemvParams& p [[buffer(4)]], uint group [[threadgroup_position_in_grid]],           \
      uint sg [[simdgroup_index_in_threadgroup]], uint simdgroups [[simdgroups_per_threadgroup]], \
      uint lane [[thread_index_in_simdgroup]]);

INSTANTIATE_GEMV(float)
INSTANTIATE_GEMV(half)
INSTANTIATE_GEMV(bfloat)
