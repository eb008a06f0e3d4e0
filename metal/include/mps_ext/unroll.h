// Loops over a tile's compile-time extents are unrolled (written before the
// `for`): the arrays they index then stay in registers. A compiler that
// leaves such a loop rolled indexes them at run time, which puts them in
// memory (the CUDA proxy's nvcc did this to the 4- and 8-row GEMV tiles: a
// 32-64 byte stack frame read and written on every step).
#pragma once

#define MPS_EXT_UNROLL _Pragma("clang loop unroll(full)")
