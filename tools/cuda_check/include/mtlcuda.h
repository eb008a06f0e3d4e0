// The part of Metal's standard library that mps_ext's kernels use, for CUDA
// (tools/cuda_check/translate_cuda.py renames MSL's vector and half types to
// the mtl_* names below and qualifies calls to these functions with metal::).
//
// Semantics follow MSL where they differ from CUDA's:
// - half and bfloat are storage types with arithmetic: half op half is half
//   (computed in float, rounded once: the same as a native half operation),
//   half op float is float, as Metal promotes.
// - vectors have component-wise arithmetic, splat and converting
//   constructors, and every copy of a 4-, 8- or 16-byte vector is one load or
//   store of that width (vcopy), so half4 and uint4 reads stay single
//   accesses; vector operands are taken by value, as MSL passes them, so an
//   operand in device memory is one load too (a const reference would read
//   it component by component), and a converting constructor copies its
//   source whole before converting.
// - the address-space macros the simulator's translator puts into classes
//   (mps_ext/sim/translate/): CUDA erases address spaces, so they are
//   csrc/sim/include/mtlsim/address_space.h's erased definitions.
// - SIMD-group functions: 32-lane warp shuffles when the whole warp is
//   active; otherwise an exact path over the active lanes only, combining
//   in the simulator's order.
// - simdgroup_matrix 8x8: two elements per lane (in Apple's placement, with
//   thread_elements(), where MTLCUDA_APPLE_MATRIX_LANES is defined), of any
//   element type, multiplied through shuffles in float (correct, not a model
//   of Apple's matrix hardware).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>
#include <stdint.h>

#include <type_traits>

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;

#define MTLCUDA_FN __device__ __forceinline__

// ------------------------------------------------------------------ address spaces

// The translator's forwarders for members MSL qualifies with an address space
// (`float get() const device`): with spaces erased, only a member that no
// thread-space copy has is forwarded, to its renamed body.
#define MTLSIM_SPACE_ASSIGNMENT(Class)
#define MTLSIM_LOCAL_SPACE_ASSIGNMENT(Class)
#define MTLSIM_COPY(...) (__VA_ARGS__)
#define MTLSIM_CONSTANT_INIT
#define MTLSIM_SPACE_METHOD(spaces, member, ...)
#define MTLSIM_SPACE_CONVERSION_TO(spaces, member, ...)
#define MTLSIM_SPACE_CONVERSION_TEMPLATE(spaces, params, ...)
#define MTLSIM_ERASED_SPACE_METHOD(spaces, member, ...)                                \
  template <class... mtlsim_A>                                                         \
  MTLCUDA_FN constexpr decltype(auto) __VA_ARGS__(mtlsim_A&&... mtlsim_a) {           \
    return member(static_cast<mtlsim_A&&>(mtlsim_a)...);                               \
  }                                                                                    \
  template <class... mtlsim_A>                                                         \
  MTLCUDA_FN constexpr decltype(auto) __VA_ARGS__(mtlsim_A&&... mtlsim_a) const {     \
    return member(static_cast<mtlsim_A&&>(mtlsim_a)...);                               \
  }
#define MTLSIM_ERASED_SPACE_CONVERSION_TO(spaces, member, ...) \
  MTLCUDA_FN operator __VA_ARGS__() const { return member(); }

// ------------------------------------------------------------------ scalars

template <class Tag>
struct mtl_small_float;

