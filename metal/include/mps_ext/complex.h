// Scalar arithmetic shared by real (float) and complex64 kernels. MSL has no
// complex type: a complex64 value is a float2 (re, im), bound from a
// torch.view_as_real view of the tensor. Overloads keep the kernels generic.
#pragma once

#include <metal_stdlib>

namespace mps_ext {

inline float cmul(float a, float b) { return a * b; }
inline float2 cmul(float2 a, float2 b) { return float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }

inline float cconj(float a) { return a; }
inline float2 cconj(float2 a) { return float2(a.x, -a.y); }

inline float cdiv(float a, float b) { return a / b; }
inline float2 cdiv(float2 a, float2 b) {
  // Scaled by the larger part of b (Smith): no overflow of |b|^2 for large b.
  if (metal::fabs(b.x) >= metal::fabs(b.y)) {
    const float r = b.y / b.x, d = b.x + b.y * r;
    return float2((a.x + a.y * r) / d, (a.y - a.x * r) / d);
  }
  const float r = b.x / b.y, d = b.y + b.x * r;
  return float2((a.x * r + a.y) / d, (a.y * r - a.x) / d);
}

inline float creciprocal(float a) { return 1.0f / a; }
inline float2 creciprocal(float2 a) { return cdiv(float2(1.0f, 0.0f), a); }

// The magnitude LAPACK's pivot search compares: |a| for real (isamax),
// |re| + |im| for complex (icamax through scabs1).
inline float abs1(float a) { return metal::fabs(a); }
inline float abs1(float2 a) { return metal::fabs(a.x) + metal::fabs(a.y); }

// a / d as LAPACK computes it for a whole column: times d's reciprocal when
// that cannot overflow (|d| >= FLT_MIN, LAPACK's sfmin for float), divided
// otherwise.
template <typename T>
inline bool reciprocal_is_safe(T d) {
  return abs1(d) >= 1.17549435e-38f;
}
template <typename T>
inline T divide(T a, T d, T reciprocal, bool use_reciprocal) {
  return use_reciprocal ? cmul(a, reciprocal) : cdiv(a, d);
}

// A real value as T: float2(x) would put x in the imaginary part too.
template <typename T>
inline T from_real(float x) {
  return T(x);
}
template <>
inline float2 from_real<float2>(float x) {
  return float2(x, 0.0f);
}

template <typename T>
inline T conj_if(T a, bool conj) {
  return conj ? cconj(a) : a;
}

}  // namespace mps_ext
