// MSL vector types: vec<T,N>, packed_vec<T,N>, swizzles, operators, type names.
#pragma once

#include <initializer_list>

#include "scalar.h"

namespace metal {

template <class T, int N> struct vec;
template <class V> struct packed;
template <class T, int N> using packed_vec = packed<vec<T, N>>;
template <class V, int... I> struct swizzle;
template <class T, int C, int R> struct matrix;

namespace __detail {

// What a value-like type stands for: swizzles and packed vectors act as the
// vec they convert to, scalars as one lane of themselves.
template <class X> struct vec_info {
  using value = X;
  using elem = X;
  static constexpr int lanes = 1;
  static constexpr bool is_vec = false;
};
template <class T, int N> struct vec_info<vec<T, N>> {
  using value = vec<T, N>;
  using elem = T;
  static constexpr int lanes = N;
  static constexpr bool is_vec = true;
};
template <class V> struct vec_info<packed<V>> : vec_info<V> {};
template <class V, int... I> struct vec_info<swizzle<V, I...>> : vec_info<V> {};

template <class X> using info = vec_info<mtlsim::value_type_t<X>>;
template <class X> using value_t = typename info<X>::value;
template <class X> using elem_t = typename info<X>::elem;
template <class X> constexpr int lanes_v = info<X>::lanes;
template <class X> constexpr bool is_vec_like_v = info<X>::is_vec;
template <class X, class E> using rebind_t = std::conditional_t<is_vec_like_v<X>, vec<E, lanes_v<X>>, E>;

// Lane i of a vector; a scalar is its own every lane.
template <class X> MTLSIM_HD constexpr decltype(auto) lane(X&& x, [[maybe_unused]] int i) {
  if constexpr (is_vec_like_v<X>) return x[i];
  else return (x);
}

// Components a constructor argument contributes (0: not usable).
template <class X>
constexpr int pieces_v = is_num_v<std::decay_t<X>> ? 1 : is_vec_like_v<X> ? lanes_v<X> : 0;

template <int I, class P, class... Ps> MTLSIM_HD constexpr auto piece(const P& p, const Ps&... ps) {
  if constexpr (I < lanes_v<P>) return lane(p, I);
  else return piece<I - lanes_v<P>>(ps...);
}

template <int... I> MTLSIM_HD constexpr int highest() { int m = 0; ((m = I > m ? I : m), ...); return m; }
template <int... I> MTLSIM_HD constexpr bool distinct() { return ((0 | ... | (1 << I)) == (... + (1 << I))); }

// Integer + - * wrap modulo 2^n as on the GPU; types narrower than int are
// widened to unsigned so that their products cannot overflow int either.
template <class T, bool = std::is_integral_v<T> && !std::is_same_v<T, bool>> struct wrapping { using type = T; };
template <class T> struct wrapping<T, true> {
  using type = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
};
template <class T> using wrap_t = typename wrapping<T>::type;

#define MTLSIM_OP_FUNCTOR(name, R, expr) \
  struct name { template <class T> MTLSIM_HD constexpr R operator()(T a, [[maybe_unused]] T b) const { return expr; } };
#define MTLSIM_SHIFT_MASK (wrap_t<T>(b) & (sizeof(T) * CHAR_BIT - 1))
MTLSIM_OP_FUNCTOR(add, T, T(wrap_t<T>(a) + wrap_t<T>(b)))
MTLSIM_OP_FUNCTOR(sub, T, T(wrap_t<T>(a) - wrap_t<T>(b)))
MTLSIM_OP_FUNCTOR(mul, T, T(wrap_t<T>(a) * wrap_t<T>(b)))
MTLSIM_OP_FUNCTOR(div, T, T(a / b))
MTLSIM_OP_FUNCTOR(mod, T, T(a % b))
MTLSIM_OP_FUNCTOR(bit_and, T, T(a & b))
MTLSIM_OP_FUNCTOR(bit_or, T, T(a | b))
MTLSIM_OP_FUNCTOR(bit_xor, T, T(a ^ b))
// Shift counts are taken modulo the lane width, as OpenCL/MSL GPUs do.
MTLSIM_OP_FUNCTOR(shl, T, T(wrap_t<T>(a) << MTLSIM_SHIFT_MASK))
MTLSIM_OP_FUNCTOR(shr, T, T(a >> MTLSIM_SHIFT_MASK))
MTLSIM_OP_FUNCTOR(eq, bool, a == b)
MTLSIM_OP_FUNCTOR(ne, bool, a != b)
MTLSIM_OP_FUNCTOR(lt, bool, a < b)
MTLSIM_OP_FUNCTOR(le, bool, a <= b)
MTLSIM_OP_FUNCTOR(gt, bool, a > b)
MTLSIM_OP_FUNCTOR(ge, bool, a >= b)
MTLSIM_OP_FUNCTOR(land, bool, bool(a) && bool(b))
MTLSIM_OP_FUNCTOR(lor, bool, bool(a) || bool(b))
MTLSIM_OP_FUNCTOR(neg, T, T(-wrap_t<T>(a)))
MTLSIM_OP_FUNCTOR(bit_not, T, T(~a))
MTLSIM_OP_FUNCTOR(lnot, bool, !a)
#undef MTLSIM_SHIFT_MASK
#undef MTLSIM_OP_FUNCTOR

struct elems_tag {};
struct splat_tag {};

// The lanes of a vector as one object, so that vec and packed copy them whole:
// the union around them has no copy assignment (see swizzle).
template <class T, int N> struct lane_array {
  T e[N];
  MTLSIM_HD constexpr T& operator[](int i) { return e[i]; }
  MTLSIM_HD constexpr const T& operator[](int i) const { return e[i]; }
};

template <class T, int N> struct storage;

// One scalar of a braced vector initializer (see vec).
template <class T> struct list_lane {
  T value;
  template <class S, std::enable_if_t<is_num_v<S>, int> = 0>
  MTLSIM_HD constexpr list_lane(const S& s) : value(T(s)) {}
};

}  // namespace __detail

template <class T, int N>
struct alignas(sizeof(T) * (N == 3 ? 4 : N)) vec : __detail::storage<T, N> {
  static_assert(N >= 2 && N <= 4, "MSL vectors have 2, 3 or 4 components");

