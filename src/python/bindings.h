// The parts of the Python extension module `shardwild._shardwild`, one
// registration function per file (module.cc calls them in order).
#pragma once

#include <pybind11/pybind11.h>

namespace shardwild::python {

// errors.cc: shardwild.Error and its kinds (ConfigError, DataError, ...).
void RegisterErrors(pybind11::module_& m);
// jobs.cc: load_config, Config, train, evaluate, predict, load_checkpoint.
void RegisterJobs(pybind11::module_& m);
// store.cc: Store (create, attach, pull, push, pull_rows, push_rows, version).
void RegisterStore(pybind11::module_& m);
// dispatcher.cc: Dispatcher (tasks of record ranges, report_done/report_failed).
void RegisterDispatcher(pybind11::module_& m);

}  // namespace shardwild::python
