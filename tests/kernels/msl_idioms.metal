// MSL as upstream kernels write it (ggml, PyTorch's c10/metal headers): no
// `using namespace metal;` (c10 style), as_type called unqualified from a
// namespace of its own, select with an integer condition, and
// make_filled_simdgroup_matrix with the row count defaulted, and conditionals
// between half, integers, float and values in device memory (ggml's dequantizers).
#include <metal_stdlib>

namespace lib {
namespace metal {  // shadows ::metal inside lib, as c10::metal does
inline float flip_sign(float x) { return as_type<float>(as_type<uint>(x) ^ 0x80000000u); }
}  // namespace metal
}  // namespace lib

kernel void idioms(device const float* x [[buffer(0)]], device const uint* bits [[buffer(1)]],
                   device float* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  device float* o = out + i * 3;
  o[0] = lib::metal::flip_sign(x[i]);
  o[1] = float(metal::select(1, -1, bits[i] & 4u));   // -1 where bit 2 is set
  o[2] = metal::select(x[i], 0.5f, int(bits[i]) & 1); // 0.5 where bit 0 is set
}

kernel void filled(device float* out [[buffer(0)]], constant float& value [[buffer(1)]]) {
  const metal::simdgroup_float8x8 m = metal::make_filled_simdgroup_matrix<float, 8>(value);
  metal::simdgroup_store(m, out, 8);
}

// MSL's usual arithmetic conversions in `?:` (half, vectors and matrices are built-in types there).
static_assert(metal::is_same_v<decltype(true ? half(1) : 0), half>, "an integer joins half");
static_assert(metal::is_same_v<decltype(true ? half(1) : 1.0f), float>, "half joins float");
static_assert(metal::is_same_v<decltype(true ? float4(1) : 0.0f), float4>, "a scalar joins a vector");
static_assert(metal::array<int, (sizeof(half) == 2 ? 3 : 1)>::size() == 3, "a conditional in template arguments");

template <class T> float scale_of(device const half* d, short il, thread T& t) {  // dequantize_q4_0's pattern
  t = il ? (d[0] / 16.h) : d[0];
  return il < 2 ? d[0] : d[0] / 16.h;
}

kernel void conditionals(device const half* h [[buffer(0)]], device const float4* v [[buffer(1)]],
                         device float* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  const bool odd = i & 1;
  device float* o = out + i * 8;
  half t;
  o[0] = scale_of(h + i, short(i % 3), t);
  o[1] = t;
  o[2] = odd ? h[i] : 0;                            // device half and an integer
  o[3] = odd ? h[i] * 2.0h : -1.0f;                 // half and float
  o[4] = (odd ? v[i] : metal::vec<float, 4>(0.5f)).y;  // device vector and a vector (a comma in <>)
  o[5] = odd ? h[i] : i == 2 ? 7 : h[i] + 1.0h;    // nested, right to left
  float a = 0, b = 0;
  (odd ? a : b) = 3;                                // a conditional of two lvalues stays an lvalue
  o[6] = a - b;
  device const half* p = odd ? h : 0;               // 0 as a null pointer constant
  o[7] = p ? float(p[i]) : -2.0f;
}
