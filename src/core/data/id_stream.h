// Synthetic row-id streams for benchmarks: uniform, or Zipf-distributed ranks
// scattered over the rows so that hot rows are spread across the table.
#pragma once

#include <cstdint>
#include <vector>

namespace shardwild {

// `count` ids in [0, rows). Ranks are drawn uniformly, or with probability
// proportional to (rank + 1)^-zipf_s when zipf_s > 0; rank r becomes row
// (r * 2654435761) mod rows, a bijection whenever rows is not a multiple of
// that prime (any rows below 2654435761). Deterministic for (rows, zipf_s,
// count, seed).
std::vector<uint64_t> MakeIdStream(int64_t rows, double zipf_s, int64_t count, uint64_t seed);

}  // namespace shardwild
