// Scaled dot-product attention. On mps, F.scaled_dot_product_attention
// without grad calls aten::_scaled_dot_product_attention_math_for_mps (torch
// 2.13-2.15): its kernels read K/V once per query head, and batch
// broadcasting, head dims outside a short list, a float mask of another
// dtype, causal with a mask and a value head dim unlike the query's go to
// MPSGraph, which materialises the scores (or, for broadcasting on 2.13 and
// 2.14, raises). Its second output is never read by its caller; torch's
// kernels return an unwritten tensor there.
//
// On the CPU (in tests), F.scaled_dot_product_attention reaches
// _scaled_dot_product_flash_attention_for_cpu or the composite
// _scaled_dot_product_attention_math depending on the shapes, and only the
// former for the common 4-D case: the override sits at the composite
// aten::scaled_dot_product_attention itself, at the CPU key. On both
// devices, a call that needs a derivative (where torch runs its composite
// math with the scores materialised) takes the training kernels at the
// device's autograd key: a forward that saves each row's log-sum-exp and a
// backward that recomputes the probabilities tile by tile.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_scaled_dot_product_attention_math_compositeimplicitautograd_dispatch.h>
#include <ATen/ops/scaled_dot_product_attention_compositeimplicitautograd_dispatch.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#if defined(MPS_EXT_METAL)
#include <ATen/ops/_scaled_dot_product_attention_math_for_mps_mps_dispatch.h>
#endif

#include "ops/attention.h"
#include "overrides/overrides.h"

namespace mps_ext::overrides {

namespace {

constexpr char kMathForMps[] = "aten::_scaled_dot_product_attention_math_for_mps";
constexpr char kSdpa[] = "aten::scaled_dot_product_attention";

// The shape torch's meta kernel gives the second output: the scores' (the
// output's, with the key count for its last dimension). Nothing is stored.
at::Tensor unwritten_scores(const at::Tensor& out, const at::Tensor& key) {
  std::vector<int64_t> shape(out.sizes().begin(), out.sizes().end());
  shape.back() = key.size(-2);
  return at::empty({}, out.options()).expand(shape);
}

std::tuple<at::Tensor, at::Tensor> math_for_mps(const at::Tensor& query, const at::Tensor& key,
                                                const at::Tensor& value, const std::optional<at::Tensor>& attn_mask,
                                                double dropout_p, bool is_causal,
                                                const std::optional<at::Tensor>& dropout_mask,
                                                std::optional<double> scale, bool enable_gqa) {
  const ops::AttentionArgs args{query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa};
  std::optional<std::string> why = ops::attention_unsupported(args);
  if (!why && dropout_mask) why = "dropout mask";
  if (why) {
    const CallingTorch calling = fallback(kMathForMps, *why);
#if defined(MPS_EXT_METAL)
    if (query.device().is_mps())
      return at::mps::_scaled_dot_product_attention_math_for_mps(query, key, value, attn_mask, dropout_p, is_causal,
                                                                 dropout_mask, scale, enable_gqa);
#endif
    // The op has no CPU kernel of torch's: the math it stands for.
    return at::compositeimplicitautograd::_scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, dropout_mask, scale, enable_gqa);
  }
  at::Tensor out = ops::attention_kernels(args);
  hit(kMathForMps);
  return {out, unwritten_scores(out, key)};
}

at::Tensor sdpa_cpu(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                    const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                    std::optional<double> scale, bool enable_gqa) {
  const ops::AttentionArgs args{query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa};
  std::optional<std::string> why = ops::attention_unsupported(args);
  // torch's CPU flash kernel applies a mask and causal together; its math path raises for them.
  if (!why && is_causal && attn_mask &&
      at::_fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) == 0)
    why = "invalid arguments";
  if (why) {
    const CallingTorch calling = fallback(kSdpa, *why);
    return at::compositeimplicitautograd::scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                                        is_causal, scale, enable_gqa);
  }
  at::Tensor out = ops::attention_kernels(args);
  hit(kSdpa);
  return out;
}

// Autograd<device>: a call autograd must see (inputs that require grad or
// carry a forward gradient, tensor subclasses) runs the training kernels,
// or else torch's composite, which decomposes into differentiable ops; any
// other goes on to the device's kernel (on mps, torch's composite, which
// calls _scaled_dot_product_attention_math_for_mps).
at::Tensor sdpa_autograd(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  const ops::AttentionArgs args{query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa};
  if (ops::attention_needs_derivative(args)) {
    std::optional<std::string> why = dropout_p != 0.0 ? std::optional<std::string>("dropout")
                                                       : ops::attention_training_unsupported(args);
    // torch's CPU flash kernel applies a mask and causal together; its math path raises for them.
    if (!why && is_causal && attn_mask && query.is_cpu() &&
        at::_fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) == 0)
      why = "invalid arguments";
    if (!why) return ops::attention_differentiable(args, kSdpa);
    const CallingTorch calling = fallback(kSdpa, "autograd: " + *why);
    return at::compositeimplicitautograd::scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                                        is_causal, scale, enable_gqa);
  }
  at::AutoDispatchBelowADInplaceOrView below;
  return at::scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

// torch 2.13 gave the op its enable_gqa argument; an older torch (the CUDA
// check's) keeps its own kernel, since a kernel of another signature cannot
// be registered.
bool math_for_mps_takes_gqa() {
  const auto op = c10::Dispatcher::singleton().findSchema({kMathForMps, ""});
  if (!op) return false;
  for (const c10::Argument& arg : op->schema().arguments())
    if (arg.name() == "enable_gqa") return true;
  return false;
}

}  // namespace

void register_attention(OverrideLibrary& lib, c10::DeviceType device) {
  if (math_for_mps_takes_gqa()) lib.impl("_scaled_dot_product_attention_math_for_mps", TORCH_FN(math_for_mps));
  lib.impl_autograd("scaled_dot_product_attention", torch::CppFunction(TORCH_FN(sdpa_autograd)));
  if (device != c10::DeviceType::CPU) return;
  lib.impl("scaled_dot_product_attention", TORCH_FN(sdpa_cpu));
}

}  // namespace mps_ext::overrides
