// The emulated torch MPS runtime: what libtorch_cpu does on a Mac for the
// symbols csrc/metal uses (MPSDevice, MPSStream, dispatch_sync_with_rethrow),
// as torch 2.13's MPSStream.mm implements them, with what the headers of 2.14
// and 2.15 add where the build is for those (build.py: their ATen/mps headers):
// - 2.14: a per-thread current stream (setCurrentMPSStream) and a pool of 32
//   streams (getStreamFromPool), ids 1 to 32, made on first use;
// - 2.15: getStreamByID; every command buffer reports its failure to its
//   stream (addErrorHandler) and the next commitAndWait rethrows the first
//   (checkLastError), as the 2.15 header describes them.
// And the mps device itself: tensors whose storage is an MTLBuffer, and
// torch's ops on them. Torch's copies and fills go to the current stream's
// command buffer without a commit, as torch's do, so they run later, on the
// GPU; a copy to the host commits and waits first. Every other op runs on the
// CPU after the current stream has run (torch's CPU fallback).
#import "emu.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/mps/MPSDevice.h>
#include <ATen/mps/MPSEvent.h>
#include <ATen/mps/MPSStream.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/TensorShape.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/native/Resize.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>

#include "backend.h"
#include "hooks.h"
#include "metal/torch_version.h"

namespace at::mps {

MPSDevice::MPSDevice() : _mtl_device(emu::device()) {}
MPSDevice::~MPSDevice() = default;

MPSDevice* MPSDevice::getInstance() {
  static MPSDevice* device = new MPSDevice;
  return device;
}

// The smallest M3's, as IOKit would report it.
unsigned MPSDevice::getCoreCount() const { return 10; }

bool is_available() { return true; }

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

namespace {

using at::mps::MPSStream;
using at::mps::SyncType;

id<MTLBuffer> buffer_of(const at::Tensor& t) { return __builtin_bit_cast(id<MTLBuffer>, t.storage().data()); }

// An mps tensor's memory as the GPU sees it, as a CPU tensor.
at::Tensor host_view(const at::Tensor& t) {
  char* base = static_cast<char*>([buffer_of(t) contents]) + t.storage_offset() * t.element_size();
  return at::from_blob(base, t.sizes(), t.strides(), at::TensorOptions().dtype(t.dtype()));
}

void release_buffer(void* buffer) { [__builtin_bit_cast(id<MTLBuffer>, buffer) release]; }

class Allocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    void* buffer = __builtin_bit_cast(void*, [emu::device() newBufferWithLength:bytes
                                                                      options:MTLResourceStorageModeShared]);
    return {buffer, buffer, &release_buffer, c10::Device(c10::DeviceType::MPS, 0)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_buffer; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy([__builtin_bit_cast(id<MTLBuffer>, dest) contents],
                [__builtin_bit_cast(id<MTLBuffer>, const_cast<void*>(src)) contents], count);
  }
};

Allocator allocator;

// Torch's work on its current stream: encoded now, run when the GPU gets there.
void enqueue(std::function<void()> work) {
  MPSStream* stream = at::mps::getCurrentMPSStream();
  emu::Command command = [work]() -> std::string {
    try {
      work();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  at::mps::dispatch_sync_with_rethrow(stream->queue(), ^() {
    stream->endKernelCoalescing();
    emu::encode(stream->commandBuffer(), command);
  });
}

void wait_current_stream() {
  MPSStream* stream = at::mps::getCurrentMPSStream();
  at::mps::dispatch_sync_with_rethrow(stream->queue(), ^() {
    stream->synchronize(SyncType::COMMIT_AND_WAIT);
  });
}

at::Tensor mps_empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                 std::optional<at::Device>, std::optional<bool>, std::optional<at::MemoryFormat> memory_format) {
  return at::detail::empty_generic(size, &allocator, c10::DispatchKeySet(c10::DispatchKey::MPS),
                                   dtype.value_or(at::kFloat), memory_format);
}

at::Tensor mps_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &allocator, c10::DispatchKeySet(c10::DispatchKey::MPS),
                                           dtype.value_or(at::kFloat));
}

at::Tensor& mps_copy_(at::Tensor& self, const at::Tensor& src, bool) {
  if (!src.is_mps()) {  // from the host: torch stages it, copies on the stream and waits
    at::Tensor staged = src.clone();
    enqueue([self, staged] { host_view(self).copy_(staged); });
    wait_current_stream();
  } else if (!self.is_mps()) {  // to the host: after the stream's work
    wait_current_stream();
    self.copy_(host_view(src));
  } else {
    enqueue([self, src] { host_view(self).copy_(host_view(src)); });
  }
  return self;
}

at::Tensor& mps_fill_(at::Tensor& self, const at::Scalar& value) {
  enqueue([self, value] { host_view(self).fill_(value); });
  return self;
}

at::Tensor& mps_zero_(at::Tensor& self) { return mps_fill_(self, 0); }

// Torch 2.15's allocator defers reusing a block until the streams recorded on
// it have run; the emulated one frees a buffer when its last reference goes,
// and the GPU references what its commands bind: nothing to defer.
void mps_record_stream(at::Tensor&, c10::Stream) {}

const at::Tensor& mps_resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat>) {
  const size_t bytes = at::detail::computeStorageNbytesContiguous(size, self.element_size(), self.storage_offset());
  c10::StorageImpl* storage = self.storage().unsafeGetStorageImpl();
  if (bytes > storage->nbytes()) {
    wait_current_stream();  // what the old memory holds is final
    c10::DataPtr grown = allocator.allocate(bytes);
    std::memcpy([__builtin_bit_cast(id<MTLBuffer>, grown.get()) contents], [buffer_of(self) contents],
                storage->nbytes());
    storage->set_data_ptr_noswap(std::move(grown));
    storage->set_nbytes(bytes);
  }
  self.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  return self;
}

// Where torch's CPU fallback writes a result back.
at::Tensor mps_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  mps_resize_(dst, self.sizes(), std::nullopt);
  at::Tensor out = dst;
  return mps_copy_(out, self, false);
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::native::cpu_fallback(op, stack);
}

}  // namespace

C10_REGISTER_GUARD_IMPL(MPS, c10::impl::NoOpDeviceGuardImpl<c10::DeviceType::MPS>);

TORCH_LIBRARY_IMPL(aten, MPS, m) {
  m.impl("empty.memory_format", TORCH_FN(mps_empty));
  m.impl("empty_strided", TORCH_FN(mps_empty_strided));
  m.impl("copy_", TORCH_FN(mps_copy_));
  m.impl("fill_.Scalar", TORCH_FN(mps_fill_));
  m.impl("zero_", TORCH_FN(mps_zero_));
  m.impl("record_stream", TORCH_FN(mps_record_stream));
  m.impl("resize_", TORCH_FN(mps_resize_));
  m.impl("_copy_from_and_resize", TORCH_FN(mps_copy_from_and_resize));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
}

TORCH_LIBRARY_IMPL(_, MPS, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>()); }

void emu::install() {
  c10::SetAllocator(c10::DeviceType::MPS, &allocator);
  mps_ext::install_metal_backend(mps_ext::metal_backend());
}
