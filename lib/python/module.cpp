// The Python module `cpuattn`: NumPy arrays and DLPack tensors (dlpack.h) in, the library's views
// over their memory (no copies), the computation with the GIL released, cpuattn::Error as
// ValueError. One unit per area (bindings.h); the helpers they share are in common.h.
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "cpuattn/cpuattn.h"

#ifndef CPUATTN_VERSION
#define CPUATTN_VERSION "0.1.0"
#endif

namespace py = pybind11;

PYBIND11_MODULE(cpuattn, m) {
  m.doc() =
      "cpuattn: fast, multithreaded CPU attention (NumPy arrays and DLPack tensors such as torch's "
      "read in place, results of the inputs' type, GIL released)";
  m.attr("__version__") = CPUATTN_VERSION;
  py::register_exception<cpuattn::Error>(m, "Error", PyExc_ValueError);

  cpuattn_py::bind_context(m);
  cpuattn_py::bind_attention(m);
  cpuattn_py::bind_kv_cache(m);
  cpuattn_py::bind_layers(m);
  cpuattn_py::bind_paged(m);
}
