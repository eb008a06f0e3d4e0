// FP8 (e4m3fn, carried as bytes) kernels: quantization with amax scales,
// dequantization, and out = a @ w^T for e4m3fn weights w (n x k, the layout
// of a Linear weight and of torch._scaled_mm's column-major b), with
//
// - scaled_mm: e4m3fn or e5m2 a with one scale or one per row; w (e4m3fn or
//   e5m2) with one scale or one per row of w (per column of b); float8
//   outputs through scaled_mm_encode;
// - fp8_linear: float/half/bfloat a; w with one scale per block_n x block_k
//   block (per tensor, per row, or 128 x 128 blocks as in FP8 checkpoints).
//
// Three kernels each:
// - gemv_stream (one row of a, k up to 16384): each SIMD group holds 512
//   bytes' worth of a in registers and streams the rows of w past them,
//   two at a time (mps_ext/gemv.h's gemv_stream), decoding 16-byte chunks
//   with the shift trick of mps_ext/fp8_decode.h: no load or unpack of a
//   per row of w.
// - gemv (m <= 8, decode): the decode GEMV loop of mps_ext/gemv.h with an
//   e4m3fn weight policy: one SIMD group per row of w for one row of a, per
//   four rows for two, per two for more (fp8_rows_per_simdgroup); each lane
//   reads 16-byte chunks of each row (a SIMD group 512 contiguous bytes per
//   chunk), decodes them once and uses them for every row of a (from cache:
//   a is small). The host sizes the grid as
//   for the dense GEMV (ops::gemv_geometry): K split over gemv_slices SIMD
//   groups when the rows alone would not fill the GPU.
//   Both read each weight byte once per call and fold the 256 the decode
//   divides by back in once per dot product.
// - tiled: 32 x 32 output tiles (mps_ext/mma.h), fp8 decoded exactly to
//   float in threadgroup memory, float accumulation.
//
// Block scales that change along k are applied per 16-byte chunk (gemv; the
// host guarantees block_k % 16 == 0) or per element (tiled); a single block
// along k scales the finished dot products. NaN codes decode to NaN and
// poison their dot products as in torch.
#include <metal_stdlib>

#include "mps_ext/fp8.h"
#include "mps_ext/fp8_weights.h"
#include "mps_ext/gemv.h"
#include "mps_ext/mma.h"
#include "mps_ext/params.h"

using namespace metal;
using mps_ext::Fp8BlockParams;
using mps_ext::Fp8MatmulParams;

typedef uchar fp8;  // host names say fp8 for e4m3fn bytes

// ---------------------------------------------------------------- quantize

// amax[b] = max |x| over block b, as float bits (non-negative floats order
// like their bits, NaN above infinity, so NaN wins as in torch's amax).
// Threadgroup (bc, br, s) reduces rows_per_group rows of block (br, bc).
template <typename T>
kernel void fp8_amax(device const T* x [[buffer(0)]], device atomic_uint* amax [[buffer(1)]],
                     constant Fp8BlockParams& p [[buffer(2)]], uint3 group [[threadgroup_position_in_grid]],
                     uint3 local [[thread_position_in_threadgroup]], uint3 size [[threads_per_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]]) {
  const uint c0 = group.x * p.block_cols, c1 = min(c0 + p.block_cols, p.cols);
  const uint r0 = group.y * p.block_rows + group.z * p.rows_per_group;
  const uint r1 = min(min(r0 + p.rows_per_group, (group.y + 1) * p.block_rows), p.rows);
  const uint width = c1 - c0;
  const ulong count = r1 > r0 ? ulong(r1 - r0) * width : 0;
  uint m = 0;
  for (ulong i = local.x; i < count; i += size.x) {
    const ulong r = r0 + i / width, c = c0 + i % width;
    m = max(m, as_type<uint>(float(x[ulong(r) * p.cols + c])) & 0x7FFFFFFFu);
  }
  m = simd_max(m);
  if (lane == 0) atomic_fetch_max_explicit(&amax[group.y * p.scale_cols + group.x], m, memory_order_relaxed);
}

// The dequantization scale of a block: amax / 448 (1 for an all-zero block).
inline float block_scale(uint amax_bits) {
  const float a = as_type<float>(amax_bits);
  return a == 0.0f ? 1.0f : precise::divide(a, 448.0f);
}

