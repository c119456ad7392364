// Jobs from Python: configs, training, evaluation, prediction, checkpoints.
//
//   cfg = shardwild.load_config("configs/fashion_mnist_mlp.yaml", overrides={"train.epochs": 2})
//   result = shardwild.train(cfg, callbacks=[fn])   # the `train --json` summary, as a dict
//   shardwild.evaluate(cfg, "ckpts")                # the `eval --json` record
//   probs = shardwild.predict(cfg, "ckpts", images) # what `predict` writes, as an array
//   tensors, manifest = shardwild.load_checkpoint("ckpts")
//
// Long calls (train, evaluate, predict) run on a thread of their own while
// the calling thread waits with the GIL released, looking at Python's
// signals every 100 ms as Python's own blocking calls do. A KeyboardInterrupt
// (or any exception a signal handler raises) interrupts the run between
// steps (TrainRunOptions::interrupt); once the job is torn down, and its
// shared memory with it, the exception is raised.
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config/config.h"
#include "core/data/readers.h"
#include "core/io/safetensors.h"
#include "nlohmann/json.hpp"
#include "python/bindings.h"
#include "python/errors.h"
#include "workers/checkpoint.h"
#include "workers/evaluator.h"
#include "workers/job.h"
#include "workers/live_metrics.h"
#include "workers/metrics_server.h"
#include "workers/progress.h"
#include "workers/summary_json.h"
#include "workers/trainer.h"

namespace py = pybind11;
using nlohmann::json;

namespace shardwild::python {
namespace {

// ---- JSON <-> Python --------------------------------------------------------

py::object ToPython(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return py::none();
    case json::value_t::boolean: return py::bool_(j.get<bool>());
    case json::value_t::number_integer: return py::int_(j.get<int64_t>());
    case json::value_t::number_unsigned: return py::int_(j.get<uint64_t>());
    case json::value_t::number_float: return py::float_(j.get<double>());
    case json::value_t::string: return py::str(j.get_ref<const std::string&>());
    case json::value_t::array: {
      py::list l;
      for (const json& v : j) l.append(ToPython(v));
      return l;
    }
    case json::value_t::object: {
      py::dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d[py::str(it.key())] = ToPython(it.value());
      return d;
    }
    default: return py::none();
  }
}

// A Python value as JSON text (YAML reads JSON), through Python's json
// module. ConfigError naming `what` when it has no JSON form.
std::string ToJsonText(const py::handle& value, const std::string& what) {
  try {
    return py::module_::import("json").attr("dumps")(value).cast<std::string>();
  } catch (py::error_already_set& e) {
    Raise(absl::InvalidArgumentError(absl::StrCat(what, ": ", e.what())), ErrorKind::kConfig);
  }
}

// ---- Config -------------------------------------------------------------------

// A loaded, validated config and what it was loaded from (so that worker
// processes can load the same one).
struct PyConfig {
  std::string path;   // the YAML file; empty when it came from a dict
  std::string text;   // the YAML (or JSON) text
  std::string source; // names it in messages: the path, or "<dict>"
  std::vector<ConfigOverride> overrides;
  Config config;
};

std::vector<ConfigOverride> OverridesFrom(const py::object& overrides) {
  std::vector<ConfigOverride> out;
  if (overrides.is_none()) return out;
  if (!py::isinstance<py::dict>(overrides)) {
    Raise(absl::InvalidArgumentError(absl::StrCat("overrides: expected a dict of dotted keys to values, got ",
                                                  py::str(overrides.get_type().attr("__name__")).cast<std::string>())),
          ErrorKind::kConfig);
  }
  for (const auto& [key, value] : overrides.cast<py::dict>()) {
    if (!py::isinstance<py::str>(key)) {
      Raise(absl::InvalidArgumentError(absl::StrCat("overrides: keys are dotted config keys (str), got ",
                                                    py::repr(key).cast<std::string>())),
            ErrorKind::kConfig);
    }
    const std::string k = key.cast<std::string>();
    out.push_back(ConfigOverride{k, ToJsonText(value, absl::StrCat("overrides[", k, "]"))});
  }
  return out;
}

PyConfig LoadPyConfig(const py::object& source, const py::object& overrides) {
  PyConfig c;
  c.overrides = OverridesFrom(overrides);
  if (py::isinstance<py::dict>(source)) {
    c.source = "<dict>";
    c.text = ToJsonText(source, "config");
  } else if (py::isinstance<py::str>(source) || py::hasattr(source, "__fspath__")) {
    c.path = py::module_::import("os").attr("fspath")(source).cast<std::string>();
    c.source = c.path;
    std::ifstream in(c.path, std::ios::binary);
    if (!in) {
      Raise(absl::NotFoundError(absl::StrCat(c.path, ": cannot open config file: ", std::strerror(errno))),
            ErrorKind::kConfig);
    }
    c.text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } else {
    Raise(absl::InvalidArgumentError(absl::StrCat("config: expected a path or a dict, got ",
                                                  py::str(source.get_type().attr("__name__")).cast<std::string>())),
          ErrorKind::kConfig);
  }
  c.config = ValueOrThrow(LoadConfigFromString(c.text, c.source, c.overrides), ErrorKind::kConfig);
  return c;
}

// `cfg` as given to train/evaluate/predict: a Config, a path or a dict.
PyConfig AsConfig(const py::object& cfg) {
  if (py::isinstance<PyConfig>(cfg)) return cfg.cast<PyConfig>();
  return LoadPyConfig(cfg, py::none());
}

// ---- Running with the GIL released, interruptibly --------------------------------

// Runs `work` on a thread of its own and waits for it with the GIL released,
// looking at Python's signals every 100 ms. When a signal handler raises
// (KeyboardInterrupt), `interrupt` is set, `work` is left to wind down, and
// the exception is raised after it returns. Exceptions `work` throws are
// rethrown here.
template <typename F>
auto RunInterruptibly(const F& work, std::atomic<bool>* interrupt) -> decltype(work()) {
  using T = decltype(work());
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::optional<T> result;
  std::exception_ptr error;
  std::thread thread([&] {
    try {
      result.emplace(work());
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  });
  std::optional<py::error_already_set> raised;
  {
    py::gil_scoped_release release;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return done; })) break;
      }
      py::gil_scoped_acquire acquire;
      if (PyErr_CheckSignals() != 0) {
        if (!raised) {
          raised.emplace();  // takes the exception the handler raised
        } else {
          PyErr_Clear();  // a second interrupt while the first winds down
        }
        interrupt->store(true, std::memory_order_relaxed);
      }
    }
  }
  thread.join();
  if (raised) throw std::move(*raised);
  if (error) std::rethrow_exception(error);
  return *std::move(result);
}

