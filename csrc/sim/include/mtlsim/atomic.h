// MSL atomics on device and threadgroup memory.
//
// Threadgroups run concurrently on worker threads, so device atomics are real
// hardware atomics. All orders behave as relaxed, like Metal's. Loads and
// failed compare-exchanges yield the GPU thread, so a spin loop waiting on
// another thread of its threadgroup lets that thread run.
#pragma once

#include <cstring>
#include <type_traits>

#include "mtlsim/glue.h"

namespace metal {

enum memory_order {
  memory_order_relaxed,
  memory_order_acquire,
  memory_order_release,
  memory_order_acq_rel,
  memory_order_seq_cst,
};

enum class thread_scope { thread_scope_thread, thread_scope_simdgroup, thread_scope_threadgroup, thread_scope_device };

template <class T>
struct atomic {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "MSL atomics are 32 or 64 bits");
  T value;
};

using atomic_int = atomic<int>;
using atomic_uint = atomic<uint>;
using atomic_bool = atomic<bool>;
using atomic_float = atomic<float>;
using atomic_ulong = atomic<ulong>;
using atomic_long = atomic<long>;

}  // namespace metal

namespace mtlsim::atomics {

// The integer type that holds T's bits.
template <class T>
using Bits = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;

// The value type of an atomic object A (`device atomic_uint`, `volatile
// threadgroup atomic<float>`...). MSL has atomic functions for device and
// threadgroup memory only; with address spaces erased every object qualifies.
template <class A> struct value_of {};
template <class T> struct value_of<metal::atomic<T>> {
  using type = T;
};
template <class A>
using value_t = std::enable_if_t<device_or_threadgroup_v<A>, typename value_of<value_type_t<A>>::type>;

// Keeps T out of deduction (it comes from the atomic object).
template <class T> struct arg {
  using type = T;
};
template <class T> using arg_t = typename arg<T>::type;

template <class A>
Bits<value_t<A>>* bits(A* a) {
  return (Bits<value_t<A>>*)a;
}

template <class T>
T from_bits(Bits<T> b) {
  T v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

template <class T>
Bits<T> to_bits(T v) {
  Bits<T> b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}

// Read-modify-write through compare-exchange, for float and for min/max.
template <class A, class F, class T = value_t<A>>
T update(A* a, F f) {
  Bits<T>* p = bits(a);
  Bits<T> old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(p, &old, to_bits(f(from_bits<T>(old))), true,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return from_bits<T>(old);
}

}  // namespace mtlsim::atomics

namespace metal {

// The value argument is not deduced: `atomic_fetch_add_explicit(&u, 1, ...)` on
// an atomic_uint passes an int, as MSL allows.
template <class A, class T = mtlsim::atomics::value_t<A>>
void atomic_store_explicit(A* a, mtlsim::atomics::arg_t<T> v, memory_order) {
  __atomic_store_n(mtlsim::atomics::bits(a), mtlsim::atomics::to_bits(v), __ATOMIC_RELAXED);
}

template <class A, class T = mtlsim::atomics::value_t<A>>
T atomic_load_explicit(A* a, memory_order) {
  mtlsim_rt->yield();
  return mtlsim::atomics::from_bits<T>(__atomic_load_n(mtlsim::atomics::bits(a), __ATOMIC_RELAXED));
}

template <class A, class T = mtlsim::atomics::value_t<A>>
T atomic_exchange_explicit(A* a, mtlsim::atomics::arg_t<T> v, memory_order) {
  return mtlsim::atomics::from_bits<T>(
      __atomic_exchange_n(mtlsim::atomics::bits(a), mtlsim::atomics::to_bits(v), __ATOMIC_RELAXED));
}

template <class A, class T = mtlsim::atomics::value_t<A>>
bool atomic_compare_exchange_weak_explicit(A* a, mtlsim::atomics::arg_t<T>* expected, mtlsim::atomics::arg_t<T> desired, memory_order, memory_order) {
  auto want = mtlsim::atomics::to_bits(*expected);
  if (__atomic_compare_exchange_n(mtlsim::atomics::bits(a), &want, mtlsim::atomics::to_bits(desired),
                                  false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    return true;
  *expected = mtlsim::atomics::from_bits<T>(want);
  mtlsim_rt->yield();
  return false;
}

template <class A, class T = mtlsim::atomics::value_t<A>>
bool atomic_compare_exchange_strong_explicit(A* a, mtlsim::atomics::arg_t<T>* expected, mtlsim::atomics::arg_t<T> desired, memory_order s, memory_order f) {
  return atomic_compare_exchange_weak_explicit(a, expected, desired, s, f);
}

#define MTLSIM_ATOMIC_RMW(name, builtin, expr)                                                    \
  template <class A, class T = mtlsim::atomics::value_t<A>>                                       \
  T name(A* a, mtlsim::atomics::arg_t<T> v, memory_order) {                                                               \
    if constexpr (is_integral_v<T> && !is_same_v<T, bool>) {                                      \
      return T(builtin(mtlsim::atomics::bits(a), mtlsim::atomics::Bits<T>(v), __ATOMIC_RELAXED)); \
    } else {                                                                                      \
      return mtlsim::atomics::update(a, [v](T x) { return T(expr); });                            \
    }                                                                                             \
  }
MTLSIM_ATOMIC_RMW(atomic_fetch_add_explicit, __atomic_fetch_add, x + v)
MTLSIM_ATOMIC_RMW(atomic_fetch_sub_explicit, __atomic_fetch_sub, x - v)
MTLSIM_ATOMIC_RMW(atomic_fetch_and_explicit, __atomic_fetch_and, x & v)
MTLSIM_ATOMIC_RMW(atomic_fetch_or_explicit, __atomic_fetch_or, x | v)
MTLSIM_ATOMIC_RMW(atomic_fetch_xor_explicit, __atomic_fetch_xor, x ^ v)
#undef MTLSIM_ATOMIC_RMW

// min/max compare as T (signed or float), not as raw bits.
template <class A, class T = mtlsim::atomics::value_t<A>>
T atomic_fetch_min_explicit(A* a, mtlsim::atomics::arg_t<T> v, memory_order) {
  return mtlsim::atomics::update(a, [v](T x) { return v < x ? v : x; });
}
template <class A, class T = mtlsim::atomics::value_t<A>>
T atomic_fetch_max_explicit(A* a, mtlsim::atomics::arg_t<T> v, memory_order) {
  return mtlsim::atomics::update(a, [v](T x) { return v > x ? v : x; });
}

}  // namespace metal
