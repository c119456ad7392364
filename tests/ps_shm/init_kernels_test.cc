// The row initialisation kernel on every dispatch target against the scalar
// expression, bit for bit, and against values pinned outside C++.
#include "ps_shm/init_kernels.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/base/random.h"
#include "core/model/hogwild_kernels.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

// The reference, written out again from init_kernels.h's definition.
float Reference(uint64_t key, int64_t j, double a, double w) {
  const uint64_t elem = SplitMix64Mix(key ^ (static_cast<uint64_t>(j) * 0xd1b54a32d192ed03ULL));
  const uint64_t bits = SplitMix64Mix(elem) >> 11;
  const double u = static_cast<double>(bits) * 0x1.0p-53;
  const double product = w * u;
  return static_cast<float>(a + product);
}

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

TEST(InitKernelsTest, UniformRowValuesAreTheScalarExpressionOnEveryTarget) {
  const uint64_t keys[] = {0, 1, 0x0123456789abcdefULL, ~uint64_t{0}, 0x8000000000000000ULL};
  const int64_t firsts[] = {0, 3, 64, int64_t{1} << 40};
  // DLRM's 1/sqrt(rows) range, a wide one, and one whose sum rounds often.
  const double ranges[][2] = {{-0.001, 0.002}, {-1.0, 2.0}, {0.5, 1e-7}, {-0.05f, 0.1f}};
  for (const std::string& target : HogwildKernelTargets()) {
    SCOPED_TRACE(target);
    ScopedHogwildKernelTarget scoped(target);
    ASSERT_TRUE(scoped.ok());
    for (uint64_t key : keys) {
      for (int64_t j0 : firsts) {
        for (const auto& r : ranges) {
          for (int64_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 33, 64, 100}) {
            std::vector<float> out(n + 1, -7.0f);
            UniformRowValues(key, j0, n, r[0], r[1], out.data());
            for (int64_t i = 0; i < n; ++i) {
              ASSERT_EQ(Bits(out[i]), Bits(Reference(key, j0 + i, r[0], r[1])))
                  << "key " << key << " j " << j0 + i << " n " << n << " range " << r[0] << "+" << r[1];
            }
            EXPECT_EQ(out[n], -7.0f) << "wrote past n = " << n;
          }
        }
      }
    }
  }
}

TEST(InitKernelsTest, UniformRowValuesKeepTheirPinnedBits) {
  // Computed with Python's integers and floats from the definition: a change
  // here changes every table's initial rows and every checkpoint's meaning.
  const uint32_t want[] = {0xbd496bf2, 0xbd3757a0, 0xbd27121b, 0xbbea5e11, 0x3d3e5ab6, 0x3cab1247};
  for (const std::string& target : HogwildKernelTargets()) {
    SCOPED_TRACE(target);
    ScopedHogwildKernelTarget scoped(target);
    ASSERT_TRUE(scoped.ok());
    float out[6];
    UniformRowValues(0x0123456789abcdefULL, 0, 6, -0.05, 0.1, out);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(Bits(out[i]), want[i]) << i;
  }
}

TEST(InitKernelsTest, RowElementDrawIsSplitMixTwice) {
  for (uint64_t key : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}}) {
    for (int64_t j : {0, 1, 17}) {
      for (uint64_t n : {0, 1, 5}) {
        const uint64_t elem = SplitMix64Mix(key ^ (static_cast<uint64_t>(j) * 0xd1b54a32d192ed03ULL));
        EXPECT_EQ(RowElementDraw(key, j, n), SplitMix64Mix(elem + n * 0x9e3779b97f4a7c15ULL));
      }
    }
  }
}

}  // namespace
}  // namespace shardwild
