#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>

#include "checked.h"
#include "fork.h"
#include "runtime.h"
#include "worker.h"

namespace mtlsim {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(50);

// An integer from the environment in [lo, hi]; anything else is an error
// rather than a guess.
unsigned env_count(const char* name, unsigned fallback, unsigned lo, unsigned hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (errno || end == v || *end || n < lo || n > hi)
    throw SimError(std::string(name) + "=" + v + ": expected an integer from " + std::to_string(lo) + " to " +
                   std::to_string(hi));
  return unsigned(n);
}

unsigned usable_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

// The memory mappings fiber stacks may take: half of Linux's per-process
// limit, leaving the rest to everything else in the process.
size_t mapping_budget() {
  size_t limit = 65530;
#if defined(__linux__)
  if (FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
    unsigned long n = 0;
    if (std::fscanf(f, "%lu", &n) == 1 && n > 0) limit = n;
    std::fclose(f);
  }
#endif
  return limit / 2;
}

uint64_t product(Dim3 d) { return uint64_t(d.x) * d.y * d.z; }

std::string str(Dim3 d) {
  std::ostringstream s;
  s << "(" << d.x << ", " << d.y << ", " << d.z << ")";
  return s.str();
}

std::string seconds(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

uint32_t ceil_div(uint32_t a, uint32_t b) { return uint32_t((uint64_t(a) + b - 1) / b); }

std::atomic<InterruptCheck> interrupt_check{nullptr};

// Worker threads, each with its own fiber stacks; one dispatch at a time.
class Pool {
 public:
  // Throws SimError when the environment asks for an invalid pool; the next
  // dispatch reads it again.
  static Pool& instance() {
    static std::once_flag once;
    std::call_once(once, [] {
      fork_protect(create_mu, ForkRank::Pool);
      pthread_atfork(nullptr, nullptr, [] { pool = nullptr; });
    });
    std::lock_guard<std::mutex> lock(create_mu);
    // Leaked on purpose: detached workers must not see the pool destroyed
    // by static destructors at exit. A forked child starts a new pool.
    if (!pool) pool = new Pool();
    return *pool;
  }

  size_t size() const { return workers_.size(); }

  void run(Job& job, size_t requested, const Options& options) {
    std::unique_lock<std::timed_mutex> serial(dispatch_mu_, std::defer_lock);
    while (!serial.try_lock_for(kPoll))
      if (std::exception_ptr e = poll_interrupt()) std::rethrow_exception(e);
    const Clock::time_point start = Clock::now();
    SignalHandlers handlers;
    const size_t active = prepare_workers(job, requested);

    std::unique_lock<std::mutex> lock(mu_);
    job_ = &job;
    active_ = remaining_ = active;
    ++generation_;
    start_cv_.notify_all();
    std::exception_ptr interrupted;
    bool stopping = false;
    while (!done_cv_.wait_for(lock, kPoll, [&] { return remaining_ == 0; })) {
      if (!stopping) {
        const std::string kernel = "kernel '" + std::string(job.launch.kernel->host_name) + "' ";
        const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
        if (options.timeout_s > 0 && elapsed > options.timeout_s) {
          job.fail(kernel + "timed out after " + seconds(options.timeout_s) + " s (" + options.timeout_source + ")");
          stopping = true;
        } else {
          lock.unlock();
          interrupted = poll_interrupt();
          lock.lock();
          if (interrupted) {
            job.fail(kernel + "interrupted");
            stopping = true;
          }
        }
      }
      // GPU threads never yield in a loop without barriers or atomics: a
      // signal makes their worker abandon them (also when another GPU
      // thread's fault failed the job).
      if (stopping || job.aborted)
        for (size_t i = 0; i < active; ++i) pthread_kill(workers_[i]->thread(), stop_signal());
    }
    job_ = nullptr;
    if (interrupted) std::rethrow_exception(interrupted);
  }

 private:
  Pool() {
    const unsigned n = env_count("MPS_EXT_SIM_THREADS", std::min(usable_cpus(), kDefaultMaxWorkers), 1, kMaxWorkers);
    stack_bytes_ = size_t(env_count("MPS_EXT_SIM_STACK_KB", 64, kMinStackKB, kMaxStackKB)) * 1024;
    budget_ = mapping_budget();
    for (unsigned i = 0; i < n; ++i) workers_.push_back(std::make_unique<Worker>(stack_bytes_));
    for (unsigned i = 0; i < n; ++i) {
      try {
        std::thread([this, i] { loop(i); }).detach();
      } catch (const std::system_error&) {
        // The system gives no more threads: run with those it gave.
        if (i == 0) throw SimError("cannot start a simulator worker thread");
        workers_.resize(i);
        break;
      }
    }
    // Wait until every worker has its thread id (the stop signal needs it).
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return attached_count_ == workers_.size(); });
  }

