// The prefetch burst: how the lost share is read from a size's timings, how
// the burst is chosen from them, and what the probe reports.
#include "core/data/prefetch_burst.h"

#include <vector>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

BurstTiming Timing(int lines, double cold, double asked, double cached) {
  BurstTiming t;
  t.lines = lines;
  t.cold_ns = cold;
  t.asked_ns = asked;
  t.cached_ns = cached;
  return t;
}

TEST(PrefetchBurstTest, LostShareIsTheMissTheBurstLeft) {
  EXPECT_DOUBLE_EQ(Timing(16, 230, 30, 30).LostShare(), 0.0);
  EXPECT_DOUBLE_EQ(Timing(32, 430, 230, 30).LostShare(), 0.5);
  EXPECT_DOUBLE_EQ(Timing(64, 700, 700, 50).LostShare(), 1.0);
  // Clamped: a burst loaded faster than the cached loads, or slower than cold.
  EXPECT_DOUBLE_EQ(Timing(8, 200, 20, 30).LostShare(), 0.0);
  EXPECT_DOUBLE_EQ(Timing(8, 200, 260, 30).LostShare(), 1.0);
  // Nothing to tell where cold is no slower than cached.
  EXPECT_DOUBLE_EQ(Timing(8, 30, 30, 30).LostShare(), 1.0);
  EXPECT_DOUBLE_EQ(Timing(8, 20, 10, 30).LostShare(), 1.0);
}

TEST(PrefetchBurstTest, TheBurstIsTheLastSizeBeforeTheFirstThatLosesLines) {
  EXPECT_EQ(ChooseBurstLines({}), kDefaultPrefetchBurstLines);
  // The 2026-12-06 EPYC guest: 16 lines arrive, 24 lose half.
  EXPECT_EQ(ChooseBurstLines({Timing(4, 200, 30, 30), Timing(8, 230, 40, 30), Timing(16, 260, 40, 30),
                              Timing(24, 340, 190, 30), Timing(32, 430, 240, 40)}),
            16);
  // At the threshold still arrives; just past it does not.
  const double at = 30 + kMaxLostBurstShare * 200;
  EXPECT_EQ(ChooseBurstLines({Timing(8, 230, 30, 30), Timing(16, 230, at, 30), Timing(32, 230, at + 1, 30)}), 16);
  // Every size arrives: the largest.
  EXPECT_EQ(ChooseBurstLines({Timing(8, 230, 30, 30), Timing(48, 500, 40, 30), Timing(64, 600, 50, 30)}), 64);
  // None does: the smallest.
  EXPECT_EQ(ChooseBurstLines({Timing(4, 200, 150, 30), Timing(8, 230, 200, 30)}), 4);
  // A larger size that happens to arrive after one that did not is not
  // taken: the first loss ends the search.
  EXPECT_EQ(ChooseBurstLines({Timing(8, 230, 30, 30), Timing(16, 260, 200, 30), Timing(24, 340, 40, 30)}), 8);
}

TEST(PrefetchBurstTest, TheProbeChoosesFromWhatItMeasured) {
  const PrefetchBurstProbe probe = ProbePrefetchBurst(/*rounds=*/4);
#if defined(__x86_64__)
  // A clock that cannot tell a miss from a hit leaves the default.
  if (!probe.measured) {
    EXPECT_TRUE(probe.sizes.empty());
    EXPECT_EQ(probe.lines, kDefaultPrefetchBurstLines);
    GTEST_SKIP() << "this machine's clock did not see the flushed lines' misses";
  }
  const std::vector<int> want = {4, 8, 12, 16, 24, 32, 48, 64};
  ASSERT_EQ(probe.sizes.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(probe.sizes[k].lines, want[k]);
    EXPECT_GT(probe.sizes[k].cold_ns, 0);
    EXPECT_GT(probe.sizes[k].asked_ns, 0);
    EXPECT_GT(probe.sizes[k].cached_ns, 0);
  }
  EXPECT_GE(probe.sizes[0].cold_ns - probe.sizes[0].cached_ns, 20.0);
  EXPECT_EQ(probe.lines, ChooseBurstLines(probe.sizes));
  EXPECT_GT(probe.seconds, 0);
#else
  EXPECT_FALSE(probe.measured);
  EXPECT_TRUE(probe.sizes.empty());
  EXPECT_EQ(probe.lines, kDefaultPrefetchBurstLines);
#endif
}

TEST(PrefetchBurstTest, TheMachinesBurstIsMeasuredOnce) {
  const PrefetchBurstProbe& first = MachinePrefetchBurst();
  const PrefetchBurstProbe& again = MachinePrefetchBurst();
  EXPECT_EQ(&first, &again);
  EXPECT_GE(first.lines, 4);
  EXPECT_LE(first.lines, 64);
}

}  // namespace
}  // namespace shardwild
