// MSL as upstream kernels write it (ggml, PyTorch's c10/metal headers): no
// `using namespace metal;` (c10 style), as_type called unqualified from a
// namespace of its own, select with an integer condition, and
// make_filled_simdgroup_matrix with the row count defaulted.
#include <metal_stdlib>

namespace lib {
namespace metal {  // shadows ::metal inside lib, as c10::metal does
inline float flip_sign(float x) { return as_type<float>(as_type<uint>(x) ^ 0x80000000u); }
}  // namespace metal
}  // namespace lib

kernel void idioms(device const float* x [[buffer(0)]], device const uint* bits [[buffer(1)]],
                   device float* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  device float* o = out + i * 3;
  o[0] = lib::metal::flip_sign(x[i]);
  o[1] = float(metal::select(1, -1, bits[i] & 4u));   // -1 where bit 2 is set
  o[2] = metal::select(x[i], 0.5f, int(bits[i]) & 1); // 0.5 where bit 0 is set
}

kernel void filled(device float* out [[buffer(0)]], constant float& value [[buffer(1)]]) {
  const metal::simdgroup_float8x8 m = metal::make_filled_simdgroup_matrix<float, 8>(value);
  metal::simdgroup_store(m, out, 8);
}
