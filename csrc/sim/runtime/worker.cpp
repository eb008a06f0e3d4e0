#include "worker.h"

#include <signal.h>
#if defined(__APPLE__)
#include <sys/ucontext.h>
#else
#include <ucontext.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "checked.h"
#include "log.h"
#include "symbolize.h"

namespace mtlsim {

namespace {

thread_local Worker* tls_worker = nullptr;

// Consecutive yields with no thread blocking or finishing before a spin loop
// is declared hopeless (about a second of spinning).
constexpr uint64_t kSpinLimit = uint64_t(1) << 24;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Dim3 unlinear(uint64_t i, Dim3 size) {
  return Dim3{uint32_t(i % size.x), uint32_t(i / size.x % size.y), uint32_t(i / size.x / size.y)};
}

std::string str(Dim3 d) {
  std::ostringstream s;
  s << "(" << d.x << ", " << d.y << ", " << d.z << ")";
  return s.str();
}

std::string str(const Site& site) {
  std::ostringstream s;
  s << (site.file ? site.file : "?") << ":" << site.line;
  return s.str();
}


// Call sites are source lines: the compiler may duplicate or merge the code of
// one call (which a GPU compiler never does with SIMD-group functions), so
// code addresses cannot tell them apart reliably.
bool same_site(const Site& a, const Site& b) {
  return a.line == b.line && (a.file == b.file || (a.file && b.file && std::strcmp(a.file, b.file) == 0));
}

uint32_t lane_mask(uint32_t threads, uint32_t sg) {
  const uint32_t n = threads - sg * kSimdWidth;
  return n >= kSimdWidth ? ~0u : (1u << n) - 1u;
}

}  // namespace

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::Forward: return "forward";
    case Schedule::Reverse: return "reverse";
    case Schedule::Random: return "random";
  }
  return "?";
}

Job::Job(const Launch& l, Schedule s, uint64_t sd) : launch(l), schedule(s), seed(sd) {}

void Job::fail(const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.empty()) error_ = message;
  aborted = true;
}

void Job::warn(const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& w : warnings_)
    if (w == message) return;
  warnings_.push_back(message);
}

void Job::log(std::string line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (logs_.size() < kMaxLogMessages) logs_.push_back(std::move(line));
  else ++dropped_logs_;
}

std::vector<std::string> Job::logs(size_t* dropped) const {
  std::lock_guard<std::mutex> lock(mu_);
  *dropped = dropped_logs_;
  return logs_;
}

std::string Job::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

std::vector<std::string> Job::warnings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return warnings_;
}

Worker::Worker(size_t stack_bytes)
    : stack_bytes_(stack_bytes), fibers_(kMaxThreadsPerThreadgroup), order_(kMaxThreadsPerThreadgroup),
      arena_(kMaxThreadgroupMemory) {}

Worker::~Worker() {
  if (tls_worker == this) {
    stack_t off{};
    off.ss_flags = SS_DISABLE;
    sigaltstack(&off, nullptr);
    tls_worker = nullptr;
  }
  std::free(alt_stack_);
}

Worker* Worker::current() { return tls_worker; }

void Worker::attach() {
  tls_worker = this;
  thread_ = pthread_self();
  // Faults are handled on their own stack: a fiber that overflowed its stack
  // has none left.
  const size_t size = 64 * 1024;
  alt_stack_ = std::malloc(size);
  if (alt_stack_) {
    stack_t ss{};
    ss.ss_sp = alt_stack_;
    ss.ss_size = size;
    sigaltstack(&ss, nullptr);
  }
  // Signals meant for the process (Ctrl-C, timers, children) are handled by
  // the other threads; a worker takes only its faults and the stop signal.
  sigset_t others;
  sigfillset(&others);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, stop_signal()}) sigdelset(&others, sig);
  pthread_sigmask(SIG_BLOCK, &others, nullptr);
}

size_t Worker::stacks_for(size_t threads) {
  size_t count = kSimdWidth;
  while (count < threads) count *= 2;
  return std::min<size_t>(count, kMaxThreadsPerThreadgroup);
}

void Worker::reserve_stacks(size_t threads) {
  const size_t count = stacks_for(threads);
  if (stacks_ && stacks_->count() >= count) return;
  stacks_.reset();
  stacks_ = std::make_unique<StackPool>(count, stack_bytes_);
}

void Worker::process(Job& job, size_t first, size_t stride) {
  job_ = &job;
  if (sigsetjmp(escape_, 1)) {
    in_kernel_ = false;
    if (fault_.kind != FaultKind::Stopped) report_fault();
    return;
  }
  try {
    for (size_t k = first; k < job.order.size() && !job.aborted; k += stride) run_group(job, job.order[k]);
  } catch (const std::exception& e) {
    job.fail(std::string("simulator error: ") + e.what());
  }
}

