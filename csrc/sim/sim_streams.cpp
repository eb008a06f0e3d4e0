#include "sim/sim_streams.h"

#include <pthread.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "wait.h"

namespace mps_ext::sim_streams {

namespace {

constexpr int64_t kPoolSize = 32;

double host_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A point a stream reaches (an event's record, a hold).
class Mark {
 public:
  void reach() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      reached_ = true;
      seconds_ = host_seconds();
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    wait_interruptibly(cv_, lock, [&] { return reached_; });
  }
  bool reached() {
    std::lock_guard<std::mutex> lock(mu_);
    return reached_;
  }
  double seconds() {
    std::lock_guard<std::mutex> lock(mu_);
    return seconds_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false;
  double seconds_ = 0;
};

class Stream {
 public:
  Stream() { std::thread([this] { run(); }).detach(); }

  void enqueue(Job job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
      ++pending_;
    }
    cv_.notify_all();
  }

  void synchronize() {
    std::unique_lock<std::mutex> lock(mu_);
    wait_interruptibly(cv_, lock, [&] { return pending_ == 0; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  bool idle() {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_ == 0;
  }

  std::vector<std::string> take_warnings() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(warnings_, {});
  }

 private:
  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      std::vector<std::string> warnings;
      std::exception_ptr error;
      try {
        warnings = job();
      } catch (...) {
        error = std::current_exception();
      }
      job = nullptr;  // what the job kept alive (its tensors) goes before the work counts as done
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (error && !error_) error_ = error;
        warnings_.insert(warnings_.end(), warnings.begin(), warnings.end());
        --pending_;
      }
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  size_t pending_ = 0;  // queued or running
  std::exception_ptr error_;
  std::vector<std::string> warnings_;
};

std::mutex pool_mu;
// Leaked on purpose, as their detached threads are: they live as long as the process.
std::array<Stream*, kPoolSize> pool{};
int64_t handed_out = 0;
thread_local int64_t current_stream = 0;

Stream& stream(int64_t id) {
  std::lock_guard<std::mutex> lock(pool_mu);
  TORCH_CHECK(id >= 1 && id <= kPoolSize && pool[id - 1], "mps_ext: no simulator stream with id ", id);
  return *pool[id - 1];
}

class SimEvent final : public Event {
 public:
  void record(int64_t id) override {
    auto mark = std::make_shared<Mark>();
    if (id == 0) {
      mark->reach();
    } else {
      stream(id).enqueue([mark] {
        mark->reach();
        return std::vector<std::string>{};
      });
    }
    std::lock_guard<std::mutex> lock(mu_);
    last_ = std::move(mark);
  }

  void block(int64_t id) override {
    std::shared_ptr<Mark> mark = last();
    if (!mark) return;
    if (id == 0) {
      mark->wait();  // the default stream is the calling thread
    } else {
      stream(id).enqueue([mark] {
        mark->wait();
        return std::vector<std::string>{};
      });
    }
  }

  bool query() override {
    std::shared_ptr<Mark> mark = last();
    return !mark || mark->reached();
  }

  void synchronize() override {
    if (std::shared_ptr<Mark> mark = last()) mark->wait();
  }

  double seconds() override {
    std::shared_ptr<Mark> mark = last();
    return mark ? mark->seconds() : 0;
  }

 private:
  std::shared_ptr<Mark> last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

  std::mutex mu_;
  std::shared_ptr<Mark> last_;
};

// A forked child has none of the parent's threads: it starts a new pool (the
// old streams are leaked, their work is the parent's).
void forget_streams_in_child() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork([] { pool_mu.lock(); }, [] { pool_mu.unlock(); },
                   [] {
                     pool.fill(nullptr);
                     handed_out = 0;
                     current_stream = 0;
                     pool_mu.unlock();
                   });
  });
}

}  // namespace

int64_t new_stream() {
  forget_streams_in_child();
  std::lock_guard<std::mutex> lock(pool_mu);
  const int64_t index = handed_out++ % kPoolSize;
  if (!pool[index]) pool[index] = new Stream();
  return index + 1;
}

int64_t current() { return current_stream; }

void set_current(int64_t id) {
  if (id != 0) stream(id);  // checks the id
  current_stream = id;
}

std::vector<std::string> submit(Job job) {
  if (current_stream == 0) return job();
  stream(current_stream).enqueue(std::move(job));
  return {};
}

void synchronize(int64_t id) {
  if (id != 0) stream(id).synchronize();
}

bool query(int64_t id) { return id == 0 || stream(id).idle(); }

std::vector<std::string> take_warnings(int64_t id) {
  return id == 0 ? std::vector<std::string>{} : stream(id).take_warnings();
}

std::unique_ptr<Event> new_event() { return std::make_unique<SimEvent>(); }

void keep_alive(int64_t id, c10::Storage storage) {
  if (id == 0) return;  // the default stream's work has run already
  stream(id).enqueue([storage = std::move(storage)] { return std::vector<std::string>{}; });
}

std::function<void()> hold(int64_t id) {
  TORCH_CHECK_VALUE(id != 0, "the default stream runs on the calling thread: it cannot be held");
  auto latch = std::make_shared<Mark>();
  stream(id).enqueue([latch] {
    latch->wait();
    return std::vector<std::string>{};
  });
  return [latch] { latch->reach(); };
}

}  // namespace mps_ext::sim_streams
