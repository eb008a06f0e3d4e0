#pragma once

#include "mtlsim/abi.h"

namespace mtlsim {

// The table every kernel module calls into; it forwards to the worker
// running the calling GPU thread.
const RuntimeAPI& runtime_api();

}  // namespace mtlsim
