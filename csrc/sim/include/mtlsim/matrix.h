// simdgroup_matrix<T, 8, 8>: an 8x8 matrix distributed over the 32 lanes of a
// SIMD group, two elements per lane, as on the GPU.
//
// Loads and stores touch only the calling lane's elements (like any other
// per-lane memory access, they need a barrier after other lanes' writes);
// multiplication is a collective that gathers the three operands from all lanes. Which elements a
// lane holds is not documented by Apple: lane_coord() below is the layout that
// public Apple-GPU kernels rely on through thread_elements(). It is the only
// place that encodes it, so kernels that never call thread_elements() are
// correct here whatever the real layout is.
#pragma once

#include "mtlsim/simd.h"

namespace mtlsim::matrix {

struct Coord {
  uint32_t row, col;  // the lane holds (row, col) and (row, col + 1)
};

inline Coord lane_coord(uint32_t lane) {
  const uint32_t quad = lane / 4;
  return Coord{(quad & 4) + (lane / 2) % 4, (quad & 2) * 2 + (lane % 2) * 2};
}

template <class TD, class TA, class TB, class TC>
struct Operands {
  metal::vec<TA, 2> a;
  metal::vec<TB, 2> b;
  metal::vec<TC, 2> c;
};

// D = A * B + C with float accumulation; lanes outside `mask` contribute zeros
// (the result is undefined on the GPU; divergence is reported by the runtime).
template <class TD, class TA, class TB, class TC>
struct MultiplyAccumulate {
  static void apply(const Operands<TD, TA, TB, TC>* const* in, metal::vec<TD, 2>* const* out, uint32_t mask) {
    float a[8][8] = {}, b[8][8] = {}, c[8][8] = {};
    for (uint32_t lane = 0; lane < kSimdWidth; ++lane) {
      if (!simd::active(mask, lane)) continue;
      const Coord p = lane_coord(lane);
      for (uint32_t k = 0; k < 2; ++k) {
        a[p.row][p.col + k] = float(in[lane]->a[k]);
        b[p.row][p.col + k] = float(in[lane]->b[k]);
        c[p.row][p.col + k] = float(in[lane]->c[k]);
      }
    }
    for (uint32_t lane = 0; lane < kSimdWidth; ++lane) {
      if (!simd::active(mask, lane)) continue;
      const Coord p = lane_coord(lane);
      for (uint32_t k = 0; k < 2; ++k) {
        float acc = c[p.row][p.col + k];
        for (uint32_t j = 0; j < 8; ++j) acc += a[p.row][j] * b[j][p.col + k];
        (*out[lane])[k] = TD(acc);
      }
    }
  }
};

inline uint32_t lane_index() { return mtlsim_rt->current()->thread_index_in_threadgroup % kSimdWidth; }

}  // namespace mtlsim::matrix

namespace metal {

template <class T, int Rows, int Cols>
struct simdgroup_matrix {
  static_assert(Rows == 8 && Cols == 8, "only 8x8 simdgroup matrices exist");
  vec<T, 2> elements;

  simdgroup_matrix() = default;
  // MSL: a diagonal matrix with `diagonal` on the diagonal.
  explicit simdgroup_matrix(T diagonal) {
    const mtlsim::matrix::Coord p = mtlsim::matrix::lane_coord(mtlsim::matrix::lane_index());
    for (uint32_t k = 0; k < 2; ++k) elements[k] = p.row == p.col + k ? diagonal : T(0);
  }

  vec<T, 2>& thread_elements() { return elements; }
  const vec<T, 2>& thread_elements() const { return elements; }
};

using simdgroup_float8x8 = simdgroup_matrix<float, 8, 8>;
using simdgroup_half8x8 = simdgroup_matrix<half, 8, 8>;
using simdgroup_bfloat8x8 = simdgroup_matrix<bfloat, 8, 8>;

// MSL: make_filled_simdgroup_matrix<T, Cols, Rows = Cols>(value).
template <class T, int R, int C = R>
simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, R, C> m;
  m.elements = vec<T, 2>(value);
  return m;
}

namespace __detail {
// Element (row, col) of the matrix as laid out in memory at `origin` (x is the
// column, y the row), optionally transposed.
inline ulong matrix_offset(uint32_t row, uint32_t col, ulong elements_per_row, ulong2 origin, bool transpose) {
  if (transpose) {
    const uint32_t t = row;
    row = col;
    col = t;
  }
  return (origin.y + row) * elements_per_row + origin.x + col;
}
}  // namespace __detail

template <class T, int R, int C, class U, std::enable_if_t<mtlsim::device_or_threadgroup_v<U>, int> = 0>
void simdgroup_load(simdgroup_matrix<T, R, C>& m, const U* src, ulong elements_per_row = C,
                    ulong2 origin = ulong2(0, 0), bool transpose = false) {
  const mtlsim::matrix::Coord p = mtlsim::matrix::lane_coord(mtlsim::matrix::lane_index());
  for (uint32_t k = 0; k < 2; ++k)
    m.elements[k] = T(src[__detail::matrix_offset(p.row, p.col + k, elements_per_row, origin, transpose)]);
}

template <class T, int R, int C, class U, std::enable_if_t<mtlsim::device_or_threadgroup_v<U>, int> = 0>
void simdgroup_store(const simdgroup_matrix<T, R, C>& m, U* dst, ulong elements_per_row = C,
                     ulong2 origin = ulong2(0, 0), bool transpose = false) {
  const mtlsim::matrix::Coord p = mtlsim::matrix::lane_coord(mtlsim::matrix::lane_index());
  for (uint32_t k = 0; k < 2; ++k)
    dst[__detail::matrix_offset(p.row, p.col + k, elements_per_row, origin, transpose)] =
        mtlsim::value_type_t<U>(m.elements[k]);
}

template <class TD, class TA, class TB, class TC>
void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                   const simdgroup_matrix<TB, 8, 8>& b,
                                   const simdgroup_matrix<TC, 8, 8>& c, MTLSIM_CALLER) {
  using Op = mtlsim::matrix::MultiplyAccumulate<TD, TA, TB, TC>;
  d.elements = mtlsim::simd::collective<Op, vec<TD, 2>>(
      mtlsim::matrix::Operands<TD, TA, TB, TC>{a.elements, b.elements, c.elements}, MTLSIM_CALLER_SITE);
}

template <class TD, class TA, class TB>
void simdgroup_multiply(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                        const simdgroup_matrix<TB, 8, 8>& b, MTLSIM_CALLER) {
  const simdgroup_matrix<TD, 8, 8> zero = make_filled_simdgroup_matrix<TD, 8, 8>(TD(0));
  simdgroup_multiply_accumulate(d, a, b, zero, mtlsim_file, mtlsim_line);
}

}  // namespace metal
