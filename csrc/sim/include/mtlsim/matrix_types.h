// MSL matrix types (<metal_matrix>): matrix<T, Cols, Rows> and floatCxR /
// halfCxR, stored column-major; m[c] is column c.
#pragma once

#include "math.h"

namespace metal {

namespace __detail {
template <class M, int C, int R> struct is_matrix_like : std::false_type {};
template <class T, int C, int R> struct is_matrix_like<matrix<T, C, R>, C, R> : std::true_type {};
}  // namespace __detail

template <class T, int C, int R>
struct matrix {
  static_assert(C >= 2 && C <= 4 && R >= 2 && R <= 4, "MSL matrices have 2 to 4 columns and rows");
  using column = vec<T, R>;
  __detail::lane_array<column, C> e;

  matrix() = default;
  // A matrix with s on the diagonal, zeros elsewhere.
  template <class S, std::enable_if_t<__detail::is_num_v<S>, int> = 0>
  explicit constexpr matrix(const S& s) : e{} {
    for (int i = 0; i < (C < R ? C : R); ++i) e[i][i] = T(s);
  }
  template <class... V, std::enable_if_t<sizeof...(V) == C && (std::is_same_v<__detail::value_t<V>, column> && ...), int> = 0>
  constexpr matrix(const V&... columns) : e{{column(columns)...}} {}
  // C * R scalars, column by column.
  template <class... S, std::enable_if_t<sizeof...(S) == C * R && (__detail::is_num_v<S> && ...), int> = 0>
  constexpr matrix(const S&... s) : e{} {
    const T v[] = {T(s)...};
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < R; ++r) e[c][r] = v[c * R + r];
  }
  // From a matrix of the same shape and another element type, in any address space.
  template <class M, std::enable_if_t<__detail::is_matrix_like<mtlsim::value_type_t<M>, C, R>::value &&
                                          !std::is_same_v<mtlsim::value_type_t<M>, matrix>, int> = 0>
  explicit constexpr matrix(const M& m) : e{} {
    for (int c = 0; c < C; ++c) e[c] = column(mtlsim::as_generic(m)[c]);
  }

  constexpr column& operator[](int c) { return e[c]; }
  constexpr const column& operator[](int c) const { return e[c]; }
  MTLSIM_SPACE_MEMBERS(matrix)
  MTLSIM_SPACE_INDEX

  friend constexpr matrix operator+(const matrix& a, const matrix& b) {
    matrix r;
    for (int c = 0; c < C; ++c) r.e[c] = a.e[c] + b.e[c];
    return r;
  }
  friend constexpr matrix operator-(const matrix& a, const matrix& b) {
    matrix r;
    for (int c = 0; c < C; ++c) r.e[c] = a.e[c] - b.e[c];
    return r;
  }
  friend constexpr matrix operator-(const matrix& a) { return matrix(T(0)) - a; }
  friend constexpr matrix& operator+=(matrix& a, const matrix& b) { return a = a + b; }
  friend constexpr matrix& operator-=(matrix& a, const matrix& b) { return a = a - b; }
};

namespace __detail {
template <class X> constexpr bool thread_num_v = is_num_v<X> && mtlsim::all_thread_v<X>;
template <class X, class V> constexpr bool thread_vec_v = std::is_same_v<value_t<X>, V> && mtlsim::all_thread_v<X>;
}  // namespace __detail

