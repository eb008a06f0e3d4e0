// MSL address spaces as C++ types.
//
// The translator spells `device`, `constant` and `threadgroup` as
// MTLSIM_DEVICE, MTLSIM_CONSTANT and MTLSIM_THREADGROUP. Built with
// MTLSIM_ADDRESS_SPACES (clang >= 18, see mps_ext/sim/compiler.py) they are
// clang address spaces, distinct qualifiers like const: a conversion between
// them is a compile error, as in MSL, and overloads on them are distinct.
// `thread` is the default address space, where locals and temporaries live.
// Otherwise (any C++17 compiler; how the package's own kernels are built into
// the extension) they are erased.
//
// The x86-64 and arm64 backends treat these address spaces as the flat one, so
// converting a reference to the generic space (`as_generic`) costs nothing;
// the shim does so internally wherever MSL allows an object of any space.
#pragma once

#include <type_traits>

#if defined(MTLSIM_ADDRESS_SPACES)
#if !defined(__clang__) || __cplusplus < 202302L
#error "MTLSIM_ADDRESS_SPACES needs clang (LLVM >= 18) in C++23 mode (address spaces, explicit object parameters)"
#endif
#define MTLSIM_DEVICE __attribute__((address_space(1)))
#define MTLSIM_CONSTANT __attribute__((address_space(2)))
#define MTLSIM_THREADGROUP __attribute__((address_space(3)))
#else
#define MTLSIM_DEVICE
#define MTLSIM_CONSTANT
#define MTLSIM_THREADGROUP
#endif

// MSL 4.2: a program-scope variable in the constant address space is initialized by a constant
// expression. The translator puts this before those that are not constexpr.
#if defined(__cpp_constinit)
#define MTLSIM_CONSTANT_INIT constinit
#elif defined(__clang__)
#define MTLSIM_CONSTANT_INIT __attribute__((require_constant_initialization))
#else
#define MTLSIM_CONSTANT_INIT __constinit
#endif

namespace mtlsim {

enum class Space { thread, device, constant, threadgroup };  // clang's address space numbers

// The address space of an object type, and the type without it (cv kept).
template <class T> struct space_of {
  static constexpr Space value = Space::thread;
  using generic = T;
};
#if defined(MTLSIM_ADDRESS_SPACES)
#define MTLSIM_SPACE_OF(name, qualifier, cv)           \
  template <class T> struct space_of<cv qualifier T> { \
    static constexpr Space value = Space::name;        \
    using generic = cv T;                              \
  };
#define MTLSIM_SPACE_OF_CV(name, qualifier)                                      \
  MTLSIM_SPACE_OF(name, qualifier, ) MTLSIM_SPACE_OF(name, qualifier, const)     \
  MTLSIM_SPACE_OF(name, qualifier, volatile) MTLSIM_SPACE_OF(name, qualifier, const volatile)
MTLSIM_SPACE_OF_CV(device, MTLSIM_DEVICE)
MTLSIM_SPACE_OF_CV(constant, MTLSIM_CONSTANT)
MTLSIM_SPACE_OF_CV(threadgroup, MTLSIM_THREADGROUP)
#undef MTLSIM_SPACE_OF_CV
#undef MTLSIM_SPACE_OF
#endif

template <class T> constexpr Space space_v = space_of<std::remove_reference_t<T>>::value;
// Whether an object of type T lives outside the thread address space.
template <class T> constexpr bool in_space_v = space_v<T> != Space::thread;
// T without its address space, reference and cv-qualifiers: the value type.
template <class T> using value_type_t = std::remove_cv_t<typename space_of<std::remove_reference_t<T>>::generic>;

// The same object, seen through a reference in the thread (generic) address space.
template <class T>
constexpr auto& as_generic(T& x) {
  if constexpr (in_space_v<T>) return *(typename space_of<T>::generic*)&x;
  else return x;
}

// Whether none of the types lives outside the thread space.
template <class... T> constexpr bool all_thread_v = (!in_space_v<T> && ...);
// Objects MSL's atomic functions and simdgroup_load/store accept: device or
// threadgroup memory (with address spaces erased, any).
template <class T> constexpr bool device_or_threadgroup_v =
#if defined(MTLSIM_ADDRESS_SPACES)
    space_v<T> == Space::device || space_v<T> == Space::threadgroup;
#else
    true;
#endif
template <class T, class Class> constexpr bool is_in_space_v = in_space_v<T> && std::is_same_v<value_type_t<T>, Class>;

// A thread-space copy of an object in another address space; any other expression as it is (a
// constant stays one, a thread-space reference one). The translator wraps in it (MTLSIM_COPY) what MSL
// copies by value: a new variable's initializer (`S s(buf[i]);`), an argument for a parameter taken by
// value (`f(buf[i])`), a returned value (`return buf[i];`). C++'s implicit copy constructor binds only
// thread-space objects, and a constructor of our own would take away a struct's aggregate
// initialization (see mps_ext/sim/translate/copies.py).
template <class T>
constexpr decltype(auto) copy_of(T&& x) {
  if constexpr (in_space_v<T> && !std::is_array_v<std::remove_reference_t<T>>)  // (an array decays)
    return value_type_t<T>(as_generic(x));
  else return static_cast<T&&>(x);
}

}  // namespace mtlsim
#define MTLSIM_COPY(...) ::mtlsim::copy_of(__VA_ARGS__)

