// Decode-time linear: y = x @ W.T (+ bias) for x with 1-8 rows, W (n x k)
// row-major with any row stride (or k-major: gemv_t below); float, half and
// bfloat (x, W, bias and y of one type), float accumulation, the bias added
// in float before the one rounding to the output type. The mapping and the
// weight loading are in mps_ext/gemv.h.
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

// Launched with up to 32 x kGemvMaxSlices threads: without the attribute a pipeline may allow fewer (and the
// host then splits K fewer ways).
static_assert(32 * mps_ext::kGemvMaxSlices == 512, "gemv_splitk's max_total_threads_per_threadgroup");
template <typename T, uint M, uint R>
[[max_total_threads_per_threadgroup(512)]] kernel void gemv_splitk(device const T* w [[buffer(0)]], device const T* x [[buffer(1)]],
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

// W stored k-major, a (k x n) row-major matrix with any row stride
// (transformers' Conv1D in GPT-2: addmm(b, x, W); W.T @ v; the gradient
// g @ W of a linear's input): y = x @ W (+ bias). Lanes run along n, each on
// C consecutive columns (16 bytes of a row of W per load), a SIMD group on
// 32 * C columns; the threadgroup's SIMD groups ("slices", the host's
// choice) take every slices-th row of W, kGemvTRowsInFlight rows at a time
// (that many 16-byte loads in flight per lane), and add their totals through
// threadgroup memory. x[i, k] is the same for every lane (from cache). Every
// weight byte is read once per call.
constant constexpr uint kGemvTRowsInFlight = 4;

// Columns [j0, j0 + 16 / sizeof(T)) of a row of W as floats, zeros past n.
template <typename T>
inline void gemv_t_columns(device const T* row, uint j0, uint n, bool vectorized, thread float4* out) {
  constexpr uint C = 16 / sizeof(T);
  if (vectorized && j0 + C <= n) {
    mps_ext::unpack16(*reinterpret_cast<device const uint4*>(row + j0), out, T());
    return;
  }
  MPS_EXT_UNROLL
  for (uint c = 0; c < C; ++c) out[c / 4][c % 4] = j0 + c < n ? float(row[j0 + c]) : 0.0f;
}

template <typename T, uint M>
kernel void gemv_t(device const T* w [[buffer(0)]], device const T* x [[buffer(1)]],
                   device const T* bias [[buffer(2)]], device T* y [[buffer(3)]],
                   constant GemvParams& p [[buffer(4)]], uint group [[threadgroup_position_in_grid]],
                   uint sg [[simdgroup_index_in_threadgroup]], uint slices [[simdgroups_per_threadgroup]],
                   uint lane [[thread_index_in_simdgroup]]) {
  constexpr uint C = 16 / sizeof(T);
  threadgroup float partial[(mps_ext::kGemvTMaxSlices - 1) * 32 * C];
  const uint j0 = (group * 32 + lane) * C;
  const bool vectorized = p.w_vectorized != 0;
  float4 acc[M][C / 4];
  MPS_EXT_UNROLL
  for (uint i = 0; i < M; ++i)
    MPS_EXT_UNROLL
    for (uint c = 0; c < C / 4; ++c) acc[i][c] = 0.0f;
  uint k = sg;
  for (; k + (kGemvTRowsInFlight - 1) * slices < p.k; k += kGemvTRowsInFlight * slices) {
    float4 wv[kGemvTRowsInFlight][C / 4];
    MPS_EXT_UNROLL
    for (uint r = 0; r < kGemvTRowsInFlight; ++r)
      gemv_t_columns(w + ulong(k + r * slices) * p.w_stride, j0, p.n, vectorized, wv[r]);
    MPS_EXT_UNROLL
    for (uint i = 0; i < M; ++i) {
      device const T* xi = x + metal::min(i, p.m - 1) * p.x_stride;
      MPS_EXT_UNROLL
      for (uint r = 0; r < kGemvTRowsInFlight; ++r) {
        const float xv = float(xi[k + r * slices]);
        MPS_EXT_UNROLL
        for (uint c = 0; c < C / 4; ++c) acc[i][c] += wv[r][c] * xv;
      }
    }
  }
  for (; k < p.k; k += slices) {
    float4 wv[C / 4];
    gemv_t_columns(w + ulong(k) * p.w_stride, j0, p.n, vectorized, wv);
    MPS_EXT_UNROLL
    for (uint i = 0; i < M; ++i) {
      const float xv = float(x[metal::min(i, p.m - 1) * p.x_stride + k]);
      MPS_EXT_UNROLL
      for (uint c = 0; c < C / 4; ++c) acc[i][c] += wv[c] * xv;
    }
  }
  // Row i of the totals: slices 1.. through threadgroup memory, added by
  // slice 0, which writes y.
  MPS_EXT_UNROLL
  for (uint i = 0; i < M; ++i) {
    if (sg > 0)
      MPS_EXT_UNROLL
      for (uint c = 0; c < C; ++c) partial[((sg - 1) * 32 + lane) * C + c] = acc[i][c / 4][c % 4];
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    if (sg == 0 && i < p.m)
      MPS_EXT_UNROLL
      for (uint c = 0; c < C; ++c) {
        if (j0 + c < p.n) {
          float v = acc[i][c / 4][c % 4];
          for (uint s = 1; s < slices; ++s) v += partial[((s - 1) * 32 + lane) * C + c];
          if (p.has_bias) v += float(bias[j0 + c]);
          y[ulong(i) * p.y_stride + j0 + c] = T(v);
        }
      }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  }
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

// gemv_t_m<M>_<type>.
#define MPS_EXT_GEMV_T(T, M) \
  template [[host_name("gemv_t_m" #M "_" #T)]] [[kernel]] decltype(gemv_t<T, M>) gemv_t<T, M>;

#define MPS_EXT_GEMV_ROWS(T)                                                                                    \
  MPS_EXT_GEMV_DENSE(T, 1, 1) MPS_EXT_GEMV(T, 1, 2) MPS_EXT_GEMV(T, 2, 2) MPS_EXT_GEMV(T, 4, 2) MPS_EXT_GEMV(T, 8, 4) \
  MPS_EXT_GEMV_T(T, 1) MPS_EXT_GEMV_T(T, 2) MPS_EXT_GEMV_T(T, 4) MPS_EXT_GEMV_T(T, 8)

MPS_EXT_GEMV_ROWS(float)
MPS_EXT_GEMV_ROWS(half)
MPS_EXT_GEMV_ROWS(bfloat)
