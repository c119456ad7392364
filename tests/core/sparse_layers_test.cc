// Tests for the sparse layers: EmbeddingBag (sum, mean, weighted) and the dot
// interaction against naive formulas and central finite differences,
// dropout, and the binary, regression and multi-label softmax losses.
#include "core/sparse_layers.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/layers.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Checks d(loss)/d(x[i]) for every i against central differences, where
// `loss` recomputes a scalar from the current x.
void ExpectGradient(std::vector<float>& x, const std::vector<float>& analytic, const std::function<double()>& loss,
                    const std::string& what, double eps = 1e-2) {
  ASSERT_EQ(x.size(), analytic.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = static_cast<float>(saved + eps);
    const double lp = loss();
    x[i] = static_cast<float>(saved - eps);
    const double lm = loss();
    x[i] = saved;
    const double numeric = (lp - lm) / (2 * eps);
    EXPECT_NEAR(analytic[i], numeric, 1e-3 + 1e-3 * std::abs(numeric)) << what << " [" << i << "]";
  }
}

struct Bags {
  std::vector<int64_t> offsets = {0, 2, 2, 3, 7, 9};  // bag sizes 2, 0 (empty), 1, 4 (with repeats), 2
  int64_t batch() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t ids() const { return offsets.back(); }
};

class EmbeddingBagTest : public ::testing::TestWithParam<std::tuple<Pooling, bool>> {};

TEST_P(EmbeddingBagTest, ForwardMatchesNaivePooling) {
  const auto [pooling, weighted] = GetParam();
  const Bags bags;
  constexpr int64_t kDim = 3, kStride = 5;  // out_stride > dim: the gaps stay untouched
  const std::vector<float> rows = Random(bags.ids() * kDim, 1);
  const std::vector<float> weights = Random(bags.ids(), 2, 0.5f, 2.0f);
  std::vector<float> out(bags.batch() * kStride, 42.0f);
  EmbeddingBagForward(rows.data(), kDim, bags.offsets.data(), weighted ? weights.data() : nullptr, bags.batch(),
                      pooling, out.data(), kStride);
  for (int64_t b = 0; b < bags.batch(); ++b) {
    const int64_t n = bags.offsets[b + 1] - bags.offsets[b];
    for (int64_t j = 0; j < kDim; ++j) {
      double want = 0;
      for (int64_t i = bags.offsets[b]; i < bags.offsets[b + 1]; ++i) want += (weighted ? weights[i] : 1.0) * rows[i * kDim + j];
      if (pooling == Pooling::kMean && n > 0) want /= n;
      EXPECT_NEAR(out[b * kStride + j], want, 1e-6) << b << "," << j;
    }
    EXPECT_EQ(out[b * kStride + kDim], 42.0f);
    EXPECT_EQ(out[b * kStride + kDim + 1], 42.0f);
  }
  // The empty bag pools to zeros.
  for (int64_t j = 0; j < kDim; ++j) EXPECT_EQ(out[1 * kStride + j], 0.0f);
}

