// Host names of the kernels: <op>_<kernel>_<types...>, the same parts the
// .metal instantiation macros join (e.g. softmax_block_half_float).
#pragma once

#include <c10/core/ScalarType.h>

#include <initializer_list>
#include <string>

namespace mps_ext::ops {

// The MSL name of a tensor dtype the kernels support.
inline const char* metal_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float";
    case at::kHalf: return "half";
    case at::kBFloat16: return "bfloat";
    case at::kComplexFloat: return "float2";  // (re, im): MSL has no complex type
    case at::kFloat8_e4m3fn: return "fp8";  // bytes: metal/fp8.metal
    case at::kFloat8_e5m2: return "e5m2";   // bytes
    default: TORCH_CHECK(false, "mps_ext: no Metal type for ", t);
  }
}

inline std::string host_name(const char* op, const char* kernel, std::initializer_list<at::ScalarType> types) {
  std::string name = std::string(op) + "_" + kernel;
  for (at::ScalarType t : types) name += std::string("_") + metal_type(t);
  return name;
}

}  // namespace mps_ext::ops
