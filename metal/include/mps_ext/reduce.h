// Reductions across a threadgroup: SIMD-group functions first, then one
// exchange through threadgroup memory. Every thread gets the result.
#pragma once

#include <metal_stdlib>

namespace mps_ext {

struct MaxOp {
  static float simd(float v) { return metal::simd_max(v); }
  static float identity() { return -INFINITY; }
};

struct SumOp {
  static float simd(float v) { return metal::simd_sum(v); }
  static float identity() { return 0.0f; }
};

// `scratch` holds one float per SIMD group (32). The trailing barrier lets the
// caller reuse it for the next reduction.
template <typename Op>
inline float threadgroup_reduce(float v, threadgroup float* scratch, uint simd_group, uint lane, uint simd_groups) {
  v = Op::simd(v);
  if (simd_groups == 1) return v;
  if (lane == 0) scratch[simd_group] = v;
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  v = Op::simd(lane < simd_groups ? scratch[lane] : Op::identity());
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  return v;
}

}  // namespace mps_ext