struct mtl_half_tag {
  static MTLCUDA_FN float to_float(unsigned short b) { return __half2float(__ushort_as_half(b)); }
  static MTLCUDA_FN unsigned short from_float(float f) { return __half_as_ushort(__float2half_rn(f)); }
};
struct mtl_bfloat_tag {
  static MTLCUDA_FN float to_float(unsigned short b) { return __bfloat162float(__ushort_as_bfloat16(b)); }
  static MTLCUDA_FN unsigned short from_float(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};

template <class Tag>
struct alignas(2) mtl_small_float {
  unsigned short bits;
  mtl_small_float() = default;
  MTLCUDA_FN mtl_small_float(float f) : bits(Tag::from_float(f)) {}
  template <class U, std::enable_if_t<std::is_integral_v<U>, int> = 0>
  MTLCUDA_FN mtl_small_float(U v) : bits(Tag::from_float(float(v))) {}
  template <class OtherTag, std::enable_if_t<!std::is_same_v<OtherTag, Tag>, int> = 0>
  MTLCUDA_FN explicit mtl_small_float(mtl_small_float<OtherTag> o) : bits(Tag::from_float(float(o))) {}
  MTLCUDA_FN operator float() const { return Tag::to_float(bits); }
  MTLCUDA_FN mtl_small_float operator-() const { return mtl_small_float(-float(*this)); }
#define MTLCUDA_ASSIGN(op)                                                      \
  MTLCUDA_FN mtl_small_float& operator op##=(mtl_small_float o) {               \
    *this = mtl_small_float(float(*this) op float(o));                          \
    return *this;                                                               \
  }
  MTLCUDA_ASSIGN(+) MTLCUDA_ASSIGN(-) MTLCUDA_ASSIGN(*) MTLCUDA_ASSIGN(/)
#undef MTLCUDA_ASSIGN
};

typedef mtl_small_float<mtl_half_tag> mtl_half;
typedef mtl_small_float<mtl_bfloat_tag> mtl_bfloat;

#define MTLCUDA_SMALL_OPS(op)                                                                           \
  template <class Tag>                                                                                  \
  MTLCUDA_FN mtl_small_float<Tag> operator op(mtl_small_float<Tag> a, mtl_small_float<Tag> b) {        \
    return mtl_small_float<Tag>(float(a) op float(b));                                                 \
  }                                                                                                     \
  template <class Tag>                                                                                  \
  MTLCUDA_FN float operator op(mtl_small_float<Tag> a, float b) { return float(a) op b; }              \
  template <class Tag>                                                                                  \
  MTLCUDA_FN float operator op(float a, mtl_small_float<Tag> b) { return a op float(b); }              \
  template <class Tag, class U, std::enable_if_t<std::is_integral_v<U>, int> = 0>                      \
  MTLCUDA_FN mtl_small_float<Tag> operator op(mtl_small_float<Tag> a, U b) {                           \
    return mtl_small_float<Tag>(float(a) op float(b));                                                 \
  }                                                                                                     \
  template <class Tag, class U, std::enable_if_t<std::is_integral_v<U>, int> = 0>                      \
  MTLCUDA_FN mtl_small_float<Tag> operator op(U a, mtl_small_float<Tag> b) {                           \
    return mtl_small_float<Tag>(float(a) op float(b));                                                 \
  }
MTLCUDA_SMALL_OPS(+) MTLCUDA_SMALL_OPS(-) MTLCUDA_SMALL_OPS(*) MTLCUDA_SMALL_OPS(/)
#undef MTLCUDA_SMALL_OPS

#define MTLCUDA_SMALL_CMP(op)                                                                                   \
  template <class Tag>                                                                                          \
  MTLCUDA_FN bool operator op(mtl_small_float<Tag> a, mtl_small_float<Tag> b) { return float(a) op float(b); } \
  template <class Tag>                                                                                          \
  MTLCUDA_FN bool operator op(mtl_small_float<Tag> a, float b) { return float(a) op b; }                       \
  template <class Tag>                                                                                          \
  MTLCUDA_FN bool operator op(float a, mtl_small_float<Tag> b) { return a op float(b); }
MTLCUDA_SMALL_CMP(<) MTLCUDA_SMALL_CMP(>) MTLCUDA_SMALL_CMP(<=) MTLCUDA_SMALL_CMP(>=) MTLCUDA_SMALL_CMP(==)
MTLCUDA_SMALL_CMP(!=)
#undef MTLCUDA_SMALL_CMP

// ------------------------------------------------------------------ vectors

namespace mtlcuda {

// The machine word a vector of this size moves as: one access per copy.
template <int Bytes> struct raw_of { typedef void type; };
template <> struct raw_of<2> { typedef unsigned short type; };
template <> struct raw_of<4> { typedef unsigned int type; };
template <> struct raw_of<8> { typedef ::uint2 type; };
template <> struct raw_of<16> { typedef ::uint4 type; };

template <class T, int N> struct fields;
template <class T> struct fields<T, 2> { T x, y; };
template <class T> struct fields<T, 3> { T x, y, z; };
template <class T> struct fields<T, 4> { T x, y, z, w; };

constexpr int vec_align(int size, int n) { return size * (n == 3 ? 4 : n); }

}  // namespace mtlcuda

