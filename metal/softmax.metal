// softmax and log_softmax over the last dimension (and a strided kernel for
// any other dimension).
//
// - simd: rows of up to 128 elements (MoE routers over their experts,
//   short attention rows): `width` lanes per row (the least power of two of
//   at least cols / 4: 32 for 65-128 elements, 16 for 33-64, ...), so a
//   SIMD group holds 32 / width rows and no lane idles on padding; eight
//   SIMD groups per threadgroup, SIMD-group shuffles only; values stay in
//   registers.
// - block: one threadgroup per row of up to 4096 elements; each thread keeps
//   its (at most) four elements in registers, so the input is read once and
//   the output written once.
// - partials + finalize: longer rows are split into chunks of 2048 elements,
//   one threadgroup each, so a single row spreads over the whole GPU. Pass 1
//   writes each chunk's (max, sum of exp); pass 2 combines a row's partials
//   and writes its chunk: two reads and one write per element.
// - strided: one thread per (outer, inner) column of a contiguous tensor
//   reduced over a middle dimension; neighbouring threads read neighbouring
//   addresses.
//
// Arithmetic is in float. Semantics follow torch's CPU kernels: an element
// equal to -inf contributes exactly 0 to the sum, so a row of -inf gives 0/0 =
// NaN; a NaN anywhere in a row makes the sum, and so the whole row, NaN.
#include <metal_stdlib>

#include "mps_ext/params.h"
#include "mps_ext/reduce.h"

using namespace metal;
using mps_ext::SoftmaxParams;

constant constexpr uint kPerThread = 4;          // block: elements per thread
constant constexpr uint kChunkPerThread = 8;     // split: elements per thread and chunk

inline float term(float x, float m) { return x == -INFINITY ? 0.0f : exp(x - m); }

// Loads up to four elements [first, first + 4) of a row; missing ones are -inf.
template <typename In>
inline float4 load4(device const In* row, uint first, uint cols, bool vectorized) {
  if (vectorized && first + 4 <= cols) return float4(*reinterpret_cast<device const vec<In, 4>*>(row + first));
  float4 v = float4(-INFINITY);
  for (uint k = 0; k < 4; ++k)
    if (first + k < cols) v[k] = float(row[first + k]);
  return v;
}

template <typename Out>
inline void store4(device Out* row, uint first, uint cols, bool vectorized, float4 v) {
  if (vectorized && first + 4 <= cols) {
    *reinterpret_cast<device vec<Out, 4>*>(row + first) = vec<Out, 4>(v);
    return;
  }
  for (uint k = 0; k < 4; ++k)
    if (first + k < cols) row[first + k] = Out(v[k]);
}

// The (max, sum of exp) of a chunk of values held by each thread, combined over the threadgroup.
inline float2 threadgroup_max_sum(float local_max, float local_sum, threadgroup float* scratch, uint sg, uint lane,
                                  uint simdgroups) {
  const float m = mps_ext::threadgroup_reduce<mps_ext::MaxOp>(local_max, scratch, sg, lane, simdgroups);
  const float rescaled = local_sum * (local_max == -INFINITY ? 0.0f : exp(local_max - m));
  return float2(m, mps_ext::threadgroup_reduce<mps_ext::SumOp>(rescaled, scratch, sg, lane, simdgroups));
}

// Reductions over the threads that share a row: `width` aligned lanes of a
// SIMD group (a power of two; butterflies, so every lane gets the result)...
struct SimdGroupReduce {
  uint width, lane;
  float maximum(float v) const {
    if (width == 32) return simd_max(v);
    for (uint o = width / 2; o > 0; o /= 2) v = max(v, simd_shuffle(v, ushort(lane ^ o)));
    return v;
  }
  float total(float v) const {
    if (width == 32) return simd_sum(v);
    for (uint o = width / 2; o > 0; o /= 2) v += simd_shuffle(v, ushort(lane ^ o));
    return v;
  }
};

// ... or a whole threadgroup.
struct ThreadgroupReduce {
  threadgroup float* scratch;
  uint sg, lane, simdgroups;
  float maximum(float v) const { return mps_ext::threadgroup_reduce<mps_ext::MaxOp>(v, scratch, sg, lane, simdgroups); }
  float total(float v) const { return mps_ext::threadgroup_reduce<mps_ext::SumOp>(v, scratch, sg, lane, simdgroups); }
};

// A row held in registers, four elements per thread starting at `first`.
// `store` false: the row is computed (its threads take part in the
// reductions) but not written.
template <typename Out, bool Log, typename In, typename Reduce>
inline void softmax_in_registers(device const In* in, device Out* out, uint cols, uint first, bool vectorized,
                                 Reduce reduce, bool store = true) {
  const float4 v = load4(in, first, cols, vectorized);
  const float m = reduce.maximum(max(max(v.x, v.y), max(v.z, v.w)));
  const float4 e = float4(term(v.x, m), term(v.y, m), term(v.z, m), term(v.w, m));
  const float sum = reduce.total(e.x + e.y + e.z + e.w);
  if (store) store4(out, first, cols, vectorized, Log ? v - m - log(sum) : e * (1.0f / sum));
}