template <typename T>
kernel void fp8_quantize(device const T* x [[buffer(0)]], device const uint* amax [[buffer(1)]],
                         device fp8* q [[buffer(2)]], device float* scale [[buffer(3)]],
                         constant Fp8BlockParams& p [[buffer(4)]], uint2 pos [[thread_position_in_grid]]) {
  if (pos.x >= p.cols || pos.y >= p.rows) return;
  const uint b = (pos.y / p.block_rows) * p.scale_cols + pos.x / p.block_cols;
  const float s = block_scale(amax[b]);
  const ulong i = ulong(pos.y) * p.cols + pos.x;
  q[i] = mps_ext::float_to_fp8(precise::divide(float(x[i]), s));
  if (pos.x % p.block_cols == 0 && pos.y % p.block_rows == 0) scale[b] = s;
}

template <typename T>
kernel void fp8_dequantize(device const fp8* q [[buffer(0)]], device const float* scale [[buffer(1)]],
                           device T* out [[buffer(2)]], constant Fp8BlockParams& p [[buffer(3)]],
                           uint2 pos [[thread_position_in_grid]]) {
  if (pos.x >= p.cols || pos.y >= p.rows) return;
  const ulong i = ulong(pos.y) * p.cols + pos.x;
  out[i] = T(mps_ext::fp8_to_float(q[i]) * scale[(pos.y / p.block_rows) * p.scale_cols + pos.x / p.block_cols]);
}

// ------------------------------------------------------------------ matmul

// What the rows of an operand of this type come out divided by (mps_ext::fp8_decode: 256).
inline float load_factor(fp8) { return 256.0f; }
template <typename T>
inline float load_factor(T) { return 1.0f; }

// The activation scale and the bias of a finished (weight-scaled) dot product out[m, n].
inline float epilogue(constant Fp8MatmulParams& p, float dot, uint m, uint n, device const float* a_scale,
                      device const float* bias) {
  float v = dot;
  if (p.has_a_scale) v *= a_scale[m * p.a_scale_stride];
  if (p.has_bias) v += bias[n];
  return v;
}

// e4m3fn rows of a (scaled_mm) for gemv.h's loop: like gemv.h's XRows
// (rows past m read row m - 1), Count bytes per step, as x / 256.
struct Fp8XRows {
  device const fp8* x;
  ulong row_stride;
  uint m;
  bool vectorized;
  bool e5m2;

  template <uint Count, bool Checked = true>
  void load(uint i, uint k, uint end, thread float4* out) const {
    mps_ext::fp8_decode<Count>(mps_ext::fp8_fetch<Count, Checked>(x + min(i, m - 1) * row_stride, k, end, vectorized), out,
                        e5m2);
  }
};

template <typename T>
struct RowsOf {
  typedef mps_ext::XRows<T> type;
  static type make(device const T* a, constant Fp8MatmulParams& p) {
    return type{a, p.a_stride, p.m, p.a_vectorized != 0};
  }
};
template <>
struct RowsOf<fp8> {
  typedef Fp8XRows type;
  static type make(device const fp8* a, constant Fp8MatmulParams& p) {
    return type{a, p.a_stride, p.m, p.a_vectorized != 0, p.a_e5m2 != 0};
  }
};

// Rows of w per SIMD group of the FP8 GEMV: one for one row of a (most SIMD
// groups resident: the decode's registers weigh more than the bf16 GEMV's),
// four for two rows of a, two for four or eight (four against four or eight
// rows of a held 128 registers and spilled: on the CUDA proxy two were
// 1.04-1.11x faster at m = 4 on q_proj, down and lm_head, 0.95x on gate/up,
// and 1.09-1.30x faster at m = 8; at m = 2 four were up to 1.16x faster;
// four rows of 8-byte chunks, which fit at 119 registers and issue 14% fewer
// instructions per weight, were up to 1.15x slower at m = 4, lm_head aside:
// 2% faster).
// And 16-byte chunks of each row a lane reads per step: two for one row of
// a, so a lane has 32 bytes in flight (on the CUDA proxy 12-15% faster than
// one on the larger Llama shapes), one for more (two to four rows already
// give 32-64). csrc/ops/fp8.cpp's gemv_rows_per_simdgroup and gemv_step say
// the same. For one row the next step's bytes are fetched before a step is
// decoded (gemv_simdgroup's Ahead): 7-13% faster on the proxy; with more
// rows the doubled chunks cost more registers than the overlap gains.
template <uint M>
constexpr uint fp8_rows_per_simdgroup() { return M == 1 ? 1 : M == 2 ? 4 : 2; }
template <uint M>
constexpr uint fp8_chunks_per_lane() { return M == 1 ? 2 : 1; }

