#include "workers/dispatcher.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/base/random.h"
#include "core/base/status.h"

namespace shardwild {
namespace {


// How long a WaitForTask sleeps at most between timeout checks: the injected
// clock cannot wake a condition variable.
constexpr std::chrono::milliseconds kWaitSlice{100};

// Calls add(file, first_record, records) for the tasks of records
// [from, end) of `file`, records ascending, each of per_task records but the
// last (`from` on a task boundary). Every task list is cut by this one rule,
// so a grown file's tasks are the whole file's.
template <typename Add>
void CutTasks(int32_t file, int64_t from, int64_t end, int64_t per_task, Add add) {
  for (int64_t b = from; b < end; b += per_task) add(file, b, std::min(per_task, end - b));
}

// CutTasks for each of `files`, in file order; adds their records to *total.
template <typename Add>
void SplitFiles(const std::vector<DataFile>& files, int64_t per_task, int64_t* total, Add add) {
  for (size_t f = 0; f < files.size(); ++f) {
    *total += files[f].records;
    CutTasks(static_cast<int32_t>(f), 0, files[f].records, per_task, add);
  }
}

absl::Status CheckFiles(const std::vector<DataFile>& files, const char* what) {
  for (const DataFile& f : files) {
    if (f.records < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("dispatcher: ", what, " file \"", f.name, "\" has ", f.records, " records (expected >= 0)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* TaskTypeName(TaskType type) {
  switch (type) {
    case TaskType::kTraining:
      return "training";
    case TaskType::kEvaluation:
      return "evaluation";
    case TaskType::kPrediction:
      return "prediction";
  }
  return "unknown";
}

absl::Status DispatcherOptions::Validate() const {
  if (records_per_task < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.records_per_task must be >= 1 (got ", records_per_task, ")"));
  }
  if (!(task_timeout_s > 0) || !std::isfinite(task_timeout_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.task_timeout_s must be a finite number > 0 (got ", task_timeout_s, ")"));
  }
  if (max_task_retries < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.max_task_retries must be >= 0 (got ", max_task_retries, ")"));
  }
  if (epochs < 0) {
    return absl::InvalidArgumentError(absl::StrCat("train.epochs must be >= 0 (got ", epochs, ")"));
  }
  return absl::OkStatus();
}

// ---- DataCursor -------------------------------------------------------------

std::string DataCursor::ToJson() const {
  nlohmann::json j;
  j["epoch"] = epoch;
  j["rng_state"] = std::to_string(rng_state);
  j["num_tasks"] = num_tasks;
  j["records_per_task"] = records_per_task;
  j["done"] = done;
  if (growing) j["growing"] = true;
  return j.dump();
}

absl::StatusOr<DataCursor> DataCursor::FromJson(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("data cursor: not a JSON object");
  }
  auto integer = [&j](const char* key, int64_t* out) -> absl::Status {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat("data cursor: \"", key, "\" is missing or not an integer"));
    }
    *out = it->get<int64_t>();
    return absl::OkStatus();
  };
  DataCursor c;
  int64_t epoch = 0;
  SW_RETURN_IF_ERROR(integer("epoch", &epoch));
  if (epoch < 1 || epoch > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("data cursor: epoch ", epoch, " is out of range"));
  }
  c.epoch = static_cast<int>(epoch);
  SW_RETURN_IF_ERROR(integer("num_tasks", &c.num_tasks));
  SW_RETURN_IF_ERROR(integer("records_per_task", &c.records_per_task));
  const auto rng = j.find("rng_state");
  if (rng != j.end() && rng->is_string()) {
    if (!absl::SimpleAtoi(rng->get<std::string>(), &c.rng_state)) {
      return absl::InvalidArgumentError("data cursor: \"rng_state\" is not a 64-bit unsigned integer");
    }
  } else if (rng != j.end() && rng->is_number_unsigned()) {
    c.rng_state = rng->get<uint64_t>();
  } else {
    return absl::InvalidArgumentError("data cursor: \"rng_state\" is missing or not an unsigned integer string");
  }
  const auto done = j.find("done");
  if (done == j.end() || !done->is_array()) {
    return absl::InvalidArgumentError("data cursor: \"done\" is missing or not an array");
  }
  for (const nlohmann::json& id : *done) {
    if (!id.is_number_integer()) return absl::InvalidArgumentError("data cursor: \"done\" holds a non-integer");
    c.done.push_back(id.get<int64_t>());
  }
  const auto growing = j.find("growing");
  if (growing != j.end()) {
    if (!growing->is_boolean()) return absl::InvalidArgumentError("data cursor: \"growing\" is not a boolean");
    c.growing = growing->get<bool>();
  }
  return c;
}

// ---- Dispatcher -------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Dispatcher>> Dispatcher::Create(const DispatcherOptions& options,
                                                               std::vector<DataFile> training,
                                                               std::vector<DataFile> evaluation,
                                                               std::vector<DataFile> prediction, Clock clock) {
  SW_RETURN_IF_ERROR(options.Validate());
  SW_RETURN_IF_ERROR(CheckFiles(training, "training"));
  SW_RETURN_IF_ERROR(CheckFiles(evaluation, "evaluation"));
  SW_RETURN_IF_ERROR(CheckFiles(prediction, "prediction"));
  if (options.growing && training.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dispatcher: growing training data is one file (got ", training.size(), ")"));
  }
  if (!clock) clock = [] { return absl::Now(); };
  return std::unique_ptr<Dispatcher>(new Dispatcher(options, std::move(training), std::move(evaluation),
                                                    std::move(prediction), std::move(clock)));
}

Dispatcher::Dispatcher(const DispatcherOptions& options, std::vector<DataFile> training,
                       std::vector<DataFile> evaluation, std::vector<DataFile> prediction, Clock clock)
    : options_(options),
      train_files_(std::move(training)),
      eval_files_(std::move(evaluation)),
      predict_files_(std::move(prediction)),
      clock_(std::move(clock)) {
  const int64_t per = options_.records_per_task;
  int64_t predict_records = 0;
  if (!options_.growing) {
    SplitFiles(train_files_, per, &train_records_,
               [this](int32_t f, int64_t b, int64_t n) { train_specs_.push_back(TaskSpec{f, b, n}); });
  }
  SplitFiles(eval_files_, per, &eval_records_,
             [this](int32_t f, int64_t b, int64_t n) { eval_specs_.push_back(TaskSpec{f, b, n}); });
  SplitFiles(predict_files_, per, &predict_records,
             [this](int32_t f, int64_t b, int64_t n) { predict_specs_.push_back(TaskSpec{f, b, n}); });

  MutexLock lock(&mu_);
  rng_ = options_.seed;
  epoch_ = 1;
  counters_.epoch = 1;
  if (options_.growing) {
    growing_ = true;
    grow_rng_ = options_.seed ^ 0x6a09e667f3bcc909ULL;
    epoch_rng_ = rng_;  // epoch 2 shuffles as an ungrown epoch 1 would have
    if (options_.epochs == 0) {
      training_done_ = true;
      counters_.epochs_completed = 0;
    }
    readable_ = train_files_[0].records;
    GrowLocked(readable_ / per * per);
  } else if (options_.epochs == 0 || train_specs_.empty()) {
    // Nothing to train: every epoch (if any) is complete at once.
    training_done_ = true;
    epoch_ = std::max(1, options_.epochs);
    epoch_rng_ = rng_;
    counters_.epoch = epoch_;
    counters_.epochs_completed = options_.epochs;
  } else {
    StartEpochLocked(std::vector<char>(train_specs_.size(), 0));
  }
  for (size_t i = 0; i < predict_specs_.size(); ++i) {
    Pending p;
    p.type = TaskType::kPrediction;
    p.id = static_cast<int64_t>(i);
    predict_todo_.push_back(std::move(p));
  }
  predict_left_ = static_cast<int64_t>(predict_specs_.size());
}

const Dispatcher::TaskSpec& Dispatcher::SpecOf(const Pending& task) const {
  switch (task.type) {
    case TaskType::kTraining:
      return train_specs_[task.id];
    case TaskType::kEvaluation:
      return eval_specs_[task.id];
    case TaskType::kPrediction:
      break;
  }
  return predict_specs_[task.id];
}

const std::string& Dispatcher::FileOf(const Pending& task) const {
  const int32_t f = SpecOf(task).file;
  switch (task.type) {
    case TaskType::kTraining:
      return train_files_[f].name;
    case TaskType::kEvaluation:
      return eval_files_[f].name;
    case TaskType::kPrediction:
      break;
  }
  return predict_files_[f].name;
}

std::string Dispatcher::Describe(const Pending& task) const {
  const TaskSpec& spec = SpecOf(task);
  std::string s = absl::StrCat(TaskTypeName(task.type), " task ", task.id, " (file \"", FileOf(task), "\", records ",
                               spec.first_record, "-", spec.first_record + spec.records - 1);
  if (task.type == TaskType::kTraining) absl::StrAppend(&s, ", epoch ", task.epoch);
  if (task.type == TaskType::kEvaluation) absl::StrAppend(&s, ", evaluation round ", task.round);
  s += ")";
  return s;
}

void Dispatcher::WakeAllLocked() {
  ++wake_generation_;
  changed_.SignalAll();
}

void Dispatcher::TouchLocked(int worker) { workers_[worker].dead = false; }

void Dispatcher::StartEpochLocked(const std::vector<char>& done) {
  const int64_t n = static_cast<int64_t>(train_specs_.size());
  epoch_rng_ = rng_;
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(SplitMix64(rng_) % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  epoch_done_ = done;
  train_todo_.clear();
  for (int64_t id : order) {
    if (done[id]) continue;
    Pending p;
    p.type = TaskType::kTraining;
    p.id = id;
    p.epoch = epoch_;
    train_todo_.push_back(std::move(p));
  }
  counters_.epoch = epoch_;
}

void Dispatcher::AdvanceLocked() {
  if (!job_error_.ok()) return;
  bool changed = false;
  if (round_open_ && round_left_ == 0) {
    round_open_ = false;
    ++counters_.eval_rounds_completed;
    changed = true;
  }
  // An epoch is complete when nothing of it is in todo or doing: every task
  // of it was reported done (a task out of retries fails the job instead),
  // and its data has stopped growing.
  while (!training_done_ && !growing_ && train_todo_.empty() && train_doing_ == 0) {
    ++counters_.epochs_completed;
    changed = true;
    if (epoch_ >= options_.epochs) {
      training_done_ = true;
      break;
    }
    ++epoch_;
    StartEpochLocked(std::vector<char>(train_specs_.size(), 0));
  }
  if (changed) WakeAllLocked();
}

bool Dispatcher::FinishedLocked() const {
  return job_error_.ok() && training_done_ && !round_open_ && predict_left_ == 0;
}

void Dispatcher::RequeueLocked(Pending task, const absl::Status& why) {
  task.last_code = why.ok() ? absl::StatusCode::kUnknown : why.code();
  task.last_error = why.ok() ? std::string("failed without a message") : std::string(why.message());
  ++task.attempt;
  if (task.attempt > options_.max_task_retries) {
    if (job_error_.ok()) {
      job_error_ = absl::Status(task.last_code,
                                absl::StrCat(Describe(task), " failed ", task.attempt,
                                             " times, more than train.max_task_retries (", options_.max_task_retries,
                                             "); last error: ", task.last_error));
    }
  } else {
    ++counters_.tasks_requeued;
    switch (task.type) {
      case TaskType::kTraining:
        train_todo_.push_front(std::move(task));
        break;
      case TaskType::kEvaluation:
        eval_todo_.push_front(std::move(task));
        break;
      case TaskType::kPrediction:
        predict_todo_.push_front(std::move(task));
        break;
    }
  }
  WakeAllLocked();
}

int Dispatcher::CheckTimeoutsLocked() {
  if (doing_.empty()) return 0;
  const absl::Time now = clock_();
  const absl::Duration timeout = absl::Seconds(options_.task_timeout_s);
  int requeued = 0;
  for (auto it = doing_.begin(); it != doing_.end() && job_error_.ok();) {
    const int worker = it->second.worker;
    const absl::Duration silent = now - std::max(it->second.handed_out, workers_[worker].last_heartbeat);
    if (silent <= timeout) {
      ++it;
      continue;
    }
    Pending task = std::move(it->second.task);
    it = doing_.erase(it);
    if (task.type == TaskType::kTraining) --train_doing_;
    RequeueLocked(std::move(task),
                  absl::DeadlineExceededError(absl::StrCat("worker ", worker, " sent no report or heartbeat for ",
                                                           absl::FormatDuration(silent), " (train.task_timeout_s is ",
                                                           options_.task_timeout_s, ")")));
    ++requeued;
  }
  return requeued;
}

bool Dispatcher::TakeLeaseLocked(int worker, uint64_t lease, Pending* task) {
  const auto it = doing_.find(lease);
  if (it == doing_.end() || it->second.worker != worker) {
    ++counters_.stale_reports;
    return false;
  }
  *task = std::move(it->second.task);
  doing_.erase(it);
  if (task->type == TaskType::kTraining) --train_doing_;
  return true;
}

Assignment Dispatcher::NextLocked(int worker, bool evaluation_only) {
  std::deque<Pending>* queue = nullptr;
  if (!eval_todo_.empty()) {
    queue = &eval_todo_;
  } else if (evaluation_only) {
    return Assignment{};  // kWait
  } else if (!train_todo_.empty()) {
    queue = &train_todo_;
  } else if (!predict_todo_.empty()) {
    queue = &predict_todo_;
  }
  Assignment a;
  if (queue == nullptr) {
    a.kind = FinishedLocked() ? Assignment::Kind::kEnd : Assignment::Kind::kWait;
    return a;
  }
  Pending p = std::move(queue->front());
  queue->pop_front();
  const TaskSpec& spec = SpecOf(p);
  a.kind = Assignment::Kind::kTask;
  Task& t = a.task;
  t.type = p.type;
  t.file = FileOf(p);
  t.first_record = spec.first_record;
  t.records = spec.records;
  t.index = p.id;
  t.epoch = p.epoch;
  t.round = p.round;
  t.model_version = p.type == TaskType::kEvaluation ? round_version_ : 0;
  t.lease = next_lease_++;
  t.attempt = p.attempt;
  if (p.type == TaskType::kTraining) ++train_doing_;
  doing_.emplace(t.lease, Doing{std::move(p), worker, clock_()});
  handed_out_ = true;
  return a;
}

absl::StatusOr<Assignment> Dispatcher::Take(int worker, bool evaluation_only) {
  if (worker < 0) return absl::InvalidArgumentError(absl::StrCat("dispatcher: worker ", worker, " is negative"));
  MutexLock lock(&mu_);
  TouchLocked(worker);
  CheckTimeoutsLocked();
  if (!job_error_.ok()) return job_error_;
  AdvanceLocked();
  return NextLocked(worker, evaluation_only);
}

absl::StatusOr<Assignment> Dispatcher::GetTask(int worker) { return Take(worker, /*evaluation_only=*/false); }

absl::StatusOr<Assignment> Dispatcher::GetEvaluationTask(int worker) { return Take(worker, /*evaluation_only=*/true); }

absl::StatusOr<Assignment> Dispatcher::WaitForTask(int worker, std::chrono::steady_clock::time_point deadline) {
  if (worker < 0) return absl::InvalidArgumentError(absl::StrCat("dispatcher: worker ", worker, " is negative"));
  MutexLock lock(&mu_);
  while (true) {
    TouchLocked(worker);
    CheckTimeoutsLocked();
    if (!job_error_.ok()) return job_error_;
    AdvanceLocked();
    Assignment a = NextLocked(worker);
    const auto now = std::chrono::steady_clock::now();
    if (a.kind != Assignment::Kind::kWait || now >= deadline) return a;
    const uint64_t generation = wake_generation_;
    const auto slice = std::min<std::chrono::steady_clock::duration>(deadline - now, kWaitSlice);
    changed_.WaitFor(&mu_, slice,
                     [this, generation]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return wake_generation_ != generation; });
  }
}

ReportResult Dispatcher::ReportDone(int worker, uint64_t lease) {
  MutexLock lock(&mu_);
  if (worker >= 0) TouchLocked(worker);
  Pending task;
  if (!TakeLeaseLocked(worker, lease, &task)) return ReportResult::kStale;
  const int64_t records = SpecOf(task).records;
  switch (task.type) {
    case TaskType::kTraining:
      epoch_done_[task.id] = 1;
      counters_.records_seen += records;
      break;
    case TaskType::kEvaluation:
      --round_left_;
      counters_.eval_records_seen += records;
      break;
    case TaskType::kPrediction:
      --predict_left_;
      counters_.predict_records_seen += records;
      if (predict_left_ == 0) WakeAllLocked();
      break;
  }
  AdvanceLocked();
  return ReportResult::kAccepted;
}

ReportResult Dispatcher::ReportFailed(int worker, uint64_t lease, const absl::Status& error) {
  MutexLock lock(&mu_);
  if (worker >= 0) TouchLocked(worker);
  Pending task;
  if (!TakeLeaseLocked(worker, lease, &task)) return ReportResult::kStale;
  RequeueLocked(std::move(task), error);
  return ReportResult::kAccepted;
}

void Dispatcher::Heartbeat(int worker) {
  MutexLock lock(&mu_);
  TouchLocked(worker);
  workers_[worker].last_heartbeat = clock_();
}

void Dispatcher::WorkerDied(int worker) {
  MutexLock lock(&mu_);
  WorkerState& w = workers_[worker];
  if (w.dead) return;
  w.dead = true;
  ++counters_.worker_failures;
  // Re-queue in lease order (doing_ is ordered), so the outcome is the same
  // on every run.
  for (auto it = doing_.begin(); it != doing_.end();) {
    if (it->second.worker != worker) {
      ++it;
      continue;
    }
    Pending task = std::move(it->second.task);
    it = doing_.erase(it);
    if (task.type == TaskType::kTraining) --train_doing_;
    RequeueLocked(std::move(task), absl::UnavailableError(absl::StrCat("worker ", worker, " died")));
  }
  WakeAllLocked();
}

int Dispatcher::CheckTimeouts() {
  MutexLock lock(&mu_);
  return CheckTimeoutsLocked();
}

absl::StatusOr<int> Dispatcher::StartEvaluation(int64_t model_version) {
  MutexLock lock(&mu_);
  if (!job_error_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("evaluation: the job has failed: ", job_error_.message()));
  }
  if (eval_specs_.empty()) return absl::FailedPreconditionError("evaluation: there are no evaluation records");
  if (round_open_) {
    return absl::FailedPreconditionError(
        absl::StrCat("evaluation: round ", round_, " (model version ", round_version_, ") is still open"));
  }
  ++round_;
  round_open_ = true;
  round_version_ = model_version;
  round_left_ = static_cast<int64_t>(eval_specs_.size());
  for (size_t i = 0; i < eval_specs_.size(); ++i) {
    Pending p;
    p.type = TaskType::kEvaluation;
    p.id = static_cast<int64_t>(i);
    p.round = round_;
    eval_todo_.push_back(std::move(p));
  }
  ++counters_.eval_rounds_started;
  WakeAllLocked();
  return round_;
}