// Progress lines through Python's sys.stdout (so a notebook shows them), a
// refreshing line when it is a terminal. Written from the job's thread,
// which takes the GIL for each piece.
ProgressReporter Reporter(bool verbose) {
  if (!verbose) return ProgressReporter::Silent();
  bool interactive = false;
  {
    py::gil_scoped_acquire acquire;
    try {
      interactive = py::module_::import("sys").attr("stdout").attr("isatty")().cast<bool>();
    } catch (py::error_already_set&) {
      interactive = false;  // a replaced sys.stdout without isatty()
    }
  }
  return ProgressReporter::ForSink(
      [](const std::string& text) {
        py::gil_scoped_acquire acquire;
        try {
          py::object out = py::module_::import("sys").attr("stdout");
          out.attr("write")(text);
          out.attr("flush")();
        } catch (py::error_already_set&) {
          // Progress output is best effort: a closed or odd sys.stdout must not stop training.
        }
      },
      interactive);
}

// The binary that train.worker_processes starts (`shardwild worker`).
std::string WorkerBinary() {
  if (const char* env = std::getenv("SHARDWILD_BINARY"); env != nullptr && *env != '\0') return env;
  return SHARDWILD_BINARY;
}

// A config written to a file for worker processes (when it came from a
// dict); removed when the run ends.
class TempConfigFile {
 public:
  explicit TempConfigFile(const std::string& text) {
    std::string pattern = (std::filesystem::temp_directory_path() / "shardwild-config-XXXXXX.yaml").string();
    const int fd = mkstemps(pattern.data(), 5);
    if (fd < 0) {
      Raise(absl::InternalError(absl::StrCat(pattern, ": cannot create the worker processes' config: ",
                                             std::strerror(errno))));
    }
    path_ = pattern;
    const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    close(fd);
    if (!ok) {
      std::remove(path_.c_str());
      Raise(absl::InternalError(absl::StrCat(path_, ": cannot write the worker processes' config")));
    }
  }
  ~TempConfigFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---- train ---------------------------------------------------------------------

// Calls every callback with the metrics; the first that returns False (the
// object False, not merely falsy) stops the run. An exception a callback
// raises is kept in `raised` and ends the run.
absl::StatusOr<bool> CallCallbacks(const py::list& callbacks, const json& metrics,
                                   std::optional<py::error_already_set>* raised) {
  py::gil_scoped_acquire acquire;
  bool go_on = true;
  try {
    const py::object record = ToPython(metrics);
    for (const py::handle& cb : callbacks) {
      const py::object r = cb(record);
      if (r.ptr() == Py_False) go_on = false;
    }
  } catch (py::error_already_set& e) {
    raised->emplace(std::move(e));
    return absl::CancelledError("a callback raised an exception");
  }
  return go_on;
}

py::object Train(const py::object& cfg_arg, const py::object& callbacks_arg, bool fresh, bool verbose) {
  const PyConfig cfg = AsConfig(cfg_arg);
  py::list callbacks;
  if (!callbacks_arg.is_none()) {
    for (const py::handle& cb : callbacks_arg) {
      if (!PyCallable_Check(cb.ptr())) {
        Raise(absl::InvalidArgumentError(absl::StrCat("callbacks: expected callables, got ",
                                                      py::repr(cb).cast<std::string>())),
              ErrorKind::kConfig);
      }
      callbacks.append(cb);
    }
  }
  // Worker processes load the same config: from its file, or from a copy of
  // the dict's text.
  std::unique_ptr<TempConfigFile> temp;
  std::string config_path = cfg.path;
  if (cfg.config.train.worker_processes && config_path.empty()) {
    temp = std::make_unique<TempConfigFile>(cfg.text);
    config_path = temp->path();
  }
  std::atomic<bool> interrupt{false};
  std::optional<py::error_already_set> callback_error;
  auto work = [&]() -> absl::StatusOr<json> {
    LiveMetrics live(MetricsRole::kChief);
    SW_ASSIGN_OR_RETURN(std::unique_ptr<MetricsServer> metrics_server,
                        ServeLiveMetrics(cfg.config.metrics, MetricsProcess::Chief(), live));
    SW_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Job::Create(cfg.config));
    ProgressReporter progress = Reporter(verbose);
    if (metrics_server) progress.Line(absl::StrCat("live metrics: http://", metrics_server->address(), "/metrics"));
    TrainRunOptions run;
    run.fresh = fresh;
    run.live_metrics = &live;
    run.interrupt = &interrupt;
    run.worker_command = {WorkerBinary(), "worker", config_path};
    for (const ConfigOverride& o : cfg.overrides) {
      run.worker_command.insert(run.worker_command.end(), {"--set", absl::StrCat(o.key, "=", o.value)});
    }
    if (!callbacks.empty()) {
      run.on_metrics = [&](const json& metrics) { return CallCallbacks(callbacks, metrics, &callback_error); };
    }
    SW_ASSIGN_OR_RETURN(TrainSummary s, RunTraining(*job, progress, run));
    return TrainSummaryJson(s, *job);
  };
  absl::StatusOr<json> summary = RunInterruptibly(work, &interrupt);
  if (callback_error) throw std::move(*callback_error);
  if (!summary.ok()) Raise(summary.status());
  return ToPython(*summary);
}