// M: the rows of a the kernel is built for (1, 2, 4, 8); it serves any m <= M.
// Runs of p.gemv_slices SIMD groups share R rows of w, each on every
// gemv_slices-th step of K (1: each SIMD group its own rows).
// a_scale is bound to any buffer when there is none (it is not read).
template <typename In, typename Out, uint M>
kernel void fp8_gemv(device const In* a [[buffer(0)]], device const fp8* w [[buffer(1)]],
                     device const float* a_scale [[buffer(2)]], device const float* w_scale [[buffer(3)]],
                     device const float* bias [[buffer(4)]], device Out* out [[buffer(5)]],
                     constant Fp8MatmulParams& p [[buffer(6)]], uint group [[threadgroup_position_in_grid]],
                     uint sg [[simdgroup_index_in_threadgroup]], uint simdgroups [[simdgroups_per_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]]) {
  constexpr uint R = fp8_rows_per_simdgroup<M>();
  threadgroup float partial[32 * R * M];
  const uint slices = p.gemv_slices;
  const uint first = (group * (simdgroups / slices) + sg / slices) * R;
  // A whole SIMD group leaves (no SIMD-group function is split); split runs
  // never do (the grid has one threadgroup per block of rows), so every
  // thread reaches gemv_sum_slices' barrier.
  if (first >= p.n) return;
  const mps_ext::Fp8Weights<16, metal::is_same<In, fp8>::value> weights{w,         p.w_stride, p.w_vectorized != 0,       w_scale,       p.block_n,
                           p.block_k, p.scale_cols, p.scale_in_epilogue == 0, p.w_e5m2 != 0};
  const typename RowsOf<In>::type rows = RowsOf<In>::make(a, p);
  mps_ext::Tile<M, R> t = mps_ext::gemv_simdgroup<M, R, fp8_chunks_per_lane<M>(), M == 1>(
      weights, rows, first, p.n, p.k, sg % slices, slices, lane);
  if (slices > 1) t = mps_ext::gemv_sum_slices(t, partial, sg, slices, lane);
  if (sg % slices != 0) return;
  const float unfold = load_factor(In());
  MPS_EXT_UNROLL
  for (uint r = 0; r < R; ++r)
    MPS_EXT_UNROLL
    for (uint i = 0; i < M; ++i) {
      const uint n = first + r;
      if (lane == r * M + i && n < p.n && i < p.m)
        out[ulong(i) * p.out_stride + n] = Out(epilogue(p, t.v[r][i] * weights.scale(n) * unfold, i, n, a_scale, bias));
    }
}

