// mps_ext._C: Python bindings of the native core.
#include <ATen/autocast_mode.h>
#include <torch/extension.h>

#include "backend.h"
#if defined(MPS_EXT_METAL)
#include "metal/metal_backend.h"
#endif
#include "overrides/overrides.h"
#include "trace.h"

void register_recording_bindings(pybind11::module_& m);
void register_sim_bindings(pybind11::module_& m);
void register_stream_bindings(pybind11::module_& m);

namespace {

c10::DeviceType device_type(const std::string& device) { return c10::Device(device).type(); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  namespace ov = mps_ext::overrides;
  m.doc() = "mps_ext native core: the Metal simulator, the op layer, overrides and the Metal backend";
  register_sim_bindings(m);
  register_recording_bindings(m);
  register_stream_bindings(m);

  m.def("_has_metal", [] { return mps_ext::metal_backend() != nullptr; });
  m.def("_metal_unavailable", [] { return mps_ext::metal_unavailable_reason(); });
  m.def("_metal_device_info", [] {
#if defined(MPS_EXT_METAL)
    return mps_ext::metal::device_info();
#else
    return std::vector<std::pair<std::string, std::string>>{};
#endif
  });

  m.def("_overrides_enable", [](const std::string& d) { ov::enable(device_type(d)); });
  m.def("_overrides_disable", [](const std::string& d) { ov::disable(device_type(d)); });
  m.def("_overrides_is_enabled", [](const std::string& d) { return ov::is_enabled(device_type(d)); });
  m.def("_overridden_ops", [](const std::string& d) { return ov::overridden_ops(device_type(d)); });
  m.def("_override_stats", [] {
    py::dict out;
    for (const auto& [op, s] : ov::stats()) {
      py::dict reasons;
      for (const auto& [why, n] : s.reasons) reasons[py::str(why)] = n;
      py::dict entry;
      entry["hits"] = s.hits;
      entry["fallbacks"] = s.fallbacks;
      entry["reasons"] = reasons;
      out[py::str(op)] = entry;
    }
    return out;
  });
  m.def("_override_reset_stats", &ov::reset_stats);
  // torch's autocast cast of one argument: only eligible tensors, and a float32 leaf that requires grad
  // (a parameter) cast once per autocast region, as torch's own ops cast theirs.
  m.def("_autocast_cast", [](const at::Tensor& t, at::ScalarType dtype, const std::string& d) {
    return at::autocast::cached_cast(dtype, t, device_type(d));
  });

  m.def("_trace_begin", &mps_ext::trace::begin, py::arg("max_records"));
  m.def("_trace_end", [](uint64_t id) {
    auto [records, dropped] = mps_ext::trace::end(id);
    py::list out;
    for (const auto& r : records)
      out.append(py::make_tuple(r.name, py::make_tuple(r.grid.x, r.grid.y, r.grid.z),
                                py::make_tuple(r.threadgroup.x, r.threadgroup.y, r.threadgroup.z), r.backend));
    return py::make_tuple(out, dropped);
  });
  m.def("_trace_open_count", &mps_ext::trace::open_count);
}