// Launched with up to 1024 threads: without the attribute a pipeline may allow fewer.
template <typename In, typename Out, bool Log>
[[max_total_threads_per_threadgroup(1024)]] kernel void softmax_block(device const In* x [[buffer(0)]], device Out* y [[buffer(1)]],
                          constant SoftmaxParams& p [[buffer(2)]], uint row [[threadgroup_position_in_grid]],
                          uint tid [[thread_position_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                          uint sg [[simdgroup_index_in_threadgroup]],
                          uint simdgroups [[simdgroups_per_threadgroup]]) {
  threadgroup float scratch[32];
  const ulong base = ulong(row) * p.cols;
  softmax_in_registers<Out, Log>(x + base, y + base, p.cols, tid * kPerThread, p.vectorized != 0,
                                 ThreadgroupReduce{scratch, sg, lane, simdgroups});
}

template <typename In, typename Out, bool Log>
kernel void softmax_simd(device const In* x [[buffer(0)]], device Out* y [[buffer(1)]],
                         constant SoftmaxParams& p [[buffer(2)]], uint group [[threadgroup_position_in_grid]],
                         uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                         uint simdgroups [[simdgroups_per_threadgroup]]) {
  uint shift = 0;  // log2 of the lanes per row (shifts: a division by a variable costs more than the row)
  while ((kPerThread << shift) < p.cols) ++shift;
  const uint first_row = (group * simdgroups + sg) << (5 - shift);
  if (first_row >= p.rows) return;  // a whole SIMD group leaves: no SIMD-group function is split
  // Rows past the last are computed on the last row and not written, so every lane takes part in the shuffles.
  const uint row = first_row + (lane >> shift);
  const ulong base = ulong(min(row, p.rows - 1)) * p.cols;
  softmax_in_registers<Out, Log>(x + base, y + base, p.cols, (lane & ((1u << shift) - 1)) * kPerThread,
                                 p.vectorized != 0, SimdGroupReduce{1u << shift, lane}, row < p.rows);
}

// Pass 1 of long rows: the (max, sum of exp) of chunk `c` of each row.
template <typename In>
kernel void softmax_partials(device const In* x [[buffer(0)]], device float2* partials [[buffer(1)]],
                             constant SoftmaxParams& p [[buffer(2)]], uint2 group [[threadgroup_position_in_grid]],
                             uint2 local [[thread_position_in_threadgroup]], uint2 size [[threads_per_threadgroup]],
                             uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                             uint simdgroups [[simdgroups_per_threadgroup]]) {
  threadgroup float scratch[32];
  // Position attributes must all have the same number of components (MSL).
  const uint c = group.x, row = group.y, tid = local.x, threads = size.x;
  device const In* in = x + ulong(row) * p.cols;
  const uint start = c * p.chunk, end = min(start + p.chunk, p.cols);
  const bool vectorized = p.vectorized != 0;
  // Two 4-wide loads per thread, each sweep covering the chunk contiguously.
  float4 v[kChunkPerThread / 4];
  float local_max = -INFINITY;
  for (uint j = 0; j < kChunkPerThread / 4; ++j) {
    const uint first = start + (j * threads + tid) * 4;
    v[j] = first < end ? load4(in, first, end, vectorized) : float4(-INFINITY);
    local_max = max(local_max, max(max(v[j].x, v[j].y), max(v[j].z, v[j].w)));
  }
  float local_sum = 0.0f;
  for (uint j = 0; j < kChunkPerThread / 4; ++j)
    local_sum += term(v[j].x, local_max) + term(v[j].y, local_max) + term(v[j].z, local_max) + term(v[j].w, local_max);
  const float2 ms = threadgroup_max_sum(local_max, local_sum, scratch, sg, lane, simdgroups);
  if (tid == 0) partials[ulong(row) * p.chunks + c] = ms;
}

// Pass 2 of long rows: combine the row's partials, write chunk `c`.
template <typename In, typename Out, bool Log>
kernel void softmax_finalize(device const In* x [[buffer(0)]], device const float2* partials [[buffer(1)]],
                             device Out* y [[buffer(2)]], constant SoftmaxParams& p [[buffer(3)]],
                             uint2 group [[threadgroup_position_in_grid]],
                             uint2 local [[thread_position_in_threadgroup]], uint2 size [[threads_per_threadgroup]],
                             uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],
                             uint simdgroups [[simdgroups_per_threadgroup]]) {
  threadgroup float scratch[32];
  const uint c = group.x, row = group.y, tid = local.x, threads = size.x;
  device const float2* part = partials + ulong(row) * p.chunks;
  float local_max = -INFINITY;
  for (uint i = tid; i < p.chunks; i += threads) local_max = max(local_max, part[i].x);
  const float m = mps_ext::threadgroup_reduce<mps_ext::MaxOp>(local_max, scratch, sg, lane, simdgroups);
  float local_sum = 0.0f;
  for (uint i = tid; i < p.chunks; i += threads) local_sum += part[i].y * (part[i].x == -INFINITY ? 0.0f : exp(part[i].x - m));
  const float sum = mps_ext::threadgroup_reduce<mps_ext::SumOp>(local_sum, scratch, sg, lane, simdgroups);
  const float log_sum = log(sum), inv = 1.0f / sum;

  device const In* in = x + ulong(row) * p.cols;
  device Out* out = y + ulong(row) * p.cols;
  const uint start = c * p.chunk, end = min(start + p.chunk, p.cols);
  const bool vectorized = p.vectorized != 0;
  for (uint j = 0; j < kChunkPerThread / 4; ++j) {
    const uint first = start + (j * threads + tid) * 4;
    if (first >= end) break;
    const float4 v = load4(in, first, end, vectorized);
    const float4 r = Log ? v - m - log_sum : float4(term(v.x, m), term(v.y, m), term(v.z, m), term(v.w, m)) * inv;
    store4(out, first, end, vectorized, r);
  }
}

// Any other dimension of a contiguous tensor viewed as (outer, cols, inner):
// thread t handles column (t / inner, t % inner).
template <typename In, typename Out, bool Log>
kernel void softmax_strided(device const In* x [[buffer(0)]], device Out* y [[buffer(1)]],
                            constant SoftmaxParams& p [[buffer(2)]], uint t [[thread_position_in_grid]]) {
  if (t >= p.rows) return;
  const ulong outer = t / p.inner, inner = t % p.inner;
  device const In* in = x + outer * p.cols * p.inner + inner;
  device Out* out = y + outer * p.cols * p.inner + inner;
  // Online (max, sum): one pass to reduce, one to write.
  float m = -INFINITY, sum = 0.0f;
  for (uint d = 0; d < p.cols; ++d) {
    const float v = float(in[ulong(d) * p.inner]);
    if (v > m) {
      // The new maximum's own term is exp(v - v): 1, or NaN for +inf as in torch.
      sum = sum * (m == -INFINITY ? 0.0f : exp(m - v)) + term(v, v);
      m = v;
    } else {
      sum += term(v, m);
    }
  }
  const float log_sum = log(sum), inv = 1.0f / sum;
  for (uint d = 0; d < p.cols; ++d) {
    const float v = float(in[ulong(d) * p.inner]);
    out[ulong(d) * p.inner] = Out(Log ? v - m - log_sum : term(v, m) * inv);
  }
}

// Host names: <op>_<kernel>_<input type>[_<output type>], built by the host
// from the same parts (csrc/ops/softmax.cpp).
#define MPS_EXT_SOFTMAX_OUT(op, log, In, Out)                                                                  \
  template [[host_name(#op "_simd_" #In "_" #Out)]] [[kernel]] decltype(softmax_simd<In, Out, log>)           \
      softmax_simd<In, Out, log>;                                                                              \
  template [[host_name(#op "_block_" #In "_" #Out)]] [[kernel]] decltype(softmax_block<In, Out, log>)         \
      softmax_block<In, Out, log>;                                                                             \
  template [[host_name(#op "_finalize_" #In "_" #Out)]] [[kernel]] decltype(softmax_finalize<In, Out, log>)   \
      softmax_finalize<In, Out, log>;                                                                          \
  template [[host_name(#op "_strided_" #In "_" #Out)]] [[kernel]] decltype(softmax_strided<In, Out, log>)     \
      softmax_strided<In, Out, log>;

#define MPS_EXT_SOFTMAX(In, Out)                \
  MPS_EXT_SOFTMAX_OUT(softmax, false, In, Out)  \
  MPS_EXT_SOFTMAX_OUT(log_softmax, true, In, Out)

MPS_EXT_SOFTMAX(float, float)
MPS_EXT_SOFTMAX(half, half)
MPS_EXT_SOFTMAX(bfloat, bfloat)
MPS_EXT_SOFTMAX(half, float)
MPS_EXT_SOFTMAX(bfloat, float)

template [[host_name("softmax_partials_float")]] [[kernel]] decltype(softmax_partials<float>) softmax_partials<float>;
template [[host_name("softmax_partials_half")]] [[kernel]] decltype(softmax_partials<half>) softmax_partials<half>;
template [[host_name("softmax_partials_bfloat")]] [[kernel]] decltype(softmax_partials<bfloat>) softmax_partials<bfloat>;
