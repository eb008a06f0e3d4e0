// Padding: constant (F.pad's default, constant_pad_nd, negative pads crop),
// reflect and replicate, forward and backward, in any rank the host reduces
// to at most kPadMaxDims dimensions (csrc/ops/pad.cpp drops and merges the
// ones without padding: a 5-D video padded along time is (N*C, T, H*W)).
//
// - forward (pad_<mode>_<bytes>): moves elements as their bytes, so one
//   kernel per element size serves every dtype (bool and uint8 to
//   complex128). Each thread writes 16 bytes of the output in memory order,
//   one aligned store whatever the row length; where they lie inside one
//   input row, it reads them with one 16-byte load, or two aligned loads
//   shifted into place where the padding before the row is not a multiple
//   of 16 bytes (a causal convolution's one-pixel border); element by
//   element at the rows' ends and in the borders. Every output byte is
//   written once, every input byte read once (twice or three times in
//   reflected and replicated borders, and by the neighbouring thread's
//   shifted load).
// - backward (pad_backward_<mode>_<type>): each thread writes 16 bytes of
//   the input's gradient. Away from the borders each element is its own
//   output position's gradient, read as the forward reads a run; at a
//   border each element gathers every output position that reads it (up to
//   three ranges per dimension: itself, and its mirror images or the border
//   it repeats), in a fixed order, in float: no atomics, the same bits every
//   run.
#include <metal_stdlib>

#include "mps_ext/params.h"
#include "mps_ext/unroll.h"

using namespace metal;
using mps_ext::PadParams;

// The input index that output index o reads along a dimension of `size`
// elements padded by `before` (torch's CPU indexing, negative pads
// included), and whether there is one (constant mode: none in the padding).
template <uint Mode>
inline bool source_index(int o, int size, int before, thread int& i) {
  if (Mode == mps_ext::kPadConstant) {
    i = o - before;
    return i >= 0 && i < size;
  }
  int j = o;
  if (o < before) {
    j = Mode == mps_ext::kPadReflect ? 2 * before - o : before;
  } else if (o >= size + before) {
    j = Mode == mps_ext::kPadReflect ? 2 * (size + before - 1) - o : size + before - 1;
  }
  // Valid paddings (the host's checks, torch's) keep j - before inside the
  // input; the clamp keeps every read in bounds whatever they are.
  i = clamp(j - before, 0, size - 1);
  return true;
}

// Where an output row reads src: the offset of its input row, and (constant
// mode) whether it has one, else it lies in the padding and holds the fill.
struct RowSource {
  ulong base;
  bool inside;
};

template <uint Mode>
inline RowSource row_source(constant PadParams& p, uint row) {
  RowSource r = {0, true};
  for (uint d = p.dims - 1; d-- > 0;) {
    int i;
    r.inside = source_index<Mode>(int(row % p.out_size[d]), int(p.in_size[d]), p.before[d], i) && r.inside;
    r.base += ulong(i) * p.src_stride[d];
    row /= p.out_size[d];
  }
  return r;
}

// Bytes [shift, shift + 16) of a followed by b (0 < shift < 16): a run that
// starts between two aligned chunks.
inline uint4 shifted(uint4 a, uint4 b, uint shift) {
  const uint words = shift / 4, bits = shift % 4 * 8;
  const uint4 lo = words == 0   ? a
                   : words == 1 ? uint4(a.y, a.z, a.w, b.x)
                   : words == 2 ? uint4(a.z, a.w, b.x, b.y)
                                : uint4(a.w, b.x, b.y, b.z);
  const uint4 hi = words == 0   ? uint4(a.y, a.z, a.w, b.x)
                   : words == 1 ? uint4(a.z, a.w, b.x, b.y)
                   : words == 2 ? uint4(a.w, b.x, b.y, b.z)
                                : b;
  return bits == 0 ? lo : lo >> bits | hi << (32 - bits);
}

// Elements [start, start + kPer) of a 16-byte aligned input row of `width`
// (start >= 0, start + kPer <= width): one aligned load, or the two aligned
// chunks around them where both lie inside the row; false where not.
template <typename T>
inline bool load_run(device const T* row, int start, int width, thread uint4& v) {
  constexpr int kPer = 16 / sizeof(T);
  const int lo = start & ~(kPer - 1);
  device const uint4* at = reinterpret_cast<device const uint4*>(row + lo);
  if (start == lo) {
    v = at[0];
    return true;
  }
  if (lo + 2 * kPer > width) return false;
  v = shifted(at[0], at[1], uint(start - lo) * sizeof(T));
  return true;
}

