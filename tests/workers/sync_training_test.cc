// ps.update sync on the real Fashion-MNIST files: two runs with the same seed
// give bit-identical parameters and the same losses. Skips when the data is
// absent.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "core/model/partitioner.h"
#include "gtest/gtest.h"
#include "tests/workers/test_config.h"
#include "workers/job.h"
#include "workers/progress.h"
#include "workers/trainer.h"

namespace shardwild {
namespace {

using testdata::HaveFashionMnist;
using testdata::LoadDefaultConfig;

struct RunResult {
  TrainSummary summary;
  std::vector<std::vector<float>> params;  // every variable, pulled after training
  std::vector<int64_t> pulls;              // per worker
  uint64_t rounds = 0;
};

void TrainOnce(const std::vector<std::string>& sets, RunResult* out) {
  absl::StatusOr<Config> config = LoadDefaultConfig(sets);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(*config);
  ASSERT_TRUE(job.ok()) << job.status();
  Job& j = **job;
  ASSERT_NE(j.sync(), nullptr);
  ProgressReporter silent = ProgressReporter::Silent();
  absl::StatusOr<TrainSummary> s = RunTraining(j, silent);
  ASSERT_TRUE(s.ok()) << s.status();
  out->summary = *s;
  const StoreLayout& layout = j.store().layout();
  for (int v = 0; v < static_cast<int>(layout.variables.size()); ++v) {
    out->params.emplace_back(layout.variables[v].size());
    ASSERT_TRUE(j.store().PullVariable(v, out->params.back().data()).ok());
  }
  for (int i = 0; i < j.num_workers(); ++i) out->pulls.push_back(j.worker(i).counters().pulls.load());
  out->rounds = j.sync()->rounds();
}

// Steps of each worker in one epoch: ceil(part / batch).
std::vector<int64_t> WorkerSteps(int64_t records, int workers, int64_t batch) {
  std::vector<int64_t> steps;
  for (const RowRange& r : FixedShardsDiv(records, workers)) steps.push_back((r.size() + batch - 1) / batch);
  return steps;
}

TEST(SyncTrainingTest, SameSeedGivesBitIdenticalParameters) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  const std::vector<std::string> sets = {"data.max_train_records=3000", "data.max_test_records=2000",
                                         "train.epochs=1",              "train.workers=2",
                                         "ps.shards=2",                 "ps.update=sync",
                                         "train.pull_every=4"};  // ignored in sync mode
  RunResult a, b;
  ASSERT_NO_FATAL_FAILURE(TrainOnce(sets, &a));
  ASSERT_NO_FATAL_FAILURE(TrainOnce(sets, &b));

  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t v = 0; v < a.params.size(); ++v) {
    ASSERT_EQ(a.params[v].size(), b.params[v].size());
    EXPECT_EQ(0, std::memcmp(a.params[v].data(), b.params[v].data(), a.params[v].size() * sizeof(float)))
        << "variable " << v << " differs between two runs with the same seed";
  }
  EXPECT_EQ(a.summary.train_loss, b.summary.train_loss);  // exact, not near
  ASSERT_TRUE(a.summary.test_loss.has_value() && b.summary.test_loss.has_value());
  EXPECT_EQ(*a.summary.test_loss, *b.summary.test_loss);
  EXPECT_EQ(*a.summary.test_accuracy, *b.summary.test_accuracy);

  // Every record seen once; one push per round (step), every step pulled.
  const std::vector<int64_t> steps = WorkerSteps(3000, 2, 128);  // 12 and 12
  EXPECT_EQ(a.summary.records_seen, 3000);
  EXPECT_EQ(a.summary.steps, steps[0] + steps[1]);
  EXPECT_EQ(a.rounds, static_cast<uint64_t>(steps[0]));
  EXPECT_EQ(a.summary.model_version, a.rounds);
  EXPECT_EQ(a.pulls, steps);
  // It learns: 12 averaged Adam steps on a batch of 2 x 128 take this MLP far
  // above chance (0.1).
  EXPECT_TRUE(std::isfinite(a.summary.train_loss));
  EXPECT_GE(*a.summary.test_accuracy, 0.55);
}

// Parts that straddle a batch boundary: worker 0 runs one step more than
// worker 1, which leaves the barrier group (arrive-and-drop) for the last
// round of each epoch. Still deterministic, and every record is seen.
TEST(SyncTrainingTest, UnevenPartsDropOutAndStayDeterministic) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  const std::vector<std::string> sets = {"data.max_train_records=2561", "data.test=", "train.epochs=2",
                                         "train.workers=2", "ps.shards=1", "ps.update=sync"};
  const std::vector<int64_t> steps = WorkerSteps(2561, 2, 128);
  ASSERT_EQ(steps, (std::vector<int64_t>{11, 10}));
  RunResult a, b;
  ASSERT_NO_FATAL_FAILURE(TrainOnce(sets, &a));
  ASSERT_NO_FATAL_FAILURE(TrainOnce(sets, &b));
  EXPECT_EQ(a.summary.records_seen, 2 * 2561);
  EXPECT_EQ(a.summary.steps, 2 * (11 + 10));
  EXPECT_EQ(a.rounds, 2u * 11);
  EXPECT_EQ(a.summary.model_version, 2u * 11);
  ASSERT_EQ(a.summary.history.size(), 2u);
  EXPECT_EQ(a.summary.history[0].records, 2561);
  EXPECT_EQ(a.summary.history[1].records, 2561);
  EXPECT_LT(a.summary.history[1].train_loss, a.summary.history[0].train_loss);
  for (size_t v = 0; v < a.params.size(); ++v) {
    EXPECT_EQ(0, std::memcmp(a.params[v].data(), b.params[v].data(), a.params[v].size() * sizeof(float)))
        << "variable " << v;
  }
  EXPECT_EQ(a.summary.train_loss, b.summary.train_loss);
}

}  // namespace
}  // namespace shardwild
