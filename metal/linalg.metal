// Small-matrix linear algebra: LU factorization with partial pivoting
// (LAPACK getrf), solves with an LU factorization (getrs) and triangular
// solves (trsm), for batches of systems of order n <= 64, float and complex64
// (float2).
//
// - thread: n <= 4, one thread per system, the matrix in registers; `solve`
//   factors and solves in the same thread (one dispatch), and so does
//   `inverse`.
// - simd: one SIMD group per matrix (factor: the matrix column-major in
//   threadgroup memory, lane l owning rows l and l + 32) or per (system,
//   right-hand side) (solves: the column in registers, lane l owning rows l and
//   l + 32, the solved value of each step broadcast from lane to lane).
// - lu_inverse_simd: factors as lu_factor_simd, then solves for each column
//   of the identity from the factors in threadgroup memory (one dispatch).
// - inverse: float triangles of order 16, 32 or 64 with at least 8 right-hand
//   sides: one threadgroup per system builds the inverse of the triangle (a
//   thread per column) and applies it to every right-hand side.
//
// Pivots are the ones LAPACK picks: the first row holding the largest |a|
// (|re| + |im| for complex, as icamax), 1-based; info is the first k
// (1-based) with U[k, k] exactly zero, and the factorization goes on past it.
#include <metal_stdlib>

#include "mps_ext/complex.h"
#include "mps_ext/params.h"

using namespace metal;
using mps_ext::LinalgParams;

inline bool is_zero(float a) { return a == 0.0f; }
inline bool is_zero(float2 a) { return a.x == 0.0f && a.y == 0.0f; }

constant constexpr uint kTinyN = 4;   // thread kernels: largest order
constant constexpr uint kMaxN = 64;   // simd kernels: largest order
constant constexpr uint kSlots = kMaxN / 32;  // rows per lane
// The row pivot step k moves to row k, after the swaps of steps 0..k-1 have
// been applied; for the row the permutation P^T b places at `row`, trace the
// swaps backwards. Out-of-range pivots (rejected by the host) are ignored.
inline uint permuted_source(device const int* piv, uint n, uint row, bool forward) {
  uint src = row;
  for (uint s = 0; s < n; ++s) {
    const uint j = forward ? s : n - 1 - s;
    const uint p = uint(piv[j] - 1);
    if (p >= n) continue;
    if (src == j) src = p;
    else if (src == p) src = j;
  }
  return src;
}

// ---------------------------------------------------------------------------
// thread kernels (n <= 4): the matrix row-major in a[i * kTinyN + j].

template <typename T>
inline uint factor_in_registers(thread T* a, thread uint* piv, uint n) {
  uint info = 0;
  for (uint k = 0; k < n; ++k) {
    uint p = k;
    float best = mps_ext::abs1(a[k * kTinyN + k]);
    for (uint i = k + 1; i < n; ++i) {
      const float v = mps_ext::abs1(a[i * kTinyN + k]);
      if (v > best) {
        best = v;
        p = i;
      }
    }
    piv[k] = p;
    if (p != k)
      for (uint j = 0; j < n; ++j) {
        const T t = a[k * kTinyN + j];
        a[k * kTinyN + j] = a[p * kTinyN + j];
        a[p * kTinyN + j] = t;
      }
    const T d = a[k * kTinyN + k];
    if (is_zero(d)) {
      if (info == 0) info = k + 1;
      continue;
    }
    const bool use_reciprocal = mps_ext::reciprocal_is_safe(d);
    const T r = mps_ext::creciprocal(d);
    for (uint i = k + 1; i < n; ++i) {
      const T l = mps_ext::divide(a[i * kTinyN + k], d, r, use_reciprocal);
      a[i * kTinyN + k] = l;
      for (uint j = k + 1; j < n; ++j) a[i * kTinyN + j] -= mps_ext::cmul(l, a[k * kTinyN + j]);
    }
  }
  return info;
}

