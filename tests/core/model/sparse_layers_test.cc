// Tests for the sparse layers: EmbeddingBag (sum, mean, weighted) and the dot
// interaction against hand-computed values, naive formulas and central
// finite differences; dropout; and the binary, regression and multi-label
// softmax losses against hand-computed values and finite differences.
#include "core/model/sparse_layers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/model/layers.h"
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
  const Pooling pooling = std::get<0>(GetParam());
  const bool weighted = std::get<1>(GetParam());
  const Bags bags;
  // Rows of one float, of fewer than a block of 8, of whole blocks and of
  // blocks and a rest.
  for (int64_t dim : {1, 3, 8, 11, 16, 19}) {
    const int64_t stride = dim + 2;  // out_stride > dim: the gaps stay untouched
    const std::vector<float> rows = Random(bags.ids() * dim, 1);
    const std::vector<float> weights = Random(bags.ids(), 2, 0.5f, 2.0f);
    std::vector<float> out(bags.batch() * stride, 42.0f);
    EmbeddingBagForward(rows.data(), dim, bags.offsets.data(), weighted ? weights.data() : nullptr, bags.batch(),
                        pooling, out.data(), stride);
    for (int64_t b = 0; b < bags.batch(); ++b) {
      const int64_t n = bags.offsets[b + 1] - bags.offsets[b];
      for (int64_t j = 0; j < dim; ++j) {
        // In float, in the entries' order, as the kernel sums: exactly.
        float want = 0.0f;
        for (int64_t i = bags.offsets[b]; i < bags.offsets[b + 1]; ++i) {
          want += (weighted ? weights[i] : 1.0f) * rows[i * dim + j];
        }
        if (pooling == Pooling::kMean && n > 0) want *= 1.0f / static_cast<float>(n);
        EXPECT_EQ(out[b * stride + j], want) << "dim " << dim << " bag " << b << " element " << j;
      }
      EXPECT_EQ(out[b * stride + dim], 42.0f);
      EXPECT_EQ(out[b * stride + dim + 1], 42.0f);
    }
    // The empty bag pools to zeros.
    for (int64_t j = 0; j < dim; ++j) EXPECT_EQ(out[1 * stride + j], 0.0f);
  }
}

