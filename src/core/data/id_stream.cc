#include "core/data/id_stream.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace shardwild {

std::vector<uint64_t> MakeIdStream(int64_t rows, double zipf_s, int64_t count, uint64_t seed) {
  std::vector<uint64_t> ids(count);
  std::mt19937_64 rng(seed);
  if (zipf_s <= 0) {
    std::uniform_int_distribution<int64_t> u(0, rows - 1);
    for (auto& id : ids) id = static_cast<uint64_t>(u(rng));
  } else {
    std::vector<double> cdf(rows);
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) cdf[r] = (sum += std::pow(static_cast<double>(r + 1), -zipf_s));
    std::uniform_real_distribution<double> u(0, sum);
    for (auto& id : ids) {
      const int64_t rank = std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
      id = static_cast<uint64_t>(std::min(rank, rows - 1));
    }
  }
  for (auto& id : ids) id = static_cast<uint64_t>((static_cast<unsigned __int128>(id) * 2654435761u) % rows);
  return ids;
}

}  // namespace shardwild
