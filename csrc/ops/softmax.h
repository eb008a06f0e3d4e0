#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace mps_ext::ops {

// Why the kernels cannot compute (log_)softmax of `input` over `dim` into
// `out_dtype` on its device (dtype, device, or a kernel the backend cannot
// run), or nullopt when they can. Raises for an invalid dim, as torch does.
std::optional<std::string> softmax_unsupported(const at::Tensor& input, int64_t dim, at::ScalarType out_dtype,
                                               bool log);

// Runs the kernels (requires !softmax_unsupported): aten::_softmax semantics,
// with the output dtype either the input's or float from half/bfloat16.
at::Tensor softmax_kernels(const at::Tensor& input, int64_t dim, at::ScalarType out_dtype, bool log);

// mps_ext::softmax / mps_ext::log_softmax: torch.softmax semantics (dtype
// casts the input first); what the kernels cannot do goes to torch.
at::Tensor softmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype);
at::Tensor log_softmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype);

}  // namespace mps_ext::ops
