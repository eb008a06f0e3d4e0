// Tests of the simulator's MSL value types and math library (mtlsim/scalar.h,
// vec.h, math.h). Prints "OK" and exits 0 when every check passes.
//
// Only the mtlsim headers are included -- output goes through builtins -- so
// the unqualified calls below also prove that the headers leave the global
// namespace free of the C library's abs/exp/max.
#include "mtlsim/math.h"

using namespace metal;

namespace {

int failures = 0;

void check(bool ok, const char* what, int line) {
  if (ok) return;
  if (++failures <= 20) __builtin_printf("FAILED line %d: %s\n", line, what);
}
#define CHECK(...) check(bool(__VA_ARGS__), #__VA_ARGS__, __LINE__)

template <class A, class B> constexpr bool same = std::is_same_v<A, B>;
bool is_nan(float x) { return x != x; }
bool near(float a, float b, float tol = 2e-6f) { return __builtin_fabsf(a - b) <= tol * (1.0f + __builtin_fabsf(b)); }
float f32(uint32_t u) { return __builtin_bit_cast(float, u); }
uint32_t u32(float f) { return __builtin_bit_cast(uint32_t, f); }

// --------------------------------------------------------------- unqualified calls

static_assert(same<decltype(abs(-1)), int>);
static_assert(same<decltype(abs(-1.0f)), float>);
static_assert(same<decltype(max(1, 2)), int>);
static_assert(same<decltype(min(1u, 2u)), uint>);
static_assert(same<decltype(exp(1.0f)), float>);
static_assert(same<decltype(fmax(half(1), half(2))), half>);
static_assert(same<decltype(pow(2.0f, 3.0f)), float>);

// ------------------------------------------------------------- overload resolution

static_assert(same<decltype(half() + 1.0f), float>);
static_assert(same<decltype(1.0f * half()), float>);
static_assert(same<decltype(half() + 1.0), float>);
static_assert(same<decltype(half() + 1), half>);
static_assert(same<decltype(2u * half()), half>);
static_assert(same<decltype(half() * half()), half>);
static_assert(same<decltype(-half()), half>);
static_assert(same<decltype(half() < 1), bool>);
static_assert(same<decltype(bfloat() + bfloat()), bfloat>);
static_assert(same<decltype(bfloat() + 1), bfloat>);
static_assert(same<decltype(bfloat() + 1.0f), float>);
static_assert(same<decltype(half() + bfloat()), float>);
static_assert(same<decltype(float4() * 2), float4>);
static_assert(same<decltype(half4() * 2.0f), half4>);
static_assert(same<decltype(2.0 * half4()), half4>);
static_assert(same<decltype(int4() % 3), int4>);
static_assert(same<decltype(float4() == float4()), bool4>);
static_assert(same<decltype(float4() < 1.0f), bool4>);
static_assert(same<decltype(!int2()), bool2>);
static_assert(same<decltype(int3() && int3()), bool3>);
static_assert(same<decltype(float4().xy + float2()), float2>);
static_assert(same<decltype(packed_float3() + packed_float3()), float3>);
static_assert(same<decltype(exp(half())), half>);
static_assert(same<decltype(exp(half4())), half4>);
static_assert(same<decltype(sqrt(float4().xyz)), float3>);
static_assert(same<decltype(abs(int4())), int4>);
static_assert(same<decltype(max(float4().xy, float4().zw)), float2>);
static_assert(same<decltype(clamp(float4(), 0.0f, 1.0f)), float4>);
static_assert(same<decltype(dot(half3(), half3())), half>);
static_assert(same<decltype(isnan(float4())), bool4>);
static_assert(same<decltype(isnan(1.0f)), bool>);
static_assert(same<decltype(select(int2(), int2(), bool2())), int2>);
static_assert(same<decltype(as_type<half2>(1u)), half2>);

template <class...> using void_t = void;
template <class A, class B, class = void> struct can_max : false_type {};
template <class A, class B> struct can_max<A, B, void_t<decltype(max(A(), B()))>> : true_type {};
template <class A, class B, class = void> struct can_add : false_type {};
template <class A, class B> struct can_add<A, B, void_t<decltype(A() + B())>> : true_type {};
template <class A, class = void> struct can_exp : false_type {};
template <class A> struct can_exp<A, void_t<decltype(exp(A()))>> : true_type {};
static_assert(!can_max<float, int>::value && !can_max<half, float>::value && !can_max<int, uint>::value);
static_assert(can_max<float4, float>::value && !can_max<float4, int>::value && !can_max<float4, float3>::value);
static_assert(!can_add<float4, half4>::value && !can_add<float4, float2>::value);
static_assert(!can_exp<int>::value && !can_exp<int4>::value && can_exp<bfloat2>::value);

// ------------------------------------------------------------------------- layouts

#define LAYOUT(T, size, align) static_assert(sizeof(T) == (size) && alignof(T) == (align), #T);
LAYOUT(half, 2, 2) LAYOUT(bfloat, 2, 2)
LAYOUT(float2, 8, 8) LAYOUT(float3, 16, 16) LAYOUT(float4, 16, 16)
LAYOUT(half2, 4, 4) LAYOUT(half3, 8, 8) LAYOUT(half4, 8, 8) LAYOUT(bfloat3, 8, 8)
LAYOUT(char2, 2, 2) LAYOUT(char3, 4, 4) LAYOUT(uchar4, 4, 4) LAYOUT(bool3, 4, 4)
LAYOUT(int3, 16, 16) LAYOUT(ushort3, 8, 8) LAYOUT(long3, 32, 32) LAYOUT(ulong2, 16, 16)
LAYOUT(packed_float3, 12, 4) LAYOUT(packed_half3, 6, 2) LAYOUT(packed_uchar3, 3, 1) LAYOUT(packed_int4, 16, 4)
#undef LAYOUT

template <class T> constexpr bool plain_v = std::is_trivially_copyable_v<T> && std::is_trivially_default_constructible_v<T> &&
                                            std::is_standard_layout_v<T>;
static_assert(plain_v<half> && plain_v<bfloat>);
// Vectors define their copy assignment, as swizzle assignments must not touch
// unnamed lanes (see swizzle in vec.h); the rest stays trivial.
template <class T> constexpr bool plain_vec_v = std::is_trivially_default_constructible_v<T> &&
                                                std::is_trivially_copy_constructible_v<T> &&
                                                std::is_trivially_destructible_v<T> && std::is_standard_layout_v<T>;
static_assert(plain_vec_v<float3> && plain_vec_v<half4> && plain_vec_v<bool2> && plain_vec_v<packed_float3>);
static_assert(plain_vec_v<ulong4> && plain_vec_v<bfloat2> && plain_vec_v<packed_uchar2>);
static_assert(same<metal::float4, ::float4> && same<metal::vec<float, 4>, float4> && same<metal::packed_vec<half, 2>, packed_half2>);

// ----------------------------------------------------------- constants and traits

constexpr half k_half = 1.5f;
static_assert(k_half.bits == 0x3E00 && half(-2).bits == 0xC000 && half(0.1).bits == 0x2E66);
static_assert(bfloat(1.0f).bits == 0x3F80);
constexpr float4 k_vec(1, 2, 3, 4);
static_assert(k_vec[3] == 4.0f);

static_assert(is_floating_point_v<half> && is_floating_point_v<bfloat> && is_floating_point_v<const float>);
static_assert(is_arithmetic_v<half> && is_scalar_v<bfloat> && is_signed_v<half> && !is_unsigned_v<half>);
static_assert(is_integral_v<ushort> && !is_integral_v<half> && is_signed_v<int> && is_unsigned_v<uchar>);
static_assert(is_vector_v<float4> && !is_vector_v<float> && vec_elements<float3>::value == 3 && vec_elements_v<int> == 1);
static_assert(same<make_unsigned_t<int>, uint> && same<make_signed_t<ushort>, short> && same<decay_t<const int&>, int>);
static_assert(same<remove_cv_t<const volatile half>, half> && same<remove_reference_t<float4&>, float4>);
static_assert(same<conditional_t<true, half, float>, half> && same<enable_if_t<true, int>, int>);
static_assert(integral_constant<int, 3>::value == 3 && true_type::value && !false_type::value && is_same_v<uint, unsigned>);

static_assert(numeric_limits<half>::max().bits == 0x7BFF && numeric_limits<half>::lowest().bits == 0xFBFF);
static_assert(numeric_limits<half>::min().bits == 0x0400 && numeric_limits<half>::denorm_min().bits == 0x0001);
static_assert(numeric_limits<half>::epsilon().bits == 0x1400 && numeric_limits<half>::infinity().bits == 0x7C00);
static_assert(numeric_limits<half>::quiet_NaN().bits == 0x7E00 && numeric_limits<half>::digits == 11);
static_assert(numeric_limits<half>::max_exponent == 16 && numeric_limits<half>::min_exponent == -13);
static_assert(numeric_limits<bfloat>::max().bits == 0x7F7F && numeric_limits<bfloat>::min().bits == 0x0080);
static_assert(numeric_limits<bfloat>::epsilon().bits == 0x3C00 && numeric_limits<bfloat>::quiet_NaN().bits == 0x7FC0);
static_assert(numeric_limits<bfloat>::digits == 8 && numeric_limits<bfloat>::max_exponent == 128);
static_assert(numeric_limits<int>::max() == INT_MAX && numeric_limits<uchar>::max() == 255 && numeric_limits<float>::is_iec559);
static_assert(numeric_limits<half>::is_signed && !numeric_limits<half>::is_integer && numeric_limits<half>::has_infinity);

void test_constants() {
  CHECK(float(HALF_MAX) == 65504.0f && float(MAXHALF) == 65504.0f && float(HALF_MIN) == 0x1p-14f);
  CHECK(float(HALF_EPSILON) == 0x1p-10f && HALF_MANT_DIG == 11 && HALF_DIG == 3 && HALF_MAX_EXP == 16);
  CHECK(__builtin_isinf(INFINITY) && is_nan(NAN) && HUGE_VALF == INFINITY && __builtin_isinf(float(HUGE_VALH)));
  CHECK(MAXFLOAT == FLT_MAX && FLT_MIN == 0x1p-126f && FLT_EPSILON == 0x1p-23f);
  CHECK(near(M_PI_F, 4 * __builtin_atanf(1)) && near(M_PI_2_F * 2, M_PI_F) && near(M_PI_4_F * 4, M_PI_F));
  CHECK(near(M_1_PI_F * M_PI_F, 1) && near(M_2_PI_F * M_PI_F, 2) && near(M_2_SQRTPI_F * M_2_SQRTPI_F * M_PI_F, 4));
  CHECK(near(M_E_F, __builtin_expf(1)) && near(M_LOG2E_F * M_LN2_F, 1) && near(M_LOG10E_F * M_LN10_F, 1));
  CHECK(near(M_SQRT2_F * M_SQRT2_F, 2) && near(M_SQRT1_2_F * M_SQRT2_F, 1));
  CHECK(M_PI_H.bits == 0x4248 && float(M_E_H) == 2.71875f && float(M_SQRT2_H) == 1.4140625f);
  CHECK(same<decltype(M_LN2_H), half> && float(M_PI_2_H) == float(half(M_PI_2_F)));
  const half hs[] = {M_LOG2E_H, M_LOG10E_H, M_LN10_H, M_PI_4_H, M_1_PI_H, M_2_PI_H, M_2_SQRTPI_H, M_SQRT1_2_H};
  const float fs[] = {M_LOG2E_F, M_LOG10E_F, M_LN10_F, M_PI_4_F, M_1_PI_F, M_2_PI_F, M_2_SQRTPI_F, M_SQRT1_2_F};
  for (int i = 0; i < 8; ++i) CHECK(hs[i].bits == half(fs[i]).bits && near(float(hs[i]), fs[i], 1e-3f));
}

// -------------------------------------------------------- conversions, exhaustively

// Exact 2^e.
double pow2(int e) {
  double r = 1;
  for (; e > 0; --e) r *= 2;
  for (; e < 0; ++e) r *= 0.5;
  return r;
}
// Value of a finite binary16 pattern, from the IEEE 754 definition.
double half_value(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double v = e ? (1024 + m) * pow2(e - 25) : m * pow2(-24);
  return h & 0x8000 ? -v : v;
}
double bfloat_value(uint16_t b) { return f32(uint32_t(b) << 16); }

// Round-to-nearest-even by bisection over the (monotonic) patterns of the
// non-negative finite values; `top` is where the next value after the largest
// finite one would be, so that the overflow threshold is its midpoint.
uint16_t ref_round(double x, uint16_t max_finite, double top, double (*value)(uint16_t)) {
  const uint16_t sign = __builtin_signbit(x) ? 0x8000 : 0;
  const double a = __builtin_fabs(x);
  const uint32_t inf = max_finite + 1u;
  auto val = [&](uint32_t b) { return b == inf ? top : value(uint16_t(b)); };
  uint32_t lo = 0, hi = inf;
  if (a >= top) return uint16_t(sign | inf);
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (val(mid) <= a ? lo : hi) = mid;
  }
  const double dlo = a - val(lo), dhi = val(hi) - a;
  return uint16_t(sign | (dlo < dhi ? lo : dhi < dlo ? hi : lo % 2 == 0 ? lo : hi));
}
uint16_t ref_half(double x) { return ref_round(x, 0x7BFF, 65536.0, half_value); }
uint16_t ref_bfloat(double x) { return ref_round(x, 0x7F7F, pow2(128), bfloat_value); }

