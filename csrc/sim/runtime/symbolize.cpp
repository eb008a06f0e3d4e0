#include "symbolize.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <sstream>

namespace mtlsim {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

std::string symbolize(const void* pc) {
  Dl_info info{};
  if (!pc || !dladdr(pc, &info) || !info.dli_fname) return "";
  std::ostringstream cmd;
#if defined(__APPLE__)
  // atos (Xcode command line tools) prints "fn (in lib) (file:line)" per inlined frame.
  cmd << "atos -i -o " << quote(info.dli_fname) << " -l " << info.dli_fbase << " " << pc << " 2>/dev/null";
#else
  // A fault's pc is the faulting instruction itself (not a return address),
  // so no adjustment is needed; shared objects are linked at address 0.
  const auto offset = reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase);
  cmd << "addr2line -i -e " << quote(info.dli_fname) << " 0x" << std::hex << offset << " 2>/dev/null";
#endif
  FILE* p = popen(cmd.str().c_str(), "r");
  if (!p) return "";
  // The innermost inlined frame comes first; the first frame in a kernel
  // source (not a simulator header) is the kernel's line.
  std::string found, first;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) {
    std::string line(buf);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
#if defined(__APPLE__)
    const auto open = line.rfind('(');
    if (open == std::string::npos || line.back() != ')') continue;
    line = line.substr(open + 1, line.size() - open - 2);
#endif
    const auto disc = line.find(" (discriminator");
    if (disc != std::string::npos) line.erase(disc);
    if (first.empty() && line.rfind("??", 0) != 0) first = line;
    const auto colon = line.rfind(':');
    if (found.empty() && colon != std::string::npos && ends_with(line.substr(0, colon), ".metal")) found = line;
  }
  pclose(p);
  return found.empty() ? first : found;
}

}  // namespace mtlsim
