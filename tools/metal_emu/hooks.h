// What the emulation offers its tests (plain C++, for the Python module).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace emu {

// Registers the MPS device with torch (allocator, torch's ops on it) and
// installs the Metal backend of csrc/metal as mps_ext's backend for mps.
void install();

// The next `count` library compiles fail with `message`: a compile error
// (MTLLibraryErrorCompileFailure), else an internal error of the compiler
// service (MTLLibraryErrorInternal), which a later try need not meet.
void fail_next_compiles(const std::string& message, int64_t count, bool compile_error);

// The next kernel the GPU runs fails with `message` instead of running.
void fail_next_kernel(const std::string& message);

// Whether torch's MPSDevice::getCoreCount throws, as it does where IOKit has
// no gpu-core-count for the GPU's accelerator entry.
void set_core_count_fails(bool fails);

// Command buffers committed so far that referenced an object already
// released when the GPU reached it.
int64_t released_object_uses();

}  // namespace emu
