// The e4m3fn codec of metal/include/mps_ext/fp8.h, one value per thread, for
// exhaustive comparison with torch's CPU conversions.
#include <metal_stdlib>

#include "mps_ext/fp8.h"
#include "mps_ext/fp8_decode.h"

using namespace metal;

kernel void decode(device const uchar* codes [[buffer(0)]], device float* out [[buffer(1)]],
                   uint i [[thread_position_in_grid]]) {
  out[i] = mps_ext::fp8_to_float(codes[i]);
}

// The inner-loop decodes, scaled back: four codes per thread through floats
// and through halves, and the NaN codes, which the half decode makes finite.
kernel void decode_fast(device const uint* codes [[buffer(0)]], device float4* out [[buffer(1)]],
                        device float4* out_half [[buffer(2)]], device uint* nan [[buffer(3)]],
                        uint i [[thread_position_in_grid]]) {
  out[i] = mps_ext::fp8x4_to_float4_div256(codes[i]) * 256.0f;
  out_half[i] = float4(mps_ext::fp8x4_to_half4_div256(codes[i])) * 256.0f;
  nan[i] = mps_ext::fp8x4_nan(codes[i]) & 0x80808080u;
}

kernel void encode(device const float* values [[buffer(0)]], device uchar* out [[buffer(1)]],
                   uint i [[thread_position_in_grid]]) {
  out[i] = mps_ext::float_to_fp8(values[i]);
}
