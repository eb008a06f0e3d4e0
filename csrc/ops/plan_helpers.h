// What the host plans of csrc/ops ask of sizes and tensors alike.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace mps_ext::ops {

inline uint32_t ceil_div(int64_t a, int64_t b) { return uint32_t((a + b - 1) / b); }

// The data types of the GEMV, softmax, grouped_mm and FP8 kernels' activations.
inline bool float_type(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

// Whether the address the kernel sees for `t`'s first element is 16-byte
// aligned. A CPU tensor's storage is memory; an MPS tensor's is an MTLBuffer
// bound at the storage offset, its start aligned.
inline bool aligned16(const at::Tensor& t) {
  const uintptr_t base = t.is_cpu() ? reinterpret_cast<uintptr_t>(t.storage().data()) : 0;
  return (base + uintptr_t(t.storage_offset()) * t.element_size()) % 16 == 0;
}

// The bytes of an e4m3fn (or uint8) tensor, as the kernels bind them.
inline at::Tensor bytes_of(const at::Tensor& t) { return t.scalar_type() == at::kByte ? t : t.view(at::kByte); }

// The rows of x a decode kernel is built for: 1, 2, 4 or 8.
inline int64_t rows_bucket(int64_t m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8; }

}  // namespace mps_ext::ops