TEST_P(EmbeddingBagTest, BackwardMatchesFiniteDifferences) {
  const auto [pooling, weighted] = GetParam();
  const Bags bags;
  constexpr int64_t kDim = 3, kStride = 4, kValid = 4;  // bag 4 is padding
  std::vector<float> rows = Random(bags.ids() * kDim, 3);
  const std::vector<float> weights = Random(bags.ids(), 4, 0.5f, 2.0f);
  const std::vector<float> g = Random(bags.batch() * kStride, 5);  // d(loss)/d(out), a linear loss
  const float* w = weighted ? weights.data() : nullptr;
  std::vector<float> out(bags.batch() * kStride);
  auto loss = [&] {
    EmbeddingBagForward(rows.data(), kDim, bags.offsets.data(), w, bags.batch(), pooling, out.data(), kStride);
    double l = 0;
    for (int64_t b = 0; b < kValid; ++b) {
      for (int64_t j = 0; j < kDim; ++j) l += g[b * kStride + j] * out[b * kStride + j];
    }
    return l;
  };
  std::vector<float> drows(rows.size(), 7.0f);
  EmbeddingBagBackward(g.data(), kStride, kDim, bags.offsets.data(), w, bags.batch(), kValid, pooling, drows.data());
  ExpectGradient(rows, drows, loss, "rows");
  // The padding bag's rows get exactly zero.
  for (int64_t i = bags.offsets[4] * kDim; i < bags.offsets[5] * kDim; ++i) EXPECT_EQ(drows[i], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(All, EmbeddingBagTest,
                         ::testing::Combine(::testing::Values(Pooling::kSum, Pooling::kMean), ::testing::Bool()));

class DotInteractionTest : public ::testing::TestWithParam<bool> {};

TEST_P(DotInteractionTest, ForwardMatchesNaiveDots) {
  const bool with_first = GetParam();
  constexpr int64_t kBatch = 3, kN = 4, kD = 5;
  const int64_t width = DotInteractionWidth(kN, kD, with_first);
  EXPECT_EQ(width, (with_first ? kD : 0) + 6);
  const std::vector<float> z = Random(kBatch * kN * kD, 6);
  constexpr int64_t kStride = 13;
  std::vector<float> out(kBatch * kStride, -1.0f);
  DotInteractionForward(z.data(), kBatch, kN, kD, with_first, out.data(), kStride);
  for (int64_t b = 0; b < kBatch; ++b) {
    int64_t at = 0;
    if (with_first) {
      for (int64_t j = 0; j < kD; ++j) EXPECT_EQ(out[b * kStride + at++], z[b * kN * kD + j]);
    }
    for (int64_t k = 1; k < kN; ++k) {
      for (int64_t l = 0; l < k; ++l) {
        double want = 0;
        for (int64_t j = 0; j < kD; ++j) want += z[(b * kN + k) * kD + j] * z[(b * kN + l) * kD + j];
        EXPECT_NEAR(out[b * kStride + at++], want, 1e-5) << b << ": " << k << "." << l;
      }
    }
    EXPECT_EQ(at, width);
    EXPECT_EQ(out[b * kStride + width], -1.0f);  // beyond the width: untouched
  }
}

TEST_P(DotInteractionTest, BackwardMatchesFiniteDifferences) {
  const bool with_first = GetParam();
  constexpr int64_t kBatch = 2, kN = 4, kD = 3;
  const int64_t width = DotInteractionWidth(kN, kD, with_first);
  std::vector<float> z = Random(kBatch * kN * kD, 7);
  const std::vector<float> g = Random(kBatch * width, 8);
  std::vector<float> out(kBatch * width);
  auto loss = [&] {
    DotInteractionForward(z.data(), kBatch, kN, kD, with_first, out.data(), width);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += g[i] * out[i];
    return l;
  };
  std::vector<float> dz(z.size(), 9.0f);
  DotInteractionBackward(z.data(), g.data(), width, kBatch, kN, kD, with_first, dz.data());
  ExpectGradient(z, dz, loss, "z");
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutDense, DotInteractionTest, ::testing::Bool());

TEST(DropoutTest, MaskKeepsTheExpectedShareAndScales) {
  constexpr int64_t kN = 100000;
  std::vector<float> y(kN, 1.0f), mask(kN);
  uint64_t state = 42;
  DropoutForward(y.data(), mask.data(), kN, 0.25f, &state);
  int64_t kept = 0;
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_TRUE(mask[i] == 0.0f || std::abs(mask[i] - 1.0f / 0.75f) < 1e-6) << mask[i];
    EXPECT_EQ(y[i], mask[i]);
    kept += mask[i] != 0.0f;
  }
  EXPECT_NEAR(static_cast<double>(kept) / kN, 0.75, 0.01);
  // The same state gives the same mask; the stream moves on.
  std::vector<float> y2(kN, 1.0f), mask2(kN), mask3(kN);
  uint64_t again = 42;
  DropoutForward(y2.data(), mask2.data(), kN, 0.25f, &again);
  EXPECT_EQ(mask, mask2);
  DropoutForward(y2.data(), mask3.data(), kN, 0.25f, &again);
  EXPECT_NE(mask2, mask3);
  // Backward multiplies by the mask.
  std::vector<float> dy(kN, 2.0f);
  DropoutBackward(dy.data(), mask.data(), kN);
  for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(dy[i], 2.0f * mask[i]);
  // Rate 0 is the identity.
  std::vector<float> y0 = {1, 2, 3}, m0(3);
  DropoutForward(y0.data(), m0.data(), 3, 0.0f, &state);
  EXPECT_EQ(y0, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(m0, (std::vector<float>{1, 1, 1}));
}

TEST(LossTest, SigmoidBinaryCrossEntropyValuesAndGradient) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 30.0f, -30.0f, 9.0f};  // the last is padding
  const std::vector<int32_t> labels = {1, 1, 0, 1, 1, 0};
  constexpr int64_t kValid = 5;
  std::vector<float> d(6, 5.0f);
  const LossResult r = SigmoidBinaryCrossEntropy(logits.data(), labels.data(), kValid, 6, d.data());
  double want = 0;
  for (int i = 0; i < kValid; ++i) {
    const double p = 1 / (1 + std::exp(-static_cast<double>(logits[i])));
    want += labels[i] ? -std::log(p) : -std::log(1 - p);
  }
  EXPECT_NEAR(r.loss_sum, want, 1e-9 * want + 1e-9);
  EXPECT_NEAR(r.loss_sum, std::log1p(std::exp(-2.0)) + std::log1p(std::exp(1.0)) + std::log1p(std::exp(0.5)) +
                              std::log1p(std::exp(-30.0)) + 30.0 + std::log1p(std::exp(-30.0)),
              1e-9);
  EXPECT_EQ(r.correct, 2);  // rows 0 and 3
  EXPECT_EQ(d[5], 0.0f);
  for (int i = 0; i < kValid; ++i) {
    const double p = 1 / (1 + std::exp(-static_cast<double>(logits[i])));
    EXPECT_NEAR(d[i], (p - labels[i]) / kValid, 1e-7) << i;
  }
  std::vector<float> z(logits.begin(), logits.begin() + 3);
  std::vector<float> dz(3);
  SigmoidBinaryCrossEntropy(z.data(), labels.data(), 3, 3, dz.data());
  ExpectGradient(z, dz, [&] { return SigmoidBinaryCrossEntropy(z.data(), labels.data(), 3, 3, nullptr).loss_sum / 3; },
                 "logits", 1e-3);
}

