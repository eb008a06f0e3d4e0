// The inner-loop decodes of float8 bytes (see mps_ext/fp8.h for the formats),
// four bytes of a 32-bit word at a time, for the kernels that stream FP8 rows
// (mps_ext/fp8_weights.h).
//
// - fp8x4_to_half4_div256: the inner-loop decode. The 7 magnitude bits of a
//   byte shifted into a half's exponent and mantissa fields (bits 13..7) give
//   exactly x / 256 for zeros and normal codes, whose smallest, 2^-6 / 256, is
//   half's smallest normal, in nine integer operations for four bytes. An
//   e4m3 subnormal would become a half subnormal, which a GPU may
//   flush to zero, and a NaN code a finite value: fp8x4_not_normal says
//   where the decode may be inexact.
// - fp8x4_to_float4_div256: the same values for every code, NaN codes as NaN,
//   through floats, never through a denormal, at about four times the
//   operations: the decode of bytes among which the half decode may be
//   inexact.
//   Callers fold the 256 back into a scale once per dot product.
// - e5m2x4_to_half4: e5m2 is the top byte of a half, so its decode is a
//   shift, exact for every code.
#pragma once

#include <metal_stdlib>

namespace mps_ext {

// Four e4m3 bytes (little-endian in w) as half values x / 256, exact where
// fp8x4_half_inexact(w) is 0. The magnitude bits of bytes 1 and 3 move right
// by one into their halves of a word, their sign bits are in place already;
// bytes 0 and 2 move left: nine operations for the four.
inline half4 fp8x4_to_half4_div256(uint w) {
  const half2 even = metal::as_type<half2>(((w << 7) & 0x3F803F80u) | ((w << 8) & 0x80008000u));
  const half2 odd = metal::as_type<half2>(((w >> 1) & 0x3F803F80u) | (w & 0x80008000u));
  return half4(even.x, odd.x, even.y, odd.y);
}

// Bit 7 of each byte of the result is set where that byte of w is not a
// normal code (magnitude 8..126): a subnormal (a half subnormal, which a GPU
// may flush), NaN (a finite half) or zero; bits 0-6 are noise. Per byte of
// the magnitudes m (no sum carries into the next byte): m + 0x78 leaves bit 7
// clear when m < 8, m + 1 sets it only for NaN. Zeros decode exactly but share
// the test: telling them apart costs two more operations per word, and
// quantized weights hold fewer zeros than subnormals.
inline uint fp8x4_not_normal(uint w) {
  const uint m = w & 0x7F7F7F7Fu;
  return ~(m + 0x78787878u) | (m + 0x01010101u);
}

// Four e4m3 bytes (little-endian in w) as float values x / 256.
inline float4 fp8x4_to_float4_div256(uint w) {
  const uint4 bytes = (uint4(w) >> uint4(0, 8, 16, 24)) & 0xFFu;
  const uint4 magnitude = bytes & 0x7Fu;
  // Exponent e (bias 7) becomes e + 112 (bias 127, less 8 for the / 256).
  const float4 normal = metal::as_type<float4>((magnitude << 20) + (112u << 23));
  const float4 subnormal = float4(magnitude) * (1.0f / 131072.0f);
  float4 value = metal::select(normal, subnormal, (magnitude >> 3) == 0u);
  value = metal::select(value, float4(NAN), magnitude == 0x7Fu);
  return metal::as_type<float4>(metal::as_type<uint4>(value) | ((bytes & 0x80u) << 24));
}

// Four e5m2 bytes (little-endian in w) as half values.
inline half4 e5m2x4_to_half4(uint w) {
  return metal::as_type<half4>(uint2(((w & 0xFFu) << 8) | ((w & 0xFF00u) << 16),
                                     ((w >> 8) & 0xFF00u) | ((w >> 24) << 24)));
}

}  // namespace mps_ext
