// Dropout: validation, the generator's draw, launch geometry, for both
// backends. The kernels are in metal/dropout.metal.
#include "ops/dropout.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#if defined(MPS_EXT_METAL)
#include <ATen/mps/MPSGeneratorImpl.h>
#endif

#include <cmath>
#include <limits>
#include <mutex>

#include "backend.h"
#include "mps_ext/params.h"
#include "ops/naming.h"
#include "ops/plan_helpers.h"

namespace mps_ext::ops {

namespace {

constexpr uint32_t kDropoutThreadsPerGroup = 256;
constexpr int64_t kDropoutPerThread = 4;

std::string forward_kernel(at::ScalarType t) { return std::string("dropout_") + metal_type(t); }
std::string backward_kernel(at::ScalarType t) { return std::string("dropout_backward_") + metal_type(t); }

// Threadgroups for `numel` elements, or 0 past what a grid's 32-bit x holds.
uint32_t threadgroups(int64_t numel) {
  const int64_t groups = (numel + kDropoutPerThread * kDropoutThreadsPerGroup - 1) /
                         (kDropoutPerThread * kDropoutThreadsPerGroup);
  return groups > int64_t(std::numeric_limits<uint32_t>::max()) ? 0 : uint32_t(groups);
}

// Every buffer's first element aligned for the kernels' 4-element loads and stores.
bool vectorized(const at::Tensor& values, const at::Tensor& result, const at::Tensor& mask) {
  const uintptr_t row = uintptr_t(kDropoutPerThread) * values.element_size();
  return aligned(values, row) && aligned(result, row) && aligned(mask, uintptr_t(kDropoutPerThread));
}

DropoutParams forward_params(int64_t numel, double p, PhiloxKey key) {
  DropoutParams params{};
  params.numel = uint64_t(numel);
  params.seed = key.seed;
  params.offset = key.offset;
  // keep iff bits / 2^32 >= p: p * 2^32 is exact in double, its ceiling the first word kept.
  params.threshold = uint64_t(std::ceil(p * 4294967296.0));
  // torch's CPU kernel: 1 / (1 - p) in double, 0 where nothing is kept, multiplied in as a float.
  const double kept = 1.0 - p;
  params.scale = float(kept == 0 ? 0.0 : 1.0 / kept);
  return params;
}

void launch_forward(const at::Tensor& values, const at::Tensor& result, const at::Tensor& mask, double p,
                    PhiloxKey key) {
  DropoutParams params = forward_params(values.numel(), p, key);
  params.vectorized = vectorized(values, result, mask);
  dispatch(Launch{forward_kernel(values.scalar_type()), {}, {threadgroups(values.numel())}, {kDropoutThreadsPerGroup}}
               .tensor(values)
               .tensor(result)
               .tensor(mask)
               .bytes(params));
}

}  // namespace

PhiloxKey draw_philox_key(const c10::Device& device) {
#if defined(MPS_EXT_METAL)
  if (device.is_mps()) {
    auto* gen = at::check_generator<at::MPSGeneratorImpl>(at::mps::detail::getDefaultMPSGenerator());
    std::lock_guard<std::mutex> lock(gen->mutex_);
    // Four fresh words of torch's own Philox stream, as its MPS random ops take them: the stream moves
    // on, so the next call (ours or torch's) gets others.
    gen->update_philox_counters();
    const uint32_t* s = gen->state_data();
    return {uint64_t(s[1]) | uint64_t(s[2]) << 32, uint64_t(s[3]) | uint64_t(s[4]) << 32};
  }
#endif
  (void)device;  // elsewhere every device draws from the CPU generator (the emulated GPU's tensors too)
  auto* gen = at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(gen->mutex_);
  const uint64_t seed = gen->random64();
  return {seed, gen->random64()};
}

std::optional<std::string> dropout_unsupported(const at::Tensor& input, double p) {
  const at::ScalarType t = input.scalar_type();
  if (!float_type(t)) return std::string("dtype ") + c10::toString(t);
  if (auto why = kernel_unsupported(input, forward_kernel(t), kDropoutThreadsPerGroup)) return why;
  if (!(p >= 0 && p <= 1)) return std::string("invalid arguments");
  if (input.numel() && !threadgroups(input.numel())) return std::string("more than 2^32 threadgroups");
  return std::nullopt;
}

std::tuple<at::Tensor, at::Tensor> dropout_kernels(const at::Tensor& input, double p, PhiloxKey key) {
  // The kernel walks memory: a dense input keeps its layout (channels-last stays so), one with gaps or
  // repeats is read once into a contiguous copy first.
  const at::Tensor values = input.is_non_overlapping_and_dense() ? input : input.contiguous();
  at::Tensor output = at::empty_like(values);
  at::Tensor mask = at::empty_like(values, values.options().dtype(at::kBool));
  if (values.numel()) launch_forward(values, output, mask, p, key);
  return {output, mask};
}

at::Tensor dropout_in_place_kernels(const at::Tensor& self, double p, PhiloxKey key) {
  const bool dense = self.is_non_overlapping_and_dense();
  const at::Tensor values = dense ? self : self.contiguous();
  at::Tensor mask = at::empty_like(values, values.options().dtype(at::kBool));
  if (values.numel()) launch_forward(values, values, mask, p, key);
  if (!dense) self.copy_(values);
  return mask;
}

std::optional<std::string> dropout_backward_unsupported(const at::Tensor& grad_output, const at::Tensor& mask) {
  const at::ScalarType t = grad_output.scalar_type();
  if (!float_type(t)) return std::string("dtype ") + c10::toString(t);
  if (auto why = kernel_unsupported(grad_output, backward_kernel(t), kDropoutThreadsPerGroup)) return why;
  if (mask.device() != grad_output.device()) return std::string("tensors on different devices");
  // torch's grad * mask * scale broadcasts and promotes: only a bool mask of the gradient's shape is the
  // mask native_dropout made.
  if (mask.scalar_type() != at::kBool || mask.layout() != at::kStrided || mask.sizes() != grad_output.sizes())
    return std::string("mask not bool or not of grad_output's shape");
  if (grad_output.numel() && !threadgroups(grad_output.numel())) return std::string("more than 2^32 threadgroups");
  return std::nullopt;
}

at::Tensor dropout_backward_kernels(const at::Tensor& grad_output, const at::Tensor& mask, double scale) {
  // Both walked in memory order: one layout for both (the gradient autograd hands over is often expanded
  // from a scalar, or laid out unlike the mask).
  const bool same = grad_output.is_non_overlapping_and_dense() && grad_output.strides() == mask.strides();
  const at::Tensor grad = same ? grad_output : grad_output.contiguous();
  const at::Tensor keep = same ? mask : mask.contiguous();
  at::Tensor grad_input = at::empty_like(grad);
  if (grad.numel() == 0) return grad_input;
  DropoutParams params{};
  params.numel = uint64_t(grad.numel());
  params.scale = float(scale);
  params.vectorized = vectorized(grad, grad_input, keep);
  dispatch(Launch{backward_kernel(grad.scalar_type()), {}, {threadgroups(grad.numel())}, {kDropoutThreadsPerGroup}}
               .tensor(grad)
               .tensor(keep)
               .tensor(grad_input)
               .bytes(params));
  return grad_input;
}

}  // namespace mps_ext::ops