bool Dispatcher::EvaluationDone(int round) const {
  MutexLock lock(&mu_);
  return round >= 1 && (round < round_ || (round == round_ && !round_open_));
}

void Dispatcher::GrowLocked(int64_t end) {
  CutTasks(0, grown_, end, options_.records_per_task, [this](int32_t f, int64_t b, int64_t n) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // (mu_ is held)
    const int64_t id = static_cast<int64_t>(train_specs_.size());
    train_specs_.push_back(TaskSpec{f, b, n});
    epoch_done_.push_back(0);
    if (training_done_ || epoch_ != 1) return;
    Pending p;
    p.type = TaskType::kTraining;
    p.id = id;
    p.epoch = 1;
    train_todo_.push_back(std::move(p));
    const size_t j = static_cast<size_t>(SplitMix64(grow_rng_) % train_todo_.size());
    std::swap(train_todo_[j], train_todo_.back());
  });
  grown_ = std::max(grown_, end);
  train_records_ = grown_;
  train_files_[0].records = grown_;
}

absl::Status Dispatcher::GrowTraining(int64_t records, bool final) {
  MutexLock lock(&mu_);
  if (!growing_) return absl::FailedPreconditionError("dispatcher: the training data is not growing");
  if (records < readable_) {
    return absl::InvalidArgumentError(
        absl::StrCat("dispatcher: the training data shrank from ", readable_, " to ", records, " records"));
  }
  readable_ = records;
  const int64_t per = options_.records_per_task;
  GrowLocked(final ? records : records / per * per);
  if (final) {
    growing_ = false;
    AdvanceLocked();
  }
  WakeAllLocked();
  return absl::OkStatus();
}

