// Median: the middle value, the mean of the two middle ones for an even
// count, whatever the order given; 0 for none.
#include "core/base/median.h"

#include <vector>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

TEST(MedianTest, MiddleValueOrMeanOfTheTwoMiddleOnes) {
  EXPECT_EQ(Median({}), 0.0);
  EXPECT_EQ(Median({7}), 7.0);
  EXPECT_EQ(Median({30, 10, 20}), 20.0);
  EXPECT_EQ(Median({40, 10, 30, 20}), 25.0);
  // One wild round does not move it.
  EXPECT_EQ(Median({30, 31, 29, 1e9, 30}), 30.0);
}

}  // namespace
}  // namespace shardwild
