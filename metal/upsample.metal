// Interpolation: nearest (torch's nearest and nearest-exact), linear
// (linear1d, bilinear2d, trilinear3d) and bicubic, forward and backward, one
// kernel per number of interpolated dimensions, so every tap table lives in
// registers.
//
// Source indices and weights are torch's CPU kernels' arithmetic, in float
// (nearest_idx and nearest_exact_idx or the generic kernel's helpers,
// area_pixel_compute_source_index, guard_index_and_lambda, the cubic
// convolution with A = -0.75 and its taps clamped into the input), from the
// scale the host computes as torch does (from the sizes, or from the op's
// scale where it is given).
//
// Each thread takes one position of the written tensor and kUpsampleRepeat
// channels there (nearest forward: below): the index arithmetic and the taps are the position's, the
// loads and stores the channels'. Neighbouring threads take neighbouring
// positions (channels first in memory: each load and store of a SIMD group
// is one run of a row) or neighbouring channel groups (channels last: each
// thread's channels lie side by side), as the host orders them.
//
// - forward (upsample_<mode>_<type>_<n>d): nearest moves the element as its
//   bytes (one kernel per element size serves every dtype torch's CPU kernel
//   takes), 16 bytes per thread: a run of channels (channels last) or of a
//   row (channels first), one load or gather and one store where aligned;
//   where every dimension repeats each element a power of two times
//   (upsample_repeat{,_pairs}_<type>_<n>d), a thread loads 16 bytes once
//   and stores them wherever they are copied;
//   linear and cubic sum their taps in float, nested as torch's
//   kernel nests them (the last dimension's taps first, each sum then
//   weighted by the dimension before).
// - backward (upsample_backward_<mode>_<type>_<n>d): each position of the
//   input's gradient gathers the output positions whose taps read it. An
//   output's first tap rises with its index, so along each dimension those
//   positions are the contiguous range whose first tap lies in a window
//   around the element (one index for nearest, two for linear, four for
//   cubic), found by binary search; each position adds its gradient times
//   the weights of its taps that read the element, in a fixed order, in
//   float: no atomics, the same bits every run.
#include <metal_stdlib>

#include "mps_ext/params.h"

using namespace metal;
using mps_ext::UpsampleParams;

template <uint Mode>
struct Taps {
  enum : uint { count = Mode == mps_ext::kUpsampleCubic ? 4 : Mode == mps_ext::kUpsampleLinear ? 2 : 1 };
};

// One interpolated dimension as the kernels index it.
struct Axis {
  ulong stride;  // src's
  uint in, out;
  float scale;
  bool align_corners, nearest_idx;
};

inline Axis axis_of(constant UpsampleParams& p, uint d) {
  Axis a;
  a.stride = p.src_stride[d];
  a.in = p.in_size[d];
  a.out = p.out_size[d];
  a.scale = p.scale[d];
  a.align_corners = p.align_corners != 0;
  a.nearest_idx = p.nearest_idx != 0;
  return a;
}

// Where output index o reads: its first tap (torch's input_index; cubic
// reads from one before it, which may lie below 0) and the distance t past
// it (torch's lambda).
struct Source {
  int first;
  float t;
};