TEST_P(EmbeddingBagTest, BackwardMatchesFiniteDifferences) {
  const Pooling pooling = std::get<0>(GetParam());
  const bool weighted = std::get<1>(GetParam());
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

// The backward's floats exactly: entry i of bag b gets (w_i * pool * scale)
// * dout[b] (pool 1 / bag size for a mean), at one float a row (its own
// loop) and at three; a padding bag's entries get zeros.
TEST_P(EmbeddingBagTest, BackwardIsEachWeightTimesItsBagsGradient) {
  const Pooling pooling = std::get<0>(GetParam());
  const bool weighted = std::get<1>(GetParam());
  const Bags bags;
  constexpr int64_t kValid = 4;
  constexpr float kScale = 0.375f;
  for (int64_t dim : {1, 3}) {
    const int64_t stride = dim + 1;
    const std::vector<float> weights = Random(bags.ids(), 6, 0.5f, 2.0f);
    const std::vector<float> g = Random(bags.batch() * stride, 7);
    const float* w = weighted ? weights.data() : nullptr;
    std::vector<float> drows(bags.ids() * dim, 7.0f);
    EmbeddingBagBackward(g.data(), stride, dim, bags.offsets.data(), w, bags.batch(), kValid, pooling, drows.data(),
                         kScale);
    for (int64_t b = 0; b < bags.batch(); ++b) {
      const int64_t begin = bags.offsets[b], end = bags.offsets[b + 1];
      const float pool = pooling == Pooling::kMean && end > begin ? 1.0f / static_cast<float>(end - begin) : 1.0f;
      for (int64_t i = begin; i < end; ++i) {
        for (int64_t j = 0; j < dim; ++j) {
          const float want = b >= kValid ? 0.0f : (weighted ? weights[i] : 1.0f) * pool * kScale * g[b * stride + j];
          EXPECT_EQ(drows[i * dim + j], want) << "dim " << dim << " bag " << b << " entry " << i << " element " << j;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, EmbeddingBagTest,
                         ::testing::Combine(::testing::Values(Pooling::kSum, Pooling::kMean), ::testing::Bool()));

// Hand-computed values: a bag of one, a bag pulling the same row twice (a
// repeated id), an empty bag, and a weighted bag.
TEST(EmbeddingBagHandTest, SumMeanAndWeightedValues) {
  const std::vector<float> rows = {1, 2,     // bag 0: one id
                                   3, -1,    // bag 1: the same id twice
                                   3, -1,    //
                                   10, 20,   // bag 3 (bag 2 is empty): two ids
                                   -2, 4};
  const std::vector<int64_t> offsets = {0, 1, 3, 3, 5};
  const std::vector<float> weights = {2, 0.5f, 0.5f, 1, 0.25f};
  std::vector<float> out(8, 99.0f);
  EmbeddingBagForward(rows.data(), 2, offsets.data(), nullptr, 4, Pooling::kSum, out.data(), 2);
  EXPECT_EQ(out, (std::vector<float>{1, 2, 6, -2, 0, 0, 8, 24}));
  EmbeddingBagForward(rows.data(), 2, offsets.data(), nullptr, 4, Pooling::kMean, out.data(), 2);
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, -1, 0, 0, 4, 12}));
  EmbeddingBagForward(rows.data(), 2, offsets.data(), weights.data(), 4, Pooling::kSum, out.data(), 2);
  EXPECT_EQ(out, (std::vector<float>{2, 4, 3, -1, 0, 0, 9.5f, 21}));
  // Mean divides by the number of ids, not by the weights' sum.
  EmbeddingBagForward(rows.data(), 2, offsets.data(), weights.data(), 4, Pooling::kMean, out.data(), 2);
  EXPECT_EQ(out, (std::vector<float>{2, 4, 1.5f, -0.5f, 0, 0, 4.75f, 10.5f}));

  // Backward: each pulled row (repeats included) gets its own share.
  const std::vector<float> g = {1, -1, 2, 4, 7, 7, 8, 16};
  std::vector<float> drows(10, 99.0f);
  EmbeddingBagBackward(g.data(), 2, 2, offsets.data(), nullptr, 4, 4, Pooling::kSum, drows.data());
  EXPECT_EQ(drows, (std::vector<float>{1, -1, 2, 4, 2, 4, 8, 16, 8, 16}));
  EmbeddingBagBackward(g.data(), 2, 2, offsets.data(), weights.data(), 4, 4, Pooling::kMean, drows.data());
  EXPECT_EQ(drows, (std::vector<float>{2, -2, 0.5f, 1, 0.5f, 1, 4, 8, 1, 2}));
  // valid 2: bags 2 and 3 are padding; bag 3's rows get zeros.
  EmbeddingBagBackward(g.data(), 2, 2, offsets.data(), nullptr, 4, 2, Pooling::kSum, drows.data());
  EXPECT_EQ(drows, (std::vector<float>{1, -1, 2, 4, 2, 4, 0, 0, 0, 0}));
  // `scale` multiplies every row's gradient (a loss summed over 4 records);
  // padding rows stay 0.
  EmbeddingBagBackward(g.data(), 2, 2, offsets.data(), weights.data(), 4, 3, Pooling::kMean, drows.data(), 4.0f);
  EXPECT_EQ(drows, (std::vector<float>{8, -8, 2, 4, 2, 4, 0, 0, 0, 0}));
}

// (with_first, d): d 3 takes the kernels' scalar paths, 8 one vector step of
// the forward pass, 35 two 16-wide blocks of the backward pass and a tail.
class DotInteractionTest : public ::testing::TestWithParam<std::tuple<bool, int64_t>> {};

TEST(DotInteractionHandTest, ValuesAndGradient) {
  // One sample, n = 3 vectors of d = 2: a = (1, 2), b = (3, -1), c = (0.5, 4).
  const std::vector<float> z = {1, 2, 3, -1, 0.5f, 4};
  EXPECT_EQ(DotInteractionWidth(3, 2, false), 3);
  EXPECT_EQ(DotInteractionWidth(3, 2, true), 5);
  EXPECT_EQ(DotInteractionWidth(27, 16, true), 16 + 351);
  std::vector<float> out(5, 99.0f);
  DotInteractionForward(z.data(), 1, 3, 2, /*with_first=*/true, out.data(), 5);
  // a, then b.a, c.a, c.b.
  EXPECT_EQ(out, (std::vector<float>{1, 2, 1, 8.5f, -2.5f}));
  std::fill(out.begin(), out.end(), 99.0f);
  DotInteractionForward(z.data(), 1, 3, 2, /*with_first=*/false, out.data(), 5);
  EXPECT_EQ(out, (std::vector<float>{1, 8.5f, -2.5f, 99.0f, 99.0f}));
  // dout = (10, 20 | 1, 2, 3): da = (10, 20) + 1 b + 2 c, db = 1 a + 3 c, dc = 2 a + 3 b.
  const std::vector<float> g = {10, 20, 1, 2, 3};
  std::vector<float> dz(6, 99.0f);
  DotInteractionBackward(z.data(), g.data(), 5, 1, 3, 2, /*with_first=*/true, dz.data());
  EXPECT_EQ(dz, (std::vector<float>{14, 27, 2.5f, 14, 11, 1}));
  DotInteractionBackward(z.data(), g.data() + 2, 3, 1, 3, 2, /*with_first=*/false, dz.data());
  EXPECT_EQ(dz, (std::vector<float>{4, 7, 2.5f, 14, 11, 1}));
}

TEST_P(DotInteractionTest, ForwardMatchesNaiveDots) {
  const bool with_first = std::get<0>(GetParam());
  const int64_t d = std::get<1>(GetParam());
  constexpr int64_t kBatch = 3, kN = 4;
  const int64_t width = DotInteractionWidth(kN, d, with_first);
  EXPECT_EQ(width, (with_first ? d : 0) + 6);
  const std::vector<float> z = Random(kBatch * kN * d, 6);
  const int64_t stride = width + 2;
  std::vector<float> out(kBatch * stride, -1.0f);
  DotInteractionForward(z.data(), kBatch, kN, d, with_first, out.data(), stride);
  for (int64_t b = 0; b < kBatch; ++b) {
    int64_t at = 0;
    if (with_first) {
      for (int64_t j = 0; j < d; ++j) EXPECT_EQ(out[b * stride + at++], z[b * kN * d + j]);
    }
    for (int64_t k = 1; k < kN; ++k) {
      for (int64_t l = 0; l < k; ++l) {
        double want = 0;
        for (int64_t j = 0; j < d; ++j) want += z[(b * kN + k) * d + j] * z[(b * kN + l) * d + j];
        EXPECT_NEAR(out[b * stride + at++], want, 1e-5) << b << ": " << k << "." << l;
      }
    }
    EXPECT_EQ(at, width);
    EXPECT_EQ(out[b * stride + width], -1.0f);  // beyond the width: untouched
  }
}

TEST_P(DotInteractionTest, BackwardMatchesFiniteDifferences) {
  const bool with_first = std::get<0>(GetParam());
  const int64_t d = std::get<1>(GetParam());
  constexpr int64_t kBatch = 2, kN = 4;
  const int64_t width = DotInteractionWidth(kN, d, with_first);
  std::vector<float> z = Random(kBatch * kN * d, 7);
  const std::vector<float> g = Random(kBatch * width, 8);
  std::vector<float> out(kBatch * width);
  auto loss = [&] {
    DotInteractionForward(z.data(), kBatch, kN, d, with_first, out.data(), width);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += g[i] * out[i];
    return l;
  };
  std::vector<float> dz(z.size(), 9.0f);
  DotInteractionBackward(z.data(), g.data(), width, kBatch, kN, d, with_first, dz.data());
  ExpectGradient(z, dz, loss, "z");
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutDense, DotInteractionTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values<int64_t>(3, 8, 35)));

TEST(DropoutTest, MaskKeepsTheExpectedShareAndScales) {
  constexpr int64_t kN = 100001;  // odd: the last draw is half used
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

TEST(LossTest, SigmoidBinaryCrossEntropyIsStableAndCountsHits) {
  // Huge logits: finite loss and gradient; a confident miss costs |z|.
  const std::vector<float> logits = {1000.0f, -1000.0f, 1000.0f, -1000.0f, 0.0f, 0.0f};
  const std::vector<int32_t> labels = {1, 0, 0, 1, 0, 1};
  std::vector<float> d(6);
  const LossResult r = SigmoidBinaryCrossEntropy(logits.data(), labels.data(), 6, 6, d.data());
  EXPECT_NEAR(r.loss_sum, 2000.0 + 2 * std::log(2.0), 1e-9);
  EXPECT_EQ(r.correct, 3);  // rows 0, 1 and 4 (logit 0 predicts 0)
  EXPECT_EQ(d, (std::vector<float>{0, 0, 1.0f / 6, -1.0f / 6, 0.5f / 6, -0.5f / 6}));
  // nullptr gradient (evaluation): the same loss.
  EXPECT_EQ(SigmoidBinaryCrossEntropy(logits.data(), labels.data(), 6, 6, nullptr).loss_sum, r.loss_sum);
  // valid 0: nothing counted, every gradient zero.
  std::fill(d.begin(), d.end(), 5.0f);
  const LossResult none = SigmoidBinaryCrossEntropy(logits.data(), labels.data(), 0, 6, d.data());
  EXPECT_EQ(none.loss_sum, 0.0);
  EXPECT_EQ(none.correct, 0);
  EXPECT_EQ(d, std::vector<float>(6, 0.0f));
}

TEST(LossTest, MeanSquaredErrorMatchesFiniteDifferences) {
  std::vector<float> p = Random(5, 11, -3, 3);
  const std::vector<float> t = Random(5, 12, -3, 3);
  std::vector<float> d(5);
  MeanSquaredError(p.data(), t.data(), 5, 5, d.data());
  ExpectGradient(p, d, [&] { return MeanSquaredError(p.data(), t.data(), 5, 5, nullptr).loss_sum / 5; }, "p", 1e-3);
}

TEST(LossTest, MultiLabelSoftmaxHandValuesPaddingAndEmptyRows) {
  // k = 3. Row 0: logits (0, 0, 0), labels {0, 1}: loss = -(1/2 log 1/3 + 1/2 log 1/3) = log 3,
  // gradient (1/3 - 1/2, 1/3 - 1/2, 1/3) / valid. Row 1: no labels. Row 2: padding.
  const std::vector<float> logits = {0, 0, 0, 5, 1, 2, 9, 9, 9};
  const std::vector<int64_t> offsets = {0, 2, 2, 3};
  const std::vector<int32_t> sets = {0, 1, 2};
  std::vector<float> d(9, 99.0f);
  const LossResult r = SoftmaxCrossEntropyMultiLabel(logits.data(), offsets.data(), sets.data(), 2, 3, 3, d.data());
  EXPECT_NEAR(r.loss_sum, std::log(3.0), 1e-6);
  EXPECT_EQ(r.correct, 1);  // row 0: arg-max 0 (the first of equal logits) is a label
  const float third = 1.0f / 3;
  EXPECT_NEAR(d[0], (third - 0.5f) / 2, 1e-7);
  EXPECT_NEAR(d[1], (third - 0.5f) / 2, 1e-7);
  EXPECT_NEAR(d[2], third / 2, 1e-7);
  for (int i = 3; i < 9; ++i) EXPECT_EQ(d[i], 0.0f) << i;  // the empty row and the padding row
  // The arg-max among several labels; one miss.
  const std::vector<float> z2 = {0, 1, 3, 2, 1, 0};
  const std::vector<int64_t> o2 = {0, 2, 3};
  EXPECT_EQ(SoftmaxCrossEntropyMultiLabel(z2.data(), o2.data(), std::vector<int32_t>{1, 2, 1}.data(), 2, 2, 3, nullptr)
                .correct,
            1);
  EXPECT_EQ(SoftmaxCrossEntropyMultiLabel(z2.data(), o2.data(), std::vector<int32_t>{0, 1, 0}.data(), 2, 2, 3, nullptr)
                .correct,
            1);
  EXPECT_EQ(SoftmaxCrossEntropyMultiLabel(z2.data(), o2.data(), std::vector<int32_t>{2, 0, 0}.data(), 2, 2, 3, nullptr)
                .correct,
            2);
}

// As SoftmaxCrossEntropy: the exponentials kept for the gradient up to
// kKeptExponentials classes, computed again past it; both give (softmax -
// target) / valid against a double-precision reference.
TEST(LossTest, MultiLabelSoftmaxOnEitherSideOfTheKeptExponentials) {
  for (int64_t k : {int64_t{2}, kKeptExponentials, kKeptExponentials + 1, int64_t{300}}) {
    SCOPED_TRACE(testing::Message() << "k " << k);
    const std::vector<float> logits = Random(3 * k, static_cast<uint32_t>(k), -6, 6);
    const std::vector<int64_t> offsets = {0, 1, 3, 4};  // row 1 has two labels
    const std::vector<int32_t> sets = {static_cast<int32_t>(k - 1), 0, 1, static_cast<int32_t>(k / 2)};
    std::vector<float> d(3 * k, 99.0f);
    const LossResult r = SoftmaxCrossEntropyMultiLabel(logits.data(), offsets.data(), sets.data(), 3, 3, k, d.data());
    double want_loss = 0;
    for (int64_t i = 0; i < 3; ++i) {
      const float* z = logits.data() + i * k;
      const double mx = *std::max_element(z, z + k);
      double sum = 0;
      for (int64_t c = 0; c < k; ++c) sum += std::exp(z[c] - mx);
      const double t = 1.0 / static_cast<double>(offsets[i + 1] - offsets[i]);
      std::vector<double> target(k, 0.0);
      for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) {
        target[sets[j]] += t;
        want_loss -= t * (z[sets[j]] - mx - std::log(sum));
      }
      for (int64_t c = 0; c < k; ++c) {
        const double want = (std::exp(z[c] - mx) / sum - target[c]) / 3;
        ASSERT_NEAR(d[i * k + c], want, 1e-7 + 1e-6 * std::abs(want)) << "row " << i << " class " << c;
      }
    }
    EXPECT_NEAR(r.loss_sum, want_loss, 1e-9 * want_loss);
  }
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
