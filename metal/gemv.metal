// Decode-time linear: y = x @ W.T (+ bias) for x with 1-8 rows, W (n x k)
// row-major with any row stride; float, half and bfloat (x, W, bias and y of
// one type), float accumulation, the bias added in float before the one
// rounding to the output type. The mapping and the weight loading are in
// mps_ext/gemv.h.
//
// - dense: one SIMD group per R rows of W over all of K, four SIMD groups
//   per threadgroup. No threadgroup memory.
// - splitk: for few rows of W and a long K (MoE routers: n = 128, k = 7168),
//   all SIMD groups of a threadgroup work on the same R rows, each on every
//   slices-th step of K, and add their totals through threadgroup memory, so
//   the GPU has enough SIMD groups to hide memory latency.
//
// R is mps_ext/gemv.h's rows_per_simdgroup(M).
//
// M is the number of x rows a kernel is built for (1, 2, 4, 8); it serves
// any m <= M. Every weight byte is read once per call, whatever m is.
#include <metal_stdlib>

#include "mps_ext/gemv.h"
#include "mps_ext/params.h"

using namespace metal;
using mps_ext::GemvParams;
using mps_ext::rows_per_simdgroup;

template <typename T, uint M>
kernel void gemv_dense(device const T* w [[buffer(0)]], device const T* x [[buffer(1)]],
                       device const T* bias [[buffer(2)]], device T* y [[buffer(3)]],
                       constant GemvParams& p [[buffer(4)]], uint group [[threadgroup_position_in_grid]],
                       uint sg [[simdgroup_index_in_threadgroup]], uint simdgroups [[simdgroups_per_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]]) {
  constexpr uint R = rows_per_simdgroup<M>();
  const uint first = (group * simdgroups + sg) * R;
  if (first >= p.n) return;  // a whole SIMD group leaves: no SIMD-group function is split
  const mps_ext::DenseWeights<T> weights{w, p.w_stride, p.w_vectorized != 0};
  const mps_ext::XRows<T> rows{x, p.x_stride, p.m, p.x_vectorized != 0};
  const mps_ext::Tile<M, R> t = mps_ext::gemv_simdgroup<M, R>(weights, rows, first, p.n, p.k, 0, 1, lane);
  mps_ext::gemv_store_tile(y, bias, p, weights, first, t, lane);
}

template <typename T, uint M>
kernel void gemv_splitk(device const T* w [[buffer(0)]], device const T* x [[buffer(1)]],
                        device const T* bias [[buffer(2)]], device T* y [[buffer(3)]],
                        constant GemvParams& p [[buffer(4)]], uint group [[threadgroup_position_in_grid]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint simdgroups [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  constexpr uint R = rows_per_simdgroup<M>();
  threadgroup float partial[32 * R * M];
  const uint first = group * R;
  const mps_ext::DenseWeights<T> weights{w, p.w_stride, p.w_vectorized != 0};
  const mps_ext::XRows<T> rows{x, p.x_stride, p.m, p.x_vectorized != 0};
  const mps_ext::Tile<M, R> t =
      mps_ext::gemv_simdgroup<M, R>(weights, rows, first, p.n, p.k, sg, simdgroups, lane);
  const mps_ext::Tile<M, R> sums = mps_ext::gemv_sum_slices(t, partial, sg, simdgroups, lane);
  if (sg == 0) mps_ext::gemv_store_tile(y, bias, p, weights, first, sums, lane);
}

// Host names: gemv_<kernel>_m<M>_<type>, built by the host from the same
// parts (csrc/ops/gemv.cpp).
#define MPS_EXT_GEMV(T, M)                                                                                     \
  template [[host_name("gemv_dense_m" #M "_" #T)]] [[kernel]] decltype(gemv_dense<T, M>) gemv_dense<T, M>;     \
  template [[host_name("gemv_splitk_m" #M "_" #T)]] [[kernel]] decltype(gemv_splitk<T, M>) gemv_splitk<T, M>;

#define MPS_EXT_GEMV_ROWS(T) MPS_EXT_GEMV(T, 1) MPS_EXT_GEMV(T, 2) MPS_EXT_GEMV(T, 4) MPS_EXT_GEMV(T, 8)

MPS_EXT_GEMV_ROWS(float)
MPS_EXT_GEMV_ROWS(half)
MPS_EXT_GEMV_ROWS(bfloat)