bool is_half_nan(uint16_t h) { return (h & 0x7FFF) > 0x7C00; }
bool is_bfloat_nan(uint16_t b) { return (b & 0x7FFF) > 0x7F80; }

// Float inputs next to every rounding boundary of a 16-bit format, plus specials.
template <class F> void for_each_boundary(uint16_t max_finite, double top, double (*value)(uint16_t), F f) {
  for (uint32_t b = 0; b <= max_finite; ++b) {
    const float v = float(value(uint16_t(b))), mid = float((value(uint16_t(b)) + (b == max_finite ? top : value(uint16_t(b + 1)))) / 2);
    const float probes[] = {v, mid, __builtin_nextafterf(mid, 0.0f), __builtin_nextafterf(mid, INFINITY), __builtin_nextafterf(v, INFINITY)};
    for (float p : probes) { f(p); f(-p); }
  }
}

void test_half_conversions() {
  int bad_decode = 0, bad_trip = 0, bad_round = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = uint16_t(i);
    const float f = half::from_bits(h);
    if (is_half_nan(h)) {
      // NaN payloads survive. Conversions quiet signaling NaNs, as hardware
      // does, unless the compiler folds a round trip away, so that bit is free.
      const uint32_t quiet = 0x400000u;
      bad_decode += !is_nan(f) || (u32(f) | quiet) != ((uint32_t(h & 0x8000) << 16) | 0x7FC00000u | uint32_t(h & 0x3FF) << 13);
      bad_trip += (half(f).bits | 0x200) != (h | 0x200);
      continue;
    }
    if ((h & 0x7FFF) == 0x7C00) bad_decode += f != (h & 0x8000 ? -INFINITY : INFINITY);
    else bad_decode += u32(f) != u32(float(half_value(h)));
    bad_trip += half(f).bits != h;
  }
  for_each_boundary(0x7BFF, 65536.0, half_value, [&](float p) { bad_round += half(p).bits != ref_half(p); });
  uint32_t seed = 12345;
  for (int i = 0; i < 200000; ++i) {
    seed = seed * 1664525u + 1013904223u;
    const float p = f32(seed);
    if (!is_nan(p)) bad_round += half(p).bits != ref_half(p);
  }
  CHECK(bad_decode == 0);
  CHECK(bad_trip == 0);
  CHECK(bad_round == 0);
  // Specials: overflow threshold, subnormal rounding, NaN quieting, integers, doubles.
  CHECK(half(65519.99f).bits == 0x7BFF && half(65520.0f).bits == 0x7C00 && half(-1e9f).bits == 0xFC00);
  CHECK(half(0x1p-25f).bits == 0 && half(0x1.000002p-25f).bits == 1 && half(0x1.8p-24f).bits == 2 && half(-0x1p-26f).bits == 0x8000);
  CHECK(half(f32(0x7F800001u)).bits == 0x7E00 && half(f32(0xFFC02000u)).bits == 0xFE01 && half(INFINITY).bits == 0x7C00);
  CHECK(half(2049).bits == 0x6800 && half(2051).bits == 0x6802 && half(-3).bits == 0xC200 && half(70000u).bits == 0x7C00);
  CHECK(half(true).bits == 0x3C00 && half(short(-1)).bits == 0xBC00 && half(100000000000L).bits == 0x7C00);
  // A double just above a half midpoint rounds up directly; via float it would tie to even.
  CHECK(half(1.0 + 0x1p-11 + 0x1p-40).bits == 0x3C01 && half(1.0 + 0x1p-11).bits == 0x3C00);
  CHECK(half(bfloat(3.0f)).bits == 0x4200 && bfloat(half(3.0f)).bits == 0x4040);
}

