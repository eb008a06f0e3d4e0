#include "trace.h"

#include <mutex>

namespace mps_ext::trace {

namespace {
std::mutex mu;
std::vector<std::vector<Record>> open_traces;  // kernels may be dispatched from any thread
}  // namespace

void begin() {
  std::lock_guard<std::mutex> lock(mu);
  open_traces.emplace_back();
}

std::vector<Record> end() {
  std::lock_guard<std::mutex> lock(mu);
  TORCH_CHECK(!open_traces.empty(), "mps_ext.trace: no trace is open");
  std::vector<Record> records = std::move(open_traces.back());
  open_traces.pop_back();
  return records;
}

void record(Record r) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& t : open_traces) t.push_back(r);
}

}  // namespace mps_ext::trace