template <uint Mode>
inline Source source_of(uint o, Axis a) {
  Source s;
  s.t = 0.0f;
  const int last = int(a.in) - 1;
  // area_pixel_compute_source_index without align_corners: torch's CPU kernels (built for AVX2, or by clang for
  // arm64) contract scale * (o + 0.5) - 0.5 into one fused multiply-add, so their indices and lambdas are fma's.
  const float centered = fma(a.scale, float(o) + 0.5f, -0.5f);
  if (Mode == mps_ext::kUpsampleNearest) {
    // nearest_idx copies where the sizes are equal and halves where the output is twice the input, whatever the
    // call's scale; the generic kernel's helper always multiplies.
    s.first = a.nearest_idx && a.out == a.in       ? int(o)
              : a.nearest_idx && a.out == 2 * a.in ? int(o >> 1)
                                                   : min(int(floor(float(o) * a.scale)), last);
    return s;
  }
  if (Mode == mps_ext::kUpsampleNearestExact) {
    // nearest_exact_idx rounds (o + 0.5) * scale once; the generic kernel's helper rounds the source index plus 0.5.
    s.first = min(int(floor(a.nearest_idx ? (float(o) + 0.5f) * a.scale : max(centered, 0.0f) + 0.5f)), last);
    return s;
  }
  if (Mode == mps_ext::kUpsampleLinear && a.in == a.out) {  // compute_source_index_and_lambda copies
    s.first = int(o);
    return s;
  }
  float real = a.align_corners ? a.scale * float(o) : centered;
  if (Mode == mps_ext::kUpsampleLinear) real = max(real, 0.0f);
  s.first = min(int(floor(real)), last);
  s.t = clamp(real - float(s.first), 0.0f, 1.0f);
  return s;
}

inline float cubic_near(float x) {  // torch's cubic_convolution1, |x| <= 1
  const float a = -0.75f;
  return ((a + 2.0f) * x - (a + 3.0f)) * x * x + 1.0f;
}

inline float cubic_far(float x) {  // torch's cubic_convolution2, 1 < |x| < 2
  const float a = -0.75f;
  return ((a * x - 5.0f * a) * x + 8.0f * a) * x - 4.0f * a;
}

// The input indices output index o reads and their weights.
template <uint Mode>
inline void taps_of(uint o, Axis a, thread int* index, thread float* weight) {
  const Source s = source_of<Mode>(o, a);
  const int last = int(a.in) - 1;
  if (Mode == mps_ext::kUpsampleLinear) {
    index[0] = s.first;
    index[1] = s.first + (a.in != a.out && s.first < last ? 1 : 0);
    weight[0] = 1.0f - s.t;
    weight[1] = s.t;
  } else if (Mode == mps_ext::kUpsampleCubic) {
    const float rest = 1.0f - s.t;
    weight[0] = cubic_far(s.t + 1.0f);
    weight[1] = cubic_near(s.t);
    weight[2] = cubic_near(rest);
    weight[3] = cubic_far(rest + 1.0f);
    for (int j = 0; j < 4; ++j) index[j] = clamp(s.first - 1 + j, 0, last);
  } else {
    index[0] = s.first;
    weight[0] = 1.0f;
  }
}

// Where a thread writes: its position along the spatial dimensions of the
// written tensor (sizes `size`), its batch index and first channel, and the
// offset of that element in the written tensor.
template <uint Levels>
struct Site {
  uint o[Levels];
  uint n, c, dst;
};

template <uint Levels>
inline Site<Levels> site_of(constant UpsampleParams& p, constant uint* size, uint t) {
  Site<Levels> s;
  uint group = 0;
  if (p.channels_inner) {
    group = t % p.channel_groups;
    t /= p.channel_groups;
  }
  s.o[Levels - 1] = t % p.spans * p.span;
  t /= p.spans;
  for (uint l = Levels - 1; l-- > 0;) {
    s.o[l] = t % size[l];
    t /= size[l];
  }
  if (!p.channels_inner) {
    group = t % p.channel_groups;
    t /= p.channel_groups;
  }
  s.n = t;
  s.c = group * p.repeat;
  s.dst = s.n * p.batch_dst_stride + s.c * p.channel_dst_stride;
  for (uint l = 0; l < Levels; ++l) s.dst += s.o[l] * p.dst_stride[l];
  return s;
}

// Each interpolated dimension's taps as offsets in src, and their weights.
template <uint Levels, uint Taps>
struct TapTable {
  ulong offset[Levels][Taps];
  float weight[Levels][Taps];
};

// The taps of dimensions Level.. summed at `at`: the last dimension's first,
// each sum weighted by the dimension before.
template <uint Level, uint Levels, uint Taps>
struct Interpolated {
  template <typename T>
  static float at(device const T* src, ulong at, thread const TapTable<Levels, Taps>& taps) {
    float sum = 0.0f;
    for (uint j = 0; j < Taps; ++j)
      sum += Interpolated<Level + 1, Levels, Taps>::at(src, at + taps.offset[Level][j], taps) * taps.weight[Level][j];
    return sum;
  }
};

