#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mps_ext::metal {

// Name, GPU family, memory... of the Metal device, for `python -m mps_ext info`.
std::vector<std::pair<std::string, std::string>> device_info();

}  // namespace mps_ext::metal