void Worker::start_fibers(Job& job, uint32_t linear_group) {
  const Launch& l = job.launch;
  const Dim3 gp = unlinear(linear_group, job.view.threadgroups_per_grid);
  Dim3 size = l.threadgroup;
  if (l.grid_in_threads) {
    // dispatchThreads: the last threadgroup in each dimension holds the rest.
    auto edge = [](uint32_t declared, uint32_t grid, uint32_t pos) {
      return std::min<uint64_t>(declared, uint64_t(grid) - uint64_t(pos) * declared);
    };
    size = Dim3{uint32_t(edge(size.x, l.grid.x, gp.x)), uint32_t(edge(size.y, l.grid.y, gp.y)),
                uint32_t(edge(size.z, l.grid.z, gp.z))};
  }
  threads_ = size.x * size.y * size.z;
  const uint32_t simdgroups = (threads_ + kSimdWidth - 1) / kSimdWidth;

  arena_used_ = job.dynamic_threadgroup_bytes;
  std::memset(arena_.data(), 0xff, arena_used_);
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    const size_t len = l.threadgroup_lengths[i];
    group_buffers_[i] = len ? arena_.data() + job.threadgroup_offsets[i] : nullptr;
    group_sizes_[i] = len;
  }
  site_offset_.assign(l.module->info->num_threadgroup_sites, -1);
  group_ = ThreadgroupView{group_buffers_.data(), group_sizes_.data(), gp, size, simdgroups};

  simd_live_.resize(simdgroups);
  simd_waiting_.assign(simdgroups, 0);
  for (uint32_t sg = 0; sg < simdgroups; ++sg) simd_live_[sg] = lane_mask(threads_, sg);
  live_ = threads_;
  done_ = at_barrier_ = 0;
  arrivals_ = idle_yields_ = 0;
  aborted_group_ = false;

  const Dim3 declared = l.threadgroup;
  for (uint32_t i = 0; i < threads_; ++i) {
    Fiber& f = fibers_[i];
    const Dim3 tid = unlinear(i, size);
    f.state = State::Runnable;
    f.thread = ThreadCtx{&job.view, &group_,
                         Dim3{gp.x * declared.x + tid.x, gp.y * declared.y + tid.y, gp.z * declared.z + tid.z},
                         tid, i};
    make_context(f.ctx, stacks_->stack(i), stacks_->stack_bytes(), &Worker::fiber_main, this);
  }

  for (uint32_t i = 0; i < threads_; ++i) order_[i] = job.schedule == Schedule::Reverse ? threads_ - 1 - i : i;
  if (job.schedule == Schedule::Random) {
    uint64_t state = job.seed ^ (uint64_t(linear_group) * 0x9e3779b97f4a7c15ull);
    for (uint32_t i = threads_; i > 1; --i) std::swap(order_[i - 1], order_[splitmix64(state) % i]);
  }
}

void Worker::run_group(Job& job, uint32_t linear_group) {
  start_fibers(job, linear_group);
  while (live_ > 0) {
    bool ran = false;
    for (uint32_t k = 0; k < threads_; ++k) {
      const uint32_t i = order_[k];
      if (fibers_[i].state != State::Runnable) continue;
      ran = true;
      running_ = i;
      in_kernel_ = true;
      switch_context(scheduler_, fibers_[i].ctx);
      in_kernel_ = false;
      if (aborted_group_) return;
      after_switch(i);
      if (job.aborted) return;
    }
    if (!ran) resolve_deadlock();
  }
}

void Worker::fiber_main(void* self) {
  auto* w = static_cast<Worker*>(self);
  w->job_->launch.kernel->entry(&w->fibers_[w->running_].thread);
  w->suspend(State::Done);
}

void Worker::suspend(State state) {
  Fiber& f = fibers_[running_];
  f.state = state;
  switch_context(f.ctx, scheduler_);
}

