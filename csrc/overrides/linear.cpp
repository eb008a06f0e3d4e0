// aten::linear, aten::mm / aten::addmm (x @ W.T written by hand, how F.linear
// reaches the CPU key when linear itself has no CPU kernel, and x @ W with W
// k x n, transformers' Conv1D) and aten::mv / aten::addmv (W @ v), routed to
// the GEMV kernels for 1-8 rows: gemv_* for a row-major weight (n x k),
// gemv_t_* for one stored k-major.
//
// Autograd: aten::linear has a derivative of its own in torch 2.13-2.15
// (derivatives.yaml: linear_backward, registered for MPS because MPS has a
// linear kernel) and is otherwise CompositeImplicitAutograd. A kernel at a
// backend key makes the dispatcher use that derivative for the backend's
// autograd key instead of decomposing linear into mm/addmm. MPS has torch's
// linear_backward kernel; the CPU key has none, so the CPU overrides register
// one here, computed with mm and sum as the decomposition's derivative is
// (once, for good: see register_linear). mm and addmm keep their own derivatives. torch's linear derivative has no
// forward-mode formula (nor on mps, where it is used too); a CPU call with tangents
// decomposes into mm/addmm, as it does without the overrides. So does a call
// traced by torch.compile or torch.export (fake or functional tensors): a graph
// must not call linear_backward, whose CPU kernel exists only once the
// overrides have been on (and whose gradient of the bias has torch's meta shape only
// on mps); mm and addmm reach the GEMV as linear does.
#include <ATen/ATen.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/addmv_cpu_dispatch.h>
#include <ATen/ops/linear_compositeimplicitautograd_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <ATen/ops/mv_compositeexplicitautograd_dispatch.h>
#if defined(MPS_EXT_METAL)
#include <ATen/ops/addmm_mps_dispatch.h>
#include <ATen/ops/addmv_mps_dispatch.h>
#include <ATen/ops/linear_mps_dispatch.h>
#include <ATen/ops/mm_mps_dispatch.h>
#endif

#include <algorithm>

#include "ops/gemv.h"
#include "overrides/overrides.h"

namespace mps_ext::overrides {

namespace {

// torch's own kernels for the tensor's device, called directly: going
// through the dispatcher would come back here.
at::Tensor original_linear(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
#if defined(MPS_EXT_METAL)
  if (input.device().is_mps()) return at::mps::linear(input, weight, bias);
#endif
  // Below autograd, the decomposition's mm/addmm run without recording.
  return at::compositeimplicitautograd::linear(input, weight, bias);
}

at::Tensor original_mm(const at::Tensor& self, const at::Tensor& mat2) {
#if defined(MPS_EXT_METAL)
  if (self.device().is_mps()) return at::mps::mm(self, mat2);
#endif
  return at::cpu::mm(self, mat2);
}

at::Tensor original_addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                          const at::Scalar& beta, const at::Scalar& alpha) {
#if defined(MPS_EXT_METAL)
  if (self.device().is_mps()) return at::mps::addmm(self, mat1, mat2, beta, alpha);
#endif
  return at::cpu::addmm(self, mat1, mat2, beta, alpha);
}

at::Tensor original_addmv(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec,
                          const at::Scalar& beta, const at::Scalar& alpha) {
#if defined(MPS_EXT_METAL)
  if (self.device().is_mps()) return at::mps::addmv(self, mat, vec, beta, alpha);
#endif
  return at::cpu::addmv(self, mat, vec, beta, alpha);
}

// GEMV when the kernels take it (counted), else nullopt and why not. The
// matrix products torch's own ops make for a call left to them (a
// _scaled_mm or _grouped_mm on its CPU kernel) stay torch's.
std::optional<at::Tensor> try_gemv(const char* op, const at::Tensor& input, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias, std::string* why) {
  if (inside_torch_call()) {
    *why = "inside torch's own op";
    return std::nullopt;
  }
  if (auto unsupported = ops::gemv_unsupported(input, weight, bias)) {
    *why = *unsupported;
    return std::nullopt;
  }
  at::Tensor out = ops::gemv(input, weight, bias);
  hit(op);
  return out;
}

at::Tensor linear(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  std::string why;
  if (auto out = try_gemv("aten::linear", input, weight, bias, &why)) return *out;
  const CallingTorch calling = fallback("aten::linear", why);
  return original_linear(input, weight, bias);
}

// mat2 (k x n) as the weight (n x k) of x @ W.T, or nullopt with the
// reason: the GEMV reads it row-major (x @ W.T with W n x k, how F.linear
// decomposes) or k-major (x @ W with W k x n, transformers' Conv1D).
std::optional<at::Tensor> weight_of(const at::Tensor& mat1, const at::Tensor& mat2, std::string* why) {
  if (mat1.dim() != 2 || mat2.dim() != 2) {
    *why = "not 2-D";
    return std::nullopt;
  }
  return mat2.t();
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2) {
  std::string why;
  if (auto weight = weight_of(self, mat2, &why)) {
    if (auto out = try_gemv("aten::mm", self, *weight, std::nullopt, &why)) return *out;
  }
  const CallingTorch calling = fallback("aten::mm", why);
  return original_mm(self, mat2);
}

// addmm(bias, x, W.t()) as nn.Linear's decomposition sends it: beta = alpha =
// 1 and `self` one row broadcast over the output (a 1-D bias, a (1, n)
// tensor, or one expanded to (m, n) with stride 0).
at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  std::string why;
  std::optional<at::Tensor> weight = weight_of(mat1, mat2, &why);
  std::optional<at::Tensor> bias;
  if (weight) {
    if (!(beta.equal(1) && alpha.equal(1))) {
      why = "beta or alpha != 1";
    } else if (self.dim() == 1) {
      bias = self;
    } else if (self.dim() == 2 && (self.size(0) == 1 || (self.stride(0) == 0 && self.size(0) == mat1.size(0)))) {
      bias = self.select(0, 0);
    } else {
      why = "self not a bias row";
    }
  }
  if (bias) {
    if (auto out = try_gemv("aten::addmm", mat1, *weight, bias, &why)) return *out;
  }
  const CallingTorch calling = fallback("aten::addmm", why);
  return original_addmm(self, mat1, mat2, beta, alpha);
}

