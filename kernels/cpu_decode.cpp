// cpu_decode.h's kernels as a Python module.

#include "cpu_decode.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention,
        "one query per sequence over its paged K/V (float32)");
}
