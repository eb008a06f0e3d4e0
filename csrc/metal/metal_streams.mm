#include "metal/metal_streams.h"

#include <ATen/mps/MPSDevice.h>
#include <ATen/mps/MPSEvent.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <unordered_map>

#include "metal/torch_version.h"
#include "wait.h"

namespace mps_ext::metal_streams {

namespace {

using at::mps::MPSStream;
using at::mps::SyncType;

std::mutex mu;
std::vector<std::shared_ptr<void>> released;  // guarded by mu

void release_later(std::shared_ptr<void> kept) {
  std::lock_guard<std::mutex> lock(mu);
  released.push_back(std::move(kept));
}

#if MPS_EXT_TORCH_AT_LEAST(15)

MPSStream* by_id(int64_t stream_id) { return at::mps::getStreamByID(stream_id); }
void remember(MPSStream*) {}

#elif MPS_EXT_TORCH_AT_LEAST(14)

// 2.14 cannot look streams up by id: those handed out or seen current are remembered.
constexpr int64_t kPoolSize = 32;  // torch's pool: ids 1..32, 0 is the default stream
std::array<MPSStream*, kPoolSize + 1> known{};  // guarded by mu

MPSStream* by_id(int64_t stream_id) {
  if (stream_id == 0) return at::mps::getDefaultMPSStream();
  std::lock_guard<std::mutex> lock(mu);
  TORCH_CHECK(stream_id >= 1 && stream_id <= kPoolSize && known[stream_id], "mps_ext: no MPS stream with id ",
              stream_id);
  return known[stream_id];
}

void remember(MPSStream* stream) {
  const int64_t stream_id = stream->unwrap().id();
  TORCH_CHECK(stream_id >= 0 && stream_id <= kPoolSize, "mps_ext: unexpected MPS stream id ", stream_id);
  std::lock_guard<std::mutex> lock(mu);
  known[stream_id] = stream;
}

#else

constexpr int64_t kPoolSize = 32;  // as torch's pool (2.14+): ids 1..32, 0 is the default stream
std::array<MPSStream*, kPoolSize> own{};  // guarded by mu; leaked on purpose, as torch's pool is
int64_t handed_out = 0;
thread_local MPSStream* current_own = nullptr;

MPSStream* by_id(int64_t stream_id) {
  if (stream_id == 0) return at::mps::getDefaultMPSStream();
  std::lock_guard<std::mutex> lock(mu);
  TORCH_CHECK(stream_id >= 1 && stream_id <= kPoolSize && own[stream_id - 1], "mps_ext: no MPS stream with id ",
              stream_id);
  return own[stream_id - 1];
}

#endif

// Work on a stream waits for (event, value) from the gate on. A wait gates
// only later work of the command buffer it is encoded into, and torch commits
// a stream's buffer and goes on in a new one at its sync points: the wait is
// encoded again into every buffer that takes work of ours until the event
// has been seen signalled.
struct Gate {
  id<MTLSharedEvent> event;  // retained
  uint64_t value;
  id<MTLCommandBuffer> encoded_in;  // retained: the last buffer it gated
};

// What mps_ext tracks of a stream. `gates` and `watched` are used inside
// blocks on the stream's queue, which serializes them.
struct StreamState {
  std::vector<Gate> gates;
  id<MTLCommandBuffer> watched = nil;  // retained: the last buffer whose completion is reported
  std::atomic<int64_t> outstanding{0};  // watched buffers not yet completed
#if !MPS_EXT_TORCH_AT_LEAST(15)
  std::mutex mu;
  std::string error;  // guarded by mu: the first GPU error not yet raised
#endif
};

// Streams live as long as the process, and so do their states.
StreamState& state_of(MPSStream* stream) {
  static std::unordered_map<MPSStream*, StreamState*> states;  // guarded by mu
  std::lock_guard<std::mutex> lock(mu);
  StreamState*& state = states[stream];
  if (!state) state = new StreamState;
  return *state;
}

#if MPS_EXT_TORCH_AT_LEAST(15)

// Torch keeps the first failure of a stream's command buffers since 2.15 and
// rethrows it at its next sync (checkLastError): raised from there, a failure
// is raised once, by whichever sync comes first.
void record_failure(StreamState&, id<MTLCommandBuffer>) {}
void raise_error(MPSStream* stream) { stream->checkLastError(); }

#else

// Torch reads no command buffer's status: the stream keeps its first failure.
void record_failure(StreamState& state, id<MTLCommandBuffer> done) {
  if (done.status != MTLCommandBufferStatusError) return;
  NSError* error = done.error;
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.error.empty())
    state.error = error ? std::string(error.localizedDescription.UTF8String) : std::string("no details");
}

// Raises the stream's first GPU error not yet raised.
void raise_error(MPSStream* stream) {
  StreamState& state = state_of(stream);
  std::string error;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    error.swap(state.error);
  }
  TORCH_CHECK(error.empty(), "mps_ext: a command buffer failed on the GPU: ", error);
}

