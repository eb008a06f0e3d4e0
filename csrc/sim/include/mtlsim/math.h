// MSL math, common, integer, relational and geometric functions, fast:: and
// precise:: (same implementation: the simulator has no fast-math mode), as_type.
//
// Every function is a template over its arguments' value types, so swizzles and
// packed vectors are accepted like the vec they stand for. The arguments must
// share one value type, except that a vector may be paired with scalars of its
// element type. half/bfloat lanes are computed in float and rounded once.
#pragma once

#include "vec.h"

namespace metal {
namespace __detail {

template <class E> struct floating_elem : bool_constant<is_small_float_v<E> || std::is_same_v<E, float>> {};
template <class E> struct integer_elem : bool_constant<std::is_integral_v<E> && !std::is_same_v<E, bool>> {};
template <class E> struct numeric_elem : bool_constant<floating_elem<E>::value || integer_elem<E>::value> {};
template <class E> struct any_elem : bool_constant<is_num_v<E>> {};

struct none {};
template <class A, class B> struct join { using type = none; };
template <class A> struct join<A, A> { using type = A; };
template <class T, int N> struct join<vec<T, N>, T> { using type = vec<T, N>; };
template <class T, int N> struct join<T, vec<T, N>> { using type = vec<T, N>; };
template <class X, class... Y> struct common { using type = X; };
template <class X, class Y, class... Z> struct common<X, Y, Z...> : common<typename join<X, Y>::type, Z...> {};
template <class... X> using common_t = typename common<value_t<X>...>::type;

// The result type of a call, if its arguments agree and have an element kind
// the function accepts; otherwise the overload drops out.
template <template <class> class Kind, class... X>
using result_t = std::enable_if_t<Kind<elem_t<common_t<X...>>>::value, common_t<X...>>;
template <template <class> class Kind, class... X> using bool_result_t = rebind_t<result_t<Kind, X...>, bool>;

// Functions that exist for floating types only take integer scalars as the
// floating type of the other arguments (`pow(2, x)`), as overload resolution
// among MSL's float and half overloads does.
template <class... V> struct first_floating { using type = none; };
template <class V, class... Rest> struct first_floating<V, Rest...> {
  using type = std::conditional_t<floating_elem<elem_t<V>>::value, elem_t<V>, typename first_floating<Rest...>::type>;
};
template <class V, class F>
using int_as_t = std::conditional_t<std::is_integral_v<V> && !std::is_same_v<F, none>, F, V>;
template <class... X>
using float_common_t = typename common<int_as_t<value_t<X>, typename first_floating<value_t<X>...>::type>...>::type;
template <template <class> class Kind, class... X>
using float_result_t = std::enable_if_t<floating_elem<elem_t<float_common_t<X...>>>::value, float_common_t<X...>>;

// The argument itself, or for a swizzle or packed vector the vec it stands for.
template <class A> MTLSIM_HD constexpr decltype(auto) as_value(const A& a) {
  if constexpr (std::is_same_v<A, value_t<A>>) return a;
  else return value_t<A>(a);
}
template <class R, class F, class... A> MTLSIM_HD R map(F f, const A&... a) {
  R r{};
  for (int i = 0; i < lanes_v<R>; ++i) lane(r, i) = elem_t<R>(f(lane(as_value(a), i)...));
  return r;
}

// Lane-wise f(x, out-lane) for the functions with an output parameter.
template <class R, class F, class O> MTLSIM_HD R map_out(F f, const R& x, O& out) {
  R r{};
  for (int i = 0; i < lanes_v<R>; ++i) lane(r, i) = elem_t<R>(f(float(lane(x, i)), lane(out, i)));
  return r;
}

// ------------------------------------------------------------------ float helpers

// IEEE maxNum/minNum: a NaN operand loses to a number.
MTLSIM_HD MTLSIM_INLINE float fmax_(float a, float b) { return a < b || __builtin_isnan(a) ? b : a; }
MTLSIM_HD MTLSIM_INLINE float fmin_(float a, float b) { return b < a || __builtin_isnan(a) ? b : a; }
MTLSIM_HD MTLSIM_INLINE float sign_(float x) { return x > 0 ? 1.0f : x < 0 ? -1.0f : __builtin_isnan(x) ? 0.0f : x; }
MTLSIM_HD MTLSIM_INLINE float fract_(float x) {
  if (__builtin_isinf(x)) return __builtin_copysignf(0.0f, x);
  return __builtin_isnan(x) ? x : fmin_(x - __builtin_floorf(x), 0x1.fffffep-1f);
}
MTLSIM_HD MTLSIM_INLINE float smoothstep_(float e0, float e1, float x) {
  const float t = fmin_(fmax_((x - e0) / (e1 - e0), 0.0f), 1.0f);
  return t * t * (3.0f - 2.0f * t);
}

// sin and cos of pi*x. x mod 2 and the split into a multiple of 1/2 plus
// r in [-1/4, 1/4] are exact in float, so large arguments lose nothing; the
// sin and cos themselves run in double, to round correctly to float nearly always.
struct sincospi_t { double s, c; };
MTLSIM_HD MTLSIM_INLINE sincospi_t sincospi_(float x) {
  const float y = __builtin_fmodf(x, 2.0f), k = __builtin_rintf(2.0f * y), r = y - 0.5f * k;
  const double a = 3.14159265358979323846 * double(r), s = __builtin_sin(a), c = __builtin_cos(a);
  switch (int(k) & 3) {
    case 0: return {s, c};
    case 1: return {c, -s};
    case 2: return {-s, -c};
    default: return {-c, s};
  }
}
// Exact zeros take IEEE's signs: sinPi(n) has the sign of n, cosPi(n + 1/2) is +0.
MTLSIM_HD MTLSIM_INLINE float sinpi_(float x) {
  const float s = float(sincospi_(x).s);
  return s == 0.0f ? __builtin_copysignf(0.0f, x) : s;
}
MTLSIM_HD MTLSIM_INLINE float cospi_(float x) { return float(sincospi_(x).c) + 0.0f; }
MTLSIM_HD MTLSIM_INLINE float tanpi_(float x) {
  const sincospi_t v = sincospi_(x);
  const float t = float(v.s / (v.c + 0.0));
  return t == 0.0f ? __builtin_copysignf(0.0f, x) : t;
}

// ---------------------------------------------------------------- integer helpers

template <class T> using uint_t = std::make_unsigned_t<T>;
template <class T> constexpr int bits_v = int(sizeof(T)) * CHAR_BIT;
using wide_t = __int128;  // holds every sum and signed product of two 64-bit lanes

template <class T> MTLSIM_HD constexpr bool negative([[maybe_unused]] T x) {
  if constexpr (std::is_signed_v<T>) return x < 0;
  else return false;
}
template <class T> MTLSIM_HD constexpr T saturate_to(wide_t w) {
  constexpr wide_t lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  return T(w < lo ? lo : w > hi ? hi : w);
}
template <class T> MTLSIM_HD T madsat_(T a, T b, T c) {
  wide_t w = 0;
  // Only an unsigned 64-bit product can overflow wide_t, and it is then above the range.
  if (__builtin_mul_overflow(wide_t(a), wide_t(b), &w) || __builtin_add_overflow(w, wide_t(c), &w))
    return std::numeric_limits<T>::max();
  return saturate_to<T>(w);
}
template <class T> MTLSIM_HD T mulhi_(T a, T b) {
  using W = std::conditional_t<std::is_signed_v<T>, wide_t, unsigned __int128>;
  return T((W(a) * W(b)) >> bits_v<T>);
}
template <class T> MTLSIM_HD T rotate_(T v, T by) {
  using U = uint_t<T>;
  const int s = int(U(by) & (bits_v<T> - 1));
  return T(U(U(v) << s | U(v) >> ((bits_v<T> - s) & (bits_v<T> - 1))));
}
template <class T> MTLSIM_HD T reverse_bits_(T x) {
  using U = uint_t<T>;
  U u = U(x);
  for (int s = 1; s < bits_v<T>; s *= 2) {
    const U m = U(U(~U(0)) / U((U(1) << s) + 1));  // s ones, s zeros, repeated
    u = U(((u >> s) & m) | ((u & m) << s));
  }
  return T(u);
}
struct extract_bits_fn {
  template <class T> MTLSIM_HD T operator()(T x, uint offset, uint bits) const {
    using U = uint_t<T>;
    if (bits == 0) return T(0);
    const U top = U(U(x) << (bits_v<T> - offset - bits));  // the field in the high bits
    if constexpr (std::is_signed_v<T>) return T(T(top) >> (bits_v<T> - bits));
    else return T(top >> (bits_v<T> - bits));
  }
};
struct insert_bits_fn {
  template <class T> MTLSIM_HD T operator()(T base, T insert, uint offset, uint bits) const {
    using U = uint_t<T>;
    if (bits == 0) return base;
    const U mask = U(U(U(~U(0)) >> (bits_v<T> - bits)) << offset);
    return T(U((U(base) & ~mask) | (U(U(insert) << offset) & mask)));
  }
};

template <class T> using if_int = std::enable_if_t<std::is_integral_v<T>, int>;
using ull = unsigned long long;

// Functions of float and integer lanes. half/bfloat lanes miss the integer
// templates and take the float overloads.
struct abs_fn {
  MTLSIM_HD float operator()(float x) const { return __builtin_fabsf(x); }
  template <class T, if_int<T> = 0> MTLSIM_HD T operator()(T x) const { return T(negative(x) ? 0u - wrap_t<T>(x) : x); }
};
struct max_fn {
  MTLSIM_HD float operator()(float a, float b) const { return fmax_(a, b); }
  template <class T, if_int<T> = 0> MTLSIM_HD T operator()(T a, T b) const { return a < b ? b : a; }
};
struct min_fn {
  MTLSIM_HD float operator()(float a, float b) const { return fmin_(a, b); }
  template <class T, if_int<T> = 0> MTLSIM_HD T operator()(T a, T b) const { return b < a ? b : a; }
};
#define MTLSIM_COMPOSED3(name, expr) \
  struct name##_fn { template <class T> MTLSIM_HD auto operator()(T a, T b, T c) const { return expr; } };
MTLSIM_COMPOSED3(clamp, min_fn{}(max_fn{}(a, b), c))
MTLSIM_COMPOSED3(max3, max_fn{}(max_fn{}(a, b), c))
MTLSIM_COMPOSED3(min3, min_fn{}(min_fn{}(a, b), c))
MTLSIM_COMPOSED3(median3, max_fn{}(min_fn{}(a, b), min_fn{}(max_fn{}(a, b), c)))
#undef MTLSIM_COMPOSED3

struct select_fn {
  template <class T> MTLSIM_HD T operator()(T a, T b, bool c) const { return c ? b : a; }
};
// Steps in the lane's own format, so it cannot go through float.
struct nextafter_fn {
  template <class T> MTLSIM_HD T operator()(T x, T y) const {
    using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;
    const float fx = float(x), fy = float(y);
    if (__builtin_isnan(fx) || __builtin_isnan(fy)) return T(fx + fy);
    if (fx == fy) return y;
    if (fx == 0.0f) return __builtin_bit_cast(T, U(fy < 0.0f ? U(U(1) << (bits_v<U> - 1)) | 1u : 1u));
    const U u = __builtin_bit_cast(U, x);
    return __builtin_bit_cast(T, U((fx < fy) == (fx > 0.0f) ? u + 1u : u - 1u));
  }
};
struct isnormal_fn {
  template <class T> MTLSIM_HD bool operator()(T x) const {
    const float a = __builtin_fabsf(float(x));
    return a >= float(numeric_limits<T>::min()) && a <= float(numeric_limits<T>::max());
  }
};
struct ldexp_fn {
  MTLSIM_HD float operator()(float x, int k) const { return __builtin_ldexpf(x, k); }
};
struct frexp_fn {
  MTLSIM_HD float operator()(float x, int& e) const { return __builtin_frexpf(x, &e); }
};
struct modf_fn {
  template <class O> MTLSIM_HD float operator()(float x, O& whole) const {
    float w = 0.0f;
    const float f = __builtin_modff(x, &w);
    whole = O(w);
    return f;
  }
};
struct sincos_fn {
  template <class O> MTLSIM_HD float operator()(float x, O& c) const {
    c = O(__builtin_cosf(x));
    return __builtin_sinf(x);
  }
};

}  // namespace __detail

// ---------------------------------------------------------------- lane functions

#define MTLSIM_PUBLIC1(name, Result, Kind)                                    \
  template <class X, class R = __detail::Result<__detail::Kind, X>>           \
  MTLSIM_HD MTLSIM_INLINE R name(const X& x) { return __detail::map<R>(__detail::name##_fn{}, x); }
#define MTLSIM_PUBLIC2(name, Result, Kind)                                    \
  template <class X, class Y, class R = __detail::Result<__detail::Kind, X, Y>> \
  MTLSIM_HD MTLSIM_INLINE R name(const X& x, const Y& y) { return __detail::map<R>(__detail::name##_fn{}, x, y); }
#define MTLSIM_PUBLIC3(name, Result, Kind)                                          \
  template <class X, class Y, class Z, class R = __detail::Result<__detail::Kind, X, Y, Z>> \
  MTLSIM_HD MTLSIM_INLINE R name(const X& x, const Y& y, const Z& z) {              \
    return __detail::map<R>(__detail::name##_fn{}, x, y, z);                         \
  }
#define MTLSIM_FUNCTOR(name, signature, expr) \
  namespace __detail { struct name##_fn { signature const { return expr; } }; }

#define MTLSIM_FLOAT_FN1(X)                                                                                    \
  X(fabs, __builtin_fabsf(x)) X(exp, __builtin_expf(x)) X(exp2, __builtin_exp2f(x))                              \
  X(exp10, __builtin_powf(10.0f, x)) X(log, __builtin_logf(x)) X(log2, __builtin_log2f(x))                       \
  X(log10, __builtin_log10f(x)) X(sqrt, __builtin_sqrtf(x)) X(rsqrt, 1.0f / __builtin_sqrtf(x))                  \
  X(sin, __builtin_sinf(x)) X(cos, __builtin_cosf(x)) X(tan, __builtin_tanf(x)) X(asin, __builtin_asinf(x))      \
  X(acos, __builtin_acosf(x)) X(atan, __builtin_atanf(x)) X(sinh, __builtin_sinhf(x))                            \
  X(cosh, __builtin_coshf(x)) X(tanh, __builtin_tanhf(x)) X(asinh, __builtin_asinhf(x))                          \
  X(acosh, __builtin_acoshf(x)) X(atanh, __builtin_atanhf(x)) X(sinpi, __detail::sinpi_(x))                      \
  X(cospi, __detail::cospi_(x)) X(tanpi, __detail::tanpi_(x)) X(floor, __builtin_floorf(x))                      \
  X(ceil, __builtin_ceilf(x)) X(round, __builtin_roundf(x)) X(rint, __builtin_rintf(x))                          \
  X(trunc, __builtin_truncf(x)) X(fract, __detail::fract_(x))                                                    \
  X(saturate, __detail::fmin_(__detail::fmax_(x, 0.0f), 1.0f)) X(sign, __detail::sign_(x))
#define MTLSIM_FLOAT_FN2(X)                                                                                    \
  X(pow, __builtin_powf(x, y)) X(powr, x < 0.0f ? __builtin_nanf("") : __builtin_powf(x, y))                     \
  X(atan2, __builtin_atan2f(x, y)) X(fmod, __builtin_fmodf(x, y)) X(copysign, __builtin_copysignf(x, y))         \
  X(fdim, __builtin_fdimf(x, y)) X(fmin, __detail::fmin_(x, y)) X(fmax, __detail::fmax_(x, y))                   \
  X(step, y < x ? 0.0f : 1.0f) X(divide, x / y)
#define MTLSIM_FLOAT_FN3(X)                                                                                    \
  X(fma, __builtin_fmaf(x, y, z)) X(mix, x + (y - x) * z) X(smoothstep, __detail::smoothstep_(x, y, z))          \
  X(fmax3, __detail::fmax_(__detail::fmax_(x, y), z)) X(fmin3, __detail::fmin_(__detail::fmin_(x, y), z))        \
  X(fmedian3, __detail::fmax_(__detail::fmin_(x, y), __detail::fmin_(__detail::fmax_(x, y), z)))
#define MTLSIM_INT_FN1(X)                                                                                      \
  X(clz, T(x ? __builtin_clzll(__detail::ull(__detail::uint_t<T>(x))) - (64 - __detail::bits_v<T>) : __detail::bits_v<T>)) \
  X(ctz, T(x ? __builtin_ctzll(__detail::ull(__detail::uint_t<T>(x))) : __detail::bits_v<T>))                   \
  X(popcount, T(__builtin_popcountll(__detail::ull(__detail::uint_t<T>(x))))) X(reverse_bits, __detail::reverse_bits_(x))
#define MTLSIM_INT_FN2(X)                                                                                      \
  X(absdiff, T(x < y ? __detail::wrap_t<T>(y) - __detail::wrap_t<T>(x) : __detail::wrap_t<T>(x) - __detail::wrap_t<T>(y))) \
  X(addsat, __detail::saturate_to<T>(__detail::wide_t(x) + y)) X(subsat, __detail::saturate_to<T>(__detail::wide_t(x) - y)) \
  X(hadd, T((x >> 1) + (y >> 1) + (x & y & 1))) X(rhadd, T((x >> 1) + (y >> 1) + ((x | y) & 1)))                  \
  X(mulhi, __detail::mulhi_(x, y)) X(mul24, T(__detail::ull(x) * __detail::ull(y))) X(rotate, __detail::rotate_(x, y))
#define MTLSIM_INT_FN3(X)                                                                                      \
  X(mad24, T(__detail::ull(x) * __detail::ull(y) + __detail::ull(z)))                                            \
  X(madhi, T(__detail::ull(__detail::mulhi_(x, y)) + __detail::ull(z))) X(madsat, __detail::madsat_(x, y, z))
#define MTLSIM_FLOAT_PREDICATES(X)                                                                             \
  X(isnan, __builtin_isnan(x)) X(isinf, __builtin_isinf(x)) X(isfinite, __builtin_isfinite(x))                   \
  X(signbit, __builtin_signbit(x) != 0)

#define MTLSIM_DEFINE_FLOAT1(name, expr) \
  MTLSIM_FUNCTOR(name, MTLSIM_HD float operator()(float x), expr) MTLSIM_PUBLIC1(name, result_t, floating_elem)
#define MTLSIM_DEFINE_FLOAT2(name, expr) \
  MTLSIM_FUNCTOR(name, MTLSIM_HD float operator()(float x, float y), expr) MTLSIM_PUBLIC2(name, float_result_t, floating_elem)
#define MTLSIM_DEFINE_FLOAT3(name, expr)                                                  \
  MTLSIM_FUNCTOR(name, MTLSIM_HD float operator()(float x, float y, float z), expr)       \
  MTLSIM_PUBLIC3(name, float_result_t, floating_elem)
#define MTLSIM_DEFINE_INT1(name, expr) \
  MTLSIM_FUNCTOR(name, template <class T> MTLSIM_HD T operator()(T x), expr) MTLSIM_PUBLIC1(name, result_t, integer_elem)
#define MTLSIM_DEFINE_INT2(name, expr) \
  MTLSIM_FUNCTOR(name, template <class T> MTLSIM_HD T operator()(T x, T y), expr) MTLSIM_PUBLIC2(name, result_t, integer_elem)
#define MTLSIM_DEFINE_INT3(name, expr)                                               \
  MTLSIM_FUNCTOR(name, template <class T> MTLSIM_HD T operator()(T x, T y, T z), expr) \
  MTLSIM_PUBLIC3(name, result_t, integer_elem)
#define MTLSIM_DEFINE_PREDICATE(name, expr) \
  MTLSIM_FUNCTOR(name, MTLSIM_HD bool operator()(float x), expr) MTLSIM_PUBLIC1(name, bool_result_t, floating_elem)

MTLSIM_FLOAT_FN1(MTLSIM_DEFINE_FLOAT1)
MTLSIM_FLOAT_FN2(MTLSIM_DEFINE_FLOAT2)
MTLSIM_FLOAT_FN3(MTLSIM_DEFINE_FLOAT3)
MTLSIM_INT_FN1(MTLSIM_DEFINE_INT1)
MTLSIM_INT_FN2(MTLSIM_DEFINE_INT2)
MTLSIM_INT_FN3(MTLSIM_DEFINE_INT3)
MTLSIM_FLOAT_PREDICATES(MTLSIM_DEFINE_PREDICATE)
MTLSIM_FUNCTOR(isordered, MTLSIM_HD bool operator()(float x, float y), !__builtin_isunordered(x, y))
MTLSIM_FUNCTOR(isunordered, MTLSIM_HD bool operator()(float x, float y), __builtin_isunordered(x, y))
MTLSIM_PUBLIC1(isnormal, bool_result_t, floating_elem)
MTLSIM_PUBLIC2(isordered, bool_result_t, floating_elem)
MTLSIM_PUBLIC2(isunordered, bool_result_t, floating_elem)
MTLSIM_PUBLIC2(nextafter, result_t, floating_elem)
MTLSIM_PUBLIC1(abs, result_t, numeric_elem)
MTLSIM_PUBLIC2(min, result_t, numeric_elem)
MTLSIM_PUBLIC2(max, result_t, numeric_elem)
MTLSIM_PUBLIC3(clamp, result_t, numeric_elem)
MTLSIM_PUBLIC3(max3, result_t, numeric_elem)
MTLSIM_PUBLIC3(min3, result_t, numeric_elem)
MTLSIM_PUBLIC3(median3, result_t, numeric_elem)

template <class X, class R = __detail::result_t<__detail::integer_elem, X>>
MTLSIM_HD MTLSIM_INLINE R extract_bits(const X& x, uint offset, uint bits) {
  return __detail::map<R>(__detail::extract_bits_fn{}, x, offset, bits);
}
template <class X, class Y, class R = __detail::result_t<__detail::integer_elem, X, Y>>
MTLSIM_HD MTLSIM_INLINE R insert_bits(const X& base, const Y& insert, uint offset, uint bits) {
  return __detail::map<R>(__detail::insert_bits_fn{}, base, insert, offset, bits);
}

// c ? b : a, lane-wise for a bool vector c. A scalar c of any scalar type
// converts to bool, as for MSL's select(T, T, bool) (select(1, -1, bits & m)).
template <class A, class B, class C, class R = __detail::result_t<__detail::any_elem, A, B>,
          std::enable_if_t<std::is_same_v<__detail::value_t<C>, bool> ||
                               std::is_same_v<__detail::value_t<C>, __detail::rebind_t<R, bool>> ||
                               (!__detail::is_vec_like_v<R> && __detail::is_num_v<__detail::value_t<C>>), int> = 0>
MTLSIM_HD MTLSIM_INLINE R select(const A& a, const B& b, const C& c) {
  return __detail::map<R>(__detail::select_fn{}, a, b, c);
}

template <class X, class K, class R = __detail::result_t<__detail::floating_elem, X>,
          std::enable_if_t<std::is_same_v<__detail::value_t<K>, int> ||
                               std::is_same_v<__detail::value_t<K>, __detail::rebind_t<R, int>>, int> = 0>
MTLSIM_HD MTLSIM_INLINE R ldexp(const X& x, const K& k) {
  return __detail::map<R>(__detail::ldexp_fn{}, x, k);
}
template <class X, class R = __detail::result_t<__detail::floating_elem, X>>
MTLSIM_HD MTLSIM_INLINE R frexp(const X& x, __detail::rebind_t<R, int>& exponent) {
  return __detail::map_out(__detail::frexp_fn{}, R(x), exponent);
}
template <class X, class R = __detail::result_t<__detail::floating_elem, X>>
MTLSIM_HD MTLSIM_INLINE R modf(const X& x, R& whole) {
  return __detail::map_out(__detail::modf_fn{}, R(x), whole);
}
template <class X, class R = __detail::result_t<__detail::floating_elem, X>>
MTLSIM_HD MTLSIM_INLINE R sincos(const X& x, R& cosval) {
  return __detail::map_out(__detail::sincos_fn{}, R(x), cosval);
}

// -------------------------------------------------------------------- relational

template <class X, std::enable_if_t<std::is_same_v<__detail::elem_t<X>, bool>, int> = 0>
MTLSIM_HD MTLSIM_INLINE bool all(const X& x) {
  const __detail::value_t<X> v = x;
  bool r = true;
  for (int i = 0; i < __detail::lanes_v<X>; ++i) r = r && __detail::lane(v, i);
  return r;
}
template <class X, std::enable_if_t<std::is_same_v<__detail::elem_t<X>, bool>, int> = 0>
MTLSIM_HD MTLSIM_INLINE bool any(const X& x) {
  const __detail::value_t<X> v = x;
  bool r = false;
  for (int i = 0; i < __detail::lanes_v<X>; ++i) r = r || __detail::lane(v, i);
  return r;
}

// --------------------------------------------------------------------- geometric
//
// Computed on float vectors, with a single rounding of the result for half.

namespace __detail {
template <class X, class... Y>
using geometric_t = std::enable_if_t<is_vector_v<value_t<X>> && (std::is_same_v<value_t<X>, value_t<Y>> && ...) &&
                                         floating_elem<elem_t<X>>::value,
                                     value_t<X>>;
template <class X> MTLSIM_HD vec<float, lanes_v<X>> to_float(const X& x) {
  return vec<float, lanes_v<X>>(value_t<X>(x));
}
template <int N> MTLSIM_HD float fdot(const vec<float, N>& a, const vec<float, N>& b) {
  float s = 0.0f;
  for (int i = 0; i < N; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace __detail

template <class X, class Y, class V = __detail::geometric_t<X, Y>>
MTLSIM_HD MTLSIM_INLINE __detail::elem_t<V> dot(const X& x, const Y& y) {
  return __detail::elem_t<V>(__detail::fdot(__detail::to_float(x), __detail::to_float(y)));
}
template <class X, class V = __detail::geometric_t<X>>
MTLSIM_HD MTLSIM_INLINE __detail::elem_t<V> length_squared(const X& x) {
  const auto f = __detail::to_float(x);
  return __detail::elem_t<V>(__detail::fdot(f, f));
}
template <class X, class V = __detail::geometric_t<X>>
MTLSIM_HD MTLSIM_INLINE __detail::elem_t<V> length(const X& x) {
  const auto f = __detail::to_float(x);
  return __detail::elem_t<V>(__builtin_sqrtf(__detail::fdot(f, f)));
}
template <class X, class Y, class V = __detail::geometric_t<X, Y>>
MTLSIM_HD MTLSIM_INLINE __detail::elem_t<V> distance_squared(const X& x, const Y& y) {
  const auto d = __detail::to_float(x) - __detail::to_float(y);
  return __detail::elem_t<V>(__detail::fdot(d, d));
}
template <class X, class Y, class V = __detail::geometric_t<X, Y>>
MTLSIM_HD MTLSIM_INLINE __detail::elem_t<V> distance(const X& x, const Y& y) {
  const auto d = __detail::to_float(x) - __detail::to_float(y);
  return __detail::elem_t<V>(__builtin_sqrtf(__detail::fdot(d, d)));
}
template <class X, class V = __detail::geometric_t<X>>
MTLSIM_HD MTLSIM_INLINE V normalize(const X& x) {
  const auto f = __detail::to_float(x);
  return V(f * (1.0f / __builtin_sqrtf(__detail::fdot(f, f))));
}
template <class X, class Y, class V = __detail::geometric_t<X, Y>, std::enable_if_t<__detail::lanes_v<V> == 3, int> = 0>
MTLSIM_HD MTLSIM_INLINE V cross(const X& x, const Y& y) {
  const auto a = __detail::to_float(x), b = __detail::to_float(y);
  return V(a.yzx * b.zxy - a.zxy * b.yzx);
}
template <class X, class Y, class Z, class V = __detail::geometric_t<X, Y, Z>>
MTLSIM_HD MTLSIM_INLINE V faceforward(const X& n, const Y& i, const Z& nref) {
  return __detail::fdot(__detail::to_float(nref), __detail::to_float(i)) < 0.0f ? V(n) : V(-V(n));
}
template <class X, class Y, class V = __detail::geometric_t<X, Y>>
MTLSIM_HD MTLSIM_INLINE V reflect(const X& i, const Y& n) {
  const auto fi = __detail::to_float(i), fn = __detail::to_float(n);
  return V(fi - 2.0f * __detail::fdot(fn, fi) * fn);
}
template <class X, class Y, class V = __detail::geometric_t<X, Y>>
MTLSIM_HD MTLSIM_INLINE V refract(const X& i, const Y& n, __detail::elem_t<V> eta) {
  const auto fi = __detail::to_float(i), fn = __detail::to_float(n);
  const float e = eta, d = __detail::fdot(fn, fi), k = 1.0f - e * e * (1.0f - d * d);
  return k < 0.0f ? V(0) : V(e * fi - (e * d + __builtin_sqrtf(k)) * fn);
}

// ----------------------------------------------------------------------- as_type

// Vectors are not trivially copyable (see swizzle in vec.h), as
// __builtin_bit_cast requires, but their bytes are still just their lanes.
template <class To, class From> MTLSIM_HD MTLSIM_INLINE To as_type(const From& x) {
  using F = __detail::value_t<From>;
  static_assert(sizeof(To) == sizeof(F), "as_type converts between types of the same size");
  const F from(x);
  To to;
  __builtin_memcpy(static_cast<void*>(&to), &from, sizeof to);
  return to;
}

// ----------------------------------------------------------- fast:: and precise::

#define MTLSIM_USING(name, ...) using metal::name;
#define MTLSIM_FLOAT_NAMES                                                                            \
  MTLSIM_FLOAT_FN1(MTLSIM_USING) MTLSIM_FLOAT_FN2(MTLSIM_USING) MTLSIM_FLOAT_FN3(MTLSIM_USING)        \
  using metal::abs; using metal::min; using metal::max; using metal::clamp; using metal::max3;          \
  using metal::min3; using metal::median3; using metal::nextafter; using metal::ldexp;                 \
  using metal::frexp; using metal::modf; using metal::sincos; using metal::dot; using metal::length;   \
  using metal::length_squared; using metal::distance; using metal::distance_squared;                   \
  using metal::normalize; using metal::cross; using metal::faceforward; using metal::reflect;          \
  using metal::refract;
namespace fast { MTLSIM_FLOAT_NAMES }
namespace precise { MTLSIM_FLOAT_NAMES }
#undef MTLSIM_FLOAT_NAMES
#undef MTLSIM_USING

}  // namespace metal

// MSL's as_type is found from any namespace (c10::metal calls it unqualified).
using metal::as_type;