template <uint Levels, uint Taps>
struct Interpolated<Levels, Levels, Taps> {
  template <typename T>
  static float at(device const T* src, ulong at, thread const TapTable<Levels, Taps>&) {
    return float(src[at]);
  }
};

// Nearest moves elements as they are: 16 bytes of channels (channels last)
// or of a row (channels first) per thread, as one store where aligned.
template <typename T, uint Mode, uint Levels>
kernel void upsample_nearest(device const T* src [[buffer(0)]], device T* out [[buffer(1)]],
                             constant UpsampleParams& p [[buffer(2)]], uint t [[thread_position_in_grid]]) {
  constexpr uint kPer = 16 / sizeof(T), last = Levels - 1;
  if (t >= p.threads) return;
  const Site<Levels> s = site_of<Levels>(p, p.out_size, t);
  ulong from = ulong(s.n) * p.batch_src_stride + ulong(s.c) * p.channel_src_stride;
  for (uint l = 0; l < last; ++l) from += ulong(source_of<Mode>(s.o[l], axis_of(p, l)).first) * p.src_stride[l];
  const Axis row = axis_of(p, last);
  if (p.span > 1) {
    uint4 chunk = uint4(0);  // the elements' bits, packed where a 16-byte store takes them
    const uint count = min(kPer, row.out - s.o[last]);
    const bool whole = p.vectorized && count == kPer;
    for (uint k = 0; k < kPer; ++k) {
      if (k >= count) break;
      const T v = src[from + ulong(source_of<Mode>(s.o[last] + k, row).first) * row.stride];
      if (whole) {
        chunk[k * sizeof(T) / 4] |= uint(v) << (k * sizeof(T) % 4 * 8);
      } else {
        out[s.dst + k * p.dst_stride[last]] = v;
      }
    }
    if (whole) *reinterpret_cast<device uint4*>(out + s.dst) = chunk;
    return;
  }
  from += ulong(source_of<Mode>(s.o[last], row).first) * row.stride;
  const uint count = min(p.repeat, p.channels - s.c);
  if (p.vectorized && count == kPer) {
    *reinterpret_cast<device uint4*>(out + s.dst) = *reinterpret_cast<device const uint4*>(src + from);
    return;
  }
  for (uint r = 0; r < count; ++r) out[s.dst + r * p.channel_dst_stride] = src[from + ulong(r) * p.channel_src_stride];
}

// Each element of x twice, x's first element first.
template <uint Size>
inline uint2 doubled(uint x);
template <>
inline uint2 doubled<1>(uint x) {
  const uint lo = (x & 0xffffu) | (x & 0xffffu) << 8, hi = (x >> 16) | (x >> 16) << 8;
  return uint2((lo & 0x00ff00ffu) * 0x101u, (hi & 0x00ff00ffu) * 0x101u);
}
template <>
inline uint2 doubled<2>(uint x) {
  return uint2((x & 0xffffu) * 0x10001u, (x >> 16) * 0x10001u);
}
template <>
inline uint2 doubled<4>(uint x) {
  return uint2(x, x);
}

// The 16 bytes a repeat thread stores: 16 bytes of src, or (Pairs) 8 bytes
// with each element twice, as a row doubled in length reads them.
template <typename T, bool Pairs>
inline uint4 repeated(device const T* at) {
  if (!Pairs) return *reinterpret_cast<device const uint4*>(at);
  const uint2 v = *reinterpret_cast<device const uint2*>(at);
  return uint4(doubled<sizeof(T)>(v.x), doubled<sizeof(T)>(v.y));
}