void Worker::after_switch(uint32_t i) {
  const uint32_t sg = i / kSimdWidth, bit = 1u << (i % kSimdWidth);
  switch (fibers_[i].state) {
    case State::Done:
      --live_;
      ++done_;
      simd_live_[sg] &= ~bit;
      idle_yields_ = 0;
      check_simdgroup(sg);
      check_barrier();
      break;
    case State::Collective:
      simd_waiting_[sg] |= bit;
      idle_yields_ = 0;
      check_simdgroup(sg);
      break;
    case State::Barrier:
      ++at_barrier_;
      idle_yields_ = 0;
      check_barrier();
      break;
    case State::Runnable:
      if (++idle_yields_ > kSpinLimit)
        job_->fail("kernel '" + std::string(job_->launch.kernel->host_name) +
                   "': GPU threads keep spinning on atomics that no other thread of the threadgroup changes "
                   "(threadgroups run one at a time per worker, and Metal guarantees no order between them)");
      break;
  }
}

void Worker::check_simdgroup(uint32_t sg) {
  const uint32_t live = simd_live_[sg];
  if (!live || simd_waiting_[sg] != live) return;
  const Fiber& first = fibers_[sg * kSimdWidth + __builtin_ctz(live)];
  for (uint32_t m = live; m; m &= m - 1) {
    const Fiber& f = fibers_[sg * kSimdWidth + __builtin_ctz(m)];
    if (f.fn != first.fn || !same_site(f.site, first.site)) return;  // divergent: resolved when stuck
  }
  complete_collective(sg, live);
}

void Worker::complete_collective(uint32_t sg, uint32_t mask) {
  const void* in[kSimdWidth] = {};
  void* out[kSimdWidth] = {};
  const uint32_t base = sg * kSimdWidth;
  const CollectiveFn fn = fibers_[base + __builtin_ctz(mask)].fn;
  for (uint32_t m = mask; m; m &= m - 1) {
    const uint32_t lane = __builtin_ctz(m);
    in[lane] = fibers_[base + lane].in;
    out[lane] = fibers_[base + lane].out;
    fibers_[base + lane].state = State::Runnable;
  }
  simd_waiting_[sg] &= ~mask;
  if (fn) {
    running_ = base + __builtin_ctz(mask);
    collective_ = &fibers_[running_].site;
    in_kernel_ = true;
    fn(in, out, mask);
    in_kernel_ = false;
    collective_ = nullptr;
  }
}

void Worker::check_barrier() {
  if (live_ == 0 || at_barrier_ != live_) return;
  uint32_t first = threads_;
  for (uint32_t i = 0; i < threads_; ++i) {
    Fiber& f = fibers_[i];
    if (f.state != State::Barrier) continue;
    if (first == threads_) {
      first = i;
    } else if (!same_site(f.site, fibers_[first].site)) {
      job_->warn("divergent threadgroup_barrier in kernel '" + std::string(job_->launch.kernel->host_name) +
                 "': " + where(first, &fibers_[first].site) + " and " + where(i, &f.site) +
                 " wait at different barriers (undefined behaviour on the GPU)");
    }
    f.state = State::Runnable;
  }
  if (done_ > 0)
    job_->warn("threadgroup_barrier at " + str(fibers_[first].site) + " in kernel '" +
               job_->launch.kernel->host_name + "' is reached after " + std::to_string(done_) + " of " +
               std::to_string(threads_) +
               " threads of the threadgroup returned (undefined behaviour on the GPU: keep every thread "
               "alive until the last barrier)");
  at_barrier_ = 0;
}

void Worker::resolve_deadlock() {
  // Nothing can run: the live lanes of some SIMD group wait at different
  // places. The GPU would run the SIMD-group function for the lanes that
  // reached it (the active lanes), which is what happens here too.
  uint32_t pick = threads_;
  for (uint32_t i = 0; i < threads_; ++i)
    if (fibers_[i].state == State::Collective && (pick == threads_ || fibers_[i].arrival < fibers_[pick].arrival))
      pick = i;
  if (pick == threads_) {
    job_->fail("simulator deadlock in kernel '" + std::string(job_->launch.kernel->host_name) + "'");
    aborted_group_ = true;
    live_ = 0;
    return;
  }
  const uint32_t sg = pick / kSimdWidth;
  const Fiber& p = fibers_[pick];
  uint32_t mask = 0;
  for (uint32_t m = simd_waiting_[sg]; m; m &= m - 1) {
    const Fiber& f = fibers_[sg * kSimdWidth + __builtin_ctz(m)];
    if (f.fn == p.fn && same_site(f.site, p.site)) mask |= 1u << __builtin_ctz(m);
  }
  std::string others;
  for (uint32_t m = simd_live_[sg] & ~mask; m; m &= m - 1) {
    const uint32_t i = sg * kSimdWidth + __builtin_ctz(m);
    if (!others.empty()) others += "; ";
    others += "lane " + std::to_string(i % kSimdWidth) + " at " +
              (fibers_[i].state == State::Barrier ? "threadgroup_barrier " : "") + str(fibers_[i].site);
  }
  job_->warn("divergent SIMD-group function at " + str(p.site) + " in kernel '" +
             job_->launch.kernel->host_name + "': it ran for lanes " + lanes(mask) + " of SIMD group " +
             std::to_string(sg) + " while the other live lanes were elsewhere (" + others + ")");
  complete_collective(sg, mask);
}

