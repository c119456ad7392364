#include "ps_shm/sync_aggregator.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "core/base/mutex.h"
#include "gtest/gtest.h"
#include "ps_shm/param_store.h"
#include "ps_shm/shm_store.h"

namespace shardwild {
namespace {

// A ParamStore that records every push (the gradient of each variable, in
// variable order, and the learning rate) and applies nothing.
class RecordingStore final : public ParamStore {
 public:
  struct Record {
    std::vector<std::vector<float>> grads;  // [variable]
    float lr = 0;
  };

  RecordingStore() {
    layout_.variables = {VariableSpec{"a", 3, 2}, VariableSpec{"b", 1, 5}};
    layout_.num_shards = 1;
    layout_.parts = {{RowRange{0, 3}}, {RowRange{0, 1}}};
    layout_.shard_nodes = {0};
  }
  const StoreLayout& layout() const override { return layout_; }
  const std::string& name() const override { return name_; }
  absl::Status Pull(absl::Span<const PullSlice>) override { return absl::OkStatus(); }
  absl::Status Push(absl::Span<const DenseGrad> grads, float lr) override {
    Record r;
    r.grads.resize(layout_.variables.size());
    for (const DenseGrad& g : grads) {
      r.grads[g.var].assign(g.grad, g.grad + layout_.variables[g.var].size());
    }
    r.lr = lr;
    MutexLock lock(&mu_);
    records_.push_back(std::move(r));
    return absl::OkStatus();
  }
  uint64_t version() const override {
    MutexLock lock(&mu_);
    return records_.size();
  }
  std::vector<Record> records() const {
    MutexLock lock(&mu_);
    return records_;
  }