namespace metal {

template <class T, int N>
struct alignas(mtlcuda::vec_align(sizeof(T), N)) vec : mtlcuda::fields<T, N> {
  static constexpr int kBytes = mtlcuda::vec_align(sizeof(T), N);
  typedef typename mtlcuda::raw_of<kBytes>::type raw_t;

  vec() = default;
  // Copies are one access of the vector's width (vcopy).
  MTLCUDA_FN vec(const vec& o) { vcopy(this, &o); }
  MTLCUDA_FN vec& operator=(const vec& o) {
    vcopy(this, &o);
    return *this;
  }
  // Implicit, as MSL converts a scalar to a vector (`float4 s = 0.0f;`).
  template <class U, std::enable_if_t<std::is_arithmetic_v<U> || std::is_class_v<U> && sizeof(U) == 2, int> = 0>
  MTLCUDA_FN vec(U s) {
    for (int i = 0; i < N; ++i) (*this)[i] = T(s);
  }
  MTLCUDA_FN vec(T a, T b) { static_assert(N == 2); this->x = a; this->y = b; }
  MTLCUDA_FN vec(T a, T b, T c) { static_assert(N == 3); this->x = a; this->y = b; this->z = c; }
  MTLCUDA_FN vec(T a, T b, T c, T d) { static_assert(N == 4); this->x = a; this->y = b; this->z = c; this->w = d; }
  // MSL's uint4(uint2, uint2): a vector from its two halves.
  template <int M = N, std::enable_if_t<M == 4, int> = 0>
  MTLCUDA_FN vec(const vec<T, 2>& lo, const vec<T, 2>& hi) { this->x = lo.x; this->y = lo.y; this->z = hi.x; this->w = hi.y; }
  template <class U, std::enable_if_t<!std::is_same_v<U, T>, int> = 0>
  MTLCUDA_FN explicit vec(const vec<U, N>& o) {
    const vec<U, N> whole(o);  // one access of o's width (vcopy), as Metal loads a vector, then converted
    if constexpr (std::is_same_v<U, mtl_bfloat> && std::is_same_v<T, float> && N % 2 == 0) {
      // A bfloat is the top half of a float: a 32-bit word holds two, each one operation from its float (a
      // conversion per element costs an extract and a shift).
      const unsigned* words = reinterpret_cast<const unsigned*>(&whole);
      for (int i = 0; i < N / 2; ++i) {
        (*this)[2 * i] = __uint_as_float(words[i] << 16);
        (*this)[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
      }
    } else {
      for (int i = 0; i < N; ++i) (*this)[i] = T(whole[i]);
    }
  }
  MTLCUDA_FN T& operator[](int i) { return reinterpret_cast<T*>(this)[i]; }
  MTLCUDA_FN const T& operator[](int i) const { return reinterpret_cast<const T*>(this)[i]; }
  // Two-component swizzles (the translator turns v.xy into v.xy()).
  MTLCUDA_FN vec<T, 2> xy() const { return vec<T, 2>((*this)[0], (*this)[1]); }
  MTLCUDA_FN vec<T, 2> zw() const { return vec<T, 2>((*this)[2], (*this)[3]); }
  MTLCUDA_FN vec<T, 3> xyz() const { return vec<T, 3>((*this)[0], (*this)[1], (*this)[2]); }

  static MTLCUDA_FN void vcopy(vec* dst, const vec* src) {
    if constexpr (std::is_void_v<raw_t>) {
      for (int i = 0; i < N; ++i) (*dst)[i] = (*src)[i];
    } else {
      *reinterpret_cast<raw_t*>(dst) = *reinterpret_cast<const raw_t*>(src);
    }
  }
};

}  // namespace metal

#define MTLCUDA_VEC_OPS(op)                                                              \
  template <class T, int N>                                                              \
  MTLCUDA_FN metal::vec<T, N> operator op(metal::vec<T, N> a, metal::vec<T, N> b) {      \
    metal::vec<T, N> r;                                                                  \
    for (int i = 0; i < N; ++i) r[i] = a[i] op b[i];                                     \
    return r;                                                                            \
  }                                                                                      \
  template <class T, int N, class S, std::enable_if_t<std::is_arithmetic_v<S>, int> = 0> \
  MTLCUDA_FN metal::vec<T, N> operator op(metal::vec<T, N> a, S s) {                     \
    metal::vec<T, N> r;                                                                  \
    for (int i = 0; i < N; ++i) r[i] = a[i] op T(s);                                     \
    return r;                                                                            \
  }                                                                                      \
  template <class T, int N, class S, std::enable_if_t<std::is_arithmetic_v<S>, int> = 0> \
  MTLCUDA_FN metal::vec<T, N> operator op(S s, metal::vec<T, N> a) {                     \
    metal::vec<T, N> r;                                                                  \
    for (int i = 0; i < N; ++i) r[i] = T(s) op a[i];                                     \
    return r;                                                                            \
  }                                                                                      \
  template <class T, int N, class S>                                                     \
  MTLCUDA_FN metal::vec<T, N>& operator op##=(metal::vec<T, N>& a, const S& b) {         \
    a = a op b;                                                                          \
    return a;                                                                            \
  }
