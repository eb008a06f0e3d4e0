// Tiled matrix multiply with 8x8 simdgroup matrices: a threadgroup of four
// SIMD groups computes a TM x 32 tile of C = A (m x k) @ B (k x n), TM being
// 16, 32 (the default) or 64, each SIMD group a (TM / 2) x 16 quarter,
// accumulating in float. Operands go through threadgroup memory as float,
// filled by loader policies, so any storage (fp8 bytes with scales, half,
// bfloat, per-expert matrices) plugs in by how it loads a tile:
//
//   struct Loader { void load(threadgroup float* tile, uint k0, uint tid) const; };
//
// fills A's tile as [TM][kTileK] (row m, column k) or B's as
// [kTileK][kTileN] for columns [k0, k0 + kTileK), with zeros outside the
// matrices; all kTileThreads threads call it.
#pragma once

#include <metal_stdlib>

namespace mps_ext {

constant constexpr uint kTileM = 32, kTileN = 32, kTileK = 32, kTileThreads = 128;

template <uint TM = kTileM>
struct TileAccumulators {
  metal::simdgroup_float8x8 m[TM / 16][2];
};

template <uint TM = kTileM, typename LoadA, typename LoadB>
inline TileAccumulators<TM> mma_tiles(LoadA load_a, LoadB load_b, uint k, threadgroup float* a_tile,
                                      threadgroup float* b_tile, uint tid, uint sg) {
  TileAccumulators<TM> acc;
  for (uint i = 0; i < TM / 16; ++i)
    for (uint j = 0; j < 2; ++j) acc.m[i][j] = metal::make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  const uint sm = (sg / 2) * (TM / 2), sn = (sg % 2) * 16;
  for (uint k0 = 0; k0 < k; k0 += kTileK) {
    load_a.load(a_tile, k0, tid);
    load_b.load(b_tile, k0, tid);
    metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    for (uint kk = 0; kk < kTileK; kk += 8) {
      metal::simdgroup_float8x8 a[TM / 16], b[2];
      for (uint i = 0; i < TM / 16; ++i) metal::simdgroup_load(a[i], a_tile + (sm + 8 * i) * kTileK + kk, kTileK);
      for (uint j = 0; j < 2; ++j) metal::simdgroup_load(b[j], b_tile + kk * kTileN + sn + 8 * j, kTileN);
      for (uint i = 0; i < TM / 16; ++i)
        for (uint j = 0; j < 2; ++j) metal::simdgroup_multiply_accumulate(acc.m[i][j], a[i], b[j], acc.m[i][j]);
    }
    metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  }
  return acc;
}

// The tile of C into `c_tile` ([TM][kTileN] floats) for the caller's
// epilogue; it must pass a threadgroup barrier before reading it.
template <uint TM>
inline void mma_store(TileAccumulators<TM> acc, threadgroup float* c_tile, uint sg) {
  const uint sm = (sg / 2) * (TM / 2), sn = (sg % 2) * 16;
  for (uint i = 0; i < TM / 16; ++i)
    for (uint j = 0; j < 2; ++j) metal::simdgroup_store(acc.m[i][j], c_tile + (sm + 8 * i) * kTileN + sn + 8 * j, kTileN);
}

}  // namespace mps_ext
