// The building blocks of decode-time GEMV (y = x @ W.T [+ bias] for x with
// 1-8 rows), shared by every kernel that streams a weight matrix once for a
// few rows of activations: dense weights (metal/gemv.metal), and the ones
// that only change how weights are read (FP8 with scales) or which matrix a
// threadgroup reads (one per expert in grouped matmul).
//
// Mapping: one SIMD group owns R consecutive rows of W. Each step, every lane
// reads U chunks (16 bytes; fp8_grouped_mm's are 8) of each of those rows,
// 32 chunks apart (so a lane has R x U loads in flight, and a SIMD group
// reads U x 32 contiguous chunks of each row), and the matching K-ranges of
// every x row (from cache: x is small), accumulating M x R dot products in
// float. A K range may be split over several SIMD groups ("slices") that
// add their results through threadgroup memory.
//
// A weight policy supplies: `enum { kPerLane }` (elements of K a lane
// consumes per chunk), `Raw` (their bits), `fetch<Checked>(row, k, end)` (the
// load of those elements of a row, zeros at or past `end`),
// `decode<Checked>(raw, row, k, end, out)` (them as floats) and `scale(row)`
// (a factor applied to the finished dot product, before the bias). Fetching
// apart from decoding lets a step issue every load before it decodes one:
// each chunk in flight holds only its raw bits, and one chunk's floats at a
// time are live.
#pragma once

#include <metal_stdlib>

#include "mps_ext/params.h"
#include "mps_ext/unroll.h"

namespace mps_ext {

// Rows of W per SIMD group for grouped_mm's decode kernels built for M rows
// of x (its host's rows_per_simdgroup in csrc/ops): one for a single row, two
// for more (the dense GEMV picks its own per shape, metal/gemv.metal). Few
// registers per lane keep many SIMD groups resident, each lane with one
// 16-byte load of W per row in flight and the M x R totals in registers;
// four rows per SIMD group held 64-120 registers and ran 1.1-1.6x slower on
// the CUDA proxy (docs/performance.md).
// A template, so a file that includes this header without a GEMV of its own
// has no unused function.
template <uint M>
constexpr uint rows_per_simdgroup() { return M == 1 ? 1 : 2; }

// 16 bytes as floats: four floats, or eight half/bfloat.
inline void unpack16(uint4 u, thread float4* out, float) { out[0] = metal::as_type<float4>(u); }

template <typename T>
inline void unpack16(uint4 u, thread float4* out, T) {
  const uint2 lo = u.xy, hi = u.zw;
  out[0] = float4(metal::as_type<metal::vec<T, 4>>(lo));
  out[1] = float4(metal::as_type<metal::vec<T, 4>>(hi));
}

// The 16 bytes of elements [k, k + 16 / sizeof(T)) of `p`: one load when
// `vectorized` (p + k is then 16-byte aligned, the caller guarantees it), one
// per element otherwise and for a chunk that reaches past `end`, whose
// missing elements read as 0. Unchecked, the caller guarantees both
// (gemv_simdgroup's full steps): no test in the loop.
template <bool Checked = true, typename T>
inline uint4 fetch16(device const T* p, uint k, uint end, bool vectorized) {
  if (!Checked || (vectorized && k + 16 / sizeof(T) <= end)) return *reinterpret_cast<device const uint4*>(p + k);
  typedef metal::conditional_t<sizeof(T) == 4, uint, ushort> Bits;  // T's bits, whatever T is
  constexpr uint kPerWord = 4 / sizeof(T);
  device const Bits* bits = reinterpret_cast<device const Bits*>(p);
  uint4 u = uint4(0);
  MPS_EXT_UNROLL
  for (uint j = 0; j < 16 / sizeof(T); ++j)
    if (k + j < end) u[j / kPerWord] |= uint(bits[k + j]) << (32 / kPerWord * (j % kPerWord));
  return u;
}

// Elements [k, k + Count) of `p` as floats (Count a multiple of 16 bytes'
// worth), loaded as fetch16 does.
template <uint Count, bool Checked = true, typename T>
inline void load_floats(device const T* p, uint k, uint end, bool vectorized, thread float4* out) {
  constexpr uint kPer16 = 16 / sizeof(T);
  MPS_EXT_UNROLL
  for (uint c = 0; c < Count / kPer16; ++c)
    unpack16(fetch16<Checked>(p, k + c * kPer16, end, vectorized), out + c * (kPer16 / 4), T());
}

// Dense row-major weights of type T with any row stride.
template <typename T>
struct DenseWeights {
  enum : uint { kPerLane = 16 / sizeof(T) };
  typedef uint4 Raw;
  device const T* w;
  ulong row_stride;
  bool vectorized;  // w and every row start 16-byte aligned

