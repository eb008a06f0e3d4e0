#include "trace.h"

#include <map>
#include <mutex>

namespace mps_ext::trace {

namespace {
std::mutex mu;
uint64_t next_id = 0;
std::map<uint64_t, std::vector<Record>> open_traces;
}  // namespace

uint64_t begin() {
  std::lock_guard<std::mutex> lock(mu);
  open_traces[++next_id];
  return next_id;
}

std::vector<Record> end(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = open_traces.find(id);
  TORCH_CHECK(it != open_traces.end(), "mps_ext.trace: trace ", id, " is not open");
  std::vector<Record> records = std::move(it->second);
  open_traces.erase(it);
  return records;
}

void record(Record r) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [id, records] : open_traces) records.push_back(r);
}

}  // namespace mps_ext::trace
