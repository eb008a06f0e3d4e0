// Runs threadgroups: every GPU thread of a threadgroup is a fiber; a worker
// thread switches between them at barriers and SIMD-group functions.
#pragma once

#include <pthread.h>

#include <array>
#include <atomic>
#include <csetjmp>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fiber.h"
#include "runtime.h"

namespace mtlsim {

enum class Schedule { Forward, Reverse, Random };
const char* schedule_name(Schedule s);

// Stopped: the dispatch was stopped (timeout, interrupt) while this GPU
// thread ran; the reason is the job's error already.
enum class FaultKind { Read, Write, Access, DivideByZero, Stopped };
struct Fault {
  void* addr;
  void* pc;
  FaultKind kind;
};

// For the duration of a dispatch: routes SIGSEGV/SIGBUS/SIGFPE raised by a
// GPU thread to its worker, which turns them into a dispatch error, and the
// stop signal to a worker running a GPU thread of a stopped job. Other
// signals go to the handler installed before (called once; a second fault
// gets the default action, so handlers that hand faults back to this one
// cannot loop). The previous handlers are restored at the end unless
// someone replaced these meanwhile.
class SignalHandlers {
 public:
  SignalHandlers();
  ~SignalHandlers();
  SignalHandlers(const SignalHandlers&) = delete;
  SignalHandlers& operator=(const SignalHandlers&) = delete;
};

// Sent to a worker to make it abandon a stopped job's GPU thread.
int stop_signal();

class GuardedBuffers;

// One run of a dispatch under one schedule, shared by the workers.
struct Job {
  Job(const Launch& launch, Schedule schedule, uint64_t seed);

  const Launch& launch;
  const Schedule schedule;
  const uint64_t seed;
  std::array<void*, kMaxBufferSlots> buffers{};
  std::array<size_t, kMaxBufferSlots> sizes{};
  DispatchView view{};
  // [[threadgroup(n)]] memory sits at the start of each threadgroup's arena.
  std::array<size_t, kMaxBufferSlots> threadgroup_offsets{};
  size_t dynamic_threadgroup_bytes = 0;
  std::vector<uint32_t> order;  // linear threadgroup ids, in the order they run
  const GuardedBuffers* guards = nullptr;

  std::atomic<bool> aborted{false};

  void fail(const std::string& message);  // the first failure wins
  void warn(const std::string& message);  // deduplicated
  // An os_log message; beyond kMaxLogMessages they are counted, not kept (a
  // GPU's log buffer is bounded too).
  void log(std::string line);
  std::string error() const;
  std::vector<std::string> warnings() const;
  // The os_log messages in the order the threads logged them, then how many more were dropped.
  std::vector<std::string> logs(size_t* dropped) const;
  static constexpr size_t kMaxLogMessages = 4096;

 private:
  mutable std::mutex mu_;
  std::string error_;
  std::vector<std::string> warnings_;
  std::vector<std::string> logs_;
  size_t dropped_logs_ = 0;
};

class Worker {
 public:
  explicit Worker(size_t stack_bytes);
  ~Worker();

  // Runs the threadgroups order[first], order[first + stride], ...; never throws.
  void process(Job& job, size_t first, size_t stride);

  // Fiber stacks for threadgroups of `threads` threads; called by the
  // dispatching thread while this worker is idle. Throws std::runtime_error.
  void reserve_stacks(size_t threads);
  // How many stacks that reserves: whole powers of two, so that dispatches of
  // varying sizes do not remap every time.
  static size_t stacks_for(size_t threads);
  void release_stacks() { stacks_.reset(); }
  // Memory mappings the stacks take.
  size_t mappings() const { return stacks_ ? 2 * stacks_->count() + 1 : 0; }

  // The calling worker thread's Worker, if it is one.
  static Worker* current();
  // Called on the worker thread once, before it runs anything.
  void attach();
  // The worker's thread, once attached.
  pthread_t thread() const { return thread_; }

  // RuntimeAPI, for the fiber currently running on this worker.
  void collective(CollectiveFn fn, const void* in, void* out, const Site& site);
  void barrier(const Site& site);
  void* threadgroup_alloc(uint32_t id, size_t size, size_t align, const Site& site);
  void yield();
  [[noreturn]] void fail(const char* message, const Site& site);
  void log(const LogMessage& message, const Site& site);
  const ThreadCtx* current_thread() const;

  // Signal handler support: is a GPU thread running (outside the runtime's
  // own code), has its job been stopped, and where to escape to.
  bool in_kernel() const { return in_kernel_; }
  bool job_stopped() const { return job_ && job_->aborted; }
  [[noreturn]] void escape_from_fault(const Fault& fault);

 private:
  enum class State : uint8_t { Runnable, Collective, Barrier, Done };
  struct Fiber {
    Context ctx;
    ThreadCtx thread;
    State state;
    CollectiveFn fn;
    const void* in;
    void* out;
    Site site;
    uint64_t arrival;
  };

  static void fiber_main(void* self);
  void run_group(Job& job, uint32_t linear_group);
  void start_fibers(Job& job, uint32_t linear_group);
  void after_switch(uint32_t i);
  void check_simdgroup(uint32_t sg);
  void check_barrier();
  void complete_collective(uint32_t sg, uint32_t mask);
  void resolve_deadlock();
  void suspend(State state);
  std::string where(uint32_t fiber, const Site* site) const;
  std::string lanes(uint32_t mask) const;
  void report_fault();

  size_t stack_bytes_;
  std::unique_ptr<StackPool> stacks_;
  std::vector<Fiber> fibers_;
  std::vector<uint32_t> order_;
  Context scheduler_;
  Job* job_ = nullptr;
  ThreadgroupView group_{};
  std::array<void*, kMaxBufferSlots> group_buffers_{};
  std::array<size_t, kMaxBufferSlots> group_sizes_{};
  uint32_t threads_ = 0, live_ = 0, done_ = 0, at_barrier_ = 0;
  std::vector<uint32_t> simd_live_, simd_waiting_;
  uint32_t running_ = 0;
  uint64_t arrivals_ = 0, idle_yields_ = 0;
  volatile bool in_kernel_ = false;
  bool aborted_group_ = false;
  const Site* collective_ = nullptr;  // the SIMD-group function being completed
  // Threadgroup memory: offsets of each declaration site in this group.
  std::vector<unsigned char> arena_;
  std::vector<int64_t> site_offset_;
  size_t arena_used_ = 0;
  // Fault escape.
  sigjmp_buf escape_;
  Fault fault_{};
  void* alt_stack_ = nullptr;
  pthread_t thread_{};
};

}  // namespace mtlsim
