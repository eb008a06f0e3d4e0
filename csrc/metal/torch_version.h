// The torch version whose headers the Metal layer is compiled against (2.13-2.15 on a Mac; the emulated
// Metal of tools/metal_emu builds it as each of them).
#pragma once

#include <torch/headeronly/version.h>

#define MPS_EXT_TORCH_AT_LEAST(minor) \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= (minor)))