 private:
  StoreLayout layout_;
  std::string name_ = "recording";
  mutable Mutex mu_;
  std::vector<Record> records_ ABSL_GUARDED_BY(mu_);
};

// Worker w's gradient in round r: values whose float sum depends on the order
// of addition (big and small magnitudes mixed), so a sum in any other order
// than worker order would show.
std::vector<float> Gradient(int w, int r, int var, int64_t n) {
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) {
    // Workers 0 and 2 bring +B and -B (B = 1e8-ish, float ulp 8), the odd
    // ones small values: in worker order the small value of worker 1 is lost
    // in B and that of worker 3 survives; in reverse order it is the other
    // way round.
    const float big = (w % 4 == 0 ? 1.0f : -1.0f) * 1.0e8f * static_cast<float>(1 + (r + i) % 3);
    const float small = 0.37f * static_cast<float>(w + 1) + 0.011f * static_cast<float>(r % 50) + 0.5f * var + 0.003f * i;
    g[i] = w % 2 == 0 ? big : small;
  }
  return g;
}

// The mean over `workers` in worker order, as the aggregator must compute it.
std::vector<float> ExpectedMean(const std::vector<int>& workers, int r, int var, int64_t n) {
  std::vector<float> sum = Gradient(workers[0], r, var, n);
  for (size_t k = 1; k < workers.size(); ++k) {
    const std::vector<float> g = Gradient(workers[k], r, var, n);
    for (int64_t i = 0; i < n; ++i) sum[i] += g[i];
  }
  for (float& x : sum) x /= static_cast<float>(workers.size());
  return sum;
}

// Runs `rounds[w]` rounds on worker w's own thread (random small delays
// scramble the arrival order), then leaves. Returns each worker's statuses.
std::vector<absl::Status> RunWorkers(SyncAggregator& agg, const StoreLayout& layout, const std::vector<int>& rounds,
                                     int round_offset = 0, uint32_t seed = 1) {
  const int n = static_cast<int>(rounds.size());
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int w = 0; w < n; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(seed * 131 + w);
      std::vector<std::vector<float>> bufs(layout.variables.size());
      std::vector<DenseGrad> grads;
      for (int r = 0; r < rounds[w]; ++r) {
        grads.clear();
        for (size_t v = 0; v < layout.variables.size(); ++v) {
          bufs[v] = Gradient(w, r + round_offset, static_cast<int>(v), layout.variables[v].size());
        }
        // Variables in reverse order: the aggregator places them by index.
        for (int v = static_cast<int>(layout.variables.size()) - 1; v >= 0; --v) grads.push_back({v, bufs[v].data()});
        if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        const absl::Status s = agg.Contribute(w, grads, 0.1f * (w + 1));
        if (!s.ok() && status[w].ok()) status[w] = s;
      }
      const absl::Status s = agg.Leave(w);
      if (!s.ok() && status[w].ok()) status[w] = s;
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

// RunWorkers with overlap: each round, worker w hands its gradient over a
// bucket at a time (`buckets`, as set on the aggregator), with random small
// delays between buckets, then contributes.
std::vector<absl::Status> RunWorkersByBucket(SyncAggregator& agg, const StoreLayout& layout,
                                             const std::vector<std::vector<int>>& buckets,
                                             const std::vector<int>& rounds, uint32_t seed = 1) {
  const int n = static_cast<int>(rounds.size());
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int w = 0; w < n; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(seed * 977 + w);
      std::vector<std::vector<float>> bufs(layout.variables.size());
      std::vector<DenseGrad> grads, part;
      auto keep = [&](const absl::Status& s) {
        if (!s.ok() && status[w].ok()) status[w] = s;
      };
      for (int r = 0; r < rounds[w]; ++r) {
        grads.clear();
        for (size_t v = 0; v < layout.variables.size(); ++v) {
          bufs[v] = Gradient(w, r, static_cast<int>(v), layout.variables[v].size());
          grads.push_back({static_cast<int>(v), bufs[v].data()});
        }
        for (size_t b = 0; b < buckets.size(); ++b) {
          if (rng() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
          part.clear();
          for (int v : buckets[b]) part.push_back({v, bufs[v].data()});
          keep(agg.ContributeBucket(w, static_cast<int>(b), part, 0.1f * (w + 1)));
        }
        keep(agg.Contribute(w, grads, 0.1f * (w + 1)));
      }
      keep(agg.Leave(w));
    });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

::testing::AssertionResult BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(SyncAggregatorTest, SumsInWorkerOrderWhateverTheArrivalOrder) {
  RecordingStore store;
  SyncAggregator agg(&store, 4);
  constexpr int kRounds = 200;
  for (const absl::Status& s : RunWorkers(agg, store.layout(), {kRounds, kRounds, kRounds, kRounds})) {
    EXPECT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(agg.rounds(), static_cast<uint64_t>(kRounds));
  const std::vector<RecordingStore::Record> rec = store.records();
  ASSERT_EQ(rec.size(), static_cast<size_t>(kRounds)) << "one push per round";
  for (int r = 0; r < kRounds; ++r) {
    for (int v = 0; v < 2; ++v) {
      const int64_t n = store.layout().variables[v].size();
      EXPECT_TRUE(BitEqual(rec[r].grads[v], ExpectedMean({0, 1, 2, 3}, r, v, n))) << "round " << r << " var " << v;
    }
    EXPECT_FLOAT_EQ(rec[r].lr, 0.1f) << "the lowest-index contributor's learning rate";
  }
  // The order matters for these values: the reverse order gives other bits
  // somewhere, so the check above really pins worker order.
  bool differs = false;
  for (int r = 0; r < kRounds && !differs; ++r) {
    differs = !BitEqual(ExpectedMean({0, 1, 2, 3}, r, 0, 6), ExpectedMean({3, 2, 1, 0}, r, 0, 6));
  }
  EXPECT_TRUE(differs);
}

TEST(SyncAggregatorTest, WorkersThatRunFewerRoundsDropOut) {
  RecordingStore store;
  SyncAggregator agg(&store, 3);
  // Worker 1 runs out after 5 rounds, worker 2 after 7, worker 0 runs 9.
  for (const absl::Status& s : RunWorkers(agg, store.layout(), {9, 5, 7})) EXPECT_TRUE(s.ok()) << s;
  const std::vector<RecordingStore::Record> rec = store.records();
  ASSERT_EQ(rec.size(), 9u);
  for (int r = 0; r < 9; ++r) {
    std::vector<int> in = {0};
    if (r < 5) in.push_back(1);
    if (r < 7) in.push_back(2);
    for (int v = 0; v < 2; ++v) {
      EXPECT_TRUE(BitEqual(rec[r].grads[v], ExpectedMean(in, r, v, store.layout().variables[v].size())))
          << "round " << r << " var " << v;
    }
  }
}

TEST(SyncAggregatorTest, LeavingCompletesTheRoundOthersWaitFor) {
  RecordingStore store;
  SyncAggregator agg(&store, 2);
  std::vector<float> a(6, 2.0f), b(5, 4.0f);
  const DenseGrad grads[2] = {{0, a.data()}, {1, b.data()}};
  absl::Status contributed;
  std::thread t([&] { contributed = agg.Contribute(0, grads, 0.5f); });
  // Worker 1 leaves without contributing, most likely while worker 0 waits;
  // either way exactly one push with worker 0's gradient comes out.
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_TRUE(agg.Leave(1).ok());
  t.join();
  EXPECT_TRUE(contributed.ok()) << contributed;
  const std::vector<RecordingStore::Record> rec = store.records();
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0].grads[0], a);
  EXPECT_EQ(rec[0].grads[1], b);
  EXPECT_FLOAT_EQ(rec[0].lr, 0.5f);
  EXPECT_TRUE(agg.Leave(0).ok());
  EXPECT_TRUE(agg.Leave(0).ok()) << "leaving twice is a no-op";
}

TEST(SyncAggregatorTest, GroupReformsForTheNextEpoch) {
  RecordingStore store;
  SyncAggregator agg(&store, 3);
  for (int epoch = 0; epoch < 20; ++epoch) {
    // Parts differ by at most one step, as the trainer's do.
    const std::vector<int> rounds = {4, 4 - (epoch % 2), 3};
    for (const absl::Status& s : RunWorkers(agg, store.layout(), rounds, /*round_offset=*/epoch * 10, epoch + 1)) {
      ASSERT_TRUE(s.ok()) << s;
    }
  }
  const std::vector<RecordingStore::Record> rec = store.records();
  ASSERT_EQ(rec.size(), 20u * 4);
  // The first round of every epoch has all three workers again.
  for (int epoch = 0; epoch < 20; ++epoch) {
    EXPECT_TRUE(BitEqual(rec[epoch * 4].grads[0], ExpectedMean({0, 1, 2}, epoch * 10, 0, 6))) << "epoch " << epoch;
    EXPECT_TRUE(BitEqual(rec[epoch * 4 + 3].grads[0],
                         ExpectedMean(epoch % 2 ? std::vector<int>{0} : std::vector<int>{0, 1}, epoch * 10 + 3, 0, 6)))
        << "epoch " << epoch;
  }
}

TEST(SyncAggregatorTest, ManyRoundsManyWorkers) {
  RecordingStore store;
  SyncAggregator agg(&store, 6);
  constexpr int kRounds = 1000;
  for (const absl::Status& s : RunWorkers(agg, store.layout(), std::vector<int>(6, kRounds))) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(agg.rounds(), static_cast<uint64_t>(kRounds));
  EXPECT_EQ(store.version(), static_cast<uint64_t>(kRounds));
}

TEST(SyncAggregatorTest, BadCallsAreErrors) {
  RecordingStore store;
  SyncAggregator agg(&store, 2);
  std::vector<float> a(6), b(5);
  const DenseGrad both[2] = {{0, a.data()}, {1, b.data()}};
  const DenseGrad one[1] = {{0, a.data()}};
  const DenseGrad bad_var[2] = {{0, a.data()}, {7, b.data()}};
  EXPECT_EQ(agg.Contribute(2, both, 0.1f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.Contribute(-1, both, 0.1f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.Contribute(0, one, 0.1f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.Contribute(0, bad_var, 0.1f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.Leave(5).code(), absl::StatusCode::kInvalidArgument);
  // Worker 1 leaves; worker 0 then runs alone; worker 1 may not come back
  // until the group re-forms.
  EXPECT_TRUE(agg.Leave(1).ok());
  EXPECT_EQ(agg.Contribute(1, both, 0.1f).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(agg.Contribute(0, both, 0.1f).ok());
  EXPECT_EQ(store.records().size(), 1u);
  EXPECT_TRUE(agg.Leave(0).ok());
  // Re-formed: both are in again, so a lone contribution would wait; worker
  // 1 is welcome again.
  std::thread t([&] { EXPECT_TRUE(agg.Contribute(1, both, 0.2f).ok()); });
  EXPECT_TRUE(agg.Contribute(0, both, 0.1f).ok());
  t.join();
  EXPECT_EQ(store.records().size(), 2u);
}

// ---- Embedding rows in sync mode -----------------------------------------

constexpr int64_t kRowDim = 6;

// A real store in sync mode: one dense variable, a static and a dynamic
// table, Adam for both (so the step counts and slot state matter too).
std::unique_ptr<ShmParamStore> SyncStore(UpdateMode mode) {
  OpenStoreOptions o;
  o.store.job_name = "swtest-sync-rows";
  o.store.update = mode;
  o.store.huge_pages = HugePagePolicy::kOff;
  o.optimizer.type = OptimizerType::kAdam;
  o.optimizer.lr = 0.01f;
  o.num_shards = 3;
  o.seed = 17;
  TableSpec st;
  st.name = "static";
  st.kind = EmbeddingKind::kStatic;
  st.dim = kRowDim;
  st.capacity = 50;
  TableSpec dy = st;
  dy.name = "dynamic";
  dy.kind = EmbeddingKind::kDynamic;
  dy.capacity = 400;
  o.tables = {st, dy};
  absl::StatusOr<std::unique_ptr<ShmParamStore>> store =
      ShmParamStore::Create(o, {VariableSpec{"w", 4, 3, InitKind::kGlorotUniform, 4, 3}});
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

// Worker w's ids and gradients of table t in round r: repeated ids within a
// worker, ids shared between workers, magnitudes that make the summation
// order visible.
void StepRows(int w, int r, int t, std::vector<uint64_t>* ids, std::vector<float>* grads) {
  std::mt19937_64 rng(static_cast<uint64_t>(w) * 1000003 + r * 7919 + t);
  const int n = 5 + static_cast<int>(rng() % 12);
  ids->resize(n);
  grads->resize(n * kRowDim);
  for (int i = 0; i < n; ++i) {
    (*ids)[i] = t == 0 ? rng() % 50 : (rng() % 30) * 0x9E3779B97F4A7C15ULL;
    for (int64_t j = 0; j < kRowDim; ++j) {
      (*grads)[i * kRowDim + j] = (rng() % 2 ? 1.0e6f : 1.0e-3f) * (static_cast<float>(rng() % 1000) / 500.0f - 1.0f);
    }
  }
}

// Runs `rounds` rounds of 3 workers, each on its own thread with random
// delays, contributing dense and row gradients.
void RunRowWorkers(SyncAggregator& agg, int rounds, uint32_t seed) {
  constexpr int kWorkers = 3;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(seed * 31 + w);
      std::vector<uint64_t> ids[2];
      std::vector<float> g[2];
      for (int r = 0; r < rounds; ++r) {
        const std::vector<float> dense = Gradient(w, r, 0, 12);
        const DenseGrad dg{0, dense.data()};
        for (int t = 0; t < 2; ++t) StepRows(w, r, t, &ids[t], &g[t]);
        const RowGrad rows[2] = {{1, ids[1], g[1].data()}, {0, ids[0], g[0].data()}};
        if (rng() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        EXPECT_TRUE(agg.Contribute(w, {&dg, 1}, 0.01f, rows, 0.05f).ok());
      }
      EXPECT_TRUE(agg.Leave(w).ok());
    });
  }
  for (std::thread& t : threads) t.join();
}

// Every id either run can have touched: params, both Adam slots, step count.
std::vector<float> Snapshot(ShmParamStore& store) {
  std::vector<float> out(12);
  EXPECT_TRUE(store.PullVariable(0, out.data()).ok());
  for (int t = 0; t < 2; ++t) {
    for (uint64_t k = 0; k < (t == 0 ? 50u : 30u); ++k) {
      const uint64_t id = t == 0 ? k : k * 0x9E3779B97F4A7C15ULL;
      std::vector<float> p(kRowDim), m(kRowDim), v(kRowDim);
      float* slots[2] = {m.data(), v.data()};
      uint64_t count = 0;
      const absl::Status s = store.ReadTableRow(t, id, p.data(), slots, &count);
      if (absl::IsNotFound(s)) {
        out.push_back(-1.0f);  // no row: the same in both runs or the comparison fails
        continue;
      }
      EXPECT_TRUE(s.ok()) << s;
      out.insert(out.end(), p.begin(), p.end());
      out.insert(out.end(), m.begin(), m.end());
      out.insert(out.end(), v.begin(), v.end());
      out.push_back(static_cast<float>(count));
    }
  }
  return out;
}

// Two runs with the same seed and worker count give bit-identical tables,
// whatever the arrival order; and the result is the sequential reference:
// each round, every worker's rows divided by 3, pushed in worker order.
TEST(SyncAggregatorTest, TableRowsAreAveragedDeterministically) {
  constexpr int kRounds = 40;
  std::vector<float> runs[2];
  for (int run = 0; run < 2; ++run) {
    std::unique_ptr<ShmParamStore> store = SyncStore(UpdateMode::kSync);
    ASSERT_NE(store, nullptr);
    SyncAggregator agg(store.get(), 3);
    RunRowWorkers(agg, kRounds, /*seed=*/run + 1);  // different delays each run
    EXPECT_EQ(agg.rounds(), static_cast<uint64_t>(kRounds));
    runs[run] = Snapshot(*store);
  }
  EXPECT_TRUE(BitEqual(runs[0], runs[1]));

  std::unique_ptr<ShmParamStore> ref = SyncStore(UpdateMode::kHogwild);
  ASSERT_NE(ref, nullptr);
  RowScratch scratch;
  for (int r = 0; r < kRounds; ++r) {
    const std::vector<float> dense = ExpectedMean({0, 1, 2}, r, 0, 12);
    const DenseGrad dg{0, dense.data()};
    ASSERT_TRUE(ref->Push({&dg, 1}, 0.01f).ok());
    for (int t = 0; t < 2; ++t) {
      std::vector<uint64_t> all_ids, ids;
      std::vector<float> all_g, g;
      for (int w = 0; w < 3; ++w) {
        StepRows(w, r, t, &ids, &g);
        all_ids.insert(all_ids.end(), ids.begin(), ids.end());
        for (float x : g) all_g.push_back(x / 3.0f);
      }
      ASSERT_TRUE(ref->PushRows(t, all_ids, all_g.data(), 0.05f, &scratch).ok());
    }
  }
  EXPECT_TRUE(BitEqual(runs[0], Snapshot(*ref)));
}

TEST(SyncAggregatorTest, BadRowGradientsAreErrors) {
  std::unique_ptr<ShmParamStore> store = SyncStore(UpdateMode::kSync);
  ASSERT_NE(store, nullptr);
  SyncAggregator agg(store.get(), 1);
  std::vector<float> dense(12), g(kRowDim);
  const DenseGrad dg{0, dense.data()};
  const std::vector<uint64_t> ids = {3};
  const RowGrad no_table[1] = {{2, ids, g.data()}};
  EXPECT_EQ(agg.Contribute(0, {&dg, 1}, 0.1f, no_table, 0.1f).code(), absl::StatusCode::kInvalidArgument);
  const RowGrad null_grads[1] = {{0, ids, nullptr}};
  EXPECT_EQ(agg.Contribute(0, {&dg, 1}, 0.1f, null_grads, 0.1f).code(), absl::StatusCode::kInvalidArgument);
  // An id out of range fails the round's push and is reported to the contributor.
  const std::vector<uint64_t> far = {50};
  const RowGrad out_of_range[1] = {{0, far, g.data()}};
  const absl::Status s = agg.Contribute(0, {&dg, 1}, 0.1f, out_of_range, 0.1f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(agg.Leave(0).ok());
}

// Processes of an allreduce job, simulated: `parties` reducers meet on one
// barrier; each call copies its buffer in, the last to arrive sums them in
// party order, and everyone copies the sum out. A set `fail` makes every
// call fail (a lost peer).
class ThreadWorld {
 public:
  explicit ThreadWorld(int parties) : parties_(parties), in_(parties) {}

  class Reducer final : public GradientReducer {
   public:
    Reducer(ThreadWorld* world, int party) : world_(world), party_(party) {}
    absl::Status AllreduceSum(float* data, size_t n) override {
      sizes.push_back(n);
      return world_->Sum(party_, data, n);
    }
    // Each call's size, in order (read once the aggregator's collective
    // thread has stopped: set_reducer or the aggregator's end).
    std::vector<size_t> sizes;

   private:
    ThreadWorld* world_;
    int party_;
  };

  absl::Status Sum(int party, float* data, size_t n) {
    MutexLock lock(&mu_);
    if (fail_) return absl::UnavailableError("peer lost");
    in_[party].assign(data, data + n);
    const uint64_t gen = generation_;
    if (++arrived_ == parties_) {
      sum_ = in_[0];
      for (int p = 1; p < parties_; ++p) {
        for (size_t i = 0; i < n; ++i) sum_[i] += in_[p][i];
      }
      arrived_ = 0;
      ++generation_;
      done_.SignalAll();
    } else {
      done_.Wait(&mu_, [this, gen]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return generation_ != gen; });
    }
    std::copy(sum_.begin(), sum_.end(), data);
    return absl::OkStatus();
  }
  void set_fail() {
    MutexLock lock(&mu_);
    fail_ = true;
  }

 private:
  const int parties_;
  Mutex mu_;
  CondVar done_;
  std::vector<std::vector<float>> in_ ABSL_GUARDED_BY(mu_);
  std::vector<float> sum_ ABSL_GUARDED_BY(mu_);
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool fail_ ABSL_GUARDED_BY(mu_) = false;
};

// Two processes of two workers each: every round, both stores receive the
// mean over all four contributions, with the same learning rate; a process
// whose parts ran out pads its rounds, and the other's contributions alone
// make the mean.
TEST(SyncAggregatorAcrossProcesses, EveryProcessPushesTheMeanOfAll) {
  ThreadWorld world(2);
  ThreadWorld::Reducer ra(&world, 0), rb(&world, 1);
  RecordingStore sa, sb;
  SyncAggregator a(&sa, 2), b(&sb, 2);
  ASSERT_TRUE(a.set_reducer(&ra).ok());
  ASSERT_TRUE(b.set_reducer(&rb).ok());
  const StoreLayout& layout = sa.layout();
  // 3 rounds in process a (workers 0 and 1 of the job), 5 and 2 in b
  // (workers 2 and 3, brought as b's 0 and 1 with round_offset 0): a pads
  // rounds 4 and 5.
  std::vector<absl::Status> sa_status, sb_status;
  std::thread pa([&] {
    sa_status = RunWorkers(a, layout, {3, 3});
    const absl::Status s = a.PadRounds(2);
    if (!s.ok()) sa_status.push_back(s);
  });
  std::thread pb([&] { sb_status = RunWorkers(b, layout, {5, 2}); });
  pa.join();
  pb.join();
  for (const absl::Status& s : sa_status) EXPECT_TRUE(s.ok()) << s;
  for (const absl::Status& s : sb_status) EXPECT_TRUE(s.ok()) << s;
  const std::vector<RecordingStore::Record> ra_rec = sa.records(), rb_rec = sb.records();
  ASSERT_EQ(ra_rec.size(), 5u);
  ASSERT_EQ(rb_rec.size(), 5u);
  for (size_t r = 0; r < 5; ++r) {
    // Bit-identical in both processes.
    EXPECT_EQ(ra_rec[r].lr, rb_rec[r].lr) << r;
    for (size_t v = 0; v < layout.variables.size(); ++v) {
      ASSERT_EQ(ra_rec[r].grads[v].size(), rb_rec[r].grads[v].size());
      EXPECT_EQ(0, std::memcmp(ra_rec[r].grads[v].data(), rb_rec[r].grads[v].data(),
                               ra_rec[r].grads[v].size() * sizeof(float)))
          << "round " << r << " variable " << v;
    }
  }
  // Rounds 0-1: four contributions (a's workers 0, 1 and b's 0, 1); mean of
  // the per-process sums. Round 2: three (b's worker 1 is out). Rounds 3-4:
  // b's worker 0 alone.
  auto contributions = [](int r) -> std::vector<std::pair<int, int>> {  // (process, worker)
    if (r < 2) return {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
    if (r == 2) return {{0, 0}, {0, 1}, {1, 0}};
    return {{1, 0}};
  };
  for (int r = 0; r < 5; ++r) {
    const auto who = contributions(r);
    float lr_sum = 0;
    for (int v = 0; v < static_cast<int>(layout.variables.size()); ++v) {
      const int64_t n = layout.variables[v].size();
      std::vector<float> pa_sum(n, 0.0f), pb_sum(n, 0.0f);
      bool any_a = false, any_b = false;
      for (const auto& [p, w] : who) {
        const std::vector<float> g = Gradient(w, r, v, n);
        std::vector<float>& sum = p == 0 ? pa_sum : pb_sum;
        bool& any = p == 0 ? any_a : any_b;
        for (int64_t i = 0; i < n; ++i) sum[i] = any ? sum[i] + g[i] : g[i];
        any = true;
      }
      for (int64_t i = 0; i < n; ++i) {
        const float expect = (pa_sum[i] + pb_sum[i]) / static_cast<float>(who.size());
        EXPECT_EQ(ra_rec[r].grads[v][i], expect) << "round " << r << " variable " << v << " index " << i;
      }
    }
    // Each process brings lr * (its contributions), with the lowest worker's
    // lr (0.1 for worker 0; b's worker 1 alone in no round).
    int in_a = 0, in_b = 0;
    for (const auto& [p, w] : who) (p == 0 ? in_a : in_b) += 1;
    lr_sum = 0.1f * static_cast<float>(in_a) + 0.1f * static_cast<float>(in_b);
    EXPECT_FLOAT_EQ(ra_rec[r].lr, lr_sum / static_cast<float>(who.size())) << r;
  }
}

TEST(SyncAggregatorAcrossProcesses, NobodyContributingPushesNothingAndErrorsReachEveryone) {
  ThreadWorld world(2);
  ThreadWorld::Reducer ra(&world, 0), rb(&world, 1);
  RecordingStore sa, sb;
  SyncAggregator a(&sa, 1), b(&sb, 1);
  ASSERT_TRUE(a.set_reducer(&ra).ok());
  ASSERT_TRUE(b.set_reducer(&rb).ok());
  absl::Status sa_pad, sb_pad;
  std::thread t([&] { sa_pad = a.PadRounds(3); });
  sb_pad = b.PadRounds(3);
  t.join();
  EXPECT_TRUE(sa_pad.ok()) << sa_pad;
  EXPECT_TRUE(sb_pad.ok()) << sb_pad;
  EXPECT_TRUE(sa.records().empty());
  EXPECT_TRUE(sb.records().empty());
  EXPECT_EQ(a.rounds(), 3u);
  // Rows of a table the store does not have.
  std::vector<float> g0(6), g1(5);
  const DenseGrad grads[2] = {{0, g0.data()}, {1, g1.data()}};
  const std::vector<uint64_t> ids = {1};
  const RowGrad rows[1] = {{0, ids, g0.data()}};
  EXPECT_EQ(a.Contribute(0, grads, 0.1f, rows, 0.1f).code(), absl::StatusCode::kInvalidArgument);
  // A lost peer: the round fails for its contributor, and pads fail too.
  world.set_fail();
  EXPECT_EQ(a.Contribute(0, grads, 0.1f).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(a.Leave(0).ok());
  EXPECT_EQ(b.PadRounds(1).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(sa.records().empty());
  // Failed rounds count as rounds, not as completed ones.
  EXPECT_EQ(a.rounds(), 4u);
  EXPECT_EQ(a.completed_rounds(), 3u);
  EXPECT_EQ(b.completed_rounds(), 3u);
  // Without a reducer there is nothing to pad with.
  SyncAggregator c(&sa, 1);
  EXPECT_EQ(c.PadRounds(1).code(), absl::StatusCode::kFailedPrecondition);
}

// The records of two processes with the given workers' rounds (a: 2
// workers, b: 2 workers, a pads to b's rounds), with or without buckets:
// a by bucket, b handing everything over with Contribute, so both ways meet.
struct TwoProcesses {
  std::vector<RecordingStore::Record> a, b;
  std::vector<size_t> a_sizes, b_sizes;
};
TwoProcesses RunTwoProcesses(const std::vector<std::vector<int>>& buckets, const std::vector<int>& a_rounds,
                             const std::vector<int>& b_rounds, uint32_t seed) {
  ThreadWorld world(2);
  ThreadWorld::Reducer ra(&world, 0), rb(&world, 1);
  RecordingStore sa, sb;
  SyncAggregator a(&sa, 2), b(&sb, 2);
  EXPECT_TRUE(a.set_reducer(&ra, buckets).ok());
  EXPECT_TRUE(b.set_reducer(&rb, buckets).ok());
  const StoreLayout& layout = sa.layout();
  const int a_max = *std::max_element(a_rounds.begin(), a_rounds.end());
  const int b_max = *std::max_element(b_rounds.begin(), b_rounds.end());
  std::vector<absl::Status> sa_status, sb_status;
  std::thread pa([&] {
    sa_status = buckets.empty() ? RunWorkers(a, layout, a_rounds, 0, seed)
                                : RunWorkersByBucket(a, layout, buckets, a_rounds, seed);
    if (b_max > a_max) sa_status.push_back(a.PadRounds(b_max - a_max));
  });
  std::thread pb([&] {
    sb_status = RunWorkers(b, layout, b_rounds, 0, seed + 1);
    if (a_max > b_max) sb_status.push_back(b.PadRounds(a_max - b_max));
  });
  pa.join();
  pb.join();
  for (const absl::Status& s : sa_status) EXPECT_TRUE(s.ok()) << s;
  for (const absl::Status& s : sb_status) EXPECT_TRUE(s.ok()) << s;
  // Stops the collective threads before their reducers' call lists are read.
  EXPECT_TRUE(a.set_reducer(nullptr).ok());
  EXPECT_TRUE(b.set_reducer(nullptr).ok());
  return {sa.records(), sb.records(), ra.sizes, rb.sizes};
}

// Overlap: bucket by bucket, the processes push exactly what one collective
// per round pushes (this reducer adds each element in party order either
// way), with workers dropping out and a process padding; and the
// collectives are the buckets in order, the first carrying the count and
// learning rates, for every round, padded ones included.
TEST(SyncAggregatorAcrossProcesses, BucketsPushWhatOneCollectivePushes) {
  const std::vector<std::vector<int>> buckets = {{1}, {0}};  // as a backward pass finishes them
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    const TwoProcesses whole = RunTwoProcesses({}, {3, 3}, {5, 2}, seed);
    const TwoProcesses split = RunTwoProcesses(buckets, {3, 3}, {5, 2}, seed);
    ASSERT_EQ(whole.a.size(), 5u);
    ASSERT_EQ(split.a.size(), 5u);
    ASSERT_EQ(split.b.size(), 5u);
    for (size_t r = 0; r < 5; ++r) {
      EXPECT_EQ(split.a[r].lr, whole.a[r].lr) << r;
      EXPECT_EQ(split.b[r].lr, whole.a[r].lr) << r;
      for (size_t v = 0; v < 2; ++v) {
        EXPECT_TRUE(BitEqual(split.a[r].grads[v], whole.a[r].grads[v])) << "round " << r << " variable " << v;
        EXPECT_TRUE(BitEqual(split.b[r].grads[v], whole.a[r].grads[v])) << "round " << r << " variable " << v;
      }
    }
    // Variable b (5 floats) + count and learning rates, then a (6 floats),
    // five rounds each; one 13-float call per round without buckets.
    std::vector<size_t> expect;
    for (int r = 0; r < 5; ++r) expect.insert(expect.end(), {7, 6});
    EXPECT_EQ(split.a_sizes, expect);
    EXPECT_EQ(split.b_sizes, expect);
    EXPECT_EQ(whole.a_sizes, std::vector<size_t>(5, 13));
  }
}

// Many rounds, workers handing buckets over at random times: no round mixes
// with the next (each round's mean is exactly the workers' mean).
TEST(SyncAggregatorAcrossProcesses, ManyBucketedRoundsStayApart) {
  ThreadWorld world(1);
  ThreadWorld::Reducer reducer(&world, 0);
  RecordingStore store;
  SyncAggregator agg(&store, 4);
  ASSERT_TRUE(agg.set_reducer(&reducer, {{1}, {0}}).ok());
  for (const absl::Status& s : RunWorkersByBucket(agg, store.layout(), {{1}, {0}}, {40, 40, 40, 40}, 7)) {
    EXPECT_TRUE(s.ok()) << s;
  }
  ASSERT_TRUE(agg.set_reducer(nullptr).ok());
  const std::vector<RecordingStore::Record> records = store.records();
  ASSERT_EQ(records.size(), 40u);
  for (int r = 0; r < 40; ++r) {
    for (int v = 0; v < 2; ++v) {
      const int64_t n = store.layout().variables[v].size();
      EXPECT_TRUE(BitEqual(records[r].grads[v], ExpectedMean({0, 1, 2, 3}, r, v, n))) << r << " " << v;
    }
    EXPECT_FLOAT_EQ(records[r].lr, 0.1f);
  }
  EXPECT_EQ(reducer.sizes.size(), 80u);
}

TEST(SyncAggregatorAcrossProcesses, BadBucketsAndHandOversAreErrors) {
  ThreadWorld world(1);
  ThreadWorld::Reducer reducer(&world, 0);
  RecordingStore store;
  SyncAggregator agg(&store, 1);
  // Every variable in exactly one non-empty bucket.
  EXPECT_EQ(agg.set_reducer(&reducer, {{0}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.set_reducer(&reducer, {{0, 1}, {1}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.set_reducer(&reducer, {{0, 1}, {}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.set_reducer(&reducer, {{0, 2}, {1}}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> g0(6, 1.0f), g1(5, 2.0f);
  const DenseGrad d0{0, g0.data()}, d1{1, g1.data()};
  // No buckets: nothing to hand over.
  ASSERT_TRUE(agg.set_reducer(&reducer).ok());
  EXPECT_EQ(agg.ContributeBucket(0, 0, {&d1, 1}, 0.1f).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(agg.set_reducer(&reducer, {{1}, {0}}).ok());
  EXPECT_EQ(agg.buckets(), 2);
  EXPECT_EQ(agg.ContributeBucket(0, 1, {&d0, 1}, 0.1f).code(), absl::StatusCode::kInvalidArgument);  // out of order
  EXPECT_EQ(agg.ContributeBucket(0, 0, {&d0, 1}, 0.1f).code(), absl::StatusCode::kInvalidArgument);  // wrong variable
  EXPECT_EQ(agg.ContributeBucket(1, 0, {&d1, 1}, 0.1f).code(), absl::StatusCode::kInvalidArgument);  // no worker 1
  // Bucket 0 by hand-over, bucket 1 with the round's Contribute.
  ASSERT_TRUE(agg.ContributeBucket(0, 0, {&d1, 1}, 0.5f).ok());
  const DenseGrad both[2] = {d0, d1};
  ASSERT_TRUE(agg.Contribute(0, both, 0.9f).ok());  // the lr of bucket 0's hand-over counts
  ASSERT_TRUE(agg.Leave(0).ok());
  // After leaving, nothing more this group... and a lost peer fails the
  // round: nothing applied, the error to the contributor.
  world.set_fail();
  ASSERT_TRUE(agg.ContributeBucket(0, 0, {&d1, 1}, 0.5f).ok());
  EXPECT_EQ(agg.Contribute(0, both, 0.5f).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(agg.Leave(0).ok());
  EXPECT_EQ(agg.PadRounds(1).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(agg.set_reducer(nullptr).ok());
  const std::vector<RecordingStore::Record> records = store.records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].lr, 0.5f);
  EXPECT_EQ(records[0].grads[0], g0);
  EXPECT_EQ(records[0].grads[1], g1);
  EXPECT_EQ(agg.rounds(), 3u);
  EXPECT_EQ(agg.completed_rounds(), 1u);
}

// A worker that fails mid-backward (hands over bucket 0, then leaves) does
// not leave the round hanging: it completes with what was handed over, so
// every process still issues the same collectives.
TEST(SyncAggregatorAcrossProcesses, LeavingMidRoundCompletesIt) {
  ThreadWorld world(1);
  ThreadWorld::Reducer reducer(&world, 0);
  RecordingStore store;
  SyncAggregator agg(&store, 2);
  ASSERT_TRUE(agg.set_reducer(&reducer, {{1}, {0}}).ok());
  std::vector<float> g0(6, 1.0f), g1(5, 2.0f);
  const DenseGrad d1{1, g1.data()};
  ASSERT_TRUE(agg.ContributeBucket(0, 0, {&d1, 1}, 0.1f).ok());
  ASSERT_TRUE(agg.Leave(1).ok());  // worker 1 never started the round
  ASSERT_TRUE(agg.Leave(0).ok());  // worker 0 failed after bucket 0
  EXPECT_EQ(agg.rounds(), 1u);
  ASSERT_TRUE(agg.set_reducer(nullptr).ok());
  EXPECT_EQ(reducer.sizes, (std::vector<size_t>{7, 6}));
  const std::vector<RecordingStore::Record> records = store.records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].grads[1], g1);
}

// A store of one variable and one table (dim 2) that records its pushes of
// rows: what each process of an allreduce job sends to the shared tables.
class RowRecordingStore final : public ParamStore {
 public:
  struct Rows {
    std::vector<uint64_t> ids;
    std::vector<float> grads;
    float lr = 0;
  };
  RowRecordingStore() {
    layout_.variables = {VariableSpec{"w", 1, 3}};
    layout_.num_shards = 1;
    layout_.parts = {{RowRange{0, 1}}};
    layout_.shard_nodes = {0};
    TableSpec t;
    t.name = "t";
    t.capacity = 100;
    t.dim = 2;
    layout_.tables = {t};
  }
  const StoreLayout& layout() const override { return layout_; }
  const std::string& name() const override { return name_; }
  absl::Status Pull(absl::Span<const PullSlice>) override { return absl::OkStatus(); }
  absl::Status Push(absl::Span<const DenseGrad>, float) override { return absl::OkStatus(); }
  absl::Status PushRows(int, absl::Span<const uint64_t> ids, const float* grads, float lr, RowScratch*) override {
    MutexLock lock(&mu_);
    rows_.push_back({{ids.begin(), ids.end()}, {grads, grads + 2 * ids.size()}, lr});
    return fail_ ? absl::UnavailableError("ps:0 is unavailable") : absl::OkStatus();
  }
  uint64_t version() const override { return 0; }
  std::vector<Rows> rows() const {
    MutexLock lock(&mu_);
    return rows_;
  }
  void set_fail() {
    MutexLock lock(&mu_);
    fail_ = true;
  }

 private:
  StoreLayout layout_;
  std::string name_ = "rows";
  mutable Mutex mu_;
  std::vector<Rows> rows_ ABSL_GUARDED_BY(mu_);
  bool fail_ ABSL_GUARDED_BY(mu_) = false;
};

// Rows across processes (tables on ps tasks): each process pushes its own
// contributors' rows, divided by the contributions of all processes, with
// their mean sparse learning rate, then meets the others once more; with
// buckets or without. A push that fails in one process fails the round in
// both.
TEST(SyncAggregatorAcrossProcesses, EachProcessPushesItsRowsOverAllContributions) {
  for (const bool buckets : {false, true}) {
    SCOPED_TRACE(buckets);
    ThreadWorld world(2);
    ThreadWorld::Reducer ra(&world, 0), rb(&world, 1);
    RowRecordingStore sa, sb;
    SyncAggregator a(&sa, 1), b(&sb, 1);
    const std::vector<std::vector<int>> one = buckets ? std::vector<std::vector<int>>{{0}} : std::vector<std::vector<int>>{};
    ASSERT_TRUE(a.set_reducer(&ra, one).ok());
    ASSERT_TRUE(b.set_reducer(&rb, one).ok());
    std::vector<float> w(3, 1.0f);
    const DenseGrad dg{0, w.data()};
    const std::vector<uint64_t> ids_a = {5, 7}, ids_b = {7};
    const std::vector<float> ga = {2, 4, 6, 8}, gb = {10, 20};
    const RowGrad rows_a[1] = {{0, ids_a, ga.data()}};
    const RowGrad rows_b[1] = {{0, ids_b, gb.data()}};
    absl::Status status_a;
    std::thread t([&] { status_a = a.Contribute(0, {&dg, 1}, 0.1f, rows_a, 0.2f); });
    const absl::Status status_b = b.Contribute(0, {&dg, 1}, 0.1f, rows_b, 0.6f);
    t.join();
    ASSERT_TRUE(status_a.ok()) << status_a;
    ASSERT_TRUE(status_b.ok()) << status_b;
    const std::vector<RowRecordingStore::Rows> pa = sa.rows(), pb = sb.rows();
    ASSERT_EQ(pa.size(), 1u);
    ASSERT_EQ(pb.size(), 1u);
    EXPECT_EQ(pa[0].ids, ids_a);
    EXPECT_EQ(pa[0].grads, (std::vector<float>{1, 2, 3, 4}));  // over 2 contributions
    EXPECT_EQ(pb[0].ids, ids_b);
    EXPECT_EQ(pb[0].grads, (std::vector<float>{5, 10}));
    EXPECT_FLOAT_EQ(pa[0].lr, 0.4f);  // the mean of 0.2 and 0.6
    EXPECT_FLOAT_EQ(pb[0].lr, 0.4f);
    // A failed push in b: both processes' rounds fail with an error.
    sb.set_fail();
    std::thread t2([&] { status_a = a.Contribute(0, {&dg, 1}, 0.1f, rows_a, 0.2f); });
    const absl::Status failed_b = b.Contribute(0, {&dg, 1}, 0.1f, rows_b, 0.6f);
    t2.join();
    EXPECT_EQ(failed_b.code(), absl::StatusCode::kUnavailable) << failed_b;
    EXPECT_EQ(status_a.code(), absl::StatusCode::kAborted) << status_a;
    ASSERT_TRUE(a.Leave(0).ok());
    ASSERT_TRUE(b.Leave(0).ok());
    ASSERT_TRUE(a.set_reducer(nullptr).ok());
    ASSERT_TRUE(b.set_reducer(nullptr).ok());
    // Each round: the gradient with the count and both learning rates
    // (3 + 3 floats), then the 1-float meeting after the rows.
    EXPECT_EQ(ra.sizes, (std::vector<size_t>{6, 1, 6, 1}));
  }
}

}  // namespace
}  // namespace shardwild