// ---- evaluate and predict ----------------------------------------------------------

CheckpointInfo Resolve(const std::string& checkpoint) {
  return ValueOrThrow(ResolveCheckpoint(checkpoint), ErrorKind::kCheckpoint);
}

py::object Evaluate(const py::object& cfg_arg, const std::string& checkpoint) {
  const PyConfig cfg = AsConfig(cfg_arg);
  const CheckpointInfo info = Resolve(checkpoint);
  std::atomic<bool> interrupt{false};
  auto work = [&]() -> absl::StatusOr<json> {
    SW_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Job::Create(cfg.config));
    const Dataset* data = job->test();
    if (data == nullptr) {
      return WithErrorKind(absl::InvalidArgumentError(absl::StrCat(cfg.source, ": data.test is empty: nothing to evaluate")),
                           ErrorKind::kConfig);
    }
    SW_ASSIGN_OR_RETURN(CheckpointEvaluation e, EvaluateCheckpoint(*job, info, *data));
    return EvaluationJson(e, *data);
  };
  absl::StatusOr<json> r = RunInterruptibly(work, &interrupt);
  if (!r.ok()) Raise(r.status());
  return ToPython(*r);
}

// `a` as a C-contiguous array of T (a view where it already is one, else a
// converted copy), or DataError naming `what`.
template <typename T>
py::array_t<T, py::array::c_style | py::array::forcecast> ArrayAs(const py::handle& a, const std::string& what) {
  auto arr = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
  if (!arr) {
    PyErr_Clear();
    Raise(absl::InvalidArgumentError(
              absl::StrCat(what, ": expected an array of ", std::is_integral_v<T> ? "integers" : "numbers")),
          ErrorKind::kData);
  }
  return arr;
}