  template <bool Checked = true>
  Raw fetch(uint row, uint k, uint end) const {
    return fetch16<Checked>(w + row * row_stride, k, end, vectorized);
  }
  template <bool Checked = true>
  void decode(Raw raw, uint, uint, uint, thread float4* out) const {
    unpack16(raw, out, T());
  }
  float scale(uint) const { return 1.0f; }
};

// The rows of x (activations, type T): rows at or past `m` read row m - 1,
// so a kernel built for M rows serves any m <= M without branching.
template <typename T>
struct XRows {
  device const T* x;
  ulong row_stride;
  uint m;
  bool vectorized;

  template <uint Count, bool Checked = true>
  void load(uint i, uint k, uint end, thread float4* out) const {
    load_floats<Count, Checked>(x + metal::min(i, m - 1) * row_stride, k, end, vectorized, out);
  }
};

// M x R partial dot products (float), then their totals over a SIMD group.
template <uint M, uint R>
struct Tile {
  float v[R][M];
};

// acc + a . b as one chain of multiply-adds (one FMA per element where the
// compiler fuses them: dot() and an add cost one instruction more).
inline float dot_add(float4 a, float4 b, float acc) {
  acc += a.x * b.x;
  acc += a.y * b.y;
  acc += a.z * b.z;
  return acc + a.w * b.w;
}

// The raw weight chunks of one K-step: R rows x N chunks per lane.
template <typename Weights, uint R, uint N>
struct StepChunks {
  typename Weights::Raw v[R][N];
};

// Where a chunk of a lane lies against K: wholly inside (no bounds test),
// wholly inside or wholly past (one test, no partial chunk: K a multiple of
// a chunk's elements), or anywhere (each element tested; zeros past K).
enum ChunkBounds : uint { kInside, kInsideOrPast, kChecked };

template <ChunkBounds B, typename Weights>
inline typename Weights::Raw gemv_fetch_chunk(Weights w, uint row, uint ku, uint k) {
  if (B == kChecked) return w.template fetch<true>(row, ku, k);
  if (B == kInsideOrPast && ku >= k) return typename Weights::Raw(0);
  return w.template fetch<false>(row, ku, k);
}

// The weight loads of the K-step at k0, all issued before any is used:
// chunks [0, Whole) inside K, the others as Tail says.
template <uint R, uint N, uint Whole, ChunkBounds Tail, typename Weights>
inline StepChunks<Weights, R, N> gemv_fetch(Weights w, thread const uint* rows, uint k0, uint k) {
  constexpr uint kChunk = 32 * Weights::kPerLane;
  StepChunks<Weights, R, N> c;
  MPS_EXT_UNROLL
  for (uint r = 0; r < R; ++r)
    MPS_EXT_UNROLL
    for (uint u = 0; u < N; ++u)
      c.v[r][u] = u < Whole ? gemv_fetch_chunk<kInside>(w, rows[r], k0 + u * kChunk, k)
                            : gemv_fetch_chunk<Tail>(w, rows[r], k0 + u * kChunk, k);
  return c;
}

// Chunk u of a fetched step (at ku, this lane's first element of it): its R
// rows decoded and the M rows of x against them.
template <uint M, uint R, ChunkBounds B, typename Weights, typename X, uint N>
inline void gemv_chunk(Weights w, X x, thread const uint* rows, thread const StepChunks<Weights, R, N>& c, uint u,
                       uint ku, uint k, thread Tile<M, R>& t) {
  constexpr uint P = Weights::kPerLane;
  if (B == kInsideOrPast && ku >= k) return;
  float4 wv[R][P / 4];
  MPS_EXT_UNROLL
  for (uint r = 0; r < R; ++r) w.template decode<B == kChecked>(c.v[r][u], rows[r], ku, k, wv[r]);
  MPS_EXT_UNROLL
  for (uint i = 0; i < M; ++i) {
    float4 xv[P / 4];
    x.template load<P, B == kChecked>(i, ku, k, xv);
    MPS_EXT_UNROLL
    for (uint r = 0; r < R; ++r)
      MPS_EXT_UNROLL
      for (uint c4 = 0; c4 < P / 4; ++c4) t.v[r][i] = dot_add(wv[r][c4], xv[c4], t.v[r][i]);
  }
}

// The arithmetic of the K-step at k0 from its fetched chunks, chunk by chunk.
template <uint M, uint R, uint N, uint Whole, ChunkBounds Tail, typename Weights, typename X>
inline void gemv_accumulate(Weights w, X x, thread const uint* rows, thread const StepChunks<Weights, R, N>& c,
                            uint k0, uint k, thread Tile<M, R>& t) {
  constexpr uint kChunk = 32 * Weights::kPerLane;
  MPS_EXT_UNROLL
  for (uint u = 0; u < N; ++u) {
    if (u < Whole)
      gemv_chunk<M, R, kInside>(w, x, rows, c, u, k0 + u * kChunk, k, t);
    else
      gemv_chunk<M, R, Tail>(w, x, rows, c, u, k0 + u * kChunk, k, t);
  }
}

// One K-step of gemv_simdgroup at k0 (N chunks: [0, Whole) inside K, the
// others as Tail says): its loads, then its arithmetic.
template <uint M, uint R, uint N, uint Whole, ChunkBounds Tail, typename Weights, typename X>
inline void gemv_step(Weights w, X x, thread const uint* rows, uint k0, uint k, thread Tile<M, R>& t) {
  gemv_accumulate<M, R, N, Whole, Tail>(w, x, rows, gemv_fetch<R, N, Whole, Tail>(w, rows, k0, k), k0, k, t);
}

// The dot products of rows [first, first + R) of `w` (rows past n - 1 read
// row n - 1) with the M rows of x, over the K-steps of slice `slice` of
// `slices`, summed over the SIMD group: every lane gets the totals. A step is
// U chunks of 32 lanes, dealt out to the slices in turn. With 16-byte aligned
// rows, the whole steps run without a bounds test per load, and the chunks
// past the last whole step, when fewer than U and none partial, join it: one
// step of up to 2U - 1 chunks, a lane skipping those past K, so a short K
// costs no extra round of loads (Qwen3-30B-A3B's experts' K = 768 is 3
// chunks of bfloat per lane: one round, not two). Ahead: the whole steps
// fetch the next step's chunks before they decode their own, so a SIMD
// group's loads stay in flight while it decodes (for weights whose decode is
// long, e4m3fn's; it holds twice the chunks in registers, which the 16-bit
// weights' short decode does not repay).
template <uint M, uint R, uint U = 1, bool Ahead = false, typename Weights, typename X>
inline Tile<M, R> gemv_simdgroup(Weights w, X x, uint first, uint n, uint k, uint slice, uint slices, uint lane) {
  constexpr uint P = Weights::kPerLane, kChunk = 32 * P, kStep = U * kChunk;
  Tile<M, R> t;
  MPS_EXT_UNROLL
  for (uint r = 0; r < R; ++r)
    MPS_EXT_UNROLL
    for (uint i = 0; i < M; ++i) t.v[r][i] = 0.0f;
  uint rows[R];
  MPS_EXT_UNROLL
  for (uint r = 0; r < R; ++r) rows[r] = metal::min(first + r, n - 1);
  const uint lane_k = lane * P;
  // The tail: the chunks past the whole steps (up to U, the last partial).
  // Unaligned rows have no whole steps, only checked ones; a tail joins the
  // last whole step when it has fewer than U chunks, none partial.
  const bool aligned = w.vectorized && x.vectorized;
  const uint whole = aligned ? k / kStep : 0, tail = (k - whole * kStep + kChunk - 1) / kChunk;
  const bool join = U > 1 && tail > 0 && tail < U && whole > 0 && k % P == 0;
  const uint plain = join ? whole - 1 : whole;  // whole steps on their own
  uint s = slice;
  if (Ahead && s < plain) {
    StepChunks<Weights, R, U> c = gemv_fetch<R, U, U, kInside>(w, rows, s * kStep + lane_k, k);
    for (; s + slices < plain; s += slices) {
      const StepChunks<Weights, R, U> ahead =
          gemv_fetch<R, U, U, kInside>(w, rows, (s + slices) * kStep + lane_k, k);
      gemv_accumulate<M, R, U, U, kInside>(w, x, rows, c, s * kStep + lane_k, k, t);
      c = ahead;
    }
    gemv_accumulate<M, R, U, U, kInside>(w, x, rows, c, s * kStep + lane_k, k, t);
    s += slices;
  } else {
    for (; s < plain; s += slices) gemv_step<M, R, U, U, kInside>(w, x, rows, s * kStep + lane_k, k, t);
  }
  if (join) {
    if (s == plain) gemv_step<M, R, 2 * U - 1, U, kInsideOrPast>(w, x, rows, plain * kStep + lane_k, k, t);
  } else {
    for (; s * kStep < k; s += slices) gemv_step<M, R, U, 0, kChecked>(w, x, rows, s * kStep + lane_k, k, t);
  }
  MPS_EXT_UNROLL
  for (uint r = 0; r < R; ++r)
    MPS_EXT_UNROLL
    for (uint i = 0; i < M; ++i) t.v[r][i] = metal::simd_sum(t.v[r][i]);
  return t;
}

// y[i, row] for a finished dot product: scaled, the bias added in float,
// rounded once. Rows past n and x rows past m are not written. `Params` has
// GemvParams' n, m, y_stride and has_bias.
template <typename T, typename Weights, typename Params>
inline void gemv_store(device T* y, device const T* bias, constant Params& p, Weights w, uint row, uint i,
                       float dot) {
  if (row >= p.n || i >= p.m) return;
  float v = dot * w.scale(row);
  if (p.has_bias) v += float(bias[row]);
  y[ulong(i) * p.y_stride + row] = T(v);
}

// The SIMD group's totals, written by lanes r * M + i (no threadgroup memory).
template <uint M, uint R, typename T, typename Weights, typename Params>
inline void gemv_store_tile(device T* y, device const T* bias, constant Params& p, Weights w, uint first,
                            Tile<M, R> t, uint lane) {
  MPS_EXT_UNROLL
  for (uint r = 0; r < R; ++r)
    MPS_EXT_UNROLL
    for (uint i = 0; i < M; ++i)
      if (lane == r * M + i) gemv_store(y, bias, p, w, first + r, i, t.v[r][i]);
}

// Split K: runs of `slices` consecutive SIMD groups of the threadgroup hold
// totals for the same rows; they are added through `partial` (one M x R tile
// per SIMD group), and the first SIMD group of each run gets the sums, each
// in the lane that gemv_store_tile writes it from (r * M + i; M x R <= 32).
// Every thread of the threadgroup must call it (a barrier).
template <uint M, uint R>
inline Tile<M, R> gemv_sum_slices(Tile<M, R> t, threadgroup float* partial, uint sg, uint slices, uint lane) {
  static_assert(M * R <= 32, "one lane per total");
  if (lane == 0)
    MPS_EXT_UNROLL
    for (uint r = 0; r < R; ++r)
      MPS_EXT_UNROLL
      for (uint i = 0; i < M; ++i) partial[sg * (R * M) + r * M + i] = t.v[r][i];
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  if (sg % slices == 0 && lane < R * M) {
    float sum = 0.0f;
    for (uint s = 0; s < slices; ++s) sum += partial[(sg + s) * (R * M) + lane];
    MPS_EXT_UNROLL
    for (uint r = 0; r < R; ++r)
      MPS_EXT_UNROLL
      for (uint i = 0; i < M; ++i)
        if (lane == r * M + i) t.v[r][i] = sum;
  }
  return t;
}

// ------------------------------------------------------------ streamed rows
//
// One row of x held in registers, for weights whose decode costs as much as
// x's loads and unpacks would (e4m3fn): SIMD group s of a threadgroup owns
// chunk s of K (32 lanes x kPerLane elements), loads its x once, and
// streams the threadgroup's rows of W past it, G rows at a time, each batch's
// loads issued before the batch before it is decoded. A batch's G partial
// dot products are reduced over the SIMD group at once by a transposing
// butterfly, and the SIMD groups' partials are added through threadgroup
// memory. Against gemv_simdgroup with one row of x, a row costs no x loads,
// no unpacks and no per-row setup.

// The totals over the SIMD group of G values per lane (G = 2, 4, 8, 16,
// 32), transposed: lane l gets the total of v[l / (32 / G)], so lanes 0,
// 32 / G, 2 * 32 / G, ... hold v[0], v[1], ... Each halving step sends
// the half of a lane's values its partner keeps: G - 1 + log2(32 / G)
// shuffles for G totals where simd_sum takes 5 for each. v is overwritten.
template <uint G>
inline float simd_sum_transposed(thread float* v, uint lane) {
  static_assert(G >= 2 && G <= 32 && (G & (G - 1)) == 0, "a power of two up to 32");
  ushort d = 16;
  MPS_EXT_UNROLL
  for (uint count = G; count > 1; count /= 2, d /= 2) {
    const bool upper = (lane & d) != 0;
    MPS_EXT_UNROLL
    for (uint i = 0; i < count / 2; ++i) {
      const float keep = upper ? v[i + count / 2] : v[i], send = upper ? v[i] : v[i + count / 2];
      v[i] = keep + metal::simd_shuffle_xor(send, d);
    }
  }
  MPS_EXT_UNROLL
  for (; d > 0; d /= 2) v[0] += metal::simd_shuffle_xor(v[0], d);
  return v[0];
}

// The raw chunks at ku of G consecutive rows from `row` (rows past n - 1
// read row n - 1).
template <uint G, bool Checked, typename Weights>
inline StepChunks<Weights, G, 1> gemv_stream_fetch(Weights w, uint row, uint n, uint ku, uint k) {
  StepChunks<Weights, G, 1> c;
  MPS_EXT_UNROLL
  for (uint j = 0; j < G; ++j) c.v[j][0] = w.template fetch<Checked>(metal::min(row + j, n - 1), ku, k);
  return c;
}

// The partial dot products of the G fetched rows from `row` with x (xv:
// this lane's elements, at ku), totalled over the SIMD group into
// partial[0 .. G) (rows past n - 1 decode row n - 1).
template <uint G, bool Checked, typename Weights>
inline void gemv_stream_batch(Weights w, thread const float4* xv, thread const StepChunks<Weights, G, 1>& c, uint row,
                              uint n, uint k, uint ku, uint lane, threadgroup float* partial) {
  constexpr uint P = Weights::kPerLane;
  float v[G];
  MPS_EXT_UNROLL
  for (uint j = 0; j < G; ++j) {
    float4 wv[P / 4];
    w.template decode<Checked>(c.v[j][0], metal::min(row + j, n - 1), ku, k, wv);
    v[j] = 0.0f;
    MPS_EXT_UNROLL
    for (uint q = 0; q < P / 4; ++q) v[j] = dot_add(wv[q], xv[q], v[j]);
  }
  const float total = simd_sum_transposed<G>(v, lane);
  if (lane % (32 / G) == 0) partial[lane / (32 / G)] = total;
}

// partial[r] for rows first + r, r < count (and up to G - 1 more past it,
// rows past n - 1 reading row n - 1): the dot products of rows of `w` with
// x over this SIMD group's chunk of K. Checked: the chunk may reach past K
// or the rows may be unaligned (each lane's loads tested, zeros past K).
template <uint G, bool Checked, typename Weights>
inline void gemv_stream_rows(Weights w, thread const float4* xv, uint first, uint count, uint n, uint k, uint ku,
                             uint lane, threadgroup float* partial) {
  StepChunks<Weights, G, 1> c = gemv_stream_fetch<G, Checked>(w, first, n, ku, k);
  uint r = 0;
  for (; r + G < count; r += G) {
    const StepChunks<Weights, G, 1> ahead = gemv_stream_fetch<G, Checked>(w, first + r + G, n, ku, k);
    gemv_stream_batch<G, Checked>(w, xv, c, first + r, n, k, ku, lane, partial + r);
    c = ahead;
  }
  gemv_stream_batch<G, Checked>(w, xv, c, first + r, n, k, ku, lane, partial + r);
}

// gemv_stream_rows for SIMD group sg of a threadgroup (its chunk of K,
// count >= 1 rows), x's elements loaded here, without a bounds test where
// none is needed: every SIMD group but the last one of a K that is not a
// whole number of chunks.
template <uint G, typename Weights, typename X>
inline void gemv_stream(Weights w, X x, uint first, uint count, uint n, uint k, uint sg, uint lane,
                        threadgroup float* partial) {
  constexpr uint P = Weights::kPerLane;
  const uint ku = (sg * 32 + lane) * P;
  float4 xv[P / 4];
  if (w.vectorized && x.vectorized && (sg + 1) * 32 * P <= k) {
    x.template load<P, false>(0, ku, k, xv);
    gemv_stream_rows<G, false>(w, xv, first, count, n, k, ku, lane, partial);
  } else {
    x.template load<P, true>(0, ku, k, xv);
    gemv_stream_rows<G, true>(w, xv, first, count, n, k, ku, lane, partial);
  }
}

}  // namespace mps_ext
