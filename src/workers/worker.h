// A worker: one pinned thread's training state and its step.
//
// fastText's Model::State in spirit: the worker owns its scratch (the model's
// buffers, the batch labels), its oneDNN stream and its RNG; the shared
// weights are reached only through the ParamStore. A step is
//   data (copy the batch) -> read params (pull) -> forward -> backward -> push
// and allocates nothing.
//
// Thread safety: a Worker is used by one thread at a time, the thread of the
// WorkerPool slot it belongs to. Its Counters may be read by any thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/dataset.h"
#include "core/data/prefetch_burst.h"
#include "core/metrics/metrics.h"
#include "core/model/model.h"
#include "core/config/options.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "ps_shm/param_store.h"
#include "ps_shm/sync_aggregator.h"
#include "workers/hot_rows.h"

namespace shardwild {

class ReplicatedStore;
class SyncAggregator;

// When a worker refreshes its local copy of the parameters and where its
// gradients go (train.pull_every, ps.max_staleness, ps.update).
struct WorkerUpdateOptions {
  // Pull on the first step of each Train call and then every `pull_every`
  // steps (ElasticDL's get_model_steps); between pulls the worker computes on
  // its local copy. >= 1.
  int pull_every = 1;
  // ElasticDL's staleness bound: before a step that would not pull, the worker
  // reads store->version() and pulls anyway when it is more than this many
  // pushes past the version read at its last pull. 0 = unbounded.
  int64_t max_staleness = 0;
  // ps.update sync: gradients go to this aggregator (not owned) instead of
  // straight to the store, and every step pulls (pull_every and
  // max_staleness do not apply). nullptr = push to the store.
  SyncAggregator* sync = nullptr;
  // ps.replication per_node / per_core: after each push the worker reports
  // the step here (ReplicatedStore::StepDone), which may average the
  // replicas on this thread. Not owned. nullptr = one copy, nothing to do.
  ReplicatedStore* replicas = nullptr;
  // The embedding tables' learning rate follows this one's schedule
  // (optimizer.sparse); nullptr = the dense optimizer's. Not owned.
  const OptimizerOptions* sparse_optimizer = nullptr;
  // Read embedding rows in place where the store allows it
  // (ParamStore::RowAddresses: local static tables under Hogwild): the
  // forward pools the rows from the store's memory, with no pulled copy.
  // Under plain SGD the embedding-bag backward is also fused with the row
  // update, with no gradient buffer; under an optimizer with slots the
  // rows' gradients are pushed as before. Never with sync or replicas.
  // false = always pull and push rows (tests compare the two).
  bool rows_in_place = true;
  // ps.hot_rows: per table read and updated in place (plain SGD), this many of its most frequent
  // ids are read and updated in the worker's own copies, merged into the
  // store every hot_rows_merge_every steps and when a training call
  // returns (workers/hot_rows.h). 0 = none.
  int64_t hot_rows = 0;
  int hot_rows_merge_every = 32;
};

// Seconds spent in each phase of the step, summed over steps.
// read_params and push are the dense variables'; pull_rows and push_rows the
// embedding tables'. With rows in place (WorkerUpdateOptions::rows_in_place)
// pull_rows only looks the rows up, the forward pools them from the store's
// memory (rows_in_forward: that part of `forward`, not a phase of its own)
// and push_rows is the fused embedding-bag backward and update.
struct PhaseTimes {
  double data = 0, read_params = 0, pull_rows = 0, forward = 0, backward = 0, push = 0, push_rows = 0;
  double rows_in_forward = 0;
  // The steps timed, the embedding rows they pulled and how many of them
  // pulled the parameters.
  int64_t steps = 0, rows = 0, pulls = 0;
  double total() const { return data + read_params + pull_rows + forward + backward + push + push_rows; }
  void Add(const PhaseTimes& o) {
    data += o.data; read_params += o.read_params; pull_rows += o.pull_rows; forward += o.forward;
    backward += o.backward; push += o.push; push_rows += o.push_rows; rows_in_forward += o.rows_in_forward;
    steps += o.steps; rows += o.rows; pulls += o.pulls;
  }
};

// The phases of a training step as PhaseTimes times them (rows_in_forward
// is part of forward), in the order of WorkerCounters::phase_ns and of the
// live metrics' phase label (workers/live_metrics.h).
inline constexpr int kNumStepPhases = 7;
inline constexpr const char* kStepPhaseNames[kNumStepPhases] = {"data",     "read_params", "pull_rows", "forward",
                                                                 "backward", "push",        "push_rows"};
// The PhaseTimes field of each, in the same order.
inline constexpr double PhaseTimes::*kStepPhaseFields[kNumStepPhases] = {
    &PhaseTimes::data,     &PhaseTimes::read_params, &PhaseTimes::pull_rows, &PhaseTimes::forward,
    &PhaseTimes::backward, &PhaseTimes::push,        &PhaseTimes::push_rows};

// Progress counters, written by the worker's thread and read by the
// progress reporter and the live metrics: relaxed atomics, as they publish
// nothing else. One thread writes them (the worker's), so it adds with a
// relaxed load and store (Bump), plain moves on x86, not a locked
// read-modify-write (a compare-exchange loop for the double) each step.
struct alignas(64) WorkerCounters {
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> samples{0};
  std::atomic<double> loss_sum{0};   // sum of per-sample losses
  std::atomic<int64_t> correct{0};   // training predictions that were right
  std::atomic<int64_t> pulls{0};     // training steps that pulled the parameters
  std::atomic<int64_t> rows_pulled{0};  // embedding rows gathered (ids, repeats included)
  std::atomic<int64_t> rows_pushed{0};  // embedding row gradients pushed (ids, before deduplication)
  // Nanoseconds of training steps spent in each phase (kStepPhaseNames),
  // added once per step.
  std::atomic<int64_t> phase_ns[kNumStepPhases]{};

