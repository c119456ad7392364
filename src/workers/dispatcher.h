// Dispatcher: ElasticDL's master task queue.
//
// Every dataset is split into tasks: a file, its first record and a record
// count, at most `records_per_task` records each (a file with 0 records gives
// no tasks). Workers take tasks (GetTask / WaitForTask) and report each one
// done or failed; the dispatcher keeps a todo queue and a doing table.
//
// Task types, in the order GetTask hands them out:
//   - evaluation: one round over the eval files, opened by StartEvaluation
//     and tagged with the model version it evaluates. While a round is open,
//     its tasks go first, so evaluation can interleave with training.
//   - training: one set of tasks per epoch, in a shuffled order. The next
//     epoch's tasks are created only when the current epoch's todo queue and
//     doing table are both empty, so epochs never overlap: no worker trains on
//     epoch e+1 while a task of epoch e may still come back.
//   - prediction: tasks in input order, each carrying its index, so the
//     caller can write results in input order.
//
// Exactly once. Every hand-out gets a fresh lease id (unique over the
// dispatcher's life). A task leaves the doing table when it is reported done
// or failed, when its worker is declared dead (WorkerDied), or when its
// worker has been silent for longer than task_timeout_s (CheckTimeouts). A
// failed, orphaned or timed-out task goes back to the front of its todo
// queue with a new lease to come, up to max_task_retries times; one more
// failure stops the job with an error naming the task (file, records, epoch
// or round) and its last error. A report quoting a lease that is no longer in
// the doing table (re-queued, already reported, or never issued) or that
// belongs to another worker is stale: it is ignored and counted. Records are
// counted when a task is reported done, so training sees every record exactly
// once per epoch (records_seen == epochs x records), and every evaluation
// round sees every eval record exactly once, even when workers die.
//
// Shuffle. The training order is a Fisher-Yates shuffle of the epoch's task
// list (files in the given order, records ascending) driven by SplitMix64
// (Steele, Lea and Flood 2014; state += 0x9e3779b97f4a7c15, then the
// 30/27/31 xor-shift-multiply finaliser); the index for slot i is
// next() % (i + 1), i from n-1 down to 1 (the modulo bias, below 2^-40 for
// fewer than 2^24 tasks, is accepted for a fixed, library-independent
// algorithm). The generator starts at `seed` and runs on across epochs, so
// each epoch has its own order and the same seed always gives the same
// sequence of orders. DataCursor keeps the state at the start of the current
// epoch, so a restored job regenerates the same order.
//
// Liveness. A task times out when more than task_timeout_s has passed since
// it was handed out or since its worker's last Heartbeat, whichever is later;
// a worker running a task longer than that must heartbeat. (Asking for or
// reporting other tasks does not keep a task alive, so a task a worker lost
// track of still comes back.) Time comes from an injectable clock (absl::Now
// by default), so tests don't sleep. Timeouts are checked by CheckTimeouts
// and also at each GetTask / WaitForTask, so no monitor thread is needed
// while workers keep asking for work.
//
// Thread safety: every method may be called concurrently from any thread.
// One mutex guards all state; the clock is called with it held (it must not
// call back into the dispatcher).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/base/mutex.h"

namespace shardwild {

struct DispatcherOptions {
  // data.records_per_task: the most records one task holds; >= 1.
  int64_t records_per_task = 1024;
  // train.task_timeout_s: a worker silent for longer than this loses its
  // tasks (they are re-queued); > 0 and finite.
  double task_timeout_s = 600;
  // train.max_task_retries: how often one task may be re-queued (after a
  // failure, a timeout or its worker's death) before the job fails; >= 0.
  int max_task_retries = 3;
  // train.epochs: training epochs; >= 0 (0: no training tasks).
  int epochs = 1;
  // train.seed: seeds the per-epoch shuffle.
  uint64_t seed = 0;
  // The training data is still being read (a streamed set whose cache is
  // being built, ColumnCache::Begin): the one training file's record count
  // given to Create is what is readable so far, GrowTraining adds records
  // as they become readable, and epoch 1 ends only after GrowTraining's
  // final call. Needs exactly one training file.
  bool growing = false;