void test_bfloat_conversions() {
  int bad_decode = 0, bad_trip = 0, bad_round = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t b = uint16_t(i);
    const float f = bfloat::from_bits(b);
    bad_decode += u32(f) != uint32_t(b) << 16;
    bad_trip += bfloat(f).bits != (is_bfloat_nan(b) ? 0x7FC0 : b);
  }
  for_each_boundary(0x7F7F, pow2(128), bfloat_value, [&](float p) { bad_round += bfloat(p).bits != ref_bfloat(p); });
  uint32_t seed = 777;
  for (int i = 0; i < 200000; ++i) {
    seed = seed * 1664525u + 1013904223u;
    const float p = f32(seed);
    bad_round += bfloat(p).bits != (is_nan(p) ? 0x7FC0 : ref_bfloat(p));
  }
  CHECK(bad_decode == 0);
  CHECK(bad_trip == 0);
  CHECK(bad_round == 0);
  CHECK(bfloat(f32(0x3F808000u)).bits == 0x3F80 && bfloat(f32(0x3F818000u)).bits == 0x3F82);
  CHECK(bfloat(f32(0x3F808001u)).bits == 0x3F81 && bfloat(FLT_MAX).bits == 0x7F80 && bfloat(-NAN).bits == 0x7FC0);
  CHECK(bfloat(1.0).bits == 0x3F80 && bfloat(257).bits == 0x4380 && bfloat(-2).bits == 0xC000);
}

// ------------------------------------------------------------------ half arithmetic

void test_small_float_arithmetic() {
  // Every operation rounds once, exactly as native fp16 does.
  int bad = 0;
  uint32_t seed = 99;
  for (int i = 0; i < 100000; ++i) {
    seed = seed * 1664525u + 1013904223u;
    const half a = half::from_bits(uint16_t(seed >> 16)), b = half::from_bits(uint16_t(seed));
    const double da = float(a), db = float(b);
    const half got[] = {a + b, a - b, a * b, a / b};
    const double want[] = {da + db, da - db, da * db, da / db};
    for (int k = 0; k < 4; ++k) {
      if (is_nan(float(want[k]))) bad += !is_nan(float(got[k]));
      else bad += got[k].bits != ref_half(want[k]);
    }
  }
  CHECK(bad == 0);
  const half big = 2048, one = 1;
  CHECK(big + one == big && (big + one) + one == big && half(float(big) + 2.0f) == half(2050));
  half h = 2048;
  h += 1;
  CHECK(h == 2048);
  h += 2.0f;
  CHECK(h == 2050);
  h = 2048;
  CHECK(++h == 2048 && h-- == 2048 && h == 2047);
  h = 3;
  h *= half(0.5f);
  h /= 2;
  h -= 0.25;
  CHECK(h == 0.5f && -h == -0.5f && +h == h && (-half(0.0f)).bits == 0x8000);
  CHECK(half(1) < 2 && half(2) >= 2.0f && half(1) != half(2) && !(half(NAN) == half(NAN)) && half(1.5f) > 1);
  CHECK(half(0.1f) + 0.2f == float(half(0.1f)) + 0.2f && half(1) + bfloat(2) == 3.0f);
  const bfloat x = 1, y = 0x1p-8f;
  CHECK(x + y == x && bfloat(x + y + y) == bfloat(1.0f) && bfloat(1.0f + 0x1p-8f + 0x1p-8f) == bfloat(1.0078125f));
  CHECK(bfloat(3) * 2 == 6 && bfloat(1) / bfloat(3) == bfloat(1.0f / 3.0f) && bfloat(2) - 1.5f == 0.5f);
  float acc = 1;
  acc += half(2);
  int n = 10;
  n -= half(3);
  CHECK(acc == 3 && n == 7 && int(half(-2.75f)) == -2 && uint(half(7.5f)) == 7 && bool(half(0.5f)) && !half(0.0f));
}

