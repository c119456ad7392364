#include "workers/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "core/io/crc32c.h"
#include "core/model/partitioner.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "core/base/status.h"
#include "workers/checkpoint.h"
#include "workers/job.h"
#include "workers/progress.h"
#include "tests/workers/test_config.h"

namespace shardwild {
namespace {

using testdata::HaveFashionMnist;
using testdata::LoadDefaultConfig;
using testdata::TempDir;

bool IsPermutation(const std::vector<int32_t>& order, int64_t n) {
  if (static_cast<int64_t>(order.size()) != n) return false;
  std::vector<int32_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < n; ++i) {
    if (sorted[i] != i) return false;
  }
  return true;
}

TEST(EpochOrderTest, IsAPermutation) {
  for (int64_t n : {0, 1, 2, 7, 1000, 60000}) {
    EXPECT_TRUE(IsPermutation(EpochOrder(n, /*seed=*/1, /*epoch=*/1), n)) << "n=" << n;
    EXPECT_TRUE(IsPermutation(EpochOrder(n, /*seed=*/12345, /*epoch=*/9), n)) << "n=" << n;
  }
}

TEST(EpochOrderTest, DeterministicForSeedAndEpoch) {
  EXPECT_EQ(EpochOrder(5000, 7, 3), EpochOrder(5000, 7, 3));
  EXPECT_EQ(EpochOrder(5000, 1, 1), EpochOrder(5000, 1, 1));
}

TEST(EpochOrderTest, DiffersBetweenEpochsAndSeeds) {
  const std::vector<int32_t> e1 = EpochOrder(5000, 1, 1);
  const std::vector<int32_t> e2 = EpochOrder(5000, 1, 2);
  const std::vector<int32_t> s2 = EpochOrder(5000, 2, 1);
  EXPECT_NE(e1, e2);
  EXPECT_NE(e1, s2);
  // Actually shuffled, not the identity or nearly so.
  std::vector<int32_t> identity(5000);
  std::iota(identity.begin(), identity.end(), 0);
  int64_t fixed = 0;
  for (int64_t i = 0; i < 5000; ++i) fixed += e1[i] == identity[i];
  EXPECT_LT(fixed, 50);
}

// 6000 records, 2 epochs, 2 workers, 3 shards (more shards than NUMA nodes,
// so each variable is split three ways).
TEST(TrainerTest, ShortRealRun) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  constexpr int kEpochs = 2;
  constexpr int64_t kRecords = 6000;
  constexpr int64_t kTestRecords = 2000;
  absl::StatusOr<Config> config =
      LoadDefaultConfig({"data.max_train_records=6000", "data.max_test_records=2000", "train.epochs=2",
                         "train.workers=2", "ps.shards=3"});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(*config);
  ASSERT_TRUE(job.ok()) << job.status();
  Job& j = **job;
  ASSERT_EQ(j.num_workers(), 2);
  ASSERT_EQ(j.train().count, kRecords);
  ASSERT_NE(j.test(), nullptr);
  ASSERT_EQ(j.test()->count, kTestRecords);
  EXPECT_EQ(j.store().layout().num_shards, 3);
  EXPECT_EQ(j.store().version(), 0u);

  ProgressReporter silent = ProgressReporter::Silent();
  absl::StatusOr<TrainSummary> s = RunTraining(j, silent);
  ASSERT_TRUE(s.ok()) << s.status();

  const int64_t batch = config->train.batch_size;
  const int64_t steps_per_epoch = testdata::TaskStepsPerEpoch(kRecords, config->data.records_per_task, batch);
  EXPECT_EQ(steps_per_epoch, 5 * 8 + 7);  // tasks of 1024 records (the last 880), batch 128
  EXPECT_EQ(s->epochs, kEpochs);
  EXPECT_EQ(s->workers, 2);
  EXPECT_EQ(s->shards, 3);
  EXPECT_GE(s->intra_op_threads, 1);
  EXPECT_EQ(s->records_seen, kEpochs * kRecords);
  EXPECT_EQ(s->steps, kEpochs * steps_per_epoch);
  EXPECT_EQ(s->model_version, static_cast<uint64_t>(s->steps)) << "one push per step";
  EXPECT_EQ(j.store().version(), s->model_version);
  EXPECT_EQ(s->store_name, j.store().name());
  EXPECT_GT(s->store_bytes, 0u);
  EXPECT_GT(s->samples_per_s, 0);
  EXPECT_GT(s->wall_s, 0);

