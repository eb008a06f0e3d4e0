// The package's .metal files, embedded at build time (setup.py generates the
// table), for compiling on the user's Mac without Apple's offline compiler.
#pragma once

#include <vector>

namespace mps_ext::metal {

struct Source {
  const char* file;                  // e.g. "softmax.metal"
  const char* text;                  // with the package's own includes inlined
  std::vector<const char*> kernels;  // the host names it defines
};

const std::vector<Source>& sources();

}  // namespace mps_ext::metal
