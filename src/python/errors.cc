#include "python/errors.h"

#include <Python.h>

#include "absl/status/status.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace shardwild::python {
namespace {

// The classes, created once at import (owned by the module from then on).
PyObject* g_error = nullptr;
PyObject* g_kinds[5] = {};  // by ErrorKind

PyObject* NewClass(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("shardwild.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(cls));  // steals no reference: the module keeps its own
  return cls;
}

}  // namespace

void Raise(const absl::Status& s, ErrorKind fallback) {
  ErrorKind kind = ErrorKindOf(s);
  if (kind == ErrorKind::kOther) kind = fallback;
  throw StatusError(s, kind);
}

void RegisterErrors(py::module_& m) {
  g_error = NewClass(m, "Error", PyExc_Exception, "Every error Shardwild raises; the message is the CLI's one line.");
  auto with_value_error = [](PyObject* base) {
    return PyTuple_Pack(2, base, PyExc_ValueError);
  };
  PyObject* config_bases = with_value_error(g_error);
  PyObject* data_bases = with_value_error(g_error);
  g_kinds[static_cast<int>(ErrorKind::kOther)] = g_error;
  g_kinds[static_cast<int>(ErrorKind::kConfig)] =
      NewClass(m, "ConfigError", config_bases, "A config key, value or combination of them is wrong.");
  g_kinds[static_cast<int>(ErrorKind::kData)] =
      NewClass(m, "DataError", data_bases, "A data file or array is missing, unreadable or malformed.");
  g_kinds[static_cast<int>(ErrorKind::kCheckpoint)] =
      NewClass(m, "CheckpointError", g_error, "No checkpoint, a damaged one, or one of another model.");
  g_kinds[static_cast<int>(ErrorKind::kStore)] =
      NewClass(m, "StoreError", g_error, "Creating or attaching a parameter store, or a bad variable, table or id.");
  Py_DECREF(config_bases);
  Py_DECREF(data_bases);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyObject* cls = g_kinds[static_cast<int>(e.kind())];
      PyObject* exc = PyObject_CallFunction(cls, "s", e.what());
      if (exc == nullptr) return;  // the call's own error stands
      const std::string code = absl::StatusCodeToString(e.status().code());
      PyObject_SetAttrString(exc, "code", py::str(code).ptr());
      PyErr_SetObject(cls, exc);
      Py_DECREF(exc);
    }
  });
}

}  // namespace shardwild::python
