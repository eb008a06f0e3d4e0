// Grouped matrix multiply (torch._grouped_mm, Mixture-of-Experts layers):
// out_g = a_g @ b_g for G groups whose extents along one dimension come from
// `offs` (int32 cumulative ends), read here on the device: the host never
// sees them, so grids are sized for the worst case and threadgroups with
// nothing to do leave at once. float, half and bfloat; float accumulation,
// one rounding to the output type. Layouts and strides: GroupedMmParams.
//
// Group g covers [offs[g - 1], offs[g]) (offs[-1] = 0), clamped to the split
// dimension; positions past offs[G - 1] are never written, as in torch.
//
// - decode: few rows per group (MoE decode: each token's top-k experts), b
//   the transposed expert weights, i.e. every group's weight W_g (n x k)
//   row-major. A threadgroup serves up to M rows of one group (M = 1, 2, 4
//   or 8, one pipeline each, so the 1-row kernel holds no 8-row registers;
//   the host picks M from m and G: see decode_rows in csrc/ops/grouped_mm.cpp;
//   a shorter run of one row takes the 1-row computation)
//   and 4 x R / slices columns of out (R = rows_per_simdgroup(M)): the GEMV
//   mapping of mps_ext/gemv.h streams those rows of W_g once for all M rows
//   (a lane reads kGroupedDecodeChunks 16-byte chunks of each per step, or
//   kFp8GroupedDecodeBytes e4m3fn bytes: mps_ext/params.h, fetched a step
//   ahead of their decode),
//   K split over `slices` SIMD groups when the host finds too few SIMD groups
//   to fill the GPU. Grid: ceil(n / (4 R / slices)) x m when split by rows
//   (one threadgroup per row of a: only threadgroups at the start of a run
//   of M routed rows of a group work, so unrouted experts cost nothing),
//   else x G * ceil(m / M). The weights are read through a policy of
//   gemv.h: b's own type, or e4m3fn bytes with their per-expert scales
//   (fp8_grouped_mm: mps_ext/fp8_weights.h; the scales at buffer 5, which
//   the host binds for every kernel and the dense ones leave unread).
// - stream (fp8_grouped_mm, up to two rows per group on average): a
//   threadgroup per routed row of a, held in registers, and a block of its
//   group's weight rows streamed past it (grouped_mm_stream below).
// - tiled: TM x 32 tiles of out with simdgroup matrices (mps_ext/mma.h), TM
//   chosen by the host from the average rows per group. Split by rows, the
//   grid's y runs over ceil(m / TM) + G tiles (the most the groups can need)
//   and each threadgroup finds its group and first row by walking offs;
//   split by columns likewise along x; split by K or not split, z is the group.
//   b's tiles load as b's type, or (fp8_grouped_mm, split by rows) as
//   e4m3fn bytes decoded exactly and times their scales (Fp8ExpertTile).
#include <metal_stdlib>

#include "mps_ext/fp8_weights.h"
#include "mps_ext/gemv.h"
#include "mps_ext/mma.h"
#include "mps_ext/params.h"

using namespace metal;
using mps_ext::GroupedMmParams;
using mps_ext::rows_per_simdgroup;
// Decode threadgroups: four SIMD groups (128 threads, as the host launches).
constant constexpr uint kDecodeSimdGroups = 4;
using mps_ext::kTileK;
using mps_ext::kTileN;
using mps_ext::kTileThreads;

using mps_ext::kGroupedSplitCols;
using mps_ext::kGroupedSplitK;
using mps_ext::kGroupedSplitRows;

// The part [start, start + size) of a dimension of length `limit` that group
// g covers.
struct Extent {
  uint start, size;
};

inline Extent group_extent(device const int* offs, uint g, uint limit) {
  const int lo = g == 0 ? 0 : offs[g - 1], hi = offs[g];
  const uint s = uint(clamp(lo, 0, int(limit))), e = uint(clamp(hi, 0, int(limit)));
  return Extent{s, e > s ? e - s : 0u};
}

