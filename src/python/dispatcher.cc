// shardwild.Dispatcher: ElasticDL's master task queue (workers/dispatcher.h)
// for a training loop written in Python. It splits a dataset into tasks
// (record ranges), hands them to workers, re-queues the tasks of workers that
// fail, die or go silent, and counts records when a task is reported done, so
// the loop sees every record exactly once per epoch.
//
//   d = shardwild.Dispatcher(records=60000, records_per_task=1000, epochs=2, seed=1)
//   for task in d.tasks(worker=0):          # blocks while tasks in flight may come back
//       train(x[task.first_record:task.stop])
//   d.counters()["records_seen"]             # 120000
//
// or by hand: task = d.get_task(w) ... d.report_done(w, task) or
// d.report_failed(w, task, "why"); `with task:` reports it done, or failed
// with the exception's text. Workers are ids (ints >= 0); they may be Python
// threads of this process (the Dispatcher is thread-safe, and get_task waits
// without the GIL), or other processes whose requests this one relays.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "python/bindings.h"
#include "python/errors.h"
#include "workers/dispatcher.h"

namespace py = pybind11;

namespace shardwild::python {
namespace {

// get_task waits in slices this long, looking at Python's signals between
// them (as Python's own blocking calls do), so Ctrl-C interrupts it.
constexpr auto kWaitSlice = std::chrono::milliseconds(100);

class PyDispatcher;

// One hand-out of a task to a worker, with the means to report it.
struct PyTask {
  Task task;
  int worker = 0;
  bool anonymous_file = false;  // made from records=N: no file name
  bool reported = false;        // reported through this object (done, failed, with)
  py::object dispatcher;        // the PyDispatcher it came from (kept alive)
};

// The training files of a Dispatcher: records=N (one unnamed file) or
// files=[(name, records), ...] / {name: records}.
std::vector<DataFile> FilesOf(const char* key, const py::object& records, const py::object& files, bool* anonymous) {
  *anonymous = false;
  if (!records.is_none() && !files.is_none()) {
    throw py::value_error(absl::StrCat("Dispatcher: give either ", key, "records or ", key, "files, not both"));
  }
  std::vector<DataFile> out;
  if (!records.is_none()) {
    *anonymous = true;
    out.push_back(DataFile{"", records.cast<int64_t>()});
  } else if (!files.is_none()) {
    py::object items = py::isinstance<py::dict>(files) ? files.attr("items")() : files;
    for (const py::handle& item : items) {
      const auto pair = item.cast<std::pair<std::string, int64_t>>();
      if (pair.first.empty()) throw py::value_error(absl::StrCat("Dispatcher: ", key, "files: a file needs a name"));
      out.push_back(DataFile{pair.first, pair.second});
    }
  }
  for (const DataFile& f : out) {
    if (f.records < 0) {
      Raise(absl::InvalidArgumentError(absl::StrCat("Dispatcher: ", key, f.name.empty() ? "records" : "files",
                                                    f.name.empty() ? "" : absl::StrCat(" '", f.name, "'"),
                                                    " must be >= 0, got ", f.records)),
            ErrorKind::kConfig);
    }
  }
  return out;
}

class PyDispatcher {
 public:
  PyDispatcher(const py::object& records, const py::object& files, int64_t records_per_task, int epochs,
               uint64_t seed, double task_timeout_s, int max_task_retries, const py::object& eval_records,
               const py::object& eval_files, const py::object& predict_records, const py::object& predict_files) {
    DispatcherOptions options;
    options.records_per_task = records_per_task;
    options.epochs = epochs;
    options.seed = seed;
    options.task_timeout_s = task_timeout_s;
    options.max_task_retries = max_task_retries;
    std::vector<DataFile> train = FilesOf("", records, files, &anonymous_[0]);
    std::vector<DataFile> eval = FilesOf("eval_", eval_records, eval_files, &anonymous_[1]);
    std::vector<DataFile> predict = FilesOf("predict_", predict_records, predict_files, &anonymous_[2]);
    dispatcher_ = ValueOrThrow(Dispatcher::Create(options, std::move(train), std::move(eval), std::move(predict)),
                               ErrorKind::kConfig);
  }

