// Kernel parameter structs, shared by the host code (C++) and the kernels
// (MSL): one definition, so the two sides cannot drift. Sizes are asserted.
#pragma once

#if defined(__METAL_VERSION__)
typedef uint mps_ext_u32;
typedef int mps_ext_i32;
typedef ulong mps_ext_u64;
#else
#include <cstdint>
typedef uint32_t mps_ext_u32;
typedef int32_t mps_ext_i32;
typedef uint64_t mps_ext_u64;
#endif

// Strides and offsets are 64-bit wherever a kernel indexes memory with them:
// a view's elements may lie 2^32 or more elements apart in its storage (rows
// of a large buffer, a batch of huge matrices), and its sizes need not be
// large for that. Sizes stay 32-bit; the host plans check them. The 64-bit
// fields come first, so that no struct has padding between fields.

namespace mps_ext {

// Softmax over `cols` elements of each of `rows` rows.
struct SoftmaxParams {
  mps_ext_u32 rows;
  mps_ext_u32 cols;
  mps_ext_u32 inner;    // strided kernel: distance between a row's elements (rows = outer * inner)
  mps_ext_u32 chunks;   // split kernels: threadgroups per row
  mps_ext_u32 chunk;    // split kernels: elements per threadgroup
  mps_ext_u32 vectorized;  // 1 when rows can be read with 4-wide loads (aligned, cols % 4 == 0)
};
static_assert(sizeof(SoftmaxParams) == 24, "SoftmaxParams layout");


// The most SIMD groups gemv_splitk splits K over (one threadgroup).
enum : mps_ext_u32 { kGemvMaxSlices = 16 };

// y (m x n, row stride y_stride) = x (m x k) @ W.T (+ bias), W n x k; for
// gemv_t, W stored k-major (k x n, w_stride between its k rows).
struct GemvParams {
  mps_ext_u64 w_stride;    // elements between rows of W
  mps_ext_u64 x_stride;    // elements between rows of x
  mps_ext_u64 y_stride;    // elements between rows of y
  mps_ext_u32 n;
  mps_ext_u32 k;
  mps_ext_u32 m;           // rows of x, at most the kernel's M
  mps_ext_u32 has_bias;
  mps_ext_u32 w_vectorized;  // 1: W and its rows start 16-byte aligned
  mps_ext_u32 x_vectorized;  // 1: x and its rows start 16-byte aligned
};
static_assert(sizeof(GemvParams) == 48, "GemvParams layout");
// The most SIMD groups of a gemv_t threadgroup: its threadgroup memory holds
// the totals of all but one (7 x 256 floats for 16-bit types).
enum : mps_ext_u32 { kGemvTMaxSlices = 8 };
// Small-matrix linear algebra (metal/linalg.metal, metal/qr.metal): `batch`
// systems of order `n` with `k` right-hand sides, or (QR) `m` x `n` matrices
// with `k` Householder reflectors. Element (i, j) of system b's matrix (A, LU,
// a triangle or the reflectors) is at b * a_bs + i * a_rs + j * a_cs; of its
// right-hand sides at b * b_bs + i * b_rs + j * b_cs (strides in elements;
// complex64 counts as one). Solutions are written column-major: (i, j) at
// (b * k + j) * n + i; QR's outputs column-major too.
struct LinalgParams {
  mps_ext_u64 a_bs, a_rs, a_cs;
  mps_ext_u64 p_bs;  // pivots or tau: between systems (0 when shared)
  mps_ext_u64 b_bs, b_rs, b_cs;
  mps_ext_u32 n;
  mps_ext_u32 k;
  mps_ext_u32 batch;
  mps_ext_u32 flags;  // LinalgFlags
  mps_ext_u32 m;  // QR: rows
};
static_assert(sizeof(LinalgParams) == 80, "LinalgParams layout");

enum LinalgFlags : mps_ext_u32 {
  kLinalgAdjoint = 1,   // LU solve: solve with A^H
  kLinalgConjRhs = 2,   // conjugate the right-hand sides as read and the solutions as written
  kLinalgUpper = 4,     // triangular solve: the upper triangle
  kLinalgUnit = 8,      // triangular solve: unit diagonal (not read)
};
// FP8 quantization of a matrix viewed as (rows, cols), one scale per block
// of block_rows x block_cols (per tensor: the whole matrix; per row: 1 x cols).
struct Fp8BlockParams {
  mps_ext_u32 rows;
  mps_ext_u32 cols;
  mps_ext_u32 block_rows;
  mps_ext_u32 block_cols;
  mps_ext_u32 scale_cols;      // ceil(cols / block_cols): scales per row of blocks
  mps_ext_u32 rows_per_group;  // amax: rows of one block that one threadgroup reduces
};
static_assert(sizeof(Fp8BlockParams) == 24, "Fp8BlockParams layout");

// out (m x n) = a (m x k) @ w^T, w (n x k) e4m3fn bytes with one float scale
// per block_n x block_k block (per tensor, per row of w, or block-wise);
// a is e4m3fn with one scale or one per row (scaled_mm), or float/half/bfloat
// without (weight-only fp8_linear).
struct Fp8MatmulParams {
  mps_ext_u64 a_stride;    // elements between rows of a
  mps_ext_u64 w_stride;    // bytes between rows of w
  mps_ext_u64 out_stride;  // elements between rows of out
  mps_ext_u32 m;
  mps_ext_u32 n;
  mps_ext_u32 k;
  mps_ext_u32 has_a_scale;
  mps_ext_u32 a_scale_stride;  // 0: one scale for a; 1: one per row
  mps_ext_u32 block_n;
  mps_ext_u32 block_k;
  mps_ext_u32 scale_cols;         // ceil(k / block_k)
  mps_ext_u32 scale_in_epilogue;  // one block along k: weight scales multiply finished dot products
  mps_ext_u32 has_bias;           // bias: float, n elements
  mps_ext_u32 a_vectorized;       // a and its rows start 16-byte aligned
  mps_ext_u32 w_vectorized;       // w and its rows start 16-byte aligned
  mps_ext_u32 a_e5m2;             // scaled_mm: a holds e5m2 bytes (else e4m3fn)
  mps_ext_u32 w_e5m2;             // scaled_mm: w holds e5m2 bytes (else e4m3fn)
  mps_ext_u32 gemv_slices;        // gemv: SIMD groups that split K for the same rows (1: none)
  mps_ext_u32 stream_rows;        // gemv_stream: rows of w per threadgroup (even)
};
static_assert(sizeof(Fp8MatmulParams) == 88, "Fp8MatmulParams layout");
// The streamed GEMV (mps_ext/gemv.h's gemv_stream): at most this many SIMD
// groups per threadgroup (each owns 32 chunks of K), rows of w per
// threadgroup (one thread of its first SIMD group finishes each), and
// partial dot products for at most this many (rows x SIMD groups) in
// threadgroup memory.
enum : mps_ext_u32 { kGemvStreamMaxSlices = 32, kGemvStreamMaxRows = 32, kGemvStreamPartials = 1024 };


// torch._grouped_mm: out_g = a_g @ b_g for each group g. `split` says which
// dimension offs divides: rows of a and out (2D x 3D), columns of b and out
// (3D x 2D), K (2D x 2D), or none (3D x 3D, every group whole). A stride of
// 0 for a group makes every group read the same 2-D operand.
enum GroupedSplit : mps_ext_u32 { kGroupedSplitNone = 0, kGroupedSplitRows = 1, kGroupedSplitCols = 2, kGroupedSplitK = 3 };

struct GroupedMmParams {
  mps_ext_u64 a_group, a_row, a_k;      // strides of a, in elements
  mps_ext_u64 b_group, b_k, b_col;      // strides of b
  mps_ext_u64 out_group, out_row;       // strides of out (its columns are contiguous)
  mps_ext_u64 scale_group;              // fp8_grouped_mm: floats between one expert's scales and the next's
  mps_ext_u32 split;   // a GroupedSplit
  mps_ext_u32 groups;
  mps_ext_u32 m;       // rows of out (of every group, or all groups' when split by rows)
  mps_ext_u32 n;       // columns of out (all groups' when split by columns)
  mps_ext_u32 k;       // contraction length (all groups' when split by K)
  mps_ext_u32 a_vectorized;  // decode: a, its rows and its groups start 16-byte aligned
  mps_ext_u32 b_vectorized;  // decode: b's contiguous rows (b_col or b_k apart) and groups start 16-byte aligned
  mps_ext_u32 decode_slices;  // decode: SIMD groups that split K for the same weight rows (1, 2, 4)
  mps_ext_u32 decode_chunks;  // decode along N: 16-byte column chunks per threadgroup (2, 4)
  // fp8_grouped_mm (e4m3fn expert weights W_g, n x k): one scale per block_n x block_k block of W_g,
  // scale_cols per row of blocks.
  mps_ext_u32 block_n, block_k, scale_cols;
  mps_ext_u32 stream_rows;  // fp8_grouped_mm's streamed decode: weight rows per threadgroup (even)
};
static_assert(sizeof(GroupedMmParams) == 128, "GroupedMmParams layout");
// The e4m3fn bytes of a weight row one lane of fp8_grouped_mm's decode reads
// per K-step (fp8_linear's GEMV reads 16). With 16, the 2-row decode held 102
// registers on the CUDA proxy against 64, and ran 1.2-2.0x slower
// (docs/performance.md); expert rows are short too (Qwen3-30B-A3B's down: 768
// bytes, one and a half 16-byte steps of a SIMD group, three 8-byte ones).
// With 4, 1.35-1.6x slower than with 8.
enum : mps_ext_u32 { kFp8GroupedDecodeBytes = 8 };
// The 16-byte chunks of a weight row (float, half, bfloat) one lane of
// grouped_mm's decode reads per K-step: two, so a lane has 32 bytes in
// flight per row (on the CUDA proxy 2-10% faster than one on Qwen3-30B-A3B's
// experts). fp8_grouped_mm reads one chunk of kFp8GroupedDecodeBytes: two ran
// up to 12% slower on the down projection.
enum : mps_ext_u32 { kGroupedDecodeChunks = 2 };


// Padding (metal/pad.metal): along each dimension d, output index o stands
// for input index o - before[d] (before < 0 crops), reflected or replicated
// back into [0, in_size[d]) as torch's CPU kernels index (reflect and
// replicate), or the fill value outside it (constant). Dimensions come in
// the output's memory order, outermost first, the output contiguous in it
// (the host drops and merges the dimensions that are not padded); src is the
// input (forward) or the output's gradient (backward), src_stride its
// strides in elements.
enum : mps_ext_u32 { kPadMaxDims = 6 };
enum PadMode : mps_ext_u32 { kPadConstant = 0, kPadReflect = 1, kPadReplicate = 2 };
struct PadParams {
  mps_ext_u64 src_stride[kPadMaxDims];
  mps_ext_u64 fill[2];  // constant: the value's bytes, cast to the element type as torch fills
  mps_ext_u64 out_numel;  // the written tensor's elements (the output, the input's gradient)
  mps_ext_u32 in_size[kPadMaxDims];
  mps_ext_u32 out_size[kPadMaxDims];
  mps_ext_i32 before[kPadMaxDims];
  mps_ext_u32 dims;
  mps_ext_u32 threads;  // the written tensor's 16-byte chunks
  // src's last dimension contiguous and its start 16-byte aligned (forward: each of its rows too)
  mps_ext_u32 src_vectorized;
  mps_ext_u32 out_vectorized;  // the written tensor 16-byte aligned
};
static_assert(sizeof(PadParams) == 160, "PadParams layout");

// Interpolation (metal/upsample.metal) of an (N, C, spatial...) tensor:
// along each interpolated (spatial) dimension d, the op's output index o
// reads the input indices torch's CPU kernels compute from scale[d]
// (area_pixel_compute_scale's value); batch and channels read their own
// index. Each thread writes `repeat` elements of the written tensor (the
// output forward, the input's gradient backward) that differ only in their
// channel, at `span` neighbouring positions along the last spatial
// dimension, so that what they share is computed once; src is the input
// (forward) or the output's gradient (backward). Strides are in elements;
// the written tensor's offsets fit 32 bits.
enum : mps_ext_u32 { kUpsampleMaxInterpolated = 3, kUpsampleRepeat = 4 };
enum UpsampleMode : mps_ext_u32 {
  kUpsampleNearest = 0,       // upsample_nearest*: floor(o * scale)
  kUpsampleNearestExact = 1,  // _upsample_nearest_exact*: floor((o + 0.5) * scale)
  kUpsampleLinear = 2,        // upsample_linear1d, upsample_bilinear2d, upsample_trilinear3d
  kUpsampleCubic = 3,         // upsample_bicubic2d
};
struct UpsampleParams {
  mps_ext_u64 src_stride[kUpsampleMaxInterpolated];  // the spatial dimensions, in the op's order
  mps_ext_u64 batch_src_stride;
  mps_ext_u64 channel_src_stride;
  float scale[kUpsampleMaxInterpolated];
  mps_ext_u32 in_size[kUpsampleMaxInterpolated];
  mps_ext_u32 out_size[kUpsampleMaxInterpolated];
  mps_ext_u32 dst_stride[kUpsampleMaxInterpolated];
  mps_ext_u32 batch_dst_stride;
  mps_ext_u32 channel_dst_stride;
  mps_ext_u32 channels;
  // kUpsampleRepeat; nearest forward: 16 bytes of channels where they are
  // the written tensor's fastest dimension, else 1
  mps_ext_u32 repeat;
  mps_ext_u32 channel_groups;  // ceil(channels / repeat)
  // nearest forward: 16 bytes of a row where the channels are not the
  // fastest dimension, else 1
  mps_ext_u32 span;
  mps_ext_u32 spans;  // ceil(the written tensor's last spatial size / span)
  // nearest forward: the 16-byte runs of channels (repeat > 1) or of a row
  // (span > 1) are 16-byte aligned in the written tensor (and, for channels,
  // in src)
  mps_ext_u32 vectorized;
  // 1 where channels are the written tensor's fastest dimension (channels
  // last): neighbouring threads take neighbouring channel groups, else
  // neighbouring positions along the last spatial dimension.
  mps_ext_u32 channels_inner;
  mps_ext_u32 align_corners;
  // nearest and nearest-exact: 1 where torch's CPU kernel indexes the call
  // with nearest_idx or nearest_exact_idx (its channels-last forward kernels,
  // every backward), 0 where with its generic forward kernel's helpers.
  mps_ext_u32 nearest_idx;
  // batch * channel_groups * the written tensor's spatial sizes (the repeat
  // kernels: src's, with spans along its last)
  mps_ext_u32 threads;
  // nearest forward's repeat kernels: output index o of dimension l reads
  // o >> factor_shift[l], so each input element is written 2^factor_shift[l]
  // times along it; the threads take the input's positions (in_size)
  mps_ext_u32 factor_shift[kUpsampleMaxInterpolated];
  mps_ext_u32 padding;
};
static_assert(sizeof(UpsampleParams) == 152, "UpsampleParams layout");

// Dropout (metal/dropout.metal) over `numel` elements in memory order, four
// per thread. Element i is kept iff word i % 4 of Philox4x32-10 at counter
// (i / 4, offset) and key seed is >= threshold: with u that word over 2^32,
// keep iff u >= p, so threshold = ceil(p * 2^32), from 0 (p = 0, all kept)
// to 2^32 (p = 1, none). Kept elements are scaled by `scale` (1 / (1 - p),
// 0 for p = 1); the backward reads the mask and uses numel, scale and
// vectorized only.
struct DropoutParams {
  mps_ext_u64 numel;
  mps_ext_u64 seed;
  mps_ext_u64 offset;
  mps_ext_u64 threshold;
  float scale;
  mps_ext_u32 vectorized;  // every buffer aligned for 4-element loads and stores
};
static_assert(sizeof(DropoutParams) == 40, "DropoutParams layout");

// Attention for few query rows (metal/attention.metal): out = softmax(q k^T
// * scale + mask) v per (batch, query head) over key_len keys. Query head h
// reads KV head h / group, so one threadgroup serves the `group` query heads
// of a KV head: its rows are (g, i) pairs, row = g * q_len + i. Strides in
// elements; the last dimension of q, k, v is contiguous. The batch is the
// broadcast of every leading dimension, one stride each (0 where broadcast).
// Keys split into `splits` runs of keys_per_split; with more than one run the
// kernel writes each run's (max, sum, unnormalised output) and a second
// kernel merges them.
enum AttentionMask : mps_ext_u32 {
  kAttentionMaskNone = 0,
  kAttentionMaskBool = 1,   // false: the key is not attended
  kAttentionMaskFloat = 2,  // added to the score, in this type
  kAttentionMaskHalf = 3,
  kAttentionMaskBfloat = 4,
};
enum AttentionVectorized : mps_ext_u32 { kAttentionVecQ = 1, kAttentionVecK = 2, kAttentionVecV = 4 };
struct AttentionParams {
  mps_ext_u64 q_stride[3];     // batch, query head, query row
  mps_ext_u64 k_stride[3];     // batch, KV head, key
  mps_ext_u64 v_stride[3];     // batch, KV head, key
  mps_ext_u64 mask_stride[4];  // batch, query head, query row, key
  mps_ext_u32 kv_heads;
  mps_ext_u32 group;       // query heads per KV head
  mps_ext_u32 q_len;
  mps_ext_u32 key_len;
  mps_ext_u32 qk_dim;
  mps_ext_u32 v_dim;
  mps_ext_u32 splits;
  mps_ext_u32 keys_per_split;
  mps_ext_u32 mask;        // AttentionMask
  mps_ext_u32 causal;      // 1: query row i attends keys 0..i (torch's top-left alignment)
  mps_ext_u32 vectorized;  // AttentionVectorized bits: rows of that tensor load in 2- or 4-element vectors
  float scale;
  // 0, or a sliding window: query row i attends the `window` keys ending at
  // its position key_len - q_len + i (aligned to the end of the keys, as
  // with a KV cache); key_first is the first key any row attends.
  mps_ext_u32 window;
  mps_ext_u32 key_first;
  mps_ext_u32 sinks;  // 1: a logit per query head (a key with value 0) in the softmax
  mps_ext_u32 lse;    // 1: the prefill kernel also writes each row's log-sum-exp (training)
  // 0, or Gemma-2's logit softcapping: a scaled score s becomes
  // softcap * tanh(s / softcap), before the mask is added
  float softcap;
  mps_ext_u32 padding;  // the struct's size a multiple of its 8-byte alignment on both sides
};
static_assert(sizeof(AttentionParams) == 176, "AttentionParams layout");
// Rows of one threadgroup (1, 2, 4 or 8); more rows per KV head take more
// threadgroups, each reading that head's keys.
enum : mps_ext_u32 { kAttentionMaxRows = 8 };
// The merge's SIMD groups per output row (metal/attention.metal: attention_merge).
enum : mps_ext_u32 { kAttentionMergeSimdGroups = 4 };
// Query rows of one prefill threadgroup (8 per SIMD group).
enum : mps_ext_u32 { kAttentionPrefillRows = 32 };

}  // namespace mps_ext
