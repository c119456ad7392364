// Helpers of the sparse-model training tests: configs from configs/ with
// overrides, generated data, training, summary metrics.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/data_gen.h"
#include "gtest/gtest.h"
#include "workers/job.h"
#include "workers/progress.h"
#include "workers/trainer.h"

namespace shardwild::testdata {

inline std::string ConfigPath(const std::string& name) { return absl::StrCat(SHARDWILD_SOURCE_DIR, "/configs/", name); }

inline absl::StatusOr<Config> Load(const std::string& name, const std::vector<std::string>& sets) {
  std::vector<ConfigOverride> overrides;
  for (const std::string& s : sets) {
    absl::StatusOr<ConfigOverride> o = ParseOverride(s);
    if (!o.ok()) return o.status();
    overrides.push_back(*o);
  }
  return LoadConfig(ConfigPath(name), overrides);
}

// Writes `rows` generated records of `kind` to dir/name; returns the planted model's metric on them.
inline double Generate(const std::string& kind, int64_t rows, uint64_t seed, const std::string& path) {
  DataGenOptions o;
  o.kind = kind;
  o.rows = rows;
  o.out = path;
  o.seed = seed;
  absl::StatusOr<DataGenResult> r = GenerateData(o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->bayes_metric : NAN;
}

inline absl::StatusOr<TrainSummary> Train(const Config& config, TrainRunOptions run = {}) {
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(config);
  if (!job.ok()) return job.status();
  ProgressReporter progress = ProgressReporter::Silent();
  return RunTraining(**job, progress, run);
}

inline double Metric(const TrainSummary& s, const std::string& name) {
  for (const auto& [k, v] : s.test_metrics) {
    if (k == name) return v;
  }
  ADD_FAILURE() << "no " << name << " in the summary";
  return NAN;
}

}  // namespace shardwild::testdata
