// Blocking waits that Ctrl-C can stop. The work waited for may run on
// another thread (a stream's, Metal's), which Python's signal handlers never
// reach: the waiting thread polls for a pending KeyboardInterrupt itself.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>

#include "sim/runtime/runtime.h"

namespace mps_ext {

// cv.wait(lock, done), but throws what the simulator's interrupt check (the
// Python bindings': a pending KeyboardInterrupt on the main thread) returns,
// polled about every 50 ms without the lock held.
template <class Done>
void wait_interruptibly(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Done done) {
  while (!cv.wait_for(lock, std::chrono::milliseconds(50), done)) {
    lock.unlock();
    const std::exception_ptr interrupt = mtlsim::poll_interrupt();
    lock.lock();
    if (interrupt) std::rethrow_exception(interrupt);
  }
}

}  // namespace mps_ext
