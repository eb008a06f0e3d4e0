// The simulator's streams. The default stream (0) runs work at once on the
// calling thread, as the host does; every other stream runs its work in order
// on a thread of its own, so ordering, waits and events are real.
#pragma once

#include <c10/core/Storage.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"

namespace mps_ext::sim_streams {

// Work for a stream; returns the warnings of the kernel it ran.
using Job = std::function<std::vector<std::string>()>;

// One of a pool of 32 streams, handed out in turn (as torch's pools do).
int64_t new_stream();
int64_t current();
void set_current(int64_t stream);

// Runs `job` on the calling thread's current stream: at once on the default
// stream, returning its warnings; otherwise later, and then its exception is
// raised by synchronize() and its warnings are returned by take_warnings().
std::vector<std::string> submit(Job job);

void synchronize(int64_t stream);
bool query(int64_t stream);
std::vector<std::string> take_warnings(int64_t stream);
std::unique_ptr<Event> new_event();
// `storage` lives until the work enqueued on `stream` so far has run.
void keep_alive(int64_t stream, c10::Storage storage);
// The stream stops at this point of its work until the returned function is
// called: lets tests order streams deterministically.
std::function<void()> hold(int64_t stream);

}  // namespace mps_ext::sim_streams
