// train.pull_every and ps.max_staleness: when a worker refreshes its local
// copy of the parameters.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "core/model/model.h"
#include "core/config/options.h"
#include "gtest/gtest.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "ps_shm/shm_store.h"
#include "ps_shm/sync_aggregator.h"
#include "workers/task_workers.h"
#include "workers/worker.h"

namespace shardwild {
namespace {

// Forwards to a real store; after each push it pushes `extra` more zero
// gradients, standing in for other workers that push meanwhile (so the
// version moves deterministically by 1 + extra per step of this worker).
class NeighboursPushStore final : public ParamStore {
 public:
  NeighboursPushStore(ParamStore* base, int extra) : base_(base), extra_(extra) {
    for (const VariableSpec& v : base->layout().variables) zeros_.emplace_back(v.size(), 0.0f);
    for (size_t v = 0; v < zeros_.size(); ++v) zero_grads_.push_back({static_cast<int>(v), zeros_[v].data()});
  }
  const StoreLayout& layout() const override { return base_->layout(); }
  const std::string& name() const override { return base_->name(); }
  absl::Status Pull(absl::Span<const PullSlice> slices) override {
    ++pull_calls_;
    return base_->Pull(slices);
  }
  absl::Status Push(absl::Span<const DenseGrad> grads, float lr) override {
    absl::Status s = base_->Push(grads, lr);
    for (int i = 0; i < extra_ && s.ok(); ++i) s = base_->Push(zero_grads_, lr);
    return s;
  }
  uint64_t version() const override { return base_->version(); }
  int64_t pull_calls() const { return pull_calls_; }

 private:
  ParamStore* base_;
  int extra_;
  std::vector<std::vector<float>> zeros_;
  std::vector<DenseGrad> zero_grads_;
  int64_t pull_calls_ = 0;
};

class PullPolicyTest : public ::testing::Test {
 protected:
  static constexpr int64_t kBatch = 16;

