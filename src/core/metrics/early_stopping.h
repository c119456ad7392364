// Early stopping after Keras's EarlyStopping callback: training stops when a
// monitored metric has not improved for `patience` evaluations in a row.
//
// Semantics (those of keras.callbacks.EarlyStopping with baseline=None,
// start_from_epoch=0). Evaluation i (0, 1, 2, ... in Update order) with value
// v is an improvement when
//   min mode:  v < best - min_delta
//   max mode:  v > best + min_delta
// where best starts at +inf (min) or -inf (max). NaN is never an
// improvement (every comparison with it is false). An improvement sets
// best = v, best_index = i and wait = 0; anything else adds 1 to wait, and
// Update returns true (stop) when wait >= patience and i > 0. So patience 0
// stops at the first evaluation that does not improve, patience 3 at the
// third in a row; the first evaluation never stops training.
//
// The state (best, best_index, wait, ...) goes to JSON and back, so it
// survives a checkpoint and resume.
//
// Thread safety: none; one thread (the trainer's) owns an EarlyStopping.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "core/config/options.h"

namespace shardwild {

class EarlyStopping {
 public:
  // `options` must be valid (EarlyStoppingOptions::Validate) and enabled.
  explicit EarlyStopping(const EarlyStoppingOptions& options);

  // Records the monitored value of the next evaluation. Returns true when
  // training should stop now (see above). Calls after a stop go on with the
  // same rule.
  bool Update(double value);

  // The best value so far; +inf (min) or -inf (max) before the first
  // improvement.
  double best() const { return best_; }
  // The index of the evaluation that gave best(); -1 before the first
  // improvement.
  int64_t best_index() const { return best_index_; }
  // Evaluations since the best (or since the start) without improvement.
  int wait() const { return wait_; }
  // How many values Update has seen.
  int64_t updates() const { return updates_; }
  // Whether the last Update returned true.
  bool stopped() const { return stopped_; }
  const std::string& monitor() const { return monitor_; }
  bool maximize() const { return maximize_; }

  // The state as a JSON object:
  //   {"monitor": "test_loss", "mode": "min", "best": 0.31, "best_index": 3,
  //    "wait": 1, "updates": 5, "stopped": false}
  // A non-finite best is written as the string "inf", "-inf" or "nan", since
  // JSON has no such numbers. min_delta and patience are options, not state.
  nlohmann::json ToJson() const;
  // Restores a state written by ToJson. InvalidArgument if `state` is not such
  // an object (nothing is changed then); FailedPrecondition if it is for
  // another monitor or mode than this object's options (the caller may start
  // afresh instead).
  absl::Status FromJson(const nlohmann::json& state);

 private:
  bool Improves(double value) const;

  // Constant after construction.
  std::string monitor_;
  bool maximize_;
  double min_delta_;
  int patience_;

  // State.
  double best_;
  int64_t best_index_ = -1;
  int wait_ = 0;
  int64_t updates_ = 0;
  bool stopped_ = false;
};

}  // namespace shardwild
