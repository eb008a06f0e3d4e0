#include "recording.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "sim/sim_backend.h"

namespace mps_ext::recording {

namespace {

// The simulator's backend but for dispatch (kept, not run) and the fill.
class RecordingBackend final : public Backend {
 public:
  const char* name() const override { return "recording"; }

  std::optional<std::string> unavailable(const std::string& kernel, uint32_t threads) override {
    if (auto why = sim_backend().unavailable(kernel, threads)) return why;
    std::shared_ptr<const ThreadLimit> limit;
    {
      std::lock_guard<std::mutex> lock(mu_);
      limit = limit_;
    }
    if (!limit) return std::nullopt;
    const int64_t most = (*limit)(kernel);
    if (threads <= most) return std::nullopt;
    return "kernel '" + kernel + "' takes at most " + std::to_string(most) + " threads per threadgroup here, not " +
           std::to_string(threads);
  }

  int64_t fill_simdgroups(const std::string& kernel, uint32_t threads) override {
    std::shared_ptr<const FillPolicy> fill;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fill = fill_;
    }
    if (!fill) return sim_backend().fill_simdgroups(kernel, threads);
    const int64_t simdgroups = (*fill)(kernel, threads);
    TORCH_CHECK_VALUE(simdgroups > 0, "mps_ext.sim.record_launches: fill_simdgroups must be positive, got ",
                      simdgroups, " for kernel '", kernel, "'");
    return simdgroups;
  }

  void dispatch(const Launch& launch) override {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
    if (!launches_.empty()) read_after_ = launches_.back().kernel;
  }

  void open(std::optional<FillPolicy> fill, std::optional<ThreadLimit> limit) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fill) fill_ = std::make_shared<const FillPolicy>(std::move(*fill));
    if (limit) limit_ = std::make_shared<const ThreadLimit>(std::move(*limit));
    launches_.clear();
    read_after_.clear();
  }

  // The launches, and the policies, to be released outside the lock: a Python one takes the GIL.
  struct Closed {
    std::vector<Launch> launches;
    std::shared_ptr<const FillPolicy> fill;
    std::shared_ptr<const ThreadLimit> limit;
  };
  Closed close() {
    std::lock_guard<std::mutex> lock(mu_);
    return {std::move(launches_), std::move(fill_), std::move(limit_)};
  }

 private:
  std::mutex mu_;
  std::shared_ptr<const FillPolicy> fill_;
  std::shared_ptr<const ThreadLimit> limit_;
  std::vector<Launch> launches_;
  std::string read_after_;  // the last launch before a host read, if there was one
};

RecordingBackend& backend() {
  static RecordingBackend b;
  return b;
}

std::atomic<bool> is_open{false};

}  // namespace

void begin(std::optional<FillPolicy> fill, std::optional<ThreadLimit> max_threads) {
  bool closed = false;
  TORCH_CHECK(is_open.compare_exchange_strong(closed, true),
              "mps_ext.sim.record_launches: a recording is already open (they do not nest)");
  backend().open(std::move(fill), std::move(max_threads));
}

std::vector<Launch> end() {
  TORCH_CHECK(is_open.exchange(false), "mps_ext.sim.record_launches: no recording is open");
  return backend().close().launches;
}

Backend* active() { return is_open.load() ? &backend() : nullptr; }

}  // namespace mps_ext::recording
