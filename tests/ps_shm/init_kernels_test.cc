// The row initialisation kernel on every dispatch target against the scalar
// expression, bit for bit, and against values pinned outside C++.
#include "ps_shm/init_kernels.h"

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/base/random.h"
#include "core/model/hogwild_kernels.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

// lowbias32, written out again.
uint32_t Lowbias32(uint32_t x) {
  x = (x ^ (x >> 16)) * 0x7feb352du;
  x = (x ^ (x >> 15)) * 0x846ca68bu;
  return x ^ (x >> 16);
}

// The reference, written out again from init_kernels.h's definition.
float Reference(uint64_t key, int64_t j, float a, float w) {
  const uint32_t x = static_cast<uint32_t>(key & 0xffffffffu) + static_cast<uint32_t>(j) * 0x9e3779b9u;
  const uint32_t bits = Lowbias32(Lowbias32(x) ^ static_cast<uint32_t>(key >> 32)) >> 8;
  const float u = static_cast<float>(bits) / 16777216.0f;
  const float product = w * u;
  return a + product;
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
  const float ranges[][2] = {{-0.001f, 0.002f}, {-1.0f, 2.0f}, {0.5f, 1e-7f}, {-0.05f, 0.1f}};
  for (const std::string& target : HogwildKernelTargets()) {
    SCOPED_TRACE(target);
    ScopedHogwildKernelTarget scoped(target);
    ASSERT_TRUE(scoped.ok());
    for (uint64_t key : keys) {
      for (int64_t j0 : firsts) {
        for (const auto& r : ranges) {
          for (int64_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100}) {
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

// The rows at once give what a call a row gives, on every target: each row
// keyed from the base key and its id, its dim values at its stride, and
// nothing written between rows or past the last.
TEST(InitKernelsTest, UniformRowsValuesAreUniformRowValuesRowByRow) {
  const uint64_t bases[] = {0, 0x0123456789abcdefULL, ~uint64_t{0}};
  const uint64_t firsts[] = {0, 5, (uint64_t{1} << 40) + 3, ~uint64_t{0} - 2};  // the last wraps the ids
  const float a = -0.05f, w = 0.1f;
  for (const std::string& target : HogwildKernelTargets()) {
    SCOPED_TRACE(target);
    ScopedHogwildKernelTarget scoped(target);
    ASSERT_TRUE(scoped.ok());
    for (uint64_t base : bases) {
      for (uint64_t first : firsts) {
        for (int64_t dim : {1, 3, 8, 15, 16, 17, 33, 64, 100}) {
          for (int64_t extra : {0, 1, 16}) {  // floats between rows: slots, padding
            const int64_t stride = dim + extra, rows = 7;
            std::vector<float> got(static_cast<size_t>(rows * stride + 1), -7.0f);
            UniformRowsValues(base, first, rows, dim, stride, a, w, got.data());
            for (int64_t r = 0; r < rows; ++r) {
              std::vector<float> want(static_cast<size_t>(dim));
              UniformRowValues(SplitMix64Mix(base ^ (first + static_cast<uint64_t>(r))), 0, dim, a, w, want.data());
              for (int64_t j = 0; j < stride; ++j) {
                const float g = got[static_cast<size_t>(r * stride + j)];
                if (j < dim) {
                  ASSERT_EQ(Bits(g), Bits(want[static_cast<size_t>(j)]))
                      << "base " << base << " first " << first << " dim " << dim << " row " << r << " j " << j;
                } else {
                  ASSERT_EQ(g, -7.0f) << "wrote between rows: dim " << dim << " stride " << stride << " row " << r;
                }
              }
            }
            EXPECT_EQ(got.back(), -7.0f) << "wrote past the last row: dim " << dim;
          }
        }
      }
    }
    // No rows or no elements: nothing written.
    float untouched[2] = {-7.0f, -7.0f};
    UniformRowsValues(1, 0, 0, 2, 2, a, w, untouched);
    UniformRowsValues(1, 0, 1, 0, 2, a, w, untouched);
    EXPECT_EQ(untouched[0], -7.0f);
    EXPECT_EQ(untouched[1], -7.0f);
  }
}

TEST(InitKernelsTest, UniformRowValuesKeepTheirPinnedBits) {
  // Computed with Python's integers and floats from the definition: a change
  // here changes every table's initial rows and every checkpoint's meaning.
  const uint32_t want[] = {0xbd1f622d, 0xbcb4d75d, 0xba640400, 0x3d122ac3, 0xbca7c1bd, 0x3d1bd593};
  for (const std::string& target : HogwildKernelTargets()) {
    SCOPED_TRACE(target);
    ScopedHogwildKernelTarget scoped(target);
    ASSERT_TRUE(scoped.ok());
    float out[6];
    UniformRowValues(0x0123456789abcdefULL, 0, 6, -0.05f, 0.1f, out);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(Bits(out[i]), want[i]) << i;
  }
}

// The draws are uniform and the rows independent: over 2^16 rows of 16
// (consecutive keys, as RowKey never gives, the harder case) every value is
// in [a, a + w), each of 64 bins holds its share within 3%, the mean and the
// variance are those of U(a, a + w), and neither element j against j + 1 of
// a row nor element j of row r against row r + 1 correlates.
TEST(InitKernelsTest, UniformRowValuesAreUniformAndIndependent) {
  constexpr int kRows = 1 << 16, kDim = 16, kBins = 64;
  const float a = -0.05f, w = 0.1f;
  std::vector<float> v(static_cast<size_t>(kRows) * kDim);
  for (int r = 0; r < kRows; ++r) UniformRowValues(0x5eed0000ULL + r, 0, kDim, a, w, v.data() + r * kDim);
  std::vector<int64_t> bins(kBins, 0);
  double sum = 0, sum2 = 0, along = 0, across = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_GE(v[i], a);
    ASSERT_LT(v[i], a + w);
    const double u = (static_cast<double>(v[i]) - a) / w;  // ~U(0, 1)
    ++bins[std::min<int>(kBins - 1, static_cast<int>(u * kBins))];
    sum += u;
    sum2 += u * u;
    if (i % kDim + 1 < kDim) along += (u - 0.5) * ((static_cast<double>(v[i + 1]) - a) / w - 0.5);
    if (i + kDim < v.size()) across += (u - 0.5) * ((static_cast<double>(v[i + kDim]) - a) / w - 0.5);
  }
  const double n = static_cast<double>(v.size());
  for (int b = 0; b < kBins; ++b) EXPECT_NEAR(bins[b], n / kBins, 0.03 * n / kBins) << "bin " << b;
  EXPECT_NEAR(sum / n, 0.5, 0.002);
  EXPECT_NEAR(sum2 / n - (sum / n) * (sum / n), 1.0 / 12, 0.001);
  // Correlation coefficients (variance 1/12); about 1e-3 for independent draws.
  EXPECT_NEAR(along / (n * 15 / 16) * 12, 0.0, 0.01);
  EXPECT_NEAR(across / (n - kDim) * 12, 0.0, 0.01);
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