TEST(LossTest, MeanSquaredErrorValuesAndGradient) {
  const std::vector<float> p = {1.0f, 2.0f, -1.0f, 100.0f};
  const std::vector<float> t = {0.5f, 2.0f, 1.0f, 0.0f};
  std::vector<float> d(4, 3.0f);
  const LossResult r = MeanSquaredError(p.data(), t.data(), 3, 4, d.data());
  EXPECT_DOUBLE_EQ(r.loss_sum, 0.25 + 0 + 4);
  EXPECT_EQ(r.correct, 0);
  EXPECT_FLOAT_EQ(d[0], 2 * 0.5f / 3);
  EXPECT_FLOAT_EQ(d[2], 2 * -2.0f / 3);
  EXPECT_EQ(d[3], 0.0f);
}

TEST(LossTest, MultiLabelSoftmaxSpreadsTheTarget) {
  constexpr int64_t kK = 4;
  std::vector<float> logits = Random(3 * kK, 9);
  const std::vector<int64_t> offsets = {0, 1, 3, 4};  // row 1 has labels {0, 2}
  const std::vector<int32_t> sets = {2, 0, 2, 3};
  std::vector<float> d(3 * kK);
  const LossResult r = SoftmaxCrossEntropyMultiLabel(logits.data(), offsets.data(), sets.data(), 3, 3, kK, d.data());
  double want = 0;
  for (int i = 0; i < 3; ++i) {
    double sum = 0;
    for (int c = 0; c < kK; ++c) sum += std::exp(logits[i * kK + c]);
    const int64_t n = offsets[i + 1] - offsets[i];
    for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) want -= (logits[i * kK + sets[j]] - std::log(sum)) / n;
  }
  EXPECT_NEAR(r.loss_sum, want, 1e-6);
  ExpectGradient(logits, d,
                 [&] {
                   return SoftmaxCrossEntropyMultiLabel(logits.data(), offsets.data(), sets.data(), 3, 3, kK, nullptr)
                              .loss_sum /
                          3;
                 },
                 "logits", 1e-3);
  // One label per row: exactly SoftmaxCrossEntropy.
  const std::vector<int32_t> single = {1, 3, 0};
  const std::vector<int64_t> one = {0, 1, 2, 3};
  std::vector<float> d1(3 * kK), d2(3 * kK);
  const LossResult a = SoftmaxCrossEntropyMultiLabel(logits.data(), one.data(), single.data(), 3, 3, kK, d1.data());
  const LossResult b = SoftmaxCrossEntropy(logits.data(), single.data(), 3, 3, kK, d2.data());
  EXPECT_NEAR(a.loss_sum, b.loss_sum, 1e-6);
  EXPECT_EQ(a.correct, b.correct);
  for (int i = 0; i < 3 * kK; ++i) EXPECT_NEAR(d1[i], d2[i], 1e-7) << i;
}

}  // namespace
}  // namespace shardwild