  ASSERT_EQ(s->history.size(), static_cast<size_t>(kEpochs));
  for (int e = 0; e < kEpochs; ++e) {
    const EpochResult& r = s->history[e];
    EXPECT_EQ(r.epoch, e + 1);
    EXPECT_EQ(r.records, kRecords);
    EXPECT_TRUE(std::isfinite(r.train_loss));
    EXPECT_GT(r.train_accuracy, 0.1);
    ASSERT_TRUE(r.test_accuracy.has_value());
    ASSERT_TRUE(r.test_loss.has_value());
  }
  // Learning happened: the loss falls and the model is far above chance (0.1).
  // A correct run gets 0.78-0.79 test accuracy here (seeds 1-3); a broken
  // gradient or optimizer stays near 0.1.
  const double first_loss = s->history.front().train_loss;
  const double last_loss = s->history.back().train_loss;
  EXPECT_LT(last_loss, first_loss);
  EXPECT_LT(last_loss, 1.0);
  EXPECT_DOUBLE_EQ(s->train_loss, last_loss);
  ASSERT_TRUE(s->test_accuracy.has_value());
  EXPECT_GE(*s->test_accuracy, 0.70);
  EXPECT_LT(*s->test_loss, 1.0);

  // Evaluating again with the final parameters gives the summary's numbers.
  absl::StatusOr<EvalResult> ev = EvaluateAll(j, *j.test());
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_EQ(ev->count, kTestRecords);
  EXPECT_DOUBLE_EQ(static_cast<double>(ev->correct) / ev->count, *s->test_accuracy);
  EXPECT_NEAR(ev->loss_sum / ev->count, *s->test_loss, 1e-9);
}

// On a synthetic two-node machine nothing is pinned or bound, but the
// placement is planned for it: shards alternate between the nodes.
TEST(TrainerTest, RunsOnSyntheticTwoNodeTopology) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  absl::StatusOr<Config> config = LoadDefaultConfig(
      {"data.max_train_records=1000", "data.max_test_records=500", "train.epochs=1", "train.workers=2",
       "train.intra_op_threads=1", "ps.shards=auto", "topology.synthetic=pack:2 numa:1 core:1 pu:1"});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(*config);
  ASSERT_TRUE(job.ok()) << job.status();
  Job& j = **job;
  EXPECT_FALSE(j.topology().is_this_system());
  EXPECT_EQ(j.placement().num_shards, 2);
  EXPECT_EQ(j.placement().workers[0].node, 0);
  EXPECT_EQ(j.placement().workers[1].node, 1);
  EXPECT_EQ(j.store().layout().shard_nodes, (std::vector<int>{0, 1}));

  ProgressReporter silent = ProgressReporter::Silent();
  absl::StatusOr<TrainSummary> s = RunTraining(j, silent);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->records_seen, 1000);
  EXPECT_EQ(s->steps, testdata::TaskStepsPerEpoch(1000, config->data.records_per_task, config->train.batch_size));
  EXPECT_EQ(s->model_version, static_cast<uint64_t>(s->steps));
  ASSERT_TRUE(s->test_accuracy.has_value());
  EXPECT_GT(*s->test_accuracy, 0.3);
}

