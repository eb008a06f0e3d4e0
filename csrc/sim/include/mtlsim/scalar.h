// MSL scalar types for the CPU simulator: half, bfloat, the integer typedefs,
// metal::numeric_limits, the metal type traits and the metal_math constants.
//
// Kernels say `using namespace metal;` and call abs()/exp()/max() unqualified,
// so nothing here may drag the C library's global math/stdlib declarations in:
// only the headers below are allowed, and all math goes through builtins.
#pragma once

#include <cfloat>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "address_space.h"

#ifdef __CUDACC__
#define MTLSIM_HD __host__ __device__
#else
#define MTLSIM_HD
#endif
#define MTLSIM_INLINE inline

// _Float16 gives hardware conversions where the target has them; elsewhere
// (clang < 15 on x86) and under MTLSIM_SOFT_HALF the bit-exact software path
// below is used.
#if defined(__FLT16_MAX__) && !defined(MTLSIM_SOFT_HALF)
#define MTLSIM_HAVE_FLOAT16 1
#endif

// Identical to glibc's <sys/types.h> typedefs, so both may be seen.
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

#ifndef __CUDACC__
namespace mtlsim {
// DispatchView::flush_half_subnormals of the dispatches running, copied by
// their GPU threads (the setting is process-wide), read and written with
// relaxed atomic builtins (<atomic> here would change which abs kernels
// call). Not thread-local: that would double the cost of a half conversion.
inline bool half_subnormals_flushed = false;
}  // namespace mtlsim
#endif