#endif

// The Metal buffer the stream's work goes into now: the one commitAndContinue commits (rootCommandBuffer,
// as Apple documents it; commandBuffer is the one the MPSCommandBuffer was made with).
id<MTLCommandBuffer> underlying(MPSStream* stream) { return stream->commandBuffer().rootCommandBuffer; }

// Inside a block on stream->queue(): `object` lives until the stream's
// current command buffer, which references it, has completed.
void hold_until_completed(MPSStream* stream, id object) {
  [object retain];
  [stream->commandBuffer() addCompletedHandler:^(id<MTLCommandBuffer>) {
    [object release];
  }];
}

// Inside a block on stream->queue(): the current command buffer, which holds
// work of ours, reports its completion and its failure (record_failure) to
// the stream (once per buffer).
void watch(MPSStream* stream) {
  StreamState& state = state_of(stream);
  id<MTLCommandBuffer> buffer = underlying(stream);
  if (buffer == state.watched) return;
  [state.watched release];
  state.watched = [buffer retain];
  StreamState* s = &state;
  ++s->outstanding;
  [stream->commandBuffer() addCompletedHandler:^(id<MTLCommandBuffer> done) {
    record_failure(*s, done);
    --s->outstanding;
  }];
}

// Inside a block on stream->queue(): the gates not yet passed, encoded into
// the current command buffer where they are not yet.
void apply_gates(MPSStream* stream) {
  StreamState& state = state_of(stream);
  std::vector<Gate> open;
  for (Gate& gate : state.gates) {
    if (gate.event.signaledValue >= gate.value) {
      [gate.event release];
      [gate.encoded_in release];
      continue;
    }
    id<MTLCommandBuffer> buffer = underlying(stream);
    if (gate.encoded_in != buffer) {
      stream->endKernelCoalescing();
      [stream->commandBuffer() encodeWaitForEvent:gate.event value:gate.value];
      hold_until_completed(stream, gate.event);
      [gate.encoded_in release];
      gate.encoded_in = [buffer retain];
    }
    open.push_back(gate);
  }
  state.gates.swap(open);
}

// Where an event's signals have got to, updated by command buffer completion
// handlers (on Metal's threads; buffers of different streams complete in any
// order), failed or not.
struct Progress {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t reached = 0;
  double gpu_seconds = 0;

  void reach(uint64_t value, double seconds) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (value <= reached) return;
      reached = value;
      gpu_seconds = seconds;
    }
    cv.notify_all();
  }
};

class MetalEvent final : public Event {
 public:
  explicit MetalEvent(id<MTLDevice> device) : event_([device newSharedEvent]) {}
  ~MetalEvent() override { [event_ release]; }

