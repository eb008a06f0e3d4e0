// Scaled dot-product attention: out = softmax(q k^T * scale + mask) v.
//
// - attention_decode: one threadgroup per (batch and KV head, block of rows,
//   run of keys). Its rows are every query row of every query head that
//   reads that KV head (GQA), so each key and value row is loaded once for
//   all of them: the lanes of a SIMD group hold E elements each of a key
//   row, one simd_sum per row gives that row's score, and the same lanes
//   then accumulate E elements of the value row. The threadgroup's SIMD
//   groups take keys in turn, each keeping a running (max, sum of exp,
//   output) per row, merged through threadgroup memory at the end. Keys are
//   split into runs over as many threadgroups as fill the GPU (the host
//   plan); a single run writes the output, several write their partial
//   (max, sum, output) for
// - attention_merge, which combines a row's runs as flash-decoding does,
//   its SIMD groups taking the runs in turn.
// - attention_prefill: longer queries, in blocks of rows with simdgroup
//   matrices for both products (below).
//
// Arithmetic is in float. Semantics follow torch's CPU math attention
// (softmax, then rows that attend no key give 0): a key whose score is -inf
// (masked, causal, or -inf from the inputs) contributes exactly 0; a row with
// no other key gives 0; a NaN score makes its row NaN, as do two +inf.
#include <metal_stdlib>

#include "mps_ext/params.h"
#include "mps_ext/unroll.h"

using namespace metal;
using mps_ext::AttentionParams;

// exp(x - m), exactly 0 for x = -inf (also when m is -inf: no key yet).
inline float attention_term(float x, float m) { return x == -INFINITY ? 0.0f : exp(x - m); }

// The larger of a running maximum and a score; a NaN score leaves the maximum
// as it is (its term carries the NaN into the sum).
inline float attention_max(float m, float x) { return x > m ? x : m; }

// Elements [lane * E, lane * E + E) of a row of `dim`: 4- or 2-element loads
// when the host found the rows aligned for them (every lane's slice then lies
// wholly inside or outside the row), else one element at a time.
template <typename T, uint E>
inline void load_slice(device const T* row, uint lane, uint dim, bool vectorized, thread float* out) {
  const uint first = lane * E;
  if (vectorized && first < dim) {
    constexpr uint W = E % 4 == 0 ? 4 : 2;
    MPS_EXT_UNROLL
    for (uint c = 0; c < E; c += W) {
      const vec<float, W> v = vec<float, W>(*reinterpret_cast<device const vec<T, W>*>(row + first + c));
      MPS_EXT_UNROLL
      for (uint e = 0; e < W; ++e) out[c + e] = v[e];
    }
    return;
  }
  MPS_EXT_UNROLL
  for (uint e = 0; e < E; ++e) out[e] = first + e < dim ? float(row[first + e]) : 0.0f;
}

// Whether a sliding window (p.window keys ending at the row's position,
// aligned to the end of the keys) leaves `key` out of query row `qrow`.
inline bool outside_window(constant AttentionParams& p, uint qrow, uint key) {
  const int pos = int(p.key_len) - int(p.q_len) + int(qrow);
  return p.window != 0 && (int(key) > pos || int(key) + int(p.window) <= pos);
}

// A row's (max, sum) with its head's sink taken in (a key of logit `sink`
// and value 0), and the factor its unnormalised output takes for that max.
struct SinkTaken {
  float sum, rescale;
};
inline SinkTaken take_sink(constant AttentionParams& p, device const float* sinks, uint head, float m, float sum) {
  if (!p.sinks) return {sum, 1.0f};
  const float sink = sinks[head], top = attention_max(m, sink), rescale = attention_term(m, top);
  return {sum * rescale + attention_term(sink, top), rescale};
}

// The mask's value for a score: what is added to it (0 where the key is
// attended, -inf where a bool mask excludes it).
inline float mask_value(device const uchar* mask, constant AttentionParams& p, ulong offset) {
  switch (p.mask) {
    case mps_ext::kAttentionMaskBool: return mask[offset] ? 0.0f : -INFINITY;
    case mps_ext::kAttentionMaskFloat: return reinterpret_cast<device const float*>(mask)[offset];
    case mps_ext::kAttentionMaskHalf: return float(reinterpret_cast<device const half*>(mask)[offset]);
    case mps_ext::kAttentionMaskBfloat: return float(reinterpret_cast<device const bfloat*>(mask)[offset]);
    default: return 0.0f;
  }
}

// Gemma-2's logit softcapping of a scaled score, where the call has one.
inline float capped(constant AttentionParams& p, float score) {
  return p.softcap > 0.0f ? p.softcap * tanh(score / p.softcap) : score;
}

// The capped score's derivative in the scaled one, 1 - tanh^2 (1 without a
// cap), at the product of a query and a key row.
inline float cap_slope(constant AttentionParams& p, float dot) {
  if (p.softcap <= 0.0f) return 1.0f;
  const float t = tanh(dot * p.scale / p.softcap);
  return 1.0f - t * t;
}

