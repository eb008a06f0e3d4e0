// Kernel parameter structs, shared by the host code (C++) and the kernels
// (MSL): one definition, so the two sides cannot drift. Sizes are asserted.
#pragma once

#if defined(__METAL_VERSION__)
typedef uint mps_ext_u32;
#else
#include <cstdint>
typedef uint32_t mps_ext_u32;
#endif

namespace mps_ext {

// Softmax over `cols` elements of each of `rows` rows.
struct SoftmaxParams {
  mps_ext_u32 rows;
  mps_ext_u32 cols;
  mps_ext_u32 inner;    // strided kernel: distance between a row's elements (rows = outer * inner)
  mps_ext_u32 chunks;   // split kernels: threadgroups per row
  mps_ext_u32 chunk;    // split kernels: elements per threadgroup
  mps_ext_u32 vectorized;  // 1 when rows can be read with 4-wide loads (aligned, cols % 4 == 0)
};
static_assert(sizeof(SoftmaxParams) == 24, "SoftmaxParams layout");

}  // namespace mps_ext
