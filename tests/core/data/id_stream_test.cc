#include "core/data/id_stream.h"

#include <algorithm>
#include <map>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

TEST(IdStreamTest, IdsAreInRangeAndDeterministic) {
  for (double s : {0.0, 1.05}) {
    const auto a = MakeIdStream(1000, s, 5000, 7);
    EXPECT_EQ(a.size(), 5000u);
    for (uint64_t id : a) EXPECT_LT(id, 1000u);
    EXPECT_EQ(a, MakeIdStream(1000, s, 5000, 7));
    EXPECT_NE(a, MakeIdStream(1000, s, 5000, 8));
  }
}

TEST(IdStreamTest, ZipfConcentratesOnFewRowsUniformDoesNot) {
  auto top_share = [](const std::vector<uint64_t>& ids) {
    std::map<uint64_t, int> counts;
    for (uint64_t id : ids) ++counts[id];
    int top = 0;
    for (const auto& [id, c] : counts) top = std::max(top, c);
    return static_cast<double>(top) / ids.size();
  };
  // Zipf(1.05) over 10000 ranks puts about 10% of draws on rank 0; uniform about 0.01% per row.
  EXPECT_GT(top_share(MakeIdStream(10000, 1.05, 100000, 1)), 0.05);
  EXPECT_LT(top_share(MakeIdStream(10000, 0.0, 100000, 1)), 0.001);
}

TEST(IdStreamTest, RankToRowMapIsABijection) {
  // With rows = 7 every rank appears under uniform draws; the map must hit every row.
  const auto ids = MakeIdStream(7, 0.0, 1000, 3);
  for (uint64_t r = 0; r < 7; ++r) EXPECT_NE(std::find(ids.begin(), ids.end(), r), ids.end()) << r;
}

}  // namespace
}  // namespace shardwild
