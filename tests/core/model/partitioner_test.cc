// Tests for the "div" row partitioner and TensorFlow's partitioner rules.
#include "core/model/partitioner.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

std::vector<int64_t> Sizes(const std::vector<RowRange>& ranges) {
  std::vector<int64_t> out;
  for (const RowRange& r : ranges) out.push_back(r.size());
  return out;
}

// The ranges are contiguous, in order, and cover [0, rows).
::testing::AssertionResult Covers(const std::vector<RowRange>& ranges, int64_t rows) {
  int64_t next = 0;
  for (size_t s = 0; s < ranges.size(); ++s) {
    if (ranges[s].begin != next || ranges[s].end < ranges[s].begin) {
      return ::testing::AssertionFailure() << "shard " << s << " is [" << ranges[s].begin << ", " << ranges[s].end
                                           << "), expected to begin at " << next;
    }
    next = ranges[s].end;
  }
  if (next != rows) return ::testing::AssertionFailure() << "ranges end at " << next << ", not " << rows;
  return ::testing::AssertionSuccess();
}

TEST(FixedShardsDivTest, UnevenSplitGivesExtraRowsToFirstShards) {
  const std::vector<RowRange> r = FixedShardsDiv(13, 5);
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(Sizes(r), (std::vector<int64_t>{3, 3, 3, 2, 2}));
  EXPECT_TRUE(Covers(r, 13));
  EXPECT_EQ(r[0].begin, 0);
  EXPECT_EQ(r[1].begin, 3);
  EXPECT_EQ(r[2].begin, 6);
  EXPECT_EQ(r[3].begin, 9);
  EXPECT_EQ(r[4].begin, 11);
  EXPECT_EQ(r[4].end, 13);
}

TEST(FixedShardsDivTest, EvenSplit) {
  const std::vector<RowRange> r = FixedShardsDiv(10, 2);
  EXPECT_EQ(Sizes(r), (std::vector<int64_t>{5, 5}));
  EXPECT_TRUE(Covers(r, 10));
}

TEST(FixedShardsDivTest, FewerRowsThanShards) {
  const std::vector<RowRange> r = FixedShardsDiv(2, 4);
  EXPECT_EQ(Sizes(r), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_TRUE(Covers(r, 2));
  EXPECT_EQ(r[2].begin, 2);
  EXPECT_EQ(r[3].begin, 2);
}

TEST(FixedShardsDivTest, OneShardTakesEverything) {
  const std::vector<RowRange> r = FixedShardsDiv(784, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].begin, 0);
  EXPECT_EQ(r[0].end, 784);
}