// Element k of a 16-byte chunk, by the elements' size, as bits: with k a
// constant (the loops over a chunk unroll) the chunk stays in registers,
// where a thread array of sub-word elements would not.
template <uint Size>
struct Chunk {  // 1 and 2 bytes: a part of a word
  static constant constexpr uint kBits = Size * 8, kPerWord = 4 / Size;
  typedef metal::conditional_t<Size == 1, uchar, ushort> Bits;
  template <typename T>
  static void set(thread uint4& chunk, uint k, T v) {
    const uint word = k / kPerWord, shift = k % kPerWord * kBits;
    chunk[word] = (chunk[word] & ~(((1u << kBits) - 1) << shift)) | uint(as_type<Bits>(v)) << shift;
  }
  template <typename T>
  static T get(uint4 chunk, uint k) {
    return as_type<T>(Bits(chunk[k / kPerWord] >> (k % kPerWord * kBits)));
  }
};
template <>
struct Chunk<4> {
  template <typename T>
  static void set(thread uint4& chunk, uint k, T v) {
    chunk[k] = as_type<uint>(v);
  }
  template <typename T>
  static T get(uint4 chunk, uint k) {
    return as_type<T>(chunk[k]);
  }
};
template <>
struct Chunk<8> {
  template <typename T>
  static void set(thread uint4& chunk, uint k, T v) {
    const uint2 w = as_type<uint2>(v);
    chunk[2 * k] = w.x;
    chunk[2 * k + 1] = w.y;
  }
  template <typename T>
  static T get(uint4 chunk, uint k) {
    return as_type<T>(uint2(chunk[2 * k], chunk[2 * k + 1]));
  }
};
template <>
struct Chunk<16> {
  template <typename T>
  static void set(thread uint4& chunk, uint, T v) {
    chunk = as_type<uint4>(v);
  }
  template <typename T>
  static T get(uint4 chunk, uint) {
    return as_type<T>(chunk);
  }
};

// Each thread writes 16 bytes of the output in memory order (aligned where
// the output is, whatever its row length), across rows where its chunk
// does.
template <typename T, uint Mode>
kernel void pad_forward(device const T* src [[buffer(0)]], device T* out [[buffer(1)]],
                        constant PadParams& p [[buffer(2)]], uint t [[thread_position_in_grid]]) {
  constexpr uint kPer = 16 / sizeof(T);
  if (t >= p.threads) return;
  const uint last = p.dims - 1, width_out = p.out_size[last];
  const ulong first = ulong(t) * kPer;
  const uint count = uint(min(ulong(kPer), p.out_numel - first));
  // 64-bit division only where the output's offsets need it: it is many instructions on the GPU.
  uint row, col;
  if (p.out_numel <= ulong(0xffffffffu)) {
    row = uint(first) / width_out;
    col = uint(first) % width_out;
  } else {
    row = uint(first / width_out);
    col = uint(first % width_out);
  }
  RowSource r = row_source<Mode>(p, row);
  const int width = int(p.in_size[last]), before = p.before[last], start = int(col) - before;
  uint4 chunk = uint4(0);  // the elements, gathered where a 16-byte store can take them
  bool loaded = p.src_vectorized && count == kPer && col + kPer <= width_out && r.inside && start >= 0 &&
                start + int(kPer) <= width;
  if (loaded) loaded = load_run(src + r.base, start, width, chunk);
  if (!loaded) {
    const T fill = *reinterpret_cast<constant const T*>(p.fill);
    MPS_EXT_UNROLL
    for (uint k = 0; k < kPer; ++k, ++col) {
      if (k < count && col == width_out) {
        col = 0;
        r = row_source<Mode>(p, ++row);
      }
      int i;
      const bool has = k < count && r.inside && source_index<Mode>(int(col), width, before, i);
      Chunk<sizeof(T)>::set(chunk, k, has ? src[r.base + ulong(i) * p.src_stride[last]] : fill);
    }
  }
  device T* dst = out + first;
  if (p.out_vectorized && count == kPer) {
    *reinterpret_cast<device uint4*>(dst) = chunk;
    return;
  }
  MPS_EXT_UNROLL
  for (uint k = 0; k < kPer; ++k)
    if (k < count) dst[k] = Chunk<sizeof(T)>::template get<T>(chunk, k);
}

