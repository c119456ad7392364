// Tests for OptimizerOptions: the linear schedule's values and the
// validation of schedule and loss_reduction (errors name the key); and the
// shared checks of tables and of the sparse optimizer.
#include "core/config/options.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

TEST(LinearScheduleTest, DecaysLinearlyFromLrToFinalLr) {
  OptimizerOptions o;
  o.lr = 0.5f;
  o.schedule = LrSchedule::kLinear;
  EXPECT_FLOAT_EQ(o.LrAt(0.0), 0.5f);
  EXPECT_FLOAT_EQ(o.LrAt(0.25), 0.375f);
  EXPECT_FLOAT_EQ(o.LrAt(0.5), 0.25f);
  EXPECT_FLOAT_EQ(o.LrAt(0.8), 0.1f);
  EXPECT_FLOAT_EQ(o.LrAt(1.0), 0.0f);
  // Progress outside [0, 1] is clamped.
  EXPECT_FLOAT_EQ(o.LrAt(-1.0), 0.5f);
  EXPECT_FLOAT_EQ(o.LrAt(2.0), 0.0f);
  // Towards final_lr instead of 0: final + (lr - final) * (1 - p).
  o.final_lr = 0.1f;
  EXPECT_FLOAT_EQ(o.LrAt(0.5), 0.3f);
  EXPECT_FLOAT_EQ(o.LrAt(0.75), 0.2f);
  EXPECT_FLOAT_EQ(o.LrAt(1.0), 0.1f);
}

TEST(LinearScheduleTest, RunsOverWhatTheWarmupLeaves) {
  OptimizerOptions o;
  o.lr = 1.0f;
  o.schedule = LrSchedule::kLinear;
  o.warmup = 0.2;
  o.warmup_start_lr = 0.0f;
  EXPECT_FLOAT_EQ(o.LrAt(0.0), 0.0f);
  EXPECT_FLOAT_EQ(o.LrAt(0.1), 0.5f);
  EXPECT_FLOAT_EQ(o.LrAt(0.2), 1.0f);  // the warmup's end: the decay starts at lr
  EXPECT_FLOAT_EQ(o.LrAt(0.6), 0.5f);  // half of the remaining 0.8
  EXPECT_FLOAT_EQ(o.LrAt(1.0), 0.0f);
}

TEST(LinearScheduleTest, LowerThanCosineEarlyHigherLate) {
  // Cosine keeps more of the rate in the first half and less in the second.
  OptimizerOptions linear, cosine;
  linear.lr = cosine.lr = 1.0f;
  linear.schedule = LrSchedule::kLinear;
  cosine.schedule = LrSchedule::kCosine;
  EXPECT_LT(linear.LrAt(0.25), cosine.LrAt(0.25));
  EXPECT_GT(linear.LrAt(0.75), cosine.LrAt(0.75));
  EXPECT_FLOAT_EQ(linear.LrAt(0.5), cosine.LrAt(0.5));
}

TEST(OptimizerValidateTest, LinearScheduleValidatesFinalLr) {
  OptimizerOptions o;
  o.lr = 0.5f;
  o.schedule = LrSchedule::kLinear;
  EXPECT_TRUE(o.Validate().ok());
  o.final_lr = 0.6f;
  const absl::Status s = o.Validate();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("optimizer.final_lr"), std::string::npos) << s;
}

TEST(OptimizerValidateTest, LossReductionDefaultsToTheMeanAndRejectsUnknownValues) {
  OptimizerOptions o;
  EXPECT_EQ(o.loss_reduction, LossReduction::kSumOverBatchSize);
  EXPECT_TRUE(o.Validate().ok());
  o.loss_reduction = LossReduction::kSum;
  EXPECT_TRUE(o.Validate().ok());
  o.loss_reduction = static_cast<LossReduction>(7);
  const absl::Status s = o.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("optimizer.loss_reduction"), std::string::npos) << s;
  EXPECT_NE(s.message().find("sum_over_batch_size or sum"), std::string::npos) << s;
}