  vec() = default;
  vec(const vec&) = default;
  MTLSIM_HD constexpr vec& operator=(const vec& v) {
    this->e = v.e;
    return *this;
  }
  template <class... U>
  MTLSIM_HD constexpr vec(__detail::elems_tag, const U&... u) : __detail::storage<T, N>{{{T(u)...}}} {}
  template <class S, std::enable_if_t<__detail::is_num_v<S>, int> = 0>
  MTLSIM_HD constexpr vec(const S& s) : vec(std::make_integer_sequence<int, N>{}, __detail::splat_tag{}, T(s)) {}
  template <class... S, std::enable_if_t<sizeof...(S) == N && (__detail::is_num_v<S> && ...), int> = 0>
  MTLSIM_HD constexpr vec(const S&... s) : __detail::storage<T, N>{{{T(s)...}}} {}
  // Scalars and vectors whose lanes add up to N, at least one of them a vector.
  template <class A, class B, class... C,
            std::enable_if_t<!(__detail::is_num_v<A> && __detail::is_num_v<B> && (__detail::is_num_v<C> && ...)) &&
                                 __detail::pieces_v<A> * __detail::pieces_v<B> * (1 * ... * __detail::pieces_v<C>) != 0 &&
                                 __detail::pieces_v<A> + __detail::pieces_v<B> + (0 + ... + __detail::pieces_v<C>) == N,
                             int> = 0>
  MTLSIM_HD constexpr vec(const A& a, const B& b, const C&... c)
      : vec(std::make_integer_sequence<int, N>{}, __detail::value_t<A>(a), __detail::value_t<B>(b), __detail::value_t<C>(c)...) {}
  template <class X, std::enable_if_t<__detail::is_vec_like_v<X> && __detail::lanes_v<X> == N &&
                                          !std::is_same_v<__detail::elem_t<X>, T>, int> = 0>
  MTLSIM_HD explicit constexpr vec(const X& x) : vec(std::make_integer_sequence<int, N>{}, __detail::value_t<X>(x)) {}
  // Braces with scalars only, as for clang's vector types: `uint4 v = {a, b, c}`
  // sets the lanes named and zeroes the rest (extra scalars are dropped here,
  // an error on the GPU).
  MTLSIM_HD constexpr vec(std::initializer_list<__detail::list_lane<T>> lanes) : __detail::storage<T, N>{} {
    int i = 0;
    for (const auto& lane : lanes) {
      if (i == N) break;
      this->e[i++] = lane.value;
    }
  }

