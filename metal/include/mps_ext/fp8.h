// float8 e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no
// infinities, 0x7F/0xFF are NaN, largest finite 448, subnormals down to
// 2^-9) carried as bytes: Metal has no fp8 type.
//
// - fp8_to_float / float_to_fp8: bit-exact with torch's CPU conversions
//   (round to nearest even; everything of magnitude >= 448, infinities
//   included, saturates to +-448; NaN keeps its sign, and decodes to the
//   float torch gives, 0x7FF00000 with the sign).
#pragma once

#include <metal_stdlib>

namespace mps_ext {

inline bool fp8_is_nan(uchar b) { return (b & 0x7F) == 0x7F; }

inline float fp8_to_float(uchar b) {
  const uint sign = uint(b & 0x80) << 24;
  const uint exponent = (b >> 3) & 0xF, mantissa = b & 0x7;
  if (fp8_is_nan(b)) return metal::as_type<float>(sign | 0x7FF00000u);
  if (exponent == 0) return metal::as_type<float>(sign | metal::as_type<uint>(float(mantissa) * 0.001953125f));
  return metal::as_type<float>(sign | ((exponent + 120) << 23) | (mantissa << 20));
}

// |x| (float bits `a`) below a float8 format's smallest normal, in units of
// its smallest subnormal, 2^(units_exponent - 150), rounded to nearest even.
inline uint subnormal_units(uint a, uint units_exponent) {
  const uint exponent = a >> 23;
  const uint shift = units_exponent - exponent;  // >= 21 below the smallest normal
  if (exponent == 0 || shift > 24) return 0;
  const uint mantissa = (a & 0x7FFFFFu) | 0x800000u;
  const uint units = mantissa >> shift;
  const uint rest = mantissa & ((1u << shift) - 1), half_unit = 1u << (shift - 1);
  return units + ((rest > half_unit || (rest == half_unit && (units & 1))) ? 1 : 0);
}

// Integer arithmetic only, so fast-math settings cannot change a rounding.
inline uchar float_to_fp8(float f) {
  const uint bits = metal::as_type<uint>(f);
  const uchar sign = uchar((bits >> 24) & 0x80);
  const uint a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7F;   // NaN
  if (a >= 0x43E00000u) return sign | 0x7E;  // >= 448: saturate
  if (a >= 0x3C800000u) {                     // >= 2^-6: a normal e4m3 value
    const uint rounded = a + 0x7FFFFu + ((a >> 20) & 1u);
    return sign | uchar((rounded - (120u << 23)) >> 20);
  }
  return sign | uchar(subnormal_units(a, 141));  // units of 2^-9 (0..8; 8 is the smallest normal)
}

// float8 e5m2 (1 sign, 5 exponent bits with bias 15, 2 mantissa bits, infinities and NaN as in IEEE) is the
// top byte of a half: decoding is a shift, exact for every code.
inline float e5m2_to_float(uchar b) { return float(metal::as_type<half>(ushort(ushort(b) << 8))); }

// Bit-exact with torch's CPU conversion: round to nearest even, past 57344 to infinity (e5m2 does not
// saturate in torch), NaN to 0x7F with its sign. Integer arithmetic only, as float_to_fp8.
inline uchar float_to_e5m2(float f) {
  const uint bits = metal::as_type<uint>(f);
  const uchar sign = uchar((bits >> 24) & 0x80);
  const uint a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7F;  // NaN
  if (a >= 0x47800000u) return sign | 0x7C;  // >= 65536: infinity
  if (a >= 0x38800000u)                      // >= 2^-14: a normal e5m2 value (rounding may reach infinity)
    return sign | uchar((a + 0xFFFFFu + ((a >> 21) & 1u) - (112u << 23)) >> 21);
  return sign | uchar(subnormal_units(a, 134));  // units of 2^-16 (0..4; 4 is the smallest normal)
}

}  // namespace mps_ext