// ----------------------------------------------------------------------- vectors

void test_vectors() {
  float4 v(1, 2, 3, 4);
  const float2 u(10, 20);
  v.xy = u;
  v.zw += u;
  const float4 w = v.wzyx;
  CHECK(all(v == float4(10, 20, 13, 24)) && all(w == float4(24, 13, 20, 10)));
  CHECK(v.x == 10 && v.r == 10 && v.g == 20 && v.b == 13 && v.a == 24 && v[3] == 24);
  CHECK(all(v.bgra == float4(13, 20, 10, 24)) && all(v.xxyy == float4(10, 10, 20, 20)) && all(v.rgb == float3(10, 20, 13)));
  CHECK(all(float2(3, 4).yx == float2(4, 3)) && all(float2(3, 4).xyxy == float4(3, 4, 3, 4)) && all(int3(1, 2, 3).zzz == int3(3)));

  // Swizzle assignments write only the named lanes, also between identical
  // swizzles (and see test_gapped_swizzles).
  const float4 c(5, 6, 7, 8);
  float4 a(1, 2, 3, 4), b(-1, -2, -3, -4);
  a.zw = c.zw;
  CHECK(all(a == float4(1, 2, 7, 8)));
  a.yz = c.yz;
  CHECK(all(a == float4(1, 6, 7, 8)));
  a.gb = b.gb;
  CHECK(all(a == float4(1, -2, -3, 8)));
  a.xz = b.zx;
  a.wy = float2(9, 10);
  CHECK(all(a == float4(-3, 10, -1, 9)));
  a = float4(-1, -2, -3, -4);
  a.xy = a.yx;
  a.zyx = float3(7, 8, 9);
  CHECK(all(a == float4(9, 8, 7, -4)));
  a.xy = 0.5f;
  a.zw *= 2;
  a.rg -= float2(1, 2);
  a.yzw /= 2;
  CHECK(all(a == float4(-0.5f, -0.75f, 7, -4)));
  int4 iv(1, 2, 3, 4);
  iv.wx <<= 1;
  iv.yz %= 2;
  iv.xyz |= int3(16);
  CHECK(all(iv == int4(18, 16, 17, 8)));
  float3 f3 = float3(1, 2, 3);
  f3.xz = f3.zx;
  CHECK(all(f3 == float3(3, 2, 1)));

  // Constructors.
  CHECK(all(float4(float2(1, 2), 3.0f, 4) == float4(1, 2, 3, 4)) && all(float4(1, float3(2, 3, 4)) == float4(1, 2, 3, 4)));
  CHECK(all(float4(float2(1, 2), float2(3, 4)) == float4(1, 2, 3, 4)) && all(float3(float2(1, 2), 3) == float3(1, 2, 3)));
  CHECK(all(float4(v.xy, c.zw) == float4(10, 20, 7, 8)) && all(float4(2) == float4(2, 2, 2, 2)) && all(float3() == 0.0f));
  CHECK(all(int2(float2(1.7f, -1.7f)) == int2(1, -1)) && all(float4(half4(1.5f)) == 1.5f) && all(uint2(int2(-1)) == 0xFFFFFFFFu));
  CHECK(all(half2(float2(0.1f, 65520.0f)) == half2(half(0.1f), half(INFINITY))) && all(bool2(int2(0, 3)) == bool2(false, true)));
  float4 z = {};
  const float4 lst = {1, 2, 3, 4};
  CHECK(all(z == 0.0f) && all(lst == float4(1, 2, 3, 4)));

  // Operators.
  CHECK(all(float4(1, 2, 3, 4) * 2 == float4(2, 4, 6, 8)) && all(2.0f / float2(4, 8) == float2(0.5f, 0.25f)));
  CHECK(all(-float2(1, -2) == float2(-1, 2)) && all(+int2(3) == 3) && all(~uint2(0) == 0xFFFFFFFFu));
  CHECK(all(int4(7, -7, 8, 9) % 4 == int4(3, -3, 0, 1)) && all((int2(6, 5) & 3) == int2(2, 1)) && all((uint2(1) | 6u) == 7u));
  CHECK(all((int2(5) ^ int2(1, 4)) == int2(4, 1)) && all(int4(INT_MAX) + 1 == INT_MIN) && all(-int2(INT_MIN) == INT_MIN));
  CHECK(all((uint2(1) << uint2(33, 2)) == uint2(2, 4)) && all((int2(-8) >> 1) == -4) && all((int2(1) << 31) == INT_MIN));
  CHECK(all(ushort2(65535) * ushort2(65535) == ushort2(1)) && all(char2(127) + char2(1) == char2(-128)) && all(uchar2(250) + 10 == 4));
  CHECK(all((float2(1, 2) < float2(2, 2)) == bool2(true, false)) && all((float2(1, 2) >= 2.0f) == bool2(false, true)));
  CHECK(all((int3(1, 2, 3) != int3(1, 0, 3)) == bool3(false, true, false)) && all((!bool2(true, false)) == bool2(false, true)));
  CHECK(all((bool2(true, false) && bool2(true, true)) == bool2(true, false)) && all((int2(0, 2) || int2(0, 0)) == bool2(false, true)));
  int2 inc(1, 2);
  CHECK(all(inc++ == int2(1, 2)) && all(inc == int2(2, 3)) && all(--inc == int2(1, 2)));
  half4 hv(1, 2, 3, 4);
  hv *= 0.5f;
  hv += half(2048);
  CHECK(all(hv == half4(2048, 2048, 2050, 2050)) && all(half4(2048) + 1 == half4(2048)));
  bfloat2 bv = bfloat2(1, 2) * 3.0f;
  CHECK(all(bv == bfloat2(3, 6)));

  // Packed vectors.
  packed_float3 p = float3(1, 2, 3);
  p += 1.0f;
  p.xy = p.yx;
  float3 q = p;
  q = q + p;
  const packed_half4 ph(1, 2, 3, 4);
  CHECK(p[0] == 3 && p.y == 2 && p.z == 4 && all(q == float3(6, 4, 8)) && all(float4(ph) == float4(1, 2, 3, 4)));
  CHECK(all(packed_float2(5) == float2(5)) && float2(ph.xy).y == 2.0f && all(int3(packed_int3(1, 2, 3)) == int3(1, 2, 3)));

  // Plain memory: memcpy and unions, as kernels use them.
  union { float4 f; uint4 u; } un;
  un.f = float4(1.0f);
  CHECK(un.u.x == 0x3F800000u && un.u.w == 0x3F800000u);
  float buf[4] = {1, 2, 3, 4};
  float4 m;
  __builtin_memcpy(static_cast<void*>(&m), buf, sizeof m);
  CHECK(all(m == float4(1, 2, 3, 4)));
}

