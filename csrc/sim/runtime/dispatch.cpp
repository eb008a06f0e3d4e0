#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "checked.h"
#include "runtime.h"
#include "worker.h"

namespace mtlsim {

namespace {

unsigned env_unsigned(const char* name, unsigned fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const unsigned long n = std::strtoul(v, &end, 10);
  return (end && *end == 0 && n > 0) ? unsigned(n) : fallback;
}

uint64_t product(Dim3 d) { return uint64_t(d.x) * d.y * d.z; }

std::string str(Dim3 d) {
  std::ostringstream s;
  s << "(" << d.x << ", " << d.y << ", " << d.z << ")";
  return s.str();
}

uint32_t ceil_div(uint32_t a, uint32_t b) { return uint32_t((uint64_t(a) + b - 1) / b); }

// Worker threads, each with its own fiber stacks; one dispatch at a time.
class Pool {
 public:
  static Pool& instance() {
    static std::once_flag once;
    std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { pool = nullptr; }); });
    std::lock_guard<std::mutex> lock(create_mu);
    // Leaked on purpose: detached workers must not see the pool destroyed
    // by static destructors at exit. A forked child starts a new pool.
    if (!pool) pool = new Pool();
    return *pool;
  }

  size_t size() const { return workers_.size(); }

  void run(Job& job, size_t workers) {
    std::lock_guard<std::mutex> serial(dispatch_mu_);
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &job;
    active_ = remaining_ = std::max<size_t>(1, std::min({workers, workers_.size(), job.order.size()}));
    ++generation_;
    start_cv_.notify_all();
    done_cv_.wait(lock, [&] { return remaining_ == 0; });
    job_ = nullptr;
  }

 private:
  Pool() {
    const unsigned n = env_unsigned("MPS_EXT_SIM_THREADS", std::max(1u, std::thread::hardware_concurrency()));
    const size_t stack_bytes = size_t(env_unsigned("MPS_EXT_SIM_STACK_KB", 64)) * 1024;
    for (unsigned i = 0; i < n; ++i) workers_.push_back(std::make_unique<Worker>(stack_bytes));
    for (unsigned i = 0; i < n; ++i) std::thread([this, i] { loop(i); }).detach();
  }

  void loop(size_t index) {
    Worker& w = *workers_[index];
    w.attach();
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (index >= active_) continue;
      Job& job = *job_;
      const size_t stride = active_;
      lock.unlock();
      w.process(job, index, stride);
      lock.lock();
      if (--remaining_ == 0) done_cv_.notify_all();
    }
  }

  static inline Pool* pool = nullptr;
  static inline std::mutex create_mu;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex dispatch_mu_, mu_;
  std::condition_variable start_cv_, done_cv_;
  Job* job_ = nullptr;
  size_t active_ = 0, remaining_ = 0;
  uint64_t generation_ = 0;
};

std::mutex checked_mu;
std::vector<bool> checked_stack;  // compare_schedules of each open `with checked()`

void validate(const Launch& l) {
  if (!l.module || !l.kernel) throw SimError("dispatch without a kernel");
  const std::string k = "kernel '" + std::string(l.kernel->host_name) + "': ";
  const Dim3 t = l.threadgroup;
  if (!t.x || !t.y || !t.z) throw SimError(k + "threadgroup size " + str(t) + " has a zero dimension");
  const uint64_t threads = product(t);
  if (threads > kMaxThreadsPerThreadgroup)
    throw SimError(k + "threadgroup size " + str(t) + " has " + std::to_string(threads) +
                   " threads; Metal allows at most " + std::to_string(kMaxThreadsPerThreadgroup));
  const uint32_t limit = l.kernel->max_total_threads_per_threadgroup;
  if (limit && threads > limit)
    throw SimError(k + "threadgroup size " + str(t) + " exceeds the kernel's [[max_total_threads_per_threadgroup(" +
                   std::to_string(limit) + ")]]");
  size_t dynamic = 0;
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    const size_t len = l.threadgroup_lengths[i];
    if (len % 16)
      throw SimError(k + "threadgroup memory length " + std::to_string(len) + " at index " + std::to_string(i) +
                     " is not a multiple of 16, as Metal requires");
    dynamic += len;
  }
  if (dynamic > kMaxThreadgroupMemory)
    throw SimError(k + std::to_string(dynamic) + " bytes of threadgroup memory requested; Metal allows " +
                   std::to_string(kMaxThreadgroupMemory));
  const uint64_t groups = l.grid_in_threads ? uint64_t(ceil_div(l.grid.x, t.x)) * ceil_div(l.grid.y, t.y) *
                                                  ceil_div(l.grid.z, t.z)
                                            : product(l.grid);
  if (groups > (uint64_t(1) << 31)) throw SimError(k + "grid " + str(l.grid) + " has too many threadgroups");
}

