// A tiny `bench store` run: the report is complete and its rates positive;
// the random-row bound's rows and what it leaves in them.
#include "workers/store_bench.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "workers/worker_pool.h"

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
// Two regions of different strides: each thread's addresses are rows of
// its own residue (row space index = t mod T), at the row's place in its
// region, and the sequence's order is kept.
TEST(RandomRowBoundTest, ThreadsKeepToTheirOwnRows) {
  std::vector<char> a(7 * 64), b(5 * 96);
  const std::vector<RowRegion> regions = {{a.data(), 7, 64}, {b.data(), 5, 96}};
  const std::vector<std::vector<uint64_t>> rows_of = {{0, 1, 6, 7, 8, 11}, {0, 5, 7, 11, 2}};
  absl::StatusOr<RandomRowBound> bound = RandomRowBound::Create(regions, 48, rows_of);
  ASSERT_TRUE(bound.ok()) << bound.status();
  auto place = [&](uint64_t row) { return row < 7 ? a.data() + row * 64 : b.data() + (row - 7) * 96; };
  // Thread 0: even rows; 11 -> 10. Thread 1: odd rows; 0 -> 1, 2 -> 3,
  // and 11 stays (12 would be past the 12 rows).
  const std::vector<std::vector<uint64_t>> want = {{0, 0, 6, 6, 8, 10}, {1, 5, 7, 11, 3}};
  for (int t = 0; t < 2; ++t) {
    const std::vector<char*>& got = bound->AddressesForTest(t);
    ASSERT_EQ(got.size(), want[t].size()) << t;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], place(want[t][i])) << t << " " << i;
  }
}

// The bound reads and writes back every word it covers, bit for bit: rows
// of any float bits (NaNs, denormals, bf16 pairs) keep them, and so do the
// bytes past row_bytes and between rows.
TEST(RandomRowBoundTest, LeavesTheRowsAsTheyWere) {
  constexpr int64_t kRows = 4096, kStride = 80;
  std::vector<uint32_t> words(kRows * kStride / 4);
  std::mt19937 rng(7);
  for (uint32_t& w : words) w = rng();
  words[0] = 0x7FA00000u;  // a signalling NaN: float arithmetic would quiet it
  words[1] = 0x00000001u;  // a denormal
  const std::vector<uint32_t> before = words;
  char* base = reinterpret_cast<char*>(words.data());
  std::vector<std::vector<uint64_t>> rows_of(2);
  for (int t = 0; t < 2; ++t) {
    for (int64_t i = 0; i < 3 * kRows; ++i) rows_of[t].push_back(static_cast<uint64_t>(rng() % kRows));
  }
  absl::StatusOr<RandomRowBound> bound = RandomRowBound::Create({{base, kRows, kStride}}, 64, rows_of);
  ASSERT_TRUE(bound.ok()) << bound.status();
  WorkerPool pool(2, [](int) { return absl::OkStatus(); });
  absl::StatusOr<RandomRowBound::Rate> rate = bound->Measure(pool, 0.01, 0.05);
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_GT(rate->rows_per_s, 0);
  EXPECT_GE(rate->wall_s, 0.05);
  EXPECT_EQ(std::memcmp(words.data(), before.data(), words.size() * sizeof(uint32_t)), 0);
}

TEST(RandomRowBoundTest, BadArgumentsAreRefused) {
  std::vector<char> a(4 * 64);
  const std::vector<RowRegion> regions = {{a.data(), 4, 64}};
  const std::vector<std::vector<uint64_t>> two = {{0}, {1}};
  auto message = [](const absl::StatusOr<RandomRowBound>& b) { return std::string(b.status().message()); };
  EXPECT_NE(message(RandomRowBound::Create(regions, 62, two)).find("multiple of 4"), std::string::npos);
  EXPECT_NE(message(RandomRowBound::Create(regions, 0, two)).find("multiple of 4"), std::string::npos);
  EXPECT_NE(message(RandomRowBound::Create(regions, 128, two)).find("cannot hold rows of 128 bytes"), std::string::npos);
  EXPECT_NE(message(RandomRowBound::Create(regions, 64, {{0}, {4}})).find("past the 4 rows"), std::string::npos);
  EXPECT_NE(message(RandomRowBound::Create(regions, 64, {{0}, {}})).find("no rows for thread 1"), std::string::npos);
  EXPECT_NE(message(RandomRowBound::Create(regions, 64, {})).find("0 threads"), std::string::npos);
  EXPECT_NE(message(RandomRowBound::Create({{a.data(), 1, 64}}, 64, two)).find("1 rows for 2 threads"),
            std::string::npos);
  absl::StatusOr<RandomRowBound> ok = RandomRowBound::Create(regions, 64, two);
  ASSERT_TRUE(ok.ok()) << ok.status();
  WorkerPool one(1, [](int) { return absl::OkStatus(); });
  EXPECT_EQ(ok->Measure(one, 0, 0.01).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace shardwild