// ------------------------------------------------------- gapped swizzle assignment

// Swizzles whose letters skip a lane (xz, ywx, ...), assigned from the same
// swizzle of another vector, from a permutation of their own letters (which
// must read every lane before writing one) and compound-assigned. The expected
// vectors come from the letters, not from the implementation.
int lane_of(char c) {
  switch (c) {
    case 'x': case 'r': return 0;
    case 'y': case 'g': return 1;
    case 'z': case 'b': return 2;
    default: return 3;
  }
}

template <class V> constexpr int lanes_of = vec_elements_v<decltype(+V())>;

template <class V> V ramp(int step) {
  V v{};
  for (int i = 0; i < lanes_of<V>; ++i) v[i] = step * (i + 1);
  return v;
}

// `what` names the copy, the permutation and the compound assignment.
template <class V, class Copy, class CopyConst, class Permute, class Add>
void check_gapped(const char* p, const char* q, const char* const (&what)[3], Copy copy, CopyConst copy_const,
                  Permute permute, Add add, int line) {
  const V a0 = ramp<V>(1), b0 = ramp<V>(10);
  V from_b = a0, from_a = a0, sum = a0;
  for (int k = 0; p[k]; ++k) {
    const int i = lane_of(p[k]);
    from_b[i] = b0[i];
    from_a[i] = a0[lane_of(q[k])];
    sum[i] = a0[i] + b0[i];
  }
  V a = a0, b = b0;
  copy(a, b);
  check(all(a == from_b) && all(b == b0), what[0], line);
  a = a0;
  copy_const(a, b0);
  check(all(a == from_b), what[0], line);
  a = a0;
  permute(a);
  check(all(a == from_a), what[1], line);
  a = a0;
  add(a, b0);
  check(all(a == sum), what[2], line);
}
#define GAPPED(V, P, Q)                                                                                        \
  check_gapped<V>(#P, #Q, {"a." #P " = b." #P, "a." #P " = a." #Q, "a." #P " += b." #P},                       \
                  [](V& a, V& b) { a.P = b.P; }, [](V& a, const V& b) { a.P = b.P; }, [](V& a) { a.P = a.Q; }, \
                  [](V& a, const V& b) { a.P += b.P; }, __LINE__)

template <class V> void test_gapped4() {
  GAPPED(V, xz, zx); GAPPED(V, zx, xz); GAPPED(V, xw, wx); GAPPED(V, wx, xw); GAPPED(V, yw, wy); GAPPED(V, wy, yw);
  GAPPED(V, rb, br); GAPPED(V, br, rb); GAPPED(V, ra, ar); GAPPED(V, ar, ra); GAPPED(V, ga, ag); GAPPED(V, ag, ga);
  GAPPED(V, xyw, ywx); GAPPED(V, xwy, wyx); GAPPED(V, yxw, xwy); GAPPED(V, ywx, wxy); GAPPED(V, wxy, yxw); GAPPED(V, wyx, xyw);
  GAPPED(V, xzw, zwx); GAPPED(V, xwz, wzx); GAPPED(V, zxw, xwz); GAPPED(V, zwx, wxz); GAPPED(V, wxz, zxw); GAPPED(V, wzx, xzw);
  GAPPED(V, rga, gar); GAPPED(V, rag, agr); GAPPED(V, gra, rag); GAPPED(V, gar, arg); GAPPED(V, arg, gra); GAPPED(V, agr, rga);
  GAPPED(V, rba, bar); GAPPED(V, rab, abr); GAPPED(V, bra, rab); GAPPED(V, bar, arb); GAPPED(V, arb, bra); GAPPED(V, abr, rba);
  // A permutation spelled in the other letter set.
  GAPPED(V, xz, br); GAPPED(V, ywx, arg);
}

template <class V> void test_gapped3() {
  GAPPED(V, xz, zx); GAPPED(V, zx, xz); GAPPED(V, rb, br); GAPPED(V, br, rb); GAPPED(V, xz, rb);
}
#undef GAPPED

void test_gapped_swizzles() {
  test_gapped4<float4>();
  test_gapped4<half4>();
  test_gapped4<uchar4>();
  test_gapped4<packed_float4>();
  test_gapped3<int3>();
  test_gapped3<packed_half3>();

  // A swizzle's type depends on neither its letter set nor the vector's length
  // or packing, so these are copy assignments too.
  const float4 b(5, 6, 7, 8);
  float4 a(1, 2, 3, 4);
  float3 c(-1, -2, -3);
  packed_float4 p(-1, -2, -3, -4);
  a.xz = b.rb;
  c.xz = a.xz;
  p.ywx = a.gar;
  CHECK(all(a == float4(5, 2, 7, 4)) && all(c == float3(5, -2, 7)) && all(float4(p) == float4(5, 2, -3, 4)));
}

// ----------------------------------------------------------------- float functions

