#include "log.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace mtlsim {

namespace {

// printf of one conversion (`spec` without its length modifier, ending in the
// conversion character), reading the argument as that conversion's type.
std::string convert(std::string spec, char conversion, const LogArg& arg) {
  char buf[512];
  int n = 0;
  switch (conversion) {
    case 'd': case 'i':
      spec.insert(spec.size() - 1, "ll");
      n = std::snprintf(buf, sizeof buf, spec.c_str(),
                        arg.kind == LogArgKind::Floating ? (long long)arg.f : (long long)arg.i);
      break;
    case 'u': case 'o': case 'x': case 'X':
      spec.insert(spec.size() - 1, "ll");
      n = std::snprintf(buf, sizeof buf, spec.c_str(),
                        arg.kind == LogArgKind::Floating ? (unsigned long long)arg.f : (unsigned long long)arg.u);
      break;
    case 'c':
      n = std::snprintf(buf, sizeof buf, spec.c_str(), int(arg.i));
      break;
    case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': case 'a': case 'A':
      n = std::snprintf(buf, sizeof buf, spec.c_str(),
                        arg.kind == LogArgKind::Floating ? arg.f
                        : arg.kind == LogArgKind::Signed ? double(arg.i)
                                                         : double(arg.u));
      break;
    case 's':
      n = std::snprintf(buf, sizeof buf, spec.c_str(),
                        arg.kind == LogArgKind::String && arg.p ? (const char*)arg.p : "(not a string)");
      break;
    case 'p':
      n = std::snprintf(buf, sizeof buf, spec.c_str(), arg.p);
      break;
  }
  return std::string(buf, n < 0 ? 0 : std::min<size_t>(size_t(n), sizeof buf - 1));
}

}  // namespace

std::string format_log(const LogMessage& m) {
  std::string out;
  uint32_t next = 0;
  for (const char* p = m.format; *p;) {
    if (*p != '%') {
      out += *p++;
      continue;
    }
    if (p[1] == '%') {
      out += '%';
      p += 2;
      continue;
    }
    // %[flags][width][.precision][length]conversion; `*` width and precision take an int argument.
    const char* start = p++;
    std::string spec = "%";
    auto take_int = [&]() -> bool {
      if (next >= m.num_args) return false;
      const LogArg& a = m.args[next++];
      spec += std::to_string(a.kind == LogArgKind::Signed ? a.i : (long long)a.u);
      ++p;
      return true;
    };
    bool ok = true;
    while (*p && std::strchr("-+ #0", *p)) spec += *p++;
    if (*p == '*') ok = take_int();
    while (*p >= '0' && *p <= '9') spec += *p++;
    if (*p == '.') {
      spec += *p++;
      if (*p == '*') ok = ok && take_int();
      while (*p >= '0' && *p <= '9') spec += *p++;
    }
    while (*p && std::strchr("hlLqjzt", *p)) ++p;
    const char conversion = *p;
    if (!conversion || !std::strchr("diuoxXcfFeEgGaAsp", conversion) || !ok || next >= m.num_args) {
      out.append(start, conversion ? p + 1 : p);  // as written: no argument, or not a conversion
      if (conversion) ++p;
      continue;
    }
    spec += conversion;
    out += convert(spec, conversion, m.args[next++]);
    ++p;
  }
  return out;
}

const char* log_level_name(LogType type) {
  switch (type) {
    case LogType::Default: return "default";
    case LogType::Info: return "info";
    case LogType::Debug: return "debug";
    case LogType::Error: return "error";
    case LogType::Fault: return "fault";
  }
  return "default";
}

}  // namespace mtlsim