  void SetUp() override {
    data_.count = 200;
    data_.dense_dim = 12;
    data_.num_classes = 3;
    data_.dense.resize(data_.count * data_.dense_dim);
    data_.labels.resize(data_.count);
    for (int64_t i = 0; i < data_.count * data_.dense_dim; ++i) data_.dense[i] = static_cast<float>((i * 37) % 101) / 101.0f;
    for (int64_t i = 0; i < data_.count; ++i) data_.labels[i] = static_cast<int32_t>(i % 3);
    model_.layers = {{"dense", 8, Activation::kRelu}, {"dense", 3, Activation::kNone}};
    order_.resize(data_.count);
    for (int64_t i = 0; i < data_.count; ++i) order_[i] = static_cast<int32_t>(i);
    opt_.type = OptimizerType::kSgd;
    opt_.lr = 0.01f;
    absl::StatusOr<std::vector<VariableSpec>> vars = Model::Variables(model_, DataShape::Of(data_));
    ASSERT_TRUE(vars.ok()) << vars.status();
    OpenStoreOptions so;
    so.store.job_name = "swtest-pull";
    so.optimizer = opt_;
    so.num_shards = 2;
    absl::StatusOr<std::unique_ptr<ShmParamStore>> store = ShmParamStore::Create(so, *vars);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  std::unique_ptr<Worker> MakeWorker(ParamStore* store, const WorkerUpdateOptions& update) {
    absl::StatusOr<std::unique_ptr<Worker>> w = Worker::Create(0, model_, kBatch, data_, store, engine_);
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return nullptr;
    (*w)->set_update_options(update);
    return *std::move(w);
  }

  // Runs the task `line` on a task runner of this fixture's model over
  // `store`, with `heartbeat`: its reply (TaskRunner::Run).
  std::optional<std::string> RunTask(ParamStore* store, const std::string& line,
                                     const std::function<bool()>& heartbeat) {
    std::unique_ptr<Worker> w = MakeWorker(store, WorkerUpdateOptions{});
    EXPECT_NE(w, nullptr);
    if (!w) return std::nullopt;
    Config config;
    config.train.batch_size = kBatch;
    config.optimizer = opt_;
    TaskRunner runner(config, *w, data_, nullptr);
    return runner.Run(line, heartbeat);
  }

  // Trains `records` records in one Train call (ceil(records / batch) steps).
  absl::Status TrainRecords(Worker& w, int64_t records) {
    return w.Train(order_.data(), records, /*max_steps=*/-1, opt_, 0, 1, nullptr);
  }

  Dataset data_;
  ModelOptions model_;
  OptimizerOptions opt_;
  std::vector<int32_t> order_;
  std::unique_ptr<ShmParamStore> store_;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
};

TEST_F(PullPolicyTest, PullsEveryKStepsWithoutAStalenessBound) {
  // 10 steps (the last batch padded): ceil(10 / k) pulls.
  const int64_t records = 9 * kBatch + 5;
  for (int k : {1, 2, 3, 4, 7, 10, 50}) {
    WorkerUpdateOptions u;
    u.pull_every = k;
    NeighboursPushStore store(store_.get(), /*extra=*/3);  // others push a lot; no bound, so no matter
    std::unique_ptr<Worker> w = MakeWorker(&store, u);
    ASSERT_NE(w, nullptr);
    ASSERT_TRUE(TrainRecords(*w, records).ok());
    EXPECT_EQ(w->counters().steps.load(), 10);
    EXPECT_EQ(w->counters().pulls.load(), (10 + k - 1) / k) << "pull_every " << k;
    EXPECT_EQ(store.pull_calls(), (10 + k - 1) / k) << "pull_every " << k;
    // A second Train call (the next epoch) starts with a pull again.
    ASSERT_TRUE(TrainRecords(*w, 3 * kBatch).ok());
    EXPECT_EQ(w->counters().pulls.load(), (10 + k - 1) / k + (3 + k - 1) / k) << "pull_every " << k;
  }
}

TEST_F(PullPolicyTest, UntimedStepsTrainButAreNotTimed) {
  // 10 steps, a pull every 3 (steps 0, 3, 6 and 9), the first 4 not timed:
  // all train and push; the times hold steps 4..9 and their 2 pulls.
  WorkerUpdateOptions u;
  u.pull_every = 3;
  std::unique_ptr<Worker> w = MakeWorker(store_.get(), u);
  ASSERT_NE(w, nullptr);
  EXPECT_FALSE(w->timed_start().has_value());
  PhaseTimes times;
  const uint64_t version = store_->version();
  const auto before = std::chrono::steady_clock::now();
  ASSERT_TRUE(w->Train(order_.data(), data_.count, /*max_steps=*/10, opt_, 0, 0, &times, /*untimed_steps=*/4).ok());
  const auto after = std::chrono::steady_clock::now();
  EXPECT_EQ(w->counters().steps.load(), 10);
  EXPECT_EQ(w->counters().pulls.load(), 4);
  EXPECT_EQ(store_->version(), version + 10);
  EXPECT_EQ(times.steps, 6);
  EXPECT_EQ(times.pulls, 2);
  EXPECT_EQ(times.rows, 0);  // no tables
  EXPECT_GT(times.forward, 0);
  ASSERT_TRUE(w->timed_start().has_value());
  EXPECT_GT(*w->timed_start(), before);
  EXPECT_LT(*w->timed_start(), after);
  // None untimed: all 10 timed, from the call's first step; the times add up.
  ASSERT_TRUE(w->Train(order_.data(), data_.count, /*max_steps=*/10, opt_, 0, 0, &times).ok());
  EXPECT_EQ(times.steps, 16);
  EXPECT_EQ(times.pulls, 2 + 4);
  EXPECT_GT(*w->timed_start(), after);
  // A call of no more steps than its untimed ones adds nothing and has no
  // timed start.
  const PhaseTimes kept = times;
  ASSERT_TRUE(w->Train(order_.data(), data_.count, /*max_steps=*/3, opt_, 0, 0, &times, /*untimed_steps=*/3).ok());
  EXPECT_EQ(w->counters().steps.load(), 23);
  EXPECT_EQ(times.steps, kept.steps);
  EXPECT_EQ(times.total(), kept.total());
  EXPECT_FALSE(w->timed_start().has_value());
}

TEST_F(PullPolicyTest, StalenessBoundForcesPulls) {
  const int64_t records = 10 * kBatch;  // 10 steps
  struct Case {
    int extra;              // other workers' pushes per step of this one
    int64_t max_staleness;
    int64_t want_pulls;
  };
  // The version moves by 1 + extra per step. After the pull of step s the
  // copy is (steps since) * (1 + extra) pushes behind; a step pulls when that
  // is more than max_staleness.
  const Case cases[] = {
      {2, 2, 10},   // 3 > 2 after every step: every step pulls
      {2, 5, 5},    // 3 <= 5, 6 > 5: every second step
      {2, 8, 4},    // 9 > 8: every third step -> steps 0,3,6,9
      {0, 1, 5},    // only its own pushes: 2 > 1 every second step
      {4, 0, 1},    // 0 = unbounded: only the pull_every pull of step 0
  };
  for (const Case& c : cases) {
    WorkerUpdateOptions u;
    u.pull_every = 100;
    u.max_staleness = c.max_staleness;
    NeighboursPushStore store(store_.get(), c.extra);
    std::unique_ptr<Worker> w = MakeWorker(&store, u);
    ASSERT_NE(w, nullptr);
    ASSERT_TRUE(TrainRecords(*w, records).ok());
    EXPECT_EQ(w->counters().pulls.load(), c.want_pulls) << "extra " << c.extra << " max_staleness " << c.max_staleness;
  }
}

TEST_F(PullPolicyTest, StalenessBoundWithARealSecondWorker) {
  // Worker 1 pushes (pull_every 1) while worker 0 computes on a copy it would
  // refresh only every 1000 steps; with max_staleness 1 worker 0 must pull
  // at least every other step (its own pushes alone force that), and more
  // often when worker 1's pushes land in between.
  WorkerUpdateOptions lazy;
  lazy.pull_every = 1000;
  lazy.max_staleness = 1;
  std::unique_ptr<Worker> w0 = MakeWorker(store_.get(), lazy);
  std::unique_ptr<Worker> w1 = MakeWorker(store_.get(), WorkerUpdateOptions{});
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(w1, nullptr);
  absl::Status s1;
  std::thread t([&] { s1 = w1->Train(order_.data(), data_.count, /*max_steps=*/40, opt_, 0, 0, nullptr); });
  ASSERT_TRUE(w0->Train(order_.data(), data_.count, /*max_steps=*/40, opt_, 0, 0, nullptr).ok());
  t.join();
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(w1->counters().pulls.load(), 40);
  EXPECT_GE(w0->counters().pulls.load(), 20);
  EXPECT_EQ(store_->version(), 80u);
}

TEST_F(PullPolicyTest, SyncModePullsEveryStep) {
  SyncAggregator agg(store_.get(), 1);
  WorkerUpdateOptions u;
  u.pull_every = 5;        // ignored in sync mode
  u.max_staleness = 1000;
  u.sync = &agg;
  std::unique_ptr<Worker> w = MakeWorker(store_.get(), u);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(TrainRecords(*w, 7 * kBatch).ok());
  EXPECT_EQ(w->counters().pulls.load(), 7);
  EXPECT_EQ(agg.rounds(), 7u);
  EXPECT_EQ(store_->version(), 7u);
}

// Forwards to a real store and records the dense calls: 'L' for a pull,
// 'F' for a push fused with the next step's pull (PushPull), 'D' for a push
// alone. Each push first sleeps `push_sleep`.
class DenseCallStore final : public ParamStore {
 public:
  DenseCallStore(ParamStore* base, std::chrono::milliseconds push_sleep) : base_(base), push_sleep_(push_sleep) {}
  const StoreLayout& layout() const override { return base_->layout(); }
  const std::string& name() const override { return base_->name(); }
  uint64_t version() const override { return base_->version(); }
  absl::Status Pull(absl::Span<const PullSlice> slices) override {
    calls_ += 'L';
    return base_->Pull(slices);
  }
  absl::Status Push(absl::Span<const DenseGrad> grads, float lr) override {
    std::this_thread::sleep_for(push_sleep_);
    calls_ += 'D';
    return base_->Push(grads, lr);
  }
  absl::Status PushPull(absl::Span<const DenseGrad> grads, float lr, absl::Span<const PullSlice> pulls) override {
    std::this_thread::sleep_for(push_sleep_);
    calls_ += 'F';
    return base_->PushPull(grads, lr, pulls);
  }
  const std::string& calls() const { return calls_; }