// Tile `t` of the tiles of `tile`-sized pieces that the groups' extents need,
// counted group after group: its group and that group's extent, with t made
// relative to the group. False when there is no such tile (a surplus
// threadgroup of the worst-case grid).
inline bool find_tile(device const int* offs, uint groups, uint limit, uint tile, thread uint& t, thread uint& g,
                      thread Extent& extent) {
  for (g = 0; g < groups; ++g) {
    extent = group_extent(offs, g, limit);
    const uint tiles = (extent.size + tile - 1) / tile;
    if (t < tiles) return true;
    t -= tiles;
  }
  return false;
}

// The rows of a that decode threadgroup `t` (its grid y) serves: at most M
// rows [rows.start, rows.start + rows.size) of group g. Split by rows, t is a
// row of a: the threadgroup finds t's group in offs (below) and
// serves the M rows from t when t starts a run of M rows of its group; for
// any other row (inside a run, or past offs[G - 1]) it has nothing to do, so
// the grid needs no more than m threadgroups along y. Not split, t counts the
// ceil(m / M) runs of every group in turn. Every lane of the SIMD group calls
// it (a SIMD-group sum).
template <uint M>
inline bool decode_rows_of(device const int* offs, constant GroupedMmParams& p, uint t, uint lane, thread uint& g,
                           thread Extent& rows) {
  if (p.split != kGroupedSplitRows) {
    const uint runs = (p.m + M - 1) / M, first = t % runs * M;
    g = t / runs;
    rows = Extent{first, min(M, p.m - first)};
    return true;
  }
  // t's group is the first whose (clamped) end is past t: the count of the
  // groups that end at or before t, the lanes counting every 32nd group
  // each. Their loads are independent, where a binary search's log2(groups)
  // loads wait on each other, at every threadgroup's start.
  uint ended = 0;
  for (uint i = lane; i < p.groups; i += 32) ended += uint(clamp(offs[i], 0, int(p.m))) <= t ? 1u : 0u;
  g = simd_sum(ended);
  if (g == p.groups) return false;
  const Extent e = group_extent(offs, g, p.m);
  if (t < e.start || t >= e.start + e.size || (t - e.start) % M != 0) return false;
  rows = Extent{t, min(M, e.start + e.size - t)};
  return true;
}

typedef uchar fp8;  // host names say fp8 for e4m3fn bytes

// Group g's weights W_g (n x k, rows b_col apart) as a gemv.h weight policy.
template <typename W>
inline mps_ext::DenseWeights<W> weights_of(device const W* b, device const float*, constant GroupedMmParams& p,
                                           uint g) {
  return mps_ext::DenseWeights<W>{b + ulong(g) * p.b_group, p.b_col, p.b_vectorized != 0};
}

// Group g's e4m3fn weights, Bytes bytes of a row per lane and chunk.
template <uint Bytes>
inline mps_ext::Fp8Weights<Bytes> fp8_weights_of(device const fp8* b, device const float* scales,
                                                 constant GroupedMmParams& p, uint g) {
  return mps_ext::Fp8Weights<Bytes>{b + ulong(g) * p.b_group,
                                    p.b_col,
                                    p.b_vectorized != 0,
                                    scales + ulong(g) * p.scale_group,
                                    p.block_n,
                                    p.block_k,
                                    p.scale_cols,
                                    p.block_k < p.k};
}

inline mps_ext::Fp8Weights<mps_ext::kFp8GroupedDecodeBytes> weights_of(device const fp8* b, device const float* scales,
                                                                       constant GroupedMmParams& p, uint g) {
  return fp8_weights_of<mps_ext::kFp8GroupedDecodeBytes>(b, scales, p, g);
}

