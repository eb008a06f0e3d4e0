// The emulated mps device: tensors whose storage is an MTLBuffer, and torch's
// ops on them. Torch's copies and fills go to the current stream's command
// buffer without a commit, as torch's do, so they run later, on the GPU; a
// copy to the host commits and waits first. Every other op runs on the CPU
// after the current stream has run (torch's CPU fallback).
#import "emu.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/TensorShape.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/native/Resize.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <cstring>
#include <optional>

#include "backend.h"
#include "hooks.h"

namespace {

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
    emu::enqueue([self, staged] { host_view(self).copy_(staged); });
    emu::wait_current_stream();
  } else if (!self.is_mps()) {  // to the host: after the stream's work
    emu::wait_current_stream();
    self.copy_(host_view(src));
  } else {
    emu::enqueue([self, src] { host_view(self).copy_(host_view(src)); });
  }
  return self;
}

at::Tensor& mps_fill_(at::Tensor& self, const at::Scalar& value) {
  emu::enqueue([self, value] { host_view(self).fill_(value); });
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
    emu::wait_current_stream();  // what the old memory holds is final
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
  mps_ext::install_metal_backend(mps_ext::metal_backend(), mps_ext::metal_unavailable_reason());
}
