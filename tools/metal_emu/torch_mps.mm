// The emulated torch MPS runtime: what libtorch_cpu does on a Mac for the
// symbols csrc/metal uses (MPSDevice, MPSStream, dispatch_sync_with_rethrow),
// as torch 2.13's MPSStream.mm implements them, with what the headers of 2.14
// and 2.15 add where the build is for those (build.py: their ATen/mps headers):
// - 2.14: a per-thread current stream (setCurrentMPSStream) and a pool of 32
//   streams (getStreamFromPool), ids 1 to 32, made on first use;
// - 2.15: getStreamByID; every command buffer reports its failure to its
//   stream (addErrorHandler) and the next commitAndWait rethrows the first
//   (checkLastError), as the 2.15 header describes them.
// The mps device (mps_device.mm) reaches the streams only through
// emu::enqueue and emu::wait_current_stream, so that it reads none of these
// headers and is built once for every runtime.
#import "emu.h"
#include "hooks.h"

#include <ATen/mps/MPSDevice.h>
#include <ATen/mps/MPSEvent.h>
#include <ATen/mps/MPSStream.h>

#include <array>
#include <atomic>
#include <exception>
#include <mutex>

#include "metal/torch_version.h"

namespace at::mps {

MPSDevice::MPSDevice() : _mtl_device(emu::device()) {}
MPSDevice::~MPSDevice() = default;

MPSDevice* MPSDevice::getInstance() {
  static MPSDevice* device = new MPSDevice;
  return device;
}

// The smallest M3's, as IOKit would report it; or torch's error where IOKit has none.
std::atomic<bool> core_count_fails{false};
unsigned MPSDevice::getCoreCount() const {
  TORCH_CHECK(!core_count_fails.load(), "Failed to get gpu-core-count property");
  return 10;
}

bool is_available() { return true; }

}  // namespace at::mps

void emu::set_core_count_fails(bool fails) { at::mps::core_count_fails.store(fails); }

namespace at::mps {

MPSStream::MPSStream(Stream stream) : _stream(stream) {
  _commandQueue = [MPSDevice::getInstance()->device() newCommandQueue];
  TORCH_CHECK(_stream.device_type() == DeviceType::MPS);
  _serialQueue = dispatch_queue_create("metal gpu stream", nullptr);
}

MPSStream::~MPSStream() {
  [_commandQueue release];
  dispatch_release(_serialQueue);
}

MPSCommandBuffer* MPSStream::commandBuffer() {
  if (!_commandBuffer) {
    _commandBuffer = [MPSCommandBuffer commandBufferFromCommandQueue:_commandQueue].retain;
#if MPS_EXT_TORCH_AT_LEAST(15)
    addErrorHandler();
#endif
  }
  return _commandBuffer;
}

id<MTLComputeCommandEncoder> MPSStream::commandEncoder() {
  if (!_commandEncoder) _commandEncoder = [commandBuffer() computeCommandEncoder].retain;
  return _commandEncoder;
}

void MPSStream::endKernelCoalescing() {
  if (_commandEncoder) {
    [_commandEncoder endEncoding];
    [_commandEncoder release];
    _commandEncoder = nil;
  }
}

void MPSStream::synchronize(SyncType syncType) {
  endKernelCoalescing();
  switch (syncType) {
    case SyncType::NONE:
    case SyncType::COMMIT_ADAPTIVE:  // commits only under memory pressure, which the emulation has none of
      break;
    case SyncType::COMMIT:
      commit();
      break;
    case SyncType::COMMIT_AND_WAIT:
      commitAndWait();
      break;
    case SyncType::COMMIT_AND_CONTINUE:
      commitAndContinue();
      break;
  }
}

void MPSStream::commit() {
  if (_enableCommitAndContinue) {
    commandBuffer();
    commitAndContinue();
  } else {
    flush();
  }
}

// Torch 2.13 and 2.14 read neither the status nor the error of the buffers.
void MPSStream::commitAndWait() {
  if (_prevCommandBuffer) {
    [_prevCommandBuffer waitUntilCompleted];
    [_prevCommandBuffer release];
    _prevCommandBuffer = nil;
  }
  if (_commandBuffer) {
    [_commandBuffer commit];
    [_commandBuffer waitUntilCompleted];
    [_commandBuffer release];
    _commandBuffer = nil;
  }
#if MPS_EXT_TORCH_AT_LEAST(15)
  checkLastError();
#endif
}

void MPSStream::commitAndContinue() {
  TORCH_INTERNAL_ASSERT(_commandBuffer);
  [_commandBuffer commitAndContinue];
#if MPS_EXT_TORCH_AT_LEAST(15)
  addErrorHandler();  // on the new underlying buffer
#endif
}

#if MPS_EXT_TORCH_AT_LEAST(15)
void MPSStream::addErrorHandler() {
  MPSStream* stream = this;
  [_commandBuffer addCompletedHandler:^(id<MTLCommandBuffer> buffer) {
    if (buffer.status == MTLCommandBufferStatusError)
      stream->recordCommandBufferError({false, 0, buffer.error.localizedDescription.UTF8String});
  }];
}

void MPSStream::recordCommandBufferError(CommandBufferError error) {
  std::lock_guard<std::mutex> lock(_commandBufferErrorMutex);
  if (!_commandBufferError) _commandBufferError = std::move(error);
}

void MPSStream::checkLastError() {
  std::optional<CommandBufferError> error;
  {
    std::lock_guard<std::mutex> lock(_commandBufferErrorMutex);
    error.swap(_commandBufferError);
  }
  TORCH_CHECK(!error, "Command buffer execution failed: ", error->message);
}
#endif

void MPSStream::flush() {
  if (_commandBuffer) {
    [_commandBuffer commit];
    if (!_enableCommitAndContinue) {
      _prevCommandBuffer = _commandBuffer;
    } else {
      [_commandBuffer release];
    }
    _commandBuffer = nil;
  }
}

MPSStream* getDefaultMPSStream() {
  static MPSStream* stream =
      new MPSStream(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::MPS, 0), 0));
  return stream;
}

