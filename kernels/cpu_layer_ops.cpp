// cpu_layer_ops.h's kernels as a Python module.

#include "cpu_layer_ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms_norm", &add_rms_norm, "residual += hidden in place; RMSNorm(residual) * weight",
        pybind11::arg("hidden"), pybind11::arg("residual"), pybind11::arg("weight"),
        pybind11::arg("eps"));
  m.def("rotary_in_place", &rotary_in_place, "rotary embedding of [tokens, heads, dim], in place",
        pybind11::arg("x"), pybind11::arg("cos"), pybind11::arg("sin"));
  m.def("silu_and_mul", &silu_and_mul, "SiLU(gate) * up of [rows, 2 * width]",
        pybind11::arg("gate_up"));
}
