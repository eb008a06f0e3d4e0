// Python access to the simulator: load modules, dispatch with CPU tensors and
// scalar bytes as buffers.
#include <pybind11/functional.h>
#include <torch/extension.h>

#include <string>
#include <tuple>
#include <vector>

#include "gpu_fill.h"
#include "sim/builtin_modules.h"
#include "sim/sim_backend.h"
#include "sim/sim_streams.h"
#include "sim/runtime/runtime.h"
#include "trace.h"

namespace py = pybind11;

namespace {

// What a dispatch from Python binds, kept until its kernel has run (on a
// non-default stream, after _sim_dispatch returned).
struct PyLaunch {
  mtlsim::Launch launch;
  std::vector<at::Tensor> tensors;
  std::vector<std::string> scalars;  // owned copies: kernels get writable memory, Python bytes are not
};

std::vector<std::string> dispatch(const mtlsim::Module& module, const std::string& kernel, const py::list& buffers,
                                  std::array<uint32_t, 3> grid, std::array<uint32_t, 3> threadgroup,
                                  const std::vector<size_t>& threadgroup_lengths, bool grid_in_threads) {
  auto pending = std::make_shared<PyLaunch>();
  mtlsim::Launch& launch = pending->launch;
  launch.module = &module;
  launch.kernel = module.find(kernel);
  if (!launch.kernel) throw py::attribute_error("no kernel named '" + kernel + "' in " + module.name);
  TORCH_CHECK_VALUE(buffers.size() <= mtlsim::kMaxBufferSlots, "at most ", mtlsim::kMaxBufferSlots,
                    " buffers can be bound, got ", buffers.size());
  TORCH_CHECK_VALUE(threadgroup_lengths.size() == mtlsim::kMaxBufferSlots, "expected ", mtlsim::kMaxBufferSlots,
                    " threadgroup memory lengths");
  pending->scalars.reserve(buffers.size());  // no reallocation: buffers point into the strings
  for (size_t i = 0; i < buffers.size(); ++i) {
    py::handle b = buffers[i];
    if (b.is_none()) continue;
    if (THPVariable_Check(b.ptr())) {
      at::Tensor t = THPVariable_Unpack(b.ptr());
      TORCH_CHECK_VALUE(t.device().is_cpu(), "buffer ", i, " must be a CPU tensor, got one on ", t.device());
      launch.buffers[i] = mps_ext::sim_buffer(t);
      pending->tensors.push_back(std::move(t));
    } else {
      std::string& bytes = pending->scalars.emplace_back(b.cast<std::string>());
      launch.buffers[i] = mtlsim::Buffer::bytes(bytes.data(), bytes.size());
    }
  }
  for (size_t i = 0; i < mtlsim::kMaxBufferSlots; ++i) launch.threadgroup_lengths[i] = threadgroup_lengths[i];
  launch.grid = mtlsim::Dim3{grid[0], grid[1], grid[2]};
  launch.threadgroup = mtlsim::Dim3{threadgroup[0], threadgroup[1], threadgroup[2]};
  launch.grid_in_threads = grid_in_threads;
  auto groups = [&](uint32_t g, uint32_t t) { return grid_in_threads ? uint32_t((uint64_t(g) + t - 1) / t) : g; };
  auto record = [&] {
    mps_ext::trace::record({kernel,
                            {groups(grid[0], threadgroup[0]), groups(grid[1], threadgroup[1]),
                             groups(grid[2], threadgroup[2])},
                            {threadgroup[0], threadgroup[1], threadgroup[2]},
                            "simulator"});
  };
  // The default stream runs the kernel now: it is recorded once it ran. On
  // another stream it runs later and is recorded when enqueued; its errors
  // and warnings come from that stream's synchronize().
  const bool runs_now = mps_ext::sim_streams::current() == 0;
  if (!runs_now) record();
  const mtlsim::Options options = mtlsim::default_options();
  std::vector<std::string> warnings;
  {
    py::gil_scoped_release release;
    warnings = mps_ext::sim_streams::submit(
        [pending, options] { return mtlsim::dispatch(pending->launch, options).warnings; });
  }
  if (runs_now) record();
  return warnings;
}

// A KeyboardInterrupt (or any exception a Python signal handler raised)
// pending on the main thread, taken out of Python to stop a dispatch with.
// Python runs signal handlers on its main thread only.
unsigned long python_main_thread = 0;

std::exception_ptr python_interrupt() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (PyThread_get_thread_ident() != python_main_thread || !Py_IsInitialized() || finalizing) return nullptr;
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return nullptr;
  return std::make_exception_ptr(py::error_already_set());
}

}  // namespace

void register_sim_bindings(py::module_& m) {
  py::register_exception<mtlsim::SimError>(m, "SimulatorError", PyExc_RuntimeError);
  py::class_<mtlsim::Module>(m, "_SimModule").def_readonly("name", &mtlsim::Module::name);
  m.def("_sim_load_module", &mtlsim::load_module, py::return_value_policy::reference, py::arg("path"),
        py::call_guard<py::gil_scoped_release>());
  m.def("_sim_kernels", [](const mtlsim::Module& module) {
    std::vector<std::tuple<std::string, uint32_t, uint32_t>> out;
    for (uint32_t i = 0; i < module.info->num_kernels; ++i) {
      const mtlsim::KernelInfo& k = module.info->kernels[i];
      out.emplace_back(k.host_name, k.max_total_threads_per_threadgroup, k.threadgroup_memory);
    }
    return out;
  });
  m.def("_sim_dispatch", &dispatch);
  m.def("_sim_builtin_kernels", [] {
    std::vector<std::string> names;
    for (const mtlsim::BuiltinModule& b : mtlsim::builtin_modules()) {
      const mtlsim::Module& module = mtlsim::builtin_module(b.name, b.init);
      for (uint32_t i = 0; i < module.info->num_kernels; ++i) names.push_back(module.info->kernels[i].host_name);
    }
    return names;
  });
  m.def("_sim_push_checked", &mtlsim::push_checked, py::arg("compare_schedules"), py::arg("timeout"));
  m.def("_sim_pop_checked", &mtlsim::pop_checked, py::arg("token"));
  m.def("_sim_set_flush_half_subnormals", &mtlsim::set_flush_half_subnormals, py::arg("flush"));
  m.def("_sim_gpu_cores", &mps_ext::sim_gpu_cores);
  m.def("_sim_set_gpu_cores", &mps_ext::set_sim_gpu_cores, py::arg("cores"));
  m.def("_apple_gpu_cores_of_architecture", &mps_ext::cores_of_architecture, py::arg("name"));
  m.def("_sim_stream_warnings", &mps_ext::sim_streams::take_warnings, py::arg("stream"));
  m.def("_sim_stream_hold", &mps_ext::sim_streams::hold, py::arg("stream"));
  python_main_thread = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  mtlsim::set_interrupt_check(&python_interrupt);
}
