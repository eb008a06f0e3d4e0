// _metal_emu: loading it makes the mps device the emulated Metal GPU, with
// csrc/metal as mps_ext's Metal backend (README: The Metal layer on an emulated Metal).
// pybind11 alone: its functions take and return no tensors, and torch/extension.h would be most of the
// emulation's build.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "hooks.h"
#include "metal/metal_backend.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  emu::install();
  m.def("fail_next_compiles", &emu::fail_next_compiles, pybind11::arg("message"), pybind11::arg("count"),
        pybind11::arg("compile_error"),
        "The next `count` library compiles fail with this message: a compile error, else the compiler "
        "service's internal error.");
  m.def("fail_next_kernel", &emu::fail_next_kernel, pybind11::arg("message"),
        "The next kernel the emulated GPU runs fails with this message instead of running.");
  m.def("set_core_count_fails", &emu::set_core_count_fails, pybind11::arg("fails"),
        "Whether torch's MPSDevice::getCoreCount throws (no gpu-core-count in IOKit).");
  m.def("device_info", &mps_ext::metal::device_info,
        "What `python -m mps_ext info` reports of the GPU (mps_ext's _C has no Metal backend on Linux).");
  m.def("released_object_uses", &emu::released_object_uses,
        "How many times the emulated GPU reached an object already released (a failed command buffer each).");
}