template <typename T, typename W, uint M>
kernel void grouped_mm_decode(device const T* a [[buffer(0)]], device const W* b [[buffer(1)]],
                              device const int* offs [[buffer(2)]], device T* out [[buffer(3)]],
                              constant GroupedMmParams& p [[buffer(4)]], device const float* scales [[buffer(5)]],
                              uint2 group [[threadgroup_position_in_grid]],
                              uint sg [[simdgroup_index_in_threadgroup]],
                              uint simdgroups [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  constexpr uint R = rows_per_simdgroup<M>();
  threadgroup float partial[kDecodeSimdGroups * R * M];
  uint g;
  Extent rows;
  if (!decode_rows_of<M>(offs, p, group.y, lane, g, rows)) return;  // the whole threadgroup, before any barrier
  // Runs of `slices` SIMD groups share R weight rows (= columns of out), each
  // reading every slices-th step of K.
  const uint slices = p.decode_slices;
  const uint first = (group.x * (simdgroups / slices) + sg / slices) * R;
  const auto w = weights_of(b, scales, p, g);
  const mps_ext::XRows<T> x{a + ulong(g) * p.a_group + ulong(rows.start) * p.a_row, p.a_row, rows.size,
                            p.a_vectorized != 0};
  constexpr bool kFp8 = is_same<W, fp8>::value;
  constexpr uint U = kFp8 ? 1 : mps_ext::kGroupedDecodeChunks;
  mps_ext::Tile<M, R> t;
  if (M > 1 && rows.size == 1) {
    // A run of one row (most runs where experts get one or two rows): no x loads or sums for absent rows.
    const mps_ext::Tile<1, R> one =
        mps_ext::gemv_simdgroup<1, R, U, kFp8>(w, x, first, p.n, p.k, sg % slices, slices, lane);
    MPS_EXT_UNROLL
    for (uint r = 0; r < R; ++r)
      MPS_EXT_UNROLL
      for (uint i = 0; i < M; ++i) t.v[r][i] = i == 0 ? one.v[r][0] : 0.0f;
  } else {
    t = mps_ext::gemv_simdgroup<M, R, U, kFp8>(w, x, first, p.n, p.k, sg % slices, slices, lane);
  }
  if (slices > 1) t = mps_ext::gemv_sum_slices(t, partial, sg, slices, lane);
  if (sg % slices != 0) return;
  device T* y = out + ulong(g) * p.out_group + ulong(rows.start) * p.out_row;
  MPS_EXT_UNROLL
  for (uint r = 0; r < R; ++r)
    MPS_EXT_UNROLL
    for (uint i = 0; i < M; ++i)
      if (lane == r * M + i && first + r < p.n && i < rows.size)
        y[ulong(i) * p.out_row + first + r] = T(t.v[r][i] * w.scale(first + r));
}

// Decode of e4m3fn experts, each routed row of a on its own (fp8_grouped_mm,
// the host's choice for up to two rows per expert on average): threadgroup
// (x, t) serves row t of a (finding its group as grouped_mm_decode's 1-row
// threadgroups do) and the block of stream_rows weight rows from
// x * stream_rows, a SIMD group per 32 x Bytes bytes of K holding the row of
// a in registers while the block streams past, G rows at a time (gemv_stream
// in mps_ext/gemv.h). Rows of a routed to one expert read its weights each.
// Bytes = 16 takes G = 2, Bytes = 8 G = 4: either way a lane holds 32 bytes of
// weights in flight, 64 registers or fewer on the CUDA proxy. Grid:
// ceil(n / stream_rows) x m.
template <typename T, uint Bytes, uint G>
kernel void grouped_mm_stream(device const T* a [[buffer(0)]], device const fp8* b [[buffer(1)]],
                              device const int* offs [[buffer(2)]], device T* out [[buffer(3)]],
                              constant GroupedMmParams& p [[buffer(4)]], device const float* scales [[buffer(5)]],
                              uint2 group [[threadgroup_position_in_grid]],
                              uint sg [[simdgroup_index_in_threadgroup]],
                              uint simdgroups [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                              uint tid [[thread_index_in_threadgroup]]) {
  threadgroup float partial[mps_ext::kGemvStreamPartials];
  threadgroup float factors[mps_ext::kGemvStreamMaxRows];
  uint g;
  Extent row;
  if (!decode_rows_of<1>(offs, p, group.y, lane, g, row)) return;  // the whole threadgroup, before the barrier
  const uint rows = p.stream_rows, first = group.x * rows, count = min(rows, p.n - first);
  const auto w = fp8_weights_of<Bytes>(b, scales, p, g);
  // Thread i < count writes row first + i (count <= 32: the host's
  // stream_rows); its scale is loaded now, so that its latency hides behind
  // the stream instead of adding to the threadgroup's end.
  if (tid < count) factors[tid] = w.scale(first + tid);
  const mps_ext::XRows<T> x{a + ulong(g) * p.a_group + ulong(row.start) * p.a_row, p.a_row, 1, p.a_vectorized != 0};
  mps_ext::gemv_stream<G>(w, x, first, count, p.n, p.k, sg, lane, partial + sg * rows);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid >= count) return;
  float dot = 0.0f;
  for (uint s = 0; s < simdgroups; ++s) dot += partial[s * rows + tid];
  out[ulong(g) * p.out_group + ulong(row.start) * p.out_row + first + tid] = T(dot * factors[tid]);
}

// Decode for weights stored (G, K, N) with N contiguous (gpt-oss, Aria: b
// not transposed), where a SIMD group cannot stream a weight row along K. A
// threadgroup serves the rows of a that grouped_mm_decode's would and
// p.decode_chunks (2 or 4) chunks of 16 bytes of columns: 32 or 64
// contiguous bytes of every weight row, the host's choice (csrc/ops). Its
// threads stand as chunks x K-lanes; a K-lane reads every lanes-th weight
// row, kKnInFlight rows per step (one 16-byte load each, all issued before
// the first is used) with the matching element of each row of a, and the
// K-lanes' sums meet through shuffles, then threadgroup memory. Grid:
// ceil(n / columns) x m when split by rows, else x G * ceil(m / M).
constant constexpr uint kKnMaxChunks = 4;
constant constexpr uint kKnInFlight = 4;

template <typename T, uint M>
kernel void grouped_mm_decode_kn(device const T* a [[buffer(0)]], device const T* b [[buffer(1)]],
                                 device const int* offs [[buffer(2)]], device T* out [[buffer(3)]],
                                 constant GroupedMmParams& p [[buffer(4)]],
                                 uint2 group [[threadgroup_position_in_grid]],
                                 uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                                 uint lane [[thread_index_in_simdgroup]]) {
  constexpr uint P = 16 / sizeof(T);  // columns of a chunk
  threadgroup float partial[kDecodeSimdGroups * M * kKnMaxChunks * P];
  uint g;
  Extent rows;
  if (!decode_rows_of<M>(offs, p, group.y, lane, g, rows)) return;  // the whole threadgroup, before the barrier
  const uint chunks = p.decode_chunks, columns = chunks * P, lanes = kDecodeSimdGroups * 32 / chunks;
  const uint chunk = lane % chunks, k_lane = sg * (32 / chunks) + lane / chunks;
  const uint first = group.x * columns;
  device const T* w = b + ulong(g) * p.b_group;
  device const T* x = a + ulong(g) * p.a_group + ulong(rows.start) * p.a_row;
  float4 acc[M][P / 4];
  MPS_EXT_UNROLL
  for (uint i = 0; i < M; ++i)
    MPS_EXT_UNROLL
    for (uint c = 0; c < P / 4; ++c) acc[i][c] = 0.0f;
  for (uint k0 = k_lane; k0 < p.k; k0 += lanes * kKnInFlight) {
    float4 wv[kKnInFlight][P / 4];
    MPS_EXT_UNROLL
    for (uint u = 0; u < kKnInFlight; ++u) {
      const uint k = min(k0 + u * lanes, p.k - 1);  // a row past K is read, then weighted by 0
      mps_ext::load_floats<P>(w + ulong(k) * p.b_k, first + chunk * P, p.n, p.b_vectorized != 0, wv[u]);
    }
    MPS_EXT_UNROLL
    for (uint u = 0; u < kKnInFlight; ++u) {
      const uint k = k0 + u * lanes;
      MPS_EXT_UNROLL
      for (uint i = 0; i < M; ++i) {
        const float xi = i < rows.size && k < p.k ? float(x[ulong(i) * p.a_row + k]) : 0.0f;
        MPS_EXT_UNROLL
        for (uint c = 0; c < P / 4; ++c) acc[i][c] += wv[u][c] * xi;
      }
    }
  }
  // The SIMD group's K-lanes of a chunk are lanes `chunks` apart.
  for (uint d = chunks; d < 32; d *= 2)
    MPS_EXT_UNROLL
    for (uint i = 0; i < M; ++i)
      MPS_EXT_UNROLL
      for (uint c = 0; c < P / 4; ++c) acc[i][c] += simd_shuffle(acc[i][c], ushort(lane ^ d));
  if (lane < chunks)
    MPS_EXT_UNROLL
    for (uint i = 0; i < M; ++i)
      MPS_EXT_UNROLL
      for (uint j = 0; j < P; ++j) partial[(sg * M + i) * columns + chunk * P + j] = acc[i][j / 4][j % 4];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  device T* y = out + ulong(g) * p.out_group + ulong(rows.start) * p.out_row + first;
  for (uint e = tid; e < M * columns; e += kDecodeSimdGroups * 32) {
    const uint i = e / columns, j = e % columns;
    if (i >= rows.size || first + j >= p.n) continue;
    float v = 0.0f;
    for (uint s = 0; s < kDecodeSimdGroups; ++s) v += partial[(s * M + i) * columns + j];
    y[ulong(i) * p.out_row + j] = T(v);
  }
}

// An R x C tile of a strided operand as floats ([R][C]), element (r, c) at
// base[r * rs + c * cs], zeros at or past (r_size, c_size). K runs along c
// for a (R = TM rows, C = K) and along r for b (R = K, C = 32 columns). The
// threads walk the tile along whichever of r and c is contiguous in memory.
template <typename T, uint R, uint C>
struct StridedTile {
  device const T* base;
  ulong rs, cs;
  uint r_size, c_size;
  bool k_along_c;

  void load(threadgroup float* tile, uint k0, uint tid) const {
    const uint r0 = k_along_c ? 0 : k0, c0 = k_along_c ? k0 : 0;
    const bool c_fastest = cs == 1;
    for (uint j = 0; j < R * C / kTileThreads; ++j) {
      const uint e = tid + j * kTileThreads;
      const uint r = c_fastest ? e / C : e % R, c = c_fastest ? e % C : e / R;
      const uint rr = r0 + r, cc = c0 + c;
      tile[r * C + c] = rr < r_size && cc < c_size ? float(base[rr * rs + cc * cs]) : 0.0f;
    }
  }
};

// The 32 x 32 tile of group g's e4m3fn weights W_g (n x k row-major, rows
// b_col apart) at rows [col, col + 32), columns [k0, k0 + 32), as b's tile
// ([k][n]): each of the 128 threads decodes 8 consecutive bytes of one row
// exactly to float (fp8x4_to_float4_div256, the 256 given back with the
// scale), times their block's scale, NaN codes as NaN, zeros outside W_g.
struct Fp8ExpertTile {
  device const uchar* w;       // W_g's row `col`
  device const float* scales;  // W_g's scales
  uint k, n, col;              // n: rows of W_g from `col` on
  ulong row_stride;
  uint block_n, block_k, scale_cols;

  void load(threadgroup float* tile, uint k0, uint tid) const {
    const uint r = tid / 4, c = (tid % 4) * 8;
    uint2 u = uint2(0);
    if (r < n)
      for (uint j = 0; j < 8; ++j)
        if (k0 + c + j < k) u[j / 4] |= uint(w[ulong(r) * row_stride + k0 + c + j]) << (8 * (j % 4));
    const float4 lo = mps_ext::fp8x4_to_float4_div256(u.x), hi = mps_ext::fp8x4_to_float4_div256(u.y);
    for (uint j = 0; j < 8; ++j) {
      const uint kk = k0 + c + j;
      float v = 0.0f;
      if (r < n && kk < k)
        v = (j < 4 ? lo[j] : hi[j - 4]) * (256.0f * scales[((col + r) / block_n) * scale_cols + kk / block_k]);
      tile[(c + j) * kTileN + r] = v;
    }
  }
};

// b's tile loader for group g, columns [col, col + 32): b's own type through
// StridedTile, or e4m3fn bytes with their scales (fp8_grouped_mm; split by
// rows: every group contracts over all of k).
template <typename T>
inline StridedTile<T, kTileK, kTileN> b_tiles_of(device const T* b, device const float*, constant GroupedMmParams& p,
                                                 uint g, Extent ks, ulong col, uint cols) {
  return {b + ulong(g) * p.b_group + ulong(ks.start) * p.b_k + col * p.b_col, p.b_k, p.b_col, ks.size, cols, false};
}

inline Fp8ExpertTile b_tiles_of(device const fp8* b, device const float* scales, constant GroupedMmParams& p, uint g,
                                Extent ks, ulong col, uint cols) {
  return {b + ulong(g) * p.b_group + col * p.b_col, scales + ulong(g) * p.scale_group, ks.size, cols, uint(col),
          p.b_col, p.block_n, p.block_k, p.scale_cols};
}

template <typename T, typename W, uint TM>
kernel void grouped_mm_tiled(device const T* a [[buffer(0)]], device const W* b [[buffer(1)]],
                             device const int* offs [[buffer(2)]], device T* out [[buffer(3)]],
                             constant GroupedMmParams& p [[buffer(4)]], device const float* scales [[buffer(5)]],
                             uint3 group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                             uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float a_tile[TM * kTileK];
  threadgroup float b_tile[kTileK * kTileN];
  threadgroup float c_tile[TM * kTileN];
  uint g = group.z, row_tile = group.y, col_tile = group.x;
  Extent rows{0, p.m}, cols{0, p.n}, ks{0, p.k};
  if (p.split == kGroupedSplitRows) {
    if (!find_tile(offs, p.groups, p.m, TM, row_tile, g, rows)) return;
  } else if (p.split == kGroupedSplitCols) {
    if (!find_tile(offs, p.groups, p.n, kTileN, col_tile, g, cols)) return;
  } else if (p.split == kGroupedSplitK) {
    ks = group_extent(offs, g, p.k);  // an empty K range still writes its zeros, as torch does
  }
  const uint m0 = row_tile * TM, n0 = col_tile * kTileN;
  if (m0 >= rows.size || n0 >= cols.size) return;
  const ulong row = rows.start + m0, col = cols.start + n0;
  const StridedTile<T, TM, kTileK> la{a + ulong(g) * p.a_group + row * p.a_row + ulong(ks.start) * p.a_k,
                                      p.a_row, p.a_k, rows.size - m0, ks.size, true};
  const auto lb = b_tiles_of(b, scales, p, g, ks, col, cols.size - n0);
  mps_ext::mma_store(mps_ext::mma_tiles<TM>(la, lb, ks.size, a_tile, b_tile, tid, sg), c_tile, sg);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  device T* y = out + ulong(g) * p.out_group + row * p.out_row + col;
  for (uint e = tid; e < TM * kTileN; e += kTileThreads) {
    const uint i = e / kTileN, j = e % kTileN;
    if (m0 + i < rows.size && n0 + j < cols.size) y[ulong(i) * p.out_row + j] = T(c_tile[e]);
  }
}

// Host names: grouped_mm_decode_m<M>_<type>, grouped_mm_decode_kn_m<M>_<type>,
// grouped_mm_tiled_m<TM>_<type>, fp8_grouped_mm_decode_m<M>_<type>,
// fp8_grouped_mm_stream<Bytes>_<type> and fp8_grouped_mm_tiled_m<TM>_<type> (e4m3fn weights), built by the host from
// the same parts (csrc/ops/grouped_mm.cpp).
#define MPS_EXT_GROUPED_MM_TILED(T, TM)                                                                        \
  template [[host_name("grouped_mm_tiled_m" #TM "_" #T)]] [[kernel]] decltype(grouped_mm_tiled<T, T, TM>)      \
      grouped_mm_tiled<T, T, TM>;

#define MPS_EXT_FP8_GROUPED_MM_TILED(T, TM)                                                                    \
  template [[host_name("fp8_grouped_mm_tiled_m" #TM "_" #T)]] [[kernel]]                                       \
      decltype(grouped_mm_tiled<T, fp8, TM>) grouped_mm_tiled<T, fp8, TM>;

#define MPS_EXT_GROUPED_MM_DECODE(T, M)                                                                        \
  template [[host_name("grouped_mm_decode_m" #M "_" #T)]] [[kernel]] decltype(grouped_mm_decode<T, T, M>)     \
      grouped_mm_decode<T, T, M>;

// fp8_grouped_mm splits x by rows, so at least 2 rows per run (decode_rows in csrc/ops/grouped_mm.cpp).
#define MPS_EXT_FP8_GROUPED_MM_DECODE(T, M)                                                                    \
  template [[host_name("fp8_grouped_mm_decode_m" #M "_" #T)]] [[kernel]]                                       \
      decltype(grouped_mm_decode<T, fp8, M>) grouped_mm_decode<T, fp8, M>;

#define MPS_EXT_FP8_GROUPED_MM_STREAM(T, Bytes, G)                                                           \
  template [[host_name("fp8_grouped_mm_stream" #Bytes "_" #T)]] [[kernel]]                                     \
      decltype(grouped_mm_stream<T, Bytes, G>) grouped_mm_stream<T, Bytes, G>;

#define MPS_EXT_GROUPED_MM_DECODE_KN(T, M)                                                                     \
  template [[host_name("grouped_mm_decode_kn_m" #M "_" #T)]] [[kernel]] decltype(grouped_mm_decode_kn<T, M>)  \
      grouped_mm_decode_kn<T, M>;

#define MPS_EXT_GROUPED_MM(T)                                                                                  \
  MPS_EXT_GROUPED_MM_DECODE(T, 1) MPS_EXT_GROUPED_MM_DECODE(T, 2) MPS_EXT_GROUPED_MM_DECODE(T, 4)              \
  MPS_EXT_GROUPED_MM_DECODE(T, 8)                                                                              \
  MPS_EXT_GROUPED_MM_DECODE_KN(T, 1) MPS_EXT_GROUPED_MM_DECODE_KN(T, 2) MPS_EXT_GROUPED_MM_DECODE_KN(T, 4)     \
  MPS_EXT_GROUPED_MM_DECODE_KN(T, 8)                                                                           \
  MPS_EXT_GROUPED_MM_TILED(T, 16) MPS_EXT_GROUPED_MM_TILED(T, 32) MPS_EXT_GROUPED_MM_TILED(T, 64)            \
  MPS_EXT_FP8_GROUPED_MM_DECODE(T, 2) MPS_EXT_FP8_GROUPED_MM_DECODE(T, 4) MPS_EXT_FP8_GROUPED_MM_DECODE(T, 8)    \
  MPS_EXT_FP8_GROUPED_MM_STREAM(T, 16, 2) MPS_EXT_FP8_GROUPED_MM_STREAM(T, 8, 4)                                \
  MPS_EXT_FP8_GROUPED_MM_TILED(T, 16) MPS_EXT_FP8_GROUPED_MM_TILED(T, 32) MPS_EXT_FP8_GROUPED_MM_TILED(T, 64)

MPS_EXT_GROUPED_MM(float)
MPS_EXT_GROUPED_MM(half)
MPS_EXT_GROUPED_MM(bfloat)