// Nearest where output index o reads o >> factor_shift along every
// dimension (2x: the VAE decoders' and UNets' upsampling), the host's
// aligned cases: each thread loads its 16 bytes of channels (channels last)
// or of a row (channels first; Pairs: 8 bytes, a row twice as long) once and
// stores them at every output position that copies them, so the input is
// read once and the index arithmetic is done once per load, not per element.
template <typename T, bool Pairs, uint Levels>
kernel void upsample_repeat(device const T* src [[buffer(0)]], device T* out [[buffer(1)]],
                            constant UpsampleParams& p [[buffer(2)]], uint t [[thread_position_in_grid]]) {
  if (t >= p.threads) return;
  const Site<Levels> s = site_of<Levels>(p, p.in_size, t);
  ulong from = ulong(s.n) * p.batch_src_stride + ulong(s.c) * p.channel_src_stride;
  uint to = s.n * p.batch_dst_stride + s.c * p.channel_dst_stride, copies_shift = 0;
  uint shift[Levels];  // the copies along each dimension; a doubled row's are inside the 16 bytes
  for (uint l = 0; l < Levels; ++l) {
    from += ulong(s.o[l]) * p.src_stride[l];
    to += (s.o[l] << p.factor_shift[l]) * p.dst_stride[l];
    shift[l] = Pairs && l == Levels - 1 ? 0 : p.factor_shift[l];
    copies_shift += shift[l];
  }
  const uint4 chunk = repeated<T, Pairs>(src + from);
  for (uint k = 0; k < 1u << copies_shift; ++k) {  // the last dimension's copies fastest
    uint at = to, rest = k;
    for (uint l = Levels; l-- > 0;) {
      at += (rest & ((1u << shift[l]) - 1)) * p.dst_stride[l];
      rest >>= shift[l];
    }
    *reinterpret_cast<device uint4*>(out + at) = chunk;
  }
}

// Linear and cubic: kUpsampleRepeat channels of one position per thread.
template <typename T, uint Mode, uint Levels>
kernel void upsample_forward(device const T* src [[buffer(0)]], device T* out [[buffer(1)]],
                             constant UpsampleParams& p [[buffer(2)]], uint t [[thread_position_in_grid]]) {
  constexpr uint kTaps = Taps<Mode>::count;
  if (t >= p.threads) return;
  const Site<Levels> s = site_of<Levels>(p, p.out_size, t);
  TapTable<Levels, kTaps> taps;
  for (uint l = 0; l < Levels; ++l) {
    int index[kTaps];
    taps_of<Mode>(s.o[l], axis_of(p, l), index, taps.weight[l]);
    for (uint j = 0; j < kTaps; ++j) taps.offset[l][j] = ulong(index[j]) * p.src_stride[l];
  }
  const ulong base = ulong(s.n) * p.batch_src_stride + ulong(s.c) * p.channel_src_stride;
  for (uint r = 0; r < mps_ext::kUpsampleRepeat && s.c + r < p.channels; ++r) {
    const ulong at = base + ulong(r) * p.channel_src_stride;
    out[s.dst + r * p.channel_dst_stride] = T(Interpolated<0, Levels, kTaps>::at(src, at, taps));
  }
}

// The first output index whose first tap is at least v (a.out if none).
template <uint Mode>
inline uint first_reading_from(int v, Axis a) {
  uint first = 0, count = a.out;
  while (count > 0) {
    const uint half = count / 2;
    if (source_of<Mode>(first + half, a).first < v) {
      first += half + 1;
      count -= half + 1;
    } else {
      count = half;
    }
  }
  return first;
}

// The weights of the taps of output index o, and which of them read input
// index i; returns whether any does.
template <uint Mode>
inline bool taps_reading(uint o, int i, Axis a, thread float* weight, thread bool* reads) {
  constexpr uint kTaps = Taps<Mode>::count;
  int index[kTaps];
  taps_of<Mode>(o, a, index, weight);
  bool any = false;
  for (uint j = 0; j < kTaps; ++j) {
    reads[j] = index[j] == i;
    any = any || reads[j];
  }
  return any;
}

