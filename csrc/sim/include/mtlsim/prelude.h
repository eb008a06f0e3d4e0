// Everything a translated .metal file sees in place of <metal_stdlib>.
#pragma once

#include "mtlsim/scalar.h"
#include "mtlsim/vec.h"
#include "mtlsim/math.h"
#include "mtlsim/glue.h"
#include "mtlsim/simd.h"
#include "mtlsim/atomic.h"
#include "mtlsim/matrix.h"
