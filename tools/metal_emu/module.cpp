// _metal_emu: loading it makes the mps device the emulated Metal GPU, with
// csrc/metal as mps_ext's Metal backend (README: The Metal layer on an emulated Metal).
// pybind11 alone: its functions take and return no tensors, and torch/extension.h would be most of the
// emulation's build.
#include <pybind11/pybind11.h>

#include "hooks.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  emu::install();
  m.def("fail_next_kernel", &emu::fail_next_kernel, pybind11::arg("message"),
        "The next kernel the emulated GPU runs fails with this message instead of running.");
  m.def("released_object_uses", &emu::released_object_uses,
        "How many times the emulated GPU reached an object already released (a failed command buffer each).");
}