// W @ v (torch.mv, and torch.matmul of a matrix and a vector): the matrix is
// the weight (row-major, or k-major: W.T @ v), the vector one row of x.
// torch's mv is composite on both keys (addmv_ into a new tensor), so it is
// the fallback on both.
at::Tensor mv(const at::Tensor& self, const at::Tensor& vec) {
  std::string why = "not a matrix and a vector";
  if (self.dim() == 2 && vec.dim() == 1) {
    if (auto out = try_gemv("aten::mv", vec, self, std::nullopt, &why)) return *out;
  }
  const CallingTorch calling = fallback("aten::mv", why);
  return at::compositeexplicitautograd::mv(self, vec);
}

// addmv(b, W, v) with beta = alpha = 1 and a bias of the output's length.
at::Tensor addmv(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  std::string why;
  if (mat.dim() != 2 || vec.dim() != 1) {
    why = "not a matrix and a vector";
  } else if (!(beta.equal(1) && alpha.equal(1))) {
    why = "beta or alpha != 1";
  } else if (self.dim() != 1) {
    why = "self not a bias row";
  } else if (auto out = try_gemv("aten::addmv", vec, mat, self, &why)) {
    return *out;
  }
  const CallingTorch calling = fallback("aten::addmv", why);
  return original_addmv(self, mat, vec, beta, alpha);
}

// torch's derivative of linear, for the CPU key (MPS has its own kernel):
// what the mm/addmm decomposition's backward computes. The bias's gradient is
// grad_output as it is: this signature does not carry the bias's shape (1-D,
// 2-D, anything that broadcasts to the output), and autograd sums a gradient
// down to its input's shape.
std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_backward_cpu(const at::Tensor& input,
                                                                   const at::Tensor& grad_output,
                                                                   const at::Tensor& weight,
                                                                   std::array<bool, 3> mask) {
  at::Tensor grad_input, grad_weight, grad_bias;
  if (weight.dim() == 1) {  // linear with a 1-D weight is input @ weight
    if (mask[0]) grad_input = grad_output.unsqueeze(-1) * weight;
    if (mask[1]) grad_weight = (grad_output.unsqueeze(-1) * input).reshape({-1, weight.size(0)}).sum(0);
  } else {
    const at::Tensor grad2 = grad_output.reshape({-1, weight.size(0)});
    if (mask[0]) grad_input = at::matmul(grad_output, weight);
    if (mask[1]) grad_weight = grad2.t().mm(input.reshape({-1, weight.size(1)}));
  }
  if (mask[2]) grad_bias = grad_output;
  return {grad_input, grad_weight, grad_bias};
}

// torch's autograd kernel of linear at the CPU key once the CPU kernel above exists.
std::optional<c10::SafeKernelFunction> torch_linear_autograd_cpu;

void linear_autograd_cpu(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto args = torch::jit::last(*stack, 3);
  const bool decompose = std::any_of(args.begin(), args.end(), [](const c10::IValue& a) {
    if (!a.isTensor()) return false;
    const at::Tensor& t = a.toTensor();
    return t._fw_grad(/*level=*/0).defined() || t.key_set().has(c10::DispatchKey::Python);
  });
  if (!decompose) return torch_linear_autograd_cpu->callBoxed(op, keys, stack);
  at::Tensor out = at::compositeimplicitautograd::linear(args[0].toTensor(), args[1].toTensor(),
                                                         args[2].toOptional<at::Tensor>());
  torch::jit::drop(*stack, 3);
  torch::jit::push(*stack, std::move(out));
}

}  // namespace

void register_linear(OverrideLibrary& lib, c10::DeviceType device) {
  lib.impl("linear", TORCH_FN(linear));
  lib.impl("mm", TORCH_FN(mm));
  lib.impl("addmm", TORCH_FN(addmm));
  lib.impl("mv", TORCH_FN(mv));
  lib.impl("addmv", TORCH_FN(addmv));
  if (device != c10::DeviceType::CPU) return;
  // linear_backward's CPU kernel outlives the overrides: a graph recorded
  // while they were on holds torch's LinearBackward nodes, which call it
  // whenever that backward runs, overrides on or off. Never unregistered, and
  // harmless while they are off (only those nodes call it).
  static const torch::Library* const backward = [] {
    auto* l = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__, __LINE__);
    l->impl("linear_backward", TORCH_FN(linear_backward_cpu));
    return l;
  }();
  (void)backward;
  torch_linear_autograd_cpu = c10::Dispatcher::singleton().findSchemaOrThrow("aten::linear", "")
                                  .getComputedKernelForDispatchKey(c10::DispatchKey::AutogradCPU);
  lib.impl_autograd("linear", torch::CppFunction::makeFromBoxedFunction<&linear_autograd_cpu>());
}

}  // namespace mps_ext::overrides