MTLCUDA_VEC_OPS(+) MTLCUDA_VEC_OPS(-) MTLCUDA_VEC_OPS(*) MTLCUDA_VEC_OPS(/) MTLCUDA_VEC_OPS(&) MTLCUDA_VEC_OPS(|)
MTLCUDA_VEC_OPS(<<) MTLCUDA_VEC_OPS(>>)
#undef MTLCUDA_VEC_OPS

// Comparisons are per component, to a bool vector (as in MSL).
#define MTLCUDA_VEC_CMP(op)                                                                 \
  template <class T, int N>                                                                 \
  MTLCUDA_FN metal::vec<bool, N> operator op(metal::vec<T, N> a, metal::vec<T, N> b) {      \
    metal::vec<bool, N> r;                                                                  \
    for (int i = 0; i < N; ++i) r[i] = a[i] op b[i];                                        \
    return r;                                                                               \
  }                                                                                         \
  template <class T, int N, class S, std::enable_if_t<std::is_arithmetic_v<S>, int> = 0>    \
  MTLCUDA_FN metal::vec<bool, N> operator op(metal::vec<T, N> a, S s) {                     \
    return a op metal::vec<T, N>(s);                                                        \
  }                                                                                         \
  template <class T, int N, class S, std::enable_if_t<std::is_arithmetic_v<S>, int> = 0>    \
  MTLCUDA_FN metal::vec<bool, N> operator op(S s, metal::vec<T, N> a) {                     \
    return metal::vec<T, N>(s) op a;                                                        \
  }
MTLCUDA_VEC_CMP(==) MTLCUDA_VEC_CMP(!=) MTLCUDA_VEC_CMP(<) MTLCUDA_VEC_CMP(>) MTLCUDA_VEC_CMP(<=)
MTLCUDA_VEC_CMP(>=)
#undef MTLCUDA_VEC_CMP

template <class T, int N>
MTLCUDA_FN metal::vec<T, N> operator-(metal::vec<T, N> a) {
  metal::vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = -a[i];
  return r;
}

#define MTLCUDA_VEC_TYPES(T)                    \
  typedef metal::vec<T, 2> mtl_##T##2;          \
  typedef metal::vec<T, 3> mtl_##T##3;          \
  typedef metal::vec<T, 4> mtl_##T##4;
MTLCUDA_VEC_TYPES(float) MTLCUDA_VEC_TYPES(int) MTLCUDA_VEC_TYPES(uint) MTLCUDA_VEC_TYPES(short)
MTLCUDA_VEC_TYPES(ushort) MTLCUDA_VEC_TYPES(char) MTLCUDA_VEC_TYPES(uchar) MTLCUDA_VEC_TYPES(bool)
typedef metal::vec<mtl_half, 2> mtl_half2;
typedef metal::vec<mtl_half, 3> mtl_half3;
typedef metal::vec<mtl_half, 4> mtl_half4;
typedef metal::vec<mtl_bfloat, 2> mtl_bfloat2;
typedef metal::vec<mtl_bfloat, 3> mtl_bfloat3;
typedef metal::vec<mtl_bfloat, 4> mtl_bfloat4;
#undef MTLCUDA_VEC_TYPES

// ------------------------------------------------------------------ functions