TEST(TrainerTest, BatchSizeZeroIsRejected) {
  absl::StatusOr<Config> config = LoadDefaultConfig({"train.batch_size=0"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  EXPECT_NE(config.status().message().find("train.batch_size"), absl::string_view::npos) << config.status();

  // A Config built by hand is validated by Job::Create before anything is loaded.
  absl::StatusOr<Config> good = LoadDefaultConfig({});
  ASSERT_TRUE(good.ok()) << good.status();
  Config bad = *good;
  bad.train.batch_size = 0;
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(bad);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
  EXPECT_NE(job.status().message().find("train.batch_size"), absl::string_view::npos) << job.status();
}

TEST(TrainerTest, MissingDataIsNotFound) {
  absl::StatusOr<Config> config =
      LoadDefaultConfig({"data.train=/nonexistent/shardwild/train", "data.test=", "train.workers=1"});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(*config);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound) << job.status();
  EXPECT_NE(job.status().message().find("/nonexistent/shardwild/train"), absl::string_view::npos) << job.status();
}

// metrics.jsonl and metrics.tensorboard: one JSON line per progress
// interval and per epoch's evaluation; TensorBoard records whose framing and
// CRCs verify and that carry the eval scalars.
TEST(TrainerTest, WritesMetricsJsonlAndTensorBoardEvents) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  TempDir scratch;
  const std::string dir = scratch.path();
  absl::StatusOr<Config> config =
      LoadDefaultConfig({"data.max_train_records=6000", "data.max_test_records=1000", "train.epochs=2",
                         "train.workers=2", "train.log_every_s=0.001", "metrics.jsonl=" + dir + "/metrics.jsonl",
                         "metrics.tensorboard=" + dir + "/tb"});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(*config);
  ASSERT_TRUE(job.ok()) << job.status();
  ProgressReporter silent = ProgressReporter::Silent();
  absl::StatusOr<TrainSummary> s = RunTraining(**job, silent);
  ASSERT_TRUE(s.ok()) << s.status();

  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  int train_lines = 0;
  std::vector<nlohmann::json> evals;
  int64_t last_step = -1;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << line;
    ASSERT_TRUE(j.contains("time") && j.contains("step") && j.contains("kind")) << line;
    EXPECT_GE(j["step"].get<int64_t>(), last_step) << "steps never go back";
    last_step = j["step"].get<int64_t>();
    if (j["kind"] == "train") {
      ++train_lines;
      EXPECT_GT(j["loss"].get<double>(), 0) << line;
    } else {
      ASSERT_EQ(j["kind"], "eval") << line;
      evals.push_back(j);
    }
  }
  EXPECT_GT(train_lines, 0);
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(evals[1]["epoch"], 2);
  EXPECT_DOUBLE_EQ(evals[1]["test_accuracy"].get<double>(), *s->test_accuracy);
  EXPECT_EQ(evals[1]["step"].get<int64_t>(), s->steps);

  // The event file: TFRecord framing (length, masked CRC of the length,
  // data, masked CRC of the data) all the way through.
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/tb")) files.push_back(e.path().string());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(files[0].find("events.out.tfevents."), std::string::npos);
  std::ifstream ev(files[0], std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(ev)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  int records = 0, eval_accuracy_records = 0;
  while (pos < bytes.size()) {
    ASSERT_LE(pos + 12, bytes.size());
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, bytes.data() + pos, 8);
    std::memcpy(&len_crc, bytes.data() + pos + 8, 4);
    ASSERT_EQ(len_crc, MaskCrc32c(Crc32c(bytes.data() + pos, 8))) << "record " << records;
    ASSERT_LE(pos + 12 + len + 4, bytes.size());
    const std::string data = bytes.substr(pos + 12, len);
    std::memcpy(&data_crc, bytes.data() + pos + 12 + len, 4);
    ASSERT_EQ(data_crc, MaskCrc32c(Crc32c(data.data(), data.size()))) << "record " << records;
    if (data.find("eval/accuracy") != std::string::npos) ++eval_accuracy_records;
    pos += 12 + len + 4;
    ++records;
  }
  EXPECT_GT(records, 3);  // the file version, train scalars, two evaluations
  EXPECT_EQ(eval_accuracy_records, 2);
}

absl::StatusOr<TrainSummary> TrainWith(const std::vector<std::string>& sets) {
  SW_ASSIGN_OR_RETURN(Config config, LoadDefaultConfig(sets));
  SW_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Job::Create(config));
  ProgressReporter silent = ProgressReporter::Silent();
  return RunTraining(*job, silent);
}

