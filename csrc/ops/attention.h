// Scaled dot-product attention: validation, the views the kernels read,
// kernel choice and launch geometry, for both backends. The kernels are in
// metal/attention.metal.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

namespace mps_ext::ops {

// One call's arguments, as aten::scaled_dot_product_attention takes them.
struct AttentionArgs {
  const at::Tensor& query;
  const at::Tensor& key;
  const at::Tensor& value;
  const std::optional<at::Tensor>& attn_mask;
  double dropout_p;
  bool is_causal;
  std::optional<double> scale;
  bool enable_gqa;
  // mps_ext's own op: a logit per query head, a sliding window (params.h).
  std::optional<at::Tensor> sinks = std::nullopt;
  int64_t window = 0;
  double softcap = 0.0;  // 0, or Gemma-2's logit softcapping (params.h)
};

// Why the kernels cannot compute this call on its device, or nullopt when
// they can. Arguments torch rejects are a reason too ("invalid arguments"):
// torch's op then raises its own error.
std::optional<std::string> attention_unsupported(const AttentionArgs& a);

// Runs the kernels (requires !attention_unsupported): torch's output, shape
// and values, contiguous.
at::Tensor attention_kernels(const AttentionArgs& a);

// Training: why the forward that saves each row's log-sum-exp and the
// backward kernels cannot take this call (which needs a derivative), or
// nullopt.
std::optional<std::string> attention_training_unsupported(const AttentionArgs& a);

// (out, stats): the output and, per output row, the log-sum-exp in column 0
// (float32, (rows, 2)) for the backward.
std::tuple<at::Tensor, at::Tensor> attention_training_forward(const AttentionArgs& a);

// The gradients of the inputs (in their shapes; sinks where given) from the
// forward's output and stats and the output's gradient.
struct AttentionGradients {
  at::Tensor query, key, value, sinks;
};
AttentionGradients attention_training_backward(const AttentionArgs& a, const at::Tensor& out, const at::Tensor& stats,
                                               const at::Tensor& grad_out);

// The call through the training kernels as one differentiable op (requires
// !attention_training_unsupported and no dropout), counted as a hit of `op`.
at::Tensor attention_differentiable(const AttentionArgs& a, const char* op);

// torch's math for the call, sinks and window included (differentiable):
// what a call the kernels do not take runs.
at::Tensor attention_reference(const AttentionArgs& a);

// Whether autograd must see the call: an input requires grad or carries a
// forward gradient, or (with `subclasses`) is a tensor subclass.
bool attention_needs_derivative(const AttentionArgs& a, bool subclasses = true);

}  // namespace mps_ext::ops
