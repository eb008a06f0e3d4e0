// The inner-loop decodes of float8 bytes (see mps_ext/fp8.h for the formats),
// four bytes of a 32-bit word at a time, for the kernels that stream FP8 rows
// (mps_ext/fp8_weights.h).
//
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
// - e5m2x4_to_half4: e5m2 is the top byte of a half, so its decode is a
//   shift, exact for every code.
#pragma once

#include <metal_stdlib>

namespace mps_ext {

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

// Four e5m2 bytes (little-endian in w) as half values.
inline half4 e5m2x4_to_half4(uint w) {
  return metal::as_type<half4>(uint2(((w & 0xFFu) << 8) | ((w & 0xFF00u) << 16),
                                     ((w >> 8) & 0xFF00u) | ((w >> 24) << 24)));
}

}  // namespace mps_ext
