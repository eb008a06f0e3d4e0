#include "gpu_fill.h"

namespace mps_ext {

int64_t cores_of_architecture(const std::string& name) {
  // "applegpu_g<generation><tier>": the tier letter is the last; the counts
  // are the smallest of M1-M4 in that tier (base, Pro, Max, Ultra).
  constexpr int64_t kBase = 7;
  if (name.rfind("applegpu_g", 0) != 0 || name.size() < 12) return kBase;
  switch (name.back()) {
    case 's': return 14;
    case 'c': return 24;
    case 'd': return 48;
    default: return kBase;
  }
}

}  // namespace mps_ext
