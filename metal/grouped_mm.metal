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
//   row-major. One threadgroup per (16 columns of out, group): the GEMV
//   mapping of mps_ext/gemv.h streams the 16 rows of W_g once for all the
//   group's rows (up to 8 at a time), and an empty group returns before
//   reading any weight. Grid: ceil(n / 16) x G.
// - tiled: TM x 32 tiles of out with simdgroup matrices (mps_ext/mma.h), TM
//   chosen by the host from the average rows per group. Split by rows, the
//   grid's y runs over ceil(m / TM) + G tiles (the most the groups can need)
//   and each threadgroup finds its group and first row by walking offs;
//   split by columns likewise along x; split by K or not split, z is the group.
#include <metal_stdlib>

#include "mps_ext/gemv.h"
#include "mps_ext/mma.h"
#include "mps_ext/params.h"

using namespace metal;
using mps_ext::GroupedMmParams;
using mps_ext::kRowsPerSimdGroup;
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

// Columns [first, first + 4) of out for `m` (<= M) rows of a group: one SIMD
// group's pass over those four rows of the group's weight.
template <uint M, typename T>
inline void decode_rows(mps_ext::DenseWeights<T> w, mps_ext::XRows<T> x, device T* y, uint y_stride, uint first,
                        uint n, uint k, uint lane) {
  const mps_ext::Tile<M, kRowsPerSimdGroup> t = mps_ext::gemv_simdgroup<M, kRowsPerSimdGroup>(w, x, first, n, k, 0, 1, lane);
  for (uint r = 0; r < kRowsPerSimdGroup; ++r)
    for (uint i = 0; i < M; ++i)
      if (lane == r * M + i && first + r < n && i < x.m) y[ulong(i) * y_stride + first + r] = T(t.v[r][i]);
}

template <typename T>
kernel void grouped_mm_decode(device const T* a [[buffer(0)]], device const T* b [[buffer(1)]],
                              device const int* offs [[buffer(2)]], device T* out [[buffer(3)]],
                              constant GroupedMmParams& p [[buffer(4)]], uint2 group [[threadgroup_position_in_grid]],
                              uint sg [[simdgroup_index_in_threadgroup]],
                              uint simdgroups [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  const uint g = group.y;
  const uint first = (group.x * simdgroups + sg) * kRowsPerSimdGroup;
  if (first >= p.n) return;  // a whole SIMD group leaves: no SIMD-group function is split
  const Extent rows = p.split == kGroupedSplitRows ? group_extent(offs, g, p.m) : Extent{0, p.m};
  const mps_ext::DenseWeights<T> w{b + ulong(g) * p.b_group, p.b_col, p.b_vectorized != 0};
  // Groups with more rows than a kernel pass takes reread their weights per 8 rows.
  for (uint r = 0; r < rows.size; r += 8) {
    const uint m = min(rows.size - r, 8u);
    const ulong row = rows.start + r;
    const mps_ext::XRows<T> x{a + ulong(g) * p.a_group + row * p.a_row, p.a_row, m, p.a_vectorized != 0};
    device T* y = out + ulong(g) * p.out_group + row * p.out_row;
    // m is the same for the whole SIMD group: the branch does not diverge.
    if (m == 1) {
      decode_rows<1>(w, x, y, p.out_row, first, p.n, p.k, lane);
    } else if (m == 2) {
      decode_rows<2>(w, x, y, p.out_row, first, p.n, p.k, lane);
    } else if (m <= 4) {
      decode_rows<4>(w, x, y, p.out_row, first, p.n, p.k, lane);
    } else {
      decode_rows<8>(w, x, y, p.out_row, first, p.n, p.k, lane);
    }
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

template <typename T, uint TM>
kernel void grouped_mm_tiled(device const T* a [[buffer(0)]], device const T* b [[buffer(1)]],
                             device const int* offs [[buffer(2)]], device T* out [[buffer(3)]],
                             constant GroupedMmParams& p [[buffer(4)]], uint3 group [[threadgroup_position_in_grid]],
                             uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
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
  const StridedTile<T, kTileK, kTileN> lb{b + ulong(g) * p.b_group + ulong(ks.start) * p.b_k + col * p.b_col,
                                          p.b_k, p.b_col, ks.size, cols.size - n0, false};
  mps_ext::mma_store(mps_ext::mma_tiles<TM>(la, lb, ks.size, a_tile, b_tile, tid, sg), c_tile, sg);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  device T* y = out + ulong(g) * p.out_group + row * p.out_row + col;
  for (uint e = tid; e < TM * kTileN; e += kTileThreads) {
    const uint i = e / kTileN, j = e % kTileN;
    if (m0 + i < rows.size && n0 + j < cols.size) y[ulong(i) * p.out_row + j] = T(c_tile[e]);
  }
}

// Host names: grouped_mm_decode_<type>, grouped_mm_tiled_m<TM>_<type>, built
// by the host from the same parts (csrc/ops/grouped_mm.cpp).
#define MPS_EXT_GROUPED_MM_TILED(T, TM)                                                                        \
  template [[host_name("grouped_mm_tiled_m" #TM "_" #T)]] [[kernel]] decltype(grouped_mm_tiled<T, TM>)         \
      grouped_mm_tiled<T, TM>;

#define MPS_EXT_GROUPED_MM(T)                                                                                  \
  template [[host_name("grouped_mm_decode_" #T)]] [[kernel]] decltype(grouped_mm_decode<T>) grouped_mm_decode<T>; \
  MPS_EXT_GROUPED_MM_TILED(T, 16) MPS_EXT_GROUPED_MM_TILED(T, 32) MPS_EXT_GROUPED_MM_TILED(T, 64)

MPS_EXT_GROUPED_MM(float)
MPS_EXT_GROUPED_MM(half)
MPS_EXT_GROUPED_MM(bfloat)