namespace metal {

// What the kernels use of <metal_type_traits>, which shares it with <type_traits>.
using std::conditional;
using std::conditional_t;
using std::is_same;
using std::is_same_v;

// select(a, b, c): b where c, else a; per component for vectors.
template <class T>
MTLCUDA_FN T select(T a, T b, bool c) {
  return c ? b : a;
}
template <class T, int N>
MTLCUDA_FN vec<T, N> select(vec<T, N> a, vec<T, N> b, vec<bool, N> c) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = c[i] ? b[i] : a[i];
  return r;
}

template <class To, class From>
MTLCUDA_FN To as_type(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "as_type: sizes differ");
  To t;
  __builtin_memcpy(&t, &f, sizeof(To));
  return t;
}

template <class T> struct is_vec : std::false_type {};
template <class T, int N> struct is_vec<vec<T, N>> : std::true_type {};

// Component-wise application of a float function to vectors.
#define MTLCUDA_UNARY(name, expr)                                          \
  MTLCUDA_FN float name(float x) { return expr; }                          \
  template <class T, int N>                                                \
  MTLCUDA_FN vec<T, N> name(vec<T, N> v) {                          \
    vec<T, N> r;                                                           \
    for (int i = 0; i < N; ++i) r[i] = T(name(float(v[i])));               \
    return r;                                                              \
  }
MTLCUDA_UNARY(exp, __expf(x))
MTLCUDA_UNARY(log, __logf(x))
MTLCUDA_UNARY(fabs, fabsf(x))
MTLCUDA_UNARY(ceil, ceilf(x))
MTLCUDA_UNARY(floor, floorf(x))
MTLCUDA_UNARY(sqrt, sqrtf(x))
MTLCUDA_UNARY(rsqrt, rsqrtf(x))
#undef MTLCUDA_UNARY

MTLCUDA_FN float fma(float a, float b, float c) { return fmaf(a, b, c); }
MTLCUDA_FN uint popcount(uint x) { return __popc(x); }
MTLCUDA_FN uint mulhi(uint a, uint b) { return __umulhi(a, b); }

MTLCUDA_FN bool isnan(float x) { return ::isnan(x); }
MTLCUDA_FN bool isinf(float x) { return ::isinf(x); }

MTLCUDA_FN float max(float a, float b) { return fmaxf(a, b); }
MTLCUDA_FN float min(float a, float b) { return fminf(a, b); }
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
MTLCUDA_FN T max(T a, T b) { return a < b ? b : a; }
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
MTLCUDA_FN T min(T a, T b) { return b < a ? b : a; }
template <class T>
MTLCUDA_FN T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }

template <class T, int N>
MTLCUDA_FN T dot(vec<T, N> a, vec<T, N> b) {
  T s = a[0] * b[0];
  for (int i = 1; i < N; ++i) s += a[i] * b[i];
  return s;
}

namespace precise {
MTLCUDA_FN float divide(float a, float b) { return __fdiv_rn(a, b); }
}  // namespace precise

// ------------------------------------------------------------------ barriers, atomics

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
MTLCUDA_FN void threadgroup_barrier(mem_flags) { __syncthreads(); }
MTLCUDA_FN void simdgroup_barrier(mem_flags) { __syncwarp(__activemask()); }

enum memory_order { memory_order_relaxed };
struct atomic_uint {
  unsigned int v;
};
MTLCUDA_FN uint atomic_fetch_max_explicit(atomic_uint* p, uint v, memory_order) { return atomicMax(&p->v, v); }

// ------------------------------------------------------------------ SIMD groups

