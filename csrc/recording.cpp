#include "recording.h"

#include <memory>
#include <string>
#include <utility>

#include "sim/sim_backend.h"

namespace mps_ext::recording {

namespace {

// The simulator's backend but for dispatch (kept, not run) and the fill.
class RecordingBackend final : public Backend {
 public:
  const char* name() const override { return "recording"; }

  RecordingBackend(std::optional<FillPolicy> fill, std::optional<ThreadLimit> limit)
      : fill_(std::move(fill)), limit_(std::move(limit)) {}

  std::optional<std::string> unavailable(const std::string& kernel, uint32_t threads) override {
    if (auto why = sim_backend().unavailable(kernel, threads)) return why;
    if (!limit_) return std::nullopt;
    const int64_t most = (*limit_)(kernel);
    if (threads <= most) return std::nullopt;
    return "kernel '" + kernel + "' takes at most " + std::to_string(most) + " threads per threadgroup here, not " +
           std::to_string(threads);
  }

  int64_t fill_simdgroups(const std::string& kernel, uint32_t threads) override {
    if (!fill_) return sim_backend().fill_simdgroups(kernel, threads);
    const int64_t simdgroups = (*fill_)(kernel, threads);
    TORCH_CHECK_VALUE(simdgroups > 0, "mps_ext.sim.record_launches: fill_simdgroups must be positive, got ",
                      simdgroups, " for kernel '", kernel, "'");
    return simdgroups;
  }

  void dispatch(const Launch& launch) override {
    TORCH_CHECK(read_after_.empty(), "mps_ext.sim.record_launches: a launch ('", launch.kernel,
                "') after a host read of what recorded launches wrote ('", read_after_,
                "' was recorded, not run): its plan may rest on unwritten memory; record it without that read (",
                "lu_factor_ex and solve_ex with check_errors=False, softmax over a dimension it need not move last)");
    launches_.push_back(launch);
  }

  int64_t new_stream() override { return sim_backend().new_stream(); }
  int64_t current_stream() override { return sim_backend().current_stream(); }
  void set_current_stream(int64_t stream) override { sim_backend().set_current_stream(stream); }
  void synchronize(int64_t stream) override { sim_backend().synchronize(stream); }
  bool query(int64_t stream) override { return sim_backend().query(stream); }
  std::unique_ptr<Event> new_event() override { return sim_backend().new_event(); }
  void record_tensor(const at::Tensor& t, int64_t stream) override { sim_backend().record_tensor(t, stream); }

  // Nothing recorded has run: torch ops after a launch read unwritten memory.
  // That is harmless for results made from it after the last launch (qr's R,
  // the triangle of the factors its kernel wrote: a replay checks the
  // kernel's buffer), not for a launch planned after it.
  void before_torch_ops() override {
    if (!launches_.empty()) read_after_ = launches_.back().kernel;
  }

  std::vector<Launch> take() { return std::move(launches_); }

 private:
  const std::optional<FillPolicy> fill_;
  const std::optional<ThreadLimit> limit_;
  std::vector<Launch> launches_;
  std::string read_after_;  // the last launch before a host read, if there was one
};

// Each thread's own recording: the launches of ops that other threads run
// meanwhile are theirs to run (a recorded launch is never run, so recording
// them here would hand those threads unwritten memory).
thread_local std::unique_ptr<RecordingBackend> open_here;

}  // namespace

void begin(std::optional<FillPolicy> fill, std::optional<ThreadLimit> max_threads) {
  TORCH_CHECK(!open_here, "mps_ext.sim.record_launches: a recording is already open on this thread (they do not nest)");
  open_here = std::make_unique<RecordingBackend>(std::move(fill), std::move(max_threads));
}

std::vector<Launch> end() {
  TORCH_CHECK(open_here, "mps_ext.sim.record_launches: no recording is open on this thread");
  std::vector<Launch> launches = open_here->take();
  open_here.reset();
  return launches;
}

Backend* active() { return open_here.get(); }

}  // namespace mps_ext::recording