  void record(int64_t stream_id) override {
    MPSStream* stream = by_id(stream_id);
    const uint64_t value = ++recorded_;
    recorded_on_.store(stream);
    std::shared_ptr<Progress> progress = progress_;
    id<MTLSharedEvent> event = event_;
    at::mps::dispatch_sync_with_rethrow(stream->queue(), ^() {
      @autoreleasepool {
        apply_gates(stream);
        watch(stream);
        stream->endKernelCoalescing();
        MPSCommandBuffer* buffer = stream->commandBuffer();
        [buffer encodeSignalEvent:event value:value];
        // A buffer that fails skips the rest of its commands, this signal too: the CPU gives it then, so that
        // no query spins and no stream that waits on it hangs (the failure is raised by the synchronizes).
        // GPUEndTime of the buffer that ends with the signal: when it was reached.
        [buffer addCompletedHandler:^(id<MTLCommandBuffer> done) {
          if (done.status == MTLCommandBufferStatusError && event.signaledValue < value) event.signaledValue = value;
          progress->reach(value, done.GPUEndTime);
        }];
        hold_until_completed(stream, event);  // after the handler above, which uses it
        // Committed now, so the signal comes even if nothing else commits this stream.
        stream->synchronize(SyncType::COMMIT);
      }
    });
  }

  void block(int64_t stream_id) override {
    const uint64_t value = recorded_.load();
    if (value == 0) return;
    MPSStream* stream = by_id(stream_id);
    id<MTLSharedEvent> event = event_;
    at::mps::dispatch_sync_with_rethrow(stream->queue(), ^() {
      @autoreleasepool {
        state_of(stream).gates.push_back(Gate{[event retain], value, nil});
        apply_gates(stream);
      }
    });
  }

  bool query() override { return event_.signaledValue >= recorded_.load(); }

  // Raises the first GPU error of the stream of the last record.
  void synchronize() override {
    {
      std::unique_lock<std::mutex> lock(progress_->mu);
      wait_interruptibly(progress_->cv, lock, [&] { return progress_->reached >= recorded_; });
    }
    free_released();
    if (MPSStream* stream = recorded_on_.load()) raise_error(stream);
  }

  double seconds() override {
    std::lock_guard<std::mutex> lock(progress_->mu);
    return progress_->gpu_seconds;
  }

 private:
  id<MTLSharedEvent> event_;
  std::shared_ptr<Progress> progress_ = std::make_shared<Progress>();
  std::atomic<uint64_t> recorded_{0};  // the value of the last signal encoded
  std::atomic<MPSStream*> recorded_on_{nullptr};
};


}  // namespace

MPSStream* current() {
#if MPS_EXT_TORCH_AT_LEAST(14)
  return at::mps::getCurrentMPSStream();
#else
  return current_own ? current_own : at::mps::getDefaultMPSStream();
#endif
}

int64_t current_id() {
  MPSStream* stream = current();
#if MPS_EXT_TORCH_AT_LEAST(14)
  remember(stream);  // it may have been set by other code
#endif
  return stream->unwrap().id();
}

void set_current(int64_t stream_id) {
  MPSStream* stream = by_id(stream_id);
#if MPS_EXT_TORCH_AT_LEAST(14)
  at::mps::setCurrentMPSStream(stream);
#else
  current_own = stream == at::mps::getDefaultMPSStream() ? nullptr : stream;
#endif
}

int64_t new_stream() {
#if MPS_EXT_TORCH_AT_LEAST(14)
  MPSStream* stream = at::mps::getStreamFromPool();
  remember(stream);
  return stream->unwrap().id();
#else
  std::lock_guard<std::mutex> lock(mu);
  const int64_t index = handed_out++ % kPoolSize;
  if (!own[index])
    own[index] = new MPSStream(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::MPS, 0), index + 1));
  return index + 1;
#endif
}

