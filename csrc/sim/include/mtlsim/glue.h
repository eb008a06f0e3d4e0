// Kernel-side plumbing: how a translated kernel reaches the runtime, gets its
// arguments bound, and declares threadgroup memory.
#pragma once

#include <cstdio>
#include <initializer_list>
#include <type_traits>

#include "mtlsim/abi.h"
#include "mtlsim/address_space.h"
#include "mtlsim/vec.h"

// Set once per binary: by the runtime inside the extension, by the generated
// init function in a separately compiled module.
extern const mtlsim::RuntimeAPI* mtlsim_rt;

// The caller's position, for reports and for telling call sites apart.
// Default arguments are evaluated at the call site, so shim functions see the
// kernel's .metal line. (GCC has no __builtin_COLUMN: sites are lines.)
#define MTLSIM_CALLER \
  const char *mtlsim_file = __builtin_FILE(), unsigned mtlsim_line = __builtin_LINE()
#define MTLSIM_CALLER_SITE \
  ::mtlsim::Site { mtlsim_file, mtlsim_line, 0 }

namespace mtlsim {

[[noreturn]] inline void fail(const char* message, const Site& site) {
  mtlsim_rt->fail(message, &site);
  __builtin_unreachable();
}

[[noreturn]] inline void fail_slot(const char* attribute, uint32_t slot, const char* problem,
                                   const Site& site) {
  char message[160];
  snprintf(message, sizeof message, "kernel parameter [[%s(%u)]] %s", attribute, slot, problem);
  fail(message, site);
}

// `threadgroup T name;` inside a kernel becomes a reference to this, with T in
// the threadgroup address space.
template <class T>
inline T& threadgroup_var(uint32_t id, const Site& site) {
  static_assert(std::is_trivially_destructible_v<value_type_t<std::remove_all_extents_t<T>>>,
                "threadgroup variables are raw memory");
  return *(T*)mtlsim_rt->threadgroup_alloc(id, sizeof(T), alignof(T), &site);
}

// The bytes of threadgroup memory a kernel's variables take, laid out as the
// runtime lays them out (each at its alignment) and rounded up to Metal's
// 16-byte granule: the emulated Metal's staticThreadgroupMemoryLength.
struct ThreadgroupVariable {
  size_t size, align;
};
constexpr uint32_t threadgroup_bytes(std::initializer_list<ThreadgroupVariable> variables) {
  size_t total = 0;
  for (const ThreadgroupVariable& v : variables) total = (total + v.align - 1) / v.align * v.align + v.size;
  return uint32_t((total + 15) / 16 * 16);
}

// reinterpret_cast in kernels (the translator routes them here): a pointer
// cast to a type the address is not aligned for is undefined on the GPU
// (float4 loads from a float buffer at an odd offset), and would go unnoticed
// on a CPU, which tolerates it.
template <class To, class From>
To aligned_cast(From&& from, MTLSIM_CALLER) {
  using F = std::remove_reference_t<From>;
  if constexpr (std::is_pointer_v<To> && std::is_pointer_v<F>) {
    using T = value_type_t<std::remove_pointer_t<To>>;
    if constexpr (!std::is_void_v<T>) {
      const auto address = (uintptr_t)from;
      if (address % alignof(T)) {
        char message[160];
        snprintf(message, sizeof message,
                 "misaligned reinterpret_cast: the type needs %zu-byte alignment, the address is %zu bytes past it",
                 alignof(T), size_t(address % alignof(T)));
        fail(message, MTLSIM_CALLER_SITE);
      }
    }
  }
  return reinterpret_cast<To>(from);
}

namespace detail {

template <class P>
constexpr bool is_attr_vector = metal::is_vector_v<std::remove_cv_t<P>>;

template <class P>
inline P attr_value(Dim3 d) {
  using Q = std::remove_cv_t<P>;
  if constexpr (is_attr_vector<Q>) {
    Q v;
    constexpr int n = metal::vec_elements<Q>::value;
    v[0] = d.x;
    v[1] = d.y;
    if constexpr (n > 2) v[2] = d.z;
    return v;
  } else {
    return static_cast<Q>(d.x);
  }
}

template <class P>
inline P attr_value(uint32_t v) {
  return static_cast<std::remove_cv_t<P>>(v);
}

inline uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

}  // namespace detail

// A kernel parameter bound to an argument-table slot.
template <uint32_t I>
struct BufferArg {
  template <class P>
  static P get(const ThreadCtx* c, const Site& site) {
    void* p = c->dispatch->buffers[I];
    if (!p) fail_slot("buffer", I, "is not bound", site);
    // C-style casts: from the runtime's generic pointers into the parameter's address space.
    if constexpr (std::is_pointer_v<P>) {
      return (P)p;
    } else {
      using T = std::remove_reference_t<P>;
      if (c->dispatch->buffer_sizes[I] < sizeof(T))
        fail_slot("buffer", I, "is bound to fewer bytes than its type needs", site);
      return *(T*)p;
    }
  }
};

template <uint32_t I>
struct ThreadgroupArg {
  template <class P>
  static P get(const ThreadCtx* c, const Site& site) {
    static_assert(std::is_pointer_v<P>, "[[threadgroup(n)]] parameters are pointers");
    void* p = c->group->buffers[I];
    if (!p) fail_slot("threadgroup", I, "has no threadgroup memory length set", site);
    return (P)p;
  }
};

template <Attr A>
struct AttrArg {
  template <class P>
  static P get(const ThreadCtx* c, const Site&) {
    using detail::attr_value;
    const DispatchView& d = *c->dispatch;
    const ThreadgroupView& g = *c->group;
    const uint32_t index = c->thread_index_in_threadgroup;
    const uint32_t threads = g.threads_per_threadgroup.x * g.threads_per_threadgroup.y *
                             g.threads_per_threadgroup.z;
    switch (A) {
      case Attr::thread_position_in_grid: return attr_value<P>(c->thread_position_in_grid);
      case Attr::thread_position_in_threadgroup: return attr_value<P>(c->thread_position_in_threadgroup);
      case Attr::threadgroup_position_in_grid: return attr_value<P>(g.threadgroup_position_in_grid);
      case Attr::threads_per_threadgroup: return attr_value<P>(g.threads_per_threadgroup);
      case Attr::threadgroups_per_grid: return attr_value<P>(d.threadgroups_per_grid);
      case Attr::threads_per_grid:
      case Attr::grid_size: return attr_value<P>(d.threads_per_grid);
      case Attr::dispatch_threads_per_threadgroup: return attr_value<P>(d.dispatch_threads_per_threadgroup);
      case Attr::grid_origin: return attr_value<P>(Dim3{0, 0, 0});
      case Attr::thread_index_in_threadgroup: return attr_value<P>(index);
      case Attr::thread_index_in_simdgroup: return attr_value<P>(index % kSimdWidth);
      case Attr::thread_index_in_quadgroup: return attr_value<P>(index % 4);
      case Attr::simdgroup_index_in_threadgroup: return attr_value<P>(index / kSimdWidth);
      case Attr::quadgroup_index_in_threadgroup: return attr_value<P>(index / 4);
      case Attr::simdgroups_per_threadgroup: return attr_value<P>(g.simdgroups_per_threadgroup);
      case Attr::quadgroups_per_threadgroup: return attr_value<P>(detail::ceil_div(threads, 4));
      case Attr::dispatch_simdgroups_per_threadgroup:
        return attr_value<P>(d.dispatch_simdgroups_per_threadgroup);
      case Attr::dispatch_quadgroups_per_threadgroup: {
        const Dim3 t = d.dispatch_threads_per_threadgroup;
        return attr_value<P>(detail::ceil_div(t.x * t.y * t.z, 4));
      }
      case Attr::threads_per_simdgroup:
      case Attr::thread_execution_width: return attr_value<P>(kSimdWidth);
    }
    __builtin_unreachable();
  }
};

// A built-in variable declared at program scope (MSL 3.1): the calling thread's value.
template <class T, Attr A>
inline T builtin() {
  return AttrArg<A>::template get<T>(mtlsim_rt->current(), Site{});
}

// Binds each kernel parameter through its binder, in declaration order; the
// parameter types come from the kernel's own signature.
template <class... Binders>
struct Bind {
  template <class... P>
  static void call(void (*kernel)(P...), const ThreadCtx* c, const Site& site) {
    static_assert(sizeof...(P) == sizeof...(Binders), "one binder per kernel parameter");
    kernel(Binders::template get<P>(c, site)...);
  }
};

// The function a GPU thread runs; `site` is the kernel's definition.
template <auto Kernel, class B, const Site* site>
void entry(const ThreadCtx* c) {
  const bool flush = c->dispatch->flush_half_subnormals;
  if (__atomic_load_n(&half_subnormals_flushed, __ATOMIC_RELAXED) != flush)
    __atomic_store_n(&half_subnormals_flushed, flush, __ATOMIC_RELAXED);
  B::call(Kernel, c, *site);
}

}  // namespace mtlsim