// Solves A x = b (or A^H x = b) for one column with A = P L U held in `lu`.
template <typename T>
inline void solve_in_registers(thread const T* lu, thread const uint* piv, thread T* x, uint n, bool adjoint) {
  if (!adjoint) {
    for (uint k = 0; k < n; ++k) {
      const T t = x[k];
      x[k] = x[piv[k]];
      x[piv[k]] = t;
    }
    for (uint i = 1; i < n; ++i)
      for (uint j = 0; j < i; ++j) x[i] -= mps_ext::cmul(lu[i * kTinyN + j], x[j]);
    for (uint i = n; i-- > 0;) {
      for (uint j = i + 1; j < n; ++j) x[i] -= mps_ext::cmul(lu[i * kTinyN + j], x[j]);
      x[i] = mps_ext::cdiv(x[i], lu[i * kTinyN + i]);
    }
    return;
  }
  // A^H = U^H L^H P^T.
  for (uint i = 0; i < n; ++i) {
    for (uint j = 0; j < i; ++j) x[i] -= mps_ext::cmul(mps_ext::cconj(lu[j * kTinyN + i]), x[j]);
    x[i] = mps_ext::cdiv(x[i], mps_ext::cconj(lu[i * kTinyN + i]));
  }
  for (uint i = n; i-- > 0;)
    for (uint j = i + 1; j < n; ++j) x[i] -= mps_ext::cmul(mps_ext::cconj(lu[j * kTinyN + i]), x[j]);
  for (uint k = n; k-- > 0;) {
    const T t = x[k];
    x[k] = x[piv[k]];
    x[piv[k]] = t;
  }
}

template <typename T>
inline void load_tiny(device const T* a, constant LinalgParams& p, uint b, thread T* m) {
  device const T* src = a + ulong(b) * p.a_bs;
  for (uint i = 0; i < p.n; ++i)
    for (uint j = 0; j < p.n; ++j) m[i * kTinyN + j] = src[i * p.a_rs + j * p.a_cs];
}

template <typename T>
inline void store_factors_tiny(thread const T* m, thread const uint* piv, uint info, uint n, uint b, device T* lu,
                               device int* pivots, device int* infos) {
  // LU column-major, as torch returns it.
  for (uint j = 0; j < n; ++j)
    for (uint i = 0; i < n; ++i) lu[(ulong(b) * n + j) * n + i] = m[i * kTinyN + j];
  for (uint k = 0; k < n; ++k) pivots[ulong(b) * n + k] = int(piv[k] + 1);
  infos[b] = int(info);
}

// Every right-hand side of system b, solved with the factors in registers.
template <typename T>
inline void solve_columns_tiny(thread const T* m, thread const uint* piv, device const T* rhs, device T* x,
                               constant LinalgParams& p, uint b) {
  const bool conj = (p.flags & mps_ext::kLinalgConjRhs) != 0, adjoint = (p.flags & mps_ext::kLinalgAdjoint) != 0;
  device const T* src = rhs + ulong(b) * p.b_bs;
  for (uint c = 0; c < p.k; ++c) {
    T v[kTinyN];
    for (uint i = 0; i < p.n; ++i) v[i] = mps_ext::conj_if(src[i * p.b_rs + c * p.b_cs], conj);
    solve_in_registers(m, piv, v, p.n, adjoint);
    for (uint i = 0; i < p.n; ++i) x[(ulong(b) * p.k + c) * p.n + i] = mps_ext::conj_if(v[i], conj);
  }
}

template <typename T>
kernel void lu_factor_thread(device const T* a [[buffer(0)]], device T* lu [[buffer(1)]],
                             device int* pivots [[buffer(2)]], device int* infos [[buffer(3)]],
                             constant LinalgParams& p [[buffer(4)]], uint b [[thread_position_in_grid]]) {
  if (b >= p.batch) return;
  T m[kTinyN * kTinyN];
  uint piv[kTinyN];
  load_tiny(a, p, b, m);
  const uint info = factor_in_registers(m, piv, p.n);
  store_factors_tiny(m, piv, info, p.n, b, lu, pivots, infos);
}

// linalg.solve: factor and solve in one thread, writing the factors too.
template <typename T>
kernel void lu_solve_fused_thread(device const T* a [[buffer(0)]], device const T* rhs [[buffer(1)]],
                                  device T* x [[buffer(2)]], device T* lu [[buffer(3)]],
                                  device int* pivots [[buffer(4)]], device int* infos [[buffer(5)]],
                                  constant LinalgParams& p [[buffer(6)]], uint b [[thread_position_in_grid]]) {
  if (b >= p.batch) return;
  T m[kTinyN * kTinyN];
  uint piv[kTinyN];
  load_tiny(a, p, b, m);
  const uint info = factor_in_registers(m, piv, p.n);
  store_factors_tiny(m, piv, info, p.n, b, lu, pivots, infos);
  solve_columns_tiny(m, piv, rhs, x, p, b);
}

