// The inner-loop decodes of float8 bytes (see mps_ext/fp8.h for the formats),
// four bytes of a 32-bit word at a time, for the kernels that stream FP8 rows
// (mps_ext/fp8_weights.h).
//
// - fp8x4_to_half4_div256: the inner-loop decode. The 7 magnitude bits of a
//   byte shifted into a half's exponent and mantissa fields (bits 13..7) give
//   exactly x / 256 for every code but NaN, in nine integer operations for
//   four bytes: normal codes land on normal halves (the smallest, 2^-6 / 256,
//   is half's smallest normal), subnormal codes on half subnormals. Apple's
//   GPUs keep half subnormals: Mesa's Vulkan driver for them reports 16-bit
//   denormals preserved, with no 16-bit flush-to-zero mode (32-bit ones
//   flush). e5m2x4_to_half4 relies on the same, and
//   tests/test_metal_hardware.py checks every code through fp8_linear on a
//   Mac. A NaN code would become a finite half: fp8x4_nan says where.
// - fp8x4_to_float4_div256: the same values for every code, NaN codes as NaN,
//   through floats, at about four times the operations: the decode of bytes
//   among which fp8x4_nan finds a NaN code, and of the tiled kernels.
//   Callers fold the 256 back into a scale once per dot product.
// - e5m2x4_to_half4: e5m2 is the top byte of a half, so its decode is a
//   shift, exact for every code.
#pragma once

#include <metal_stdlib>

namespace mps_ext {

// Four e4m3 bytes (little-endian in w) as half values x / 256, exact for
// every code but NaN (fp8x4_nan). The magnitude bits of bytes 1 and 3 move
// right by one into their halves of a word, their sign bits are in place
// already; bytes 0 and 2 move left: nine operations for the four.
inline half4 fp8x4_to_half4_div256(uint w) {
  const half2 even = metal::as_type<half2>(((w << 7) & 0x3F803F80u) | ((w << 8) & 0x80008000u));
  const half2 odd = metal::as_type<half2>(((w >> 1) & 0x3F803F80u) | (w & 0x80008000u));
  return half4(even.x, odd.x, even.y, odd.y);
}

// Bit 7 of each byte of the result is set where that byte of w is a NaN code
// (magnitude 0x7F), bits 0-6 are noise: per byte of the magnitudes, m + 1
// sets bit 7 only for 0x7F and never carries into the next byte. Two
// operations per word; the test that also sent subnormals and zeros to the
// float decode took four and cost fp8_linear 3-13% at one row of a on the
// CUDA proxy (docs/performance.md).
inline uint fp8x4_nan(uint w) { return (w & 0x7F7F7F7Fu) + 0x01010101u; }

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