// One row of a against w with a held in registers (mps_ext/gemv.h's
// gemv_stream): threadgroup g owns rows [g * stream_rows, (g + 1) *
// stream_rows) of w, each of its SIMD groups one chunk of K (512 bytes of w),
// so there are ceil(k / 512) of them; the host takes it for k up to
// kGemvStreamMaxSlices chunks, fp8_gemv<M = 1> beyond. Two rows per batch:
// on the CUDA proxy four held more than 64 registers and spilled
// (threadgroups of up to 1024 threads allow no more), 3-10% slower.
template <typename In, typename Out>
kernel void fp8_gemv_stream(device const In* a [[buffer(0)]], device const fp8* w [[buffer(1)]],
                            device const float* a_scale [[buffer(2)]], device const float* w_scale [[buffer(3)]],
                            device const float* bias [[buffer(4)]], device Out* out [[buffer(5)]],
                            constant Fp8MatmulParams& p [[buffer(6)]], uint group [[threadgroup_position_in_grid]],
                            uint sg [[simdgroup_index_in_threadgroup]],
                            uint simdgroups [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                            uint tid [[thread_index_in_threadgroup]]) {
  threadgroup float partial[mps_ext::kGemvStreamPartials];
  threadgroup float factors[mps_ext::kGemvStreamMaxRows];
  const uint rows = p.stream_rows, first = group * rows, count = min(rows, p.n - first);
  const mps_ext::Fp8Weights<16, metal::is_same<In, fp8>::value> weights{
      w, p.w_stride, p.w_vectorized != 0, w_scale, p.block_n, p.block_k, p.scale_cols, p.scale_in_epilogue == 0,
      p.w_e5m2 != 0};
  // Thread i < count writes row first + i (count <= 32: the host's
  // stream_rows). Its scale is loaded now, so that its latency hides behind
  // the stream instead of adding to the end of a threadgroup whose rows are
  // few.
  if (tid < count) factors[tid] = weights.scale(first + tid) * load_factor(In());
  mps_ext::gemv_stream<2>(weights, RowsOf<In>::make(a, p), first, count, p.n, p.k, sg, lane, partial + sg * rows);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid >= count) return;
  float dot = 0.0f;
  for (uint s = 0; s < simdgroups; ++s) dot += partial[s * rows + tid];
  out[first + tid] = Out(epilogue(p, dot * factors[tid], 0, first + tid, a_scale, bias));
}

inline float element(device const fp8* p, ulong i, bool e5m2) {
  return e5m2 ? mps_ext::e5m2_to_float(p[i]) : mps_ext::fp8_to_float(p[i]);
}
template <typename T>
inline float element(device const T* p, ulong i, bool) { return float(p[i]); }

// Rows [first, first + 32) of a row-major (rows x k) matrix into a tile:
// [row][k] for a, transposed to [k][row] for w; w's block scales applied
// per element when they change along k.
template <typename T>
struct RowTiles {
  device const T* base;
  uint rows, k;
  ulong stride;
  uint first;
  bool transposed;
  device const float* scale;
  uint block_rows, block_k, scale_cols;
  bool scaled;
  bool e5m2;

  void load(threadgroup float* tile, uint k0, uint tid) const {
    const uint r = tid / 4, c = (tid % 4) * 8;  // 32 rows x 4 chunks of 8: 128 threads
    const uint row = first + r;
    for (uint j = 0; j < 8; ++j) {
      const uint kk = k0 + c + j;
      float v = 0.0f;
      if (row < rows && kk < k) {
        v = element(base, ulong(row) * stride + kk, e5m2);
        if (scaled) v *= scale[(row / block_rows) * scale_cols + kk / block_k];
      }
      tile[transposed ? (c + j) * mps_ext::kTileN + r : r * mps_ext::kTileK + c + j] = v;
    }
  }
};

template <typename In, typename Out>
kernel void fp8_tiled(device const In* a [[buffer(0)]], device const fp8* w [[buffer(1)]],
                      device const float* a_scale [[buffer(2)]], device const float* w_scale [[buffer(3)]],
                      device const float* bias [[buffer(4)]], device Out* out [[buffer(5)]],
                      constant Fp8MatmulParams& p [[buffer(6)]], uint2 group [[threadgroup_position_in_grid]],
                      uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float a_tile[mps_ext::kTileM * mps_ext::kTileK];
  threadgroup float b_tile[mps_ext::kTileK * mps_ext::kTileN];
  threadgroup float c_tile[mps_ext::kTileM * mps_ext::kTileN];
  const uint m0 = group.y * mps_ext::kTileM, n0 = group.x * mps_ext::kTileN;
  const RowTiles<In> la{a, p.m, p.k, p.a_stride, m0, false, w_scale, 1, 1, 1, false, p.a_e5m2 != 0};
  const RowTiles<fp8> lb{w,         p.n,       p.k,       p.w_stride, n0, true, w_scale, p.block_n, p.block_k,
                         p.scale_cols, p.scale_in_epilogue == 0, p.w_e5m2 != 0};
  mps_ext::mma_store(mps_ext::mma_tiles(la, lb, p.k, a_tile, b_tile, tid, sg), c_tile, sg);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint e = tid; e < mps_ext::kTileM * mps_ext::kTileN; e += mps_ext::kTileThreads) {
    const uint m = m0 + e / mps_ext::kTileN, n = n0 + e % mps_ext::kTileN;
    if (m >= p.m || n >= p.n) continue;
    const float w_factor = p.scale_in_epilogue ? w_scale[(n / p.block_n) * p.scale_cols] : 1.0f;
    out[ulong(m) * p.out_stride + n] = Out(epilogue(p, c_tile[e] * w_factor, m, n, a_scale, bias));
  }
}

