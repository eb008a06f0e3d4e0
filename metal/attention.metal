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
// - attention_merge, which combines a row's runs as flash-decoding does.
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
      score[r] = simd_sum(dot) * p.scale;
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

// grid: one SIMD group per output row; lane l combines elements [l E, l E + E) of every run.
template <typename T, uint E>
kernel void attention_merge(device const float* partial_out [[buffer(0)]],
                            device const float2* partial_stats [[buffer(1)]], device T* out [[buffer(2)]],
                            constant AttentionParams& p [[buffer(3)]], device const float* sinks [[buffer(4)]],
                            uint row [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
  device const float2* stats = partial_stats + ulong(row) * p.splits;
  float row_max = -INFINITY;
  for (uint j = 0; j < p.splits; ++j) row_max = attention_max(row_max, stats[j].x);
  float row_sum = 0.0f, acc[E];
  MPS_EXT_UNROLL
  for (uint e = 0; e < E; ++e) acc[e] = 0.0f;
  const uint first = lane * E;
  for (uint j = 0; j < p.splits; ++j) {
    const float rescale = attention_term(stats[j].x, row_max);
    row_sum += stats[j].y * rescale;
    device const float* part = partial_out + (ulong(row) * p.splits + j) * p.v_dim;
    MPS_EXT_UNROLL
    for (uint e = 0; e < E; ++e)
      if (first + e < p.v_dim) acc[e] += part[first + e] * rescale;
  }
  const SinkTaken t = take_sink(p, sinks, (row / p.q_len) % (p.kv_heads * p.group), row_max, row_sum);
  MPS_EXT_UNROLL
  for (uint e = 0; e < E; ++e)
    if (first + e < p.v_dim)
      out[ulong(row) * p.v_dim + first + e] = T(t.sum == 0.0f ? 0.0f : acc[e] * t.rescale / t.sum);
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

// grid: (blocks of kAttentionPrefillRows query rows, query heads, batch);
// kPrefillSimdGroups SIMD groups.
template <typename T, uint D>
kernel void attention_prefill(device const T* q [[buffer(0)]], device const T* k [[buffer(1)]],
                              device const T* v [[buffer(2)]], device const uchar* mask [[buffer(3)]],
                              device T* out [[buffer(4)]], constant AttentionParams& p [[buffer(5)]],
                              device const float* sinks [[buffer(6)]], uint3 group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
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
  // The keys some row of the block attends: causal stops at the last row, a window at the last row's
  // position and starts at the first row's window.
  const uint block_end = block_row + mps_ext::kAttentionPrefillRows;
  uint key_begin = 0, key_end = p.causal ? min(p.key_len, block_end) : p.key_len;
  if (p.window) {
    const int first_pos = int(p.key_len) - int(p.q_len) + int(block_row);
    key_begin = uint(max(first_pos - int(p.window) + 1, 0));
    key_end = uint(clamp(first_pos + int(mps_ext::kAttentionPrefillRows), 0, int(key_end)));
  }

  device const T* q_head = q + batch * p.q_stride[0] + head * p.q_stride[1];
  device const T* k_head = k + batch * p.k_stride[0] + kv_head * p.k_stride[1];
  device const T* v_head = v + batch * p.v_stride[0] + kv_head * p.v_stride[1];
  const ulong mask_row = batch * p.mask_stride[0] + head * p.mask_stride[1] + ulong(row) * p.mask_stride[2];

  simdgroup_float8x8 qm[B], om[B];
  MPS_EXT_UNROLL
  for (uint b = 0; b < B; ++b) {
    MPS_EXT_UNROLL
    for (uint e = 0; e < 2; ++e) {
      const uint i = 2 * lane + e, r = first_row + i / 8, d = b * 8 + i % 8;
      stage[i] = r < p.q_len && d < p.qk_dim ? float(q_head[r * p.q_stride[2] + d]) : 0.0f;
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_load(qm[b], stage);
    simdgroup_barrier(mem_flags::mem_threadgroup);
    om[b] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  }

  float m = -INFINITY, l = 0.0f;  // row `row`'s running maximum and sum
  for (uint k0 = key_begin; k0 < key_end; k0 += BK) {
    for (uint i = tid; i < BK * D; i += threads) {
      const uint key = i / D, d = i % D;
      tile[d * BK + key] = k0 + key < key_end && d < p.qk_dim ? float(k_head[(k0 + key) * p.k_stride[2] + d]) : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    MPS_EXT_UNROLL
    for (uint c = 0; c < BK / 8; ++c) {
      simdgroup_float8x8 s = make_filled_simdgroup_matrix<float, 8, 8>(0.0f), kt;
      MPS_EXT_UNROLL
      for (uint b = 0; b < B; ++b) {
        simdgroup_load(kt, tile + b * 8 * BK + c * 8, BK);
        simdgroup_multiply_accumulate(s, qm[b], kt, s);
      }
      simdgroup_store(s, s_tile + c * 8, BK);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // every SIMD group done with K^T
    for (uint i = tid; i < BK * D; i += threads) {
      const uint key = i / D, d = i % D;
      tile[i] = k0 + key < key_end && d < p.v_dim ? float(v_head[(k0 + key) * p.v_stride[2] + d]) : 0.0f;
    }

    // The online softmax of this lane's scores; P replaces them in s_tile.
    float x[per_lane], tile_max = -INFINITY;
    MPS_EXT_UNROLL
    for (uint j = 0; j < per_lane; ++j) {
      const uint key = k0 + first_col + j;
      float score = s_tile[(lane / 4) * BK + first_col + j] * p.scale;
      if (key >= key_end || (p.causal && key > row) || outside_window(p, row, key)) {
        score = -INFINITY;
      } else if (p.mask != mps_ext::kAttentionMaskNone && row < p.q_len) {
        score += mask_value(mask, p, mask_row + key * p.mask_stride[3]);
      }
      x[j] = score;
      tile_max = attention_max(tile_max, score);
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

    MPS_EXT_UNROLL
    for (uint c = 0; c < BK / 8; ++c) {
      simdgroup_float8x8 pm, vm;
      simdgroup_load(pm, s_tile + c * 8, BK);
      MPS_EXT_UNROLL
      for (uint b = 0; b < B; ++b) {
        simdgroup_load(vm, tile + c * 8 * D + b * 8, D);
        simdgroup_multiply_accumulate(om[b], pm, vm, om[b]);
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // every SIMD group done with V
  }

  // torch gives a row that attends no key 0.
  const SinkTaken t = take_sink(p, sinks, head, m, l);
  const float inverse = t.sum == 0.0f ? 0.0f : t.rescale / t.sum;
  device T* out_head = out + (ulong(batch) * p.kv_heads * p.group + head) * p.q_len * p.v_dim;
  MPS_EXT_UNROLL
  for (uint b = 0; b < B; ++b) {
    simdgroup_store(om[b], stage);
    simdgroup_barrier(mem_flags::mem_threadgroup);
    MPS_EXT_UNROLL
    for (uint e = 0; e < 2; ++e) {
      const uint d = b * 8 + (2 * lane + e) % 8;
      if (row < p.q_len && d < p.v_dim) out_head[ulong(row) * p.v_dim + d] = T(stage[2 * lane + e] * inverse);
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
  }
}

// Host names: attention_decode_<type>_e<E>_r<R>, attention_merge_<type>_e<E>,
// attention_prefill_<type>_d<D> (csrc/ops/attention.cpp builds the same).
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

#define MPS_EXT_ATTENTION_PREFILL(T, D)                                                         \
  template [[host_name("attention_prefill_" #T "_d" #D)]] [[kernel]] decltype(attention_prefill<T, D>) \
      attention_prefill<T, D>;

#define MPS_EXT_ATTENTION_TYPE(T)   \
  MPS_EXT_ATTENTION(T, 2)           \
  MPS_EXT_ATTENTION(T, 4)           \
  MPS_EXT_ATTENTION(T, 6)           \
  MPS_EXT_ATTENTION(T, 8)           \
  MPS_EXT_ATTENTION_PREFILL(T, 32)  \
  MPS_EXT_ATTENTION_PREFILL(T, 64)  \
  MPS_EXT_ATTENTION_PREFILL(T, 96)  \
  MPS_EXT_ATTENTION_PREFILL(T, 128) \
  MPS_EXT_ATTENTION_PREFILL(T, 160) \
  MPS_EXT_ATTENTION_PREFILL(T, 192) \
  MPS_EXT_ATTENTION_PREFILL(T, 256)

MPS_EXT_ATTENTION_TYPE(float)
MPS_EXT_ATTENTION_TYPE(half)
MPS_EXT_ATTENTION_TYPE(bfloat)
