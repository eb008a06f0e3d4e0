// Python access to the backends' streams and events (mps_ext/streams.py
// builds torch.cuda's API on these). Calls that wait release the GIL: work
// finishing on another thread may need it (to free a tensor Python let go of).
#include <torch/extension.h>

#include "backend.h"

namespace py = pybind11;

namespace {

mps_ext::Backend& backend(const std::string& device) {
  std::string why;
  mps_ext::Backend* b = mps_ext::backend_for(c10::Device(device), &why);
  TORCH_CHECK(b, "mps_ext: ", why);
  return *b;
}

}  // namespace

void register_stream_bindings(py::module_& m) {
  using mps_ext::Event;
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("_stream_new", [](const std::string& d) { return backend(d).new_stream(); });
  m.def("_stream_current", [](const std::string& d) { return backend(d).current_stream(); });
  m.def("_stream_set_current", [](const std::string& d, int64_t s) { backend(d).set_current_stream(s); });
  m.def("_stream_synchronize", [](const std::string& d, int64_t s) { backend(d).synchronize(s); }, no_gil);
  m.def("_stream_query", [](const std::string& d, int64_t s) { return backend(d).query(s); }, no_gil);
  m.def("_record_tensor", [](const std::string& d, const at::Tensor& t, int64_t s) {
    mps_ext::Backend& b = backend(d);
    TORCH_CHECK(t.device().type() == c10::Device(d).type(), "record_stream: the tensor is on ", t.device(),
                ", the stream on ", d);
    b.record_tensor(t, s);
  });
  m.def("_wait_torch_event", [](const std::string& d, int64_t s, int64_t event_id) {
    backend(d).wait_torch_event(s, event_id);
  }, no_gil);
  py::class_<Event>(m, "_Event")
      .def("record", &Event::record, no_gil)
      .def("block", &Event::block, no_gil)
      .def("query", &Event::query, no_gil)
      .def("synchronize", &Event::synchronize, no_gil)
      .def("seconds", &Event::seconds);
  m.def("_before_torch_ops", [](const std::string& d) { mps_ext::before_torch_ops(c10::Device(d)); }, no_gil);
  m.def("_event_new", [](const std::string& d) { return backend(d).new_event(); });
}
