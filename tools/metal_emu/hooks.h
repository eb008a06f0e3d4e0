// What the emulation offers its tests (plain C++, for the Python module).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace emu {

// Registers the MPS device with torch (allocator, torch's ops on it) and
// installs the Metal backend of csrc/metal as mps_ext's backend for mps.
void install();

// The next kernel the GPU runs fails with `message` instead of running.
void fail_next_kernel(const std::string& message);

// Command buffers committed so far that referenced an object already
// released when the GPU reached it.
int64_t released_object_uses();

}  // namespace emu
