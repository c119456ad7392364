// StepClock against std::chrono::steady_clock over the same spans, and its
// choice of counter against the kernel's (a wrong rate or a wrong choice
// would scale every phase time that `shardwild bench` and the live metrics
// report).
#include "core/base/step_clock.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

TEST(StepClockTest, UsesTheCounterOnlyWhereTheKernelKeepsTimeWithIt) {
  std::ifstream in("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string source;
  in >> source;
  if (source != "tsc") {
    EXPECT_FALSE(StepClock::UsesTsc()) << "clocksource " << source;
  }
#if !defined(__x86_64__)
  EXPECT_FALSE(StepClock::UsesTsc());
#endif
  if (!StepClock::UsesTsc()) {
    EXPECT_EQ(StepClock::NanosecondsPerTick(), 1.0);
  }
  EXPECT_GT(StepClock::NanosecondsPerTick(), 0.0);
}

TEST(StepClockTest, SpansAgreeWithSteadyClock) {
  // A 50 ms span measured by both clocks, their reads side by side at each
  // end. A thread preempted between two of those reads skews one span by
  // its time away, so the best of 5 spans is compared: within 0.5%.
  double best = 1.0;
  for (int attempt = 0; attempt < 5 && best > 0.005; ++attempt) {
    const auto s0 = std::chrono::steady_clock::now();
    const uint64_t c0 = StepClock::Now();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint64_t c1 = StepClock::Now();
    const auto s1 = std::chrono::steady_clock::now();
    const double steady_ns = std::chrono::duration<double, std::nano>(s1 - s0).count();
    const double step_ns = static_cast<double>(StepClock::Nanoseconds(c0, c1));
    EXPECT_GT(step_ns, 0.0);
    best = std::min(best, std::abs(step_ns / steady_ns - 1.0));
    EXPECT_NEAR(StepClock::Seconds(c0, c1), step_ns * 1e-9, 1e-6);
  }
  EXPECT_LT(best, 0.005) << "StepClock's spans differ from steady_clock's by " << best * 100 << "%";
}

TEST(StepClockTest, NeverGoesBackOnOneThreadAndAReversedSpanIsZero) {
  uint64_t last = StepClock::Now();
  for (int i = 0; i < 100000; ++i) {
    const uint64_t now = StepClock::Now();
    ASSERT_GE(now, last) << i;
    last = now;
  }
  const uint64_t a = StepClock::Now();
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const uint64_t b = StepClock::Now();
  EXPECT_GT(StepClock::Nanoseconds(a, b), 0);
  EXPECT_EQ(StepClock::Nanoseconds(b, a), 0);
  EXPECT_EQ(StepClock::Nanoseconds(a, a), 0);
}

TEST(StepClockTest, ThreadsShareItsOrigin) {
  // A read on another thread, after one here and before another, falls
  // between them (counters a few ticks apart on two cores are tolerated by
  // Nanoseconds, so 1 us of slack).
  for (int i = 0; i < 20; ++i) {
    const uint64_t before = StepClock::Now();
    uint64_t there = 0;
    std::thread t([&] { there = StepClock::Now(); });
    t.join();
    const uint64_t after = StepClock::Now();
    const double slack_ticks = 1000.0 / StepClock::NanosecondsPerTick();
    EXPECT_GE(static_cast<double>(there) + slack_ticks, static_cast<double>(before)) << i;
    EXPECT_LE(static_cast<double>(there), static_cast<double>(after) + slack_ticks) << i;
  }
}

}  // namespace
}  // namespace shardwild
