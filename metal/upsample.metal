// Interpolation: nearest (torch's nearest and nearest-exact), linear
// (linear1d, bilinear2d, trilinear3d) and bicubic, forward and backward, in
// the dimensions of the written tensor's memory order (csrc/ops/upsample.cpp),
// so channels-last tensors are read and written as they lie.
//
// Source indices and weights are torch's CPU kernels' arithmetic, in float
// (nearest_idx and nearest_exact_idx or the generic kernel's helpers,
// area_pixel_compute_source_index, guard_index_and_lambda, the cubic
// convolution with A = -0.75 and its taps clamped into the input), from the
// scale the host computes as torch does (from the sizes, or from the op's
// scale where it is given).
//
// - forward (upsample_<mode>_<type>): one thread per output element. Nearest
//   moves the element as its bytes (one kernel per element size serves every
//   dtype torch's CPU kernel takes); linear and cubic sum their taps in
//   float, nested as torch's kernel nests them (the last dimension's taps
//   first, each sum then weighted by the dimension before).
// - backward (upsample_backward_<mode>_<type>): one thread per element of
//   the input's gradient gathers the output positions whose taps read it. An
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

template <typename T, uint Mode>
kernel void upsample_forward(device const T* src [[buffer(0)]], device T* out [[buffer(1)]],
                             constant UpsampleParams& p [[buffer(2)]], uint t [[thread_position_in_grid]]) {
  constexpr uint kTaps = Taps<Mode>::count;
  if (t >= p.threads) return;
  // Each interpolated dimension's taps as offsets in src, outermost dimension first.
  const uint levels = popcount(p.interpolated);
  ulong base = 0, offset[mps_ext::kUpsampleMaxInterpolated][kTaps];
  float weight[mps_ext::kUpsampleMaxInterpolated][kTaps];
  for (uint d = p.dims, r = t, level = levels; d-- > 0;) {
    const uint o = r % p.out_size[d];
    r /= p.out_size[d];
    if ((p.interpolated >> d & 1u) == 0) {
      base += ulong(o) * p.src_stride[d];
      continue;
    }
    --level;
    int index[kTaps];
    taps_of<Mode>(o, axis_of(p, d), index, weight[level]);
    for (uint j = 0; j < kTaps; ++j) offset[level][j] = ulong(index[j]) * p.src_stride[d];
  }
  if (kTaps == 1) {
    for (uint level = 0; level < levels; ++level) base += offset[level][0];
    out[t] = src[base];
    return;
  }
  // sum[level]: that dimension's taps so far, each weighted by its sum over the dimensions after it.
  uint tap[mps_ext::kUpsampleMaxInterpolated] = {0, 0, 0};
  float sum[mps_ext::kUpsampleMaxInterpolated] = {0.0f, 0.0f, 0.0f};
  const uint inner = levels - 1;
  for (;;) {
    ulong at = base;
    for (uint level = 0; level < levels; ++level) at += offset[level][tap[level]];
    sum[inner] += float(src[at]) * weight[inner][tap[inner]];
    uint level = inner;
    while (++tap[level] == kTaps) {
      if (level == 0) {
        out[t] = T(sum[0]);
        return;
      }
      tap[level] = 0;
      sum[level - 1] += sum[level] * weight[level - 1][tap[level - 1]];
      sum[level] = 0.0f;
      --level;
    }
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

// The weights of the taps of output index o that read input index i; returns how many there are.
template <uint Mode>
inline uint weights_reading(uint o, int i, Axis a, thread float* w) {
  constexpr uint kTaps = Taps<Mode>::count;
  int index[kTaps];
  float weight[kTaps];
  taps_of<Mode>(o, a, index, weight);
  uint n = 0;
  for (uint j = 0; j < kTaps; ++j)
    if (index[j] == i) w[n++] = weight[j];
  return n;
}

template <typename T, uint Mode>
kernel void upsample_backward(device const T* grad_out [[buffer(0)]], device T* grad_in [[buffer(1)]],
                              constant UpsampleParams& p [[buffer(2)]], uint t [[thread_position_in_grid]]) {
  constexpr uint kTaps = Taps<Mode>::count;
  constexpr uint kLevels = mps_ext::kUpsampleMaxInterpolated;
  if (t >= p.threads) return;
  // An output reads from its first tap to kTaps - 1 past it (cubic: from one before it to two past it), clamped
  // into the input: those reading input index i have their first tap in [i - below, i + above].
  const int below = kTaps == 4 ? 2 : kTaps == 2 ? 1 : 0, above = kTaps == 4 ? 1 : 0;
  const uint levels = popcount(p.interpolated);
  ulong base = 0;
  Axis axis[kLevels];
  int index[kLevels];
  uint first[kLevels], end[kLevels];
  bool any = true;
  for (uint d = p.dims, r = t, level = levels; d-- > 0;) {
    const uint i = r % p.in_size[d];
    r /= p.in_size[d];
    if ((p.interpolated >> d & 1u) == 0) {
      base += ulong(i) * p.src_stride[d];
      continue;
    }
    --level;
    axis[level] = axis_of(p, d);
    index[level] = int(i);
    first[level] = first_reading_from<Mode>(int(i) - below, axis[level]);
    end[level] = first_reading_from<Mode>(int(i) + above + 1, axis[level]);
    any = any && first[level] < end[level];
  }
  // Every output position in the ranges, the last dimension fastest; at each, every combination of its taps
  // that read this element, in the order torch's kernel adds them.
  uint o[kLevels], n[kLevels];
  float w[kLevels][kTaps];
  for (uint level = 0; any && level < levels; ++level) {
    o[level] = first[level];
    n[level] = weights_reading<Mode>(o[level], index[level], axis[level], w[level]);
  }
  float sum = 0.0f;
  while (any) {
    bool reads = true;
    ulong at = base;
    for (uint level = 0; level < levels; ++level) {
      at += ulong(o[level]) * axis[level].stride;
      reads = reads && n[level] > 0;
    }
    if (reads) {
      const float g = float(grad_out[at]);
      uint tap[kLevels] = {0, 0, 0};
      for (uint more = 1; more != 0;) {
        // torch's products: (w_d * w_h * w_w) * g for linear, (g * w_h) * w_w for cubic.
        float term = Mode == mps_ext::kUpsampleCubic ? g : 1.0f;
        for (uint level = 0; level < levels; ++level) term *= w[level][tap[level]];
        sum += Mode == mps_ext::kUpsampleCubic ? term : term * g;
        uint level = levels;
        while (level > 0 && ++tap[level - 1] == n[level - 1]) tap[--level] = 0;
        more = level;
      }
    }
    uint level = levels;
    while (level > 0 && ++o[level - 1] == end[level - 1]) {
      --level;
      o[level] = first[level];
    }
    any = level > 0;
    for (uint l = any ? level - 1 : levels; l < levels; ++l)
      n[l] = weights_reading<Mode>(o[l], index[l], axis[l], w[l]);
  }
  grad_in[t] = T(sum);
}

// upsample_{nearest,nearest_exact}_<element type of that size>,
// upsample_{linear,cubic}_<type>, upsample_backward_<mode>_<type>
// (csrc/ops/upsample.cpp names them from the same parts).
#define MPS_EXT_UPSAMPLE(mode, Mode, T)                                                                        \
  template [[host_name("upsample_" #mode "_" #T)]] [[kernel]] decltype(upsample_forward<T, Mode>)              \
      upsample_forward<T, Mode>;

MPS_EXT_UPSAMPLE(nearest, mps_ext::kUpsampleNearest, uchar)
MPS_EXT_UPSAMPLE(nearest, mps_ext::kUpsampleNearest, ushort)
MPS_EXT_UPSAMPLE(nearest, mps_ext::kUpsampleNearest, uint)
MPS_EXT_UPSAMPLE(nearest_exact, mps_ext::kUpsampleNearestExact, uchar)
MPS_EXT_UPSAMPLE(nearest_exact, mps_ext::kUpsampleNearestExact, ushort)
MPS_EXT_UPSAMPLE(nearest_exact, mps_ext::kUpsampleNearestExact, uint)

#define MPS_EXT_UPSAMPLE_BACKWARD(mode, Mode, T)                                                               \
  template [[host_name("upsample_backward_" #mode "_" #T)]] [[kernel]] decltype(upsample_backward<T, Mode>)    \
      upsample_backward<T, Mode>;

#define MPS_EXT_UPSAMPLE_TYPE(T)                                           \
  MPS_EXT_UPSAMPLE(linear, mps_ext::kUpsampleLinear, T)                    \
  MPS_EXT_UPSAMPLE(cubic, mps_ext::kUpsampleCubic, T)                      \
  MPS_EXT_UPSAMPLE_BACKWARD(nearest, mps_ext::kUpsampleNearest, T)         \
  MPS_EXT_UPSAMPLE_BACKWARD(nearest_exact, mps_ext::kUpsampleNearestExact, T) \
  MPS_EXT_UPSAMPLE_BACKWARD(linear, mps_ext::kUpsampleLinear, T)           \
  MPS_EXT_UPSAMPLE_BACKWARD(cubic, mps_ext::kUpsampleCubic, T)

MPS_EXT_UPSAMPLE_TYPE(float)
MPS_EXT_UPSAMPLE_TYPE(half)
MPS_EXT_UPSAMPLE_TYPE(bfloat)