void test_float_functions() {
  const float inf = INFINITY, nan = NAN;
  CHECK(abs(-2.5f) == 2.5f && abs(-inf) == inf && u32(fabs(-0.0f)) == 0 && is_nan(abs(nan)));
  CHECK(fmax(nan, 1.0f) == 1 && fmax(1.0f, nan) == 1 && max(nan, 2.0f) == 2 && min(2.0f, nan) == 2 && fmin(nan, -1.0f) == -1);
  CHECK(is_nan(fmax(nan, nan)) && min(-inf, 0.0f) == -inf && max(-inf, 0.0f) == 0 && fmin(3.0f, 2.0f) == 2);
  CHECK(fmax(half(1), half(nan)) == 1 && max(bfloat(-1), bfloat(2)) == 2 && all(max(float2(1, nan), 0.0f) == float2(1, 0)));
  CHECK(clamp(5.0f, 0.0f, 1.0f) == 1 && clamp(-5.0f, 0.0f, 1.0f) == 0 && clamp(nan, 0.0f, 1.0f) == 0 && clamp(0.5f, 0.0f, 1.0f) == 0.5f);
  CHECK(saturate(-1.0f) == 0 && saturate(2.0f) == 1 && saturate(0.25f) == 0.25f && saturate(nan) == 0 && saturate(half(3)) == 1);
  CHECK(all(clamp(float4(-1, 0.5f, 2, nan), 0.0f, 1.0f) == float4(0, 0.5f, 1, 0)) && all(saturate(half2(-1, 0.5f)) == half2(0, 0.5f)));
  CHECK(mix(1.0f, 3.0f, 0.25f) == 1.5f && all(mix(float2(0), float2(4, 8), 0.5f) == float2(2, 4)) && mix(half(1), half(3), half(0.5f)) == 2);
  CHECK(step(1.0f, 0.5f) == 0 && step(1.0f, 1.0f) == 1 && all(step(float2(1, 2), float2(1.5f)) == float2(1, 0)));
  CHECK(smoothstep(0.0f, 1.0f, 0.5f) == 0.5f && smoothstep(0.0f, 1.0f, -1.0f) == 0 && smoothstep(0.0f, 2.0f, 3.0f) == 1);
  CHECK(sign(-3.0f) == -1 && sign(2.0f) == 1 && u32(sign(0.0f)) == 0 && u32(sign(-0.0f)) == 0x80000000u && sign(nan) == 0);
  CHECK(sign(inf) == 1 && all(sign(half3(-2, 0, 5)) == half3(-1, 0, 1)));
  CHECK(select(1.0f, 2.0f, true) == 2 && select(1, 2, false) == 1 && all(select(float2(1, 2), float2(3, 4), bool2(true, false)) == float2(3, 2)));
  CHECK(all(select(int3(0), int3(1, 2, 3), int3(5, 0, 1) > 0) == int3(1, 0, 3)) && all(select(float2(1), float2(2), true) == 2.0f));

  CHECK(exp(0.0f) == 1 && exp(-inf) == 0 && exp(inf) == inf && is_nan(exp(nan)) && near(exp(1.0f), 2.7182818f));
  CHECK(exp2(10.0f) == 1024 && exp2(-inf) == 0 && near(exp10(2.0f), 100) && exp10(-inf) == 0 && exp10(inf) == inf);
  CHECK(log(1.0f) == 0 && log(0.0f) == -inf && is_nan(log(-1.0f)) && log(inf) == inf && log2(8.0f) == 3 && near(log10(1000.0f), 3));
  CHECK(pow(2.0f, 10.0f) == 1024 && pow(-1.0f, 2.0f) == 1 && is_nan(powr(-1.0f, 2.0f)) && powr(4.0f, 0.5f) == 2 && pow(0.0f, -1.0f) == inf);
  CHECK(sqrt(4.0f) == 2 && is_nan(sqrt(-1.0f)) && sqrt(inf) == inf && rsqrt(4.0f) == 0.5f && rsqrt(0.0f) == inf);
  CHECK(near(sin(1.0f), 0.84147098f) && near(cos(1.0f), 0.54030231f) && near(tan(1.0f), 1.5574077f) && is_nan(sin(inf)));
  CHECK(near(asin(1.0f), M_PI_2_F) && near(acos(0.0f), M_PI_2_F) && near(atan(inf), M_PI_2_F) && is_nan(asin(2.0f)));
  CHECK(near(atan2(1.0f, 0.0f), M_PI_2_F) && near(atan2(0.0f, -1.0f), M_PI_F) && near(atan2(-1.0f, -1.0f), -3 * M_PI_4_F));
  CHECK(near(sinh(1.0f), 1.1752012f) && near(cosh(1.0f), 1.5430806f) && tanh(inf) == 1 && near(tanh(0.5f), 0.46211716f));
  CHECK(near(asinh(1.0f), 0.88137359f) && acosh(1.0f) == 0 && is_nan(acosh(0.5f)) && atanh(1.0f) == inf && near(atanh(0.5f), 0.54930614f));
  CHECK(sinpi(0.5f) == 1 && u32(sinpi(1.0f)) == 0 && u32(sinpi(-2.0f)) == 0x80000000u && sinpi(0x1p22f + 0.5f) == 1 && sinpi(-0.5f) == -1);
  CHECK(cospi(1.0f) == -1 && u32(cospi(0.5f)) == 0 && cospi(0x1p22f + 1) == -1 && cospi(0.0f) == 1 && near(cospi(1.0f / 3), 0.5f));
  CHECK(near(tanpi(0.25f), 1) && tanpi(0.5f) == inf && tanpi(1.5f) == -inf && is_nan(sinpi(inf)) && near(sinpi(1.0f / 6), 0.5f));
  CHECK(floor(-1.5f) == -2 && ceil(-1.5f) == -1 && round(-2.5f) == -3 && round(2.5f) == 3 && rint(2.5f) == 2 && rint(3.5f) == 4);
  CHECK(trunc(-1.7f) == -1 && floor(inf) == inf && is_nan(ceil(nan)) && all(round(half2(0.5f, -1.5f)) == half2(1, -2)));
  CHECK(fract(-1.25f) == 0.75f && fract(2.5f) == 0.5f && fract(inf) == 0 && u32(fract(-inf)) == 0x80000000u && is_nan(fract(nan)));
  CHECK(fract(-1e-10f) == 0x1.fffffep-1f && fract(half(-1.25f)) == 0.75f);
  CHECK(fmod(5.5f, 2.0f) == 1.5f && fmod(-5.5f, 2.0f) == -1.5f && is_nan(fmod(inf, 1.0f)) && is_nan(fmod(1.0f, 0.0f)));
  CHECK(fma(2.0f, 3.0f, 4.0f) == 10 && fma(0x1.001p0f, 0x1.001p0f, -1.0f) == 0x1.0008p-11f);
  CHECK(copysign(1.0f, -0.0f) == -1 && copysign(-2.0f, 1.0f) == 2 && fdim(5.0f, 3.0f) == 2 && fdim(3.0f, 5.0f) == 0 && is_nan(fdim(nan, 1.0f)));
  CHECK(nextafter(1.0f, 2.0f) == 0x1.000002p0f && nextafter(0.0f, -1.0f) == -0x1p-149f && nextafter(1.0f, 1.0f) == 1 && is_nan(nextafter(nan, 1.0f)));
  CHECK(nextafter(half(1), half(2)).bits == 0x3C01 && nextafter(half(0), half(-1)).bits == 0x8001 && nextafter(half(-1), half(0)).bits == 0xBBFF);
  CHECK(nextafter(bfloat(1), bfloat(0)).bits == 0x3F7F && nextafter(half(65504), half(INFINITY)).bits == 0x7C00);
  CHECK(ldexp(1.5f, 3) == 12 && all(ldexp(half4(1), int4(1, 2, 3, -1)) == half4(2, 4, 8, 0.5f)) && all(ldexp(float2(1), 2) == 4.0f));
  CHECK(ldexp(half(1), -24).bits == 0x0001 && ldexp(half(1), -25).bits == 0 && ldexp(1.0f, 200) == inf);
  int e = 0;
  int2 e2;
  CHECK(frexp(8.0f, e) == 0.5f && e == 4 && all(frexp(half2(3, 0.25f), e2) == half2(0.75f, 0.5f)) && all(e2 == int2(2, -1)));
  float ip = 0;
  half2 hip;
  CHECK(modf(3.75f, ip) == 0.75f && ip == 3 && modf(-3.75f, ip) == -0.75f && ip == -3);
  CHECK(all(modf(half2(1.5f, -2.25f), hip) == half2(0.5f, -0.25f)) && all(hip == half2(1, -2)));
  float cs = 0;
  float2 cs2;
  CHECK(sincos(0.0f, cs) == 0 && cs == 1 && all(sincos(float2(0, M_PI_2_F), cs2) == float2(0, 1)) && near(cs2.y, 0, 1e-7f));
  CHECK(fast::divide(1.0f, 4.0f) == 0.25f && precise::divide(3.0f, 2.0f) == 1.5f && divide(1.0f, 0.0f) == inf);
  CHECK(fast::exp(0.0f) == 1 && precise::sqrt(9.0f) == 3 && fast::normalize(float2(0, 2)).y == 1 && precise::clamp(2.0f, 0.0f, 1.0f) == 1);
  CHECK(max3(1.0f, 3.0f, 2.0f) == 3 && min3(1.0f, 3.0f, -2.0f) == -2 && median3(1.0f, 3.0f, 2.0f) == 2 && median3(5.0f, 1.0f, 3.0f) == 3);
  CHECK(fmax3(nan, 1.0f, 2.0f) == 2 && fmin3(1.0f, nan, 2.0f) == 1 && fmedian3(3.0f, 1.0f, 2.0f) == 2 && median3(2, 9, 4) == 4);

  CHECK(isnan(nan) && !isnan(inf) && isinf(-inf) && !isinf(1.0f) && isfinite(1.0f) && !isfinite(inf) && !isfinite(nan));
  CHECK(isnormal(1e-5f) && !isnormal(half(1e-5f)) && isnormal(half(1)) && !isnormal(half(INFINITY)) && !isnormal(0.0f) && !isnormal(nan));
  CHECK(!isnormal(0x1p-127f) && isnormal(bfloat(0x1p-126f)) && signbit(-0.0f) && !signbit(0.0f) && signbit(half(-nan)));
  CHECK(isordered(1.0f, 2.0f) && !isordered(nan, 1.0f) && isunordered(1.0f, nan) && !isunordered(inf, 1.0f));
  CHECK(all(isnan(float4(nan, 0, inf, -nan)) == bool4(true, false, false, true)) && all(isinf(half2(1, INFINITY)) == bool2(false, true)));
  CHECK(all(isfinite(float3(1, inf, nan)) == bool3(true, false, false)) && all(signbit(float2(-1, 1)) == bool2(true, false)));
  CHECK(all(isunordered(float2(nan, 1), float2(1)) == bool2(true, false)) && all(isnormal(float2(1, 0)) == bool2(true, false)));

  // half/bfloat lanes: computed in float, rounded once.
  int bad = 0;
  for (uint32_t i = 0; i < 65536; i += 7) {
    const half h = half::from_bits(uint16_t(i));
    const float f = h;
    const half got[] = {exp(h), sqrt(h), sin(h), log2(h), rsqrt(h), tanh(h)};
    const float want[] = {__builtin_expf(f), __builtin_sqrtf(f), __builtin_sinf(f), __builtin_log2f(f), 1 / __builtin_sqrtf(f),
                          __builtin_tanhf(f)};
    for (int k = 0; k < 6; ++k) bad += is_nan(want[k]) ? !is_nan(got[k]) : got[k].bits != half(want[k]).bits;
  }
  CHECK(bad == 0);
  CHECK(exp(bfloat(1)).bits == bfloat(__builtin_expf(1)).bits && pow(half(2), half(0.5f)) == half(1.41421356f));
  CHECK(all(exp(float4(0, 1, 2, -inf)) == float4(1, __builtin_expf(1), __builtin_expf(2), 0)) && all(abs(float3(-1, 2, -3).zyx) == float3(3, 2, 1)));
}

