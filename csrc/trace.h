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

void begin();                  // opens a (possibly nested) trace
std::vector<Record> end();     // closes the innermost trace, returns its records
void record(Record r);         // appended to every open trace

}  // namespace mps_ext::trace