  MTLSIM_HD constexpr T& operator[](int i) { return this->e[i]; }
  MTLSIM_HD constexpr const T& operator[](int i) const { return this->e[i]; }
  MTLSIM_SPACE_MEMBERS(vec)
  MTLSIM_SPACE_INDEX

 private:
  using bool_vec = vec<bool, N>;

  template <int... I, class... P>
  MTLSIM_HD constexpr vec(std::integer_sequence<int, I...>, const P&... p)
      : __detail::storage<T, N>{{{T(__detail::piece<I>(p...))...}}} {}
  template <int... I>
  MTLSIM_HD constexpr vec(std::integer_sequence<int, I...>, __detail::splat_tag, const T& s)
      : __detail::storage<T, N>{{{(void(I), s)...}}} {}

  template <class R, class F> MTLSIM_HD static constexpr R zip(const vec& a, const vec& b, F f) {
    R r{};
    for (int i = 0; i < N; ++i) r[i] = f(a[i], b[i]);
    return r;
  }

  // Hidden friends: found through vec, swizzle<vec,...> and packed<vec>, and
  // non-templates, so scalars broadcast and proxies convert on the way in.
#define MTLSIM_VEC_BINARY(op, F)                                                                        \
  friend MTLSIM_HD constexpr vec operator op(const vec& a, const vec& b) { return zip<vec>(a, b, __detail::F{}); } \
  friend MTLSIM_HD constexpr vec& operator op##=(vec& a, const vec& b) { return a = a op b; }
#define MTLSIM_VEC_PREDICATE(op, F) \
  friend MTLSIM_HD constexpr bool_vec operator op(const vec& a, const vec& b) { return zip<bool_vec>(a, b, __detail::F{}); }
#define MTLSIM_VEC_UNARY(op, R, F) \
  friend MTLSIM_HD constexpr R operator op(const vec& a) { return zip<R>(a, a, __detail::F{}); }
#define MTLSIM_VEC_STEP(op, compound)                                                  \
  friend MTLSIM_HD constexpr vec& operator op(vec& a) { return a compound vec(T(1)); } \
  friend MTLSIM_HD constexpr vec operator op(vec& a, int) { vec t = a; op a; return t; }

