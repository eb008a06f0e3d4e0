// mps_ext.trace(): a record of every kernel dispatched while a trace is open.
#pragma once

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

// Opens a trace; traces nest and may be open on several threads at once.
uint64_t begin();
// Closes the trace `id` returned, returns its records.
std::vector<Record> end(uint64_t id);
// Appended to every open trace: kernels dispatched from any thread (autograd's) count.
void record(Record r);

}  // namespace mps_ext::trace