#if MPS_EXT_TORCH_AT_LEAST(14)
namespace {
thread_local MPSStream* current_stream = nullptr;
constexpr int64_t kPoolSize = 32;

MPSStream* pool_stream(int64_t id) {
  static std::mutex mu;
  static std::array<MPSStream*, kPoolSize> pool{};  // live as long as the process, as torch's
  std::lock_guard<std::mutex> lock(mu);
  MPSStream*& stream = pool[id - 1];
  if (!stream) stream = new MPSStream(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::MPS, 0), id));
  return stream;
}
}  // namespace

MPSStream* getCurrentMPSStream() { return current_stream ? current_stream : getDefaultMPSStream(); }

void setCurrentMPSStream(MPSStream* stream) { current_stream = stream; }

MPSStream* getStreamFromPool() {
  static std::atomic<int64_t> next{0};
  return pool_stream(next++ % kPoolSize + 1);
}
#else
MPSStream* getCurrentMPSStream() { return getDefaultMPSStream(); }
#endif

#if MPS_EXT_TORCH_AT_LEAST(15)
MPSStream* getStreamByID(int64_t stream_id) {
  if (stream_id == 0) return getDefaultMPSStream();
  TORCH_CHECK(stream_id >= 1 && stream_id <= kPoolSize, "Invalid MPS stream id ", stream_id);
  return pool_stream(stream_id);
}
#endif

void dispatch_sync_with_rethrow(dispatch_queue_t queue, void (^block)()) {
  __block std::exception_ptr error;
  dispatch_sync(queue, ^() {
    try {
      block();
    } catch (...) {
      error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

std::shared_ptr<MPSEventPool> getMPSEventPool() {
  TORCH_CHECK(false, "metal_emu: torch.mps.Event (torch's event pool) is not emulated");
}

#if MPS_EXT_TORCH_AT_LEAST(15)
void MPSEventPool::waitForEvent(id_t, bool, MPSStream*) {
#else
void MPSEventPool::waitForEvent(id_t, bool) {
#endif
  TORCH_CHECK(false, "metal_emu: torch.mps.Event (torch's event pool) is not emulated");
}

}  // namespace at::mps

void emu::enqueue(std::function<void()> work) {
  at::mps::MPSStream* stream = at::mps::getCurrentMPSStream();
  Command command = [work]() -> std::string {
    try {
      work();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  at::mps::dispatch_sync_with_rethrow(stream->queue(), ^() {
    stream->endKernelCoalescing();
    encode(stream->commandBuffer(), command);
  });
}

void emu::wait_current_stream() {
  at::mps::MPSStream* stream = at::mps::getCurrentMPSStream();
  at::mps::dispatch_sync_with_rethrow(stream->queue(), ^() {
    stream->synchronize(at::mps::SyncType::COMMIT_AND_WAIT);
  });
}