  MTLSIM_VEC_BINARY(+, add) MTLSIM_VEC_BINARY(-, sub) MTLSIM_VEC_BINARY(*, mul) MTLSIM_VEC_BINARY(/, div)
  MTLSIM_VEC_BINARY(%, mod) MTLSIM_VEC_BINARY(&, bit_and) MTLSIM_VEC_BINARY(|, bit_or)
  MTLSIM_VEC_BINARY(^, bit_xor) MTLSIM_VEC_BINARY(<<, shl) MTLSIM_VEC_BINARY(>>, shr)
  MTLSIM_VEC_PREDICATE(==, eq) MTLSIM_VEC_PREDICATE(!=, ne) MTLSIM_VEC_PREDICATE(<, lt)
  MTLSIM_VEC_PREDICATE(<=, le) MTLSIM_VEC_PREDICATE(>, gt) MTLSIM_VEC_PREDICATE(>=, ge)
  MTLSIM_VEC_PREDICATE(&&, land) MTLSIM_VEC_PREDICATE(||, lor)
  MTLSIM_VEC_UNARY(-, vec, neg) MTLSIM_VEC_UNARY(~, vec, bit_not) MTLSIM_VEC_UNARY(!, bool_vec, lnot)
  MTLSIM_VEC_STEP(++, +=) MTLSIM_VEC_STEP(--, -=)
  friend MTLSIM_HD constexpr vec operator+(const vec& a) { return a; }
#undef MTLSIM_VEC_BINARY
#undef MTLSIM_VEC_PREDICATE
#undef MTLSIM_VEC_UNARY
#undef MTLSIM_VEC_STEP
};

// A packed vector has the lanes of vec<T,N> without its padding or alignment.
// It is built like the vec (implicitly where that conversion is implicit), and
// arithmetic converts it to vec.
template <class V> struct packed : __detail::storage<__detail::elem_t<V>, __detail::lanes_v<V>> {
  packed() = default;
  packed(const packed&) = default;
  MTLSIM_HD constexpr packed& operator=(const packed& p) {
    this->e = p.e;
    return *this;
  }
  MTLSIM_HD constexpr packed(const V& v) : packed(std::make_integer_sequence<int, __detail::lanes_v<V>>{}, v) {}
  template <class X, std::enable_if_t<!std::is_same_v<X, V> && !std::is_same_v<X, packed> &&
                                          std::is_convertible_v<const X&, V>, int> = 0>
  MTLSIM_HD constexpr packed(const X& x) : packed(V(x)) {}
  template <class X, std::enable_if_t<!std::is_convertible_v<const X&, V> && std::is_constructible_v<V, const X&>, int> = 0>
  MTLSIM_HD explicit constexpr packed(const X& x) : packed(V(x)) {}
  template <class A, class B, class... C, std::enable_if_t<std::is_constructible_v<V, const A&, const B&, const C&...>, int> = 0>
  MTLSIM_HD constexpr packed(const A& a, const B& b, const C&... c) : packed(V(a, b, c...)) {}

  MTLSIM_HD constexpr auto& operator[](int i) { return this->e[i]; }
  MTLSIM_HD constexpr const auto& operator[](int i) const { return this->e[i]; }
  MTLSIM_HD constexpr operator V() const {
    V v{};
    for (int i = 0; i < __detail::lanes_v<V>; ++i) v[i] = this->e[i];
    return v;
  }
  MTLSIM_SPACE_MEMBERS(packed)
  MTLSIM_SPACE_CONVERSION(V)
  MTLSIM_SPACE_INDEX

 private:
  template <int... I>
  MTLSIM_HD constexpr packed(std::integer_sequence<int, I...>, const V& v)
      : __detail::storage<__detail::elem_t<V>, __detail::lanes_v<V>>{{{v[I]...}}} {}
};

// A view of some lanes of the enclosing vector: a union member whose array
// overlays lanes 0..highest. Each assignment reads the named lanes of its
// source, then writes those lanes and no others (`a.xz = a.zx` swaps). The copy
// assignment, which `a.xz = b.xz` picks, goes the same way (so `a.xx = b.xx` is
// rejected, as in MSL); an implicit one would copy b.y too.
//
// That leaves the union of swizzles without a copy assignment, so vec and
// packed define theirs (copying lane_array) and are not trivially copyable. Nor
// could they be: a trivial copy of a vector needs trivial copies of its
// members, and a trivial copy of xz carries y. They stay trivially
// default-constructible, copy-constructible and destructible, and
// standard-layout, their bytes being their lanes: memcpy of a vector works in
// practice (GCC's -Wclass-memaccess wants the destination cast to void*), and
// as_type uses it, as __builtin_bit_cast needs trivially copyable types.
template <class V, int... I> struct swizzle {
  using T = __detail::elem_t<V>;
  T e[__detail::highest<I...>() + 1];

  swizzle() = default;
  swizzle(const swizzle&) = default;
  MTLSIM_HD constexpr swizzle& operator=(const swizzle& s) { return *this = V(s); }
  MTLSIM_HD constexpr operator V() const { return V(__detail::elems_tag{}, e[I]...); }
  MTLSIM_HD constexpr swizzle& operator=(const V& v) {
    static_assert(__detail::distinct<I...>(), "a swizzle that repeats a lane cannot be assigned");
    int k = 0;
    ((e[I] = v[k++]), ...);
    return *this;
  }
  MTLSIM_SPACE_MEMBERS(swizzle)
  MTLSIM_SPACE_CONVERSION(V)
};

namespace __detail {
template <class P> struct is_proxy : std::false_type {};
template <class V> struct is_proxy<packed<V>> : std::true_type {};
template <class V, int... I> struct is_proxy<swizzle<V, I...>> : std::true_type {};
}  // namespace __detail

#define MTLSIM_PROXY_COMPOUND(op)                                                                                 \
  template <class P, class X, std::enable_if_t<__detail::is_proxy<P>::value && mtlsim::all_thread_v<X>, int> = 0> \
  MTLSIM_HD constexpr P& operator op##=(P& p, const X& x) { return p = __detail::value_t<P>(__detail::value_t<P>(p) op x); }
MTLSIM_PROXY_COMPOUND(+) MTLSIM_PROXY_COMPOUND(-) MTLSIM_PROXY_COMPOUND(*) MTLSIM_PROXY_COMPOUND(/)
MTLSIM_PROXY_COMPOUND(%) MTLSIM_PROXY_COMPOUND(&) MTLSIM_PROXY_COMPOUND(|) MTLSIM_PROXY_COMPOUND(^)
MTLSIM_PROXY_COMPOUND(<<) MTLSIM_PROXY_COMPOUND(>>)
#undef MTLSIM_PROXY_COMPOUND

// ------------------------------------------------------------- swizzle members
//
// Every 2-4 letter swizzle of both letter sets, as union members. A macro cannot
// re-enter its own expansion, so each nesting level of the index loop has its
// own copy.
#define MTLSIM_CAT(a, b) MTLSIM_CAT_(a, b)
#define MTLSIM_CAT_(a, b) a##b
#define MTLSIM_UNPAREN(...) __VA_ARGS__

#define MTLSIM_XYZW0 x
#define MTLSIM_XYZW1 y
#define MTLSIM_XYZW2 z
#define MTLSIM_XYZW3 w
#define MTLSIM_RGBA0 r
#define MTLSIM_RGBA1 g
#define MTLSIM_RGBA2 b
#define MTLSIM_RGBA3 a
#define MTLSIM_LETTER(S, i) MTLSIM_##S##i

#define MTLSIM_LOOP_A2(F, ...) F(__VA_ARGS__, 0) F(__VA_ARGS__, 1)
#define MTLSIM_LOOP_A3(F, ...) MTLSIM_LOOP_A2(F, __VA_ARGS__) F(__VA_ARGS__, 2)
#define MTLSIM_LOOP_A4(F, ...) MTLSIM_LOOP_A3(F, __VA_ARGS__) F(__VA_ARGS__, 3)
#define MTLSIM_LOOP_B2(F, ...) F(__VA_ARGS__, 0) F(__VA_ARGS__, 1)
#define MTLSIM_LOOP_B3(F, ...) MTLSIM_LOOP_B2(F, __VA_ARGS__) F(__VA_ARGS__, 2)
#define MTLSIM_LOOP_B4(F, ...) MTLSIM_LOOP_B3(F, __VA_ARGS__) F(__VA_ARGS__, 3)
#define MTLSIM_LOOP_C2(F, ...) F(__VA_ARGS__, 0) F(__VA_ARGS__, 1)
#define MTLSIM_LOOP_C3(F, ...) MTLSIM_LOOP_C2(F, __VA_ARGS__) F(__VA_ARGS__, 2)
#define MTLSIM_LOOP_C4(F, ...) MTLSIM_LOOP_C3(F, __VA_ARGS__) F(__VA_ARGS__, 3)
#define MTLSIM_LOOP_D2(F, ...) F(__VA_ARGS__, 0) F(__VA_ARGS__, 1)
#define MTLSIM_LOOP_D3(F, ...) MTLSIM_LOOP_D2(F, __VA_ARGS__) F(__VA_ARGS__, 2)
#define MTLSIM_LOOP_D4(F, ...) MTLSIM_LOOP_D3(F, __VA_ARGS__) F(__VA_ARGS__, 3)

#define MTLSIM_SWIZZLE2(S, i, j) \
  swizzle<vec<T, 2>, i, j> MTLSIM_CAT(MTLSIM_LETTER(S, i), MTLSIM_LETTER(S, j));
#define MTLSIM_SWIZZLE3(S, i, j, k) \
  swizzle<vec<T, 3>, i, j, k> MTLSIM_CAT(MTLSIM_CAT(MTLSIM_LETTER(S, i), MTLSIM_LETTER(S, j)), MTLSIM_LETTER(S, k));
#define MTLSIM_SWIZZLE4(S, i, j, k, l)                                                            \
  swizzle<vec<T, 4>, i, j, k, l> MTLSIM_CAT(MTLSIM_CAT(MTLSIM_LETTER(S, i), MTLSIM_LETTER(S, j)), \
                                            MTLSIM_CAT(MTLSIM_LETTER(S, k), MTLSIM_LETTER(S, l)));
#define MTLSIM_SWIZZLES_2A(N, S, i) MTLSIM_LOOP_B##N(MTLSIM_SWIZZLE2, S, i)
#define MTLSIM_SWIZZLES_3A(N, S, i) MTLSIM_LOOP_B##N(MTLSIM_SWIZZLES_3B, N, S, i)
#define MTLSIM_SWIZZLES_3B(N, S, i, j) MTLSIM_LOOP_C##N(MTLSIM_SWIZZLE3, S, i, j)
#define MTLSIM_SWIZZLES_4A(N, S, i) MTLSIM_LOOP_B##N(MTLSIM_SWIZZLES_4B, N, S, i)
#define MTLSIM_SWIZZLES_4B(N, S, i, j) MTLSIM_LOOP_C##N(MTLSIM_SWIZZLES_4C, N, S, i, j)
#define MTLSIM_SWIZZLES_4C(N, S, i, j, k) MTLSIM_LOOP_D##N(MTLSIM_SWIZZLE4, S, i, j, k)
#define MTLSIM_SWIZZLES(N)                    \
  MTLSIM_LOOP_A##N(MTLSIM_SWIZZLES_2A, N, XYZW) \
  MTLSIM_LOOP_A##N(MTLSIM_SWIZZLES_3A, N, XYZW) \
  MTLSIM_LOOP_A##N(MTLSIM_SWIZZLES_4A, N, XYZW) \
  MTLSIM_LOOP_A##N(MTLSIM_SWIZZLES_2A, N, RGBA) \
  MTLSIM_LOOP_A##N(MTLSIM_SWIZZLES_3A, N, RGBA) \
  MTLSIM_LOOP_A##N(MTLSIM_SWIZZLES_4A, N, RGBA)

#define MTLSIM_STORAGE(N, xyzw, rgba)       \
  template <class T> struct storage<T, N> { \
    union {                                 \
      lane_array<T, N> e;                   \
      abi_member<sizeof(T) * N> _abi;       \
      struct { T MTLSIM_UNPAREN xyzw; };    \
      struct { T MTLSIM_UNPAREN rgba; };    \
      MTLSIM_SWIZZLES(N)                    \
    };                                      \
  };
namespace __detail {
// GCC's x86-64 ABI code classifies a by-value aggregate member by member, so the
// ~1000 swizzles would make each call passing or returning a vector cost
// milliseconds of compile time. A misaligned member right after the lanes makes
// it stop there and pass the vector in memory. (2-byte vectors have no room for
// one, but also few swizzles.)
struct __attribute__((packed)) misaligned { char c; uint16_t s; };
template <size_t Bytes> using abi_member = std::conditional_t<(Bytes > 2), misaligned, char>;

MTLSIM_STORAGE(2, (x, y), (r, g))
MTLSIM_STORAGE(3, (x, y, z), (r, g, b))
MTLSIM_STORAGE(4, (x, y, z, w), (r, g, b, a))
}  // namespace __detail

// ------------------------------------------------------ values in address spaces
#if defined(MTLSIM_ADDRESS_SPACES)
// Operators on half, bfloat, vectors and swizzles in device, constant or
// threadgroup memory: the operands as thread-space references (a copy, in
// MSL terms), then the usual operator.
namespace __detail {
template <class X> struct is_value_class : std::false_type {};
template <class F> struct is_value_class<small_float<F>> : std::true_type {};
template <class T, int N> struct is_value_class<vec<T, N>> : std::true_type {};
template <class V> struct is_value_class<packed<V>> : std::true_type {};
template <class V, int... I> struct is_value_class<swizzle<V, I...>> : std::true_type {};
template <class T, int C, int R> struct is_value_class<matrix<T, C, R>> : std::true_type {};
template <class X> constexpr bool spaced_value_v = mtlsim::in_space_v<X> && is_value_class<mtlsim::value_type_t<X>>::value;
// Operands of which one lives outside the thread space and one is a value
// class: `v * args.scale` with `args` in constant memory is MSL too.
template <class A, class B>
constexpr bool spaced_operands_v = (mtlsim::in_space_v<A> || mtlsim::in_space_v<B>) &&
                                   (is_value_class<mtlsim::value_type_t<A>>::value ||
                                    is_value_class<mtlsim::value_type_t<B>>::value);
// An operand's value: a half or bfloat outside the thread space is read through its bits, which a
// constant expression may do (`static constexpr constant half two = one * 2`); the thread-space view
// of an address-space object is a cast no constant expression may contain.
template <class X>
MTLSIM_HD constexpr decltype(auto) operand(const X& x) {
  if constexpr (mtlsim::in_space_v<X> && is_small_float_v<mtlsim::value_type_t<X>>)
    return mtlsim::value_type_t<X>::from_bits(x.bits);
  else
    return mtlsim::as_generic(x);
}
}  // namespace __detail

#define MTLSIM_SPACE_BINARY(op)                                                                                \
  template <class A, class B, std::enable_if_t<__detail::spaced_operands_v<A, B>, int> = 0> \
  MTLSIM_HD constexpr auto operator op(const A& a, const B& b)                                                  \
      -> decltype(__detail::operand(a) op __detail::operand(b)) {                                           \
    return __detail::operand(a) op __detail::operand(b);                                                    \
  }
#define MTLSIM_SPACE_COMPOUND(op)                                                                              \
  template <class A, class B, std::enable_if_t<__detail::spaced_operands_v<A, B>, int> = 0> \
  MTLSIM_HD constexpr auto operator op(A& a, const B& b)                                                        \
      -> decltype(mtlsim::as_generic(a) op mtlsim::as_generic(b), a) {                                          \
    mtlsim::as_generic(a) op mtlsim::as_generic(b);                                                             \
    return a;                                                                                                   \
  }
#define MTLSIM_SPACE_UNARY(op)                                                                                 \
  template <class A, std::enable_if_t<__detail::spaced_value_v<A>, int> = 0>                                    \
  MTLSIM_HD constexpr auto operator op(const A& a) -> decltype(op mtlsim::as_generic(a)) {                     \
    return op mtlsim::as_generic(a);                                                                           \
  }
MTLSIM_SPACE_BINARY(+) MTLSIM_SPACE_BINARY(-) MTLSIM_SPACE_BINARY(*) MTLSIM_SPACE_BINARY(/)
MTLSIM_SPACE_BINARY(%) MTLSIM_SPACE_BINARY(&) MTLSIM_SPACE_BINARY(|) MTLSIM_SPACE_BINARY(^)
MTLSIM_SPACE_BINARY(<<) MTLSIM_SPACE_BINARY(>>) MTLSIM_SPACE_BINARY(==) MTLSIM_SPACE_BINARY(!=)
MTLSIM_SPACE_BINARY(<) MTLSIM_SPACE_BINARY(<=) MTLSIM_SPACE_BINARY(>) MTLSIM_SPACE_BINARY(>=)
MTLSIM_SPACE_BINARY(&&) MTLSIM_SPACE_BINARY(||)
MTLSIM_SPACE_COMPOUND(+=) MTLSIM_SPACE_COMPOUND(-=) MTLSIM_SPACE_COMPOUND(*=) MTLSIM_SPACE_COMPOUND(/=)
MTLSIM_SPACE_COMPOUND(%=) MTLSIM_SPACE_COMPOUND(&=) MTLSIM_SPACE_COMPOUND(|=) MTLSIM_SPACE_COMPOUND(^=)
MTLSIM_SPACE_COMPOUND(<<=) MTLSIM_SPACE_COMPOUND(>>=)
MTLSIM_SPACE_UNARY(-) MTLSIM_SPACE_UNARY(+) MTLSIM_SPACE_UNARY(~) MTLSIM_SPACE_UNARY(!)
#undef MTLSIM_SPACE_BINARY
#undef MTLSIM_SPACE_COMPOUND
#undef MTLSIM_SPACE_UNARY
#endif

// ------------------------------------------------------------------- traits/names

template <class T> struct is_vector : false_type {};
template <class T, int N> struct is_vector<vec<T, N>> : true_type {};
template <class T> inline constexpr bool is_vector_v = is_vector<T>::value;
template <class T> struct vec_elements : integral_constant<int, 1> {};
template <class T, int N> struct vec_elements<vec<T, N>> : integral_constant<int, N> {};
template <class T> inline constexpr int vec_elements_v = vec_elements<T>::value;

#define MTLSIM_VECTOR_SCALARS(X) \
  X(bool) X(char) X(uchar) X(short) X(ushort) X(int) X(uint) X(long) X(ulong) X(half) X(bfloat) X(float)
#define MTLSIM_PACKED_SCALARS(X) \
  X(char) X(uchar) X(short) X(ushort) X(int) X(uint) X(half) X(bfloat) X(float)
#define MTLSIM_VEC_NAMES(T) using T##2 = vec<T, 2>; using T##3 = vec<T, 3>; using T##4 = vec<T, 4>;
#define MTLSIM_PACKED_NAMES(T) \
  using packed_##T##2 = packed_vec<T, 2>; using packed_##T##3 = packed_vec<T, 3>; using packed_##T##4 = packed_vec<T, 4>;
MTLSIM_VECTOR_SCALARS(MTLSIM_VEC_NAMES)
MTLSIM_PACKED_SCALARS(MTLSIM_PACKED_NAMES)

}  // namespace metal

#define MTLSIM_GLOBAL_VEC_NAMES(T) using metal::T##2; using metal::T##3; using metal::T##4;
#define MTLSIM_GLOBAL_PACKED_NAMES(T) using metal::packed_##T##2; using metal::packed_##T##3; using metal::packed_##T##4;
MTLSIM_VECTOR_SCALARS(MTLSIM_GLOBAL_VEC_NAMES)
MTLSIM_PACKED_SCALARS(MTLSIM_GLOBAL_PACKED_NAMES)
