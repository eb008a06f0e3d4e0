#pragma once

#include "backend.h"
#include "sim/runtime/runtime.h"

namespace mps_ext {

// A CPU tensor as a simulator buffer: its data at the storage offset, as many
// bytes as its strides reach, and which of them are its elements. Empty
// tensors are still bound (zero bytes).
mtlsim::Buffer sim_buffer(const at::Tensor& t);

// The core count of the GPU the simulator plans grids for (gpu_fill.h): a
// setting, kSimulatedGpuCores unless changed, for every thread.
int64_t sim_gpu_cores();
void set_sim_gpu_cores(int64_t cores);

// The kernel whose host name is `name` among those compiled into this
// extension (with its module in *module), or nullptr.
const mtlsim::KernelInfo* builtin_kernel(const std::string& name, const mtlsim::Module** module);

// Runs the kernels translated from metal/*.metal at build time, on CPU tensors.
Backend& sim_backend();

}  // namespace mps_ext
