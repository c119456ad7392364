// Evaluation and prediction from checkpoints: `shardwild eval` on one
// checkpoint, the sidecar evaluator that watches a checkpoint directory
// (`shardwild eval --watch`, TF's SidecarEvaluator), and `shardwild predict`.
//
// The job (workers/job.h) supplies the model, the store and the workers; a
// checkpoint is restored into every replica of its store (RestoreJob) and the
// data are evaluated over all workers (EvaluateAll). The job must not train
// meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/idx_reader.h"
#include "workers/checkpoint.h"
#include "workers/job.h"
#include "workers/worker.h"

namespace shardwild {

// `path` is one checkpoint (a directory holding manifest.json), verified; or
// a checkpoint directory, whose newest good checkpoint is taken (skipped
// ones are appended to `skipped`). NotFound if there is none.
absl::StatusOr<CheckpointInfo> ResolveCheckpoint(const std::string& path, std::vector<std::string>* skipped = nullptr);

struct CheckpointEvaluation {
  std::string name;    // ckpt-<step>
  std::string path;
  int64_t step = 0;
  bool final = false;  // written at the end of training
  EvalResult result;
  double loss() const { return result.count ? result.loss_sum / result.count : 0; }
  double accuracy() const { return result.count ? static_cast<double>(result.correct) / result.count : 0; }
};

// Restores `checkpoint` into `job` and evaluates `data`.
absl::StatusOr<CheckpointEvaluation> EvaluateCheckpoint(Job& job, const CheckpointInfo& checkpoint,
                                                        const Dataset& data);

struct WatchOptions {
  std::string dir;            // the training job's checkpoint.dir
  double idle_timeout_s = 0;  // stop after this long without a new checkpoint; 0 = wait for the final one
  double poll_s = 0.05;       // how often the directory is looked at
};

struct WatchSummary {
  std::vector<CheckpointEvaluation> evaluated;
  std::vector<std::pair<std::string, std::string>> skipped;  // (name, why)
  bool saw_final = false;      // stopped after the final checkpoint
  bool idle_timed_out = false; // stopped after idle_timeout_s
};

// The sidecar evaluator. Follows DIR/history.jsonl (CheckpointHistory): every
// checkpoint completed there, including those written before the watch
// started, is evaluated in the order written, or reported as skipped with
// the reason when it cannot be (pruned by checkpoint.keep before its turn,
// deleted or damaged under the evaluator). Returns after evaluating a final
// checkpoint (the one training writes at its end), or after idle_timeout_s
// without a new one. on_evaluated / on_skipped (may be empty) are called as
// it goes, on the calling thread.
absl::StatusOr<WatchSummary> WatchCheckpoints(
    Job& job, const Dataset& data, const WatchOptions& options,
    const std::function<void(const CheckpointEvaluation&)>& on_evaluated,
    const std::function<void(const std::string& name, const std::string& why)>& on_skipped);

// Reads the images of an IDX file ("...-images-idx3-ubyte[.gz]") as a data
// set without labels, for prediction. `features` > 0 is checked.
absl::StatusOr<Dataset> LoadImagesForPrediction(const std::string& path, int64_t features);

}  // namespace shardwild
