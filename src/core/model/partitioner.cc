#include "core/model/partitioner.h"

#include <algorithm>

namespace shardwild {
namespace {

// ceil(a / b) for a >= 0, b >= 1, without overflow (a may be near 2^127).
__int128 CeilDiv(__int128 a, __int128 b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace

std::vector<RowRange> FixedShardsDiv(int64_t rows, int shards) {
  std::vector<RowRange> out(shards);
  const int64_t base = rows / shards, extra = rows % shards;
  int64_t begin = 0;
  for (int s = 0; s < shards; ++s) {
    const int64_t n = base + (s < extra ? 1 : 0);
    out[s] = {begin, begin + n};
    begin += n;
  }
  return out;
}

int NumPartitions(const PartitionerOptions& options, int64_t rows, int64_t row_bytes, int num_shards) {
  // Everything is computed in 128 bits: rows * row_bytes may not fit in 64.
  const __int128 r = std::max<int64_t>(rows, 0);
  const __int128 rb = std::max<int64_t>(row_bytes, 1);
  __int128 cap = std::max(num_shards, 1);
  if (options.max_shards > 0) cap = std::min<__int128>(cap, options.max_shards);
  __int128 k = cap;  // kFixedShards: max_shards is FixedShardsPartitioner's num_shards
  switch (options.kind) {
    case PartitionerOptions::Kind::kFixedShards:
      break;
    case PartitionerOptions::Kind::kMinSize:
      k = std::min(cap, CeilDiv(r * rb, std::max<int64_t>(options.min_shard_bytes, 1)));
      break;
    case PartitionerOptions::Kind::kMaxSize: {
      const __int128 rows_per_partition = std::max<__int128>(1, std::max<int64_t>(options.max_shard_bytes, 1) / rb);
      k = std::min(cap, CeilDiv(r, rows_per_partition));
      break;
    }
  }
  k = std::min(k, std::max<__int128>(r, 1));
  return static_cast<int>(std::max<__int128>(k, 1));
}

std::vector<RowRange> PartitionRows(const PartitionerOptions& options, int64_t rows, int64_t row_bytes,
                                    int num_shards, int first_shard) {
  std::vector<RowRange> out(num_shards, RowRange{rows, rows});
  const int k = NumPartitions(options, rows, row_bytes, num_shards);
  const std::vector<RowRange> slices = FixedShardsDiv(rows, k);
  const int first = ((first_shard % num_shards) + num_shards) % num_shards;
  for (int i = 0; i < k; ++i) out[(first + i) % num_shards] = slices[i];
  return out;
}

}  // namespace shardwild
