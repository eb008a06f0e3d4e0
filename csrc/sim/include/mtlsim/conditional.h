// MSL's conditional operator on the shim's value types.
//
// half, bfloat, vectors and matrices are built in to MSL and classes here. C++'s
// `?:` between classes that convert both ways is ambiguous (`c ? h : 0`,
// `c ? h : 1.0f`), and an arm in another address space is another type
// (`c ? buf[i] : v`). The translator casts each arm of every conditional to
// cond_t<its type, the other arm's type>: where one of these value types is
// involved, the type MSL's usual arithmetic conversions give; a null pointer
// constant facing a pointer, that pointer type; otherwise the arm's own type
// (C++'s rules, which are MSL's for the built-in scalars and pointers).
#pragma once

#include "matrix_types.h"

namespace mtlsim::cond {

template <class T> struct tag { using type = T; };
template <class V> struct is_matrix : std::false_type {};
template <class T, int C, int R> struct is_matrix<metal::matrix<T, C, R>> : std::true_type {};
// The value an arm stands for: address space, cv and reference gone; swizzles and packed vectors as vec.
template <class X> using value_t = metal::__detail::value_t<X>;
template <class V> constexpr bool shim_value_v =
    metal::__detail::is_small_float_v<V> || metal::__detail::is_vec_like_v<V> || is_matrix<V>::value;

// Two scalars: a 16-bit float absorbs integers (and bool); anything else with it gives float.
template <class A, class B>
using scalar_common_t = std::conditional_t<std::is_integral_v<A>, B, std::conditional_t<std::is_integral_v<B>, A, float>>;

template <class X, class Y> constexpr auto pick() {
  using VX = value_t<X>;
  using VY = value_t<Y>;
  using RX = std::remove_reference_t<X>;
  using RY = std::remove_reference_t<Y>;
  if constexpr (std::is_same_v<X, Y>) return tag<X>{};
  else if constexpr (shim_value_v<VX> || shim_value_v<VY>) {
    if constexpr (std::is_same_v<VX, VY>) return tag<VX>{};
    else if constexpr (metal::__detail::is_num_v<VX> && metal::__detail::is_num_v<VY>) return tag<scalar_common_t<VX, VY>>{};
    else if constexpr (metal::__detail::is_vec_like_v<VX> && metal::__detail::is_num_v<VY>) return tag<VX>{};  // splat
    else if constexpr (metal::__detail::is_num_v<VX> && metal::__detail::is_vec_like_v<VY>) return tag<VY>{};
    else return tag<X>{};  // no common type in MSL either: C++ reports it
  } else if constexpr (std::is_integral_v<RX> && std::is_pointer_v<RY>) {
    return tag<std::remove_cv_t<RY>>{};  // `c ? p : 0`: the 0 is a null pointer constant
  } else {
    return tag<X>{};
  }
}

}  // namespace mtlsim::cond

namespace mtlsim {
// The type an arm of `c ? x : y` becomes (X: decltype((x)), Y: decltype((y))).
template <class X, class Y> using cond_t = typename decltype(cond::pick<X, Y>())::type;
}  // namespace mtlsim
