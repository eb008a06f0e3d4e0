// e4m3fn (and e5m2) weights for the decode GEMV loop of mps_ext/gemv.h: the
// weight policy of every kernel that streams FP8 matrices (fp8_linear,
// scaled_mm, fp8_grouped_mm), one scale per block_n x block_k block (per
// channel is block_n = 1, block_k = k).
#pragma once

#include <metal_stdlib>

#include "mps_ext/fp8_decode.h"
#include "mps_ext/unroll.h"

namespace mps_ext {

// Bytes (8 or 16) bytes of a row from byte k, zeros at or past `end`: one
// load when `vectorized` (the row is then 16-byte aligned); unchecked, the
// caller guarantees both.
template <uint Bytes, bool Checked = true>
inline metal::vec<uint, Bytes / 4> fp8_fetch(device const uchar* row, uint k, uint end, bool vectorized) {
  typedef metal::vec<uint, Bytes / 4> words;
  if (!Checked || (vectorized && k + Bytes <= end)) return *reinterpret_cast<device const words*>(row + k);
  words u = words(0);
  MPS_EXT_UNROLL
  for (uint j = 0; j < Bytes; ++j)
    if (k + j < end) u[j / 4] |= uint(row[k + j]) << (8 * (j % 4));
  return u;
}

// Fetched bytes as floats: e4m3fn bytes divided by 256, NaN codes as NaN;
// e5m2 bytes (scaled_mm) divided by 256 too, their infinities and NaN as they
// are.
template <uint Bytes>
inline void fp8_decode(metal::vec<uint, Bytes / 4> u, thread float4* out, bool e5m2) {
  constexpr uint W = Bytes / 4;
  if (e5m2) {
    MPS_EXT_UNROLL
    for (uint c = 0; c < W; ++c) out[c] = float4(e5m2x4_to_half4(u[c])) * (1.0f / 256.0f);
    return;
  }
  // NaN codes do not occur in real weights: loads without one take the half
  // decode, the others the float one, which gives NaN its NaN.
  uint nan = 0;
  MPS_EXT_UNROLL
  for (uint c = 0; c < W; ++c) nan |= fp8x4_nan(u[c]);
  if ((nan & 0x80808080u) == 0) {
    MPS_EXT_UNROLL
    for (uint c = 0; c < W; ++c) out[c] = float4(fp8x4_to_half4_div256(u[c]));
    return;
  }
  MPS_EXT_UNROLL
  for (uint c = 0; c < W; ++c) out[c] = fp8x4_to_float4_div256(u[c]);
}

// e4m3fn weights for gemv.h's loop (and e5m2 ones where MayBeE5m2, scaled_mm's
// operands: the format test stays out of the loop of every other kernel):
// Bytes (8 or 16) bytes of a row per lane and chunk as x / 256 (scale() gives
// the 256 back, with the row's scale when there is one block along k), NaN
// codes as NaN; block scales that change along k multiply each chunk
// (block_k % Bytes == 0: a chunk is inside one block).
template <uint Bytes, bool MayBeE5m2 = false>
struct Fp8Weights {
  enum : uint { kPerLane = Bytes };
  typedef metal::vec<uint, Bytes / 4> Raw;
  device const uchar* w;
  ulong row_stride;
  bool vectorized;
  device const float* scales;
  uint block_n, block_k, scale_cols;
  bool per_chunk;
  bool e5m2 = false;  // read only where MayBeE5m2

  template <bool Checked = true>
  Raw fetch(uint row, uint k, uint end) const {
    return fp8_fetch<Bytes, Checked>(w + row * row_stride, k, end, vectorized);
  }
  template <bool Checked = true>
  void decode(Raw raw, uint row, uint k, uint end, thread float4* out) const {
    fp8_decode<Bytes>(raw, out, MayBeE5m2 && e5m2);
    if (per_chunk && (!Checked || k < end)) {
      const float s = scales[(row / block_n) * scale_cols + k / block_k];
      MPS_EXT_UNROLL
      for (uint c = 0; c < Bytes / 4; ++c) out[c] *= s;
    }
  }
  float scale(uint row) const { return per_chunk ? 256.0f : 256.0f * scales[(row / block_n) * scale_cols]; }
};

}  // namespace mps_ext
