// metal::uniform<T> (<metal_uniform>): a value the program declares the same
// in every thread, which lets Apple's compiler keep it in scalar registers.
// The simulator computes it per thread like any value and does not check the
// claim; operations on it give T, which converts back.
#pragma once

namespace metal {

template <class T>
struct uniform {
  T value;

  constexpr uniform() = default;
  constexpr uniform(T v) : value(v) {}
  constexpr operator T() const { return value; }
};

template <class T> constexpr uniform<T> make_uniform(T v) { return uniform<T>(v); }

}  // namespace metal
