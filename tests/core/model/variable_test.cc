// Tests for initial values of variables.
#include "core/model/variable.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

VariableSpec Glorot(const std::string& name, int64_t rows, int64_t cols) {
  return VariableSpec{name, rows, cols, InitKind::kGlorotUniform, rows, cols};
}

std::vector<float> Fill(const VariableSpec& spec, uint64_t seed) {
  std::vector<float> out(spec.size(), std::numeric_limits<float>::quiet_NaN());
  FillInitialValue(spec, seed, out.data());
  return out;
}

// Fraction of positions where `a` and `b` differ.
double DifferentFraction(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  return static_cast<double>(diff) / static_cast<double>(a.size());
}

TEST(FillInitialValueTest, ZerosOverwriteEverything) {
  const VariableSpec spec{"dense_0/bias", 37, 3, InitKind::kZeros, 0, 0};
  std::vector<float> out(spec.size() + 1, 7.0f);
  FillInitialValue(spec, 42, out.data());
  for (int64_t i = 0; i < spec.size(); ++i) EXPECT_EQ(out[i], 0.0f) << i;
  EXPECT_EQ(out[spec.size()], 7.0f) << "wrote past the variable";
}

TEST(FillInitialValueTest, GlorotWithinLimitAndSpansIt) {
  const VariableSpec spec = Glorot("dense_0/kernel", 30, 20);
  const double limit = std::sqrt(6.0 / (30 + 20));
  const std::vector<float> v = Fill(spec, 1);
  float lo = v[0], hi = v[0];
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    ASSERT_LE(std::abs(x), limit * (1 + 1e-6));
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  // 600 uniform draws come close to both ends.
  EXPECT_LT(lo, -0.97 * limit);
  EXPECT_GT(hi, 0.97 * limit);
}

TEST(FillInitialValueTest, GlorotUsesFansNotShape) {
  // The limit comes from fan_in + fan_out.
  const VariableSpec spec{"emb", 100, 10, InitKind::kGlorotUniform, 1000, 500};
  const double limit = std::sqrt(6.0 / 1500);
  for (float x : Fill(spec, 3)) ASSERT_LE(std::abs(x), limit * (1 + 1e-6));
}

TEST(FillInitialValueTest, GlorotIsDeterministic) {
  const VariableSpec spec = Glorot("dense_1/kernel", 16, 8);
  EXPECT_EQ(Fill(spec, 5), Fill(spec, 5));
  const VariableSpec copy = spec;
  EXPECT_EQ(Fill(copy, 5), Fill(spec, 5));
}

TEST(FillInitialValueTest, GlorotDependsOnSeedAndName) {
  const VariableSpec a = Glorot("dense_1/kernel", 16, 8);
  const VariableSpec b = Glorot("dense_2/kernel", 16, 8);
  EXPECT_GT(DifferentFraction(Fill(a, 5), Fill(a, 6)), 0.95);
  EXPECT_GT(DifferentFraction(Fill(a, 5), Fill(b, 5)), 0.95);
  // A name that is a prefix of another is still a different name.
  const VariableSpec c = Glorot("dense_1/kernel2", 16, 8);
  EXPECT_GT(DifferentFraction(Fill(a, 5), Fill(c, 5)), 0.95);
}

TEST(FillInitialValueTest, GlorotMomentsOfLargeVariable) {
  const VariableSpec spec = Glorot("big", 256, 256);
  const double limit = std::sqrt(6.0 / 512);
  const std::vector<float> v = Fill(spec, 11);
  double sum = 0, sum2 = 0;
  for (float x : v) {
    sum += x;
    sum2 += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(v.size());
  const double mean = sum / n;
  const double var = sum2 / n - mean * mean;
  // Standard error of the mean is limit / sqrt(3 n) ~ 0.0023 limit.
  EXPECT_LT(std::abs(mean), 0.01 * limit);
  // The variance of U(-l, l) is l^2 / 3; its standard error here is ~0.35%.
  EXPECT_NEAR(var, limit * limit / 3, 0.02 * limit * limit / 3);
  // No long runs of repeats: the stream is not stuck.
  int64_t repeats = 0;
  for (size_t i = 1; i < v.size(); ++i) repeats += v[i] == v[i - 1];
  EXPECT_LT(repeats, 10);
}

}  // namespace
}  // namespace shardwild