 private:
  ParamStore* base_;
  std::chrono::milliseconds push_sleep_;
  std::string calls_;
};

// A task runner trains a task's steps as one range: one pull at its start,
// then each step's push fused with the next step's pull, as in one Train
// call (a call a step would pull and push apart every step: "LD" 10 times).
TEST_F(PullPolicyTest, ATaskRunnerTrainsATaskInOneRange) {
  DenseCallStore store(store_.get(), std::chrono::milliseconds(0));
  // task <lease> <epoch> <first> <count> <progress_begin> <per_step>: 10 steps.
  const std::optional<std::string> reply = RunTask(&store, "task 7 1 0 160 0 0.01", [] { return true; });
  ASSERT_TRUE(reply.has_value());
  EXPECT_TRUE(absl::StartsWith(*reply, "done 7 160 10 ")) << *reply;
  EXPECT_EQ(store.calls(), "LFFFFFFFFFD");
  EXPECT_EQ(store_->version(), 10u);
}

// Between a task's steps, once a second has passed since its last message,
// the runner sends a heartbeat; when that says the parent is gone, the task
// stops before its next step and has no reply.
TEST_F(PullPolicyTest, ATaskRunnerSendsHeartbeatsBetweenStepsAndStopsWhenTheParentIsGone) {
  for (bool parent_there : {true, false}) {
    SCOPED_TRACE(parent_there ? "parent there" : "parent gone");
    // 5 steps of at least 0.4 s each: at least one heartbeat, by the third
    // step's end at the latest.
    DenseCallStore store(store_.get(), std::chrono::milliseconds(400));
    int heartbeats = 0;
    const std::optional<std::string> reply = RunTask(&store, "task 3 1 0 80 0 0.01", [&] {
      ++heartbeats;
      return parent_there;
    });
    if (parent_there) {
      ASSERT_TRUE(reply.has_value());
      EXPECT_TRUE(absl::StartsWith(*reply, "done 3 80 5 ")) << *reply;
      EXPECT_EQ(store.calls(), "LFFFFD");
      EXPECT_GE(heartbeats, 1);
    } else {
      EXPECT_FALSE(reply.has_value()) << *reply;
      EXPECT_EQ(heartbeats, 1);
      // Stopped after the step of the heartbeat, the third at the latest.
      EXPECT_LE(store.calls().size(), 4u) << store.calls();
      EXPECT_GE(store.calls().size(), 2u) << store.calls();
    }
  }
}

// The bytes a dense push moves, and where the next batch is asked for: the
// default MLP's push under Adam (235,146 parameters of 32 bytes, 7.5 MB)
// outgrows any L2, so its step asks after the push; a push that fits one
// (a single weight, as sparse_logreg's) keeps asking during the step.
TEST(AskNextBatchTest, FollowsThePushBytesAgainstTheL2) {
  Dataset data;
  data.count = 1;
  data.dense_dim = 784;
  data.num_classes = 10;
  ModelOptions mlp;
  mlp.layers = {{"dense", 256, Activation::kRelu}, {"dense", 128, Activation::kRelu}, {"dense", 10, Activation::kNone}};
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Create(mlp, DataShape::Of(data), 128, engine, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  constexpr int64_t kParams = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10;
  static_assert(kParams == 235146);
  EXPECT_EQ(DensePushBytes(**m, OptimizerType::kAdam), kParams * 32);  // p, m, v read and written, g, copy
  EXPECT_EQ(DensePushBytes(**m, OptimizerType::kSgd), kParams * 16);
  EXPECT_EQ(DensePushBytes(**m, OptimizerType::kMomentum), kParams * 24);
  EXPECT_TRUE(AskNextBatchAfterPush(DensePushBytes(**m, OptimizerType::kAdam), size_t{2} << 20));
  EXPECT_FALSE(AskNextBatchAfterPush(DensePushBytes(**m, OptimizerType::kAdam), size_t{16} << 20));
  EXPECT_FALSE(AskNextBatchAfterPush(8, size_t{2} << 20));
  EXPECT_FALSE(AskNextBatchAfterPush(size_t{2} << 20, size_t{2} << 20));  // an L2's worth still fits
  EXPECT_FALSE(AskNextBatchAfterPush(0, 0));                               // no dense push
}

}  // namespace
}  // namespace shardwild
