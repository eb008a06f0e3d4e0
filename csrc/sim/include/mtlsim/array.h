// metal::array<T, N> (<metal_array>): a fixed-size array that is a value type.
#pragma once

#include <cstddef>

#include "address_space.h"

namespace metal {

template <class T, size_t N>
struct array {
  T elems_[N > 0 ? N : 1];  // public, so that array stays an aggregate: array<int, 3> a = {1, 2, 3};

  static constexpr size_t size() { return N; }
  static constexpr size_t max_size() { return N; }
  static constexpr bool empty() { return N == 0; }

#if defined(MTLSIM_ADDRESS_SPACES)
  // Members usable on an array in any address space; elements keep that space.
  template <class Self> constexpr auto& operator[](this Self& self, size_t i) { return self.elems_[i]; }
  template <class Self> constexpr auto& front(this Self& self) { return self.elems_[0]; }
  template <class Self> constexpr auto& back(this Self& self) { return self.elems_[N - 1]; }
  template <class Self> constexpr auto* data(this Self& self) { return self.elems_; }
  template <class Self> constexpr auto* begin(this Self& self) { return self.elems_; }
  template <class Self> constexpr auto* end(this Self& self) { return self.elems_ + N; }
#else
  constexpr T& operator[](size_t i) { return elems_[i]; }
  constexpr const T& operator[](size_t i) const { return elems_[i]; }
  constexpr T& front() { return elems_[0]; }
  constexpr const T& front() const { return elems_[0]; }
  constexpr T& back() { return elems_[N - 1]; }
  constexpr const T& back() const { return elems_[N - 1]; }
  constexpr T* data() { return elems_; }
  constexpr const T* data() const { return elems_; }
  constexpr T* begin() { return elems_; }
  constexpr const T* begin() const { return elems_; }
  constexpr T* end() { return elems_ + N; }
  constexpr const T* end() const { return elems_ + N; }
#endif
};

}  // namespace metal
