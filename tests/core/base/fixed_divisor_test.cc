// FixedDivisor: x / d and x % d as the division gives them, for every
// divisor up to the shard limit, at and around each divisor's multiples,
// at the numerator limit and for random numerators below it.
#include "core/base/fixed_divisor.h"

#include <cstdint>
#include <random>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

testing::AssertionResult Divides(const FixedDivisor& f, uint64_t x) {
  const uint64_t d = f.divisor();
  const uint64_t q = f.Quotient(x);
  const uint64_t r = f.Remainder(x, q);
  if (q == x / d && r == x % d) return testing::AssertionSuccess();
  return testing::AssertionFailure() << x << " / " << d << " gave " << q << " remainder " << r << ", not " << x / d
                                     << " remainder " << x % d;
}

TEST(FixedDivisorTest, EveryDivisorUpToTheShardLimit) {
  std::mt19937_64 rng(11);
  constexpr uint64_t kLast = FixedDivisor::kNumeratorLimit - 1;
  for (uint64_t d = 1; d <= FixedDivisor::kMaxDivisor; ++d) {
    const FixedDivisor f(static_cast<uint32_t>(d));
    ASSERT_EQ(f.divisor(), d);
    // Small numerators, the multiples of d near the top and their
    // neighbours (where a quotient rounded up would show), the largest.
    for (uint64_t x = 0; x < 3 * d + 2; ++x) ASSERT_TRUE(Divides(f, x));
    const uint64_t top = kLast / d * d;
    for (uint64_t k = 0; k < 4 && top >= k * d + 1; ++k) {
      ASSERT_TRUE(Divides(f, top - k * d));
      ASSERT_TRUE(Divides(f, top - k * d - 1));
      if (top - k * d + 1 <= kLast) {
        ASSERT_TRUE(Divides(f, top - k * d + 1));
      }
    }
    ASSERT_TRUE(Divides(f, kLast));
    for (int i = 0; i < 256; ++i) ASSERT_TRUE(Divides(f, rng() % FixedDivisor::kNumeratorLimit));
    // A table's usual ids: below 2^40.
    for (int i = 0; i < 64; ++i) ASSERT_TRUE(Divides(f, rng() >> 24));
  }
}

}  // namespace
}  // namespace shardwild
