// Dropout as torch's native_dropout and native_dropout_backward compute it,
// each in one pass over memory:
//
// - forward (dropout_<type>): each thread takes four consecutive elements,
//   draws one Philox4x32-10 block for them (metal/include/mps_ext/philox.h:
//   counter (i / 4, offset), key seed; DropoutParams says how a word decides)
//   and writes the output and the keep mask (torch's bool, one byte per
//   element). The mask of element i depends on (seed, offset, i) alone.
// - backward (dropout_backward_<type>): grad * mask * scale.
//
// Both round as torch's CPU kernels do (input.mul(mask).mul_(scale)): in
// float, x * 1 or x * 0 (exact, NaN and infinities stay NaN where dropped,
// zeros keep their sign) times float(scale), rounded once to the type.
#include <metal_stdlib>

#include "mps_ext/params.h"
#include "mps_ext/philox.h"

using namespace metal;
using mps_ext::DropoutParams;

template <typename T>
inline T scaled(T x, bool keep, float scale) {
  return T(float(x) * (keep ? scale : 0.0f));
}

template <typename T>
kernel void dropout_forward(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                            device uchar* mask [[buffer(2)]], constant DropoutParams& p [[buffer(3)]],
                            uint group [[threadgroup_position_in_grid]], uint lane [[thread_position_in_threadgroup]],
                            uint width [[threads_per_threadgroup]]) {
  const ulong quad = ulong(group) * width + lane, first = quad * 4;
  if (first >= p.numel) return;
  const uint4 bits = mps_ext::philox4x32_10(uint4(uint(quad), uint(quad >> 32), uint(p.offset), uint(p.offset >> 32)),
                                            uint2(uint(p.seed), uint(p.seed >> 32)));
  const bool4 keep = bool4(ulong(bits.x) >= p.threshold, ulong(bits.y) >= p.threshold,
                           ulong(bits.z) >= p.threshold, ulong(bits.w) >= p.threshold);
  if (p.vectorized && first + 4 <= p.numel) {
    const vec<T, 4> v = *reinterpret_cast<device const vec<T, 4>*>(x + first);
    *reinterpret_cast<device vec<T, 4>*>(out + first) =
        vec<T, 4>(scaled(v.x, keep.x, p.scale), scaled(v.y, keep.y, p.scale), scaled(v.z, keep.z, p.scale),
                  scaled(v.w, keep.w, p.scale));
    *reinterpret_cast<device uchar4*>(mask + first) = uchar4(keep);
    return;
  }
  for (uint k = 0; k < 4 && first + k < p.numel; ++k) {
    out[first + k] = scaled(x[first + k], keep[k], p.scale);
    mask[first + k] = uchar(keep[k]);
  }
}

template <typename T>
kernel void dropout_backward(device const T* grad [[buffer(0)]], device const uchar* mask [[buffer(1)]],
                             device T* grad_input [[buffer(2)]], constant DropoutParams& p [[buffer(3)]],
                             uint group [[threadgroup_position_in_grid]],
                             uint lane [[thread_position_in_threadgroup]], uint width [[threads_per_threadgroup]]) {
  const ulong first = (ulong(group) * width + lane) * 4;
  if (first >= p.numel) return;
  if (p.vectorized && first + 4 <= p.numel) {
    const vec<T, 4> g = *reinterpret_cast<device const vec<T, 4>*>(grad + first);
    const uchar4 m = *reinterpret_cast<device const uchar4*>(mask + first);
    *reinterpret_cast<device vec<T, 4>*>(grad_input + first) =
        vec<T, 4>(scaled(g.x, m.x != 0, p.scale), scaled(g.y, m.y != 0, p.scale), scaled(g.z, m.z != 0, p.scale),
                  scaled(g.w, m.w != 0, p.scale));
    return;
  }
  for (uint k = 0; k < 4 && first + k < p.numel; ++k)
    grad_input[first + k] = scaled(grad[first + k], mask[first + k] != 0, p.scale);
}

// dropout_<type>, dropout_backward_<type> (csrc/ops/dropout.cpp names them
// from the same parts).
#define MPS_EXT_DROPOUT(T)                                                                                     \
  template [[host_name("dropout_" #T)]] [[kernel]] decltype(dropout_forward<T>) dropout_forward<T>;            \
  template [[host_name("dropout_backward_" #T)]] [[kernel]] decltype(dropout_backward<T>) dropout_backward<T>;

MPS_EXT_DROPOUT(float)
MPS_EXT_DROPOUT(half)
MPS_EXT_DROPOUT(bfloat)
