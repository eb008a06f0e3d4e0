#include <torch/extension.h>

void register_sim_bindings(pybind11::module_& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "mps_ext native core: the Metal simulator (and, on macOS, the Metal backend)";
  register_sim_bindings(m);
}