[[noreturn]] void DataFail(const std::string& message) {
  Raise(absl::InvalidArgumentError(message), ErrorKind::kData);
}

// The records of NumPy inputs, read as a data file of the config would be:
// dense values raw as in the file (Fashion-MNIST pixels 0-255, scaled as the
// IDX reader scales them; Criteo/CSV counts through data.dense_transform),
// sparse fields as raw ids (the file's values; the model hashes them as it
// hashes a file's). `inputs` is an array of dense features ([n, features],
// or [n, rows, cols] of images), or a dict {"dense": array, FIELD: (ids,
// offsets) or {"ids", "offsets", "weights"}} with every sparse field of the
// training data.
Dataset DatasetFromArrays(const py::object& inputs, const Config& config, const Dataset& train) {
  Dataset d;
  py::object dense = py::none();
  py::dict fields;
  if (py::isinstance<py::dict>(inputs)) {
    for (const auto& [key, value] : inputs.cast<py::dict>()) {
      const std::string k = py::str(key).cast<std::string>();
      if (k == "dense") {
        dense = py::reinterpret_borrow<py::object>(value);
      } else {
        fields[key] = value;
      }
    }
  } else {
    dense = inputs;
  }
  d.count = -1;
  d.dense_dim = train.dense_dim;
  if (!dense.is_none()) {
    auto a = ArrayAs<float>(dense, "inputs[\"dense\"]");
    if (a.ndim() < 1) DataFail("inputs: dense features need one row per record");
    int64_t per_record = 1;
    for (py::ssize_t i = 1; i < a.ndim(); ++i) per_record *= a.shape(i);
    if (per_record != train.dense_dim) {
      DataFail(absl::StrCat("inputs: ", per_record, " dense features per record, the model takes ", train.dense_dim));
    }
    d.count = a.shape(0);
    d.dense.resize(static_cast<size_t>(d.count * per_record));
    const float* src = a.data();
    const bool images = config.data.format == DataFormat::kIdx;
    for (size_t i = 0; i < d.dense.size(); ++i) {
      d.dense[i] = images ? src[i] / 255.0f : ApplyDenseTransform(src[i], config.data.dense_transform);
    }
  } else if (train.dense_dim > 0) {
    DataFail(absl::StrCat("inputs: the model takes ", train.dense_dim, " dense features per record (inputs[\"dense\"])"));
  }
  for (const SparseField& tf : train.fields) {
    const py::str name(tf.name);
    if (!fields.contains(name)) DataFail(absl::StrCat("inputs: sparse field '", tf.name, "' is missing"));
    const py::object v = fields[name];
    py::object ids, offsets, weights = py::none();
    if (py::isinstance<py::dict>(v)) {
      const py::dict f = v.cast<py::dict>();
      for (const auto& [key, value] : f) {
        const std::string k = py::str(key).cast<std::string>();
        if (k != "ids" && k != "offsets" && k != "weights") {
          DataFail(absl::StrCat("inputs[\"", tf.name, "\"]: unknown key '", k, "' (expected ids, offsets, weights)"));
        }
      }
      if (!f.contains("ids") || !f.contains("offsets")) {
        DataFail(absl::StrCat("inputs[\"", tf.name, "\"]: needs \"ids\" and \"offsets\""));
      }
      ids = f["ids"];
      offsets = f["offsets"];
      if (f.contains("weights")) weights = f["weights"];
    } else if (py::isinstance<py::tuple>(v) && py::len(v) == 2) {
      ids = v.cast<py::tuple>()[0];
      offsets = v.cast<py::tuple>()[1];
    } else {
      DataFail(absl::StrCat("inputs[\"", tf.name, "\"]: expected (ids, offsets) or {\"ids\", \"offsets\", \"weights\"}"));
    }
    const std::string where = absl::StrCat("inputs[\"", tf.name, "\"]");
    auto id_arr = ArrayAs<int64_t>(ids, where + " ids");
    auto off_arr = ArrayAs<int64_t>(offsets, where + " offsets");
    if (id_arr.ndim() != 1 || off_arr.ndim() != 1 || off_arr.shape(0) < 1) {
      DataFail(where + ": ids and offsets must be 1-dimensional, offsets with one entry per record plus one");
    }
    const int64_t n = off_arr.shape(0) - 1;
    if (d.count >= 0 && n != d.count) {
      DataFail(absl::StrCat(where, ": offsets give ", n, " records, the other inputs ", d.count));
    }
    d.count = n;
    SparseField f;
    f.name = tf.name;
    f.offsets.assign(off_arr.data(), off_arr.data() + off_arr.shape(0));
    if (f.offsets.front() != 0 || f.offsets.back() != id_arr.shape(0)) {
      DataFail(absl::StrCat(where, ": offsets must start at 0 and end at len(ids) = ", id_arr.shape(0)));
    }
    for (size_t i = 1; i < f.offsets.size(); ++i) {
      if (f.offsets[i] < f.offsets[i - 1]) DataFail(absl::StrCat(where, ": offsets decrease at index ", i));
    }
    f.ids.resize(static_cast<size_t>(id_arr.shape(0)));
    for (size_t i = 0; i < f.ids.size(); ++i) {
      if (id_arr.data()[i] < 0) DataFail(absl::StrCat(where, ": id ", id_arr.data()[i], " at index ", i, " is negative"));
      f.ids[i] = static_cast<uint64_t>(id_arr.data()[i]);
    }
    if (!weights.is_none()) {
      auto w = ArrayAs<float>(weights, where + " weights");
      if (w.ndim() != 1 || w.shape(0) != id_arr.shape(0)) DataFail(where + ": weights need one value per id");
      f.weights.assign(w.data(), w.data() + w.shape(0));
    }
    d.fields.push_back(std::move(f));
    fields.attr("pop")(name);
  }
  if (py::len(fields) > 0) {
    DataFail(absl::StrCat("inputs: unknown sparse field '", py::str(fields.begin()->first).cast<std::string>(),
                          "' (the training data has ", train.fields.size(), " sparse fields)"));
  }
  if (d.count < 0) DataFail("inputs: no records");
  d.num_classes = train.num_classes;
  d.class_names = train.class_names;
  d.labels.assign(static_cast<size_t>(d.count), 0);
  return d;
}

