// Kernels with deliberate bugs that checked mode must catch, each next to a
// correct twin that it must pass without a false alarm.
#include <metal_stdlib>
using namespace metal;

// BUG: reads the slot another thread writes, with no barrier in between.
kernel void reverse_missing_barrier(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                                    uint i [[thread_position_in_grid]], uint t [[thread_position_in_threadgroup]],
                                    uint n [[threads_per_threadgroup]]) {
  threadgroup float tile[256];
  tile[t] = x[i];
  y[i] = tile[n - 1 - t];
}

kernel void reverse_with_barrier(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                                 uint i [[thread_position_in_grid]], uint t [[thread_position_in_threadgroup]],
                                 uint n [[threads_per_threadgroup]]) {
  threadgroup float tile[256];
  tile[t] = x[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = tile[n - 1 - t];
}

// BUG: even and odd lanes call different SIMD-group functions.
kernel void divergent_simd_sum(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                               uint i [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
  float v = x[i];
  if (lane % 2 == 0) {
    v = simd_sum(v);
  } else {
    v = simd_max(v);
  }
  y[i] = v;
}

kernel void uniform_simd_sum(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                             uint i [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
  const float s = simd_sum(x[i]);
  const float m = simd_max(x[i]);
  y[i] = lane % 2 == 0 ? s : m;
}

// BUG: no bounds check, dispatched over a grid rounded up to whole threadgroups.
kernel void scale_unchecked(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                            uint i [[thread_position_in_grid]]) {
  y[i] = 2.0f * x[i];
}

kernel void scale_checked(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                          constant uint& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  if (i < n) y[i] = 2.0f * x[i];
}

// BUG: off by one, writing one element past the end.
kernel void write_one_past(device float* y [[buffer(0)]], constant uint& n [[buffer(1)]],
                           uint i [[thread_position_in_grid]]) {
  if (i <= n) y[i] = 1.0f;
}

// BUG: 36000 bytes of threadgroup memory; Metal allows 32768.
kernel void threadgroup_too_big(device float* y [[buffer(0)]], uint t [[thread_position_in_threadgroup]]) {
  threadgroup float big[9000];
  big[t] = 1.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[t] = big[8999 - t];
}

kernel void threadgroup_at_limit(device float* y [[buffer(0)]], uint t [[thread_position_in_threadgroup]]) {
  threadgroup float big[8192];
  for (uint k = t; k < 8192; k += 32) big[k] = float(k);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[t] = big[8191 - t];
}

// BUG: threads that returned early never reach the barrier the others wait at.
kernel void barrier_after_return(device float* y [[buffer(0)]], constant uint& n [[buffer(1)]],
                                 uint i [[thread_position_in_grid]], uint t [[thread_position_in_threadgroup]]) {
  threadgroup float tile[64];
  if (i >= n) return;
  tile[t] = float(i);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[i] = tile[t];
}

// BUG: a per-thread array far larger than a GPU thread's stack.
kernel void huge_local_array(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  volatile float scratch[40000];
  for (uint k = 0; k < 40000; k += 1000) scratch[k] = float(k + i);
  y[i] = scratch[(i * 1000) % 40000];
}

// BUG: integer division by zero (the GPU returns garbage; a CPU traps).
kernel void divide_by_zero(device int* y [[buffer(0)]], constant int& d [[buffer(1)]],
                           uint i [[thread_position_in_grid]]) {
  y[i] = int(i) / d;
}

// BUG: float4 loads from a float buffer at an odd element offset: misaligned.
kernel void misaligned_vector_load(device const float* x [[buffer(0)]], device float4* y [[buffer(1)]],
                                   uint i [[thread_position_in_grid]]) {
  y[i] = reinterpret_cast<device const float4*>(x + 1)[i];
}

kernel void aligned_vector_load(device const float* x [[buffer(0)]], device float4* y [[buffer(1)]],
                                uint i [[thread_position_in_grid]]) {
  y[i] = reinterpret_cast<device const float4*>(x + 4)[i];
}