// What the backward gathers for one element of the input's gradient: along
// each dimension the range of output positions that may read it, and at the
// position it is at, the weights of its taps and which of them read it.
template <uint Levels, uint Taps>
struct Gather {
  Axis axis[Levels];
  int index[Levels];
  uint first[Levels], end[Levels];
  float weight[Levels][Taps];
  bool reads[Levels][Taps];
};

// Every combination of the gathered taps of dimensions Level.., in the order
// torch's kernel adds them; `term` is the product so far.
template <uint Level, uint Levels, uint Taps, uint Mode>
struct Combinations {
  static void add(float term, float g, thread const Gather<Levels, Taps>& at, thread float& sum) {
    for (uint j = 0; j < Taps; ++j)
      if (at.reads[Level][j]) Combinations<Level + 1, Levels, Taps, Mode>::add(term * at.weight[Level][j], g, at, sum);
  }
};

template <uint Levels, uint Taps, uint Mode>
struct Combinations<Levels, Levels, Taps, Mode> {
  // torch's products: (w_d * w_h * w_w) * g for linear, (g * w_h) * w_w for cubic.
  static void add(float term, float g, thread const Gather<Levels, Taps>&, thread float& sum) {
    sum += Mode == mps_ext::kUpsampleCubic ? term : term * g;
  }
};

// The output positions of dimensions Level.. in their ranges, the last
// dimension fastest, from offset `at` in grad_out; sum[r] is channel r's.
template <uint Level, uint Levels, uint Taps, uint Mode>
struct Positions {
  template <typename T>
  static void add(device const T* grad_out, ulong at, constant UpsampleParams& p, uint channels,
                  thread Gather<Levels, Taps>& g, thread float* sum) {
    for (uint o = g.first[Level]; o < g.end[Level]; ++o) {
      if (taps_reading<Mode>(o, g.index[Level], g.axis[Level], g.weight[Level], g.reads[Level]))
        Positions<Level + 1, Levels, Taps, Mode>::add(grad_out, at + ulong(o) * g.axis[Level].stride, p, channels, g,
                                                      sum);
    }
  }
};

template <uint Levels, uint Taps, uint Mode>
struct Positions<Levels, Levels, Taps, Mode> {
  template <typename T>
  static void add(device const T* grad_out, ulong at, constant UpsampleParams& p, uint channels,
                  thread Gather<Levels, Taps>& g, thread float* sum) {
    for (uint r = 0; r < mps_ext::kUpsampleRepeat; ++r) {
      if (r >= channels) break;
      const float grad = float(grad_out[at + ulong(r) * p.channel_src_stride]);
      Combinations<0, Levels, Taps, Mode>::add(Mode == mps_ext::kUpsampleCubic ? grad : 1.0f, grad, g, sum[r]);
    }
  }
};

template <typename T, uint Mode, uint Levels>
kernel void upsample_backward(device const T* grad_out [[buffer(0)]], device T* grad_in [[buffer(1)]],
                              constant UpsampleParams& p [[buffer(2)]], uint t [[thread_position_in_grid]]) {
  constexpr uint kTaps = Taps<Mode>::count;
  if (t >= p.threads) return;
  const Site<Levels> s = site_of<Levels>(p, p.in_size, t);
  // An output reads from its first tap to kTaps - 1 past it (cubic: from one before it to two past it), clamped
  // into the input: those reading input index i have their first tap in [i - below, i + above].
  const int below = kTaps == 4 ? 2 : kTaps == 2 ? 1 : 0, above = kTaps == 4 ? 1 : 0;
  Gather<Levels, kTaps> g;
  for (uint l = 0; l < Levels; ++l) {
    g.axis[l] = axis_of(p, l);
    g.index[l] = int(s.o[l]);
    g.first[l] = first_reading_from<Mode>(int(s.o[l]) - below, g.axis[l]);
    g.end[l] = first_reading_from<Mode>(int(s.o[l]) + above + 1, g.axis[l]);
  }
  const uint channels = min(p.channels - s.c, uint(mps_ext::kUpsampleRepeat));  // the host's repeat backward
  float sum[mps_ext::kUpsampleRepeat] = {0.0f, 0.0f, 0.0f, 0.0f};
  Positions<0, Levels, kTaps, Mode>::add(grad_out, ulong(s.n) * p.batch_src_stride + ulong(s.c) * p.channel_src_stride,
                                         p, channels, g, sum);
  for (uint r = 0; r < mps_ext::kUpsampleRepeat; ++r)
    if (r < channels) grad_in[s.dst + r * p.channel_dst_stride] = T(sum[r]);
}