py::object Predict(const py::object& cfg_arg, const std::string& checkpoint, const py::object& inputs) {
  const PyConfig cfg = AsConfig(cfg_arg);
  const CheckpointInfo info = Resolve(checkpoint);
  std::optional<std::string> path;
  if (py::isinstance<py::str>(inputs) || py::hasattr(inputs, "__fspath__")) {
    path = py::module_::import("os").attr("fspath")(inputs).cast<std::string>();
  }
  // The job loads the training data (class names, dense width, fields)
  // before the arrays can be checked against it.
  std::atomic<bool> interrupt{false};
  std::unique_ptr<Job> job =
      ValueOrThrow(RunInterruptibly([&] { return Job::Create(cfg.config); }, &interrupt));
  std::optional<Dataset> arrays;
  if (!path) arrays = DatasetFromArrays(inputs, cfg.config, job->train());
  struct Out {
    std::vector<float> probs;
    int64_t count = 0, k = 0;
  };
  auto work = [&]() -> absl::StatusOr<Out> {
    SW_RETURN_IF_ERROR(RestoreJob(*job, info));
    Dataset file_data;
    if (path) {
      SW_ASSIGN_OR_RETURN(file_data, cfg.config.data.format == DataFormat::kIdx
                                         ? LoadImagesForPrediction(*path, job->train().dense_dim)
                                         : LoadDataset(cfg.config, *path, 0, &job->train()));
    }
    const Dataset& data = path ? file_data : *arrays;
    SW_ASSIGN_OR_RETURN(std::vector<float> probs, PredictAll(*job, data));
    const int64_t k = job->worker(0).model().outputs();
    Out out{std::move(probs), data.count, k};
    job.reset();  // the store's shared memory goes before control returns to Python
    return out;
  };
  absl::StatusOr<Out> r = RunInterruptibly(work, &interrupt);
  if (!r.ok()) Raise(r.status());
  // softmax: [n, classes]; binary: [n] (the probability of label 1);
  // regression: [n].
  const bool softmax = cfg.config.model.head == HeadType::kSoftmax;
  std::vector<py::ssize_t> shape = softmax ? std::vector<py::ssize_t>{r->count, r->k} : std::vector<py::ssize_t>{r->count};
  py::array_t<float> result(shape);
  std::memcpy(result.mutable_data(), r->probs.data(), r->probs.size() * sizeof(float));
  return result;
}