TEST(OptimizerValidateTest, UnknownScheduleIsRejected) {
  OptimizerOptions o;
  o.schedule = static_cast<LrSchedule>(9);
  const absl::Status s = o.Validate();
  EXPECT_NE(s.message().find("optimizer.schedule"), std::string::npos) << s;
}

TEST(OptimizerValidateTest, SparseOptimizerErrorsNameTheSparseKey) {
  Config c;
  c.model.layers = {{"dense", 2, Activation::kNone}};
  c.data.train = "t";
  c.sparse_optimizer.emplace();
  c.sparse_optimizer->loss_reduction = static_cast<LossReduction>(5);
  const absl::Status s = c.Validate();
  EXPECT_NE(s.message().find("optimizer.sparse.loss_reduction"), std::string::npos) << s;
}

// A bad lr is named as such, not as the final_lr it bounds.
TEST(OptimizerValidateTest, LrIsCheckedBeforeTheRatesItBounds) {
  OptimizerOptions o;
  o.lr = -1.0f;
  EXPECT_EQ(std::string(o.Validate().message()), "optimizer.lr: must be a finite number > 0, got -1");
}

TEST(OptimizerValidateTest, ValidateSparseOptimizerNamesTheSparseKeys) {
  OptimizerOptions o;
  EXPECT_TRUE(ValidateSparseOptimizer(o).ok());
  o.rho = 2.0f;
  const absl::Status s = ValidateSparseOptimizer(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()), "optimizer.sparse.rho: must be in [0, 1), got 2");
}

TEST(ValidateTablesTest, ErrorsNameTheKeyTheIndexAndTheTable) {
  std::vector<TableOptions> tables(2);
  tables[0] = {"a", 10, 4};
  tables[1] = {"b", 10, 4};
  EXPECT_TRUE(ValidateTables(tables, "tables").ok());
  EXPECT_TRUE(ValidateTables({}, "tables").ok());
  const std::pair<std::function<void(std::vector<TableOptions>*)>, const char*> cases[] = {
      {[](auto* t) { (*t)[1].name = ""; }, "tables[1] ().name: must be 1..40 bytes"},
      {[](auto* t) { (*t)[1].name = std::string(41, 'x'); }, "must be 1..40 bytes"},
      {[](auto* t) { (*t)[1].name = "wide/x"; }, "tables[1] (wide/x).name: names starting with 'wide/' are the wide part's"},
      {[](auto* t) { (*t)[1].name = "a"; }, "tables[1] (a).name: table 'a' is defined twice"},
      {[](auto* t) { (*t)[0].rows = 0; }, "tables[0] (a).rows: must be >= 1, got 0"},
      {[](auto* t) { (*t)[1].dim = -2; }, "tables[1] (b).dim: must be >= 1, got -2"},
      {[](auto* t) { (*t)[0].evict_lru = true; }, "tables[0] (a).on_full: evict_lru needs kind: dynamic"},
      {[](auto* t) { (*t)[0].init_scale = -1; }, "tables[0] (a).init_scale: must be >= 0"},
  };
  for (const auto& [change, message] : cases) {
    std::vector<TableOptions> bad = tables;
    change(&bad);
    const absl::Status s = ValidateTables(bad, "tables");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_NE(std::string(s.message()).find(message), std::string::npos) << s << " lacks " << message;
  }
  // The model's tables are checked by the same rules, under model.tables.
  ModelOptions m;
  m.layers = {{"dense", 1, Activation::kNone}};
  m.tables = tables;
  m.tables[1].dim = 0;
  EXPECT_EQ(std::string(m.Validate().message()), "model.tables[1] (b).dim: must be >= 1, got 0");
}

TEST(LossReductionNameTest, NamesAreTheConfigValues) {
  EXPECT_STREQ(LossReductionName(LossReduction::kSumOverBatchSize), "sum_over_batch_size");
  EXPECT_STREQ(LossReductionName(LossReduction::kSum), "sum");
}

}  // namespace
}  // namespace shardwild