  // OK, or InvalidArgument naming the first bad key.
  absl::Status Validate() const;
};

// One input file and how many records it holds.
struct DataFile {
  std::string name;
  int64_t records = 0;  // >= 0
};

enum class TaskType { kTraining, kEvaluation, kPrediction };
const char* TaskTypeName(TaskType type);

// One hand-out of a task to a worker.
struct Task {
  TaskType type = TaskType::kTraining;
  std::string file;
  int64_t first_record = 0;  // in `file`, 0-based
  int64_t records = 0;       // >= 1
  // Training: the task's id within the epoch (position in the unshuffled
  // list). Evaluation: its id within the round. Prediction: its position in
  // input order (0, 1, ...), for writing results in order.
  int64_t index = 0;
  int epoch = 0;              // training: 1-based epoch; else 0
  int round = 0;              // evaluation: 1-based round; else 0
  int64_t model_version = 0;  // evaluation: the version it evaluates; else 0
  uint64_t lease = 0;         // quote it in the report; >= 1
  int attempt = 0;            // 0 on the first hand-out, +1 per re-queue
};

// What GetTask / WaitForTask hand a worker (errors travel as the status).
struct Assignment {
  enum class Kind {
    kTask,  // `task` is the worker's; report it with task.lease
    kWait,  // nothing to hand out now, but tasks in flight may come back
    kEnd,   // the job is finished: every task is done
  };
  Kind kind = Kind::kWait;
  Task task;  // meaningful for kTask only
};

enum class ReportResult {
  kAccepted,  // the lease was current; the task left the doing table
  kStale,     // ignored (re-queued, already reported, or not this worker's)
};

// Counters over the dispatcher's life (after Restore, records_seen
// includes the epochs and tasks the cursor counts as done).
struct DispatcherCounters {
  int64_t records_seen = 0;       // training records in tasks reported done
  int64_t eval_records_seen = 0;  // evaluation records, over all rounds
  int64_t predict_records_seen = 0;
  int64_t tasks_requeued = 0;     // failures, timeouts and deaths re-queued
  int64_t worker_failures = 0;    // WorkerDied calls for live workers
  int64_t stale_reports = 0;      // reports ignored because of their lease
  int epoch = 0;                  // current training epoch (1-based)
  int epochs_completed = 0;
  int eval_rounds_started = 0;
  int eval_rounds_completed = 0;
};

// Where training stands, for checkpoints: the current epoch, the shuffle
// state at its start, and which of its tasks are done. Tasks in flight count
// as not done (they are handed out again after Restore). An open evaluation
// round and prediction progress are not part of the cursor.
struct DataCursor {
  int epoch = 1;                 // 1-based
  uint64_t rng_state = 0;        // SplitMix64 state before this epoch's shuffle
  int64_t num_tasks = 0;         // tasks per epoch, checked by Restore
  int64_t records_per_task = 0;  // checked by Restore
  std::vector<int64_t> done;     // task ids (Task::index) done this epoch, ascending
  // Taken while the training data was still growing (epoch 1): num_tasks
  // is the tasks known then, a prefix of the final list (ids are the same).
  bool growing = false;

  // {"epoch":..,"rng_state":"<decimal>","num_tasks":..,"records_per_task":..,"done":[..]}
  // (and "growing":true when it was)
  // (rng_state as a string: it is 64-bit unsigned, beyond JSON's doubles).
  std::string ToJson() const;
  // InvalidArgument for malformed JSON or missing / mistyped fields.
  static absl::StatusOr<DataCursor> FromJson(std::string_view json);
};

class Dispatcher {
 public:
  // Returns the time used for worker timeouts; called with the dispatcher's
  // lock held, from any thread.
  using Clock = std::function<absl::Time()>;

