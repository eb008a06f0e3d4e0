// float8 e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no
// infinities, 0x7F/0xFF are NaN, largest finite 448, subnormals down to
// 2^-9) carried as bytes: Metal has no fp8 type.
//
// - fp8_to_float / float_to_fp8: bit-exact with torch's CPU conversions
//   (round to nearest even; everything of magnitude >= 448, infinities
//   included, saturates to +-448; NaN keeps its sign, and decodes to the
//   float torch gives, 0x7FF00000 with the sign).
// - fp8x4_to_half4_div256: the inner-loop decode. The 7 magnitude bits of a
//   byte shifted into a half's exponent and mantissa fields (bits 13..7) give
//   exactly x / 256 for zeros and normal codes, whose smallest, 2^-6 / 256, is
//   half's smallest normal, with two ANDs, two shifts and an OR for four
//   bytes. An e4m3 subnormal would become a half subnormal, which a GPU may
//   flush to zero: fp8x4_subnormals says where the decode is exact.
// - fp8x4_to_float4_div256: the same values for every code, through floats,
//   never through a denormal, at about four times the operations: the decode
//   of a word that holds a subnormal.
//   Callers fold the 256 back into a scale once per dot product. NaN codes
//   decode to finite values: use fp8x4_has_nan to catch them.
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

// Four e4m3 bytes (little-endian in w) as half values x / 256, exact where
// fp8x4_subnormals(w) is 0.
inline half4 fp8x4_to_half4_div256(uint w) {
  const uint lo = (w & 0xFFu) | ((w & 0xFF00u) << 8);
  const uint hi = ((w >> 16) & 0xFFu) | ((w >> 8) & 0xFF0000u);
  const uint2 h = uint2(((lo & 0x007F007Fu) << 7) | ((lo & 0x00800080u) << 8),
                        ((hi & 0x007F007Fu) << 7) | ((hi & 0x00800080u) << 8));
  return metal::as_type<half4>(h);
}

// Bit 7 of each byte of the result is set where that byte of w is a
// subnormal code (exponent field 0, mantissa not 0). Per byte, adding 0x78
// to the exponent field sets bit 7 unless it is 0, and adding 0x7F to the
// mantissa sets it unless that is 0; no sum carries into the next byte.
inline uint fp8x4_subnormals(uint w) {
  const uint exponent_set = (w & 0x78787878u) + 0x78787878u, mantissa_set = (w & 0x07070707u) + 0x7F7F7F7Fu;
  return mantissa_set & ~exponent_set & 0x80808080u;
}

// Four e4m3 bytes (little-endian in w) as float values x / 256.
inline float4 fp8x4_to_float4_div256(uint w) {
  const uint4 bytes = (uint4(w) >> uint4(0, 8, 16, 24)) & 0xFFu;
  const uint4 magnitude = bytes & 0x7Fu;
  // Exponent e (bias 7) becomes e + 112 (bias 127, less 8 for the / 256).
  const float4 normal = metal::as_type<float4>((magnitude << 20) + (112u << 23));
  const float4 subnormal = float4(magnitude) * (1.0f / 131072.0f);
  const float4 value = metal::select(normal, subnormal, (magnitude >> 3) == 0u);
  return metal::as_type<float4>(metal::as_type<uint4>(value) | ((bytes & 0x80u) << 24));
}

// Whether any of the four bytes is a NaN code (a magnitude of 0x7F carries into bit 7).
inline bool fp8x4_has_nan(uint w) { return (((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) != 0; }

// float8 e5m2 (1 sign, 5 exponent bits with bias 15, 2 mantissa bits, infinities and NaN as in IEEE) is the
// top byte of a half: decoding is a shift, exact for every code.
inline float e5m2_to_float(uchar b) { return float(metal::as_type<half>(ushort(ushort(b) << 8))); }

// Four e5m2 bytes (little-endian in w) as half values.
inline half4 e5m2x4_to_half4(uint w) {
  return metal::as_type<half4>(uint2(((w & 0xFFu) << 8) | ((w & 0xFF00u) << 16),
                                     ((w >> 8) & 0xFF00u) | ((w >> 24) << 24)));
}

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
