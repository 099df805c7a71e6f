// cpu_panel_linear.h's kernels as a Python module.

#include "cpu_panel_linear.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("panel_linear", &panel_linear, "x . W^T + bias over W in panels (float32, or int8 * scales)",
        pybind11::arg("x"), pybind11::arg("panels"), pybind11::arg("scales"), pybind11::arg("bias"),
        pybind11::arg("out_features"), pybind11::arg("path") = kAvx512);
  m.def("widest_path_here", &widest_path_here, "the widest vector path this CPU runs");
  m.def("default_path_here", &default_path_here, "the path panel_linear takes unless told");
}