  // counter += delta, by the counters' one writer.
  template <class T>
  static void Bump(std::atomic<T>& counter, T delta) {
    counter.store(counter.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
  }
};

struct EvalResult {
  int64_t count = 0;
  int64_t correct = 0;
  double loss_sum = 0;
  // Every metric the head implies (AUC, log-loss, P@k, RMSE, ...).
  std::optional<EvalMetrics> metrics;
  void Add(const EvalResult& o) {
    count += o.count; correct += o.correct; loss_sum += o.loss_sum;
    if (o.metrics) {
      if (metrics) {
        metrics->Merge(*o.metrics);
      } else {
        metrics = o.metrics;
      }
    }
  }
};

// Named metric values, e.g. {"test_auc", 0.79}.
using MetricValues = std::vector<std::pair<std::string, double>>;

// The metrics of an evaluation beyond loss and accuracy, named "test_<name>"
// (test_auc, test_logloss, test_precision_at_5, test_rmse).
MetricValues ExtraTestMetrics(const EvalResult& result);

// The bytes one dense push of `model` moves through the caches under an
// optimizer of `type`: each parameter and each of its slots read and
// written, its gradient read and the worker's copy written (the fused pull).
// The default MLP under Adam: 235,146 parameters, 32 bytes each.
int64_t DensePushBytes(const Model& model, OptimizerType type);

// Whether a step asks for the next batch's lines after its dense push rather
// than during its forward and backward: where the push moves more bytes than
// a core's L2 holds (`l2_bytes`), the lines asked for before it are gone
// from the caches when the next step loads them.
bool AskNextBatchAfterPush(int64_t dense_push_bytes, size_t l2_bytes);

class Worker {
 public:
  // Builds the worker's model (oneDNN primitives for `batch` rows) and
  // buffers. `store` and `train` must outlive the worker. The store must
  // hold the model's variables and tables (Model::Describe) in that order.
  // `seed` seeds the worker's dropout masks (mixed with its index).
  static absl::StatusOr<std::unique_ptr<Worker>> Create(int index, const ModelOptions& model, int64_t batch,
                                                        const Dataset& train, ParamStore* store,
                                                        const dnnl::engine& engine, uint64_t seed = 1);

