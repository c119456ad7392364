#include "net/half.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

TEST(HalfTest, Fp16DecodesAndReencodesEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(f)))) << h;
    } else {
      EXPECT_EQ(FloatToFp16(f), h) << h;
    }
  }
  EXPECT_EQ(Fp16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);  // a tie rounds to even: infinity
  EXPECT_EQ(FloatToFp16(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);  // a tie rounds to even: zero
  EXPECT_EQ(FloatToFp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToFp16(-std::numeric_limits<float>::infinity()), 0xfc00);
}

#if defined(__FLT16_MAX__)
// The compiler's own float -> _Float16 conversion (round to nearest even) as
// the reference, on random bit patterns.
TEST(HalfTest, Fp16RoundsAsTheCompiler) {
  std::mt19937 rng(5);
  for (int i = 0; i < 2000000; ++i) {
    const float f = BitsFloat(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    const _Float16 want = static_cast<_Float16>(f);
    uint16_t bits;
    std::memcpy(&bits, &want, sizeof(bits));
    ASSERT_EQ(FloatToFp16(f), bits) << f;
  }
}
#endif

TEST(HalfTest, Bf16RoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(f)))) << h;
    } else {
      EXPECT_EQ(FloatToBf16(f), h) << h;
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng());
    const float f = BitsFloat(u);
    if (!std::isfinite(f)) continue;
    const uint16_t h = FloatToBf16(f);
    const float got = Bf16ToFloat(h);
    // Nearest of the two bf16 values around f; ties to the even one.
    const float down = Bf16ToFloat(static_cast<uint16_t>(u >> 16));
    const float up = Bf16ToFloat(static_cast<uint16_t>((u >> 16) + 1));
    if (std::isinf(up)) continue;  // beyond the largest bf16: IEEE overflow rules, not "nearest"
    const double dd = std::fabs(static_cast<double>(f) - down), du = std::fabs(static_cast<double>(up) - f);
    const float want = dd < du ? down : du < dd ? up : (((u >> 16) & 1) ? up : down);
    ASSERT_EQ(got, want) << f;
  }
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f)), 1.0f);
}

}  // namespace
}  // namespace shardwild