MTLCUDA_FN uint simd_lane() {
  uint lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

// A value of any size moved between lanes as 32-bit words.
template <class T>
MTLCUDA_FN T shuffle_value(unsigned mask, const T& v, uint src) {
  constexpr int kWords = (sizeof(T) + 3) / 4;
  unsigned w[kWords] = {};
  __builtin_memcpy(w, &v, sizeof(T));
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_sync(mask, w[i], src);
  T r;
  __builtin_memcpy(&r, w, sizeof(T));
  return r;
}

template <class T>
MTLCUDA_FN T simd_shuffle(T v, ushort src) {
  return shuffle_value(__activemask(), v, src);
}
template <class T>
MTLCUDA_FN T simd_broadcast(T v, ushort src) {
  return shuffle_value(__activemask(), v, src);
}
template <class T>
MTLCUDA_FN T simd_shuffle_xor(T v, ushort mask) {
  return shuffle_value(__activemask(), v, simd_lane() ^ mask);
}

// The simulator's order: lane i combines with lane i + s for s = 16 .. 1, an
// inactive partner leaving the value as it is; every lane gets lane 0's.
template <class T, class F>
MTLCUDA_FN T simd_reduce(T v, F combine) {
  const unsigned mask = __activemask();
  if (mask == 0xffffffffu) {
    for (int s = 16; s > 0; s >>= 1) {
      const T other = shuffle_value(mask, v, simd_lane() + s < 32 ? simd_lane() + s : simd_lane());
      if (simd_lane() + s < 32) v = combine(v, other);
    }
    return shuffle_value(mask, v, 0);
  }
  // Some lanes inactive: gather the active lanes' values and reduce them in
  // every lane, in the same order.
  T acc[32];
  unsigned present = 0;
  for (int i = 0; i < 32; ++i)
    if ((mask >> i) & 1u) {
      acc[i] = shuffle_value(mask, v, i);
      present |= 1u << i;
    }
  for (int s = 16; s > 0; s >>= 1)
    for (int i = 0; i < s; ++i) {
      const bool a = (present >> i) & 1u, b = (present >> (i + s)) & 1u;
      if (a && b) {
        acc[i] = combine(acc[i], acc[i + s]);
      } else if (b) {
        acc[i] = acc[i + s];
        present |= 1u << i;
      }
    }
  return acc[0];
}

struct SumFn {
  template <class T> MTLCUDA_FN T operator()(T a, T b) const { return a + b; }
};
struct MaxFn {
  template <class T> MTLCUDA_FN T operator()(T a, T b) const { return max(a, b); }
};
struct MinFn {
  template <class T> MTLCUDA_FN T operator()(T a, T b) const { return min(a, b); }
};

MTLCUDA_FN bool simd_all(bool v) { return __all_sync(__activemask(), v); }
MTLCUDA_FN bool simd_any(bool v) { return __any_sync(__activemask(), v); }

template <class T> MTLCUDA_FN T simd_sum(T v) { return simd_reduce(v, SumFn()); }
template <class T> MTLCUDA_FN T simd_max(T v) { return simd_reduce(v, MaxFn()); }
template <class T> MTLCUDA_FN T simd_min(T v) { return simd_reduce(v, MinFn()); }

// ------------------------------------------------------------------ simdgroup matrices

// Where a lane's two elements of an 8x8 matrix lie: adjacent columns of one row, at a placement MSL leaves to the
// GPU and shows only through thread_elements(). Code that reads or writes thread_elements() depends on Apple's
// (MLX's MMA tiles): lane l holds row (l / 16) * 4 + (l / 2) % 4, columns c and c + 1 for c = ((l / 8) % 2) * 4
// + (l % 2) * 2 (MLX's BaseMMAFrag::get_coord). A translation that defines MTLCUDA_APPLE_MATRIX_LANES (the
// peers', tools/cuda_check/peer_sources.py) gets that placement and thread_elements(); any other gets lane l on
// row l / 4, columns 2 * (l % 4) and 2 * (l % 4) + 1, and no thread_elements(), so nothing can see a placement
// that is not Apple's. Loads, stores and products cost the same under both (two accesses; 24 shuffles, the
// source lanes a mask of the reader's lane bits or'ed with a constant of the unrolled k), but mps_ext's kernels
// stage matrices through threadgroup memory in rows, lane l at elements 2l and 2l + 1, which are the row-major
// placement's own addresses: under Apple's their prefill attention takes up to 29 more registers, and spills
// more at head dims 160 and 192 (ptxas -v, sm_90).
namespace matrix_lanes {
#ifdef MTLCUDA_APPLE_MATRIX_LANES
__host__ __device__ constexpr uint row(uint lane) { return (lane >> 4) * 4 + ((lane >> 1) & 3); }
__host__ __device__ constexpr uint col(uint lane) { return ((lane >> 3) & 1) * 4 + (lane & 1) * 2; }
// The lane that holds row r, columns 2p and 2p + 1.
__host__ __device__ constexpr uint lane_of(uint r, uint p) {
  return (r >> 2) << 4 | (p >> 1) << 3 | (r & 3) << 1 | (p & 1);
}
constexpr uint kRowBits = 0x16u, kColBits = 0x09u;  // the lane bits lane_of takes from r, p
#else
__host__ __device__ constexpr uint row(uint lane) { return lane / 4; }
__host__ __device__ constexpr uint col(uint lane) { return 2 * (lane % 4); }
__host__ __device__ constexpr uint lane_of(uint r, uint p) { return r * 4 + p; }
constexpr uint kRowBits = 0x1cu, kColBits = 0x03u;
#endif
}  // namespace matrix_lanes

template <class T, int Cols, int Rows = Cols>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "only 8x8 simdgroup matrices");
  alignas(2 * sizeof(T)) T e[2];  // this lane's elements: (matrix_lanes::row, col) and the one to its right