// linalg.inv_ex: factor and invert in one thread; the inverse column-major,
// as torch returns it (column c solves A x = e_c).
template <typename T>
kernel void lu_inverse_thread(device const T* a [[buffer(0)]], device T* inverse [[buffer(1)]],
                              device int* infos [[buffer(2)]], constant LinalgParams& p [[buffer(3)]],
                              uint b [[thread_position_in_grid]]) {
  if (b >= p.batch) return;
  T m[kTinyN * kTinyN];
  uint piv[kTinyN];
  load_tiny(a, p, b, m);
  infos[b] = int(factor_in_registers(m, piv, p.n));
  device T* out = inverse + ulong(b) * p.n * p.n;
  for (uint c = 0; c < p.n; ++c) {
    T v[kTinyN];
    for (uint i = 0; i < p.n; ++i) v[i] = mps_ext::from_real<T>(i == c ? 1.0f : 0.0f);
    solve_in_registers(m, piv, v, p.n, false);
    for (uint i = 0; i < p.n; ++i) out[c * p.n + i] = v[i];
  }
}

template <typename T>
kernel void lu_solve_thread(device const T* lu [[buffer(0)]], device const int* pivots [[buffer(1)]],
                            device const T* rhs [[buffer(2)]], device T* x [[buffer(3)]],
                            constant LinalgParams& p [[buffer(4)]], uint b [[thread_position_in_grid]]) {
  if (b >= p.batch) return;
  T m[kTinyN * kTinyN];
  uint piv[kTinyN];
  load_tiny(lu, p, b, m);
  device const int* src = pivots + ulong(b) * p.p_bs;
  for (uint k = 0; k < p.n; ++k) {
    const uint q = uint(src[k] - 1);
    piv[k] = q < p.n ? q : k;  // out-of-range pivots (rejected by the host) never index out of bounds
  }
  solve_columns_tiny(m, piv, rhs, x, p, b);
}

// ---------------------------------------------------------------------------
// simd kernels (n <= 64).

// One SIMD group factors one matrix, held column-major in threadgroup memory
// (lanes touch consecutive rows of a column: no bank conflicts without
// padding, so a complex 64 x 64 matrix fits the 32 KiB exactly).
template <typename T>
inline void load_simd(device const T* a, constant LinalgParams& p, uint b, threadgroup T* m, uint lane) {
  device const T* src = a + ulong(b) * p.a_bs;
  for (uint j = 0; j < p.n; ++j)
    for (uint i = lane; i < p.n; i += 32) m[j * p.n + i] = src[i * p.a_rs + j * p.a_cs];
  threadgroup_barrier(mem_flags::mem_threadgroup);
}

