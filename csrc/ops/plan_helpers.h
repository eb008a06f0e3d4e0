// What the host plans of csrc/ops ask of sizes and tensors alike.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"

namespace mps_ext::ops {

inline uint32_t ceil_div(int64_t a, int64_t b) { return uint32_t((a + b - 1) / b); }

// The data types of the GEMV, softmax, grouped_mm and FP8 kernels' activations.
inline bool float_type(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

// Whether the address the kernel sees for `t`'s first element is a multiple
// of `bytes` (at most 16). A CPU tensor's storage is memory; an MPS tensor's
// is an MTLBuffer bound at the storage offset, its start aligned.
inline bool aligned(const at::Tensor& t, uintptr_t bytes) {
  const uintptr_t base = t.is_cpu() ? reinterpret_cast<uintptr_t>(t.storage().data()) : 0;
  return (base + uintptr_t(t.storage_offset()) * t.element_size()) % bytes == 0;
}

inline bool aligned16(const at::Tensor& t) { return aligned(t, 16); }

// The bytes of an e4m3fn (or uint8) tensor, as the kernels bind them.
inline at::Tensor bytes_of(const at::Tensor& t) { return t.scalar_type() == at::kByte ? t : t.view(at::kByte); }

// The rows of x a decode kernel is built for: 1, 2, 4 or 8.
inline int64_t rows_bucket(int64_t m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8; }

// Why `kernel` cannot run on `t`'s device at this many threads per
// threadgroup (no backend there, t not strided, the kernel unavailable), or
// nullopt.
inline std::optional<std::string> kernel_unsupported(const at::Tensor& t, const std::string& kernel,
                                                     uint32_t threads_per_threadgroup) {
  std::string why;
  Backend* backend = backend_for(t.device(), &why);
  if (!backend) return why;
  if (t.layout() != at::kStrided) return std::string("not strided");
  return backend->unavailable(kernel, threads_per_threadgroup);
}

// `t`'s layout (sizes, strides, dtype) on the meta device, without memory.
inline at::Tensor meta_view(const at::Tensor& t) {
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}

// The dimensions of `t` in its memory order, outermost first (those of size
// 1 wherever their strides put them), or nullopt where t is not dense in that
// order: the order in which a kernel that writes element k of t at offset k
// walks its dimensions.
inline std::optional<std::vector<int64_t>> dense_order(const at::Tensor& t) {
  std::vector<int64_t> order(t.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  int64_t expected = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (t.size(*it) == 1) continue;
    if (t.stride(*it) != expected) return std::nullopt;
    expected *= t.size(*it);
  }
  return order;
}

}  // namespace mps_ext::ops
