// MSL 3.2's <metal_logging>: os_log, os_log_default and their printf-style
// log functions. The prelude includes it for sources that target MSL 3.2
// (MTLSIM_MSL_VERSION), as only they may name these; the runtime formats each
// message and writes it to the process's stderr (mps_ext/sim/runtime/log.cpp).
#pragma once

#include <initializer_list>
#include <type_traits>

#include "mtlsim/abi.h"
#include "mtlsim/address_space.h"
#include "mtlsim/scalar.h"
#include "mtlsim/vec.h"

extern const mtlsim::RuntimeAPI* mtlsim_rt;

namespace mtlsim {

// A log function's format, and the .metal position of the call: the default
// arguments of this converting constructor are evaluated where the kernel
// passes its string literal (a parameter pack leaves no room for MTLSIM_CALLER).
struct LogFormat {
  const char* text;
  Site site;
  LogFormat(const MTLSIM_CONSTANT char* format, const char* file = __builtin_FILE(),
            unsigned line = __builtin_LINE())
      : text((const char*)format), site{file, line, 0} {}
};

template <class T>
LogArg log_arg(const T& value) {
  using V = value_type_t<T>;
  const V& v = as_generic(value);
  LogArg a{};
  if constexpr (std::is_enum_v<V>) {
    return log_arg(static_cast<std::underlying_type_t<V>>(v));
  } else if constexpr (std::is_integral_v<V> && std::is_signed_v<V>) {
    a.kind = LogArgKind::Signed;
    a.i = v;
  } else if constexpr (std::is_integral_v<V>) {
    a.kind = LogArgKind::Unsigned;
    a.u = v;
  } else if constexpr (std::is_pointer_v<V>) {
    a.kind = std::is_same_v<value_type_t<std::remove_pointer_t<V>>, char> ? LogArgKind::String : LogArgKind::Pointer;
    a.p = (const void*)v;
  } else {
    static_assert(metal::is_floating_point_v<V>,
                  "os_log formats scalars (integers, half, bfloat, float), constant strings and pointers: "
                  "pass a vector's lanes one by one");
    a.kind = LogArgKind::Floating;
    a.f = float(v);
  }
  return a;
}

inline void write_log(const MTLSIM_CONSTANT char* subsystem, const MTLSIM_CONSTANT char* category, LogType type,
                      const LogFormat& format, std::initializer_list<LogArg> args) {
  const LogMessage m{(const char*)subsystem, (const char*)category, type, format.text, uint32_t(args.size()),
                     args.begin()};
  mtlsim_rt->log(&m, &format.site);
}

}  // namespace mtlsim

namespace metal {

// Each log function, callable on an os_log in any address space (MSL declares
// them `constant`; os_log_default is in the constant space).
#if defined(MTLSIM_ADDRESS_SPACES)
#define MTLSIM_OS_LOG_FUNCTION(name, type)                                                                \
  template <class Self, class... A>                                                                       \
  void name(this const Self& self, ::mtlsim::LogFormat format, const A&... args) {                        \
    const os_log& l = ::mtlsim::as_generic(self);                                                         \
    ::mtlsim::write_log(l.subsystem_, l.category_, type, format, {::mtlsim::log_arg(args)...});           \
  }
#else
#define MTLSIM_OS_LOG_FUNCTION(name, type)                                                                \
  template <class... A>                                                                                   \
  void name(::mtlsim::LogFormat format, const A&... args) const {                                         \
    ::mtlsim::write_log(subsystem_, category_, type, format, {::mtlsim::log_arg(args)...});               \
  }
#endif

struct os_log {
  constexpr os_log(const MTLSIM_CONSTANT char* subsystem, const MTLSIM_CONSTANT char* category)
      : subsystem_(subsystem), category_(category) {}

  MTLSIM_OS_LOG_FUNCTION(log, ::mtlsim::LogType::Default)
  MTLSIM_OS_LOG_FUNCTION(log_debug, ::mtlsim::LogType::Debug)
  MTLSIM_OS_LOG_FUNCTION(log_info, ::mtlsim::LogType::Info)
  MTLSIM_OS_LOG_FUNCTION(log_error, ::mtlsim::LogType::Error)
  MTLSIM_OS_LOG_FUNCTION(log_fault, ::mtlsim::LogType::Fault)

  const MTLSIM_CONSTANT char* subsystem_;
  const MTLSIM_CONSTANT char* category_;
};
#undef MTLSIM_OS_LOG_FUNCTION

// The default log: messages without a subsystem and category.
inline constexpr MTLSIM_CONSTANT os_log os_log_default = os_log(nullptr, nullptr);

}  // namespace metal
