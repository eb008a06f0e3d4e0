// F.dropout and nn.Dropout in training: aten::dropout and aten::dropout_ are
// CompositeImplicitAutograd. For mps, torch 2.13 and 2.14 take their
// composite path (is_fused_kernel_acceptable names CUDA, XPU, lazy and
// privateuse1 only): empty_like, bernoulli_, div_, then mul, four passes;
// 2.15 sends out-of-place dropout on mps to native_dropout, and keeps the
// composite for dropout_ everywhere. Here, at the device's Autograd key,
// both reach native_dropout as torch does for CUDA, so autograd records
// NativeDropoutBackward, and native_dropout and native_dropout_backward run
// one Metal pass each.
//
// What torch's composite does stays: p outside [0, 1] raises its error; p ==
// 0, eval mode and empty inputs return the input itself; p == 1 multiplies by
// a zero (NaN stays NaN). Calls the kernels cannot take (other dtypes) keep
// torch's composite whole, bernoulli_ stream included, as do tensors a
// transform wraps (fake and functional tensors, vmap, functorch's grad): its
// decomposition is what those transforms expect.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/dropout_compositeimplicitautograd_dispatch.h>
#include <ATen/ops/native_dropout_backward_cpu_dispatch.h>
#include <ATen/ops/native_dropout_cpu_dispatch.h>
#if defined(MPS_EXT_METAL)
#include <ATen/ops/native_dropout_backward_mps_dispatch.h>
#include <ATen/ops/native_dropout_mps_dispatch.h>
#endif
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>

#include "ops/dropout.h"
#include "overrides/overrides.h"

namespace mps_ext::overrides {

namespace {

std::tuple<at::Tensor, at::Tensor> original_native_dropout(const at::Tensor& input, double p,
                                                           std::optional<bool> train) {
#if defined(MPS_EXT_METAL)
  if (input.device().is_mps()) return at::mps::native_dropout(input, p, train);
#endif
  return at::cpu::native_dropout(input, p, train);
}

at::Tensor original_native_dropout_backward(const at::Tensor& grad_output, const at::Tensor& mask, double scale) {
#if defined(MPS_EXT_METAL)
  if (grad_output.device().is_mps()) return at::mps::native_dropout_backward(grad_output, mask, scale);
#endif
  return at::cpu::native_dropout_backward(grad_output, mask, scale);
}

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  std::optional<std::string> why;
  if (inside_torch_call()) {
    why = "inside torch's own op";
  } else if (train.has_value() && !*train) {
    why = "not training";  // torch's kernel copies the input: nothing to draw
  } else if (input.numel() == 0) {
    why = "empty input";
  } else {
    why = ops::dropout_unsupported(input, p);
  }
  if (why) {
    const CallingTorch calling = fallback("aten::native_dropout", *why);
    return original_native_dropout(input, p, train);
  }
  auto out = ops::dropout_kernels(input, p, ops::draw_philox_key(input.device()));
  hit("aten::native_dropout");
  return out;
}

at::Tensor native_dropout_backward(const at::Tensor& grad_output, const at::Tensor& mask, double scale) {
  if (auto why = ops::dropout_backward_unsupported(grad_output, mask)) {
    const CallingTorch calling = fallback("aten::native_dropout_backward", *why);
    return original_native_dropout_backward(grad_output, mask, scale);
  }
  at::Tensor grad_input = ops::dropout_backward_kernels(grad_output, mask, scale);
  hit("aten::native_dropout_backward");
  return grad_input;
}

// Tensors whose transform dispatches below autograd expecting torch's decomposition.
bool transformed(const at::Tensor& t) {
  const c10::DispatchKeySet keys = t.key_set();
  return keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::Functionalize) ||
         keys.has(c10::DispatchKey::FuncTorchBatched) || keys.has(c10::DispatchKey::FuncTorchGradWrapper);
}

// Why dropout(input, p, train) is torch's composite, or nullopt where it
// reaches native_dropout; `trivial` where the composite draws nothing (it
// raises, returns the input or multiplies by zero) or belongs to a call left
// to torch.
std::optional<std::string> composite_reason(const at::Tensor& input, double p, bool train, bool* trivial) {
  *trivial = !train || input.numel() == 0 || !(p > 0 && p < 1) || inside_torch_call();
  if (*trivial) return std::string();
  if (transformed(input)) return std::string("a transform's tensor");
  return ops::dropout_unsupported(input, p);
}

at::Tensor dropout(const at::Tensor& input, double p, bool train) {
  bool trivial = false;
  if (auto why = composite_reason(input, p, train, &trivial)) {
    if (trivial) return at::compositeimplicitautograd::dropout(input, p, train);
    const CallingTorch calling = fallback("aten::dropout", *why);
    return at::compositeimplicitautograd::dropout(input, p, train);
  }
  // Through the dispatcher: autograd records NativeDropoutBackward, the device key runs the kernel.
  return std::get<0>(at::native_dropout(input, p, train));
}

// dropout_ where autograd records it: one pass over the input, and the
// derivative native_dropout's is (the gradient through the mask alone, as
// torch's mul_ gives it).
struct DropoutInPlace : public torch::autograd::Function<DropoutInPlace> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor input, double p) {
    at::Tensor mask = ops::dropout_in_place_kernels(input, p, ops::draw_philox_key(input.device()));
    hit("aten::dropout_");
    ctx->mark_dirty({input});
    ctx->save_for_backward({mask});
    ctx->saved_data["scale"] = 1.0 / (1.0 - p);
    return input;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const at::Tensor mask = ctx->get_saved_variables()[0];
    return {at::native_dropout_backward(grad[0], mask, ctx->saved_data["scale"].toDouble()), at::Tensor()};
  }
};

at::Tensor& dropout_(at::Tensor& input, double p, bool train) {
  bool trivial = false;
  if (auto why = composite_reason(input, p, train, &trivial)) {
    if (trivial) return at::compositeimplicitautograd::dropout_(input, p, train);
    const CallingTorch calling = fallback("aten::dropout_", *why);
    return at::compositeimplicitautograd::dropout_(input, p, train);
  }
  const bool differentiated = c10::GradMode::is_enabled() && input.requires_grad();
  if (input._fw_grad(/*level=*/0).defined() || (differentiated && input.is_leaf())) {
    // copy_'s checks (a leaf that requires grad raises torch's error) and forward-mode formula, which a
    // custom Function lacks.
    return input.copy_(std::get<0>(at::native_dropout(input, p, train)));
  }
  if (differentiated) {
    DropoutInPlace::apply(input, p);
    return input;
  }
  ops::dropout_in_place_kernels(input, p, ops::draw_philox_key(input.device()));
  hit("aten::dropout_");
  // Below autograd, the write is this kernel's: the version counter says so, as an in-place op's does.
  torch::autograd::impl::bump_version(input);
  return input;
}

}  // namespace

void register_dropout(OverrideLibrary& lib) {
  lib.impl("native_dropout", TORCH_FN(native_dropout));
  lib.impl("native_dropout_backward", TORCH_FN(native_dropout_backward));
  lib.impl_autograd("dropout", torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(dropout)));
  lib.impl_autograd("dropout_", torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(dropout_)));
}

}  // namespace mps_ext::overrides
