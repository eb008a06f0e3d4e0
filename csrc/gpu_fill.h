// How many SIMD groups fill a GPU: the one figure every plan (csrc/ops) sizes
// its grids by, so that a grid gives each core as much memory traffic in
// flight as it can hold, on an 8-core M1 as on an 80-core Ultra. Each backend
// supplies it (Backend::fill_simdgroups): Metal from the GPU's core count, the
// simulator from a setting with the same policy, a launch recording from what
// it is given (the CUDA check: the GPU's SMs x each kernel's resident warps).
#pragma once

#include <cstdint>
#include <string>

namespace mps_ext {

// SIMD groups an Apple GPU core keeps resident for kernels of GEMV's register
// use: a core holds 768-3072 threads (24-96 SIMD groups), fewer the more
// registers each thread takes.
constexpr int64_t kResidentSimdGroupsPerCore = 32;

// The simulator's core count unless set (mps_ext.sim.gpu_cores): 32 x 32 =
// 1024 SIMD groups, an M-series Max.
constexpr int64_t kSimulatedGpuCores = 32;

inline int64_t fill_simdgroups_for_cores(int64_t cores) { return cores * kResidentSimdGroupsPerCore; }

// The core count of the smallest chip of the tier an MTLDevice architecture
// name stands for ("applegpu_g15s": an M3 Pro, 14 cores), for when the GPU's
// registry entry has no gpu-core-count; an unknown name counts as the smallest
// Mac GPU.
int64_t cores_of_architecture(const std::string& name);

}  // namespace mps_ext