  // A Task object for `a` (kTask), None for kEnd.
  py::object Hand(const py::object& self, int worker, const Assignment& a) {
    if (a.kind == Assignment::Kind::kEnd) return py::none();
    auto t = std::make_unique<PyTask>();
    t->task = a.task;
    t->worker = worker;
    t->anonymous_file = anonymous_[static_cast<int>(a.task.type)];
    t->dispatcher = self;
    return py::cast(std::move(t));
  }

  // GetTask, waiting while the answer is kWait: until `timeout_s` (None:
  // no limit) passes, then TimeoutError.
  py::object GetTask(const py::object& self, int worker, const py::object& timeout_s) {
    std::optional<std::chrono::steady_clock::time_point> deadline;
    if (!timeout_s.is_none()) {
      const double t = timeout_s.cast<double>();
      if (!(t >= 0) || !std::isfinite(t)) throw py::value_error(absl::StrCat("get_task: timeout must be >= 0, got ", t));
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(t));
    }
    while (true) {
      absl::StatusOr<Assignment> a;
      {
        py::gil_scoped_release release;
        auto until = std::chrono::steady_clock::now() + kWaitSlice;
        if (deadline && *deadline < until) until = *deadline;
        a = dispatcher_->WaitForTask(worker, until);
      }
      if (!a.ok()) Raise(a.status(), worker < 0 ? ErrorKind::kConfig : ErrorKind::kOther);
      if (a->kind != Assignment::Kind::kWait) return Hand(self, worker, *a);
      if (deadline && std::chrono::steady_clock::now() >= *deadline) {
        PyErr_SetString(PyExc_TimeoutError,
                        absl::StrCat("get_task: no task for worker ", worker, " within the timeout; tasks are still in flight")
                            .c_str());
        throw py::error_already_set();
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  py::object GetEvaluationTask(const py::object& self, int worker) {
    absl::StatusOr<Assignment> a = dispatcher_->GetEvaluationTask(worker);
    if (!a.ok()) Raise(a.status(), worker < 0 ? ErrorKind::kConfig : ErrorKind::kOther);
    if (a->kind != Assignment::Kind::kTask) return py::none();
    return Hand(self, worker, *a);
  }

  // The lease of `lease_or_task` (an int, or a Task, which is then marked reported).
  static uint64_t LeaseOf(const py::handle& lease_or_task, PyTask** task) {
    *task = nullptr;
    if (py::isinstance<PyTask>(lease_or_task)) {
      *task = &lease_or_task.cast<PyTask&>();
      return (*task)->task.lease;
    }
    return lease_or_task.cast<uint64_t>();
  }

  bool ReportDone(int worker, const py::handle& lease_or_task) {
    PyTask* task = nullptr;
    const uint64_t lease = LeaseOf(lease_or_task, &task);
    if (task != nullptr) task->reported = true;
    return dispatcher_->ReportDone(worker, lease) == ReportResult::kAccepted;
  }

  bool ReportFailed(int worker, const py::handle& lease_or_task, const std::string& message) {
    PyTask* task = nullptr;
    const uint64_t lease = LeaseOf(lease_or_task, &task);
    if (task != nullptr) task->reported = true;
    return dispatcher_->ReportFailed(worker, lease, absl::UnknownError(message)) == ReportResult::kAccepted;
  }

  void Heartbeat(int worker) { dispatcher_->Heartbeat(worker); }
  void WorkerDied(int worker) { dispatcher_->WorkerDied(worker); }
  int CheckTimeouts() { return dispatcher_->CheckTimeouts(); }
  int StartEvaluation(int64_t model_version) {
    return ValueOrThrow(dispatcher_->StartEvaluation(model_version), ErrorKind::kOther);
  }
  bool EvaluationDone(int round) const { return dispatcher_->EvaluationDone(round); }
  bool finished() const { return dispatcher_->finished(); }
  py::object error() const {
    const absl::Status s = dispatcher_->status();
    if (s.ok()) return py::none();
    return py::str(std::string(s.message()));
  }
  std::string Cursor() const { return dispatcher_->Cursor().ToJson(); }
  void Restore(const std::string& json) {
    const DataCursor cursor = ValueOrThrow(DataCursor::FromJson(json), ErrorKind::kConfig);
    ThrowIfError(dispatcher_->Restore(cursor), ErrorKind::kConfig);
  }

  py::dict Counters() const {
    const DispatcherCounters c = dispatcher_->counters();
    py::dict d;
    d["records_seen"] = c.records_seen;
    d["eval_records_seen"] = c.eval_records_seen;
    d["predict_records_seen"] = c.predict_records_seen;
    d["tasks_requeued"] = c.tasks_requeued;
    d["worker_failures"] = c.worker_failures;
    d["stale_reports"] = c.stale_reports;
    d["epoch"] = c.epoch;
    d["epochs_completed"] = c.epochs_completed;
    d["eval_rounds_started"] = c.eval_rounds_started;
    d["eval_rounds_completed"] = c.eval_rounds_completed;
    return d;
  }

 private:
  std::unique_ptr<Dispatcher> dispatcher_;
  bool anonymous_[3] = {false, false, false};  // by TaskType: its files came as records=N
};

// for task in dispatcher.tasks(worker): each task is reported done when the
// loop asks for the next one (unless it was reported already); a task in
// hand when the loop is left (break, an exception) is reported failed, so it
// is handed out again.
class TaskIterator {
 public:
  TaskIterator(py::object dispatcher, int worker, py::object timeout_s)
      : dispatcher_(std::move(dispatcher)), worker_(worker), timeout_s_(std::move(timeout_s)) {}
  TaskIterator(TaskIterator&&) = default;  // a moved-from iterator holds no task
  TaskIterator& operator=(TaskIterator&&) = delete;
  ~TaskIterator() {
    if (current_ && !current_.is_none()) {
      PyTask& t = current_.cast<PyTask&>();
      if (!t.reported) {
        dispatcher_.cast<PyDispatcher&>().ReportFailed(
            worker_, current_, "the worker's loop over its tasks was left before this task was done");
      }
    }
  }

  py::object Next() {
    PyDispatcher& d = dispatcher_.cast<PyDispatcher&>();
    if (current_ && !current_.is_none()) {
      if (!current_.cast<PyTask&>().reported) d.ReportDone(worker_, current_);
      current_ = py::none();
    }
    py::object next = d.GetTask(dispatcher_, worker_, timeout_s_);
    if (next.is_none()) throw py::stop_iteration();
    current_ = next;
    return next;
  }

 private:
  py::object dispatcher_;
  int worker_;
  py::object timeout_s_;
  py::object current_;  // the task in hand, or None
};

std::string TaskRepr(const PyTask& t) {
  const Task& k = t.task;
  std::string where = t.anonymous_file ? "" : absl::StrCat("file '", k.file, "', ");
  std::string which;
  if (k.type == TaskType::kTraining) which = absl::StrCat(", epoch ", k.epoch);
  if (k.type == TaskType::kEvaluation) which = absl::StrCat(", round ", k.round, ", model_version ", k.model_version);
  return absl::StrCat("<shardwild.Task ", TaskTypeName(k.type), " ", k.index, ": ", where, "records [",
                      k.first_record, ", ", k.first_record + k.records, ")", which, ", lease ", k.lease,
                      k.attempt > 0 ? absl::StrCat(", attempt ", k.attempt) : "", ">");
}

}  // namespace

void RegisterDispatcher(py::module_& m) {
  py::class_<PyTask>(m, "Task", R"doc(
One hand-out of a task: records [first_record, stop) of `file` (None for a
Dispatcher made from records=N). Report it once: task.done(),
task.failed(message), `with task:` (done, or failed with the exception's
text), or Dispatcher.report_done / report_failed with it or its lease.
)doc")
      .def_property_readonly("type", [](const PyTask& t) { return TaskTypeName(t.task.type); },
                             "training, evaluation or prediction")
      .def_property_readonly("file", [](const PyTask& t) -> py::object {
        if (t.anonymous_file) return py::none();
        return py::str(t.task.file);
      })
      .def_property_readonly("first_record", [](const PyTask& t) { return t.task.first_record; })
      .def_property_readonly("records", [](const PyTask& t) { return t.task.records; })
      .def_property_readonly("stop", [](const PyTask& t) { return t.task.first_record + t.task.records; },
                             "first_record + records")
      .def_property_readonly("index", [](const PyTask& t) { return t.task.index; },
                             "training: the task's id in its epoch; evaluation: in its round; prediction: its "
                             "position in input order")
      .def_property_readonly("epoch", [](const PyTask& t) { return t.task.epoch; }, "training: 1-based; else 0")
      .def_property_readonly("round", [](const PyTask& t) { return t.task.round; }, "evaluation: 1-based; else 0")
      .def_property_readonly("model_version", [](const PyTask& t) { return t.task.model_version; },
                             "evaluation: the version the round evaluates")
      .def_property_readonly("lease", [](const PyTask& t) { return t.task.lease; }, "quote it in the report")
      .def_property_readonly("attempt", [](const PyTask& t) { return t.task.attempt; }, "0, then +1 per re-queue")
      .def_property_readonly("worker", [](const PyTask& t) { return t.worker; })
      .def_property_readonly("reported", [](const PyTask& t) { return t.reported; })
      .def("done", [](py::object self) {
        PyTask& t = self.cast<PyTask&>();
        return t.dispatcher.cast<PyDispatcher&>().ReportDone(t.worker, self);
      }, "Reports the task done; False if the report was stale (the task was re-queued meanwhile).")
      .def("failed", [](py::object self, const std::string& message) {
        PyTask& t = self.cast<PyTask&>();
        return t.dispatcher.cast<PyDispatcher&>().ReportFailed(t.worker, self, message);
      }, py::arg("message") = "", "Reports the task failed: it goes back to the queue (or the job fails).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py::object self, const py::object& type, const py::object& value, const py::object&) {
        PyTask& t = self.cast<PyTask&>();
        if (t.reported) return false;
        PyDispatcher& d = t.dispatcher.cast<PyDispatcher&>();
        if (type.is_none()) {
          d.ReportDone(t.worker, self);
        } else {
          const std::string name = type.attr("__name__").cast<std::string>();
          const std::string text = py::str(value).cast<std::string>();
          d.ReportFailed(t.worker, self, text.empty() ? name : absl::StrCat(name, ": ", text));
        }
        return false;
      })
      .def("__repr__", [](const PyTask& t) { return TaskRepr(t); });

