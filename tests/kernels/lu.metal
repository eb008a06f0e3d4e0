// Batched LU factorization with partial pivoting, as LAPACK's getrf: one
// threadgroup per matrix held in threadgroup memory, one thread per row.
// Pivots are 1-based; ties in |a| go to the lowest row, as idamax does.
#include <metal_stdlib>
using namespace metal;

constant constexpr uint kMaxN = 32;

struct LUParams {
  uint n;
  uint batch;
};

kernel void lu_factor(device float* a [[buffer(0)]], device int* pivots [[buffer(1)]],
                      device int* info [[buffer(2)]], constant LUParams& p [[buffer(3)]],
                      uint batch [[threadgroup_position_in_grid]],
                      uint row [[thread_position_in_threadgroup]]) {
  threadgroup float m[kMaxN][kMaxN + 1];  // +1: rows in different banks
  threadgroup uint pivot_row;
  threadgroup int first_zero;
  const uint n = p.n;
  device float* mat = a + ulong(batch) * n * n;
  for (uint j = 0; j < n; ++j) m[row][j] = mat[row * n + j];
  if (row == 0) first_zero = 0;
  threadgroup_barrier(mem_flags::mem_threadgroup);

  for (uint k = 0; k < n; ++k) {
    if (row == 0) {
      uint best = k;
      for (uint i = k + 1; i < n; ++i)
        if (fabs(m[i][k]) > fabs(m[best][k])) best = i;
      pivot_row = best;
      pivots[batch * n + k] = int(best + 1);
      if (m[best][k] == 0.0f && first_zero == 0) first_zero = int(k + 1);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    // Rows k and pivot_row swap: both read the other row before either writes.
    const uint pr = pivot_row;
    const bool swapping = pr != k && (row == k || row == pr);
    float other[kMaxN];
    if (swapping)
      for (uint j = 0; j < n; ++j) other[j] = m[row == k ? pr : k][j];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (swapping)
      for (uint j = 0; j < n; ++j) m[row][j] = other[j];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const float d = m[k][k];
    if (row > k && d != 0.0f) {
      const float l = m[row][k] / d;
      m[row][k] = l;
      for (uint j = k + 1; j < n; ++j) m[row][j] -= l * m[k][j];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  for (uint j = 0; j < n; ++j) mat[row * n + j] = m[row][j];
  if (row == 0) info[batch] = first_zero;
}