// grid: (splits, blocks of R rows, batch x KV heads); threadgroups of whole
// SIMD groups. `mask` is bound to q when there is none (never read).
template <typename T, uint E, uint R>
kernel void attention_decode(device const T* q [[buffer(0)]], device const T* k [[buffer(1)]],
                             device const T* v [[buffer(2)]], device const uchar* mask [[buffer(3)]],
                             device T* out [[buffer(4)]], device float* partial_out [[buffer(5)]],
                             device float2* partial_stats [[buffer(6)]], constant AttentionParams& p [[buffer(7)]],
                             device const float* sinks [[buffer(8)]], uint3 group [[threadgroup_position_in_grid]],
                             uint lane [[thread_index_in_simdgroup]],
                             uint sg [[simdgroup_index_in_threadgroup]],
                             uint simdgroups [[simdgroups_per_threadgroup]]) {
  // One row per (SIMD group, row) pair for the merge; the output slices of a row.
  threadgroup float stats[32 * R * 2];
  threadgroup float merged[R * 32 * E];

  const uint split = group.x, batch = group.z / p.kv_heads, kv_head = group.z % p.kv_heads;
  const uint rows = p.group * p.q_len, first_row = group.y * R;
  const uint key_begin = p.key_first + split * p.keys_per_split,
             key_end = min(key_begin + p.keys_per_split, p.key_len);
  const bool vec_q = p.vectorized & mps_ext::kAttentionVecQ, vec_k = p.vectorized & mps_ext::kAttentionVecK,
             vec_v = p.vectorized & mps_ext::kAttentionVecV;

  // Rows past the last repeat it (every lane computes, only real rows are written).
  uint head[R], qrow[R];
  float qv[R][E], acc[R][E], m[R], s[R];
  MPS_EXT_UNROLL
  for (uint r = 0; r < R; ++r) {
    const uint row = min(first_row + r, rows - 1);
    head[r] = kv_head * p.group + row / p.q_len;
    qrow[r] = row % p.q_len;
    load_slice<T, E>(q + batch * p.q_stride[0] + head[r] * p.q_stride[1] + qrow[r] * p.q_stride[2], lane, p.qk_dim,
                     vec_q, qv[r]);
    m[r] = -INFINITY;
    s[r] = 0.0f;
    MPS_EXT_UNROLL
    for (uint e = 0; e < E; ++e) acc[r][e] = 0.0f;
  }

  device const T* k_head = k + batch * p.k_stride[0] + kv_head * p.k_stride[1];
  device const T* v_head = v + batch * p.v_stride[0] + kv_head * p.v_stride[1];
  const ulong mask_base = batch * p.mask_stride[0];
  for (uint key = key_begin + sg; key < key_end; key += simdgroups) {
    float kv[E];
    load_slice<T, E>(k_head + key * p.k_stride[2], lane, p.qk_dim, vec_k, kv);
    float score[R];
    MPS_EXT_UNROLL
    for (uint r = 0; r < R; ++r) {
      float dot = 0.0f;
      MPS_EXT_UNROLL
      for (uint e = 0; e < E; ++e) dot = fma(qv[r][e], kv[e], dot);
      score[r] = capped(p, simd_sum(dot) * p.scale);
      if (p.mask != mps_ext::kAttentionMaskNone)
        score[r] += mask_value(mask, p, mask_base + head[r] * p.mask_stride[1] + qrow[r] * p.mask_stride[2] +
                                            key * p.mask_stride[3]);
      if ((p.causal && key > qrow[r]) || outside_window(p, qrow[r], key)) score[r] = -INFINITY;
    }
    load_slice<T, E>(v_head + key * p.v_stride[2], lane, p.v_dim, vec_v, kv);
    MPS_EXT_UNROLL
    for (uint r = 0; r < R; ++r) {
      if (score[r] == -INFINITY) continue;  // contributes exactly 0
      const float next = attention_max(m[r], score[r]);
      const float rescale = attention_term(m[r], next), weight = attention_term(score[r], next);
      s[r] = s[r] * rescale + weight;
      MPS_EXT_UNROLL
      for (uint e = 0; e < E; ++e) acc[r][e] = acc[r][e] * rescale + weight * kv[e];
      m[r] = next;
    }
  }

  // Merge the SIMD groups: the row's maximum over them, then their rescaled
  // sums and outputs, added one SIMD group at a time.
  if (lane == 0) {
    MPS_EXT_UNROLL
    for (uint r = 0; r < R; ++r) {
      stats[(sg * R + r) * 2] = m[r];
      stats[(sg * R + r) * 2 + 1] = s[r];
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float row_max[R], row_sum[R];
  MPS_EXT_UNROLL
  for (uint r = 0; r < R; ++r) {
    row_max[r] = -INFINITY;
    for (uint g = 0; g < simdgroups; ++g) row_max[r] = attention_max(row_max[r], stats[(g * R + r) * 2]);
    row_sum[r] = 0.0f;
    for (uint g = 0; g < simdgroups; ++g)
      row_sum[r] += stats[(g * R + r) * 2 + 1] * attention_term(stats[(g * R + r) * 2], row_max[r]);
  }
  for (uint g = 0; g < simdgroups; ++g) {
    if (sg == g) {
      MPS_EXT_UNROLL
      for (uint r = 0; r < R; ++r) {
        const float rescale = attention_term(m[r], row_max[r]);
        MPS_EXT_UNROLL
        for (uint e = 0; e < E; ++e) {
          const uint i = (r * 32 + lane) * E + e;
          merged[i] = (g == 0 ? 0.0f : merged[i]) + acc[r][e] * rescale;
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }

  // Threads of the threadgroup share the writes: element d of row r.
  const uint threads = simdgroups * 32, tid = sg * 32 + lane;
  for (uint i = tid; i < R * p.v_dim; i += threads) {
    const uint r = i / p.v_dim, d = i % p.v_dim;
    if (first_row + r >= rows) break;
    const float value = merged[(r * 32 + d / E) * E + d % E];
    const ulong out_row = (ulong(batch) * p.kv_heads * p.group + head[r]) * p.q_len + qrow[r];
    if (p.splits == 1) {
      const SinkTaken t = take_sink(p, sinks, head[r], row_max[r], row_sum[r]);
      out[out_row * p.v_dim + d] = T(t.sum == 0.0f ? 0.0f : value * t.rescale / t.sum);
    } else {
      partial_out[(out_row * p.splits + split) * p.v_dim + d] = value;
      if (d == 0) partial_stats[out_row * p.splits + split] = float2(row_max[r], row_sum[r]);
    }
  }
}

// The largest of a value over the SIMD group's lanes (no lane's value is NaN:
// the runs' maxima never take a NaN score).
inline float simd_max_of(float v) {
  MPS_EXT_UNROLL
  for (ushort offset = 16; offset > 0; offset /= 2) v = attention_max(v, simd_shuffle_xor(v, offset));
  return v;
}

// grid: one threadgroup of kAttentionMergeSimdGroups SIMD groups per output
// row. SIMD group g combines runs g, g + G, ... (lane l elements [l E, l E +
// E) of each), so that no lane walks every run in turn; the groups' sums are
// then added through threadgroup memory, in a fixed order.
template <typename T, uint E>
kernel void attention_merge(device const float* partial_out [[buffer(0)]],
                            device const float2* partial_stats [[buffer(1)]], device T* out [[buffer(2)]],
                            constant AttentionParams& p [[buffer(3)]], device const float* sinks [[buffer(4)]],
                            uint row [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]],
                            uint sg [[simdgroup_index_in_threadgroup]],
                            uint simdgroups [[simdgroups_per_threadgroup]]) {
  constexpr uint G = mps_ext::kAttentionMergeSimdGroups;
  threadgroup float group_acc[G * 32 * E];
  threadgroup float group_sum[G];
  device const float2* stats = partial_stats + ulong(row) * p.splits;
  float m = -INFINITY;
  for (uint j = lane; j < p.splits; j += 32) m = attention_max(m, stats[j].x);
  const float row_max = simd_max_of(m);
  float row_sum = 0.0f, acc[E];
  MPS_EXT_UNROLL
  for (uint e = 0; e < E; ++e) acc[e] = 0.0f;
  const uint first = lane * E;
  for (uint j = sg; j < p.splits; j += simdgroups) {
    const float rescale = attention_term(stats[j].x, row_max);
    row_sum += stats[j].y * rescale;
    device const float* part = partial_out + (ulong(row) * p.splits + j) * p.v_dim;
    MPS_EXT_UNROLL
    for (uint e = 0; e < E; ++e)
      if (first + e < p.v_dim) acc[e] += part[first + e] * rescale;
  }
  MPS_EXT_UNROLL
  for (uint e = 0; e < E; ++e) group_acc[(sg * 32 + lane) * E + e] = acc[e];
  if (lane == 0) group_sum[sg] = row_sum;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg != 0) return;
  row_sum = 0.0f;
  for (uint g = 0; g < simdgroups; ++g) row_sum += group_sum[g];
  const SinkTaken t = take_sink(p, sinks, (row / p.q_len) % (p.kv_heads * p.group), row_max, row_sum);
  MPS_EXT_UNROLL
  for (uint e = 0; e < E; ++e) {
    float sum = 0.0f;
    for (uint g = 0; g < simdgroups; ++g) sum += group_acc[(g * 32 + lane) * E + e];
    if (first + e < p.v_dim) out[ulong(row) * p.v_dim + first + e] = T(t.sum == 0.0f ? 0.0f : sum * t.rescale / t.sum);
  }
}

// Prefill: query blocks of kPrefillRows rows per (batch, query head), flash
// style. Each SIMD group owns 8 of the block's rows as 8x8 matrices of q and
// of the output (head dims padded with zeros to D); the threadgroup walks the
// keys BK at a time through one tile of threadgroup memory, first K^T (for
// S = q k^T), then V (for out += P V). The online softmax runs on the scores
// staged in threadgroup memory, lane l on row l / 4 of its SIMD group's 8:
// the same row that elements 2l and 2l + 1 of a row-major 8x8 tile belong
// to, which is how the output is rescaled and written (through memory, not
// through the matrices' lane layout, which no code here depends on). Causal
// blocks stop at their last row's keys.
constant constexpr uint kPrefillSimdGroups = mps_ext::kAttentionPrefillRows / 8;

// A row-major 8x8 tile of `m` scaled by `by`, lane l's factor applying to
// elements 2l and 2l + 1 (row l / 4).
inline void scale_rows(thread simdgroup_float8x8& m, float by, threadgroup float* stage, uint lane) {
  simdgroup_store(m, stage);
  simdgroup_barrier(mem_flags::mem_threadgroup);
  stage[2 * lane] *= by;
  stage[2 * lane + 1] *= by;
  simdgroup_barrier(mem_flags::mem_threadgroup);
  simdgroup_load(m, stage);
  simdgroup_barrier(mem_flags::mem_threadgroup);
}

// Rows [first, first + rows) of a head's matrix (row stride `stride`, `dim`
// valid columns, rows below `limit` valid) as a tile of rows x D floats,
// zeros outside; transposed, as D x rows. Every thread of the threadgroup
// calls it.
template <typename T, uint D>
inline void load_tile(threadgroup float* tile, device const T* head, ulong stride, uint first, uint rows, uint limit,
                      uint dim, bool transposed, uint tid, uint threads) {
  for (uint i = tid; i < rows * D; i += threads) {
    const uint r = i / D, d = i % D;
    tile[transposed ? d * rows + r : i] =
        first + r < limit && d < dim ? float(head[ulong(first + r) * stride + d]) : 0.0f;
  }
}

// Rows [first, first + 8) of a head's matrix as D / 8 matrices of 8x8,
// zeros outside, through the SIMD group's stage.
template <typename T, uint D>
inline void load_rows(thread simdgroup_float8x8* m, device const T* head, ulong stride, uint first, uint limit,
                      uint dim, threadgroup float* stage, uint lane) {
  MPS_EXT_UNROLL
  for (uint b = 0; b < D / 8; ++b) {
    MPS_EXT_UNROLL
    for (uint e = 0; e < 2; ++e) {
      const uint i = 2 * lane + e, r = first + i / 8, d = b * 8 + i % 8;
      stage[i] = r < limit && d < dim ? float(head[ulong(r) * stride + d]) : 0.0f;
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_load(m[b], stage);
    simdgroup_barrier(mem_flags::mem_threadgroup);
  }
}

// The 8 rows of `m` (D / 8 matrices), times lane l's factor (row l / 4), as
// rows [first, first + 8) of a contiguous matrix of `dim` columns, those
// below `limit`.
template <typename T, uint D>
inline void store_rows(thread const simdgroup_float8x8* m, float by, device T* head, uint first, uint limit, uint dim,
                       threadgroup float* stage, uint lane) {
  const uint row = first + lane / 4;
  MPS_EXT_UNROLL
  for (uint b = 0; b < D / 8; ++b) {
    simdgroup_store(m[b], stage);
    simdgroup_barrier(mem_flags::mem_threadgroup);
    MPS_EXT_UNROLL
    for (uint e = 0; e < 2; ++e) {
      const uint d = b * 8 + (2 * lane + e) % 8;
      if (row < limit && d < dim) head[ulong(row) * dim + d] = T(stage[2 * lane + e] * by);
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
  }
}

// out (8 x N, row stride N) = a (8 x D, as D / 8 matrices) times b (D x N in
// threadgroup memory, row stride N).
template <uint D, uint N>
inline void rows_times_tile(thread const simdgroup_float8x8* a, threadgroup const float* b, threadgroup float* out) {
  MPS_EXT_UNROLL
  for (uint c = 0; c < N / 8; ++c) {
    simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f), bm;
    MPS_EXT_UNROLL
    for (uint i = 0; i < D / 8; ++i) {
      simdgroup_load(bm, b + i * 8 * N + c * 8, N);
      simdgroup_multiply_accumulate(acc, a[i], bm, acc);
    }
    simdgroup_store(acc, out + c * 8, N);
  }
}

// acc (8 x D, as D / 8 matrices) += a (8 x N, row stride N) times b (N x D in
// threadgroup memory, row stride D).
template <uint D, uint N>
inline void accumulate_rows(thread simdgroup_float8x8* acc, threadgroup const float* a, threadgroup const float* b) {
  MPS_EXT_UNROLL
  for (uint c = 0; c < N / 8; ++c) {
    simdgroup_float8x8 am, bm;
    simdgroup_load(am, a + c * 8, N);
    MPS_EXT_UNROLL
    for (uint i = 0; i < D / 8; ++i) {
      simdgroup_load(bm, b + c * 8 * D + i * 8, D);
      simdgroup_multiply_accumulate(acc[i], am, bm, acc[i]);
    }
  }
}

// A score as softmax takes it: q.k times the scale plus the mask's value, or
// -inf for a key past `key_end`, causally later or outside the window.
inline float attention_score(constant AttentionParams& p, device const uchar* mask, ulong mask_row, uint row, uint key,
                             uint key_end, float dot) {
  if (key >= key_end || (p.causal && key > row) || outside_window(p, row, key)) return -INFINITY;
  float score = capped(p, dot * p.scale);
  if (p.mask != mps_ext::kAttentionMaskNone && row < p.q_len)
    score += mask_value(mask, p, mask_row + key * p.mask_stride[3]);
  return score;
}

// The keys [begin, end) some row of the block [block_row, block_row + rows)
// attends: causal stops at the last row, a window at the last row's position
// and starts at the first row's window.
inline uint2 block_keys(constant AttentionParams& p, uint block_row, uint rows) {
  uint begin = 0, end = p.causal ? min(p.key_len, block_row + rows) : p.key_len;
  if (p.window) {
    const int first_pos = int(p.key_len) - int(p.q_len) + int(block_row);
    begin = uint(max(first_pos - int(p.window) + 1, 0));
    end = uint(clamp(first_pos + int(rows), 0, int(end)));
  }
  return uint2(begin, end);
}

// The row of the output (and of the training statistics) of query row 0 of
// a (batch, query head).
inline ulong first_out_row(constant AttentionParams& p, uint batch, uint head) {
  return (ulong(batch) * p.kv_heads * p.group + head) * p.q_len;
}

// grid: (blocks of kAttentionPrefillRows query rows, query heads, batch);
// kPrefillSimdGroups SIMD groups. With p.lse, also each row's log-sum-exp
// (sinks included; -inf where the row attends nothing) into stats[row].x.
template <typename T, uint D>
kernel void attention_prefill(device const T* q [[buffer(0)]], device const T* k [[buffer(1)]],
                              device const T* v [[buffer(2)]], device const uchar* mask [[buffer(3)]],
                              device T* out [[buffer(4)]], constant AttentionParams& p [[buffer(5)]],
                              device const float* sinks [[buffer(6)]], device float2* stats [[buffer(7)]],
                              uint3 group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                              uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
  // Keys per tile: K^T or V of BK keys in 16 KiB of floats.
  constexpr uint BK = D <= 128 ? 32 : 16;
  threadgroup float tile[BK * D];
  threadgroup float scores[kPrefillSimdGroups][8 * BK];
  threadgroup float stages[kPrefillSimdGroups][64];
  constexpr uint B = D / 8, per_lane = BK / 4, threads = kPrefillSimdGroups * 32;
  threadgroup float* const s_tile = scores[sg];
  threadgroup float* const stage = stages[sg];

  const uint batch = group.z, head = group.y, kv_head = head / p.group;
  const uint block_row = group.x * mps_ext::kAttentionPrefillRows, first_row = block_row + sg * 8;
  const uint row = first_row + lane / 4, first_col = (lane % 4) * per_lane;
  const uint2 keys = block_keys(p, block_row, mps_ext::kAttentionPrefillRows);

  device const T* q_head = q + batch * p.q_stride[0] + head * p.q_stride[1];
  device const T* k_head = k + batch * p.k_stride[0] + kv_head * p.k_stride[1];
  device const T* v_head = v + batch * p.v_stride[0] + kv_head * p.v_stride[1];
  const ulong mask_row = batch * p.mask_stride[0] + head * p.mask_stride[1] + ulong(row) * p.mask_stride[2];

  simdgroup_float8x8 qm[B], om[B];
  load_rows<T, D>(qm, q_head, p.q_stride[2], first_row, p.q_len, p.qk_dim, stage, lane);
  MPS_EXT_UNROLL
  for (uint b = 0; b < B; ++b) om[b] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);

  float m = -INFINITY, l = 0.0f;  // row `row`'s running maximum and sum
  for (uint k0 = keys.x; k0 < keys.y; k0 += BK) {
    load_tile<T, D>(tile, k_head, p.k_stride[2], k0, BK, keys.y, p.qk_dim, true, tid, threads);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    rows_times_tile<D, BK>(qm, tile, s_tile);
    threadgroup_barrier(mem_flags::mem_threadgroup);  // every SIMD group done with K^T
    load_tile<T, D>(tile, v_head, p.v_stride[2], k0, BK, keys.y, p.v_dim, false, tid, threads);

    // The online softmax of this lane's scores; P replaces them in s_tile.
    float x[per_lane], tile_max = -INFINITY;
    MPS_EXT_UNROLL
    for (uint j = 0; j < per_lane; ++j) {
      const uint key = k0 + first_col + j;
      x[j] = attention_score(p, mask, mask_row, row, key, keys.y, s_tile[(lane / 4) * BK + first_col + j]);
      tile_max = attention_max(tile_max, x[j]);
    }
    tile_max = attention_max(tile_max, simd_shuffle_xor(tile_max, 1));
    tile_max = attention_max(tile_max, simd_shuffle_xor(tile_max, 2));
    const float next = attention_max(m, tile_max), rescale = attention_term(m, next);
    float sum = 0.0f;
    MPS_EXT_UNROLL
    for (uint j = 0; j < per_lane; ++j) {
      const float weight = attention_term(x[j], next);
      s_tile[(lane / 4) * BK + first_col + j] = weight;
      sum += weight;
    }
    sum += simd_shuffle_xor(sum, 1);
    sum += simd_shuffle_xor(sum, 2);
    l = l * rescale + sum;
    m = next;
    if (!simd_all(rescale == 1.0f)) {
      MPS_EXT_UNROLL
      for (uint b = 0; b < B; ++b) scale_rows(om[b], rescale, stage, lane);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // V and every P in place
    accumulate_rows<D, BK>(om, s_tile, tile);
    threadgroup_barrier(mem_flags::mem_threadgroup);  // every SIMD group done with V
  }

  // torch gives a row that attends no key 0.
  const SinkTaken t = take_sink(p, sinks, head, m, l);
  const ulong out_row = first_out_row(p, batch, head);
  store_rows<T, D>(om, t.sum == 0.0f ? 0.0f : t.rescale / t.sum, out + out_row * p.v_dim, first_row, p.q_len,
                   p.v_dim, stage, lane);
  if (p.lse && lane % 4 == 0 && row < p.q_len) {
    const float top = p.sinks ? attention_max(m, sinks[head]) : m;
    stats[out_row + row].x = t.sum == 0.0f ? -INFINITY : top + log(t.sum);
  }
}

// Training: the gradients of attention_prefill's output, recomputing each
// tile's probabilities from the forward's log-sum-exp (stats[row].x) and
// delta_i = dout_i . out_i (stats[row].y), flash-attention style:
// dS = P (dP - delta) with dP = dout v^T; dq = dS k scale, dk = dS^T q scale,
// dv = P^T dout. dout, stats and the gradients are contiguous in the output's
// row order (dq, dk and dv with their own head dims). Head dims up to 128.
constant constexpr uint kBackwardTile = 32;

// grid: (blocks of kAttentionPrefillRows query rows, query heads, batch):
// dq of the block's rows over every key they attend.
template <typename T, uint D>
kernel void attention_backward_dq(device const T* q [[buffer(0)]], device const T* k [[buffer(1)]],
                                  device const T* v [[buffer(2)]], device const uchar* mask [[buffer(3)]],
                                  device const T* dout [[buffer(4)]], device const float2* stats [[buffer(5)]],
                                  device T* dq [[buffer(6)]], constant AttentionParams& p [[buffer(7)]],
                                  uint3 group [[threadgroup_position_in_grid]],
                                  uint tid [[thread_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                                  uint sg [[simdgroup_index_in_threadgroup]]) {
  constexpr uint BK = kBackwardTile;
  threadgroup float tile[BK * D];
  threadgroup float scores[kPrefillSimdGroups][8 * BK];
  threadgroup float grads[kPrefillSimdGroups][8 * BK];
  threadgroup float stages[kPrefillSimdGroups][64];
  constexpr uint B = D / 8, per_lane = BK / 4, threads = kPrefillSimdGroups * 32;
  threadgroup float* const s_tile = scores[sg];
  threadgroup float* const g_tile = grads[sg];
  threadgroup float* const stage = stages[sg];

  const uint batch = group.z, head = group.y, kv_head = head / p.group;
  const uint block_row = group.x * mps_ext::kAttentionPrefillRows, first_row = block_row + sg * 8;
  const uint row = first_row + lane / 4, first_col = (lane % 4) * per_lane;
  const uint2 keys = block_keys(p, block_row, mps_ext::kAttentionPrefillRows);
  const ulong out_row = first_out_row(p, batch, head);

  device const T* k_head = k + batch * p.k_stride[0] + kv_head * p.k_stride[1];
  device const T* v_head = v + batch * p.v_stride[0] + kv_head * p.v_stride[1];
  const ulong mask_row = batch * p.mask_stride[0] + head * p.mask_stride[1] + ulong(row) * p.mask_stride[2];
  const float2 st = row < p.q_len ? stats[out_row + row] : float2(-INFINITY, 0.0f);

  simdgroup_float8x8 qm[B], dom[B], dqm[B];
  load_rows<T, D>(qm, q + batch * p.q_stride[0] + head * p.q_stride[1], p.q_stride[2], first_row, p.q_len, p.qk_dim,
                  stage, lane);
  load_rows<T, D>(dom, dout + out_row * p.v_dim, p.v_dim, first_row, p.q_len, p.v_dim, stage, lane);
  MPS_EXT_UNROLL
  for (uint b = 0; b < B; ++b) dqm[b] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);

  for (uint k0 = keys.x; k0 < keys.y; k0 += BK) {
    load_tile<T, D>(tile, k_head, p.k_stride[2], k0, BK, keys.y, p.qk_dim, true, tid, threads);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    rows_times_tile<D, BK>(qm, tile, s_tile);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    load_tile<T, D>(tile, v_head, p.v_stride[2], k0, BK, keys.y, p.v_dim, true, tid, threads);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    rows_times_tile<D, BK>(dom, tile, g_tile);
    threadgroup_barrier(mem_flags::mem_threadgroup);  // every SIMD group done with V^T
    MPS_EXT_UNROLL
    for (uint j = 0; j < per_lane; ++j) {
      const uint i = (lane / 4) * BK + first_col + j;
      const float dot = s_tile[i];
      const float weight = attention_term(attention_score(p, mask, mask_row, row, k0 + first_col + j, keys.y, dot),
                                          st.x);
      s_tile[i] = weight * (g_tile[i] - st.y) * cap_slope(p, dot);
    }
    load_tile<T, D>(tile, k_head, p.k_stride[2], k0, BK, keys.y, p.qk_dim, false, tid, threads);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    accumulate_rows<D, BK>(dqm, s_tile, tile);
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  store_rows<T, D>(dqm, p.scale, dq + out_row * p.qk_dim, first_row, p.q_len, p.qk_dim, stage, lane);
}

// grid: (blocks of kBackwardTile keys, KV heads, batch): dk and dv of the
// block's keys over every row of every query head of the KV head (GQA's sum
// over the group) that attends them. Each SIMD group owns 8 keys.
template <typename T, uint D>
kernel void attention_backward_dkv(device const T* q [[buffer(0)]], device const T* k [[buffer(1)]],
                                   device const T* v [[buffer(2)]], device const uchar* mask [[buffer(3)]],
                                   device const T* dout [[buffer(4)]], device const float2* stats [[buffer(5)]],
                                   device T* dk [[buffer(6)]], device T* dv [[buffer(7)]],
                                   constant AttentionParams& p [[buffer(8)]], uint3 group [[threadgroup_position_in_grid]],
                                   uint tid [[thread_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                                   uint sg [[simdgroup_index_in_threadgroup]]) {
  constexpr uint BQ = kBackwardTile;
  threadgroup float tile[BQ * D];
  threadgroup float probs[kPrefillSimdGroups][8 * BQ];
  threadgroup float grads[kPrefillSimdGroups][8 * BQ];
  threadgroup float2 row_stats[BQ];
  threadgroup float stages[kPrefillSimdGroups][64];
  constexpr uint B = D / 8, per_lane = BQ / 4, threads = kPrefillSimdGroups * 32;
  threadgroup float* const p_tile = probs[sg];
  threadgroup float* const g_tile = grads[sg];
  threadgroup float* const stage = stages[sg];

  const uint batch = group.z, kv_head = group.y;
  const uint key_block = group.x * BQ, first_key = key_block + sg * 8;
  const uint key = first_key + lane / 4, first_col = (lane % 4) * per_lane;
  device const T* k_head = k + batch * p.k_stride[0] + kv_head * p.k_stride[1];
  device const T* v_head = v + batch * p.v_stride[0] + kv_head * p.v_stride[1];

  simdgroup_float8x8 km[B], vm[B], dkm[B], dvm[B];
  load_rows<T, D>(km, k_head, p.k_stride[2], first_key, p.key_len, p.qk_dim, stage, lane);
  load_rows<T, D>(vm, v_head, p.v_stride[2], first_key, p.key_len, p.v_dim, stage, lane);
  MPS_EXT_UNROLL
  for (uint b = 0; b < B; ++b) {
    dkm[b] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    dvm[b] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  }

  // The rows that can attend the block: causal from its first key on, a
  // window from the row at its first key to the last row it reaches.
  const int offset = int(p.key_len) - int(p.q_len);
  int row_begin = p.causal ? int(key_block) : 0, row_end = int(p.q_len);
  if (p.window) {
    row_begin = max(row_begin, int(key_block) - offset);
    row_end = min(row_end, int(key_block + BQ) + int(p.window) - 1 - offset);
  }
  for (uint g = 0; g < p.group; ++g) {
    const uint head = kv_head * p.group + g;
    const ulong out_row = first_out_row(p, batch, head);
    device const T* q_head = q + batch * p.q_stride[0] + head * p.q_stride[1];
    device const T* dout_head = dout + out_row * p.v_dim;
    const ulong mask_head = batch * p.mask_stride[0] + head * p.mask_stride[1];
    for (int r0 = max(row_begin, 0); r0 < row_end; r0 += BQ) {
      const uint q0 = uint(r0);
      if (tid < BQ) row_stats[tid] = q0 + tid < p.q_len ? stats[out_row + q0 + tid] : float2(-INFINITY, 0.0f);
      load_tile<T, D>(tile, q_head, p.q_stride[2], q0, BQ, p.q_len, p.qk_dim, true, tid, threads);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      rows_times_tile<D, BQ>(km, tile, p_tile);  // S^T: this SIMD group's keys by the tile's rows
      threadgroup_barrier(mem_flags::mem_threadgroup);
      load_tile<T, D>(tile, dout_head, p.v_dim, q0, BQ, p.q_len, p.v_dim, true, tid, threads);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      rows_times_tile<D, BQ>(vm, tile, g_tile);  // dP^T
      threadgroup_barrier(mem_flags::mem_threadgroup);  // every SIMD group done with dout^T
      MPS_EXT_UNROLL
      for (uint j = 0; j < per_lane; ++j) {
        const uint i = (lane / 4) * BQ + first_col + j, row = q0 + first_col + j;
        const float2 st = row_stats[first_col + j];
        const float dot = p_tile[i];
        const float score = attention_score(p, mask, mask_head + ulong(row) * p.mask_stride[2], row, key, p.key_len,
                                            dot);
        const float weight = row < p.q_len ? attention_term(score, st.x) : 0.0f;
        p_tile[i] = weight;
        g_tile[i] = weight * (g_tile[i] - st.y) * cap_slope(p, dot);
      }
      load_tile<T, D>(tile, dout_head, p.v_dim, q0, BQ, p.q_len, p.v_dim, false, tid, threads);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      accumulate_rows<D, BQ>(dvm, p_tile, tile);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      load_tile<T, D>(tile, q_head, p.q_stride[2], q0, BQ, p.q_len, p.qk_dim, false, tid, threads);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      accumulate_rows<D, BQ>(dkm, g_tile, tile);
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
  }
  const ulong kv_row = (ulong(batch) * p.kv_heads + kv_head) * p.key_len;
  store_rows<T, D>(dkm, p.scale, dk + kv_row * p.qk_dim, first_key, p.key_len, p.qk_dim, stage, lane);
  store_rows<T, D>(dvm, 1.0f, dv + kv_row * p.v_dim, first_key, p.key_len, p.v_dim, stage, lane);
}

// Host names: attention_decode_<type>_e<E>_r<R>, attention_merge_<type>_e<E>,
// attention_prefill_<type>_d<D>, attention_backward_{dq,dkv}_<type>_d<D>
// (csrc/ops/attention.cpp builds the same).
#define MPS_EXT_ATTENTION_DECODE(T, E, R)                                                          \
  template [[host_name("attention_decode_" #T "_e" #E "_r" #R)]] [[kernel]] decltype(            \
      attention_decode<T, E, R>) attention_decode<T, E, R>;

#define MPS_EXT_ATTENTION(T, E)                                                                    \
  MPS_EXT_ATTENTION_DECODE(T, E, 1)                                                                \
  MPS_EXT_ATTENTION_DECODE(T, E, 2)                                                                \
  MPS_EXT_ATTENTION_DECODE(T, E, 4)                                                                \
  MPS_EXT_ATTENTION_DECODE(T, E, 8)                                                                \
  template [[host_name("attention_merge_" #T "_e" #E)]] [[kernel]] decltype(attention_merge<T, E>) \
      attention_merge<T, E>;

#define MPS_EXT_ATTENTION_PREFILL(T, D)                                                                  \
  template [[host_name("attention_prefill_" #T "_d" #D)]] [[kernel]] decltype(attention_prefill<T, D>)     \
      attention_prefill<T, D>;

#define MPS_EXT_ATTENTION_BACKWARD(T, D)                                                                 \
  MPS_EXT_ATTENTION_PREFILL(T, D)                                                                        \
  template [[host_name("attention_backward_dq_" #T "_d" #D)]] [[kernel]] decltype(                       \
      attention_backward_dq<T, D>) attention_backward_dq<T, D>;                                          \
  template [[host_name("attention_backward_dkv_" #T "_d" #D)]] [[kernel]] decltype(                      \
      attention_backward_dkv<T, D>) attention_backward_dkv<T, D>;

#define MPS_EXT_ATTENTION_TYPE(T)    \
  MPS_EXT_ATTENTION(T, 2)            \
  MPS_EXT_ATTENTION(T, 4)            \
  MPS_EXT_ATTENTION(T, 6)            \
  MPS_EXT_ATTENTION(T, 8)            \
  MPS_EXT_ATTENTION_BACKWARD(T, 32)  \
  MPS_EXT_ATTENTION_BACKWARD(T, 64)  \
  MPS_EXT_ATTENTION_BACKWARD(T, 96)  \
  MPS_EXT_ATTENTION_BACKWARD(T, 128) \
  MPS_EXT_ATTENTION_PREFILL(T, 160)  \
  MPS_EXT_ATTENTION_PREFILL(T, 192)  \
  MPS_EXT_ATTENTION_PREFILL(T, 256)

MPS_EXT_ATTENTION_TYPE(float)
MPS_EXT_ATTENTION_TYPE(half)
MPS_EXT_ATTENTION_TYPE(bfloat)
