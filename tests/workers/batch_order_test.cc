// A worker's steps train the records of its order, batch after batch: the
// worker takes each step's records a step ahead (its data phase asks for
// their lines during the step before, in parts where a batch is more lines
// than a burst of prefetches, Worker::set_prefetch_burst_lines), so a slip there would train a batch twice,
// skip one or train records outside the range. Every record here has a row
// of its own (record r reads row r only), so the rows that moved are
// exactly the records that were trained.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config/options.h"
#include "core/model/model.h"
#include "gtest/gtest.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "ps_shm/shm_store.h"
#include "workers/job.h"
#include "workers/worker.h"

namespace shardwild {
namespace {

constexpr int64_t kRecords = 1000;

class BatchOrderTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    data_.count = kRecords;
    data_.num_classes = 2;
    SparseField f;
    f.name = "f";
    f.offsets.push_back(0);
    for (int64_t r = 0; r < kRecords; ++r) {
      f.ids.push_back(static_cast<uint64_t>(r));
      f.offsets.push_back(r + 1);
      data_.labels.push_back(1);
    }
    data_.fields.push_back(std::move(f));
    model_.head = HeadType::kBinary;
    model_.tables = {{"f", kRecords, 1, false, false, 0.01f}};
    model_.sparse = {{"f", "f", Pooling::kSum, true}};
    model_.layers = {{"dense", 1, Activation::kNone}};
    order_.resize(kRecords);
    for (int64_t i = 0; i < kRecords; ++i) order_[i] = static_cast<int32_t>(i);
    std::mt19937_64 rng(11);
    std::shuffle(order_.begin(), order_.end(), rng);
  }

  // A worker of batch `batch` over a fresh store (plain SGD), its data
  // packed when the test's parameter says so; the rows as they start.
  void Start(int64_t batch, const std::string& job) {
    absl::StatusOr<ModelSpec> spec = Model::Describe(model_, DataShape::Of(data_));
    ASSERT_TRUE(spec.ok()) << spec.status();
    OpenStoreOptions so;
    so.store.job_name = job;
    so.num_shards = 2;
    so.optimizer.type = OptimizerType::kSgd;
    so.optimizer.lr = 0.5f;
    so.tables = TableSpecsOf(*spec);
    so.seed = 3;
    opt_ = so.optimizer;
    auto store = ShmParamStore::Create(so, spec->variables);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    auto worker = Worker::Create(0, model_, batch, data_, store_.get(), engine_, /*seed=*/3);
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    if (GetParam()) {
      packed_ = worker_->model().PackRecords(data_);
      ASSERT_TRUE(packed_.has_value() && packed_->has_ids());
      worker_->set_packed_records(&*packed_);
    }
    initial_ = Rows();
  }

  std::vector<float> Rows() {
    std::vector<uint64_t> ids(kRecords);
    for (int64_t i = 0; i < kRecords; ++i) ids[i] = static_cast<uint64_t>(i);
    std::vector<float> rows(kRecords);
    RowScratch scratch;
    EXPECT_TRUE(store_->PullRows(0, ids, rows.data(), PullMode::kReadOnly, &scratch).ok());
    return rows;
  }

  // The records whose rows moved since Start.
  std::set<int32_t> Moved() {
    const std::vector<float> now = Rows();
    std::set<int32_t> moved;
    for (int64_t r = 0; r < kRecords; ++r) {
      if (now[r] != initial_[r]) moved.insert(static_cast<int32_t>(r));
    }
    return moved;
  }

  Dataset data_;
  ModelOptions model_;
  OptimizerOptions opt_;
  std::vector<int32_t> order_;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  std::unique_ptr<ShmParamStore> store_;
  std::unique_ptr<Worker> worker_;
  std::optional<PackedRecords> packed_;
  std::vector<float> initial_;
};

TEST_P(BatchOrderTest, ARangeTrainsEachOfItsRecordsAndNoOther) {
  // Batches of 100 or 16 one-line records, asked for in bursts of 1 line
  // (4 parts, each asked again by the load), 8 (4 parts of 25, or 2 of 8),
  // 32 (4 of 25, or the batch at once) and 1024 (the batch at once). 737
  // records are 7 whole batches and one of 37 (or 46 of 16 and one of 1).
  for (int64_t batch : {int64_t{100}, int64_t{16}}) {
    for (int burst : {1, 8, 32, 1024}) {
      SCOPED_TRACE(absl::StrCat("batch ", batch, " burst ", burst));
      Start(batch, absl::StrCat("sw-batch-order-", GetParam() ? "p" : "u", batch, "-", burst));
      worker_->set_prefetch_burst_lines(burst);
      constexpr int64_t kCount = 737;
      ASSERT_TRUE(worker_->Train(order_.data(), kCount, /*max_steps=*/-1, opt_, 0, 1, nullptr).ok());
      EXPECT_EQ(worker_->counters().steps.load(), (kCount + batch - 1) / batch);
      EXPECT_EQ(worker_->counters().samples.load(), kCount);
      const std::set<int32_t> want(order_.begin(), order_.begin() + kCount);
      EXPECT_EQ(Moved(), want);
    }
  }
}

TEST_P(BatchOrderTest, ACyclingRunWrapsRoundItsRange) {
  // 3 steps of 100 over a range of 250: the third batch is the range's last
  // 50 records, then its first 50 again. A run of 2 steps moves only the
  // first 200 records' rows.
  Start(100, absl::StrCat("sw-batch-cycle-", GetParam() ? "p" : "u"));
  ASSERT_TRUE(worker_->Train(order_.data(), 250, /*max_steps=*/2, opt_, 0, 0, nullptr).ok());
  EXPECT_EQ(Moved(), std::set<int32_t>(order_.begin(), order_.begin() + 200));
  Start(100, absl::StrCat("sw-batch-cycle2-", GetParam() ? "p" : "u"));
  ASSERT_TRUE(worker_->Train(order_.data(), 250, /*max_steps=*/3, opt_, 0, 0, nullptr).ok());
  EXPECT_EQ(worker_->counters().samples.load(), 300);
  EXPECT_EQ(Moved(), std::set<int32_t>(order_.begin(), order_.begin() + 250));
}

TEST_P(BatchOrderTest, AStoppedRunStartsItsNextCallAtTheRangesStart) {
  // A call cut short after its first step (its next batch already taken and
  // asked for) trains only that batch; the next call starts again at the
  // start of the range it is given.
  Start(100, absl::StrCat("sw-batch-stop-", GetParam() ? "p" : "u"));
  int steps = 0;
  ASSERT_TRUE(worker_->TrainRange(order_.data(), 500, opt_, 0, 0.001, 0, nullptr, [&] { return ++steps < 1; }).ok());
  EXPECT_EQ(steps, 1);
  EXPECT_EQ(Moved(), std::set<int32_t>(order_.begin(), order_.begin() + 100));
  ASSERT_TRUE(worker_->TrainRange(order_.data() + 600, 150, opt_, 0, 0.001, 1, nullptr).ok());
  std::set<int32_t> want(order_.begin(), order_.begin() + 100);
  want.insert(order_.begin() + 600, order_.begin() + 750);
  EXPECT_EQ(Moved(), want);
}

INSTANTIATE_TEST_SUITE_P(PackedOrNot, BatchOrderTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Packed" : "Fields"; });

}  // namespace
}  // namespace shardwild