// eval.every_steps evaluates between tasks, besides the epoch ends; every
// evaluation sees every test record once. eval.sidecar leaves it all out.
TEST(TrainerTest, InlineEvaluationEveryStepsAndSidecar) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  // 3000 records in tasks of 1024, 1024 and 952 (8 steps of batch 128 each),
  // 2 workers: every 5 steps of each worker is every 10 steps over both, at
  // the first task boundary at or after each multiple. Epoch 1: both first
  // tasks end at 16 (evaluate), the third at 24 (the epoch's end, due at
  // 20: one evaluation); epoch 2: 32, 40 and the end at 48. Five in all.
  TempDir metrics_dir;
  const std::string metrics = metrics_dir.path() + "/m.jsonl";
  absl::StatusOr<TrainSummary> s =
      TrainWith({"data.max_train_records=3000", "data.max_test_records=700", "train.epochs=2", "train.workers=2",
                 "eval.every_steps=5", "metrics.jsonl=" + metrics});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->eval_records_seen, 5 * 700);
  std::vector<int64_t> eval_steps;
  {
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("kind", "") == "eval" && j.contains("test_loss")) eval_steps.push_back(j["step"].get<int64_t>());
    }
  }
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{16, 24, 32, 40, 48}));
  EXPECT_EQ(s->records_seen, 2 * 3000);
  ASSERT_TRUE(s->test_accuracy.has_value());

  // eval.every_epochs: 2 of 3 epochs -> epoch 2 and the last.
  s = TrainWith({"data.max_train_records=3000", "data.max_test_records=700", "train.epochs=3", "train.workers=2",
                 "eval.every_epochs=2"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->eval_records_seen, 2 * 700);
  EXPECT_FALSE(s->history[0].test_accuracy.has_value());
  EXPECT_TRUE(s->history[1].test_accuracy.has_value());

  TempDir scratch;
  const std::string dir = scratch.path();
  s = TrainWith({"data.max_train_records=3000", "data.max_test_records=700", "train.epochs=1", "train.workers=2",
                 "eval.sidecar=true", "checkpoint.dir=" + dir});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->eval_records_seen, 0);
  EXPECT_FALSE(s->test_accuracy.has_value());
  EXPECT_EQ(s->checkpoints_written, 1);
  // A sidecar needs checkpoints to read.
  absl::StatusOr<Config> bad = LoadDefaultConfig({"eval.sidecar=true"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("eval.sidecar"), absl::string_view::npos) << bad.status();
}

// early_stopping: a test accuracy that must improve by more than 1 never
// does after the first evaluation, so with patience 1 training stops after
// epoch 2 of 5; the final checkpoint says so and a restart trains no more.
TEST(TrainerTest, EarlyStoppingStopsAndStaysStopped) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  TempDir scratch;
  const std::string dir = scratch.path();
  const std::vector<std::string> sets = {"data.max_train_records=3000", "data.max_test_records=500",
                                         "train.epochs=5", "train.workers=2",
                                         "early_stopping.monitor=test_accuracy", "early_stopping.min_delta=1",
                                         "early_stopping.patience=1", "checkpoint.dir=" + dir};
  absl::StatusOr<TrainSummary> s = TrainWith(sets);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->stopped_early_at_epoch.has_value());
  EXPECT_EQ(*s->stopped_early_at_epoch, 2);
  EXPECT_EQ(s->history.size(), 2u);
  EXPECT_EQ(s->records_seen, 2 * 3000);
  absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(dir);
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_TRUE((*found)->state.extra.value("final", false));
  EXPECT_EQ((*found)->state.extra["early_stopping"]["stopped"], true);
  absl::StatusOr<TrainSummary> again = TrainWith(sets);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->history.empty());
  EXPECT_EQ(again->records_seen, 2 * 3000);
  // Without the impossible min_delta it trains all 5 epochs.
  absl::StatusOr<TrainSummary> full =
      TrainWith({"data.max_train_records=3000", "data.max_test_records=500", "train.epochs=5", "train.workers=2",
                 "early_stopping.monitor=train_loss", "early_stopping.patience=3"});
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_FALSE(full->stopped_early_at_epoch.has_value());
  EXPECT_EQ(full->history.size(), 5u);
}