std::string Worker::lanes(uint32_t mask) const {
  std::string s;
  for (uint32_t lane = 0; lane < kSimdWidth;) {
    if (!((mask >> lane) & 1u)) {
      ++lane;
      continue;
    }
    uint32_t end = lane;
    while (end + 1 < kSimdWidth && ((mask >> (end + 1)) & 1u)) ++end;
    if (!s.empty()) s += ",";
    s += std::to_string(lane) + (end > lane ? "-" + std::to_string(end) : "");
    lane = end + 1;
  }
  return s;
}

std::string Worker::where(uint32_t fiber, const Site* site) const {
  const ThreadCtx& t = fibers_[fiber].thread;
  std::string s = "thread " + str(t.thread_position_in_grid) + " (threadgroup " +
                  str(group_.threadgroup_position_in_grid) + ", thread " + str(t.thread_position_in_threadgroup) +
                  ")";
  if (site && site->file) s += " at " + str(*site);
  return s;
}

void Worker::collective(CollectiveFn fn, const void* in, void* out, const Site& site) {
  Fiber& f = fibers_[running_];
  f.fn = fn;
  f.in = in;
  f.out = out;
  f.site = site;
  f.arrival = arrivals_++;
  suspend(State::Collective);
}

void Worker::barrier(const Site& site) {
  fibers_[running_].site = site;
  suspend(State::Barrier);
}

void* Worker::threadgroup_alloc(uint32_t id, size_t size, size_t align, const Site& site) {
  // Runtime code (allocations, locks): a stop signal must not escape from it.
  in_kernel_ = false;
  if (id >= site_offset_.size()) fail("threadgroup declaration id out of range (stale module?)", site);
  if (site_offset_[id] < 0) {
    const size_t offset = (arena_used_ + align - 1) / align * align;
    if (offset + size > kMaxThreadgroupMemory) {
      std::ostringstream m;
      m << "threadgroup memory exceeds Metal's limit of " << kMaxThreadgroupMemory << " bytes: this declaration needs "
        << size << " bytes at offset " << offset;
      if (job_->dynamic_threadgroup_bytes) m << " (" << job_->dynamic_threadgroup_bytes << " bytes of [[threadgroup(n)]] memory)";
      fail(m.str().c_str(), site);
    }
    // Poison: a thread that reads before anyone wrote sees NaN / all ones.
    std::memset(arena_.data() + offset, 0xff, size);
    site_offset_[id] = int64_t(offset);
    arena_used_ = offset + size;
  }
  in_kernel_ = true;
  return arena_.data() + site_offset_[id];
}

void Worker::yield() { suspend(State::Runnable); }

const ThreadCtx* Worker::current_thread() const { return &fibers_[running_].thread; }

void Worker::log(const LogMessage& m, const Site& site) {
  in_kernel_ = false;  // runtime code (allocations, a lock), as in threadgroup_alloc
  std::string line = std::string("os_log ") + log_level_name(m.type);
  if (m.subsystem) line += std::string(" [") + m.subsystem + (m.category ? std::string(":") + m.category : "") + "]";
  job_->log(line + ": " + format_log(m) + " — kernel '" + job_->launch.kernel->host_name + "', " +
            where(running_, &site));
  in_kernel_ = true;
}

void Worker::fail(const char* message, const Site& site) {
  in_kernel_ = false;
  job_->fail(std::string(message) + " — kernel '" + job_->launch.kernel->host_name + "', " + where(running_, &site));
  aborted_group_ = true;
  switch_context(fibers_[running_].ctx, scheduler_);
  std::abort();  // never resumed
}

void Worker::escape_from_fault(const Fault& fault) {
  fault_ = fault;
  siglongjmp(escape_, 1);
}

