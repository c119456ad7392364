#include "core/data/prefetch_burst.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/base/huge_page_allocator.h"
#include "core/base/median.h"
#include "core/base/prefetch.h"
#include "core/base/random.h"
#include "core/base/step_clock.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace shardwild {

double BurstTiming::LostShare() const {
  const double miss = cold_ns - cached_ns;
  if (!(miss > 0)) return 1.0;
  return std::clamp((asked_ns - cached_ns) / miss, 0.0, 1.0);
}

int ChooseBurstLines(const std::vector<BurstTiming>& sizes) {
  if (sizes.empty()) return kDefaultPrefetchBurstLines;
  int lines = sizes.front().lines;
  for (const BurstTiming& t : sizes) {
    if (t.LostShare() > kMaxLostBurstShare) break;
    lines = t.lines;
  }
  return lines;
}

namespace {

#if defined(__x86_64__)

constexpr std::array<int, 8> kBurstSizes = {4, 8, 12, 16, 24, 32, 48, 64};
constexpr size_t kProbeBytes = size_t{8} << 20;  // 131,072 lines
constexpr int64_t kWaitNs = 10000;               // between the burst and its loads, as a step's compute

// The clock read once every earlier instruction has completed (lfence: the
// loads before it have their data), and before any later one starts.
uint64_t FencedNow() {
  _mm_lfence();
  const uint64_t t = StepClock::Now();
  _mm_lfence();
  return t;
}

// Independent loads, one a line, whose misses overlap; returns their sum so
// that they are not dropped.
uint64_t LoadLines(const char* base, const uint32_t* line, int n) {
  uint64_t sum = 0;
  for (int i = 0; i < n; ++i) sum += static_cast<unsigned char>(base[uint64_t{line[i]} * kCacheLineBytes]);
  return sum;
}

void FlushLines(const char* base, const uint32_t* line, int n) {
  for (int i = 0; i < n; ++i) _mm_clflush(base + uint64_t{line[i]} * kCacheLineBytes);
  _mm_mfence();
}

#endif

}  // namespace

PrefetchBurstProbe ProbePrefetchBurst(int rounds) {
  PrefetchBurstProbe probe;
#if defined(__x86_64__)
  const uint64_t start = StepClock::Now();
  rounds = std::max(rounds, 1);
  HugePageVector<char> buffer(kProbeBytes, 1);  // written, so every page is there
  const char* base = buffer.data();
  constexpr uint32_t kLines = kProbeBytes / kCacheLineBytes;
  std::array<std::array<std::vector<double>, 3>, kBurstSizes.size()> samples;
  std::array<uint32_t, kBurstSizes.back()> line{};
  uint64_t rng = 0x5eedb0a57ULL;
  uint64_t sink = 0;
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < kBurstSizes.size(); ++k) {
      const int n = kBurstSizes[k];
      // The burst first, on lines of pages not touched for a while (their
      // translations not cached, as a batch's scattered records' are not).
      for (int i = 0; i < n; ++i) line[i] = static_cast<uint32_t>(SplitMix64(rng) % kLines);
      FlushLines(base, line.data(), n);
      for (int i = 0; i < n; ++i) PrefetchLine(base + uint64_t{line[i]} * kCacheLineBytes);
      const uint64_t asked = StepClock::Now();
      while (StepClock::Nanoseconds(asked, StepClock::Now()) < kWaitNs) {
      }
      uint64_t t0 = FencedNow();
      sink += LoadLines(base, line.data(), n);
      uint64_t t1 = FencedNow();
      samples[k][1].push_back(static_cast<double>(StepClock::Nanoseconds(t0, t1)));
      // Then other lines, not asked for, and loaded again at once.
      for (int i = 0; i < n; ++i) line[i] = static_cast<uint32_t>(SplitMix64(rng) % kLines);
      FlushLines(base, line.data(), n);
      t0 = FencedNow();
      sink += LoadLines(base, line.data(), n);
      t1 = FencedNow();
      sink += LoadLines(base, line.data(), n);
      const uint64_t t2 = FencedNow();
      samples[k][0].push_back(static_cast<double>(StepClock::Nanoseconds(t0, t1)));
      samples[k][2].push_back(static_cast<double>(StepClock::Nanoseconds(t1, t2)));
    }
  }
  // The sums keep the loads; they are never used otherwise.
  asm volatile("" : : "r"(sink));
  for (size_t k = 0; k < kBurstSizes.size(); ++k) {
    BurstTiming t;
    t.lines = kBurstSizes[k];
    t.cold_ns = Median(std::move(samples[k][0]));
    t.asked_ns = Median(std::move(samples[k][1]));
    t.cached_ns = Median(std::move(samples[k][2]));
    probe.sizes.push_back(t);
  }
  // A clock too coarse to see a miss (or lines that the flush did not
  // reach) tells nothing: keep the default.
  if (probe.sizes.front().cold_ns - probe.sizes.front().cached_ns < 20.0) {
    probe.sizes.clear();
  } else {
    probe.measured = true;
    probe.lines = ChooseBurstLines(probe.sizes);
  }
  probe.seconds = StepClock::Seconds(start, StepClock::Now());
#else
  (void)rounds;
#endif
  return probe;
}

const PrefetchBurstProbe& MachinePrefetchBurst() {
  static const PrefetchBurstProbe probe = ProbePrefetchBurst();
  return probe;
}

}  // namespace shardwild