void synchronize(int64_t stream_id) {
  MPSStream* stream = by_id(stream_id);
  // torch's wait below cannot be interrupted: wait for a signal after the
  // work so far first, where Ctrl-C can stop the wait; torch's then returns
  // at once. The first failure of the stream's buffers not yet raised is
  // raised here (raise_error: torch's record from 2.15, ours before).
  MetalEvent done(at::mps::MPSDevice::getInstance()->device());
  done.record(stream_id);
  done.synchronize();
  at::mps::dispatch_sync_with_rethrow(stream->queue(), ^() {
    @autoreleasepool {
      stream->synchronize(SyncType::COMMIT_AND_WAIT);
    }
  });
  free_released();
  raise_error(stream);
}

// A queue cannot be asked whether it is idle; the command buffers that hold
// work of ours report their completion. Work not yet committed is committed,
// so that a polling loop ends.
bool query(int64_t stream_id) {
  MPSStream* stream = by_id(stream_id);
  if (state_of(stream).outstanding.load() == 0) return true;
  at::mps::dispatch_sync_with_rethrow(stream->queue(), ^() {
    @autoreleasepool {
      stream->synchronize(SyncType::COMMIT);
    }
  });
  return false;
}

std::unique_ptr<Event> new_event(id<MTLDevice> device) { return std::make_unique<MetalEvent>(device); }

void record_tensor(const at::Tensor& t, int64_t stream_id) {
  MPSStream* stream = by_id(stream_id);
#if MPS_EXT_TORCH_AT_LEAST(15)
  // Torch's allocator tracks streams since 2.15, but its recordStream records
  // nothing for a private-storage buffer (every default MPS tensor): the
  // tensor is held below as well.
  t.record_stream(stream->unwrap());
#endif
  // Committed now: an idle stream would otherwise hold the tensor until it next synchronizes.
  at::mps::dispatch_sync_with_rethrow(stream->queue(), ^() {
    @autoreleasepool {
      keep_until_completed(stream, {t});
      stream->synchronize(SyncType::COMMIT);
    }
  });
}

void wait_torch_event(int64_t stream_id, int64_t event_id) {
#if MPS_EXT_TORCH_AT_LEAST(15)
  at::mps::getMPSEventPool()->waitForEvent(static_cast<id_t>(event_id), /*syncEvent=*/false, by_id(stream_id));
#else
  // Before 2.15 torch's pool waits on the default stream only, where torch
  // also records its events: any other stream waits for the default stream's
  // work so far, which includes the event's last record.
  if (stream_id == 0) {
    at::mps::getMPSEventPool()->waitForEvent(static_cast<id_t>(event_id), /*syncEvent=*/false);
    return;
  }
  MetalEvent after(at::mps::MPSDevice::getInstance()->device());
  after.record(0);
  after.block(stream_id);
#endif
}

void before_encoding(MPSStream* stream) {
  apply_gates(stream);
  watch(stream);
}

void after_torch_work(MPSStream* stream) {
#if !MPS_EXT_TORCH_AT_LEAST(14)
  MPSStream* torch_stream = at::mps::getDefaultMPSStream();
  if (stream == torch_stream) return;
  static MetalEvent* torch_work = new MetalEvent(at::mps::MPSDevice::getInstance()->device());  // never freed
  torch_work->record(0);
  torch_work->block(stream->unwrap().id());
#else
  (void)stream;
#endif
}

void before_torch_ops() {
#if !MPS_EXT_TORCH_AT_LEAST(14)
  if (current_own) synchronize(current_own->unwrap().id());
#endif
}

void keep_until_completed(MPSStream* stream, std::vector<at::Tensor> tensors) {
  // Owned by the handler until it hands it over; a plain pointer, so the last
  // reference is never dropped on Metal's thread when the block goes.
  auto* kept = new std::vector<at::Tensor>(std::move(tensors));
  [stream->commandBuffer() addCompletedHandler:^(id<MTLCommandBuffer>) {
    release_later(std::shared_ptr<void>(kept, [](void* p) { delete static_cast<std::vector<at::Tensor>*>(p); }));
  }];
}

void free_released() {
  std::vector<std::shared_ptr<void>> done;
  {
    std::lock_guard<std::mutex> lock(mu);
    done.swap(released);
  }
}

}  // namespace mps_ext::metal_streams
