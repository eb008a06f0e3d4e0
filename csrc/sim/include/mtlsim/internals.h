// The metal_stdlib internals that shipped Metal code calls directly (MLX's
// bf16_math.h and atomic.h, behind `#pragma METAL internals : enable`): the
// __metal_* builtins under the public math and SIMD-group functions, the
// fast-math flags they take, and the _disjunction and remove_addrspace traits.
//
// __metal_NAME(x..., fast) is metal::NAME(x...): the simulator computes every
// function precisely, which fast math permits, so the flag is accepted and has
// no effect. The SIMD-group builtins pass their caller's position on, so
// reports name the .metal line of the call.
#pragma once

#include "mtlsim/math.h"
#include "mtlsim/simd.h"

#define __METAL_FAST_MATH__ true
#define __METAL_PRECISE_MATH__ false
#define __METAL_MAYBE_FAST_MATH__ __METAL_PRECISE_MATH__  // Apple's default: no -ffast-math

namespace metal {
template <class... B> using _disjunction = disjunction<B...>;
template <class T> struct remove_addrspace { using type = typename mtlsim::space_of<T>::generic; };
template <class T> using remove_addrspace_t = typename remove_addrspace<T>::type;
}  // namespace metal

#define MTLSIM_INTERNAL1(name) \
  template <class X> MTLSIM_INLINE auto __metal_##name(const X& x, bool = false) { return metal::name(x); }
#define MTLSIM_INTERNAL2(name)                                                    \
  template <class X, class Y> MTLSIM_INLINE auto __metal_##name(const X& x, const Y& y, bool = false) { \
    return metal::name(x, y);                                                     \
  }
#define MTLSIM_INTERNAL3(name)                                                                        \
  template <class X, class Y, class Z>                                                                \
  MTLSIM_INLINE auto __metal_##name(const X& x, const Y& y, const Z& z, bool = false) {               \
    return metal::name(x, y, z);                                                                      \
  }
#define MTLSIM_INTERNAL_FLOAT1(name, ...) MTLSIM_INTERNAL1(name)
#define MTLSIM_INTERNAL_FLOAT2(name, ...) MTLSIM_INTERNAL2(name)
#define MTLSIM_INTERNAL_FLOAT3(name, ...) MTLSIM_INTERNAL3(name)
MTLSIM_FLOAT_FN1(MTLSIM_INTERNAL_FLOAT1)
MTLSIM_FLOAT_FN2(MTLSIM_INTERNAL_FLOAT2)
MTLSIM_FLOAT_FN3(MTLSIM_INTERNAL_FLOAT3)
MTLSIM_INTERNAL2(nextafter)
#undef MTLSIM_INTERNAL_FLOAT1
#undef MTLSIM_INTERNAL_FLOAT2
#undef MTLSIM_INTERNAL_FLOAT3
#undef MTLSIM_INTERNAL1
#undef MTLSIM_INTERNAL2
#undef MTLSIM_INTERNAL3

template <class X, class K> MTLSIM_INLINE auto __metal_ldexp(const X& x, const K& k, bool = false) {
  return metal::ldexp(x, k);
}
template <class X, class E> MTLSIM_INLINE auto __metal_frexp(const X& x, E* exponent) {
  return metal::frexp(x, *exponent);
}

// The SIMD-group width, in the type of the argument.
template <class T> MTLSIM_INLINE T __metal_get_simdgroup_size(T) { return T(32); }

#define MTLSIM_INTERNAL_COLLECTIVE(name) \
  template <class T> T __metal_##name(T x, MTLSIM_CALLER) { return metal::name(x, mtlsim_file, mtlsim_line); }
// The bitwise reductions take floating-point scalars too (MLX's bfloat simd_xor
// calls them with float), and combine their bits.
#define MTLSIM_INTERNAL_BITWISE(name)                                                          \
  template <class T> T __metal_##name(T x, MTLSIM_CALLER) {                                    \
    if constexpr (std::is_integral_v<T>) {                                                     \
      return metal::name(x, mtlsim_file, mtlsim_line);                                         \
    } else {                                                                                   \
      using Bits = std::conditional_t<sizeof(T) == 2, ushort, uint>;                           \
      return metal::as_type<T>(metal::name(metal::as_type<Bits>(x), mtlsim_file, mtlsim_line)); \
    }                                                                                          \
  }
#define MTLSIM_INTERNAL_PERMUTE(name)                        \
  template <class T> T __metal_##name(T x, ushort lane, MTLSIM_CALLER) { \
    return metal::name(x, lane, mtlsim_file, mtlsim_line);   \
  }
#define MTLSIM_INTERNAL_FILL(name)                                                   \
  template <class T> T __metal_##name(T x, T fill, ushort delta, ushort modulo, MTLSIM_CALLER) { \
    return metal::name(x, fill, delta, modulo, mtlsim_file, mtlsim_line);           \
  }
MTLSIM_INTERNAL_COLLECTIVE(simd_sum)
MTLSIM_INTERNAL_COLLECTIVE(simd_product)
MTLSIM_INTERNAL_COLLECTIVE(simd_max)
MTLSIM_INTERNAL_COLLECTIVE(simd_min)
MTLSIM_INTERNAL_BITWISE(simd_and)
MTLSIM_INTERNAL_BITWISE(simd_or)
MTLSIM_INTERNAL_BITWISE(simd_xor)
MTLSIM_INTERNAL_COLLECTIVE(simd_prefix_inclusive_sum)
MTLSIM_INTERNAL_COLLECTIVE(simd_prefix_exclusive_sum)
MTLSIM_INTERNAL_COLLECTIVE(simd_prefix_inclusive_product)
MTLSIM_INTERNAL_COLLECTIVE(simd_prefix_exclusive_product)
MTLSIM_INTERNAL_PERMUTE(simd_shuffle)
MTLSIM_INTERNAL_PERMUTE(simd_broadcast)
MTLSIM_INTERNAL_PERMUTE(simd_shuffle_up)
MTLSIM_INTERNAL_PERMUTE(simd_shuffle_down)
MTLSIM_INTERNAL_PERMUTE(simd_shuffle_xor)
MTLSIM_INTERNAL_PERMUTE(simd_shuffle_rotate_up)
MTLSIM_INTERNAL_PERMUTE(simd_shuffle_rotate_down)
MTLSIM_INTERNAL_FILL(simd_shuffle_and_fill_up)
MTLSIM_INTERNAL_FILL(simd_shuffle_and_fill_down)
#undef MTLSIM_INTERNAL_COLLECTIVE
#undef MTLSIM_INTERNAL_BITWISE
#undef MTLSIM_INTERNAL_PERMUTE
#undef MTLSIM_INTERNAL_FILL
