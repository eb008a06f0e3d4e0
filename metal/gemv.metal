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
// M is the number of x rows a kernel is built for (1, 2, 4, 8); it serves
// any m <= M. Every weight byte is read once per call, whatever m is.
//
// R is the rows of W per SIMD group (mps_ext/gemv.h), and U the 16-byte
// chunks of each row a lane reads per step (chunks_per_lane). One row of x
// has kernels for R = 1 and 2: one weight row per SIMD group keeps the most
// SIMD groups resident, which a large n (lm_head, MLP up) needs; two rows
// give each SIMD group more loads in flight, which a small n needs (q_proj,
// down: about as many rows as the GPU holds SIMD groups). Two to four rows
// of x take R = 2; five to eight take R = 4, which halves the loads of x per
// weight loaded (on the CUDA proxy 1.06-1.43x faster than R = 2 at m = 8 on
// Llama-3-8B's projections, lm_head even; at m = 4 R = 2 was 1.12-1.41x
// faster).
#include <metal_stdlib>

#include "mps_ext/gemv.h"
#include "mps_ext/params.h"

using namespace metal;
using mps_ext::GemvParams;

// Chunks per lane and step: two for one row of x (two or four 16-byte loads
// per lane in flight; on the CUDA proxy down m=1 ran 49 -> 38 us with two
// rows of W; a step fetches before it decodes, so with one row two chunks
// hold 40 registers, as one does); one for more rows of x, whose loads
// already fill a step (two ran slower there). csrc/ops/gemv.cpp's
// chunks_per_lane says the same.
template <uint M, uint R>
constexpr uint chunks_per_lane() { return M == 1 ? 2 : 1; }

template <typename T, uint M, uint R>
kernel void gemv_dense(device const T* w [[buffer(0)]], device const T* x [[buffer(1)]],
                       device const T* bias [[buffer(2)]], device T* y [[buffer(3)]],
                       constant GemvParams& p [[buffer(4)]], uint group [[threadgroup_position_in_grid]],
                       uint sg [[simdgroup_index_in_threadgroup]], uint simdgroups [[simdgroups_per_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]]) {
  const uint first = (group * simdgroups + sg) * R;
  if (first >= p.n) return;  // a whole SIMD group leaves: no SIMD-group function is split
  const mps_ext::DenseWeights<T> weights{w, p.w_stride, p.w_vectorized != 0};
  const mps_ext::XRows<T> rows{x, p.x_stride, p.m, p.x_vectorized != 0};
  const mps_ext::Tile<M, R> t =
      mps_ext::gemv_simdgroup<M, R, chunks_per_lane<M, R>()>(weights, rows, first, p.n, p.k, 0, 1, lane);
  mps_ext::gemv_store_tile(y, bias, p, weights, first, t, lane);
}

template <typename T, uint M, uint R>
kernel void gemv_splitk(device const T* w [[buffer(0)]], device const T* x [[buffer(1)]],
                        device const T* bias [[buffer(2)]], device T* y [[buffer(3)]],
                        constant GemvParams& p [[buffer(4)]], uint group [[threadgroup_position_in_grid]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint simdgroups [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[32 * R * M];
  const uint first = group * R;
  const mps_ext::DenseWeights<T> weights{w, p.w_stride, p.w_vectorized != 0};
  const mps_ext::XRows<T> rows{x, p.x_stride, p.m, p.x_vectorized != 0};
  const mps_ext::Tile<M, R> t =
      mps_ext::gemv_simdgroup<M, R, chunks_per_lane<M, R>()>(weights, rows, first, p.n, p.k, sg, simdgroups, lane);
  const mps_ext::Tile<M, R> sums = mps_ext::gemv_sum_slices(t, partial, sg, simdgroups, lane);
  if (sg == 0) mps_ext::gemv_store_tile(y, bias, p, weights, first, sums, lane);
}

// Host names: gemv_<kernel>_m<M>_r<R>_<type>, built by the host from the same
// parts (csrc/ops/gemv.cpp). One weight row per SIMD group is only planned
// when the rows fill the GPU, so never split.
#define MPS_EXT_GEMV_DENSE(T, M, R)                                                                            \
  template [[host_name("gemv_dense_m" #M "_r" #R "_" #T)]] [[kernel]] decltype(gemv_dense<T, M, R>)           \
      gemv_dense<T, M, R>;
#define MPS_EXT_GEMV(T, M, R)                                                                                  \
  MPS_EXT_GEMV_DENSE(T, M, R)                                                                                  \
  template [[host_name("gemv_splitk_m" #M "_r" #R "_" #T)]] [[kernel]] decltype(gemv_splitk<T, M, R>)         \
      gemv_splitk<T, M, R>;

#define MPS_EXT_GEMV_ROWS(T) \
  MPS_EXT_GEMV_DENSE(T, 1, 1) MPS_EXT_GEMV(T, 1, 2) MPS_EXT_GEMV(T, 2, 2) MPS_EXT_GEMV(T, 4, 2) MPS_EXT_GEMV(T, 8, 4)

MPS_EXT_GEMV_ROWS(float)
MPS_EXT_GEMV_ROWS(half)
MPS_EXT_GEMV_ROWS(bfloat)