absl::StatusOr<TrainSummary> TrainWithOptions(const std::vector<std::string>& sets, const TrainRunOptions& options) {
  SW_ASSIGN_OR_RETURN(Config config, LoadDefaultConfig(sets));
  SW_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Job::Create(config));
  ProgressReporter silent = ProgressReporter::Silent();
  return RunTraining(*job, silent, options);
}

// TrainRunOptions::on_metrics (the Python API's callbacks): it sees every
// progress interval and epoch end; false at the first progress interval
// ends the epoch early and the run, as early stopping does, in the task
// loop (hogwild) and in lockstep rounds (sync); an error ends the run.
TEST(TrainerTest, OnMetricsSeesTheRunAndStopsIt) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  for (const char* update : {"hogwild", "sync"}) {
    SCOPED_TRACE(update);
    const std::vector<std::string> sets = {"data.max_train_records=20000", "data.max_test_records=500",
                                           "train.epochs=3", "train.workers=2", "train.log_every_s=0.001",
                                           std::string("ps.update=") + update};
    std::vector<nlohmann::json> seen;
    TrainRunOptions all;
    all.on_metrics = [&](const nlohmann::json& m) -> absl::StatusOr<bool> {
      seen.push_back(m);
      return true;
    };
    absl::StatusOr<TrainSummary> s = TrainWithOptions({"data.max_train_records=3000", "data.max_test_records=500",
                                                       "train.epochs=2", "train.workers=2",
                                                       std::string("ps.update=") + update},
                                                      all);
    ASSERT_TRUE(s.ok()) << s.status();
    std::vector<int> epochs;
    for (const nlohmann::json& m : seen) {
      if (m["event"] == "epoch") epochs.push_back(m["epoch"].get<int>());
    }
    EXPECT_EQ(epochs, (std::vector<int>{1, 2}));
    EXPECT_EQ(seen.back()["test_accuracy"].get<double>(), *s->test_accuracy);
    EXPECT_EQ(seen.back()["records"].get<int64_t>(), 3000);

    TrainRunOptions stop;
    int calls = 0;
    stop.on_metrics = [&](const nlohmann::json& m) -> absl::StatusOr<bool> {
      ++calls;
      return m["event"] != "progress";
    };
    s = TrainWithOptions(sets, stop);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE(s->stopped_early_at_epoch.has_value());
    EXPECT_EQ(*s->stopped_early_at_epoch, 1);
    ASSERT_EQ(s->history.size(), 1u);
    EXPECT_GT(s->history[0].records, 0);
    EXPECT_LT(s->history[0].records, 20000);
    EXPECT_LE(calls, 2);  // the progress interval that stopped it, and the epoch's end

    TrainRunOptions fail;
    fail.on_metrics = [](const nlohmann::json&) -> absl::StatusOr<bool> {
      return absl::CancelledError("the observer failed");
    };
    s = TrainWithOptions(sets, fail);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().message(), "the observer failed");
  }
}

// TrainRunOptions::interrupt, set from another thread while the workers
// train: the run stops between steps and returns Cancelled, in every loop.
TEST(TrainerTest, InterruptStopsTheRunBetweenSteps) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  for (const char* update : {"hogwild", "sync"}) {
    SCOPED_TRACE(update);
    std::atomic<bool> interrupt{false};
    TrainRunOptions options;
    options.interrupt = &interrupt;
    std::atomic<int> progress_calls{0};
    options.on_metrics = [&](const nlohmann::json& m) -> absl::StatusOr<bool> {
      if (m["event"] == "progress") progress_calls.fetch_add(1);
      return true;
    };
    std::thread interrupter([&] {
      while (progress_calls.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      interrupt.store(true);
    });
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<TrainSummary> s = TrainWithOptions(
        {"train.epochs=50", "train.workers=2", "train.log_every_s=0.01", std::string("ps.update=") + update}, options);
    interrupter.join();
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kCancelled) << s.status();
    // 50 epochs would take minutes; the interrupt ends it within moments.
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 60.0);
  }
}

}  // namespace
}  // namespace shardwild