  // Trains on the records order[0..count): ceil(count / batch) steps, the
  // last batch padded. With max_steps >= 0 runs exactly that many steps,
  // cycling through the records (benchmarks). Adds phase times to `times`.
  // The learning rate of each step is optimizer.LrAt(progress), where
  // progress runs linearly from progress_begin (first step) to progress_end
  // (after the last). Pulls as update_options() say (every step by default).
  // With a SyncAggregator each step's push goes through it, so every worker
  // of the pool must be in Train at once (one RunAll); the worker leaves the
  // aggregator's group when Train returns, on success or error.
  // The first `untimed_steps` steps run as the others but are not added to
  // `times` (a benchmark's warm-up that flows into its timed steps: their
  // first is then asked for a step ahead like every other, and runs on a
  // thread that is already working); timed_start() says when the first
  // timed one began.
  absl::Status Train(const int32_t* order, int64_t count, int64_t max_steps, const OptimizerOptions& optimizer,
                     double progress_begin, double progress_end, PhaseTimes* times, int64_t untimed_steps = 0);
  // When the last Train or TrainRange call began its first timed step (the
  // call's start where it had none untimed); unset before any.
  std::optional<std::chrono::steady_clock::time_point> timed_start() const { return timed_start_; }

  // Trains on the records order[0..count), ceil(count / batch) steps, the
  // last batch padded, as part of a longer run: step k of this call is step
  // first_step + k of the run, and its learning rate is
  // optimizer.LrAt(progress_begin + (first_step + k) * progress_per_step).
  // So a run split into several calls (checkpoint segments, a resumed run)
  // computes exactly the rates of one call. Otherwise as Train.
  // `after_step`, if given, runs after each step, and the call returns
  // before the next one once it returns false (a task runner's heartbeat,
  // whose parent is gone). It lets a long range be one call: a call's steps
  // fuse each step's pull into the last one's push and ask for the next
  // batch's records a step ahead, which its first step cannot.
  absl::Status TrainRange(const int32_t* order, int64_t count, const OptimizerOptions& optimizer,
                          double progress_begin, double progress_per_step, int64_t first_step, PhaseTimes* times,
                          const std::function<bool()>& after_step = nullptr);

  // Train and TrainRange return before their next step once *stop is true
  // (read relaxed, once a step): how the lockstep trainer ends its rounds
  // early when a run is stopped or interrupted (a worker in a sync group
  // then leaves it as usual). nullptr = every step runs. Set only while the
  // worker is idle.
  void set_stop(const std::atomic<bool>* stop) { stop_ = stop; }

  // Evaluates records [begin, end) of `data` with the store's current parameters.
  absl::StatusOr<EvalResult> Evaluate(const Dataset& data, int64_t begin, int64_t end);

  // Predictions of records [begin, end) of `data` with the store's current
  // parameters, into out[(end - begin) x model().outputs()] in record order:
  // class probabilities (softmax), the probability of label 1 (binary) or
  // the predicted value (regression). Embedding rows of ids a dynamic table
  // lacks read as their initial values and are not inserted.
  absl::Status Predict(const Dataset& data, int64_t begin, int64_t end, float* out);

  int index() const { return index_; }
  const Model& model() const { return *model_; }
  WorkerCounters& counters() { return counters_; }
  // The copies of the hot rows (WorkerUpdateOptions::hot_rows); empty until
  // the first training call that reads rows in place.
  const HotRows& hot_rows() const { return hot_; }

  // Sets when the worker pulls and where it pushes. Call from the thread
  // that owns the worker, or before handing it to one (WorkerPool::RunAll
  // orders the two). Default: pull every step, push to the store.
  // New hot-row settings drop the copies (they hold no unmerged updates
  // between training calls) and choose again at the next call.
  void set_update_options(const WorkerUpdateOptions& options) {
    if (options.hot_rows != update_.hot_rows) {
      hot_ = HotRows();
      hot_rows_chosen_ = false;
    }
    update_ = options;
  }
  const WorkerUpdateOptions& update_options() const { return update_; }

  // The training data packed for this worker's model (Model::PackRecords of
  // the data given to Create), which training steps then load from; not
  // owned, must outlive the training calls; null (the default) = load from
  // the data set's fields. Call as set_update_options.
  void set_packed_records(const PackedRecords* packed) { packed_ = packed; }

  // The most lines of the next batch a training step asks for at once
  // (data.prefetch_burst_lines, or what this machine's cores bring in:
  // MachinePrefetchBurst in core/data/prefetch_burst.h); >= 1. A hint: the
  // values trained are the same whatever it is. Call as set_update_options.
  void set_prefetch_burst_lines(int lines) { prefetch_burst_lines_ = std::max(lines, 1); }
  int prefetch_burst_lines() const { return prefetch_burst_lines_; }

