// Python access to launch recording (mps_ext.sim.record_launches).
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <utility>
#include <vector>

#include "recording.h"
#include "sim/sim_backend.h"

namespace py = pybind11;

namespace {

// A closed recording: Python reads its launches, the simulator replays them.
struct Recorded {
  std::vector<mps_ext::Launch> launches;
};

// (kernel, grid, threadgroup, threadgroup memory, args): an arg is the bytes of
// a parameter struct, or (tensor, byte offset in its storage, bytes it spans).
py::list describe(const Recorded& r) {
  py::list out;
  for (const mps_ext::Launch& l : r.launches) {
    py::list args;
    for (const mps_ext::Arg& a : l.args) {
      if (!a.is_tensor()) {
        args.append(py::bytes(reinterpret_cast<const char*>(a.bytes.data()), a.bytes.size()));
        continue;
      }
      const size_t offset = size_t(a.tensor.storage_offset()) * a.tensor.element_size();
      args.append(py::make_tuple(a.tensor, offset, mps_ext::sim_buffer(a.tensor).size));
    }
    const mtlsim::Module* module = nullptr;
    const mtlsim::KernelInfo* kernel = mps_ext::builtin_kernel(l.kernel, &module);
    out.append(py::make_tuple(l.kernel, py::make_tuple(l.threadgroups.x, l.threadgroups.y, l.threadgroups.z),
                              py::make_tuple(l.threads_per_threadgroup.x, l.threads_per_threadgroup.y,
                                             l.threads_per_threadgroup.z),
                              kernel ? kernel->threadgroup_memory : 0, args));
  }
  return out;
}

}  // namespace

void register_recording_bindings(py::module_& m) {
  m.def("_record_begin", &mps_ext::recording::begin, py::arg("fill"), py::arg("max_threads"));
  m.def("_record_end", [] { return Recorded{mps_ext::recording::end()}; });
  py::class_<Recorded>(m, "_Recording")
      .def("launches", &describe)
      .def(
          "replay",
          [](const Recorded& r) {
            for (const mps_ext::Launch& l : r.launches) mps_ext::dispatch(l);
          },
          py::call_guard<py::gil_scoped_release>());
}