// Factors the matrix in m in place; returns info. The 0-based pivot row of
// step k lands in piv[k / 32] of lane k % 32.
template <typename T>
inline uint factor_simd(threadgroup T* m, uint n, thread uint* piv_of_step, uint lane) {
  uint info = 0;
  for (uint k = 0; k < n; ++k) {
    // Pivot: the first row of the largest magnitude. Each lane scans its rows
    // in order (strict >), then the smallest row among the lanes holding the
    // maximum wins.
    float best = -1.0f;
    uint best_row = kMaxN;
    for (uint i = k + lane; i < n; i += 32) {
      const float v = mps_ext::abs1(m[k * n + i]);
      if (v > best) {
        best = v;
        best_row = i;
      }
    }
    const float top = simd_max(best);
    uint piv = simd_min(best == top ? best_row : kMaxN);
    // LAPACK's scan starts from row k: when that is NaN nothing compares
    // greater and row k stays (so does a column without any number).
    if (piv >= n || isnan(mps_ext::abs1(m[k * n + k]))) piv = k;
    if (lane == k % 32) piv_of_step[k / 32] = piv;
    if (piv != k)
      for (uint j = lane; j < n; j += 32) {
        const T t = m[j * n + k];
        m[j * n + k] = m[j * n + piv];
        m[j * n + piv] = t;
      }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const T d = m[k * n + k];
    if (is_zero(d)) {
      if (info == 0) info = k + 1;
      continue;  // the column below is zero too: nothing to eliminate
    }
    const bool use_reciprocal = mps_ext::reciprocal_is_safe(d);
    const T r = mps_ext::creciprocal(d);
    // Each lane scales and updates its own rows; the pivot row is only read.
    for (uint i = k + 1 + lane; i < n; i += 32) {
      const T l = mps_ext::divide(m[k * n + i], d, r, use_reciprocal);
      m[k * n + i] = l;
      for (uint j = k + 1; j < n; ++j) m[j * n + i] -= mps_ext::cmul(l, m[j * n + k]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  return info;
}

template <typename T>
kernel void lu_factor_simd(device const T* a [[buffer(0)]], device T* lu [[buffer(1)]],
                           device int* pivots [[buffer(2)]], device int* infos [[buffer(3)]],
                           constant LinalgParams& p [[buffer(4)]], uint b [[threadgroup_position_in_grid]],
                           uint lane [[thread_index_in_simdgroup]]) {
  threadgroup T m[kMaxN * kMaxN];
  const uint n = p.n;
  load_simd(a, p, b, m, lane);
  uint piv[kSlots];
  const uint info = factor_simd(m, n, piv, lane);
  device T* out = lu + ulong(b) * n * n;
  for (uint j = 0; j < n; ++j)
    for (uint i = lane; i < n; i += 32) out[j * n + i] = m[j * n + i];
  for (uint slot = 0, k = lane; k < n; ++slot, k += 32) pivots[ulong(b) * n + k] = int(piv[slot] + 1);
  if (lane == 0) infos[b] = int(info);
}

// A triangular operand: element (i, j) at a[i * rs + j * cs], conjugated on
// read when `conj`.
template <typename T>
struct Triangle {
  device const T* a;
  ulong rs, cs;
  bool conj, unit;
  T at(uint i, uint j) const { return mps_ext::conj_if(a[i * rs + j * cs], conj); }
};

// LU factors held column-major in threadgroup memory: L (unit diagonal) or U.
template <typename T>
struct FactorsInThreadgroup {
  threadgroup const T* a;
  uint n;
  bool unit;
  T at(uint i, uint j) const { return a[j * n + i]; }
};

// Solves M y = x in place for one column spread over the SIMD group (lane l
// holds rows l and l + 32), M (a Triangle or FactorsInThreadgroup) lower
// (forward) or upper (backward). Each step broadcasts the finished value to
// every lane.
template <typename T, typename M>
inline void substitute(thread T* x, M m, uint n, bool upper, uint lane) {
  for (uint s = 0; s < n; ++s) {
    const uint j = upper ? n - 1 - s : s;
    T xj = simd_broadcast(x[j / 32], ushort(j % 32));
    if (!m.unit) xj = mps_ext::cdiv(xj, m.at(j, j));
    for (uint slot = 0; slot < kSlots; ++slot) {
      const uint i = lane + 32 * slot;
      if (i == j) x[slot] = xj;
      else if (i < n && (upper ? i < j : i > j)) x[slot] -= mps_ext::cmul(m.at(i, j), xj);
    }
  }
}

// The (system, right-hand side) pair of this SIMD group: kSolveGroups per threadgroup.
inline bool solve_pair(constant LinalgParams& p, uint group, uint sg, uint simdgroups, thread uint& b,
                       thread uint& c) {
  const ulong pair = ulong(group) * simdgroups + sg;
  if (pair >= ulong(p.batch) * p.k) return false;
  b = uint(pair / p.k);
  c = uint(pair % p.k);
  return true;
}

template <typename T>
inline void store_column(thread const T* x, device T* out, constant LinalgParams& p, uint b, uint c, uint lane,
                         bool conj) {
  for (uint slot = 0; slot < kSlots; ++slot) {
    const uint i = lane + 32 * slot;
    if (i < p.n) out[(ulong(b) * p.k + c) * p.n + i] = mps_ext::conj_if(x[slot], conj);
  }
}

// A X = B or A^H X = B with A = P L U: one SIMD group per column of B.
template <typename T>
kernel void lu_solve_simd(device const T* lu [[buffer(0)]], device const int* pivots [[buffer(1)]],
                          device const T* rhs [[buffer(2)]], device T* x [[buffer(3)]],
                          constant LinalgParams& p [[buffer(4)]], uint group [[threadgroup_position_in_grid]],
                          uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                          uint simdgroups [[simdgroups_per_threadgroup]]) {
  uint b, c;
  if (!solve_pair(p, group, sg, simdgroups, b, c)) return;  // a whole SIMD group leaves
  const uint n = p.n;
  const bool conj = (p.flags & mps_ext::kLinalgConjRhs) != 0, adjoint = (p.flags & mps_ext::kLinalgAdjoint) != 0;
  device const int* piv = pivots + ulong(b) * p.p_bs;
  device const T* f = lu + ulong(b) * p.a_bs;
  device const T* col = rhs + ulong(b) * p.b_bs + ulong(c) * p.b_cs;
  T v[kSlots];
  for (uint slot = 0; slot < kSlots; ++slot) {
    const uint i = lane + 32 * slot;
    // A X = B starts from P^T b: row i of it is row permuted_source(i) of b.
    const uint row = adjoint ? i : permuted_source(piv, n, i, false);
    v[slot] = i < n ? mps_ext::conj_if(col[row * p.b_rs], conj) : T(0.0f);
  }
  if (!adjoint) {
    substitute(v, Triangle<T>{f, p.a_rs, p.a_cs, false, true}, n, false, lane);   // L
    substitute(v, Triangle<T>{f, p.a_rs, p.a_cs, false, false}, n, true, lane);   // U
  } else {
    substitute(v, Triangle<T>{f, p.a_cs, p.a_rs, true, false}, n, false, lane);   // U^H
    substitute(v, Triangle<T>{f, p.a_cs, p.a_rs, true, true}, n, true, lane);     // L^H
    // x = P z: row i of x is row permuted_source(i) of z, held by another lane.
    T w[kSlots];
    for (uint slot = 0; slot < kSlots; ++slot) {
      const uint src = permuted_source(piv, n, min(lane + 32 * slot, n - 1), true);
      T pick = T(0.0f);
      for (uint s = 0; s < kSlots; ++s) {
        const T moved = simd_shuffle(v[s], ushort(src % 32));
        if (src / 32 == s) pick = moved;
      }
      w[slot] = pick;
    }
    for (uint slot = 0; slot < kSlots; ++slot) v[slot] = w[slot];
  }
  store_column(v, x, p, b, c, lane, conj);
}

// linalg.inv_ex for orders 5 to 64: one SIMD group factors the matrix in
// threadgroup memory, as lu_factor_simd, then solves A x = e_c column after
// column from the factors there, writing the inverse column-major.
template <typename T>
kernel void lu_inverse_simd(device const T* a [[buffer(0)]], device T* inverse [[buffer(1)]],
                            device int* infos [[buffer(2)]], constant LinalgParams& p [[buffer(3)]],
                            uint b [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
  threadgroup T m[kMaxN * kMaxN];
  const uint n = p.n;
  load_simd(a, p, b, m, lane);
  uint piv[kSlots];
  const uint info = factor_simd(m, n, piv, lane);
  // P^T e_c = e_row[c]: the swaps of every step applied in order to the
  // position of the one (this lane's columns c = lane + 32 * slot).
  uint row[kSlots];
  for (uint slot = 0; slot < kSlots; ++slot) row[slot] = lane + 32 * slot;
  for (uint k = 0; k < n; ++k) {
    const uint pk = simd_broadcast(piv[k / 32], ushort(k % 32));
    for (uint slot = 0; slot < kSlots; ++slot)
      row[slot] = row[slot] == k ? pk : row[slot] == pk ? k : row[slot];
  }
  device T* out = inverse + ulong(b) * n * n;
  for (uint c = 0; c < n; ++c) {
    const uint one = simd_shuffle(row[c / 32], ushort(c % 32));
    T v[kSlots];
    for (uint slot = 0; slot < kSlots; ++slot) v[slot] = mps_ext::from_real<T>(lane + 32 * slot == one ? 1.0f : 0.0f);
    substitute(v, FactorsInThreadgroup<T>{m, n, true}, n, false, lane);   // L
    substitute(v, FactorsInThreadgroup<T>{m, n, false}, n, true, lane);   // U
    for (uint slot = 0, i = lane; i < n; ++slot, i += 32) out[c * n + i] = v[slot];
  }
  if (lane == 0) infos[b] = int(info);
}

// M X = B for a triangle M (flags: upper, unit diagonal): one SIMD group per column of B.
template <typename T>
kernel void trsm_simd(device const T* a [[buffer(0)]], device const T* rhs [[buffer(1)]], device T* x [[buffer(2)]],
                      constant LinalgParams& p [[buffer(3)]], uint group [[threadgroup_position_in_grid]],
                      uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                      uint simdgroups [[simdgroups_per_threadgroup]]) {
  uint b, c;
  if (!solve_pair(p, group, sg, simdgroups, b, c)) return;
  device const T* col = rhs + ulong(b) * p.b_bs + ulong(c) * p.b_cs;
  T v[kSlots];
  for (uint slot = 0; slot < kSlots; ++slot) {
    const uint i = lane + 32 * slot;
    v[slot] = i < p.n ? T(col[i * p.b_rs]) : T(0.0f);
  }
  const bool upper = (p.flags & mps_ext::kLinalgUpper) != 0, unit = (p.flags & mps_ext::kLinalgUnit) != 0;
  substitute(v, Triangle<T>{a + ulong(b) * p.a_bs, p.a_rs, p.a_cs, false, unit}, p.n, upper, lane);
  store_column(v, x, p, b, c, lane, false);
}

// M X = B for a float triangle of order n in {16, 32, 64} and many right-hand
// sides: one threadgroup of n threads per system. Thread t first solves
// M y = e_t, column t of M^-1, into threadgroup memory; then every column of X
// is M^-1 times the column of B, thread t computing row t.
template <typename T>
kernel void trsm_inverse(device const T* a [[buffer(0)]], device const T* rhs [[buffer(1)]],
                         device T* x [[buffer(2)]], constant LinalgParams& p [[buffer(3)]],
                         uint b [[threadgroup_position_in_grid]], uint t [[thread_position_in_threadgroup]]) {
  threadgroup T inv[kMaxN * (kMaxN + 1)];  // column-major, columns padded against bank conflicts
  const uint n = p.n, ld = n + 1;
  const bool upper = (p.flags & mps_ext::kLinalgUpper) != 0, unit = (p.flags & mps_ext::kLinalgUnit) != 0;
  const Triangle<T> m{a + ulong(b) * p.a_bs, p.a_rs, p.a_cs, false, unit};
  threadgroup T* y = inv + t * ld;
  for (uint s = 0; s < n; ++s) {
    const uint i = upper ? n - 1 - s : s;
    if (upper ? i > t : i < t) {
      y[i] = 0.0f;
      continue;
    }
    T v = i == t ? 1.0f : 0.0f;
    // The finished entries of column t between the diagonal and row i.
    if (upper)
      for (uint k = i + 1; k <= t; ++k) v -= m.at(i, k) * y[k];
    else
      for (uint k = t; k < i; ++k) v -= m.at(i, k) * y[k];
    y[i] = unit ? v : v / m.at(i, i);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  device const T* src = rhs + ulong(b) * p.b_bs;
  const uint first = upper ? t : 0, last = upper ? n : t + 1;  // the nonzero entries of row t of M^-1
  for (uint c = 0; c < p.k; ++c) {
    T acc = 0.0f;
    for (uint k = first; k < last; ++k) acc += inv[k * ld + t] * src[k * p.b_rs + c * p.b_cs];
    x[(ulong(b) * p.k + c) * n + t] = acc;
  }
}

// Host names: lu_<kernel>_<type> and trsm_<kernel>_<type> (csrc/ops/linalg.cpp
// builds the same strings); float2 is complex64.
#define MPS_EXT_LINALG(T)                                                                                        \
  template [[host_name("lu_factor_thread_" #T)]] [[kernel]] decltype(lu_factor_thread<T>) lu_factor_thread<T>;   \
  template [[host_name("lu_solve_fused_thread_" #T)]] [[kernel]] decltype(lu_solve_fused_thread<T>)             \
      lu_solve_fused_thread<T>;                                                                                  \
  template [[host_name("lu_inverse_thread_" #T)]] [[kernel]] decltype(lu_inverse_thread<T>) lu_inverse_thread<T>; \
  template [[host_name("lu_solve_thread_" #T)]] [[kernel]] decltype(lu_solve_thread<T>) lu_solve_thread<T>;      \
  template [[host_name("lu_factor_simd_" #T)]] [[kernel]] decltype(lu_factor_simd<T>) lu_factor_simd<T>;         \
  template [[host_name("lu_inverse_simd_" #T)]] [[kernel]] decltype(lu_inverse_simd<T>) lu_inverse_simd<T>;      \
  template [[host_name("lu_solve_simd_" #T)]] [[kernel]] decltype(lu_solve_simd<T>) lu_solve_simd<T>;            \
  template [[host_name("trsm_simd_" #T)]] [[kernel]] decltype(trsm_simd<T>) trsm_simd<T>;

MPS_EXT_LINALG(float)
MPS_EXT_LINALG(float2)

template [[host_name("trsm_inverse_float")]] [[kernel]] decltype(trsm_inverse<float>) trsm_inverse<float>;
