// Partitioners: how a variable's rows are split across shards.
//
// As in TensorFlow's ParameterServerStrategy, a partitioner only chooses HOW
// MANY partitions a variable gets along axis 0 (NumPartitions); the rows are
// then dealt out with the "div" rule: `rows` rows over `k` partitions gives
// the first `rows % k` partitions one extra row, so 13 rows over 5 is
// 3,3,3,2,2.
//
// The partition count follows tf.distribute.experimental.partitioners (the
// "bytes" of a variable are rows * row_bytes; Shardwild stores float32, so
// TF's bytes_per_string never applies):
//   FixedShards  k = min(num_shards_arg, rows)
//   MinSize      k = max(1, min(rows, max_shards, ceil(total_bytes / min_shard_bytes)))
//                Like TF (min_max_variable_partitioner) this rounds UP, so a
//                partition may hold less than min_shard_bytes: 1.5x
//                min_shard_bytes gives 2 partitions of 0.75x each.
//   MaxSize      rows_per_partition = max(1, floor(max_shard_bytes / row_bytes)),
//                k = ceil(rows / rows_per_partition), then capped by max_shards
//                (TF's variable_axis_size_partitioner). With the div rule no
//                partition exceeds max_shard_bytes unless a single row does
//                or a cap applies.
// On top of TF's rules, k never exceeds the store's shard count (each shard
// holds at most one partition of a variable) nor `rows`, and is at least 1.
//
// All functions here are pure and thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config/options.h"

namespace shardwild {

struct RowRange {
  int64_t begin = 0;  // first row
  int64_t end = 0;    // one past the last row
  int64_t size() const { return end - begin; }
};

// One range per shard, contiguous and covering [0, rows). shards >= 1.
std::vector<RowRange> FixedShardsDiv(int64_t rows, int shards);

// The number of partitions of a variable of `rows` rows of `row_bytes` bytes
// each in a store of `num_shards` shards, by the rules above: in
// [1, min(num_shards, max(rows, 1))]. `options` must have passed Validate();
// rows >= 0, row_bytes >= 1, num_shards >= 1.
int NumPartitions(const PartitionerOptions& options, int64_t rows, int64_t row_bytes, int num_shards);

// Where the rows of such a variable go: one range per shard (num_shards of
// them). Its k = NumPartitions(...) div-rule slices, in row order, go to shards
// first_shard, first_shard + 1, ... (mod num_shards); every other shard gets
// the empty range [rows, rows). Since k <= num_shards, a shard never gets two
// slices, so each shard's rows are one contiguous range even when the
// placement wraps round; the non-empty ranges, sorted by `begin`, tile
// [0, rows). first_shard is taken modulo num_shards; num_shards >= 1.
std::vector<RowRange> PartitionRows(const PartitionerOptions& options, int64_t rows, int64_t row_bytes,
                                    int num_shards, int first_shard);

}  // namespace shardwild