  py::class_<TaskIterator>(m, "TaskIterator")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &TaskIterator::Next);

  py::class_<PyDispatcher>(m, "Dispatcher", R"doc(
ElasticDL's master for a custom loop: tasks of at most records_per_task
records, shuffled per epoch (seed), handed to workers (int ids >= 0); a task
that is reported failed, whose worker died (worker_died) or was silent for
task_timeout_s goes back to the queue, up to max_task_retries times, after
which the job fails (get_task raises shardwild.Error naming the task).
Records count when a task is reported done, so counters()["records_seen"]
ends at epochs x records exactly. Evaluation tasks (eval_records /
eval_files, one round per start_evaluation) go first while a round is open;
prediction tasks (predict_*) come after training, in input order.
)doc")
      .def(py::init<const py::object&, const py::object&, int64_t, int, uint64_t, double, int, const py::object&,
                    const py::object&, const py::object&, const py::object&>(),
           py::arg("records") = py::none(), py::arg("files") = py::none(), py::kw_only(),
           py::arg("records_per_task") = 1024, py::arg("epochs") = 1, py::arg("seed") = 0,
           py::arg("task_timeout_s") = 600.0, py::arg("max_task_retries") = 3, py::arg("eval_records") = py::none(),
           py::arg("eval_files") = py::none(), py::arg("predict_records") = py::none(),
           py::arg("predict_files") = py::none(), R"doc(
records: the number of training records (one unnamed file), or files: a
list of (name, records) or a dict {name: records}. ConfigError for a bad
option (naming it).
)doc")
      .def("get_task", [](py::object self, int worker, const py::object& timeout) {
        return self.cast<PyDispatcher&>().GetTask(self, worker, timeout);
      }, py::arg("worker"), py::arg("timeout") = py::none(), R"doc(
The next task for `worker`, or None when all work is done. While nothing is
free but tasks in flight may come back, waits (without the GIL) for up to
`timeout` seconds (None: as long as it takes), then raises TimeoutError.
)doc")
      .def("get_evaluation_task", [](py::object self, int worker) {
        return self.cast<PyDispatcher&>().GetEvaluationTask(self, worker);
      }, py::arg("worker"), "An evaluation task of the open round, or None; never waits, never hands out training.")
      .def("tasks", [](py::object self, int worker, const py::object& timeout) {
        return TaskIterator(self, worker, timeout);
      }, py::arg("worker"), py::arg("timeout") = py::none(), R"doc(
Iterates over `worker`'s tasks (get_task until None). Each task is reported
done when the loop asks for the next one, unless it was reported already;
the task in hand when the loop is left early (break, an exception) is
reported failed, so it is handed out again.
)doc")
      .def("report_done", &PyDispatcher::ReportDone, py::arg("worker"), py::arg("lease"),
           "The task of `lease` (or a Task) is done: its records count. False if the report was stale.")
      .def("report_failed", &PyDispatcher::ReportFailed, py::arg("worker"), py::arg("lease"),
           py::arg("message") = "", "The task of `lease` (or a Task) failed: it is re-queued. False if stale.")
      .def("heartbeat", &PyDispatcher::Heartbeat, py::arg("worker"),
           "`worker` is alive: its tasks in flight get task_timeout_s from now.")
      .def("worker_died", &PyDispatcher::WorkerDied, py::arg("worker"),
           "`worker` is gone: its tasks go back to the queue and worker_failures grows by one.")
      .def("check_timeouts", &PyDispatcher::CheckTimeouts, "Re-queues the tasks whose time is up; returns how many.")
      .def("start_evaluation", &PyDispatcher::StartEvaluation, py::arg("model_version") = 0,
           "Opens an evaluation round over the eval files; returns its number.")
      .def("evaluation_done", &PyDispatcher::EvaluationDone, py::arg("round"))
      .def("counters", &PyDispatcher::Counters,
           "records_seen, eval_records_seen, predict_records_seen, tasks_requeued, worker_failures, stale_reports, "
           "epoch, epochs_completed, eval_rounds_started, eval_rounds_completed")
      .def_property_readonly("finished", &PyDispatcher::finished, "Whether all work is done.")
      .def_property_readonly("error", &PyDispatcher::error, "The error that stopped the job, or None.")
      .def("cursor", &PyDispatcher::Cursor, "Where training stands, as JSON (for a checkpoint).")
      .def("restore", &PyDispatcher::Restore, py::arg("cursor"),
           "Resumes from cursor() JSON, before any task has been handed out.");
}

}  // namespace shardwild::python
