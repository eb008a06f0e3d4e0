// Kernels `python -m mps_ext selftest` runs in the simulator to show it works
// on this machine: one per execution feature.
#include <metal_stdlib>
using namespace metal;

// A non-uniform grid: the last threadgroup is partial.
kernel void axpy(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                 constant float& a [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  y[i] = a * x[i] + y[i];
}

// Threadgroup memory, barriers and simd_sum: one sum per threadgroup.
kernel void block_sum(device const float* x [[buffer(0)]], device float* sums [[buffer(1)]],
                      constant uint& n [[buffer(2)]], uint i [[thread_position_in_grid]],
                      uint group [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]],
                      uint sg [[simdgroup_index_in_threadgroup]], uint simdgroups [[simdgroups_per_threadgroup]]) {
  threadgroup float partial[32];
  float v = simd_sum(i < n ? x[i] : 0.0f);
  if (lane == 0) partial[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg == 0) {
    v = simd_sum(lane < simdgroups ? partial[lane] : 0.0f);
    if (lane == 0) sums[group] = v;
  }
}

// simdgroup_matrix: C = A B for 32x32 matrices, one SIMD group per 8x8 tile of C.
kernel void matmul32(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                     device float* c [[buffer(2)]], uint2 tile [[threadgroup_position_in_grid]]) {
  simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  for (uint k = 0; k < 32; k += 8) {
    simdgroup_float8x8 ma, mb;
    simdgroup_load(ma, a, 32, ulong2(k, tile.y * 8));
    simdgroup_load(mb, b, 32, ulong2(tile.x * 8, k));
    simdgroup_multiply_accumulate(acc, ma, mb, acc);
  }
  simdgroup_store(acc, c, 32, ulong2(tile.x * 8, tile.y * 8));
}

// Device atomics from many threadgroups running on different CPU threads.
kernel void histogram(device const uint* x [[buffer(0)]], device atomic_uint* bins [[buffer(1)]],
                      uint i [[thread_position_in_grid]]) {
  atomic_fetch_add_explicit(&bins[x[i] % 16], 1u, memory_order_relaxed);
}
