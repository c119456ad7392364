// StreamFeed against a sequential reference: the items of a task hold each
// of its records exactly once, in windows of the given size, in an order
// fixed by the seed, epoch and task; a task stopped early leaves nothing
// running; the memory budget's arithmetic.
#include "workers/stream_feed.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config/config.h"
#include "core/data/data_gen.h"
#include "gtest/gtest.h"
#include "tests/workers/test_config.h"

namespace shardwild {
namespace {

using testdata::TempDir;

std::unique_ptr<ColumnCache> MakeCache(const TempDir& dir, int64_t rows) {
  DataGenOptions g;
  g.kind = "criteo";
  g.rows = rows;
  g.out = dir.path() + "/d.tsv";
  EXPECT_TRUE(GenerateData(g).ok());
  ReadOptions o;
  o.format = DataFormat::kCriteo;
  absl::StatusOr<std::unique_ptr<ColumnCache>> c = ColumnCache::Open({g.out}, o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// A record's identity for the multiset checks: its dense features and ids.
std::vector<double> Key(const Dataset& d, int64_t r) {
  std::vector<double> k(d.dense.begin() + r * d.dense_dim, d.dense.begin() + (r + 1) * d.dense_dim);
  k.push_back(d.labels[static_cast<size_t>(r)]);
  for (const SparseField& f : d.fields) {
    for (int64_t i = f.offsets[r]; i < f.offsets[r + 1]; ++i) k.push_back(static_cast<double>(f.ids[i]));
    k.push_back(-1);
  }
  return k;
}

// All the items of one task, in order, as record keys, and the item sizes.
std::vector<std::vector<double>> Feed(StreamFeed& feed, int epoch, int64_t first, int64_t count,
                                      std::vector<int64_t>* sizes) {
  std::vector<std::vector<double>> keys;
  feed.Start(epoch, first, count);
  while (true) {
    absl::StatusOr<const Dataset*> item = feed.Next();
    EXPECT_TRUE(item.ok()) << item.status();
    if (!item.ok() || *item == nullptr) break;
    sizes->push_back((*item)->count);
    for (int64_t r = 0; r < (*item)->count; ++r) keys.push_back(Key(**item, r));
  }
  feed.Finish();
  return keys;
}

TEST(StreamFeedTest, ItemsHoldEveryRecordOfTheTaskOnceWindowByWindow) {
  TempDir dir;
  std::unique_ptr<ColumnCache> cache = MakeCache(dir, 2000);
  ASSERT_TRUE(cache);
  Dataset all;
  ASSERT_TRUE(cache->Read(0, 2000, &all).ok());
  StreamFeedOptions o;
  o.window = 300;
  o.item_records = 100;
  o.depth = 2;
  o.seed = 7;
  StreamFeed feed(*cache, o);
  const int64_t first = 150, count = 1234;
  std::vector<int64_t> sizes;
  const std::vector<std::vector<double>> got = Feed(feed, 3, first, count, &sizes);
  ASSERT_EQ(static_cast<int64_t>(got.size()), count);
  // Window w (records [first + 300w, ...)) comes whole before the next one.
  for (int64_t w = 0; w * 300 < count; ++w) {
    const int64_t lo = w * 300, hi = std::min<int64_t>(count, lo + 300);
    std::multiset<std::vector<double>> want, have(got.begin() + lo, got.begin() + hi);
    for (int64_t r = first + lo; r < first + hi; ++r) want.insert(Key(all, r));
    EXPECT_EQ(have, want) << "window " << w;
  }
  // Items: 100 records, the windows' last ones shorter (300 = 3 x 100; 1234 = 4 x 300 + 34).
  EXPECT_EQ(sizes.size(), 13u);
  EXPECT_EQ(sizes.back(), 34);
  // Shuffled, and the same again for the same task and epoch, not another epoch.
  std::vector<std::vector<double>> in_order;
  for (int64_t r = first; r < first + count; ++r) in_order.push_back(Key(all, r));
  EXPECT_NE(got, in_order);
  std::vector<int64_t> ignored;
  EXPECT_EQ(Feed(feed, 3, first, count, &ignored), got);
  EXPECT_NE(Feed(feed, 4, first, count, &ignored), got);
  // The peak: the one window of 300 records and at most depth + 1 items of 100.
  EXPECT_GE(feed.peak_bytes(), DatasetBytes(all) * 300 / 2000);
  EXPECT_LE(feed.peak_bytes(), 2 * DatasetBytes(all) * (300 + 3 * 100) / 2000);
}

// A task given up in the middle (the worker's job stopped): Finish stops the
// reader, which may be waiting for a free item, and the next task is whole.
TEST(StreamFeedTest, FinishInTheMiddleStopsTheReader) {
  TempDir dir;
  std::unique_ptr<ColumnCache> cache = MakeCache(dir, 1000);
  ASSERT_TRUE(cache);
  StreamFeedOptions o;
  o.window = 200;
  o.item_records = 10;
  o.depth = 1;
  StreamFeed feed(*cache, o);
  feed.Start(1, 0, 1000);
  ASSERT_TRUE(feed.Next().ok());
  feed.Finish();
  std::vector<int64_t> sizes;
  EXPECT_EQ(Feed(feed, 1, 0, 1000, &sizes).size(), 1000u);
  EXPECT_EQ(cache->Read(0, 1001, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StreamFeedTest, OptionsFitTheBudget) {
  Config c;
  c.source = "x.yaml";
  c.train.batch_size = 100;
  c.train.pull_every = 2;
  c.data.prefetch_batches = 5;
  c.data.records_per_task = 100000;
  c.data.memory_budget_mb = 10;
  // 1000 bytes a record, 2 readers: 5 MiB each. Items of more rounds
  // (kItemSteps steps) would leave a smaller window than items of one
  // round, 200 records: 3 ahead + 1 held, and the rest the window.
  absl::StatusOr<StreamFeedOptions> o = StreamFeedOptionsFor(c, 1000, 2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->item_records, 200);
  EXPECT_EQ(o->depth, 3);
  const double budget = 5.0 * (1 << 20), items = 4 * 200 * 1000.0;
  EXPECT_EQ(o->window, static_cast<int64_t>((budget - items) / (1000.0 * 200)) * 200);
  EXPECT_LE(o->window * 1000.0 + items, budget);
  // At most one task's records.
  c.data.records_per_task = 450;
  // (A task of 3 rounds: one item of 600 records, its window as large as
  // 3 items of one round would make it.)
  EXPECT_EQ(StreamFeedOptionsFor(c, 1000, 2)->window, 600);
  EXPECT_EQ(StreamFeedOptionsFor(c, 1000, 2)->item_records, 600);
  EXPECT_EQ(StreamFeedOptionsFor(c, 1000, 2)->depth, 1);  // 6 steps ahead
  // Items of 16 rounds would leave a window 4% smaller than one round's
  // (the task's 100000 records): halved to 8 rounds.
  c.data.records_per_task = 100000;
  c.data.memory_budget_mb = 200;
  o = StreamFeedOptionsFor(c, 1000, 2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->item_records, 1600);
  EXPECT_EQ(o->window, 63 * 1600);
  // A budget with room: items of kItemSteps steps (16 rounds of 2), one
  // ahead; the window a task's records, rounded up to whole items.
  c.data.memory_budget_mb = 400;
  o = StreamFeedOptionsFor(c, 1000, 2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->item_records, kItemSteps * 100);
  EXPECT_EQ(o->depth, 1);
  EXPECT_EQ(o->window, 32 * 3200);
  // Nor than the shuffle buffer asked for (rounded up to a round): 5 rounds.
  c.data.records_per_task = 100000;
  c.data.shuffle_buffer = 900;
  o = StreamFeedOptionsFor(c, 1000, 2);
  EXPECT_EQ(o->item_records, 1000);
  EXPECT_EQ(o->window, 1000);
  // pull_every 1: 32 rounds of one step.
  c.data.shuffle_buffer = 0;
  c.train.pull_every = 1;
  EXPECT_EQ(StreamFeedOptionsFor(c, 1000, 2)->item_records, kItemSteps * 100);
  // An explicit window that does not fit, and a budget below one item.
  c.train.pull_every = 2;
  c.data.memory_budget_mb = 10;
  c.data.shuffle_buffer = 10000;
  absl::StatusOr<StreamFeedOptions> bad = StreamFeedOptionsFor(c, 1000, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("x.yaml: data.shuffle_buffer: data.memory_budget_mb 10 shared by 2 readers"),
            std::string::npos)
      << bad.status();
  c.data.shuffle_buffer = 0;
  c.data.memory_budget_mb = 1;
  bad = StreamFeedOptionsFor(c, 1000, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("raise data.memory_budget_mb"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace shardwild