// Members that let the shim's value types be copied from, assigned to and
// converted in every address space (classes would otherwise work only in the
// thread space: `this` and the implicit copy constructor's reference are
// generic). They forward to the thread-space members; empty when erased.
#if defined(MTLSIM_ADDRESS_SPACES)
#define MTLSIM_SPACE_MEMBERS(Class)                                                                       \
  template <class U, std::enable_if_t<::mtlsim::is_in_space_v<U, Class>, int> = 0>                       \
  constexpr Class(const U& u) : Class(::mtlsim::as_generic(u)) {}                                         \
  template <class Self, class U,                                                                          \
            std::enable_if_t<::mtlsim::in_space_v<Self> || ::mtlsim::in_space_v<U>, int> = 0>             \
  constexpr Self& operator=(this Self& self, const U& u) {                                                \
    ::mtlsim::as_generic(self) = ::mtlsim::as_generic(u);                                                 \
    return self;                                                                                          \
  }                                                                                                       \
  template <class Self, std::enable_if_t<::mtlsim::in_space_v<Self>, int> = 0> /* `v = {a, b}` */        \
  constexpr Self& operator=(this Self& self, const Class& u) {                                            \
    ::mtlsim::as_generic(self) = u;                                                                       \
    return self;                                                                                          \
  }
#define MTLSIM_SPACE_CONVERSION(Target)                                                                   \
  template <class Self, std::enable_if_t<::mtlsim::in_space_v<Self>, int> = 0>                           \
  constexpr operator Target(this const Self& self) { return ::mtlsim::as_generic(self); }
// Lane i of a vector in any address space, in that address space.
#define MTLSIM_SPACE_INDEX                                                                                \
  template <class Self, std::enable_if_t<::mtlsim::in_space_v<Self>, int> = 0>                           \
  constexpr auto& operator[](this Self& self, int i) { return self.e.e[i]; }
#else
#define MTLSIM_SPACE_INDEX
#define MTLSIM_SPACE_MEMBERS(Class)
#define MTLSIM_SPACE_CONVERSION(Target)
#endif

// Forwarders for member functions that MSL qualifies with an address space
// (`float get() const device`): the translator renames the member, drops the
// qualifier and adds one of these to the class, which calls it on an object in
// one of the spaces listed by number through its thread-space view. Empty when
// erased.
#define MTLSIM_UNPAREN(...) __VA_ARGS__
#if defined(MTLSIM_ADDRESS_SPACES)
namespace mtlsim {
template <class T, int... Space> constexpr bool space_among_v = ((int(space_v<T>) == Space) || ...);
}  // namespace mtlsim
#define MTLSIM_SPACE_METHOD(spaces, member, ...)                                                          \
  template <class mtlsim_Self, class... mtlsim_A,                                                         \
            std::enable_if_t<::mtlsim::space_among_v<mtlsim_Self, MTLSIM_UNPAREN spaces>, int> = 0>       \
  constexpr decltype(auto) __VA_ARGS__(this mtlsim_Self&& mtlsim_self, mtlsim_A&&... mtlsim_a) {          \
    return ::mtlsim::as_generic(mtlsim_self).member(static_cast<mtlsim_A&&>(mtlsim_a)...);                \
  }
#define MTLSIM_SPACE_CONVERSION_TO(spaces, member, ...)                                                   \
  template <class mtlsim_Self,                                                                            \
            std::enable_if_t<::mtlsim::space_among_v<mtlsim_Self, MTLSIM_UNPAREN spaces>, int> = 0>       \
  constexpr operator __VA_ARGS__(this const mtlsim_Self& mtlsim_self) {                                   \
    return ::mtlsim::as_generic(mtlsim_self).member();                                                    \
  }
#define MTLSIM_SPACE_CONVERSION_TEMPLATE(spaces, params, ...)                                             \
  template <MTLSIM_UNPAREN params, class mtlsim_Self,                                                     \
            std::enable_if_t<::mtlsim::space_among_v<mtlsim_Self, MTLSIM_UNPAREN spaces>, int> = 0>       \
  constexpr operator __VA_ARGS__(this const mtlsim_Self& mtlsim_self) {                                   \
    return ::mtlsim::as_generic(mtlsim_self).operator __VA_ARGS__();                                      \
  }