// ------------------------------------------------------------ FP8 outputs

// torch._scaled_mm's float8 outputs: the float result times 1 / scale_result
// (the reciprocal rounded first, as torch computes it), converted as torch's
// tensor conversion does (e4m3fn saturates to +-448, e5m2 overflows to
// infinity).
inline uchar encode(float v, bool e5m2) { return e5m2 ? mps_ext::float_to_e5m2(v) : mps_ext::float_to_fp8(v); }

template <bool E5m2>
kernel void scaled_mm_encode(device const float* x [[buffer(0)]], device const float* scale_result [[buffer(1)]],
                             device fp8* out [[buffer(2)]], constant Fp8BlockParams& p [[buffer(3)]],
                             uint2 pos [[thread_position_in_grid]]) {
  if (pos.x >= p.cols || pos.y >= p.rows) return;
  const ulong i = ulong(pos.y) * p.cols + pos.x;
  out[i] = encode(x[i] * precise::divide(1.0f, scale_result[0]), E5m2);
}

// Host names, built by the host from the same parts (csrc/ops/fp8.cpp):
// fp8_<kernel>_<type>, scaled_mm_{gemv_m<M>,tiled}_fp8_<out type>,
// fp8_linear_{gemv_m<M>,tiled}_<input type>, scaled_mm_encode_{fp8,e5m2}.
// scaled_mm reads e4m3fn or e5m2 operands (a flag per operand in the params).
#define MPS_EXT_FP8_CONVERT(T)                                                                                 \
  template [[host_name("fp8_amax_" #T)]] [[kernel]] decltype(fp8_amax<T>) fp8_amax<T>;                         \
  template [[host_name("fp8_quantize_" #T)]] [[kernel]] decltype(fp8_quantize<T>) fp8_quantize<T>;             \
  template [[host_name("fp8_dequantize_" #T)]] [[kernel]] decltype(fp8_dequantize<T>) fp8_dequantize<T>;

#define MPS_EXT_FP8_GEMV(op, In, Out, M, name)                                                                 \
  template [[host_name(#op "_gemv_m" #M "_" name)]] [[kernel]] decltype(fp8_gemv<In, Out, M>) fp8_gemv<In, Out, M>;

#define MPS_EXT_FP8_MATMUL(op, In, Out, name)                                                                  \
  template [[host_name(#op "_gemv_stream_" name)]] [[kernel]] decltype(fp8_gemv_stream<In, Out>)                 \
      fp8_gemv_stream<In, Out>;                                                                                \
  MPS_EXT_FP8_GEMV(op, In, Out, 1, name)                                                                       \
  MPS_EXT_FP8_GEMV(op, In, Out, 2, name)                                                                       \
  MPS_EXT_FP8_GEMV(op, In, Out, 4, name)                                                                       \
  MPS_EXT_FP8_GEMV(op, In, Out, 8, name)                                                                       \
  template [[host_name(#op "_tiled_" name)]] [[kernel]] decltype(fp8_tiled<In, Out>) fp8_tiled<In, Out>;

#define MPS_EXT_FP8_TYPES(T)                       \
  MPS_EXT_FP8_CONVERT(T)                           \
  MPS_EXT_FP8_MATMUL(scaled_mm, fp8, T, "fp8_" #T) \
  MPS_EXT_FP8_MATMUL(fp8_linear, T, T, #T)

MPS_EXT_FP8_TYPES(float)
MPS_EXT_FP8_TYPES(half)
MPS_EXT_FP8_TYPES(bfloat)
template [[host_name("scaled_mm_encode_fp8")]] [[kernel]] decltype(scaled_mm_encode<false>) scaled_mm_encode<false>;
template [[host_name("scaled_mm_encode_e5m2")]] [[kernel]] decltype(scaled_mm_encode<true>) scaled_mm_encode<true>;
