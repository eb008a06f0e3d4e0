// Everything a translated .metal file sees in place of <metal_stdlib>.
#pragma once

#include "mtlsim/scalar.h"
#include "mtlsim/vec.h"
#include "mtlsim/math.h"
#include "mtlsim/glue.h"
#include "mtlsim/simd.h"
#include "mtlsim/atomic.h"
#include "mtlsim/matrix.h"
#include "mtlsim/matrix_types.h"
#include "mtlsim/array.h"
#include "mtlsim/internals.h"
#include "mtlsim/uniform.h"
#include "mtlsim/conditional.h"
// MSL 3.2's <metal_logging>, for sources that target 3.2 (the translator defines MTLSIM_MSL_VERSION):
// a 3.1 source may declare names of its own that 3.2 takes (MLX's logging.h does).
#if defined(MTLSIM_MSL_VERSION) && MTLSIM_MSL_VERSION >= 320
#include "mtlsim/logging.h"
#endif

// The address-space keywords of translated kernels, last: the shim's own code
// spells them MTLSIM_*. Compiler messages show these names.
#define device MTLSIM_DEVICE
#define constant MTLSIM_CONSTANT
#define threadgroup MTLSIM_THREADGROUP
// MSL's assert: a false condition aborts the dispatch, naming the condition and its .metal line.
#undef assert
#define assert(...) \
  ((__VA_ARGS__) ? void(0) : ::mtlsim::fail("assertion failed: " #__VA_ARGS__, ::mtlsim::Site{__FILE__, __LINE__, 0}))
