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

}  // namespace shardwild