void Worker::report_fault() {
  const char* access = fault_.kind == FaultKind::Write ? "write" : fault_.kind == FaultKind::Read ? "read" : "access";
  std::string what;
  if (job_->guards) what = job_->guards->describe(fault_.addr, access);
  if (what.empty() && stacks_->guard_owner(fault_.addr) >= 0)
    what = "stack overflow (each GPU thread has " + std::to_string(stack_bytes_ / 1024) +
           " KiB; set MPS_EXT_SIM_STACK_KB)";
  if (what.empty()) {
    std::ostringstream s;
    s << "invalid memory " << access << " at address " << fault_.addr;
    what = s.str();
  }
  if (fault_.kind == FaultKind::DivideByZero) what = "integer division by zero";
  // A fault inside a SIMD-group function is reported at the kernel's call.
  const std::string line = collective_ ? str(*collective_) : symbolize(fault_.pc);
  collective_ = nullptr;
  job_->fail(what + " — kernel '" + job_->launch.kernel->host_name + "', " + where(running_, nullptr) +
             (line.empty() ? "" : " at " + line));
}

// ---- signals ---------------------------------------------------------------

namespace {

// Default action: ignore, so a stop signal that arrives after the dispatch
// (when the handlers are restored) is harmless.
constexpr int kStopSignal = SIGURG;
constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, kStopSignal};
constexpr int kNumSignals = 4;

struct sigaction previous[kNumSignals];
bool installed[kNumSignals];
// Whether a fault that is not a GPU thread's was handed on since install.
std::atomic<bool> chained[kNumSignals];

int signal_slot(int sig) {
  for (int i = 0; i < kNumSignals; ++i)
    if (kSignals[i] == sig) return i;
  return 0;
}

void* fault_pc(void* context) {
  auto* uc = static_cast<ucontext_t*>(context);
#if defined(__APPLE__) && defined(__aarch64__)
  return reinterpret_cast<void*>(uc->uc_mcontext->__ss.__pc);
#elif defined(__APPLE__) && defined(__x86_64__)
  return reinterpret_cast<void*>(uc->uc_mcontext->__ss.__rip);
#elif defined(__linux__) && defined(__x86_64__)
  return reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__linux__) && defined(__aarch64__)
  return reinterpret_cast<void*>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return nullptr;
#endif
}

FaultKind fault_kind(int sig, void* context) {
  if (sig == SIGFPE) return FaultKind::DivideByZero;
#if defined(__linux__) && defined(__x86_64__)
  // Bit 1 of the page-fault error code: the access was a write.
  return (static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_ERR] & 2) ? FaultKind::Write : FaultKind::Read;
#else
  (void)context;
  return FaultKind::Access;
#endif
}

bool is_handler(const struct sigaction& a, void (*fn)(int, siginfo_t*, void*)) {
  return (a.sa_flags & SA_SIGINFO) && a.sa_sigaction == fn;
}

// Hands a signal that is not the simulator's to the handler installed before.
void chain(int sig, siginfo_t* info, void* context) {
  const int slot = signal_slot(sig);
  const struct sigaction& prev = previous[slot];
  const bool is_fault = sig != kStopSignal;
  // A fault handed on once already (or a handler that hands it back here):
  // the default action, when the instruction faults again.
  if (is_fault && chained[slot].exchange(true)) {
    signal(sig, SIG_DFL);
    return;
  }
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction) prev.sa_sigaction(sig, info, context);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  } else if (is_fault) {
    signal(sig, SIG_DFL);
  }
}

void on_signal(int sig, siginfo_t* info, void* context) {
  Worker* w = Worker::current();
  if (sig == kStopSignal) {
    if (w) {
      if (w->in_kernel() && w->job_stopped()) w->escape_from_fault(Fault{nullptr, nullptr, FaultKind::Stopped});
      return;
    }
  } else if (w && w->in_kernel()) {
    w->escape_from_fault(Fault{info->si_addr, fault_pc(context), fault_kind(sig, context)});
  }
  chain(sig, info, context);
}

}  // namespace

int stop_signal() { return kStopSignal; }

SignalHandlers::SignalHandlers() {
  for (int i = 0; i < kNumSignals; ++i) {
    struct sigaction current {};
    sigaction(kSignals[i], nullptr, &current);
    if (is_handler(current, on_signal)) continue;
    struct sigaction mine {};
    mine.sa_sigaction = on_signal;
    mine.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&mine.sa_mask);
    chained[i] = false;
    sigaction(kSignals[i], &mine, &previous[i]);
    installed[i] = true;
  }
}

SignalHandlers::~SignalHandlers() {
  for (int i = 0; i < kNumSignals; ++i) {
    if (!installed[i]) continue;
    struct sigaction current {};
    sigaction(kSignals[i], nullptr, &current);
    // Someone installed a handler over ours meanwhile: it may hand signals
    // to ours, which stays (and keeps handing them on).
    if (!is_handler(current, on_signal)) continue;
    sigaction(kSignals[i], &previous[i], nullptr);
    installed[i] = false;
  }
}

}  // namespace mtlsim