#define MTLSIM_ERASED_SPACE_METHOD(spaces, member, ...)
#define MTLSIM_ERASED_SPACE_CONVERSION_TO(spaces, member, ...)
namespace mtlsim {
// MSL assigns a struct member by member. In C++ a union holding a simulator
// vector (ggml's block types) has no copy assignment, the vector's own being
// user-provided (it writes the lanes, not the swizzle views that share them):
// such a struct is copied as its bytes, which is what every MSL type holds.
template <class T> constexpr void assign_struct(T& to, const T& from) {
  if constexpr (std::is_copy_assignable_v<T>) {
    to = from;
  } else {
    static_assert(std::is_trivially_destructible_v<T>, "MSL structs hold plain data");
    __builtin_memcpy(static_cast<void*>(&to), static_cast<const void*>(&from), sizeof(T));
  }
}
}  // namespace mtlsim
// Assignment of a whole user-defined struct in any address space, from a value
// (braced too) or from an object in any space, as MSL allows. Templates, so the
// class keeps its implicit copy assignment and stays an aggregate.
#define MTLSIM_SPACE_ASSIGNMENT(Class)                                                                    \
  template <class mtlsim_Self, std::enable_if_t<::mtlsim::in_space_v<mtlsim_Self>, int> = 0>             \
  constexpr mtlsim_Self& operator=(this mtlsim_Self& mtlsim_self, const Class& mtlsim_value) {            \
    ::mtlsim::assign_struct<Class>(::mtlsim::as_generic(mtlsim_self), mtlsim_value);                      \
    return mtlsim_self;                                                                                   \
  }                                                                                                       \
  template <class mtlsim_Self, class mtlsim_U,                                                            \
            std::enable_if_t<::mtlsim::is_in_space_v<mtlsim_U, Class>, int> = 0>                        \
  constexpr mtlsim_Self& operator=(this mtlsim_Self& mtlsim_self, const mtlsim_U& mtlsim_value) {         \
    ::mtlsim::assign_struct<Class>(::mtlsim::as_generic(mtlsim_self), ::mtlsim::as_generic(mtlsim_value));\
    return mtlsim_self;                                                                                   \
  }
// The same for a class local to a function, which may have no member templates: one assignment per
// pair of address spaces, and the implicit copy assignment declared again (defaulted), which declaring
// the others would suppress.
#define MTLSIM_LOCAL_SPACE_ASSIGNMENT(Class)                                                              \
  Class& operator=(const Class&) = default;                                                               \
  Class& operator=(const MTLSIM_DEVICE Class& v) { return *this = ::mtlsim::copy_of(v); }                \
  Class& operator=(const MTLSIM_CONSTANT Class& v) { return *this = ::mtlsim::copy_of(v); }              \
  Class& operator=(const MTLSIM_THREADGROUP Class& v) { return *this = ::mtlsim::copy_of(v); }           \
  MTLSIM_LOCAL_ASSIGN_INTO(MTLSIM_DEVICE, Class) MTLSIM_LOCAL_ASSIGN_INTO(MTLSIM_THREADGROUP, Class)
#define MTLSIM_LOCAL_ASSIGN_INTO(Space, Class)                                                            \
  MTLSIM_LOCAL_ASSIGN(Space, , Class) MTLSIM_LOCAL_ASSIGN(Space, MTLSIM_DEVICE, Class)                    \
  MTLSIM_LOCAL_ASSIGN(Space, MTLSIM_CONSTANT, Class) MTLSIM_LOCAL_ASSIGN(Space, MTLSIM_THREADGROUP, Class)
#define MTLSIM_LOCAL_ASSIGN(Space, From, Class)                                                           \
  Space Class& operator=(this Space Class& self, const From Class& v) {                                   \
    ::mtlsim::as_generic(self) = ::mtlsim::copy_of(v);                                                    \
    return self;                                                                                          \
  }
#else
#define MTLSIM_SPACE_ASSIGNMENT(Class)
#define MTLSIM_LOCAL_SPACE_ASSIGNMENT(Class)
#define MTLSIM_SPACE_METHOD(spaces, member, ...)
#define MTLSIM_SPACE_CONVERSION_TO(spaces, member, ...)
#define MTLSIM_SPACE_CONVERSION_TEMPLATE(spaces, params, ...)
// With address spaces erased, a member that only an address space's copy has calls that copy.
#define MTLSIM_ERASED_SPACE_METHOD(spaces, member, ...)                                                   \
  template <class... mtlsim_A>                                                                            \
  constexpr decltype(auto) __VA_ARGS__(mtlsim_A&&... mtlsim_a) {                                          \
    return member(static_cast<mtlsim_A&&>(mtlsim_a)...);                                                  \
  }                                                                                                       \
  template <class... mtlsim_A>                                                                            \
  constexpr decltype(auto) __VA_ARGS__(mtlsim_A&&... mtlsim_a) const {                                    \
    return member(static_cast<mtlsim_A&&>(mtlsim_a)...);                                                  \
  }
#define MTLSIM_ERASED_SPACE_CONVERSION_TO(spaces, member, ...) \
  operator __VA_ARGS__() const { return member(); }
#endif
