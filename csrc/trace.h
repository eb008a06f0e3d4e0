// mps_ext.trace(): a record of every kernel dispatched while a trace is open.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "backend.h"

namespace mps_ext::trace {

struct Record {
  std::string name;
  Size3 grid;         // threadgroups per grid
  Size3 threadgroup;  // threads per threadgroup
  std::string backend;
};

// Opens a trace that keeps at most `max_records`; traces nest and may be open
// on several threads at once.
uint64_t begin(size_t max_records);
// Closes the trace `id` returned: its records, and how many it dropped.
std::pair<std::vector<Record>, size_t> end(uint64_t id);
// Appended to every open trace: kernels dispatched from any thread (autograd's) count.
// Called once a dispatch succeeded.
void record(const Record& r);
size_t open_count();

}  // namespace mps_ext::trace
