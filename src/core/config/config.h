// YAML configuration loading into the Options structs (options.h).
//
// Errors name the file, the line and column, the dotted key, and what was
// expected, e.g.
//   configs/x.yaml:7:12: train.epochs: expected an integer >= 1, got 'ten'
// Unknown keys are errors (a typo must not be silently ignored).
//
// Keys that exist only in YAML: optimizer.decay_epochs and
// optimizer.warmup_epochs (also under optimizer.sparse) give the step period
// and the warmup in epochs; the loader stores decay_epochs / train.epochs in
// decay_every and warmup_epochs / train.epochs in warmup. Each excludes its
// fraction key; decay_epochs must be in (0, train.epochs], warmup_epochs in
// [0, train.epochs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config/options.h"

namespace shardwild {

// One `--set key=value` override. `key` is a dotted path; list items are
// addressed by index ("model.layers.1.units"). `value` is parsed as YAML, so
// "2", "auto", "0.01" and "[1, 2]" all work.
struct ConfigOverride {
  std::string key;
  std::string value;
};

// Parses "key=value" (as given to --set). InvalidArgument if there is no '='
// or the key is empty.
absl::StatusOr<ConfigOverride> ParseOverride(const std::string& text);

// Loads `path`, applies `overrides` in order, fills a Config and validates it.
// NotFound if the file does not exist; InvalidArgument for everything else.
absl::StatusOr<Config> LoadConfig(const std::string& path,
                                  const std::vector<ConfigOverride>& overrides = {});

// Same, from YAML text; `source_name` stands in for the file name in messages.
absl::StatusOr<Config> LoadConfigFromString(const std::string& yaml, const std::string& source_name,
                                            const std::vector<ConfigOverride>& overrides = {});

// How a store variable's values start (StoreSpec; core/model/variable.h's
// InitKind, which this layer cannot name).
enum class StoreVariableInit { kZeros, kGlorotUniform };

// One dense variable of a StoreSpec: `variables.<name>` given as its shape
// ([rows] or [rows, cols]) or as {shape: [...], init: zeros|glorot_uniform}.
struct StoreVariableOptions {
  std::string name;            // 1..63 bytes, unique
  std::vector<int64_t> shape;  // 1 or 2 dimensions, each >= 1; [rows] means cols 1
  StoreVariableInit init = StoreVariableInit::kZeros;
};

// A parameter store described on its own, without a model or data: what the
// Python API's Store.create(layout) builds. The keys are those of the
// config file where they exist there, read by the same parsers with the
// same messages:
//   variables:  {name: shape or {shape, init}}   (StoreVariableOptions)
//   tables:     a list as model.tables           (TableOptions)
//   optimizer:  as optimizer, with optimizer.sparse; only the update rule's
//               keys (type, lr, momentum, nesterov, beta1, beta2, epsilon,
//               initial_accumulator_value, rho, l1, l2): the learning-rate
//               schedule and loss_reduction belong to a training run
//   ps:         shards, update (hogwild or row_lock), job_name,
//               stale_segments, huge_pages, partitioner
//   seed:       the initial values' seed (train.seed)
// Unknown keys are errors naming the key; at least one variable or table
// is required.
struct StoreSpec {
  std::vector<StoreVariableOptions> variables;
  std::vector<TableOptions> tables;
  OptimizerOptions optimizer;
  std::optional<OptimizerOptions> sparse_optimizer;  // optimizer.sparse; unset = `optimizer` for tables too
  StoreOptions ps;
  uint64_t seed = 1;
};

// Reads a StoreSpec from YAML (or JSON) text and validates it. Messages
// start with `source_name` and, where `positions` is true, the line and
// column ("layout.yaml:3:7: tables[0].dim: expected an integer, got 'x'");
// text made from another structure (a Python dict serialised to JSON) gives
// positions = false, since they would mean nothing to its author
// ("layout: tables[0].dim: ..."). InvalidArgument, kind kConfig.
absl::StatusOr<StoreSpec> LoadStoreSpecFromString(const std::string& yaml, const std::string& source_name,
                                                  bool positions = true);

// A store spec's optimizer section on its own (the Python API's
// Store.attach(name, optimizer=...)): `yaml` holds what StoreSpec's
// `optimizer` key would, read and checked the same way, with the same
// messages (optimizer.*, optimizer.sparse.*).
struct StoreOptimizers {
  OptimizerOptions optimizer;
  std::optional<OptimizerOptions> sparse_optimizer;
};
absl::StatusOr<StoreOptimizers> LoadStoreOptimizersFromString(const std::string& yaml, const std::string& source_name,
                                                              bool positions = true);

}  // namespace shardwild
