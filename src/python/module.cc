// The extension module behind the `shardwild` Python package
// (src/python/shardwild/__init__.py re-exports what it defines).
#include <pybind11/pybind11.h>

#include "python/bindings.h"

PYBIND11_MODULE(_shardwild, m) {
  m.doc() = "Shardwild: NUMA-aware Hogwild parameter-server training (the C++ core)";
  m.attr("__version__") = SHARDWILD_VERSION;
  shardwild::python::RegisterErrors(m);
  shardwild::python::RegisterJobs(m);
  shardwild::python::RegisterStore(m);
  shardwild::python::RegisterDispatcher(m);
}
