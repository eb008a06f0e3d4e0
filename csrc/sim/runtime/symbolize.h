#pragma once

#include <string>

namespace mtlsim {

// "file.metal:37" for a code address inside a kernel module, or "" when the
// line cannot be found (no addr2line / atos, or no debug line table).
std::string symbolize(const void* pc);

}  // namespace mtlsim
