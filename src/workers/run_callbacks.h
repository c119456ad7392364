// RunCallbacks: what a training run does around its steps, the same for the
// in-process trainer (trainer.cc) and the worker-process trainer
// (task_trainer.cc), after Keras' callbacks: metrics as JSON lines and
// TensorBoard scalars (config.metrics), early stopping (config.early_stopping,
// its state restored from and saved to checkpoints), the epoch's summary
// line, and the latest evaluation's result for the run summary.
//
// Thread safety: one thread (the trainer's) owns it; the progress callback
// of WorkerPool::RunAll runs on that thread too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "core/metrics/early_stopping.h"
#include "core/io/metrics_log.h"
#include "core/config/options.h"
#include "core/io/tfevents.h"
#include "nlohmann/json.hpp"
#include "workers/progress.h"
#include "workers/worker.h"

namespace shardwild {

struct EpochResult;

class RunCallbacks {
 public:
  // Opens the metrics files (the JSONL file appended to when `resumed`) and
  // sets up early stopping, from `restored_extra["early_stopping"]` when a
  // checkpoint carried it (a state for another monitor is reported on
  // `progress` and dropped). `progress` must outlive the object.
  static absl::StatusOr<std::unique_ptr<RunCallbacks>> Create(const Config& config, bool resumed,
                                                              const nlohmann::json& restored_extra,
                                                              ProgressReporter* progress);

  // A progress interval: train loss and throughput at global step `step`.
  absl::Status OnProgress(int epoch, int64_t step, double loss, double samples_per_s);
  // An evaluation between steps (`round` of `rounds` steps of epoch
  // `epoch`): the line, the metrics, and early stopping on a test_* monitor.
  // Returns whether training should stop now.
  absl::StatusOr<bool> OnEvaluation(int epoch, int64_t round, int64_t rounds, int64_t step, double loss,
                                    double accuracy, const MetricValues& extra);
  // The end of an epoch (`er` complete, with its test metrics if it
  // evaluated): the line, the metrics, and early stopping on the epoch's
  // values. Returns whether training should stop now.
  absl::StatusOr<bool> OnEpochEnd(const EpochResult& er, int epochs, int64_t step);

  // The caller's observer (TrainRunOptions::on_metrics, the Python API's
  // callbacks): given the metrics of each progress interval and each epoch
  // as a JSON object; returning false stops training as early stopping
  // does, an error ends the run with it.
  using Observer = std::function<absl::StatusOr<bool>(const nlohmann::json&)>;
  void set_observer(Observer observer) { observer_ = std::move(observer); }

  // Whether early stopping or the observer has asked to stop.
  bool stopped() const { return stopped_; }
  // The early-stopping state for a checkpoint; null when it is off.
  nlohmann::json early_stopping_state() const { return early_ ? early_->ToJson() : nlohmann::json(); }
  // The latest evaluation, if any.
  struct Evaluation {
    double loss = 0, accuracy = 0;
    MetricValues extra;  // test_auc, ... (ExtraTestMetrics)
  };
  const std::optional<Evaluation>& last_evaluation() const { return last_eval_; }

 private:
  RunCallbacks() = default;
  // Writes `record` (with "step") and `scalars` at `step`.
  absl::Status Log(nlohmann::json record, int64_t step, absl::Span<const ScalarValue> scalars);
  // Feeds early stopping; announces a stop.
  bool Stop(double value);
  // The observer said stop: the line, and stopped().
  void StopForObserver(int epoch, int64_t step);

  ProgressReporter* progress_ = nullptr;
  std::unique_ptr<MetricsLog> jsonl_;
  std::unique_ptr<EventFileWriter> events_;
  std::optional<EarlyStopping> early_;
  bool stopped_ = false;
  std::optional<Evaluation> last_eval_;
  Observer observer_;
  // Early stopping on a test_* metric of `extra` (or loss/accuracy).
  std::optional<bool> StopOnTest(double loss, double accuracy, const MetricValues& extra);
};

}  // namespace shardwild