// --------------------------------------------------------------- integer functions

void test_integer_functions() {
  CHECK(abs(INT_MIN) == INT_MIN && abs(-5) == 5 && abs(char(-3)) == 3 && abs(7u) == 7 && abs(long(-9)) == 9);
  CHECK(absdiff(-5, 10) == 15 && absdiff(3u, 10u) == 7 && absdiff(uchar(200), uchar(10)) == 190 && absdiff(10L, -3L) == 13);
  CHECK(addsat(INT_MAX, 1) == INT_MAX && addsat(INT_MIN, -1) == INT_MIN && addsat(uchar(250), uchar(10)) == 255 && addsat(3, 4) == 7);
  CHECK(addsat(LONG_MAX, 1L) == LONG_MAX && addsat(ULONG_MAX, 1ul) == ULONG_MAX && addsat(short(-32768), short(-1)) == -32768);
  CHECK(subsat(INT_MIN, 1) == INT_MIN && subsat(3u, 5u) == 0 && subsat(INT_MAX, -1) == INT_MAX && subsat(0ul, 1ul) == 0 && subsat(9, 4) == 5);
  CHECK(hadd(INT_MAX, INT_MAX) == INT_MAX && hadd(-1, -2) == -2 && hadd(3u, 4u) == 3 && hadd(UINT_MAX, UINT_MAX) == UINT_MAX);
  CHECK(rhadd(1, 2) == 2 && rhadd(-1, -2) == -1 && rhadd(UINT_MAX, 0u) == 0x80000000u && rhadd(char(127), char(127)) == 127);
  CHECK(clamp(7, 0, 5) == 5 && clamp(-7, 0, 5) == 0 && clamp(3u, 1u, 2u) == 2 && min(-1, 1) == -1 && max(2u, 9u) == 9);
  CHECK(max3(1, 7, 3) == 7 && min3(4, 2, 8) == 2 && median3(9, 1, 5) == 5 && median3(uchar(1), uchar(2), uchar(3)) == 2);
  CHECK(clz(1) == 31 && clz(0) == 32 && clz(-1) == 0 && clz(uchar(1)) == 7 && clz(ushort(0)) == 16 && clz(1ul) == 63 && clz(char(-1)) == 0);
  CHECK(ctz(8) == 3 && ctz(0u) == 32 && ctz(short(0)) == 16 && ctz(0x8000000000000000ul) == 63 && ctz(uchar(0x80)) == 7);
  CHECK(popcount(-1) == 32 && popcount(uchar(0xF0)) == 4 && popcount(0ul) == 0 && popcount(char(-1)) == 8 && popcount(LONG_MIN) == 1);
  CHECK(mulhi(0x80000000u, 4u) == 2 && mulhi(-1, -1) == 0 && mulhi(INT_MIN, 2) == -1 && mulhi(ULONG_MAX, ULONG_MAX) == ULONG_MAX - 1);
  CHECK(mulhi(LONG_MIN, LONG_MIN) == 0x4000000000000000L && mulhi(uchar(200), uchar(200)) == 156 && mulhi(short(-300), short(300)) == -2);
  CHECK(mul24(2, 3) == 6 && mul24(-2, 3) == -6 && mul24(0x7FFFFFu, 2u) == 0xFFFFFEu && mad24(2, 3, 4) == 10 && mad24(-2, 3, 1) == -5);
  CHECK(madhi(0x80000000u, 4u, 1u) == 3 && madhi(-1, 1, 5) == 4);
  CHECK(madsat(INT_MAX, 2, 0) == INT_MAX && madsat(UINT_MAX, 2u, 0u) == UINT_MAX && madsat(ULONG_MAX, 2ul, 0ul) == ULONG_MAX);
  CHECK(madsat(-3, 2, 1) == -5 && madsat(INT_MIN, 2, 5) == INT_MIN && madsat(LONG_MAX, 2L, LONG_MIN) == LONG_MAX - 1);
  CHECK(madsat(0x4000000000000000L, 2L, -5L) == LONG_MAX - 4 && madsat(uchar(20), uchar(20), uchar(0)) == 255);
  CHECK(rotate(0x80000001u, 1u) == 3 && rotate(uchar(0x81), uchar(1)) == 0x03 && rotate(1u, 33u) == 2 && rotate(1, -1) == INT_MIN);
  CHECK(rotate(0x12345678u, 0u) == 0x12345678u && rotate(1ul, 64ul) == 1 && rotate(short(0x4001), short(2)) == 5);
  CHECK(reverse_bits(1u) == 0x80000000u && reverse_bits(uchar(1)) == 0x80 && reverse_bits(ushort(0x00F1)) == 0x8F00);
  CHECK(reverse_bits(1ul) == 0x8000000000000000ul && reverse_bits(0x12345678u) == 0x1E6A2C48u && reverse_bits(-2) == INT_MAX);
  CHECK(extract_bits(0xF0u, 4, 4) == 0xF && extract_bits(0xF0, 4, 4) == -1 && extract_bits(0x70, 4, 4) == 7 && extract_bits(5u, 3, 0) == 0);
  CHECK(extract_bits(0xDEADBEEFu, 0, 32) == 0xDEADBEEFu && extract_bits(char(-128), 7, 1) == -1 && extract_bits(uchar(0x80), 7, 1) == 1);
  CHECK(insert_bits(0u, 7u, 1, 3) == 14 && insert_bits(0xFFFFFFFFu, 0u, 4, 8) == 0xFFFFF00Fu && insert_bits(uchar(0), uchar(0xFF), 0, 8) == 0xFF);
  CHECK(insert_bits(5, 1, 0, 0) == 5 && insert_bits(0, -1, 31, 1) == INT_MIN && insert_bits(0ul, 1ul, 63, 1) == 0x8000000000000000ul);
  CHECK(all(popcount(uint4(0, 1, 3, 7)) == uint4(0, 1, 2, 3)) && all(clamp(int4(-5, 0, 5, 50), 0, 10) == int4(0, 0, 5, 10)));
  CHECK(all(extract_bits(uint2(0xAB, 0xCD), 4, 4) == uint2(0xA, 0xC)) && all(insert_bits(int2(0), int2(1, 3), 2, 2) == int2(4, 12)));
  CHECK(all(max(short3(1, -2, 3).zyx, short3(0)) == short3(3, 0, 1)) && all(abs(int2(-1, INT_MIN)) == int2(1, INT_MIN)));
  CHECK(all(rotate(uint2(1), uint2(1, 31)) == uint2(2, 0x80000000u)) && all(mulhi(long2(LONG_MAX), long2(2)) == long2(0)));
}

