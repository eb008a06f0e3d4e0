// Pieces of the Metal standard library real kernels use: matrix types,
// metal::array, as_type, type traits, declval, function-pointer template
// parameters, integer arguments of float functions and braced vectors.
#include <metal_stdlib>
using namespace metal;

// A matrix in every address space: out = m (given) * v, v * m, m * m, m + m, 2 * m, transpose, determinant.
kernel void matrices(constant float4x4& cm [[buffer(0)]], device float3x2* dm [[buffer(1)]],
                     device const float4* v [[buffer(2)]], device float* out [[buffer(3)]],
                     device half4x4* hm [[buffer(4)]], uint i [[thread_position_in_grid]]) {
  threadgroup float4x4 tm;
  if (i == 0) tm = cm;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const float4x4 m = tm;
  const float4 mv = cm * v[i];                   // (4)
  const float4 vm = v[i] * m;                    // (4)
  const float4x4 mm = m * transpose(cm) + 2.0f * m - tm;   // (16)
  const float2 r = dm[0] * v[i].xyz;             // 3 columns, 2 rows: (2)
  const float3 l = v[i].zw * dm[0];              // (3)
  device float* o = out + i * 32;
  for (int k = 0; k < 4; ++k) o[k] = mv[k];
  for (int k = 0; k < 4; ++k) o[4 + k] = vm[k];
  for (int c = 0; c < 4; ++c)
    for (int k = 0; k < 4; ++k) o[8 + c * 4 + k] = mm[c][k];
  o[24] = r.x; o[25] = r.y;
  o[26] = l.x; o[27] = l.y; o[28] = l.z;
  o[29] = determinant(cm);
  o[30] = determinant(float3x3(m[0].xyz, m[1].xyz, m[2].xyz)) + determinant(float2x2(1, 2, 3, 4));
  o[31] = float((half4x4(m) * half4(1.0h))[i % 4]);
  if (i == 0) hm[0] = half4x4(cm) * half4x4(1.0h) + hm[0];
}

template <class T> struct product { using type = decltype(metal::declval<T>() * metal::declval<T>()); };
template <class T, metal::enable_if_t<metal::is_floating_point_v<T>, bool> = true> T twice(T x) { return x * 2; }
template <class T, metal::enable_if_t<metal::is_integral_v<T>, bool> = true> T twice(T x) { return x << 1; }
static_assert(metal::is_same_v<product<half>::type, half>, "half * half is half");
static_assert(metal::is_floating_point_v<bfloat> && metal::is_signed_v<half> && !metal::is_integral_v<half>, "");
static_assert(metal::is_unsigned_v<uint> && metal::is_same_v<metal::make_unsigned_t<int>, uint>, "");

float negate(float x) { return -x; }
float square(float x) { return x * x; }
template <float (*F)(float)> float apply(float x) { return F(x); }

constant array<float, 3> kWeights = {0.5f, 1.5f, 2.5f};
float weighted(constant array<float, 3>& w, thread const array<float, 3>& x) {
  float s = 0;
  for (uint k = 0; k < w.size(); ++k) s += w[k] * x[k];
  return s;
}

kernel void library(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                    device uint* bits [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  const float a = x[i];
  array<float, 3> xs = {a, 2 * a, 3 * a};
  uint4 u = {1u, 2u, 3u};                        // the last lane is zero
  device float* o = out + i * 8;
  o[0] = weighted(kWeights, xs) + xs.back() - xs.front() + float(xs.size());
  o[1] = pow(2, a) + fmax(a, 0) + fmin(1, a);   // integer arguments of float functions
  o[2] = apply<negate>(a) + apply<square>(a);
  o[3] = twice(a) + float(twice(int(i)));
  o[4] = as_type<float>(as_type<uint>(a) ^ 0x80000000u);   // flips the sign
  o[5] = float(u.x + u.y + u.z + u.w);
  o[6] = float(as_type<half2>(as_type<uint>(half2(half(a), 1.0h))).x);
  o[7] = float(metal::numeric_limits<half>::max());
  bits[i] = as_type<uint>(x[i]);                 // as_type of a device value
}
