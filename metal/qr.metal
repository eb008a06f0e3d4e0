// Householder QR of batches of small matrices (m, n <= 64), float and complex64
// (float2), with LAPACK's conventions so that the results are the ones torch's
// CPU gives, signs included:
//
// - geqrf (as geqr2): reflector s maps column s onto beta e_s with
//   beta = -sign(Re alpha) |(alpha, x)|, H_s = I - tau_s v v^H, v[s] = 1 and
//   v below it stored under R's diagonal; tau_s = 0 (H_s = I) when x is zero
//   and alpha real. R's diagonal is real.
// - householder_product (as org2r/ung2r): Q = H_0 ... H_{k-1}, applied from
//   the last reflector to the first onto the first columns of the identity.
//
// One SIMD group per matrix, held column-major in threadgroup memory; lane l
// owns rows l and l + 32 and only ever touches those (column sums go through
// simd_sum, the pivot-like alpha through simd_broadcast), so no barrier is
// needed. A complex 64 x 64 matrix fills the 32 KiB exactly.
#include <metal_stdlib>

#include "mps_ext/complex.h"
#include "mps_ext/params.h"

using namespace metal;
using mps_ext::LinalgParams;

constant constexpr uint kQrMaxN = 64;

// The parts of a real or complex64 value that the reflector's norm needs
// (only QR's: here, not in mps_ext/complex.h, whose every function the
// other files that include it use).
inline float real_part(float a) { return a; }
inline float real_part(float2 a) { return a.x; }
inline float imag_part(float) { return 0.0f; }
inline float imag_part(float2 a) { return a.y; }
inline float abs_max(float a) { return fabs(a); }  // the larger magnitude of the parts
inline float abs_max(float2 a) { return max(fabs(a.x), fabs(a.y)); }
inline float norm2(float a) { return a * a; }  // |a|^2
inline float norm2(float2 a) { return dot(a, a); }

// C[:, j] -= t v (v^H C[:, j]) for the columns j right of s and the rows from
// s on, v[s] = 1 and v[i] = vs[slot] for this lane's rows i > s.
template <typename T>
inline void reflect(threadgroup T* c, uint rows, uint cols, uint s, thread const T* vs, T t, uint lane) {
  const T one = mps_ext::from_real<T>(1.0f);
  for (uint j = s + 1; j < cols; ++j) {
    T part = T(0.0f);
    for (uint slot = 0, i = lane; i < rows; ++slot, i += 32)
      if (i >= s) part += mps_ext::cmul(mps_ext::cconj(i == s ? one : vs[slot]), c[j * rows + i]);
    const T tw = mps_ext::cmul(t, simd_sum(part));
    for (uint slot = 0, i = lane; i < rows; ++slot, i += 32)
      if (i >= s) c[j * rows + i] -= mps_ext::cmul(i == s ? one : vs[slot], tw);
  }
}