  // Stacks for the workers that run `job`, within the mapping budget; the
  // number of workers to run it on. Workers are idle here.
  size_t prepare_workers(const Job& job, size_t requested) {
    const size_t threads = product(job.launch.threadgroup);
    size_t active = std::max<size_t>(1, std::min({requested, workers_.size(), job.order.size()}));
    active = std::min(active, std::max<size_t>(1, budget_ / (2 * Worker::stacks_for(threads) + 1)));
    try {
      for (size_t i = 0; i < active; ++i) workers_[i]->reserve_stacks(threads);
    } catch (const std::exception& e) {
      throw SimError(std::string(e.what()) + " (MPS_EXT_SIM_STACK_KB, MPS_EXT_SIM_THREADS)");
    }
    size_t total = 0;
    for (const auto& w : workers_) total += w->mappings();
    if (total > budget_)
      for (size_t i = active; i < workers_.size(); ++i) workers_[i]->release_stacks();
    return active;
  }

  void loop(size_t index) {
    Worker& w = *workers_[index];
    w.attach();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++attached_count_;
    }
    done_cv_.notify_all();
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
  size_t stack_bytes_ = 0, budget_ = 0, attached_count_ = 0;
  std::timed_mutex dispatch_mu_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  Job* job_ = nullptr;
  size_t active_ = 0, remaining_ = 0;
  uint64_t generation_ = 0;
};

struct CheckedBlock {
  uint64_t token;
  std::thread::id thread;
  bool compare_schedules;
  double timeout_s;
};
std::mutex checked_mu;
uint64_t next_token = 0;
std::vector<CheckedBlock> checked_blocks;  // in the order they were opened
const bool fork_safe = (fork_protect(checked_mu, ForkRank::Checked), true);

// MPS_EXT_SIM_TIMEOUT in seconds, 0 when unset.
double env_timeout() {
  const char* v = std::getenv("MPS_EXT_SIM_TIMEOUT");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const double t = std::strtod(v, &end);
  if (end == v || *end || !(t > 0) || !std::isfinite(t))
    throw SimError(std::string("MPS_EXT_SIM_TIMEOUT=") + v + ": expected a positive number of seconds");
  return t;
}

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
    // Each length is bounded before the sum, which therefore cannot wrap.
    if (len > kMaxThreadgroupMemory || (dynamic += len) > kMaxThreadgroupMemory)
      throw SimError(k + "threadgroup memory of " + std::to_string(len) + " bytes at index " + std::to_string(i) +
                     " brings the total over Metal's limit of " + std::to_string(kMaxThreadgroupMemory) + " bytes");
  }
  const uint64_t groups = l.grid_in_threads ? uint64_t(ceil_div(l.grid.x, t.x)) * ceil_div(l.grid.y, t.y) *
                                                  ceil_div(l.grid.z, t.z)
                                            : product(l.grid);
  if (groups > (uint64_t(1) << 31)) throw SimError(k + "grid " + str(l.grid) + " has too many threadgroups");
}

void prepare(Job& job, const GuardedBuffers& guards, const Options& options) {
  const Launch& l = job.launch;
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    job.buffers[i] = l.buffers[i].data ? guards.data(i) : nullptr;
    job.sizes[i] = l.buffers[i].size;
  }
  job.guards = &guards;
  const Dim3 t = l.threadgroup;
  job.view.buffers = job.buffers.data();
  job.view.buffer_sizes = job.sizes.data();
  job.view.dispatch_threads_per_threadgroup = t;
  job.view.dispatch_simdgroups_per_threadgroup = ceil_div(uint32_t(product(t)), kSimdWidth);
  job.view.flush_half_subnormals = options.flush_half_subnormals;
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

// A dispatch's os_log messages, on stderr (where Metal writes them with MTL_LOG_TO_STDERR=1): those of its
// first run only (checked mode runs it again under other schedules), also when it failed.
void write_logs(const Job& job) {
  size_t dropped = 0;
  std::string text;
  for (const std::string& line : job.logs(&dropped)) text += line + "\n";
  if (dropped)
    text += "os_log: " + std::to_string(dropped) + " more messages of kernel '" + job.launch.kernel->host_name +
            "' dropped (" + std::to_string(Job::kMaxLogMessages) + " are kept per dispatch)\n";
  if (!text.empty()) {
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }
}