#ifdef MTLCUDA_APPLE_MATRIX_LANES
  MTLCUDA_FN vec<T, 2>& thread_elements() { return *reinterpret_cast<vec<T, 2>*>(e); }
  MTLCUDA_FN const vec<T, 2>& thread_elements() const { return *reinterpret_cast<const vec<T, 2>*>(e); }
#endif
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<mtl_half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<mtl_bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int Cols, int Rows = Cols>
MTLCUDA_FN simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T v) {
  simdgroup_matrix<T, Cols, Rows> m;
  m.e[0] = m.e[1] = v;
  return m;
}

// MSL's signature: elements_per_row, the matrix's origin (column, row) in the source, and whether the source
// holds it transposed (element (r, c) at src[c * elements_per_row + r]: ggml's K^T).
template <class T, int C, int R, class U>
MTLCUDA_FN void simdgroup_load(simdgroup_matrix<T, C, R>& m, const U* src, ulong elements_per_row = C,
                               vec<ulong, 2> matrix_origin = 0, bool transpose_matrix = false) {
  const uint lane = simd_lane(), r = matrix_lanes::row(lane), c = matrix_lanes::col(lane);
  src += matrix_origin.y * elements_per_row + matrix_origin.x;
  if (transpose_matrix) {
    m.e[0] = T(src[c * elements_per_row + r]);
    m.e[1] = T(src[(c + 1) * elements_per_row + r]);
  } else {
    m.e[0] = T(src[r * elements_per_row + c]);
    m.e[1] = T(src[r * elements_per_row + c + 1]);
  }
}

template <class T, int C, int R, class U>
MTLCUDA_FN void simdgroup_store(const simdgroup_matrix<T, C, R>& m, U* dst, ulong elements_per_row = C,
                                vec<ulong, 2> matrix_origin = 0, bool transpose_matrix = false) {
  const uint lane = simd_lane(), r = matrix_lanes::row(lane), c = matrix_lanes::col(lane);
  dst += matrix_origin.y * elements_per_row + matrix_origin.x;
  if (transpose_matrix) {
    dst[c * elements_per_row + r] = U(m.e[0]);
    dst[(c + 1) * elements_per_row + r] = U(m.e[1]);
  } else {
    dst[r * elements_per_row + c] = U(m.e[0]);
    dst[r * elements_per_row + c + 1] = U(m.e[1]);
  }
}

// d = a * b + c. The operands may differ in type, as MSL allows (ggml multiplies bfloat Q and K into a float
// S, and a float P by bfloat V into a half O): the products are summed in float, from c in float, and
// rounded once to d's type (for float matrices, exactly a float multiply-accumulate).
template <class TD, class TA, class TB, class TC>
MTLCUDA_FN void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                              const simdgroup_matrix<TB, 8, 8>& b,
                                              const simdgroup_matrix<TC, 8, 8>& c) {
  const unsigned full = 0xffffffffu;
  const uint lane = simd_lane(), rows = lane & matrix_lanes::kRowBits, cols = lane & matrix_lanes::kColBits;
  const float a0 = float(a.e[0]), a1 = float(a.e[1]), b0 = float(b.e[0]), b1 = float(b.e[1]);
  float acc0 = float(c.e[0]), acc1 = float(c.e[1]);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    // a(row, k): the lane of this row holding columns k & ~1; b(k, cols): the lane of row k, these columns.
    const float av = __shfl_sync(full, k & 1 ? a1 : a0, rows | matrix_lanes::lane_of(0, k >> 1));
    const uint from = matrix_lanes::lane_of(k, 0) | cols;
    const float bk0 = __shfl_sync(full, b0, from), bk1 = __shfl_sync(full, b1, from);
    acc0 += av * bk0;
    acc1 += av * bk1;
  }
  d.e[0] = TD(acc0);
  d.e[1] = TD(acc1);
}

}  // namespace metal