TEST(FixedShardsDivTest, ZeroRows) {
  const std::vector<RowRange> r = FixedShardsDiv(0, 3);
  EXPECT_EQ(Sizes(r), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_TRUE(Covers(r, 0));
}

TEST(FixedShardsDivTest, SizesDifferByAtMostOneAndNeverIncrease) {
  for (int64_t rows : {1, 7, 64, 100, 1000, 1001}) {
    for (int shards : {1, 2, 3, 5, 8, 64}) {
      const std::vector<RowRange> r = FixedShardsDiv(rows, shards);
      ASSERT_EQ(r.size(), static_cast<size_t>(shards));
      EXPECT_TRUE(Covers(r, rows)) << rows << " over " << shards;
      for (int s = 1; s < shards; ++s) {
        EXPECT_LE(r[s].size(), r[s - 1].size()) << rows << " over " << shards;
        EXPECT_LE(r[0].size() - r[s].size(), 1) << rows << " over " << shards;
      }
    }
  }
}


// ---- NumPartitions: TensorFlow's rules ---------------------------------------

constexpr int64_t kFloat = 4;  // bytes of a float32 element

PartitionerOptions Fixed(int num) {
  PartitionerOptions o;
  o.kind = PartitionerOptions::Kind::kFixedShards;
  o.max_shards = num;
  return o;
}

PartitionerOptions MinSize(int64_t min_shard_bytes, int max_shards) {
  PartitionerOptions o;
  o.kind = PartitionerOptions::Kind::kMinSize;
  o.min_shard_bytes = min_shard_bytes;
  o.max_shards = max_shards;
  return o;
}

PartitionerOptions MaxSize(int64_t max_shard_bytes, int max_shards = 0) {
  PartitionerOptions o;
  o.kind = PartitionerOptions::Kind::kMaxSize;
  o.max_shard_bytes = max_shard_bytes;
  o.max_shards = max_shards;
  return o;
}

TEST(NumPartitionsTest, FixedShardsIsMinOfShardsAndRows) {
  // TF: FixedShardsPartitioner(num_shards=2) on [10, 3] -> [2, 1].
  EXPECT_EQ(NumPartitions(Fixed(2), 10, 3 * kFloat, 8), 2);
  EXPECT_EQ(NumPartitions(Fixed(5), 13, kFloat, 5), 5);
  EXPECT_EQ(NumPartitions(Fixed(5), 3, kFloat, 5), 3);  // never more than the rows
  // 0 = the store's shard count, the default (and the old behaviour).
  EXPECT_EQ(NumPartitions(PartitionerOptions{}, 13, kFloat, 5), 5);
  // Never more than the store's shards, whatever max_shards says.
  EXPECT_EQ(NumPartitions(Fixed(8), 100, kFloat, 3), 3);
}

TEST(NumPartitionsTest, MinSizeFollowsTensorFlowExamples) {
  // TF docstring: MinSizePartitioner(min_shard_bytes=4, max_shards=2) on [6, 1] float32 -> 2;
  // with max_shards=10 -> 6 (24 bytes / 4 = 6, then capped by the 6 rows).
  EXPECT_EQ(NumPartitions(MinSize(4, 2), 6, kFloat, 16), 2);
  EXPECT_EQ(NumPartitions(MinSize(4, 10), 6, kFloat, 16), 6);
  // min_max_variable_partitioner: [1024, 1024] float32 with 256 KiB slices -> 16.
  EXPECT_EQ(NumPartitions(MinSize(256 << 10, 16), 1024, 1024 * kFloat, 16), 16);
  EXPECT_EQ(NumPartitions(MinSize(256 << 10, 8), 1024, 1024 * kFloat, 16), 8);
}

TEST(NumPartitionsTest, MinSizeOnAOneMebibyteVariable) {
  // 1 MiB = 1024 rows of 1 KiB; 256 KiB minimum -> 4 partitions, below max_shards 8.
  EXPECT_EQ(NumPartitions(MinSize(256 << 10, 8), 1024, 1 << 10, 8), 4);
  EXPECT_EQ(Sizes(PartitionRows(MinSize(256 << 10, 8), 1024, 1 << 10, 8, 0)),
            (std::vector<int64_t>{256, 256, 256, 256, 0, 0, 0, 0}));
  // A variable smaller than min_shard_bytes is not partitioned.
  EXPECT_EQ(NumPartitions(MinSize(256 << 10, 8), 100, 1 << 10, 8), 1);
  EXPECT_EQ(NumPartitions(MinSize(2 << 20, 8), 1024, 1 << 10, 8), 1);
  // max_shards and the store's shard count both cap it.
  EXPECT_EQ(NumPartitions(MinSize(256 << 10, 2), 1024, 1 << 10, 8), 2);
  EXPECT_EQ(NumPartitions(MinSize(256 << 10, 8), 1024, 1 << 10, 3), 3);
  EXPECT_EQ(NumPartitions(MinSize(256 << 10, 0), 1024, 1 << 10, 3), 3);
}

TEST(NumPartitionsTest, MinSizeRoundsUpLikeTensorFlow) {
  // TF computes ceil(total_bytes / min_slice_size): 1.5 minimums make 2
  // partitions (of 0.75 minimum each), not 1.
  EXPECT_EQ(NumPartitions(MinSize(16, 8), 6, kFloat, 8), 2);
  EXPECT_EQ(NumPartitions(MinSize(16, 8), 4, kFloat, 8), 1);
  EXPECT_EQ(NumPartitions(MinSize(16, 8), 5, kFloat, 8), 2);
}

TEST(NumPartitionsTest, MaxSizeFollowsTensorFlowExamples) {
  // TF docstring: MaxSizePartitioner(max_shard_bytes=4) on [6, 1] float32 -> 6;
  // with max_shards=2 -> 2; max_shard_bytes=1024 -> 1.
  EXPECT_EQ(NumPartitions(MaxSize(4), 6, kFloat, 16), 6);
  EXPECT_EQ(NumPartitions(MaxSize(4, 2), 6, kFloat, 16), 2);
  EXPECT_EQ(NumPartitions(MaxSize(1024), 6, kFloat, 16), 1);
}

TEST(NumPartitionsTest, MaxSizeKeepsEveryPartitionUnderTheLimit) {
  // 10 rows of 4 KiB, at most 12 KiB a partition: 3 rows fit, so 4 partitions (3,3,2,2).
  const PartitionerOptions o = MaxSize(12 << 10);
  EXPECT_EQ(NumPartitions(o, 10, 4 << 10, 8), 4);
  EXPECT_EQ(Sizes(PartitionRows(o, 10, 4 << 10, 4, 0)), (std::vector<int64_t>{3, 3, 2, 2}));
  // TF counts whole rows per partition, not bytes: 3 rows of 5 bytes with an
  // 8-byte limit need 3 partitions (ceil(15 / 8) = 2 would put 10 bytes in one).
  EXPECT_EQ(NumPartitions(MaxSize(8), 3, 5, 8), 3);
  // A row larger than the limit still makes one partition per row.
  EXPECT_EQ(NumPartitions(MaxSize(100), 5, 1000, 8), 5);
  // The store's shard count caps it; then partitions exceed the limit.
  EXPECT_EQ(NumPartitions(o, 10, 4 << 10, 2), 2);
  // For every shape that fits, no partition is over the limit.
  for (int64_t rows : {1, 2, 7, 13, 64, 100}) {
    for (int64_t row_bytes : {4, 12, 100, 4096}) {
      for (int64_t limit : {4, 50, 1000, 1 << 16}) {
        const int k = NumPartitions(MaxSize(limit), rows, row_bytes, 4096);
        for (const RowRange& r : FixedShardsDiv(rows, k)) {
          if (row_bytes <= limit) {
            EXPECT_LE(r.size() * row_bytes, limit) << rows << "x" << row_bytes << " / " << limit;
          }
        }
        if (k > 1) {  // as few partitions as possible: one fewer would not do
          const int64_t largest = FixedShardsDiv(rows, k - 1)[0].size();
          EXPECT_GT(largest * row_bytes, limit) << rows << "x" << row_bytes << " / " << limit;
        }
      }
    }
  }
}

TEST(NumPartitionsTest, StaysWithinOneAndTheShardsAndRows) {
  for (const PartitionerOptions& o : {Fixed(0), Fixed(3), MinSize(1, 0), MinSize(1 << 20, 1), MaxSize(1), MaxSize(1 << 30)}) {
    for (int64_t rows : {0, 1, 2, 9, 1000}) {
      for (int shards : {1, 2, 5, 64}) {
        const int k = NumPartitions(o, rows, 40, shards);
        EXPECT_GE(k, 1);
        EXPECT_LE(k, shards);
        EXPECT_LE(k, std::max<int64_t>(rows, 1));
      }
    }
  }
}

TEST(NumPartitionsTest, HugeVariablesDoNotOverflow) {
  // rows * row_bytes = 2^63, one more than int64_t holds; saturating
  // arithmetic would give 1 partition where 2 are due.
  const int64_t rows = int64_t{1} << 33, row_bytes = int64_t{1} << 30;
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(NumPartitions(MinSize(int64_t{1} << 62, 64), rows, row_bytes, 64), 2);
  EXPECT_EQ(NumPartitions(MinSize(max, 64), rows, row_bytes, 64), 2);
  EXPECT_EQ(NumPartitions(MinSize(1 << 20, 64), rows, row_bytes, 64), 64);
  EXPECT_EQ(NumPartitions(MaxSize(max), rows, row_bytes, 64), 2);  // 2^33 - 1 rows fit in one
}

// ---- PartitionRows -------------------------------------------------------------

// The non-empty ranges, sorted by row, tile [0, rows); each shard has at most one.
::testing::AssertionResult Tiles(const std::vector<RowRange>& ranges, int64_t rows) {
  std::vector<RowRange> sorted;
  for (const RowRange& r : ranges) {
    if (r.size() < 0) return ::testing::AssertionFailure() << "negative range [" << r.begin << ", " << r.end << ")";
    if (r.size() > 0) sorted.push_back(r);
  }
  std::sort(sorted.begin(), sorted.end(), [](const RowRange& a, const RowRange& b) { return a.begin < b.begin; });
  return Covers(sorted, rows);
}

TEST(PartitionRowsTest, FixedShardsFromShardZeroIsTheDivRule) {
  const std::vector<RowRange> r = PartitionRows(Fixed(5), 13, kFloat, 5, 0);
  EXPECT_EQ(Sizes(r), (std::vector<int64_t>{3, 3, 3, 2, 2}));
  EXPECT_TRUE(Covers(r, 13));
  // With the default options it matches FixedShardsDiv range for range,
  // empty ranges included.
  for (int64_t rows : {1, 2, 13, 100}) {
    for (int shards : {1, 3, 5}) {
      const std::vector<RowRange> a = PartitionRows(PartitionerOptions{}, rows, kFloat, shards, 0);
      const std::vector<RowRange> b = FixedShardsDiv(rows, shards);
      ASSERT_EQ(a.size(), b.size());
      for (size_t s = 0; s < a.size(); ++s) {
        EXPECT_EQ(a[s].begin, b[s].begin) << rows << " over " << shards << ", shard " << s;
        EXPECT_EQ(a[s].end, b[s].end) << rows << " over " << shards << ", shard " << s;
      }
    }
  }
}

TEST(PartitionRowsTest, FewerPartitionsThanShardsLeaveTheRestEmpty) {
  // MaxSize: 4 partitions (3,3,2,2) in an 8-shard store.
  const std::vector<RowRange> r = PartitionRows(MaxSize(12 << 10), 10, 4 << 10, 8, 0);
  ASSERT_EQ(r.size(), 8u);
  EXPECT_EQ(Sizes(r), (std::vector<int64_t>{3, 3, 2, 2, 0, 0, 0, 0}));
  EXPECT_TRUE(Covers(r, 10));
}

TEST(PartitionRowsTest, OnePartitionGoesWholeToFirstShard) {
  const std::vector<RowRange> r = PartitionRows(MinSize(256 << 10, 8), 100, 1 << 10, 4, 2);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(Sizes(r), (std::vector<int64_t>{0, 0, 100, 0}));
  EXPECT_EQ(r[2].begin, 0);
  EXPECT_EQ(r[2].end, 100);
  EXPECT_TRUE(Tiles(r, 100));
}

TEST(PartitionRowsTest, PlacementWrapsRoundAndEachShardStaysContiguous) {
  // 3 partitions of 7 rows (3,2,2) starting at shard 3 of 4: shards 3, 0, 1.
  const std::vector<RowRange> r = PartitionRows(Fixed(3), 7, kFloat, 4, 3);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[3].begin, 0);
  EXPECT_EQ(r[3].end, 3);
  EXPECT_EQ(r[0].begin, 3);
  EXPECT_EQ(r[0].end, 5);
  EXPECT_EQ(r[1].begin, 5);
  EXPECT_EQ(r[1].end, 7);
  EXPECT_EQ(r[2].size(), 0);
  EXPECT_TRUE(Tiles(r, 7));
}

TEST(PartitionRowsTest, AlwaysTilesTheRows) {
  for (const PartitionerOptions& o : {Fixed(0), Fixed(2), MinSize(64, 0), MaxSize(100)}) {
    for (int64_t rows : {1, 5, 13, 200}) {
      for (int shards : {1, 2, 5, 8}) {
        for (int first : {0, 1, shards - 1}) {
          const std::vector<RowRange> r = PartitionRows(o, rows, 12, shards, first);
          ASSERT_EQ(r.size(), static_cast<size_t>(shards));
          EXPECT_TRUE(Tiles(r, rows)) << rows << " over " << shards << " from " << first;
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardwild
