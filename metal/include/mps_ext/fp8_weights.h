// e4m3fn (and e5m2) weights for the decode GEMV loop of mps_ext/gemv.h: the
// weight policy of every kernel that streams FP8 matrices (fp8_linear,
// scaled_mm, fp8_grouped_mm), one scale per block_n x block_k block (per
// channel is block_n = 1, block_k = k).
#pragma once

#include <metal_stdlib>

#include "mps_ext/fp8_decode.h"
#include "mps_ext/unroll.h"

namespace mps_ext {

// Elements [k, k + Bytes) of a row as floats (Bytes: 8 or 16), zeros at or
// past `end`: one load of Bytes bytes when `vectorized` (the row is then
// 16-byte aligned); unchecked, the caller guarantees both. e4m3fn bytes come
// out divided by 256; the result says whether a NaN code was among them.
// e5m2 bytes (scaled_mm) come out divided by 256 too, their infinities and
// NaN as they are.
template <uint Bytes, bool Checked = true>
inline bool fp8_load(device const uchar* row, uint k, uint end, bool vectorized, thread float4* out,
                     bool e5m2 = false) {
  constexpr uint W = Bytes / 4;  // 32-bit words, four bytes each
  typedef metal::vec<uint, W> words;
  words u = words(0);
  if (!Checked || (vectorized && k + Bytes <= end)) {
    u = *reinterpret_cast<device const words*>(row + k);
  } else {
    MPS_EXT_UNROLL
    for (uint j = 0; j < Bytes; ++j)
      if (k + j < end) u[j / 4] |= uint(row[k + j]) << (8 * (j % 4));
  }
  if (e5m2) {
    MPS_EXT_UNROLL
    for (uint c = 0; c < W; ++c) out[c] = float4(e5m2x4_to_half4(u[c])) * (1.0f / 256.0f);
    return false;
  }
  // Subnormal and NaN codes are rare in real weights (subnormals lie below
  // 2^-6 of the scale): words without one take the half decode, the others
  // the float one.
  uint inexact = 0;
  MPS_EXT_UNROLL
  for (uint c = 0; c < W; ++c) inexact |= fp8x4_half_inexact(u[c]);
  if (inexact == 0) {
    MPS_EXT_UNROLL
    for (uint c = 0; c < W; ++c) out[c] = float4(fp8x4_to_half4_div256(u[c]));
    return false;
  }
  bool nan = false;
  MPS_EXT_UNROLL
  for (uint c = 0; c < W; ++c) {
    out[c] = fp8x4_to_float4_div256(u[c]);
    nan = nan || fp8x4_has_nan(u[c]);
  }
  return nan;
}

// e4m3fn weights for gemv.h's loop: Bytes (8 or 16) bytes of a row per lane
// and step as x / 256 (scale() gives the 256 back, with the row's scale when there is
// one block along k), NaN codes as NaN; block scales that change along k
// multiply each chunk (block_k % Bytes == 0: a chunk is inside one block).
template <uint Bytes>
struct Fp8Weights {
  enum : uint { kPerLane = Bytes };
  device const uchar* w;
  ulong row_stride;
  bool vectorized;
  device const float* scales;
  uint block_n, block_k, scale_cols;
  bool per_chunk;
  bool e5m2 = false;  // scaled_mm's e5m2 operands

  template <bool Checked = true>
  void load(uint row, uint k, uint end, thread float4* out) const {
    const bool nan = fp8_load<Bytes, Checked>(w + row * row_stride, k, end, vectorized, out, e5m2);
    if (per_chunk && (!Checked || k < end)) {
      const float s = scales[(row / block_n) * scale_cols + k / block_k];
      MPS_EXT_UNROLL
      for (uint c = 0; c < Bytes / 4; ++c) out[c] *= s;
    }
    if (nan) out[0].x = NAN;  // poisons the dot product whatever a holds (NaN x 0 is NaN)
  }
  float scale(uint row) const { return per_chunk ? 256.0f : 256.0f * scales[(row / block_n) * scale_cols]; }
};

}  // namespace mps_ext