// A (m x n) = Q R: R and the reflectors into `qr` (column-major, m x n per
// matrix), tau (k = min(m, n) per matrix).
template <typename T>
kernel void qr_geqrf_simd(device const T* a [[buffer(0)]], device T* qr [[buffer(1)]], device T* tau [[buffer(2)]],
                          constant LinalgParams& p [[buffer(3)]], uint b [[threadgroup_position_in_grid]],
                          uint lane [[thread_index_in_simdgroup]]) {
  threadgroup T c[kQrMaxN * kQrMaxN];
  const uint rows = p.m, cols = p.n;
  device const T* src = a + ulong(b) * p.a_bs;
  for (uint j = 0; j < cols; ++j)
    for (uint i = lane; i < rows; i += 32) c[j * rows + i] = src[i * p.a_rs + j * p.a_cs];
  for (uint s = 0; s < p.k; ++s) {
    T vs[kQrMaxN / 32];
    T own = T(0.0f);
    float largest = 0.0f;  // of x, the column below the diagonal
    for (uint slot = 0, i = lane; i < rows; ++slot, i += 32) {
      vs[slot] = c[s * rows + i];
      if (i > s) largest = max(largest, abs_max(vs[slot]));
      if (slot == s / 32) own = vs[slot];
    }
    largest = simd_max(largest);
    const T alpha = simd_broadcast(own, ushort(s % 32));
    T t = T(0.0f);
    if (largest != 0.0f || imag_part(alpha) != 0.0f) {
      // |(alpha, x)| summed in units of the largest part, as LAPACK's nrm2 and lapy3: squares of
      // float-range values neither overflow nor vanish.
      const float unit = max(largest, abs_max(alpha));
      float part = 0.0f;
      for (uint slot = 0, i = lane; i < rows; ++slot, i += 32)
        if (i > s) part += norm2(vs[slot] / unit);
      const float norm = unit * sqrt(simd_sum(part) + norm2(alpha / unit));
      const float beta = -copysign(norm, real_part(alpha));
      t = mps_ext::cdiv(mps_ext::from_real<T>(beta) - alpha, mps_ext::from_real<T>(beta));
      const T d = alpha - mps_ext::from_real<T>(beta);  // v = x / d
      const bool use_reciprocal = mps_ext::reciprocal_is_safe(d);
      const T r = mps_ext::creciprocal(d);
      for (uint slot = 0, i = lane; i < rows; ++slot, i += 32) {
        if (i > s) vs[slot] = c[s * rows + i] = mps_ext::divide(vs[slot], d, r, use_reciprocal);
        if (i == s) c[s * rows + i] = mps_ext::from_real<T>(beta);
      }
    }
    if (lane == 0) tau[ulong(b) * p.k + s] = t;
    reflect(c, rows, cols, s, vs, mps_ext::cconj(t), lane);  // H_s^H from the left
  }
  device T* out = qr + ulong(b) * rows * cols;
  for (uint j = 0; j < cols; ++j)
    for (uint i = lane; i < rows; i += 32) out[j * rows + i] = c[j * rows + i];
}

// Q (m x n, column-major) = H_0 ... H_{k-1}: the first n columns of the
// product of the k reflectors stored below the diagonal of A (m x >= k).
template <typename T>
kernel void qr_householder_simd(device const T* a [[buffer(0)]], device const T* tau [[buffer(1)]],
                                device T* q [[buffer(2)]], constant LinalgParams& p [[buffer(3)]],
                                uint b [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
  threadgroup T c[kQrMaxN * kQrMaxN];
  const uint rows = p.m, cols = p.n;
  device const T* v = a + ulong(b) * p.a_bs;
  for (uint j = p.k; j < cols; ++j)
    for (uint i = lane; i < rows; i += 32) c[j * rows + i] = mps_ext::from_real<T>(i == j ? 1.0f : 0.0f);
  for (uint s = p.k; s-- > 0;) {
    const T t = tau[ulong(b) * p.p_bs + s];
    T vs[kQrMaxN / 32];
    for (uint slot = 0, i = lane; i < rows; ++slot, i += 32) vs[slot] = i > s ? v[i * p.a_rs + s * p.a_cs] : T(0.0f);
    reflect(c, rows, cols, s, vs, t, lane);
    // Column s: H_s e_s.
    for (uint slot = 0, i = lane; i < rows; ++slot, i += 32)
      c[s * rows + i] = i > s ? -mps_ext::cmul(t, vs[slot]) : i == s ? mps_ext::from_real<T>(1.0f) - t : T(0.0f);
  }
  device T* out = q + ulong(b) * rows * cols;
  for (uint j = 0; j < cols; ++j)
    for (uint i = lane; i < rows; i += 32) out[j * rows + i] = c[j * rows + i];
}

// Host names: qr_<kernel>_<type> (csrc/ops/linalg.cpp builds the same strings); float2 is complex64.
#define MPS_EXT_QR(T)                                                                                            \
  template [[host_name("qr_geqrf_simd_" #T)]] [[kernel]] decltype(qr_geqrf_simd<T>) qr_geqrf_simd<T>;            \
  template [[host_name("qr_householder_simd_" #T)]] [[kernel]] decltype(qr_householder_simd<T>)                 \
      qr_householder_simd<T>;

MPS_EXT_QR(float)
MPS_EXT_QR(float2)
