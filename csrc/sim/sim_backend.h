#pragma once

#include "backend.h"
#include "sim/runtime/runtime.h"

namespace mps_ext {

// A CPU tensor as a simulator buffer: its data at the storage offset, as many
// bytes as its strides reach, and which of them are its elements. Empty
// tensors are still bound (zero bytes).
mtlsim::Buffer sim_buffer(const at::Tensor& t);

// Runs the kernels translated from metal/*.metal at build time, on CPU tensors.
Backend& sim_backend();

}  // namespace mps_ext