// upsample_{nearest,nearest_exact,repeat,repeat_pairs}_<element type of that size>_<n>d,
// upsample_{linear,cubic}_<type>_<n>d, upsample_backward_<mode>_<type>_<n>d
// (csrc/ops/upsample.cpp names them from the same parts).
#define MPS_EXT_UPSAMPLE_KERNEL(kernel, mode, Mode, T, n)                                   \
  template [[host_name("upsample_" #mode "_" #T "_" #n "d")]] [[kernel]] decltype(kernel<T, Mode, n>) \
      kernel<T, Mode, n>;
#define MPS_EXT_UPSAMPLE(mode, Mode, T, n) MPS_EXT_UPSAMPLE_KERNEL(upsample_forward, mode, Mode, T, n)

#define MPS_EXT_UPSAMPLE_BACKWARD(mode, Mode, T, n)                                        \
  template [[host_name("upsample_backward_" #mode "_" #T "_" #n "d")]] [[kernel]]          \
      decltype(upsample_backward<T, Mode, n>) upsample_backward<T, Mode, n>;

#define MPS_EXT_UPSAMPLE_NEAREST(T, n)                                                      \
  MPS_EXT_UPSAMPLE_KERNEL(upsample_nearest, nearest, mps_ext::kUpsampleNearest, T, n)       \
  MPS_EXT_UPSAMPLE_KERNEL(upsample_nearest, nearest_exact, mps_ext::kUpsampleNearestExact, T, n) \
  MPS_EXT_UPSAMPLE_KERNEL(upsample_repeat, repeat, false, T, n)                            \
  MPS_EXT_UPSAMPLE_KERNEL(upsample_repeat, repeat_pairs, true, T, n)

#define MPS_EXT_UPSAMPLE_BYTES(n)  \
  MPS_EXT_UPSAMPLE_NEAREST(uchar, n) \
  MPS_EXT_UPSAMPLE_NEAREST(ushort, n) \
  MPS_EXT_UPSAMPLE_NEAREST(uint, n)

MPS_EXT_UPSAMPLE_BYTES(1)
MPS_EXT_UPSAMPLE_BYTES(2)
MPS_EXT_UPSAMPLE_BYTES(3)

// Bicubic is 2-D only; its backward copies with the nearest kernel where no size changes.
#define MPS_EXT_UPSAMPLE_DIMS(T, n)                                                 \
  MPS_EXT_UPSAMPLE(linear, mps_ext::kUpsampleLinear, T, n)                          \
  MPS_EXT_UPSAMPLE_BACKWARD(nearest, mps_ext::kUpsampleNearest, T, n)               \
  MPS_EXT_UPSAMPLE_BACKWARD(nearest_exact, mps_ext::kUpsampleNearestExact, T, n)    \
  MPS_EXT_UPSAMPLE_BACKWARD(linear, mps_ext::kUpsampleLinear, T, n)

#define MPS_EXT_UPSAMPLE_TYPE(T)                          \
  MPS_EXT_UPSAMPLE_DIMS(T, 1)                             \
  MPS_EXT_UPSAMPLE_DIMS(T, 2)                             \
  MPS_EXT_UPSAMPLE_DIMS(T, 3)                             \
  MPS_EXT_UPSAMPLE(cubic, mps_ext::kUpsampleCubic, T, 2)  \
  MPS_EXT_UPSAMPLE_BACKWARD(cubic, mps_ext::kUpsampleCubic, T, 2)

MPS_EXT_UPSAMPLE_TYPE(float)
MPS_EXT_UPSAMPLE_TYPE(half)
MPS_EXT_UPSAMPLE_TYPE(bfloat)
