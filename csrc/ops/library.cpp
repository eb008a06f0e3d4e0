// The mps_ext:: operator library: schemas, and the same implementation at the
// CPU key (simulator) and the MPS key (Metal).
#include <torch/library.h>

#include "ops/softmax.h"

TORCH_LIBRARY(mps_ext, m) {
  m.def("softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor");
  m.def("log_softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(mps_ext, CPU, m) {
  m.impl("softmax", TORCH_FN(mps_ext::ops::softmax));
  m.impl("log_softmax", TORCH_FN(mps_ext::ops::log_softmax));
}

TORCH_LIBRARY_IMPL(mps_ext, MPS, m) {
  m.impl("softmax", TORCH_FN(mps_ext::ops::softmax));
  m.impl("log_softmax", TORCH_FN(mps_ext::ops::log_softmax));
}
