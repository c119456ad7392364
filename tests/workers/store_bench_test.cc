// A tiny `bench store` run: the report is complete and its rates positive.
#include "workers/store_bench.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

TEST(StoreBenchTest, TinyRunReportsRatesAndBound) {
  for (EmbeddingKind kind : {EmbeddingKind::kStatic, EmbeddingKind::kDynamic}) {
    SCOPED_TRACE(EmbeddingKindName(kind));
    StoreBenchOptions o;
    o.rows = 10000;
    o.dim = 16;
    o.seconds = 0.05;
    o.warmup_seconds = 0.01;
    o.threads = 2;
    o.shards = 2;
    o.kind = kind;
    o.ids = IdDistribution::kZipf;
    absl::StatusOr<StoreBenchReport> r = RunStoreBench(o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->rows_per_s, 0);
    EXPECT_GT(r->bound_rows_per_s, 0);
    EXPECT_GT(r->ratio, 0);
    EXPECT_DOUBLE_EQ(r->ratio, r->rows_per_s / r->bound_rows_per_s);
    EXPECT_EQ(r->row_bytes, 2 * 16 * 4);  // adagrad: params + one slot
    EXPECT_DOUBLE_EQ(r->bytes_per_s, r->rows_per_s * 2 * r->row_bytes);
    EXPECT_NE(FormatStoreBenchReport(*r).find("ratio"), std::string::npos);
  }
}

TEST(StoreBenchTest, BadOptionsNameTheFlag) {
  StoreBenchOptions o;
  o.rows = 0;
  EXPECT_NE(std::string(RunStoreBench(o).status().message()).find("--rows"), std::string::npos);
  o = StoreBenchOptions();
  o.threads = 0;
  EXPECT_NE(std::string(RunStoreBench(o).status().message()).find("--threads"), std::string::npos);
}

// Every update mode runs, with 1 and 2 threads (sync: 2 workers of one
// aggregator, so a round waits for both or for the one still in).
TEST(StoreBenchTest, EveryUpdateModeRuns) {
  for (UpdateMode mode : {UpdateMode::kHogwild, UpdateMode::kRowLock, UpdateMode::kSync}) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(absl::StrCat(UpdateModeName(mode), " x", threads));
      StoreBenchOptions o;
      o.rows = 5000;
      o.dim = 16;
      o.seconds = 0.05;
      o.warmup_seconds = 0.01;
      o.threads = threads;
      o.update = mode;
      o.optimizer = OptimizerType::kAdam;
      absl::StatusOr<StoreBenchReport> r = RunStoreBench(o);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_GT(r->rows_per_s, 0);
      EXPECT_EQ(r->row_bytes, 3 * 16 * 4);
      EXPECT_NE(FormatStoreBenchReport(*r).find(absl::StrCat("ps.update ", UpdateModeName(mode))), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace shardwild