// ---- load_checkpoint -----------------------------------------------------------------

py::array ArrayOf(const SafetensorsTensor& t) {
  std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
  py::dtype dtype;
  switch (t.dtype) {
    case SafetensorsDtype::kF32: dtype = py::dtype::of<float>(); break;
    case SafetensorsDtype::kF64: dtype = py::dtype::of<double>(); break;
    case SafetensorsDtype::kU64: dtype = py::dtype::of<uint64_t>(); break;
    case SafetensorsDtype::kI64: dtype = py::dtype::of<int64_t>(); break;
    case SafetensorsDtype::kU32: dtype = py::dtype::of<uint32_t>(); break;
    case SafetensorsDtype::kI32: dtype = py::dtype::of<int32_t>(); break;
    case SafetensorsDtype::kU16: dtype = py::dtype::of<uint16_t>(); break;
    case SafetensorsDtype::kU8: dtype = py::dtype::of<uint8_t>(); break;
    default:
      Raise(absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(t.name), "': dtype ",
                                                    SafetensorsDtypeName(t.dtype), " has no NumPy equivalent here")),
            ErrorKind::kCheckpoint);
  }
  py::array a(dtype, shape);
  std::memcpy(a.mutable_data(), t.data.data(), t.data.size());
  return a;
}

// Every tensor of a checkpoint: dense variables by name ("dense0/kernel"
// [rows, cols]) and their optimizer slots ("<var>/slot<k>"), and per
// embedding table "<table>/ids", "<table>/params", "<table>/slot<k>",
// "<table>/update_count"; and the manifest's body.
py::tuple LoadCheckpoint(const std::string& path) {
  const CheckpointInfo info = Resolve(path);
  if (info.kind == CheckpointKind::kState) {
    Raise(absl::FailedPreconditionError(absl::StrCat(
              info.path, ": a cluster chief's checkpoint holds no tensors (they are in the ps tasks' checkpoints ",
              "it names: ", info.params_info.dump(), ")")),
          ErrorKind::kCheckpoint);
  }
  py::dict tensors;
  const json& tables = info.manifest.at("partitioning").at("tables");
  for (const json& file : info.manifest.at("files")) {
    const std::string name = file.at("name").get<std::string>();
    const std::string file_path = (std::filesystem::path(info.path) / name).string();
    std::unique_ptr<SafetensorsReader> reader = ValueOrThrow(SafetensorsReader::Open(file_path), ErrorKind::kCheckpoint);
    std::string prefix;
    if (name.rfind("table-", 0) == 0) {
      const size_t t = std::stoul(name.substr(6));
      if (t >= tables.size()) {
        Raise(absl::FailedPreconditionError(absl::StrCat(file_path, ": table ", t, " is not in the manifest")),
              ErrorKind::kCheckpoint);
      }
      prefix = tables[t].at("name").get<std::string>() + "/";
    }
    for (const std::string& tensor : reader->names()) {
      const SafetensorsTensor t = ValueOrThrow(reader->Get(tensor), ErrorKind::kCheckpoint);
      tensors[py::str(prefix + tensor)] = ArrayOf(t);
    }
  }
  return py::make_tuple(tensors, ToPython(info.manifest));
}

}  // namespace