  // The records training steps load from from now on, instead of the data
  // given to Create (streamed training hands each window of records here);
  // same shape, not owned, must outlive the training calls; clears the
  // packed records. Call as set_update_options.
  void set_train_data(const Dataset* data) {
    train_ = data;
    packed_ = nullptr;
  }

 private:
  Worker() = default;
  absl::Status PullAll();
  // Pulls every lookup's rows for the loaded batch, in one PullRowsBatch.
  absl::Status PullRows(PullMode mode);
  // A training step's rows: the in-place lookups get their addresses, the
  // others are pulled (kInsert).
  absl::Status PrepareRows(bool in_place_allowed);
  // A training step's row updates: PushRowsBatch of the pulled lookups,
  // then the in-place lookups' fused backward and SGD.
  absl::Status UpdateRows(float lr);
  // The model's rows_ready hook: UpdateRows(step_sparse_lr_) inside the
  // backward when update_rows_in_backward_, timed into rows_in_backward_ns_,
  // its error kept in rows_status_.
  void RowsReady();
  // Rejects evaluation or prediction data whose shape differs from the training data's.
  absl::Status CheckShape(const Dataset& data, const char* what) const;
  absl::Status TrainSteps(const int32_t* order, int64_t count, int64_t max_steps, const OptimizerOptions& optimizer,
                          double progress_begin, double progress_per_step, int64_t first_step, PhaseTimes* times,
                          int64_t untimed_steps, const std::function<bool()>& after_step);
  // Runs TrainSteps, then leaves the sync group if there is one.
  absl::Status TrainAndLeave(const int32_t* order, int64_t count, int64_t max_steps, const OptimizerOptions& optimizer,
                             double progress_begin, double progress_per_step, int64_t first_step, PhaseTimes* times,
                             int64_t untimed_steps = 0, const std::function<bool()>& after_step = nullptr);

  int index_ = 0;
  std::optional<std::chrono::steady_clock::time_point> timed_start_;
  const Dataset* train_ = nullptr;
  ParamStore* store_ = nullptr;
  std::unique_ptr<Model> model_;
  dnnl::stream stream_;
  std::vector<int32_t> batch_records_;  // [batch] the records of the step being loaded
  std::vector<int32_t> next_records_;   // [batch] those of the next step, taken a step ahead (TrainSteps)
  RowScratch row_scratch_;
  std::vector<RowPull> row_pulls_;      // [lookup], set each step (PullRowsBatch)
  std::vector<RowGrad> row_pushes_;     // [lookup], set each step (PushRowsBatch, or the sync round)
  // Per lookup: false once the store declined RowAddresses (never asked again).
  std::vector<char> in_place_possible_;
  std::vector<PullSlice> pulls_;      // one per variable, into the model's params
  std::vector<DenseGrad> pushes_;     // one per variable, from the model's grads
  WorkerCounters counters_;
  WorkerUpdateOptions update_;
  // Overlap (SyncAggregator buckets): the sync barrier the backward pass
  // hands each layer's gradient to (null = none), the next bucket, the
  // step's learning rate and the first hand-over's error.
  SyncAggregator* bucket_sync_ = nullptr;
  int next_bucket_ = 0;
  float step_lr_ = 0;
  float step_sparse_lr_ = 0;
  absl::Status bucket_status_;
  // Rows updated as soon as the backward has their gradients (TrainSteps,
  // when no sync round takes them): the time that took this step and its error.
  bool update_rows_in_backward_ = false;
  int64_t rows_in_backward_ns_ = 0;
  absl::Status rows_status_;
  uint64_t version_at_pull_ = 0;             // store->version() read just before the last training pull
  const std::atomic<bool>* stop_ = nullptr;  // set_stop
  const PackedRecords* packed_ = nullptr;  // set_packed_records
  int prefetch_burst_lines_ = kDefaultPrefetchBurstLines;  // set_prefetch_burst_lines
  // update_.hot_rows: chosen on the first training call that reads rows in
  // place (hot_rows_chosen_), merged by TrainSteps.
  HotRows hot_;
  bool hot_rows_chosen_ = false;
};

}  // namespace shardwild