  // Splits the files into tasks and creates epoch 1's training tasks and
  // the prediction tasks. InvalidArgument for bad options (naming the key)
  // or a file with a negative record count. `clock` defaults to absl::Now.
  static absl::StatusOr<std::unique_ptr<Dispatcher>> Create(const DispatcherOptions& options,
                                                            std::vector<DataFile> training,
                                                            std::vector<DataFile> evaluation = {},
                                                            std::vector<DataFile> prediction = {},
                                                            Clock clock = nullptr);
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Hands worker `worker` (>= 0; any id, an id seen in WorkerDied starts
  // afresh) the next task: an open evaluation round's first, then the
  // current epoch's, then prediction's. kWait if none is free but some are
  // in flight; kEnd when all work is done; the job's error once a task has
  // exhausted its retries. InvalidArgument for a negative worker. Never
  // blocks.
  absl::StatusOr<Assignment> GetTask(int worker);

  // As GetTask, but hands out only evaluation tasks of the open round: kTask
  // with one of them, else kWait (also when no round is open or training
  // tasks are free: those stay queued). For running an evaluation round
  // between training tasks without starting any. Never blocks.
  absl::StatusOr<Assignment> GetEvaluationTask(int worker);

  // As GetTask, but while the answer is kWait blocks until tasks are
  // re-queued, an epoch or round starts, the job ends or fails, or
  // `deadline` (real time, not the injected clock) passes; then kWait.
  absl::StatusOr<Assignment> WaitForTask(int worker, std::chrono::steady_clock::time_point deadline);

  // Worker `worker` finished the task of `lease`: its records are counted
  // (records_seen, eval_records_seen or predict_records_seen). kStale (and
  // counted) if the lease is not current for this worker. After the job has
  // failed, reports are still taken, but no new epoch or round starts.
  ReportResult ReportDone(int worker, uint64_t lease);

  // Worker `worker` failed the task of `lease` with `error` (an OK status
  // reads as Unknown): it goes back to todo, or the job fails if it has been
  // re-queued max_task_retries times. kStale (and counted) as for ReportDone.
  ReportResult ReportFailed(int worker, uint64_t lease, const absl::Status& error);

  // Worker `worker` is alive: each of its tasks in flight has
  // task_timeout_s from now before it times out.
  void Heartbeat(int worker);

  // Worker `worker` is gone: its tasks go back to todo (each counting as a
  // failure of that task) and worker_failures grows by one. A second call
  // before the worker's next contact (any call naming it) is a no-op.
  void WorkerDied(int worker);

  // Re-queues every task in flight whose time is up (see Liveness above; each
  // counts as a failure of that task). Returns how many were re-queued. The
  // worker is not declared dead: its later reports on those leases are
  // stale, and it may ask for new tasks.
  int CheckTimeouts();

  // Opens an evaluation round over the eval files, tagged with
  // `model_version`; returns its 1-based round number. Also after every
  // training task is done (the final evaluation): the job is unfinished
  // again until the round completes. FailedPrecondition if there are no
  // eval records, a round is still open, or the job has failed.
  absl::StatusOr<int> StartEvaluation(int64_t model_version);
  // Whether round `round` has been started and every one of its tasks is done.
  bool EvaluationDone(int round) const;

  // Growing training data (DispatcherOptions::growing): the training file
  // now has `records` readable records (never fewer than before). Tasks are
  // cut from them exactly as Create would cut the final file (every task
  // but the last holds records_per_task records, so task ids do not depend
  // on how the data grew); the records past the last whole task wait for
  // more, or for `final`. Each new task of epoch 1 goes to a uniformly
  // random place in the todo queue (a running Fisher-Yates insertion from
  // its own generator, seeded by options.seed), so epoch 1 is shuffled over
  // the tasks known at each moment; later epochs shuffle the whole list as
  // usual, starting from the generator state an ungrown epoch 1 would have
  // used. `final`: `records` is the file's whole count; epoch 1 can end.
  // FailedPrecondition when the dispatcher is not growing (or no longer).
  absl::Status GrowTraining(int64_t records, bool final);
  // Whether the training data is still growing.
  bool growing() const;

  // The training cursor (see DataCursor).
  DataCursor Cursor() const;
  // Replaces the training state with `cursor`'s: the epoch's order is
  // regenerated and only its tasks not in cursor.done are handed out, then
  // later epochs follow as in the original run. A cursor taken while the
  // data grew restores into the grown data's dispatcher (its tasks are a
  // prefix). FailedPrecondition after any task has been handed out or while
  // this dispatcher's data is growing; InvalidArgument if the cursor does
  // not fit this dataset (task count, records_per_task, epoch beyond
  // options.epochs + 1, unknown or repeated task ids).
  absl::Status Restore(const DataCursor& cursor);

  DispatcherCounters counters() const;
  // OK, or the error that stopped the job.
  absl::Status status() const;
  // Whether all work is done (GetTask would answer kEnd).
  bool finished() const;

 private:
  // A task's definition: which file, which records.
  struct TaskSpec {
    int32_t file = 0;  // into the type's file list
    int64_t first_record = 0;
    int64_t records = 0;
  };
  // A task waiting in todo or running in doing.
  struct Pending {
    TaskType type = TaskType::kTraining;
    int64_t id = 0;  // into the type's TaskSpec list
    int epoch = 0;   // training
    int round = 0;   // evaluation
    int attempt = 0;
    std::string last_error;
    absl::StatusCode last_code = absl::StatusCode::kOk;
  };
  struct Doing {
    Pending task;
    int worker = 0;
    absl::Time handed_out;
  };
  struct WorkerState {
    absl::Time last_heartbeat = absl::InfinitePast();
    bool dead = false;  // WorkerDied since its last contact
  };

  Dispatcher(const DispatcherOptions& options, std::vector<DataFile> training, std::vector<DataFile> evaluation,
             std::vector<DataFile> prediction, Clock clock);

  // GetTask (evaluation_only false) and GetEvaluationTask (true).
  absl::StatusOr<Assignment> Take(int worker, bool evaluation_only);
  // `worker` made contact: clears its dead mark.
  void TouchLocked(int worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GetTask without the argument check and the lock; only evaluation tasks
  // when `evaluation_only`.
  Assignment NextLocked(int worker, bool evaluation_only = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shuffles epoch_'s tasks from rng_ (epoch_rng_ keeps the start state)
  // into train_todo_, leaving out `done`.
  void StartEpochLocked(const std::vector<char>& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cuts training records [grown_, end) into tasks (end: a multiple of
  // records_per_task, or the final count) and queues them for epoch 1.
  void GrowLocked(int64_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves on to the next epoch when the current one is complete; closes a
  // complete evaluation round.
  void AdvanceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts `task` back at the front of its todo queue after `why`, or fails
  // the job when it is out of retries.
  void RequeueLocked(Pending task, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int CheckTimeoutsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `lease` from doing if it is current for `worker`; counts a
  // stale report otherwise.
  bool TakeLeaseLocked(int worker, uint64_t lease, Pending* task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FinishedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `training task 3 (file "f1", records 30-39, epoch 2)`.
  std::string Describe(const Pending& task) const;
  const TaskSpec& SpecOf(const Pending& task) const;
  const std::string& FileOf(const Pending& task) const;
  void WakeAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction (the training file's record count and
  // train_specs_ grow under mu_ while growing_).
  const DispatcherOptions options_;
  std::vector<DataFile> train_files_;
  const std::vector<DataFile> eval_files_;
  const std::vector<DataFile> predict_files_;
  std::vector<TaskSpec> train_specs_;  // canonical order; ids index it (grows under mu_ while growing_)
  std::vector<TaskSpec> eval_specs_;
  std::vector<TaskSpec> predict_specs_;  // input order
  int64_t train_records_ = 0;            // per epoch (grows under mu_ while growing_)
  int64_t eval_records_ = 0;             // per round
  const Clock clock_;

  mutable Mutex mu_;
  CondVar changed_;  // signalled whenever wake_generation_ advances
  uint64_t wake_generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status job_error_ ABSL_GUARDED_BY(mu_);
  uint64_t next_lease_ ABSL_GUARDED_BY(mu_) = 1;
  bool handed_out_ ABSL_GUARDED_BY(mu_) = false;  // any task ever (Restore checks)

  // Training.
  int epoch_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t epoch_rng_ ABSL_GUARDED_BY(mu_) = 0;  // rng_ before epoch_'s shuffle
  uint64_t rng_ ABSL_GUARDED_BY(mu_) = 0;        // after it
  bool training_done_ ABSL_GUARDED_BY(mu_) = false;
  bool growing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t grown_ ABSL_GUARDED_BY(mu_) = 0;        // records cut into tasks
  int64_t readable_ ABSL_GUARDED_BY(mu_) = 0;     // records said to be readable
  uint64_t grow_rng_ ABSL_GUARDED_BY(mu_) = 0;    // epoch 1's insertions while growing
  std::vector<char> epoch_done_ ABSL_GUARDED_BY(mu_);  // [task id] of epoch_
  int64_t train_doing_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Pending> train_todo_ ABSL_GUARDED_BY(mu_);

  // Evaluation.
  int round_ ABSL_GUARDED_BY(mu_) = 0;  // last round started
  bool round_open_ ABSL_GUARDED_BY(mu_) = false;
  int64_t round_version_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t round_left_ ABSL_GUARDED_BY(mu_) = 0;  // tasks of the open round not done
  std::deque<Pending> eval_todo_ ABSL_GUARDED_BY(mu_);

  // Prediction.
  int64_t predict_left_ ABSL_GUARDED_BY(mu_) = 0;  // not done
  std::deque<Pending> predict_todo_ ABSL_GUARDED_BY(mu_);

  std::map<uint64_t, Doing> doing_ ABSL_GUARDED_BY(mu_);  // by lease (ordered: deterministic re-queue)
  std::unordered_map<int, WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  DispatcherCounters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardwild
