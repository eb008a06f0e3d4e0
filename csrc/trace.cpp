#include "trace.h"

#include <map>
#include <mutex>

#include "sim/runtime/fork.h"

namespace mps_ext::trace {

namespace {

struct Open {
  size_t max_records;
  std::vector<Record> records;
  size_t dropped = 0;
};

std::mutex mu;
uint64_t next_id = 0;
std::map<uint64_t, Open> open_traces;
const bool fork_safe = (mtlsim::fork_protect(mu, mtlsim::ForkRank::Trace), true);

}  // namespace

uint64_t begin(size_t max_records) {
  std::lock_guard<std::mutex> lock(mu);
  open_traces[++next_id] = Open{max_records, {}, 0};
  return next_id;
}

std::pair<std::vector<Record>, size_t> end(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = open_traces.find(id);
  TORCH_CHECK(it != open_traces.end(), "mps_ext.trace: trace ", id, " is not open");
  std::pair<std::vector<Record>, size_t> out{std::move(it->second.records), it->second.dropped};
  open_traces.erase(it);
  return out;
}

void record(const Record& r) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [id, t] : open_traces) {
    if (t.records.size() < t.max_records) {
      t.records.push_back(r);
    } else {
      ++t.dropped;
    }
  }
}

size_t open_count() {
  std::lock_guard<std::mutex> lock(mu);
  return open_traces.size();
}

}  // namespace mps_ext::trace