void RegisterJobs(py::module_& m) {
  py::class_<PyConfig>(m, "Config", "A loaded and validated config (load_config).")
      .def_property_readonly("path", [](const PyConfig& c) { return c.path.empty() ? py::object(py::none()) : py::str(c.path); },
                             "The YAML file it came from, or None for a dict.")
      .def_property_readonly("source", [](const PyConfig& c) { return c.source; },
                             "What error messages call it: the path, or \"<dict>\".")
      .def_property_readonly("text", [](const PyConfig& c) { return c.text; }, "The YAML (or JSON) text it was read from.")
      .def_property_readonly(
          "overrides",
          [](const PyConfig& c) {
            py::dict d;
            for (const ConfigOverride& o : c.overrides) d[py::str(o.key)] = py::str(o.value);
            return d;
          },
          "The overrides applied, as dotted keys to their YAML text.")
      .def(
          "with_overrides",
          [](const PyConfig& c, const py::object& overrides) {
            PyConfig n = c;
            for (ConfigOverride& o : OverridesFrom(overrides)) n.overrides.push_back(std::move(o));
            n.config = ValueOrThrow(LoadConfigFromString(n.text, n.source, n.overrides), ErrorKind::kConfig);
            return n;
          },
          py::arg("overrides"), "A copy with more overrides applied (later ones win).")
      .def("__repr__", [](const PyConfig& c) {
        return absl::StrCat("shardwild.Config(", c.source, c.overrides.empty() ? "" : ", with overrides", ")");
      });

  m.def(
      "load_config",
      [](const py::object& source, const py::object& overrides) { return LoadPyConfig(source, overrides); },
      py::arg("source"), py::arg("overrides") = py::none(),
      R"(Loads and validates a config, as `shardwild train CONFIG --set k=v` does.

source: a YAML file's path, or a dict of the same structure.
overrides: {"train.epochs": 2, "model.layers.1.units": 64, ...}: dotted keys
  (list items by index) to values, applied in order as --set is.
Raises ConfigError with the CLI's message (file:line:column: key: what was expected).)");

  m.def("train", &Train, py::arg("config"), py::arg("callbacks") = py::none(), py::arg("fresh") = false,
        py::arg("verbose") = true,
        R"(Trains as `shardwild train --json` does and returns its summary as a dict.

config: a Config, a path or a dict.
callbacks: callables, each called with a dict of metrics at every progress
  interval ({"event": "progress", "epoch", "step", "train_loss",
  "samples_per_s"}) and at the end of every epoch ({"event": "epoch", "epoch",
  "epochs", "step", "records", "train_loss", "train_accuracy", "seconds",
  "samples_per_s", and the test metrics when the epoch evaluated}). Returning
  False stops training as early stopping does (the summary's
  stopped_early_at_epoch says where); an exception a callback raises ends the
  run and is raised from train().
fresh: ignore checkpoint.dir's checkpoints (the CLI's --fresh).
verbose: print the progress lines, as the CLI does, through sys.stdout.
The GIL is released while training. A KeyboardInterrupt stops the run
between steps, removes its shared memory and is re-raised; the checkpoints
written so far are kept.)");

  m.def("evaluate", &Evaluate, py::arg("config"), py::arg("checkpoint"),
        R"(Evaluates a checkpoint (one ckpt-<step> directory, or a checkpoint.dir whose
newest good one is taken) on data.test, as `shardwild eval --json` does, and
returns its record: checkpoint, step, final, records, test_loss,
test_accuracy, the head's test metrics, rows_skipped.)");

  m.def("predict", &Predict, py::arg("config"), py::arg("checkpoint"), py::arg("inputs"),
        R"(Predictions of a checkpoint, as `shardwild predict` writes them, as an array:
[n, classes] class probabilities for a softmax head, [n] the probability of
label 1 for a binary head, [n] the value for regression.

inputs: a data file's path (IDX images, or a file in the config's data
  format), or NumPy arrays read as such a file would be: dense features raw as
  in the file (Fashion-MNIST pixels 0-255, [n, 784] or [n, 28, 28]; Criteo
  counts, transformed by data.dense_transform), or a dict {"dense": array,
  FIELD: (ids, offsets) or {"ids": ..., "offsets": ..., "weights": ...}} with
  every sparse field of the training data (ids raw, as in the file; offsets
  of length n + 1).)");

  m.def("load_checkpoint", &LoadCheckpoint, py::arg("path"),
        R"(Reads a checkpoint (one ckpt-<step> directory, or a checkpoint.dir whose newest
good one is taken), verified, into (tensors, manifest):

tensors: {name: ndarray}: every dense variable by name ("dense0/kernel"
  [in, out], "dense0/bias" [out, 1]) and its optimizer slots
  ("<var>/slot0", ...); per embedding table "<table>/ids", "<table>/params",
  "<table>/slot<k>", "<table>/update_count".
manifest: the manifest's body (step, epoch, model_version, optimizer,
  partitioning, data_cursor, extra, files).)");
}

}  // namespace shardwild::python