// The output positions [start, start + count) along a dimension that read
// input index i: its own, and (reflect) its mirror image in each border or
// (replicate) each border it repeats; count 0 where there is none.
struct Sources {
  int start[3];
  int count[3];
};

template <uint Mode>
inline Sources sources_of(int i, int size, int before, int out) {
  Sources s;
  const int own = i + before;
  s.start[1] = own;
  s.count[1] = own >= 0 && own < out ? 1 : 0;
  if (Mode == mps_ext::kPadReflect) {
    const int left = before - i, right = 2 * (size - 1) + before - i;
    s.start[0] = left;
    s.count[0] = i > 0 && left >= 0 && left < before ? 1 : 0;
    s.start[2] = right;
    s.count[2] = i < size - 1 && right >= size + before && right < out ? 1 : 0;
  } else {
    const int left_end = min(before, out), right_start = max(size + before, 0);
    s.start[0] = 0;
    s.count[0] = i == 0 ? max(left_end, 0) : 0;
    s.start[2] = right_start;
    s.count[2] = i == size - 1 ? max(out - right_start, 0) : 0;
  }
  return s;
}

// Element e (in memory order) of the input's gradient: the sum of every
// output position that reads it, every combination of its dimensions'
// sources, the last dimension fastest.
template <typename T, uint Mode, typename Acc>
inline Acc gathered(device const T* grad_out, constant PadParams& p, uint e) {
  Sources sources[mps_ext::kPadMaxDims];
  uint range[mps_ext::kPadMaxDims], step[mps_ext::kPadMaxDims];
  bool any = true;
  for (uint d = p.dims; d-- > 0;) {
    sources[d] = sources_of<Mode>(int(e % p.in_size[d]), int(p.in_size[d]), p.before[d], int(p.out_size[d]));
    e /= p.in_size[d];
    range[d] = 0;
    while (range[d] < 2 && sources[d].count[range[d]] == 0) ++range[d];
    step[d] = 0;
    any = any && sources[d].count[range[d]] > 0;
  }
  Acc sum = Acc(0.0f);  // torch adds into zeros: a gradient of -0 gives +0
  while (any) {
    ulong offset = 0;
    for (uint d = 0; d < p.dims; ++d)
      offset += ulong(sources[d].start[range[d]] + int(step[d])) * p.src_stride[d];
    sum += Acc(grad_out[offset]);
    // The next combination: the last dimension's next position, next range, else back to its first
    // range and on to the dimension before it; past the first dimension, done.
    uint d = p.dims;
    while (d-- > 0) {
      if (++step[d] < uint(sources[d].count[range[d]])) break;
      step[d] = 0;
      do ++range[d]; while (range[d] < 3 && sources[d].count[range[d]] == 0);
      if (range[d] < 3) break;
      range[d] = 0;
      while (sources[d].count[range[d]] == 0) ++range[d];
    }
    any = d < p.dims;
  }
  return sum;
}

// Whether input index i along a dimension is read by its own output
// position alone (away from every border).
template <uint Mode>
inline bool own_only(int i, int size, int before, int out) {
  const Sources s = sources_of<Mode>(i, size, before, out);
  return s.count[0] == 0 && s.count[1] == 1 && s.count[2] == 0;
}

