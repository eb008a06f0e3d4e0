// Padding: constant (F.pad's default, constant_pad_nd, negative pads crop),
// reflect and replicate, forward and backward, in any rank the host reduces
// to at most kPadMaxDims dimensions (csrc/ops/pad.cpp drops and merges the
// ones without padding: a 5-D video padded along time is (N*C, T, H*W)).
//
// - forward (pad_<mode>_<bytes>): moves elements as their bytes, so one
//   kernel per element size serves every dtype (bool and uint8 to
//   complex128). Each thread writes 16 bytes of an output row: one 16-byte
//   load and store where the chunk lies inside the input and both are
//   aligned (a frame padded along time, a row padded on the left by a
//   multiple of 16 bytes), element by element otherwise. Every output byte
//   is written once, every input byte read once (twice or three times in
//   reflected and replicated borders).
// - backward (pad_backward_<mode>_<type>): one thread per element of the
//   input's gradient gathers every output position that reads it (up to
//   three ranges per dimension: itself, and its mirror images or the border
//   it repeats), in a fixed order, in float: no atomics, the same bits every
//   run.
#include <metal_stdlib>

#include "mps_ext/params.h"

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

template <typename T, uint Mode>
kernel void pad_forward(device const T* src [[buffer(0)]], device T* out [[buffer(1)]],
                        constant PadParams& p [[buffer(2)]], uint t [[thread_position_in_grid]]) {
  constexpr uint kPer = 16 / sizeof(T);
  if (t >= p.threads) return;
  const uint last = p.dims - 1, row = t / p.chunks, first = t % p.chunks * kPer;
  // The row's offset in src; in constant mode, a row in the padding holds only the fill.
  ulong base = 0;
  bool inside = true;
  for (uint d = last, r = row; d-- > 0;) {
    int i;
    inside = source_index<Mode>(int(r % p.out_size[d]), int(p.in_size[d]), p.before[d], i) && inside;
    base += ulong(i) * p.src_stride[d];
    r /= p.out_size[d];
  }
  const T fill = *reinterpret_cast<constant const T*>(p.fill);
  const int width = int(p.in_size[last]), before = p.before[last];
  const uint count = min(kPer, p.out_size[last] - first);
  device T* dst = out + ulong(row) * p.out_size[last] + first;
  const int start = int(first) - before;  // the input index of the chunk's first element, inside the input
  if (p.src_vectorized && count == kPer && inside && start >= 0 && start + int(kPer) <= width) {
    const uint4 v = *reinterpret_cast<device const uint4*>(src + base + uint(start));
    if (p.out_vectorized) {
      *reinterpret_cast<device uint4*>(dst) = v;
      return;
    }
    const thread T* e = reinterpret_cast<const thread T*>(&v);
    for (uint k = 0; k < kPer; ++k) dst[k] = e[k];
    return;
  }
  uint4 chunk;  // the elements, gathered where a 16-byte store can take them
  thread T* values = reinterpret_cast<thread T*>(&chunk);
  for (uint k = 0; k < kPer; ++k) {
    int i;
    const bool has = k < count && inside && source_index<Mode>(int(first + k), width, before, i);
    values[k] = has ? src[base + ulong(i) * p.src_stride[last]] : fill;
  }
  if (p.out_vectorized && count == kPer) {
    *reinterpret_cast<device uint4*>(dst) = chunk;
    return;
  }
  for (uint k = 0; k < count; ++k) dst[k] = values[k];
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

template <typename T, uint Mode>
kernel void pad_backward(device const T* grad_out [[buffer(0)]], device T* grad_in [[buffer(1)]],
                         constant PadParams& p [[buffer(2)]], uint t [[thread_position_in_grid]]) {
  if (t >= p.threads) return;
  typedef metal::conditional_t<metal::is_same<T, float2>::value, float2, float> Acc;  // complex64: (re, im)
  // Most elements lie away from every border: read only by their own position, without the tables below
  // (which index by dimension, so they live in thread memory).
  bool own_only = true;
  ulong own = 0;
  for (uint d = p.dims, r = t; d-- > 0;) {
    const Sources s = sources_of<Mode>(int(r % p.in_size[d]), int(p.in_size[d]), p.before[d], int(p.out_size[d]));
    r /= p.in_size[d];
    own_only = own_only && s.count[0] == 0 && s.count[1] == 1 && s.count[2] == 0;
    own += ulong(s.start[1]) * p.src_stride[d];
  }
  if (own_only) {
    grad_in[t] = T(Acc(0.0f) + Acc(grad_out[own]));  // as the sum below: torch adds into zeros
    return;
  }
  Sources sources[mps_ext::kPadMaxDims];
  uint range[mps_ext::kPadMaxDims], step[mps_ext::kPadMaxDims];
  bool any = true;
  for (uint d = p.dims, r = t; d-- > 0;) {
    sources[d] = sources_of<Mode>(int(r % p.in_size[d]), int(p.in_size[d]), p.before[d], int(p.out_size[d]));
    r /= p.in_size[d];
    range[d] = 0;
    while (range[d] < 2 && sources[d].count[range[d]] == 0) ++range[d];
    step[d] = 0;
    any = any && sources[d].count[range[d]] > 0;
  }
  // Every combination of the dimensions' sources, the last dimension fastest.
  Acc sum = Acc(0.0f);
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
  grad_in[t] = T(sum);
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