// ------------------------------------------------------------------ entry points

namespace mtlcuda {

// Metal's argument table: [[buffer(0)]] to [[buffer(30)]].
constexpr int kBufferSlots = 31;

// What a launch passes: the buffer addresses by [[buffer(i)]] slot (a
// parameter struct bound with setBytes is a device copy of its bytes).
struct Args {
  unsigned long long buf[kBufferSlots];
};

enum class Attr {
  thread_position_in_grid, threads_per_grid, thread_position_in_threadgroup, threads_per_threadgroup,
  threadgroup_position_in_grid, threadgroups_per_grid, dispatch_threads_per_threadgroup,
  thread_index_in_threadgroup, thread_index_in_simdgroup, simdgroup_index_in_threadgroup, threads_per_simdgroup,
  simdgroups_per_threadgroup, thread_execution_width, dispatch_simdgroups_per_threadgroup
};

template <int Slot>
struct BufferArg {
  template <class P>
  static MTLCUDA_FN P get(const Args& a) {
    if constexpr (std::is_pointer_v<P>) {
      return reinterpret_cast<P>(a.buf[Slot]);
    } else {
      return *reinterpret_cast<std::remove_reference_t<P>*>(a.buf[Slot]);
    }
  }
};

template <class P>
MTLCUDA_FN P position(uint x, uint y, uint z) {
  typedef std::remove_cv_t<std::remove_reference_t<P>> V;
  if constexpr (metal::is_vec<V>::value) {
    V v;
    v[0] = x;
    v[1] = y;
    if constexpr (sizeof(V) / sizeof(v[0]) >= 3) v[2] = z;
    return v;
  } else {
    return V(x);
  }
}

MTLCUDA_FN uint linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
MTLCUDA_FN uint threads_in_group() { return blockDim.x * blockDim.y * blockDim.z; }

template <Attr A>
struct AttrArg {
  template <class P>
  static MTLCUDA_FN P get(const Args&) {
    typedef std::remove_cv_t<std::remove_reference_t<P>> V;
    if constexpr (A == Attr::thread_position_in_grid)
      return position<V>(blockIdx.x * blockDim.x + threadIdx.x, blockIdx.y * blockDim.y + threadIdx.y,
                         blockIdx.z * blockDim.z + threadIdx.z);
    else if constexpr (A == Attr::threads_per_grid)
      return position<V>(gridDim.x * blockDim.x, gridDim.y * blockDim.y, gridDim.z * blockDim.z);
    else if constexpr (A == Attr::thread_position_in_threadgroup)
      return position<V>(threadIdx.x, threadIdx.y, threadIdx.z);
    else if constexpr (A == Attr::threads_per_threadgroup || A == Attr::dispatch_threads_per_threadgroup)
      return position<V>(blockDim.x, blockDim.y, blockDim.z);
    else if constexpr (A == Attr::threadgroup_position_in_grid)
      return position<V>(blockIdx.x, blockIdx.y, blockIdx.z);
    else if constexpr (A == Attr::threadgroups_per_grid)
      return position<V>(gridDim.x, gridDim.y, gridDim.z);
    else if constexpr (A == Attr::thread_index_in_threadgroup)
      return V(linear_tid());
    else if constexpr (A == Attr::thread_index_in_simdgroup)
      return V(linear_tid() % 32);
    else if constexpr (A == Attr::simdgroup_index_in_threadgroup)
      return V(linear_tid() / 32);
    else if constexpr (A == Attr::simdgroups_per_threadgroup || A == Attr::dispatch_simdgroups_per_threadgroup)
      return V((threads_in_group() + 31) / 32);
    else
      return V(32);
  }
};

template <auto F>
struct Entry;

template <class... P, void (*F)(P...)>
struct Entry<F> {
  template <class... B>
  static MTLCUDA_FN void run(const Args& a) {
    static_assert(sizeof...(P) == sizeof...(B), "one binding per kernel parameter");
    F(B::template get<P>(a)...);
  }
};

}  // namespace mtlcuda