// --------------------------------------------------- geometric, relational, as_type

void test_geometric_relational_as_type() {
  CHECK(dot(float3(1, 2, 3), float3(4, 5, 6)) == 32 && dot(half2(1, 2), half2(3, 4)) == 11 && dot(float4(1).xy, float2(2)) == 4);
  CHECK(all(cross(float3(1, 0, 0), float3(0, 1, 0)) == float3(0, 0, 1)) && all(cross(half3(0, 1, 0), half3(1, 0, 0)) == half3(0, 0, -1)));
  CHECK(length(float2(3, 4)) == 5 && length(half2(3, 4)) == 5 && length_squared(float3(1, 2, 2)) == 9 && length(float4(-2, 0, 0, 0)) == 2);
  CHECK(distance(float2(1, 1), float2(4, 5)) == 5 && distance_squared(float2(1, 1), float2(4, 5)) == 25 && distance(half3(1), half3(1)) == 0);
  CHECK(all(normalize(float2(3, 4)) == float2(0.6f, 0.8f)) && all(normalize(half2(0, 7)) == half2(0, 1)) && isnan(normalize(float2(0)).x));
  CHECK(all(faceforward(float2(0, 1), float2(0, -1), float2(0, 1)) == float2(0, 1)) && all(faceforward(float2(0, 1), float2(0, 1), float2(0, 1)) == float2(0, -1)));
  CHECK(all(reflect(float2(1, -1), float2(0, 1)) == float2(1, 1)) && all(refract(float2(0, -1), float2(0, 1), 1.0f) == float2(0, -1)));
  CHECK(all(refract(normalize(float2(1, -0.1f)), float2(0, 1), 2.0f) == float2(0)));

  CHECK(all(bool4(true)) && !all(bool2(true, false)) && any(bool2(false, true)) && !any(bool3(false)) && all(true) && !any(false));
  const bool4 b(true, true, false, false);
  CHECK(all(b.xy) && !any(b.zw) && any(b.yz) && all(float3(1, 2, 3) > 0.0f));

  CHECK(as_type<uint>(1.0f) == 0x3F800000u && as_type<float>(0x40000000u) == 2 && as_type<ushort>(bfloat(1)) == 0x3F80);
  const half2 hp = as_type<half2>(0x3C004000u);
  CHECK(hp.x == 2 && hp.y == 1 && as_type<uint>(half2(2, 1)) == 0x3C004000u && as_type<short>(half(-2)) == -16384);
  CHECK(all(as_type<uint2>(float2(1, -2)) == uint2(0x3F800000u, 0xC0000000u)) && as_type<ulong>(float2(0, 1)) == 0x3F80000000000000ul);
  CHECK(all(as_type<float4>(uint4(0x3F800000u)) == 1.0f) && as_type<int>(float4(1).x) == 0x3F800000 && as_type<uchar4>(1u).x == 1);
  CHECK(as_type<half>(ushort(0x7C00)) == INFINITY && as_type<uint2>(float4(0, 2, 0, 0).yx).x == 0x40000000u);
}

}  // namespace

int main() {
  test_constants();
  test_half_conversions();
  test_bfloat_conversions();
  test_small_float_arithmetic();
  test_vectors();
  test_gapped_swizzles();
  test_float_functions();
  test_integer_functions();
  test_geometric_relational_as_type();
  if (failures) {
    __builtin_printf("%d check(s) failed\n", failures);
    return 1;
  }
  __builtin_printf("OK\n");
  return 0;
}
