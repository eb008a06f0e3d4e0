// What torch's own Metal kernels (aten/src/ATen/native/mps/kernels, with the c10/metal headers they include)
// use of Metal beyond mtlcuda.h and peer_ext.h (tools/cuda_check/peer_torch.py). Only additions, included
// by torch's translations alone, after the other two: the same shim as every other code base.
//
// - <metal_array>'s array (c10::metal::array is the kernels' parameter arrays: SoftmaxParams' sizes);
// - the <metal_type_traits> names c10/metal/utils.h builds its opmath_t and overloads from;
// - the math functions its complex helpers name (declared there, never called by these kernels) and
//   the precise:: forms the softmax kernels call;
// - clz (float8.h's e4m3fn conversion);
// - integral_constant and a scalar tanh (PrefillAttention.h's tile sizes and softcapping).
#pragma once

#include <type_traits>
#include <utility>

#define M_SQRT2_F 1.41421356237309504880f
#define M_PI_F 3.14159265358979323846f

namespace metal {

template <class T, unsigned N>
struct array {
  T elems[N];
  MTLCUDA_FN T& operator[](unsigned i) { return elems[i]; }
  MTLCUDA_FN const T& operator[](unsigned i) const { return elems[i]; }
  MTLCUDA_FN static constexpr unsigned size() { return N; }
};

using std::declval;
using std::enable_if;
using std::enable_if_t;
using std::is_floating_point;
using std::is_integral;
using std::is_signed;
using std::is_signed_v;
using std::is_unsigned_v;
using std::remove_cv_t;
using std::remove_reference_t;
using std::is_convertible_v;
using std::integral_constant;
// Metal counts half and bfloat as floating point and scalar; std does not know the shim's types.
template <class T>
inline constexpr bool is_floating_point_v =
    std::is_floating_point_v<T> || std::is_same_v<T, mtl_half> || std::is_same_v<T, mtl_bfloat>;
template <class T>
inline constexpr bool is_integral_v = std::is_integral_v<T>;
template <class T>
inline constexpr bool is_scalar_v = std::is_scalar_v<T> || is_floating_point_v<T>;

MTLCUDA_FN uint clz(uint x) { return __clz(x); }
MTLCUDA_FN bool isunordered(float a, float b) { return ::isnan(a) || ::isnan(b); }
MTLCUDA_FN float fmod(float a, float b) { return fmodf(a, b); }
MTLCUDA_FN float copysign(float a, float b) { return copysignf(a, b); }
MTLCUDA_FN float atan2(float a, float b) { return atan2f(a, b); }
MTLCUDA_FN float abs(float a) { return fabsf(a); }
MTLCUDA_FN int abs(int a) { return a < 0 ? -a : a; }
MTLCUDA_FN float tanh(float x) { return ::tanhf(x); }

namespace precise {
MTLCUDA_FN float exp(float x) { return ::expf(x); }
MTLCUDA_FN float log(float x) { return ::logf(x); }
MTLCUDA_FN float sqrt(float x) { return ::sqrtf(x); }
MTLCUDA_FN float pow(float a, float b) { return ::powf(a, b); }
MTLCUDA_FN float atan2(float a, float b) { return ::atan2f(a, b); }
MTLCUDA_FN float cos(float x) { return ::cosf(x); }
MTLCUDA_FN float sin(float x) { return ::sinf(x); }
}  // namespace precise

}  // namespace metal

namespace metal {

// Lane i gets lane i + delta's value, `fill` past the last lane (c10's complex product reduction).
template <class T>
MTLCUDA_FN T simd_shuffle_and_fill_down(T v, T fill, ushort delta) {
  const T down = simd_shuffle_down(v, delta);
  return (threadIdx.x % 32) + delta < 32 ? down : fill;
}

// The limits c10's NaN-propagating reductions return, usable on the device (std's are host constexpr).
template <>
struct numeric_limits<float> {
  static MTLCUDA_FN constexpr float quiet_NaN() { return __builtin_nanf(""); }
  static MTLCUDA_FN constexpr float infinity() { return __builtin_huge_valf(); }
  static MTLCUDA_FN constexpr float max() { return 3.40282347e38f; }
  static MTLCUDA_FN constexpr float lowest() { return -3.40282347e38f; }
};

}  // namespace metal
