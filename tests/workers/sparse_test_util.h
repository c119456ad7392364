// Helpers of the sparse-model training tests: configs from configs/ with
// overrides, generated data, training, summary metrics.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config/config.h"
#include "core/data/data_gen.h"
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

// A small binary-head data set with two sparse fields "a" and "b" of 1-3
// ids per record (ids in [0, id_range), repeated across and within batches)
// and 4 dense features.
inline Dataset TwoFieldSparseData(int64_t count, uint64_t id_range) {
  Dataset data;
  data.count = count;
  data.dense_dim = 4;
  data.num_classes = 2;
  for (int64_t i = 0; i < count * data.dense_dim; ++i) data.dense.push_back(static_cast<float>(i % 17) / 17.0f);
  for (int64_t i = 0; i < count; ++i) data.labels.push_back(static_cast<int32_t>((i * 7) % 3 == 0));
  for (const char* name : {"a", "b"}) {
    SparseField f;
    f.name = name;
    f.offsets.push_back(0);
    for (int64_t r = 0; r < count; ++r) {
      for (int64_t k = 0; k < 1 + r % 3; ++k) {
        f.ids.push_back(static_cast<uint64_t>(r * 7919 + k * 104729) % id_range);
      }
      f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
    }
    data.fields.push_back(f);
  }
  return data;
}

// Over TwoFieldSparseData: "a" through static table "ta" (pooled as
// `a_pooling`) and as a wide lookup, "b" through dynamic table "tb" (mean),
// a dot interaction, towers on both sides.
inline ModelOptions TwoTableDotModel(Pooling a_pooling) {
  ModelOptions model;
  model.head = HeadType::kBinary;
  model.bottom = {{"dense", 8, Activation::kRelu}};
  model.tables = {{"ta", 1000, 8, false, false, 0.1f}, {"tb", 4096, 8, true, false, 0.1f}};
  model.sparse = {{"a", "ta", a_pooling, true}, {"b", "tb", Pooling::kMean, true}};
  model.interaction = Interaction::kDot;
  model.layers = {{"dense", 8, Activation::kRelu}, {"dense", 1, Activation::kNone}};
  model.wide = {"a"};
  model.wide_rows = 100;
  return model;
}

inline double Metric(const TrainSummary& s, const std::string& name) {
  for (const auto& [k, v] : s.test_metrics) {
    if (k == name) return v;
  }
  ADD_FAILURE() << "no " << name << " in the summary";
  return NAN;
}

}  // namespace shardwild::testdata