// Each thread writes 16 bytes of the input's gradient in memory order. Most
// chunks lie away from every border: each of their elements is its own
// output position's gradient, a run of the output's row that one aligned
// load, or two shifted into place, reads. Chunks at a border (or across
// rows) gather element by element.
template <typename T, uint Mode>
kernel void pad_backward(device const T* grad_out [[buffer(0)]], device T* grad_in [[buffer(1)]],
                         constant PadParams& p [[buffer(2)]], uint t [[thread_position_in_grid]]) {
  constexpr uint kPer = 16 / sizeof(T);
  if (t >= p.threads) return;
  typedef metal::conditional_t<metal::is_same<T, float2>::value, float2, float> Acc;  // complex64: (re, im)
  const uint last = p.dims - 1, width = p.in_size[last];
  const uint first = t * kPer, count = min(kPer, uint(p.out_numel) - first);
  const uint col = first % width;
  bool fast = p.src_vectorized && count == kPer && col + kPer <= width;
  // The output row of the chunk's own positions (the dimensions before the last, each away from its borders).
  ulong row_start = 0;
  for (uint d = last, r = first / width; fast && d-- > 0;) {
    const int i = int(r % p.in_size[d]);
    r /= p.in_size[d];
    fast = own_only<Mode>(i, int(p.in_size[d]), p.before[d], int(p.out_size[d]));
    row_start += ulong(i + p.before[d]) * p.src_stride[d];
  }
  MPS_EXT_UNROLL
  for (uint k = 0; k < kPer; ++k)
    fast = fast && own_only<Mode>(int(col + k), int(width), p.before[last], int(p.out_size[last]));
  uint4 chunk = uint4(0);
  if (fast) {
    const ulong own = row_start + ulong(int(col) + p.before[last]), lo = own & ~ulong(kPer - 1);
    device const uint4* at = reinterpret_cast<device const uint4*>(grad_out + lo);
    if (own == lo) {
      chunk = at[0];
    } else if (lo + 2 * kPer <= row_start + p.out_size[last]) {
      chunk = shifted(at[0], at[1], uint(own - lo) * sizeof(T));
    } else {
      fast = false;
    }
  }
  MPS_EXT_UNROLL
  for (uint k = 0; k < kPer; ++k) {
    if (k >= count) continue;
    const Acc g = fast ? Acc(0.0f) + Acc(Chunk<sizeof(T)>::template get<T>(chunk, k))
                       : gathered<T, Mode, Acc>(grad_out, p, first + k);
    Chunk<sizeof(T)>::set(chunk, k, T(g));
  }
  device T* dst = grad_in + first;
  if (p.out_vectorized && count == kPer) {
    *reinterpret_cast<device uint4*>(dst) = chunk;
    return;
  }
  MPS_EXT_UNROLL
  for (uint k = 0; k < kPer; ++k)
    if (k < count) dst[k] = Chunk<sizeof(T)>::template get<T>(chunk, k);
}

// pad_{constant,reflect,replicate}_<element type of that size>,
// pad_backward_{reflect,replicate}_<type> (csrc/ops/pad.cpp names them from
// the same parts).
#define MPS_EXT_PAD_FORWARD(mode, Mode, T)                                                                     \
  template [[host_name("pad_" #mode "_" #T)]] [[kernel]] decltype(pad_forward<T, Mode>) pad_forward<T, Mode>;

#define MPS_EXT_PAD_FORWARDS(T)                               \
  MPS_EXT_PAD_FORWARD(constant, mps_ext::kPadConstant, T)     \
  MPS_EXT_PAD_FORWARD(reflect, mps_ext::kPadReflect, T)       \
  MPS_EXT_PAD_FORWARD(replicate, mps_ext::kPadReplicate, T)

MPS_EXT_PAD_FORWARDS(uchar)
MPS_EXT_PAD_FORWARDS(ushort)
MPS_EXT_PAD_FORWARDS(uint)
MPS_EXT_PAD_FORWARDS(ulong)
MPS_EXT_PAD_FORWARDS(uint4)

#define MPS_EXT_PAD_BACKWARD(mode, Mode, T)                                                                    \
  template [[host_name("pad_backward_" #mode "_" #T)]] [[kernel]] decltype(pad_backward<T, Mode>)              \
      pad_backward<T, Mode>;

#define MPS_EXT_PAD_BACKWARDS(T)                              \
  MPS_EXT_PAD_BACKWARD(reflect, mps_ext::kPadReflect, T)      \
  MPS_EXT_PAD_BACKWARD(replicate, mps_ext::kPadReplicate, T)

MPS_EXT_PAD_BACKWARDS(float)
MPS_EXT_PAD_BACKWARDS(half)
MPS_EXT_PAD_BACKWARDS(bfloat)
MPS_EXT_PAD_BACKWARDS(float2)
