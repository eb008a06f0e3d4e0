// e4m3fn weights for the decode GEMV loop of mps_ext/gemv.h: the weight
// policy of kernels that stream FP8 matrices (one scale per block_n x
// block_k block; per channel is block_n = 1, block_k = k).
#pragma once

#include <metal_stdlib>

#include "mps_ext/fp8.h"

namespace mps_ext {

// 16 bytes of a row per lane and step, decoded as x / 256 (scale() gives the
// 256 back, with the row's scale when there is one block along k); NaN codes
// read as NaN. Block scales that change along k multiply each chunk
// (block_k % 16 == 0, so a chunk lies inside one block).
struct Fp8Weights {
  enum : uint { kPerLane = 16 };
  device const uchar* w;
  ulong row_stride;
  bool vectorized;  // w and every row start 16-byte aligned
  device const float* scales;
  uint block_n, block_k, scale_cols;
  bool per_chunk;

  void load(uint row, uint k, uint end, thread float4* out) const {
    device const uchar* p = w + row * row_stride;
    uint4 u = uint4(0);
    if (vectorized && k + 16 <= end) {
      u = *reinterpret_cast<device const uint4*>(p + k);
    } else {
      for (uint j = 0; j < 16; ++j)
        if (k + j < end) u[j / 4] |= uint(p[k + j]) << (8 * (j % 4));
    }
    const bool nan = fp8x4_has_nan(u.x) || fp8x4_has_nan(u.y) || fp8x4_has_nan(u.z) || fp8x4_has_nan(u.w);
    const float s = nan ? NAN : (per_chunk && k < end) ? scales[(row / block_n) * scale_cols + k / block_k] : 1.0f;
    for (uint c = 0; c < 4; ++c) out[c] = float4(fp8x4_to_half4_div256(u[c])) * s;
  }
  float scale(uint row) const { return per_chunk ? 256.0f : 256.0f * scales[(row / block_n) * scale_cols]; }
};

}  // namespace mps_ext
