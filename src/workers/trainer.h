// Training: epochs over the shuffled data, Hogwild workers, evaluation at the
// end of each epoch.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/checkpoint.h"
#include "workers/job.h"
#include "workers/progress.h"

namespace shardwild {

class LiveMetrics;
class RunCallbacks;
struct ExternalTraining;

struct EpochResult {
  int epoch = 0;                       // 1-based
  int64_t records = 0;                 // training records seen this epoch
  double train_loss = 0;               // mean over the epoch's records
  double train_accuracy = 0;
  std::optional<double> test_loss;     // absent without data.test
  std::optional<double> test_accuracy;
  MetricValues test_metrics;           // test_auc, test_logloss, ... (ExtraTestMetrics)
  double seconds = 0;                  // training part of the epoch
  double samples_per_s = 0;
};

struct TrainSummary {
  int epochs = 0;
  int workers = 0;
  int intra_op_threads = 0;
  int shards = 0;
  int64_t steps = 0;                   // steps over all workers
  int64_t records_seen = 0;            // training records over all epochs
  double samples_per_s = 0;            // over the training time (evaluation excluded)
  double train_loss = 0;               // last epoch
  std::optional<double> test_loss;     // after the last epoch
  std::optional<double> test_accuracy;
  MetricValues test_metrics;           // test_auc, ... of the last evaluation
  double wall_s = 0;                   // the whole run, evaluation included
  uint64_t model_version = 0;          // pushes applied, summed over the replicas
  uint64_t store_bytes = 0;            // over all replicas
  std::string store_name;              // of the first replica
  std::vector<EpochResult> history;    // the epochs this run trained (a resumed run: from its epoch on)
  // Checkpoints (checkpoint.dir): the step this run resumed from (nullopt
  // if it started fresh), checkpoints this run wrote, the last one's path,
  // and the checkpoints skipped on resume because they did not verify.
  std::optional<int64_t> resumed_from_step;
  // The newest checkpoint was the job's final one (after the last epoch, or
  // written when early stopping ended it): this run trained nothing, and
  // the test metrics, if any, are the final model's, evaluated now.
  bool already_complete = false;
  int64_t checkpoints_written = 0;
  // Seconds spent writing this run's checkpoints (the workers wait
  // meanwhile), and finding, verifying and restoring the one it resumed
  // from (nullopt if it started fresh).
  double checkpoint_write_s = 0;
  std::optional<double> checkpoint_restore_s;
  std::string last_checkpoint;
  std::vector<std::string> skipped_checkpoints;
  // early_stopping: the epoch in which training stopped early, if it did.
  std::optional<int> stopped_early_at_epoch;
  // Coordination counters (the dispatcher's); zero while training runs on
  // in-process workers with fixed parts of each epoch.
  int64_t eval_records_seen = 0;       // test records evaluated, over all evaluations
  int64_t tasks_requeued = 0;
  int64_t worker_failures = 0;
  // Streamed data (data.stream): the mean over the workers of the seconds
  // their steps waited for data, and the most bytes the workers' readers
  // held (each worker's peak, summed); zero otherwise.
  double data_wait_s = 0;
  int64_t reader_peak_bytes = 0;
  // Seconds from the end of the job's set-up (store created, workers built)
  // to the first training task handed out; negative when none was.
  double first_task_after_ready_s = -1;
  // Streamed: the records readable when the first task went out (fewer
  // than all of them when training started while the cache was built);
  // -1 otherwise.
  int64_t records_ready_at_first_task = -1;
};

// The processes of a train.strategy allreduce job, as the trainer sees
// them (net/allreduce_task.h implements it over Gloo). Rank r's workers take
// parts r * workers .. (r + 1) * workers - 1 of the world's world * workers
// parts of each epoch (the div rule over the epoch's order), and every rank
// takes part in every round (job.sync() pads the rounds its parts ran out
// before; the barrier's reducer sums over the group). Rank 0 alone writes
// checkpoints. Epochs are cut into segments of 16 rounds; between two,
// rank 0 lets waiting joiners in (AdmitJoiners). When a segment fails on a
// collective (a member died), Recover re-forms the group; every member then
// takes rank 0's parameters, optimizer state and cursor (SyncState), and
// the records rank 0's completed rounds left are split over the new group.
// So each record is trained once per epoch, as far as rank 0's rounds
// completed (a round a lost member took part in but that failed is trained
// again), and records_seen counts the group's records.
class ElasticGroup {
 public:
  virtual ~ElasticGroup() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Whether this process joined a running job: before its first step it
  // takes the job's state (SyncState with its own cursor ignored).
  virtual bool joined_late() const = 0;
  // A segment failed with `failure`: true when the group re-formed (the
  // trainer then calls SyncState), false when the failure was not the
  // group's (it is returned as is); an error when the group could not
  // re-form (too few members left, the rendezvous gone).
  virtual absl::StatusOr<bool> Recover(const absl::Status& failure) = 0;
  // Between two segments, on every member at once: re-forms the group when
  // rank 0 has joiners waiting; whether it did (then SyncState follows).
  virtual absl::StatusOr<bool> AdmitJoiners() = 0;
  // After a (re)forming: every member takes rank 0's parameters and
  // optimizer state, `cursor` and `order` (rank 0's values in, everyone's
  // out).
  virtual absl::Status SyncState(std::vector<int64_t>* cursor, std::vector<int32_t>* order) = 0;
  // Every member waits until all have called it (a 1-value collective).
  virtual absl::Status Barrier() = 0;
};

// Embedding tables a Job keeps outside its own store (Job::tables_store():
// train.strategy allreduce, on ps tasks), checkpointed by that store's owner.
struct TableCheckpoints {
  // On the rank that writes a checkpoint, before it writes its dense part:
  // checkpoints the tables at `step` and returns what the checkpoint records
  // of them (its extra "tables").
  std::function<absl::StatusOr<nlohmann::json>(int64_t step)> save;
  // With a resumed checkpoint, after its dense part is restored: restores
  // the tables from what `save` recorded (`tables`, never null). Every rank
  // calls it; one of them (rank 0) acts. Then the group meets (Barrier)
  // before any rank trains.
  std::function<absl::Status(const CheckpointInfo& checkpoint, const nlohmann::json& tables)> restore;
};

// How RunTraining starts.
struct TrainRunOptions {
  // Ignore the checkpoints in checkpoint.dir and start from the initial
  // values (the CLI's --fresh). New checkpoints are still written there.
  bool fresh = false;
  // Tests: stop (with the status Aborted) right after the n-th checkpoint
  // this run writes, as if the process had been killed then; 0 = never.
  int64_t stop_after_checkpoints = 0;
  // train.worker_processes: the program and leading arguments that start one
  // worker process (workers/task_trainer.h appends --store, --index, --fd
  // and --parent). The CLI passes {"/proc/self/exe", "worker", CONFIG,
  // "--set", ...}; unused otherwise.
  std::vector<std::string> worker_command;
  // A cluster's chief (src/net): the parameters live on the ps tasks and
  // the workers are remote worker tasks (task_trainer.h, ExternalTraining);
  // not owned. nullptr = this machine's store and workers.
  const ExternalTraining* external = nullptr;
  // Required when the Job has a tables store (Job::tables_store()) and
  // checkpoint.dir is set; not owned. nullptr = the tables are in the Job's
  // store.
  const TableCheckpoints* tables = nullptr;
  // Live metrics (metrics.port; workers/live_metrics.h): the run attaches
  // its job's worker counters and store to it while it trains, and
  // publishes the train loss of each progress interval and epoch, the
  // dispatcher's counters and its checkpoints. Not owned; nullptr = none.
  LiveMetrics* live_metrics = nullptr;
  // The Python API's callbacks (src/python): called on the trainer's thread
  // with the metrics of each progress interval ({"event": "progress",
  // "epoch", "step", "train_loss", "samples_per_s"}) and of each epoch's end
  // ({"event": "epoch", "epoch", "epochs", "step", "records", "train_loss",
  // "train_accuracy", "seconds", "samples_per_s", and test_loss,
  // test_accuracy, test_* when the epoch evaluated}). Returning false stops
  // training as early stopping does: no more steps are started, the epoch
  // ends with what it trained, the final checkpoint is written (with
  // checkpoint.dir) and the summary's stopped_early_at_epoch says where. An
  // error ends the run with that error. Empty = none.
  std::function<absl::StatusOr<bool>(const nlohmann::json&)> on_metrics;
  // Set from any thread to interrupt the run (the Python API's
  // KeyboardInterrupt): no more steps are started (a worker stops between
  // steps; worker processes finish their task), nothing more is written,
  // and RunTraining returns Cancelled. The checkpoints written so far stay,
  // so a restart resumes from the last one. Not owned; nullptr = never.
  const std::atomic<bool>* interrupt = nullptr;
  // train.strategy allreduce across processes (net/allreduce_task.h): this
  // process is a member of a group training one model in lock-step rounds
  // (not owned; nullptr = this process alone). See ElasticGroup.
  ElasticGroup* elastic = nullptr;
};

// Whether options.interrupt is set.
inline bool Interrupted(const TrainRunOptions& options) {
  return options.interrupt != nullptr && options.interrupt->load(std::memory_order_relaxed);
}

// The status RunTraining returns when options.interrupt stopped it.
absl::Status InterruptedError();

// A hash of the config fields that decide what a run computes (model,
// data, optimizers, batch, workers, seed, epochs, update mode, shards), as
// hex. A checkpoint records it; resuming under another hash is reported.
std::string TrainingConfigHash(const Config& config);

// Deterministic permutation of [0, n) for (seed, epoch).
std::vector<int32_t> EpochOrder(int64_t n, uint64_t seed, int epoch);

// Trains `job` for config.train.epochs epochs; each epoch sees every record
// exactly once.
//
// ps.update hogwild and row_lock (and every train.worker_processes run)
// train in the dispatcher's tasks: RunTaskTraining (workers/task_trainer.h),
// on the job's worker threads through a Coordinator, or on worker processes;
// checkpoints and evaluations due every N steps land on task boundaries,
// evaluation runs as exactly-once evaluation tasks, and a checkpoint's data
// cursor is the dispatcher's.
//
// ps.update sync trains in lockstep rounds (described from here on): the
// shuffled order is split into one contiguous part per worker (div rule) and
// the workers step together, so a run is bit-for-bit reproducible. With
// several replicas (ps.replication) they are averaged at the end of each
// epoch, besides every ps.sync_every steps. Evaluates data.test after each
// epoch.
//
// Checkpoints (config.checkpoint, workers/checkpoint.h): with a directory,
// the run first resumes from the newest checkpoint there that verifies
// (unless options.fresh): parameters, slots and model version are restored
// into every replica, and training continues in the saved epoch at the
// saved step, with the same order and learning rates, so a resumed run
// computes what the uninterrupted run would have (bit for bit with
// ps.update sync). If the workers, batch size or record count changed, the
// saved epoch restarts from its beginning instead (reported). Checkpoints
// are written with every worker stopped between steps: every
// checkpoint.every_steps steps of each worker, at the end of every
// checkpoint.every_epochs epochs, and at the end. With several replicas a
// checkpoint first averages them and saves the mean.
absl::StatusOr<TrainSummary> RunTraining(Job& job, ProgressReporter& progress, const TrainRunOptions& options = {});

// Evaluates the store's current parameters on `data`, split over the workers
// in chunks of data.records_per_task records whose results are merged in
// order, as inline evaluation's tasks are (so both agree bit for bit).
absl::StatusOr<EvalResult> EvaluateAll(Job& job, const Dataset& data);

// Class probabilities of every record of `data` (record-major, in input
// order: data.count x the model's classes), split over the workers.
absl::StatusOr<std::vector<float>> PredictAll(Job& job, const Dataset& data);

// Restores `checkpoint` into every replica of `job` (workers idle).
// FailedPrecondition when the checkpoint records data preprocessing
// (DataPreprocessingJson) other than the job's config says.
absl::Status RestoreJob(Job& job, const CheckpointInfo& checkpoint);

// FailedPrecondition naming the checkpoint when it was trained on data read
// otherwise than `config` reads it (its extra.data against
// DataPreprocessingJson(config)).
absl::Status CheckCheckpointData(const Config& config, const CheckpointInfo& checkpoint);

// How the config reads its data (format, dense transform, text and CSV
// options), as recorded in every checkpoint's manifest (extra.data).
nlohmann::json DataPreprocessingJson(const Config& config);

// The checkpoint step of a training run, with every worker idle: adds the
// early-stopping state (callbacks) and the data record
// (DataPreprocessingJson) to state.extra, writes the checkpoint of the job's
// first replica (WriteCheckpoint, checkpoint.keep; with options.external,
// its write_checkpoint instead), and counts it in
// `summary` (checkpoints_written, last_checkpoint). Aborted, after writing,
// once options.stop_after_checkpoints are written (the test hook).
absl::Status WriteTrainingCheckpoint(Job& job, CheckpointState state, const RunCallbacks& callbacks,
                                     const TrainRunOptions& options, TrainSummary* summary);

// The resume step of a training run: unless `fresh`, finds the newest good
// checkpoint in config.checkpoint.dir (each skipped one is appended to
// summary->skipped_checkpoints and reported on `progress` as a warning),
// restores it into `job` (with `external`, checks its data record and calls
// its restore_params instead), sets summary->checkpoint_restore_s to the
// seconds all that took, and warns if it was written under another config
// hash. Returns it, or nullopt when there is nothing to resume (also
// without checkpoint.dir).
absl::StatusOr<std::optional<CheckpointInfo>> ResumeJob(Job& job, bool fresh, ProgressReporter& progress,
                                                        TrainSummary* summary,
                                                        const ExternalTraining* external = nullptr);

}  // namespace shardwild