bool Dispatcher::growing() const {
  MutexLock lock(&mu_);
  return growing_;
}

DataCursor Dispatcher::Cursor() const {
  MutexLock lock(&mu_);
  DataCursor c;
  c.growing = growing_;
  c.epoch = epoch_;
  c.rng_state = epoch_rng_;
  c.num_tasks = static_cast<int64_t>(train_specs_.size());
  c.records_per_task = options_.records_per_task;
  for (size_t i = 0; i < epoch_done_.size(); ++i) {
    if (epoch_done_[i]) c.done.push_back(static_cast<int64_t>(i));
  }
  return c;
}

absl::Status Dispatcher::Restore(const DataCursor& cursor) {
  MutexLock lock(&mu_);
  if (growing_) return absl::FailedPreconditionError("data cursor: Restore while the training data is growing");
  const int64_t n = static_cast<int64_t>(train_specs_.size());
  if (cursor.growing && cursor.epoch != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data cursor: taken while the data grew, but in epoch ", cursor.epoch, " (expected 1)"));
  }
  if ((cursor.growing ? cursor.num_tasks > n : cursor.num_tasks != n) ||
      cursor.records_per_task != options_.records_per_task) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data cursor: it is for ", cursor.num_tasks, " tasks of up to ", cursor.records_per_task,
        " records (data.records_per_task); this dataset has ", n, " tasks of up to ", options_.records_per_task));
  }
  const int last_epoch = std::max(1, options_.epochs);
  if (cursor.epoch < 1 || cursor.epoch > last_epoch) {
    return absl::InvalidArgumentError(
        absl::StrCat("data cursor: epoch ", cursor.epoch, " is not in [1, ", last_epoch, "] (train.epochs)"));
  }
  std::vector<char> done(n, 0);
  int64_t done_records = 0;
  for (int64_t id : cursor.done) {
    if (id < 0 || id >= n || done[id]) {
      return absl::InvalidArgumentError(
          absl::StrCat("data cursor: done task id ", id, " is out of range [0, ", n, ") or repeated"));
    }
    done[id] = 1;
    done_records += train_specs_[id].records;
  }
  if (handed_out_) return absl::FailedPreconditionError("data cursor: Restore after tasks were handed out");
  if (options_.epochs == 0 || n == 0) return absl::OkStatus();  // nothing to train
  epoch_ = cursor.epoch;
  rng_ = cursor.rng_state;
  training_done_ = false;
  counters_.epochs_completed = epoch_ - 1;
  counters_.records_seen = static_cast<int64_t>(epoch_ - 1) * train_records_ + done_records;
  StartEpochLocked(done);
  AdvanceLocked();
  WakeAllLocked();
  return absl::OkStatus();
}

DispatcherCounters Dispatcher::counters() const {
  MutexLock lock(&mu_);
  return counters_;
}

absl::Status Dispatcher::status() const {
  MutexLock lock(&mu_);
  return job_error_;
}

bool Dispatcher::finished() const {
  MutexLock lock(&mu_);
  return FinishedLocked();
}

}  // namespace shardwild