std::vector<std::string> run(Job& job, const Options& options) {
  Pool& pool = Pool::instance();
  pool.run(job, options.workers ? options.workers : pool.size(), options);
  if (job.schedule == Schedule::Forward) write_logs(job);
  const std::string error = job.error();
  if (!error.empty()) throw SimError(error);
  return job.warnings();
}

void append(std::vector<std::string>& all, const std::vector<std::string>& more) {
  for (const auto& w : more)
    if (std::find(all.begin(), all.end(), w) == all.end()) all.push_back(w);
}

std::string compare(const std::vector<std::vector<unsigned char>>& a, const std::vector<std::vector<unsigned char>>& b,
                    Schedule schedule, const KernelInfo& kernel, const GuardedBuffers& guards) {
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
      << guards.offset_in(i, first);
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

  // Every mode runs on copies of the buffers that end at guard pages, so an
  // out-of-bounds access is an error instead of damage to the process; the
  // copies go back to the caller's memory only when the dispatch succeeded.
  GuardedBuffers guards(l);
  Report report;
  // Checked mode runs under several schedules; every run must produce the same bytes.
  std::vector<std::vector<unsigned char>> reference;
  const std::vector<Schedule> schedules =
      options.checked && options.compare_schedules
          ? std::vector<Schedule>{Schedule::Forward, Schedule::Reverse, Schedule::Random}
          : std::vector<Schedule>{Schedule::Forward};
  for (Schedule s : schedules) {
    guards.load();
    Job job(l, s, options.seed);
    prepare(job, guards, options);
    try {
      append(report.warnings, run(job, options));
    } catch (const SimError& e) {
      throw SimError(s == Schedule::Forward ? e.what() : std::string(e.what()) + " (" + schedule_name(s) +
                                                             " schedule)");
    }
    const std::string canaries = guards.check_canaries();
    if (!canaries.empty()) throw SimError("kernel '" + std::string(l.kernel->host_name) + "': " + canaries);
    if (schedules.size() == 1) break;
    if (reference.empty()) {
      reference = guards.contents();
      continue;
    }
    const std::string diff = compare(reference, guards.contents(), s, *l.kernel, guards);
    if (!diff.empty()) throw SimError(diff);
  }
  guards.store();
  return report;
}

void set_interrupt_check(InterruptCheck check) { interrupt_check = check; }

std::exception_ptr poll_interrupt() {
  const InterruptCheck check = interrupt_check.load();
  return check ? check() : nullptr;
}

uint64_t push_checked(bool compare_schedules, double timeout_s) {
  std::lock_guard<std::mutex> lock(checked_mu);
  checked_blocks.push_back(CheckedBlock{++next_token, std::this_thread::get_id(), compare_schedules, timeout_s});
  return next_token;
}

void pop_checked(uint64_t token) {
  std::lock_guard<std::mutex> lock(checked_mu);
  for (auto it = checked_blocks.begin(); it != checked_blocks.end(); ++it) {
    if (it->token == token) {
      checked_blocks.erase(it);
      return;
    }
  }
}

std::atomic<bool> flush_half_subnormals{false};

bool set_flush_half_subnormals(bool flush) { return flush_half_subnormals.exchange(flush); }

Options default_options() {
  static const bool env = [] {
    const char* v = std::getenv("MPS_EXT_SIM_CHECK");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  Options o;
  o.timeout_s = env_timeout();
  o.timeout_source = "MPS_EXT_SIM_TIMEOUT";
  o.flush_half_subnormals = flush_half_subnormals.load();
  std::lock_guard<std::mutex> lock(checked_mu);
  const CheckedBlock* block = nullptr;
  for (auto it = checked_blocks.rbegin(); it != checked_blocks.rend() && !block; ++it)
    if (it->thread == std::this_thread::get_id()) block = &*it;
  if (!block && !checked_blocks.empty()) block = &checked_blocks.back();
  o.checked = env || block;
  if (block) {
    o.compare_schedules = block->compare_schedules;
    if (block->timeout_s > 0) {
      o.timeout_s = block->timeout_s;
      o.timeout_source = "checked(timeout=...)";
    }
  }
  return o;
}

}  // namespace mtlsim
