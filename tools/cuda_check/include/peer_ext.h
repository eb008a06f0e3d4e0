// What the peers' kernels (ggml-metal, MLX) use of Metal beyond what mtlcuda.h gives the project's
// (tools/cuda_check/peers.py). Only additions: the peers' translations include it after mtlcuda.h, so
// every code base runs on the same shim.
//
// - [[threadgroup(n)]] kernel parameters (ggml's shmem, MLX's tgp_memory): dynamic shared
//   memory, slot 0 at offset 0 (the launcher passes the size, as setThreadgroupMemoryLength);
// - simd_shuffle_down, fmax, fast::exp and exp2, log2, type traits, numeric_limits, uniform/make_uniform, the
//   long/ulong vectors MLX's index helpers return, the 4x4 matrix types of ggml's prefill
//   attention, and a type name ggml's headers declare (packed_char4) but these kernels never use.
#pragma once

#include <cfloat>
#include <limits>

// <metal_stdlib>'s largest finite half (ggml's attention kernels start running maxima from -MAXHALF), and the
// float constants of <metal_math> that MLX's steel attention scales by.
#define MAXHALF 65504.0f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LN2_F 0.693147180559945309417f

namespace metal {

// Metal: lane i gets lane i + delta's value; the top delta lanes keep their own (as CUDA's).
template <class T>
MTLCUDA_FN T simd_shuffle_down(T v, ushort delta) {
  const unsigned mask = __activemask();
  constexpr int kWords = (sizeof(T) + 3) / 4;
  unsigned w[kWords] = {};
  __builtin_memcpy(w, &v, sizeof(T));
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_down_sync(mask, w[i], delta);
  T r;
  __builtin_memcpy(&r, w, sizeof(T));
  return r;
}

template <class T>
MTLCUDA_FN T simd_shuffle_up(T v, ushort delta) {
  const unsigned mask = __activemask();
  constexpr int kWords = (sizeof(T) + 3) / 4;
  unsigned w[kWords] = {};
  __builtin_memcpy(w, &v, sizeof(T));
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_up_sync(mask, w[i], delta);
  T r;
  __builtin_memcpy(&r, w, sizeof(T));
  return r;
}

MTLCUDA_FN float fmax(float a, float b) { return fmaxf(a, b); }
template <class T, int N>
MTLCUDA_FN vec<T, N> fmax(vec<T, N> a, vec<T, N> b) {  // by value, as mtlcuda.h's operators
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = T(fmaxf(float(a[i]), float(b[i])));
  return r;
}

namespace precise {
MTLCUDA_FN float tanh(float x) { return ::tanhf(x); }
template <class T, int N>
MTLCUDA_FN vec<T, N> tanh(vec<T, N> v) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = T(::tanhf(float(v[i])));
  return r;
}
}  // namespace precise

// What MLX's steel headers use of <metal_type_traits> beyond mtlcuda.h's (the standard library's own); address
// spaces are erased, so removing one is the identity.
using std::bool_constant;
using std::enable_if_t;
using std::is_integral;
using std::remove_cv;
using std::remove_cv_t;
template <class T>
using remove_addrspace_t = T;

MTLCUDA_FN float log2(float x) { return __log2f(x); }

namespace fast {
MTLCUDA_FN float exp(float x) { return __expf(x); }
template <class T, int N>
MTLCUDA_FN vec<T, N> exp(vec<T, N> v) { return ::metal::exp(v); }
MTLCUDA_FN float exp2(float x) { return exp2f(x); }  // ex2.approx under -use_fast_math, as Metal's fast::exp2
}  // namespace fast

// <metal_uniform>
template <class T>
using uniform = T;
template <class T>
__host__ __device__ constexpr T make_uniform(T v) {
  return v;
}

// <metal_limits> for arithmetic types (MLX's Limits<float>).
template <class T>
struct numeric_limits : std::numeric_limits<T> {};

// <metal_matrix>: C columns of R elements. ggml's prefill attention stages K and V through half4x4 and
// bfloat4x4 (copied whole, converted as MSL converts matrices: element-wise).
template <class T, int C, int R = C>
struct matrix {
  vec<T, R> columns[C];
  matrix() = default;
  template <class U, std::enable_if_t<!std::is_same_v<U, T>, int> = 0>
  MTLCUDA_FN explicit matrix(const matrix<U, C, R>& o) {
    for (int i = 0; i < C; ++i) columns[i] = vec<T, R>(o.columns[i]);
  }
  MTLCUDA_FN vec<T, R>& operator[](int i) { return columns[i]; }
  MTLCUDA_FN const vec<T, R>& operator[](int i) const { return columns[i]; }
};
typedef matrix<float, 4> float4x4;
typedef matrix<mtl_half, 4> half4x4;
typedef matrix<mtl_bfloat, 4> bfloat4x4;

}  // namespace metal

// max and min of two halves or bfloats (simd_max over half scores): an exact match, found by argument-dependent
// lookup, where float's overloads and CUDA's global ones would be ambiguous.
template <class Tag>
MTLCUDA_FN mtl_small_float<Tag> max(mtl_small_float<Tag> a, mtl_small_float<Tag> b) { return a < b ? b : a; }
template <class Tag>
MTLCUDA_FN mtl_small_float<Tag> min(mtl_small_float<Tag> a, mtl_small_float<Tag> b) { return b < a ? b : a; }

typedef metal::vec<long, 2> mtl_long2;
typedef metal::vec<long, 3> mtl_long3;
typedef metal::vec<long, 4> mtl_long4;
typedef metal::vec<unsigned long, 2> mtl_ulong2;
typedef metal::vec<unsigned long, 3> mtl_ulong3;
typedef metal::vec<unsigned long, 4> mtl_ulong4;
typedef metal::vec<signed char, 4> packed_char4;

namespace mtlcuda {

// [[threadgroup(n)]]: dynamic shared memory; one slot (0), at offset 0.
extern __shared__ __align__(16) unsigned char mtlcuda_dynamic_threadgroup[];

template <int Slot>
struct ThreadgroupArg {
  static_assert(Slot == 0, "the proxy binds threadgroup slot 0 only");
  template <class P>
  static MTLCUDA_FN P get(const Args&) {
    return reinterpret_cast<P>(mtlcuda_dynamic_threadgroup);
  }
};

}  // namespace mtlcuda
