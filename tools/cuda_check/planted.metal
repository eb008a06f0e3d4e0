// Planted bugs: each must be flagged by the compute-sanitizer tool named in
// its host name, or the CUDA check's sanitizer verdicts prove nothing.
#include <metal_stdlib>

using namespace metal;

// racecheck: each thread reads its neighbour's threadgroup slot with no
// barrier after the writes.
kernel void planted_race(device float* out [[buffer(0)]], uint tid [[thread_position_in_threadgroup]],
                         uint size [[threads_per_threadgroup]]) {
  threadgroup float slots[256];
  slots[tid] = float(tid);
  out[tid] = slots[(tid + 1) % size];
}

// memcheck: the last thread writes one element past the buffer (n elements).
kernel void planted_oob(device float* out [[buffer(0)]], constant uint& n [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) {
  out[i == n - 1 ? n : i] = 1.0f;
}

// synccheck: a threadgroup barrier reached by only half of the threads.
kernel void planted_divergent_barrier(device float* out [[buffer(0)]],
                                      uint tid [[thread_position_in_threadgroup]]) {
  threadgroup float slots[256];
  slots[tid] = float(tid);
  if (tid < 16) threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = slots[tid];
}