// matrix * column vector, row vector * matrix, matrix * matrix, and scaling.
template <class T, int C, int R, class V, std::enable_if_t<__detail::thread_vec_v<V, vec<T, C>>, int> = 0>
constexpr vec<T, R> operator*(const matrix<T, C, R>& m, const V& v) {
  const vec<T, C> x(v);
  vec<T, R> r = m[0] * x[0];
  for (int c = 1; c < C; ++c) r += m[c] * x[c];
  return r;
}
template <class T, int C, int R, class V, std::enable_if_t<__detail::thread_vec_v<V, vec<T, R>>, int> = 0>
constexpr vec<T, C> operator*(const V& v, const matrix<T, C, R>& m) {
  vec<T, C> r;
  for (int c = 0; c < C; ++c) r[c] = dot(vec<T, R>(v), m[c]);
  return r;
}
template <class T, int K, int R, int C>
constexpr matrix<T, C, R> operator*(const matrix<T, K, R>& a, const matrix<T, C, K>& b) {
  matrix<T, C, R> r;
  for (int c = 0; c < C; ++c) r[c] = a * b[c];
  return r;
}
template <class T, int C, int R, class S, std::enable_if_t<__detail::thread_num_v<S>, int> = 0>
constexpr matrix<T, C, R> operator*(const matrix<T, C, R>& m, const S& s) {
  matrix<T, C, R> r;
  for (int c = 0; c < C; ++c) r[c] = m[c] * T(s);
  return r;
}
template <class T, int C, int R, class S, std::enable_if_t<__detail::thread_num_v<S>, int> = 0>
constexpr matrix<T, C, R> operator*(const S& s, const matrix<T, C, R>& m) {
  return m * s;
}
template <class T, int C, int R, class X>
constexpr auto operator*=(matrix<T, C, R>& m, const X& x) -> decltype(m = m * x) {
  return m = m * x;
}

namespace __detail {
template <class T, int C, int R>
constexpr matrix<T, R, C> transpose(const matrix<T, C, R>& m) {
  matrix<T, R, C> t;
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) t[r][c] = m[c][r];
  return t;
}

// Cofactor expansion along the first column, in float.
template <class T, int N>
constexpr T determinant(const matrix<T, N, N>& m) {
  if constexpr (N == 2) {
    return T(float(m[0][0]) * float(m[1][1]) - float(m[1][0]) * float(m[0][1]));
  } else {
    float det = 0;
    for (int r = 0; r < N; ++r) {
      matrix<float, N - 1, N - 1> minor;
      for (int c = 1; c < N; ++c)
        for (int rr = 0, k = 0; rr < N; ++rr)
          if (rr != r) minor[c - 1][k++] = float(m[c][rr]);
      det += (r % 2 ? -1.0f : 1.0f) * float(m[0][r]) * float(determinant(minor));
    }
    return T(det);
  }
}

template <class M> struct is_matrix : std::false_type {};
template <class T, int C, int R> struct is_matrix<matrix<T, C, R>> : is_matrix_like<matrix<T, C, R>, C, R> {};
}  // namespace __detail

// Matrices in any address space.
template <class M, std::enable_if_t<__detail::is_matrix<mtlsim::value_type_t<M>>::value, int> = 0>
constexpr auto transpose(const M& m) { return __detail::transpose(mtlsim::as_generic(m)); }
template <class M, std::enable_if_t<__detail::is_matrix<mtlsim::value_type_t<M>>::value, int> = 0>
constexpr auto determinant(const M& m) { return __detail::determinant(mtlsim::as_generic(m)); }

#define MTLSIM_MATRIX_NAMES(T)                                                                       \
  using T##2x2 = matrix<T, 2, 2>; using T##2x3 = matrix<T, 2, 3>; using T##2x4 = matrix<T, 2, 4>;  \
  using T##3x2 = matrix<T, 3, 2>; using T##3x3 = matrix<T, 3, 3>; using T##3x4 = matrix<T, 3, 4>;  \
  using T##4x2 = matrix<T, 4, 2>; using T##4x3 = matrix<T, 4, 3>; using T##4x4 = matrix<T, 4, 4>;
MTLSIM_MATRIX_NAMES(float)
MTLSIM_MATRIX_NAMES(half)
#undef MTLSIM_MATRIX_NAMES

}  // namespace metal

#define MTLSIM_GLOBAL_MATRIX_NAMES(T)                                                          \
  using metal::T##2x2; using metal::T##2x3; using metal::T##2x4; using metal::T##3x2;          \
  using metal::T##3x3; using metal::T##3x4; using metal::T##4x2; using metal::T##4x3; using metal::T##4x4;
MTLSIM_GLOBAL_MATRIX_NAMES(float)
MTLSIM_GLOBAL_MATRIX_NAMES(half)
#undef MTLSIM_GLOBAL_MATRIX_NAMES