void prepare(Job& job, const GuardedBuffers* guards) {
  const Launch& l = job.launch;
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    job.buffers[i] = guards && l.buffers[i].data ? guards->data(i) : l.buffers[i].data;
    job.sizes[i] = l.buffers[i].size;
  }
  job.guards = guards;
  const Dim3 t = l.threadgroup;
  job.view.buffers = job.buffers.data();
  job.view.buffer_sizes = job.sizes.data();
  job.view.dispatch_threads_per_threadgroup = t;
  job.view.dispatch_simdgroups_per_threadgroup = ceil_div(uint32_t(product(t)), kSimdWidth);
  if (l.grid_in_threads) {
    job.view.threads_per_grid = l.grid;
    job.view.threadgroups_per_grid = Dim3{ceil_div(l.grid.x, t.x), ceil_div(l.grid.y, t.y), ceil_div(l.grid.z, t.z)};
  } else {
    job.view.threadgroups_per_grid = l.grid;
    job.view.threads_per_grid = Dim3{l.grid.x * t.x, l.grid.y * t.y, l.grid.z * t.z};
  }
  size_t offset = 0;
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    job.threadgroup_offsets[i] = offset;
    offset += l.threadgroup_lengths[i];
  }
  job.dynamic_threadgroup_bytes = offset;

  const uint32_t groups = uint32_t(product(job.view.threadgroups_per_grid));
  job.order.resize(groups);
  for (uint32_t g = 0; g < groups; ++g) job.order[g] = job.schedule == Schedule::Reverse ? groups - 1 - g : g;
  if (job.schedule == Schedule::Random) {
    uint64_t state = job.seed;
    for (uint32_t g = groups; g > 1; --g) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(job.order[g - 1], job.order[(state >> 33) % g]);
    }
  }
}

std::vector<std::string> run(Job& job, const Options& options) {
  Pool& pool = Pool::instance();
  pool.run(job, options.workers ? options.workers : pool.size());
  const std::string error = job.error();
  if (!error.empty()) throw SimError(error);
  return job.warnings();
}

void append(std::vector<std::string>& all, const std::vector<std::string>& more) {
  for (const auto& w : more)
    if (std::find(all.begin(), all.end(), w) == all.end()) all.push_back(w);
}

std::string compare(const std::vector<std::vector<unsigned char>>& a, const std::vector<std::vector<unsigned char>>& b,
                    Schedule schedule, const KernelInfo& kernel) {
  for (uint32_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    size_t first = 0, count = 0;
    for (size_t j = a[i].size(); j-- > 0;)
      if (a[i][j] != b[i][j]) {
        first = j;
        ++count;
      }
    const size_t word = first / 4 * 4;
    std::ostringstream m;
    m << "kernel '" << kernel.host_name << "' is not deterministic: the forward and " << schedule_name(schedule)
      << " schedules wrote different results to buffer(" << i << ") (" << count << " bytes differ, the first at byte "
      << first;
    if (word + 4 <= a[i].size()) {
      uint32_t x, y;
      float fx, fy;
      std::memcpy(&x, &a[i][word], 4);
      std::memcpy(&y, &b[i][word], 4);
      std::memcpy(&fx, &x, 4);
      std::memcpy(&fy, &y, 4);
      m << std::hex << ": 0x" << x << " vs 0x" << y << std::dec << ", as float " << fx << " vs " << fy;
    }
    m << "). Threads read threadgroup memory another thread writes without a threadgroup_barrier in between, read "
         "threadgroup memory nobody wrote, or race on device memory.";
    return m.str();
  }
  return "";
}

}  // namespace

Report dispatch(const Launch& l, const Options& options) {
  validate(l);
  if (!product(l.grid)) return {};
  install_fault_handlers();

  Report report;
  if (!options.checked) {
    Job job(l, Schedule::Forward, options.seed);
    prepare(job, nullptr);
    report.warnings = run(job, options);
    return report;
  }

  // Checked: run on guarded copies under several schedules; every run must
  // produce the same bytes.
  GuardedBuffers guards(l);
  std::vector<std::vector<unsigned char>> reference;
  const std::vector<Schedule> schedules =
      options.compare_schedules ? std::vector<Schedule>{Schedule::Forward, Schedule::Reverse, Schedule::Random}
                                : std::vector<Schedule>{Schedule::Forward};
  for (Schedule s : schedules) {
    guards.load();
    Job job(l, s, options.seed);
    prepare(job, &guards);
    try {
      append(report.warnings, run(job, options));
    } catch (const SimError& e) {
      throw SimError(s == Schedule::Forward ? e.what() : std::string(e.what()) + " (" + schedule_name(s) +
                                                             " schedule)");
    }
    const std::string canaries = guards.check_canaries();
    if (!canaries.empty()) throw SimError("kernel '" + std::string(l.kernel->host_name) + "': " + canaries);
    if (reference.empty()) {
      reference = guards.contents();
      continue;
    }
    const std::string diff = compare(reference, guards.contents(), s, *l.kernel);
    if (!diff.empty()) throw SimError(diff);
  }
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i)
    if (l.buffers[i].data && l.buffers[i].size) std::memcpy(l.buffers[i].data, reference[i].data(), l.buffers[i].size);
  return report;
}

void push_checked(bool compare_schedules) {
  std::lock_guard<std::mutex> lock(checked_mu);
  checked_stack.push_back(compare_schedules);
}

void pop_checked() {
  std::lock_guard<std::mutex> lock(checked_mu);
  if (!checked_stack.empty()) checked_stack.pop_back();
}

Options default_options() {
  static const bool env = [] {
    const char* v = std::getenv("MPS_EXT_SIM_CHECK");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  std::lock_guard<std::mutex> lock(checked_mu);
  Options o;
  o.checked = env || !checked_stack.empty();
  o.compare_schedules = checked_stack.empty() || checked_stack.back();
  return o;
}

}  // namespace mtlsim