namespace metal {

template <class Format> struct small_float;

namespace __detail {

template <int ExpBits, int MantBits> struct binary_format {
  static constexpr int exp_bits = ExpBits, mant_bits = MantBits;
};
using binary16 = binary_format<5, 10>;
using bfloat16 = binary_format<8, 7>;

template <class T> struct is_small_float : std::false_type {};
template <class F> struct is_small_float<small_float<F>> : std::true_type {};
template <class T> constexpr bool is_small_float_v = is_small_float<T>::value;

// Anything MSL treats as an arithmetic scalar, in any address space.
template <class T> constexpr bool is_num_v =
    std::is_arithmetic_v<mtlsim::value_type_t<T>> || is_small_float_v<mtlsim::value_type_t<T>>;

// Round-to-nearest-even of an IEEE binary value (Mant fraction bits, exponent
// bias Bias, stored in U) to binary16. NaNs are quieted, keeping the top payload
// bits, as the x86 F16C and ARM conversions do.
template <class U, int Mant, int Bias>
MTLSIM_HD constexpr uint16_t round_to_binary16(U u) {
  constexpr int top = int(sizeof(U)) * 8 - 1;
  const uint16_t sign = uint16_t((u >> top) << 15);
  const U mag = u & ~(U(1) << top);
  const U inf = (~U(0) >> 1) >> Mant << Mant;
  if (mag >= inf) return uint16_t(sign | 0x7C00 | (mag > inf ? 0x200 | (mag >> (Mant - 10) & 0x3FF) : 0));
  const int e = int(mag >> Mant) - Bias;
  if (e > 15) return uint16_t(sign | 0x7C00);
  if (e < -25) return sign;  // below half the smallest subnormal: rounds to zero
  const U m = (mag & ((U(1) << Mant) - 1)) | (U(1) << Mant);
  const int shift = Mant - 10 + (e < -14 ? -14 - e : 0);
  const U rest = m & ((U(1) << shift) - 1), halfway = U(1) << (shift - 1);
  U q = m >> shift;
  q += rest > halfway || (rest == halfway && (q & 1));
  // q carries the implicit bit, so a rounding carry moves into the exponent.
  return uint16_t(sign | (e < -14 ? q : (U(e + 14) << 10) + q));
}

MTLSIM_HD constexpr float binary16_to_float(uint16_t h) {
#ifdef MTLSIM_HAVE_FLOAT16
  return static_cast<float>(__builtin_bit_cast(_Float16, h));
#else
  const uint32_t sign = uint32_t(h & 0x8000) << 16, mag = h & 0x7FFFu;
  if (mag >= 0x7C00) return __builtin_bit_cast(float, sign | 0x7F800000u | (mag & 0x3FF) << 13 | (mag > 0x7C00 ? 0x400000u : 0));
  if (mag >= 0x400) return __builtin_bit_cast(float, sign | (mag + ((127 - 15) << 10)) << 13);
  const float sub = float(mag) * 0x1p-24f;  // exact
  return sign ? -sub : sub;
#endif
}

template <class T> MTLSIM_HD constexpr uint16_t float_to_binary16(T v) {
  // Doubles round directly (as a _Float16 cast does); everything else is exact
  // in float or beyond half's range, so going through float is not a double rounding.
  using Src = std::conditional_t<std::is_floating_point_v<T>, T, float>;
#ifdef MTLSIM_HAVE_FLOAT16
  return __builtin_bit_cast(uint16_t, static_cast<_Float16>(static_cast<Src>(v)));
#else
  if constexpr (sizeof(Src) > sizeof(float))
    return round_to_binary16<uint64_t, 52, 1023>(__builtin_bit_cast(uint64_t, static_cast<double>(v)));
  else
    return round_to_binary16<uint32_t, 23, 127>(__builtin_bit_cast(uint32_t, static_cast<float>(v)));
#endif
}

// Same rounding as c10::BFloat16 (everything goes through float, NaN -> 0x7FC0).
template <class T> MTLSIM_HD constexpr uint16_t float_to_bfloat16(T v) {
  const uint32_t u = __builtin_bit_cast(uint32_t, static_cast<float>(v));
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

// A subnormal half as the zero of its sign where the dispatch flushes them.
MTLSIM_HD constexpr uint16_t flushed_binary16(uint16_t h) {
#ifndef __CUDACC__
  if ((h & 0x7C00) == 0 && !__builtin_is_constant_evaluated() &&
      __atomic_load_n(&mtlsim::half_subnormals_flushed, __ATOMIC_RELAXED))
    return uint16_t(h & 0x8000);
#endif
  return h;
}

MTLSIM_HD constexpr uint16_t to_bits(binary16, float f) { return flushed_binary16(float_to_binary16(f)); }
MTLSIM_HD constexpr uint16_t to_bits(binary16, double d) { return flushed_binary16(float_to_binary16(d)); }
MTLSIM_HD constexpr uint16_t to_bits(binary16, long double d) { return flushed_binary16(float_to_binary16(d)); }
MTLSIM_HD constexpr uint16_t to_bits(bfloat16, float f) { return float_to_bfloat16(f); }
MTLSIM_HD constexpr float from_bits(binary16, uint16_t h) { return binary16_to_float(flushed_binary16(h)); }
MTLSIM_HD constexpr float from_bits(bfloat16, uint16_t b) { return __builtin_bit_cast(float, uint32_t(b) << 16); }

// Result type of a binary operation involving half/bfloat: the 16-bit type
// absorbs integers, anything wider (or the other 16-bit type) gives float.
template <class A, class B>
using mixed_t = std::enable_if_t<(is_small_float_v<A> || is_small_float_v<B>) && is_num_v<A> && is_num_v<B> &&
                                     mtlsim::all_thread_v<A, B>,
                                 std::conditional_t<std::is_same_v<A, B>, A,
                                 std::conditional_t<std::is_integral_v<A>, B,
                                 std::conditional_t<std::is_integral_v<B>, A, float>>>>;

struct bits_tag {};

}  // namespace __detail

// 16-bit float stored as its bit pattern; arithmetic is done in float and
// rounded once per operation, which is exact for + - * / of two 16-bit values.
template <class Format> struct small_float {
  uint16_t bits;

  small_float() = default;
  template <class T, std::enable_if_t<__detail::is_num_v<T> && !std::is_same_v<T, small_float>, int> = 0>
  MTLSIM_HD constexpr small_float(T v)
      : bits(__detail::to_bits(Format{}, std::conditional_t<std::is_floating_point_v<T>, T, float>(v))) {}
  MTLSIM_HD constexpr small_float(__detail::bits_tag, uint16_t b) : bits(b) {}
  MTLSIM_HD static constexpr small_float from_bits(uint16_t b) { return small_float(__detail::bits_tag{}, b); }

  MTLSIM_HD constexpr operator float() const { return __detail::from_bits(Format{}, bits); }
  MTLSIM_SPACE_MEMBERS(small_float)
  MTLSIM_SPACE_CONVERSION(float)

  MTLSIM_HD constexpr small_float operator+() const { return *this; }
  MTLSIM_HD constexpr small_float operator-() const { return from_bits(uint16_t(bits ^ 0x8000)); }
  MTLSIM_HD constexpr small_float& operator++() { return *this = small_float(float(*this) + 1.0f); }
  MTLSIM_HD constexpr small_float& operator--() { return *this = small_float(float(*this) - 1.0f); }
  MTLSIM_HD constexpr small_float operator++(int) { small_float t = *this; ++*this; return t; }
  MTLSIM_HD constexpr small_float operator--(int) { small_float t = *this; --*this; return t; }

#define MTLSIM_SMALL_COMPOUND(op) \
  template <class B, std::enable_if_t<mtlsim::all_thread_v<B>, int> = 0>                                  \
  MTLSIM_HD constexpr small_float& operator op##=(const B& b) { return *this = small_float(*this op b); }
  MTLSIM_SMALL_COMPOUND(+) MTLSIM_SMALL_COMPOUND(-) MTLSIM_SMALL_COMPOUND(*) MTLSIM_SMALL_COMPOUND(/)
#undef MTLSIM_SMALL_COMPOUND
};

using half = small_float<__detail::binary16>;
using bfloat = small_float<__detail::bfloat16>;

// Exact-match templates, so they win over the built-in operators reachable
// through the implicit conversions in both directions.
#define MTLSIM_SMALL_ARITH(op)                                                           \
  template <class A, class B, class R = __detail::mixed_t<A, B>>                         \
  MTLSIM_HD constexpr R operator op(const A& a, const B& b) { return R(float(R(a)) op float(R(b))); }
#define MTLSIM_SMALL_COMPARE(op)                                                         \
  template <class A, class B, class R = __detail::mixed_t<A, B>>                         \
  MTLSIM_HD constexpr bool operator op(const A& a, const B& b) { return float(R(a)) op float(R(b)); }
MTLSIM_SMALL_ARITH(+) MTLSIM_SMALL_ARITH(-) MTLSIM_SMALL_ARITH(*) MTLSIM_SMALL_ARITH(/)
MTLSIM_SMALL_COMPARE(==) MTLSIM_SMALL_COMPARE(!=) MTLSIM_SMALL_COMPARE(<)
MTLSIM_SMALL_COMPARE(<=) MTLSIM_SMALL_COMPARE(>) MTLSIM_SMALL_COMPARE(>=)
#undef MTLSIM_SMALL_ARITH
#undef MTLSIM_SMALL_COMPARE

// ---------------------------------------------------------------- numeric_limits

template <class T> struct numeric_limits : std::numeric_limits<T> {};

template <class F> struct numeric_limits<small_float<F>> {
 private:
  using T = small_float<F>;
  static constexpr int E = F::exp_bits, M = F::mant_bits, bias = (1 << (E - 1)) - 1;
  static constexpr bool is_half = E == 5;
  MTLSIM_HD static constexpr T make(int b) { return T::from_bits(uint16_t(b)); }

 public:
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false, is_exact = false,
                        has_infinity = true, has_quiet_NaN = true, has_signaling_NaN = true,
                        has_denorm_loss = false, is_iec559 = true, is_bounded = true, is_modulo = false,
                        traps = false, tinyness_before = false;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr int radix = 2, digits = M + 1, min_exponent = 2 - bias, max_exponent = bias + 1;
  static constexpr int digits10 = is_half ? 3 : 2, max_digits10 = is_half ? 5 : 4;
  static constexpr int min_exponent10 = is_half ? -4 : -37, max_exponent10 = is_half ? 4 : 38;

  MTLSIM_HD static constexpr T min() { return make(1 << M); }
  MTLSIM_HD static constexpr T max() { return make((((1 << E) - 1) << M) - 1); }
  MTLSIM_HD static constexpr T lowest() { return make(0x8000 | ((((1 << E) - 1) << M) - 1)); }
  MTLSIM_HD static constexpr T epsilon() { return make((bias - M) << M); }
  MTLSIM_HD static constexpr T round_error() { return make((bias - 1) << M); }
  MTLSIM_HD static constexpr T infinity() { return make(((1 << E) - 1) << M); }
  MTLSIM_HD static constexpr T quiet_NaN() { return make(((1 << E) - 1) << M | 1 << (M - 1)); }
  MTLSIM_HD static constexpr T signaling_NaN() { return make(((1 << E) - 1) << M | 1 << (M - 2)); }
  MTLSIM_HD static constexpr T denorm_min() { return make(1); }
};

// ------------------------------------------------------------------- type traits

using std::bool_constant;
using std::declval;
using std::false_type;
using std::integral_constant;
using std::true_type;

// What <metal_type_traits> shares with <type_traits> (not is_empty and void_t, which MLX's
// steel/utils/type_traits.h defines in namespace metal itself).
#define MTLSIM_STD_VALUE_TRAIT(name) using std::name; using std::name##_v;
#define MTLSIM_STD_TYPE_TRAIT(name) using std::name; using std::name##_t;
MTLSIM_STD_VALUE_TRAIT(is_same) MTLSIM_STD_VALUE_TRAIT(is_integral) MTLSIM_STD_VALUE_TRAIT(is_unsigned)
MTLSIM_STD_VALUE_TRAIT(is_void) MTLSIM_STD_VALUE_TRAIT(is_const) MTLSIM_STD_VALUE_TRAIT(is_volatile)
MTLSIM_STD_VALUE_TRAIT(is_pointer) MTLSIM_STD_VALUE_TRAIT(is_reference) MTLSIM_STD_VALUE_TRAIT(is_array)
MTLSIM_STD_VALUE_TRAIT(is_class) MTLSIM_STD_VALUE_TRAIT(is_enum) MTLSIM_STD_VALUE_TRAIT(is_convertible)
MTLSIM_STD_VALUE_TRAIT(is_base_of) MTLSIM_STD_VALUE_TRAIT(is_union) MTLSIM_STD_VALUE_TRAIT(is_function)
MTLSIM_STD_VALUE_TRAIT(is_lvalue_reference) MTLSIM_STD_VALUE_TRAIT(is_rvalue_reference)
MTLSIM_STD_VALUE_TRAIT(is_null_pointer) MTLSIM_STD_VALUE_TRAIT(is_member_pointer)
MTLSIM_STD_VALUE_TRAIT(is_fundamental) MTLSIM_STD_VALUE_TRAIT(is_compound) MTLSIM_STD_VALUE_TRAIT(is_object)
MTLSIM_STD_VALUE_TRAIT(is_trivially_copyable)
MTLSIM_STD_VALUE_TRAIT(is_trivially_destructible) MTLSIM_STD_VALUE_TRAIT(is_constructible)
MTLSIM_STD_VALUE_TRAIT(is_default_constructible) MTLSIM_STD_VALUE_TRAIT(is_assignable)
MTLSIM_STD_VALUE_TRAIT(rank) MTLSIM_STD_VALUE_TRAIT(extent) MTLSIM_STD_VALUE_TRAIT(alignment_of)
MTLSIM_STD_VALUE_TRAIT(conjunction) MTLSIM_STD_VALUE_TRAIT(disjunction) MTLSIM_STD_VALUE_TRAIT(negation)
MTLSIM_STD_TYPE_TRAIT(enable_if) MTLSIM_STD_TYPE_TRAIT(conditional) MTLSIM_STD_TYPE_TRAIT(make_unsigned)
MTLSIM_STD_TYPE_TRAIT(make_signed) MTLSIM_STD_TYPE_TRAIT(remove_cv) MTLSIM_STD_TYPE_TRAIT(remove_const)
MTLSIM_STD_TYPE_TRAIT(remove_volatile) MTLSIM_STD_TYPE_TRAIT(remove_reference) MTLSIM_STD_TYPE_TRAIT(decay)
MTLSIM_STD_TYPE_TRAIT(add_const) MTLSIM_STD_TYPE_TRAIT(underlying_type) MTLSIM_STD_TYPE_TRAIT(remove_pointer)
MTLSIM_STD_TYPE_TRAIT(add_pointer) MTLSIM_STD_TYPE_TRAIT(add_volatile) MTLSIM_STD_TYPE_TRAIT(add_cv)
MTLSIM_STD_TYPE_TRAIT(add_lvalue_reference) MTLSIM_STD_TYPE_TRAIT(add_rvalue_reference)
MTLSIM_STD_TYPE_TRAIT(remove_extent) MTLSIM_STD_TYPE_TRAIT(remove_all_extents) MTLSIM_STD_TYPE_TRAIT(common_type)
#undef MTLSIM_STD_VALUE_TRAIT
#undef MTLSIM_STD_TYPE_TRAIT

// The std trait, widened to count half and bfloat as floating point.
#define MTLSIM_WIDENED_TRAIT(name)                                                                     \
  template <class T> struct name                                                                       \
      : bool_constant<std::name##_v<T> || __detail::is_small_float_v<std::remove_cv_t<T>>> {};         \
  template <class T> inline constexpr bool name##_v = name<T>::value;
MTLSIM_WIDENED_TRAIT(is_floating_point)
MTLSIM_WIDENED_TRAIT(is_arithmetic)
MTLSIM_WIDENED_TRAIT(is_signed)
MTLSIM_WIDENED_TRAIT(is_scalar)
#undef MTLSIM_WIDENED_TRAIT

}  // namespace metal

using metal::bfloat;
using metal::half;

// ---------------------------------------------------------- metal_math constants

// Spelled as glibc does, so a later <math.h> redefines them identically.
#ifndef INFINITY
#define INFINITY (__builtin_inff ())
#endif
#ifndef NAN
#define NAN (__builtin_nanf (""))
#endif
#ifndef HUGE_VALF
#define HUGE_VALF (__builtin_huge_valf ())
#endif
#ifndef MAXFLOAT
#define MAXFLOAT	3.40282347e+38F
#endif

#define HUGE_VALH (::metal::numeric_limits<::metal::half>::infinity())
#define MAXHALF (::metal::numeric_limits<::metal::half>::max())
#define HALF_MAX (::metal::numeric_limits<::metal::half>::max())
#define HALF_MIN (::metal::numeric_limits<::metal::half>::min())
#define HALF_EPSILON (::metal::numeric_limits<::metal::half>::epsilon())
#define HALF_DIG 3
#define HALF_MANT_DIG 11
#define HALF_MAX_10_EXP 4
#define HALF_MAX_EXP 16
#define HALF_MIN_10_EXP (-4)
#define HALF_MIN_EXP (-13)
#define HALF_RADIX 2

#define M_E_F 2.71828182845904523536028747135266250f
#define M_LOG2E_F 1.44269504088896340735992468100189214f
#define M_LOG10E_F 0.434294481903251827651128918916605082f
#define M_LN2_F 0.693147180559945309417232121458176568f
#define M_LN10_F 2.30258509299404568401799145468436421f
#define M_PI_F 3.14159265358979323846264338327950288f
#define M_PI_2_F 1.57079632679489661923132169163975144f
#define M_PI_4_F 0.785398163397448309615660845819875721f
#define M_1_PI_F 0.318309886183790671537767526745028724f
#define M_2_PI_F 0.636619772367581343075535053490057448f
#define M_2_SQRTPI_F 1.12837916709551257389615890312154517f
#define M_SQRT2_F 1.41421356237309504880168872420969808f
#define M_SQRT1_2_F 0.707106781186547524400844362104849039f

#define M_E_H (::metal::half(M_E_F))
#define M_LOG2E_H (::metal::half(M_LOG2E_F))
#define M_LOG10E_H (::metal::half(M_LOG10E_F))
#define M_LN2_H (::metal::half(M_LN2_F))
#define M_LN10_H (::metal::half(M_LN10_F))
#define M_PI_H (::metal::half(M_PI_F))
#define M_PI_2_H (::metal::half(M_PI_2_F))
#define M_PI_4_H (::metal::half(M_PI_4_F))
#define M_1_PI_H (::metal::half(M_1_PI_F))
#define M_2_PI_H (::metal::half(M_2_PI_F))
#define M_2_SQRTPI_H (::metal::half(M_2_SQRTPI_F))
#define M_SQRT2_H (::metal::half(M_SQRT2_F))
#define M_SQRT1_2_H (::metal::half(M_SQRT1_2_F))
