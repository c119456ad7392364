#include "core/metrics/metrics.h"

#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

// The AUC by its definition: over every (positive, negative) pair, 1 if the
// positive scores higher, 1/2 on a tie.
double BruteForceAuc(const std::vector<float>& scores, const std::vector<int32_t>& labels) {
  double wins = 0;
  int64_t pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (labels[i] == 0) continue;
    for (size_t j = 0; j < scores.size(); ++j) {
      if (labels[j] != 0) continue;
      ++pairs;
      if (scores[i] > scores[j]) {
        wins += 1;
      } else if (scores[i] == scores[j]) {
        wins += 0.5;
      }
    }
  }
  return wins / static_cast<double>(pairs);
}

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(ExactAucTest, MatchesPairwiseCountWithManyTies) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (int n : {2, 3, 10, 57, 200, 1000, 2500}) {
    SCOPED_TRACE(n);
    std::vector<float> scores(n);
    std::vector<int32_t> labels(n);
    for (int i = 0; i < n; ++i) {
      labels[i] = (rng() % 3 == 0) ? 1 : 0;
      // Rounded to 0.1 over a narrow range: many ties, within and across classes.
      scores[i] = std::round((noise(rng) + 0.7f * labels[i]) * 10.0f) / 10.0f;
    }
    labels[0] = 1;
    labels[n - 1] = 0;
    EXPECT_NEAR(ExactAuc(scores, labels), BruteForceAuc(scores, labels), 1e-12);
  }
}

TEST(ExactAucTest, HandComputedCases) {
  // Perfect, inverted, all tied.
  EXPECT_DOUBLE_EQ(ExactAuc(std::vector<float>{0.1f, 0.2f, 0.8f, 0.9f}, std::vector<int32_t>{0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(ExactAuc(std::vector<float>{0.9f, 0.8f, 0.2f, 0.1f}, std::vector<int32_t>{0, 0, 1, 1}), 0.0);
  EXPECT_DOUBLE_EQ(ExactAuc(std::vector<float>{0.5f, 0.5f, 0.5f}, std::vector<int32_t>{1, 0, 1}), 0.5);
  // Positives 0.4, 0.6; negatives 0.4, 0.2: pairs (0.4,0.4)=1/2, (0.4,0.2)=1,
  // (0.6,0.4)=1, (0.6,0.2)=1 -> 3.5 / 4.
  EXPECT_DOUBLE_EQ(ExactAuc(std::vector<float>{0.4f, 0.6f, 0.4f, 0.2f}, std::vector<int32_t>{1, 1, 0, 0}), 0.875);
  // -0 and +0 tie.
  EXPECT_DOUBLE_EQ(ExactAuc(std::vector<float>{-0.0f, 0.0f}, std::vector<int32_t>{1, 0}), 0.5);
}

TEST(ExactAucTest, NaNWhenAClassIsAbsent) {
  EXPECT_TRUE(std::isnan(ExactAuc(std::vector<float>{0.1f, 0.2f}, std::vector<int32_t>{1, 1})));
  EXPECT_TRUE(std::isnan(ExactAuc(std::vector<float>{0.1f, 0.2f}, std::vector<int32_t>{0, 0})));
  EXPECT_TRUE(std::isnan(ExactAuc(std::vector<float>{}, std::vector<int32_t>{})));
}

TEST(ExactAucTest, NaNScoresRankLowest) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Negative NaN below the positive 0.1; the two NaNs tie.
  EXPECT_DOUBLE_EQ(ExactAuc(std::vector<float>{0.1f, nan}, std::vector<int32_t>{1, 0}), 1.0);
  EXPECT_DOUBLE_EQ(ExactAuc(std::vector<float>{nan, nan}, std::vector<int32_t>{1, 0}), 0.5);
}

TEST(EvalMetricsTest, BinaryAgainstHandComputation) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, -3.0f, 0.0f};
  const std::vector<int32_t> labels = {1, 0, 0, 1, 1};
  EvalMetrics m(HeadType::kBinary, 2);
  m.AddBinary(logits.data(), labels.data(), 5);
  ASSERT_EQ(m.count(), 5);
  double bce = 0;
  for (int i = 0; i < 5; ++i) {
    const double p = Sigmoid(logits[i]);
    bce -= labels[i] ? std::log(p) : std::log(1 - p);
  }
  EXPECT_NEAR(m.loss(), bce / 5, 1e-12);
  EXPECT_NEAR(m.logloss(), bce / 5, 1e-12);
  // p > 0.5: rows 0 (1, right), 2 (0, wrong); p <= 0.5: 1 (right), 3 (wrong), 4 (p = 0.5, wrong).
  EXPECT_DOUBLE_EQ(m.accuracy(), 2.0 / 5);
  EXPECT_DOUBLE_EQ(m.auc(), BruteForceAuc(logits, labels));
  EXPECT_TRUE(std::isnan(m.rmse()));
  EXPECT_TRUE(std::isnan(m.precision_at_k()));
  const auto values = m.Values();
  ASSERT_EQ(values.size(), 4u);
  EXPECT_EQ(values[0].first, "auc");
  EXPECT_EQ(values[1].first, "logloss");
  EXPECT_EQ(values[2].first, "accuracy");
  EXPECT_EQ(values[3].first, "loss");
  EXPECT_DOUBLE_EQ(values[0].second, m.auc());
}

TEST(EvalMetricsTest, LoglossClampsAndLossIsStableForLargeLogits) {
  const std::vector<float> logits = {100.0f, -100.0f};
  const std::vector<int32_t> labels = {0, 0};
  EvalMetrics m(HeadType::kBinary, 2);
  m.AddBinary(logits.data(), labels.data(), 2);
  // Row 0: p clamps to 1 - 1e-7 -> -log(1e-7); row 1: p = e^-100 -> clamp 1e-7 -> -log(1 - 1e-7).
  EXPECT_NEAR(m.logloss(), (-std::log(1e-7) - std::log(1 - 1e-7)) / 2, 1e-9);
  // Unclamped cross-entropy: 100 + log1p(e^-100) and log1p(e^-100).
  EXPECT_NEAR(m.loss(), 50.0, 1e-9);
  EXPECT_TRUE(std::isnan(m.auc()));  // one class only
}

TEST(EvalMetricsTest, MergingHalvesEqualsAddingAll) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  const int n = 999;
  std::vector<float> logits(n);
  std::vector<int32_t> labels(n);
  for (int i = 0; i < n; ++i) {
    logits[i] = std::round(u(rng) * 4) / 4;  // ties
    labels[i] = (u(rng) + logits[i] > 0) ? 1 : 0;
  }
  EvalMetrics all(HeadType::kBinary, 2), a(HeadType::kBinary, 2), b(HeadType::kBinary, 2);
  all.AddBinary(logits.data(), labels.data(), n);
  a.AddBinary(logits.data(), labels.data(), 400);
  b.AddBinary(logits.data() + 400, labels.data() + 400, n - 400);
  a.Merge(b);
  EXPECT_EQ(a.count(), all.count());
  EXPECT_DOUBLE_EQ(a.auc(), all.auc());
  EXPECT_NEAR(a.loss(), all.loss(), 1e-12);
  EXPECT_NEAR(a.logloss(), all.logloss(), 1e-12);
  EXPECT_DOUBLE_EQ(a.accuracy(), all.accuracy());

  // Softmax and regression merge the same way.
  const int k = 4;
  std::vector<float> z(n * k);
  std::vector<float> targets(n);
  for (float& v : z) v = u(rng);
  for (float& v : targets) v = u(rng);
  std::vector<int32_t> classes(n);
  for (int i = 0; i < n; ++i) classes[i] = labels[i] * 2 + (i % 2);
  EvalMetrics sall(HeadType::kSoftmax, k, 2), sa(HeadType::kSoftmax, k, 2), sb(HeadType::kSoftmax, k, 2);
  sall.AddSoftmax(z.data(), classes.data(), nullptr, nullptr, 0, n);
  sa.AddSoftmax(z.data(), classes.data(), nullptr, nullptr, 0, 400);
  sb.AddSoftmax(z.data() + 400 * k, classes.data() + 400, nullptr, nullptr, 400, n - 400);
  sa.Merge(sb);
  EXPECT_NEAR(sa.loss(), sall.loss(), 1e-12);
  EXPECT_DOUBLE_EQ(sa.accuracy(), sall.accuracy());
  EXPECT_DOUBLE_EQ(sa.precision_at_k(), sall.precision_at_k());
  EvalMetrics rall(HeadType::kRegression, 0), ra(HeadType::kRegression, 0), rb(HeadType::kRegression, 0);
  rall.AddRegression(logits.data(), targets.data(), n);
  ra.AddRegression(logits.data(), targets.data(), 400);
  rb.AddRegression(logits.data() + 400, targets.data() + 400, n - 400);
  ra.Merge(rb);
  EXPECT_NEAR(ra.rmse(), rall.rmse(), 1e-12);
}

// Serialize/Deserialize carry every sum and every AUC pair: the copy's
// values are bit-equal for each head, it merges like the original, and
// damaged bytes are refused.
TEST(EvalMetricsTest, SerializeRoundTripsEveryHeadAndRefusesDamage) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  const int n = 301, k = 5;
  std::vector<float> logits(n * k), targets(n);
  std::vector<int32_t> labels(n), classes(n);
  for (float& v : logits) v = std::round(u(rng) * 4) / 4;
  for (float& v : targets) v = u(rng);
  for (int i = 0; i < n; ++i) {
    labels[i] = u(rng) + logits[i] > 0 ? 1 : 0;
    classes[i] = i % k;
  }
  EvalMetrics binary(HeadType::kBinary, 2), softmax(HeadType::kSoftmax, k, 3), regression(HeadType::kRegression, 0);
  binary.AddBinary(logits.data(), labels.data(), n);
  softmax.AddSoftmax(logits.data(), classes.data(), nullptr, nullptr, 0, n);
  regression.AddRegression(logits.data(), targets.data(), n);
  for (const EvalMetrics* m : {&binary, &softmax, &regression}) {
    absl::StatusOr<EvalMetrics> copy = EvalMetrics::Deserialize(m->Serialize());
    ASSERT_TRUE(copy.ok()) << copy.status();
    EXPECT_EQ(copy->head(), m->head());
    EXPECT_EQ(copy->top_k(), m->top_k());
    EXPECT_EQ(copy->count(), m->count());
    const auto want = m->Values(), got = copy->Values();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].first, want[i].first);
      EXPECT_EQ(std::memcmp(&got[i].second, &want[i].second, sizeof(double)), 0) << want[i].first;
    }
  }
  // A deserialized part merges as the part itself would: the AUC over both.
  EvalMetrics a(HeadType::kBinary, 2), b(HeadType::kBinary, 2);
  a.AddBinary(logits.data(), labels.data(), 100);
  b.AddBinary(logits.data() + 100, labels.data() + 100, n - 100);
  absl::StatusOr<EvalMetrics> b2 = EvalMetrics::Deserialize(b.Serialize());
  ASSERT_TRUE(b2.ok());
  a.Merge(*b2);
  EvalMetrics all(HeadType::kBinary, 2);
  all.AddBinary(logits.data(), labels.data(), n);
  EXPECT_DOUBLE_EQ(a.auc(), all.auc());
  EXPECT_EQ(a.count(), n);

  const std::string bytes = binary.Serialize();
  EXPECT_FALSE(EvalMetrics::Deserialize("").ok());
  EXPECT_FALSE(EvalMetrics::Deserialize(bytes.substr(0, bytes.size() - 1)).ok()) << "truncated";
  EXPECT_FALSE(EvalMetrics::Deserialize(bytes + "x").ok()) << "trailing bytes";
  std::string bad_magic = bytes;
  bad_magic[0] ^= 1;
  EXPECT_FALSE(EvalMetrics::Deserialize(bad_magic).ok());
  std::string bad_head = bytes;
  bad_head[4] = 7;
  EXPECT_FALSE(EvalMetrics::Deserialize(bad_head).ok());
}

TEST(EvalMetricsTest, SoftmaxSingleLabel) {
  // 3 classes, 3 rows.
  const std::vector<float> z = {2.0f, 1.0f, 0.0f,   // arg-max 0, top-2 {0, 1}
                                0.0f, 0.0f, 3.0f,   // arg-max 2, top-2 {2, 0} (tie broken by index)
                                1.0f, 1.0f, 1.0f};  // all tied: arg-max 0, top-2 {0, 1}
  const std::vector<int32_t> labels = {0, 1, 1};
  EvalMetrics m(HeadType::kSoftmax, 3, 2);
  m.AddSoftmax(z.data(), labels.data(), nullptr, nullptr, 0, 3);
  double ce = 0;
  for (int r = 0; r < 3; ++r) {
    double s = 0;
    for (int c = 0; c < 3; ++c) s += std::exp(static_cast<double>(z[r * 3 + c]));
    ce += std::log(s) - z[r * 3 + labels[r]];
  }
  EXPECT_NEAR(m.loss(), ce / 3, 1e-12);
  EXPECT_DOUBLE_EQ(m.accuracy(), 1.0 / 3);
  // Hits: row 0: {0,1} has 0 -> 1; row 1: {2,0} lacks 1 -> 0; row 2: {0,1} has 1 -> 1.
  EXPECT_DOUBLE_EQ(m.precision_at_k(), 2.0 / (2 * 3));
  const auto values = m.Values();
  ASSERT_EQ(values.size(), 3u);
  EXPECT_EQ(values[0].first, "accuracy");
  EXPECT_EQ(values[1].first, "loss");
  EXPECT_EQ(values[2].first, "precision_at_2");
  EXPECT_TRUE(std::isnan(m.auc()));

  // top_k 1: no precision entry; P@1 = accuracy.
  EvalMetrics one(HeadType::kSoftmax, 3);
  one.AddSoftmax(z.data(), labels.data(), nullptr, nullptr, 0, 3);
  EXPECT_EQ(one.Values().size(), 2u);
  EXPECT_DOUBLE_EQ(one.precision_at_k(), one.accuracy());
}

TEST(EvalMetricsTest, SoftmaxMultiLabelAccuracyAndPrecisionAtK) {
  // 4 classes; records 10..12 of a data set whose label arrays start at record 0.
  const std::vector<float> z = {0.0f, 5.0f, 4.0f, 1.0f,   // top-3 {1, 2, 3}
                                3.0f, 0.0f, 1.0f, 2.0f,   // top-3 {0, 3, 2}
                                0.0f, 1.0f, 2.0f, 3.0f};  // top-3 {3, 2, 1}
  // Records 0..9 have one label each; 10: {2, 1}; 11: {1}; 12: {0, 1}.
  std::vector<int64_t> offsets(14);
  std::vector<int32_t> sets;
  for (int r = 0; r < 10; ++r) {
    offsets[r] = static_cast<int64_t>(sets.size());
    sets.push_back(3);
  }
  offsets[10] = static_cast<int64_t>(sets.size());
  sets.insert(sets.end(), {2, 1});
  offsets[11] = static_cast<int64_t>(sets.size());
  sets.push_back(1);
  offsets[12] = static_cast<int64_t>(sets.size());
  sets.insert(sets.end(), {0, 1});
  offsets[13] = static_cast<int64_t>(sets.size());
  const std::vector<int32_t> first_labels = {2, 1, 0};  // labels[] of records 10..12

  EvalMetrics m(HeadType::kSoftmax, 4, 3);
  m.AddSoftmax(z.data(), first_labels.data(), offsets.data(), sets.data(), 10, 3);
  // Arg-max: 1 in {2,1} yes; 0 in {1} no; 3 in {0,1} no.
  EXPECT_DOUBLE_EQ(m.accuracy(), 1.0 / 3);
  // Hits: {1,2,3} & {2,1} = 2; {0,3,2} & {1} = 0; {3,2,1} & {0,1} = 1 -> 3 / (3 * 3).
  EXPECT_DOUBLE_EQ(m.precision_at_k(), 3.0 / 9);
  // Loss: cross-entropy against the uniform distribution over the row's labels.
  auto lse = [&](int r) {
    double s = 0;
    for (int c = 0; c < 4; ++c) s += std::exp(static_cast<double>(z[r * 4 + c]));
    return std::log(s);
  };
  const double expected = ((lse(0) - (z[2] + z[1]) / 2) + (lse(1) - z[4 + 1]) + (lse(2) - (z[8 + 0] + z[8 + 1]) / 2)) / 3;
  EXPECT_NEAR(m.loss(), expected, 1e-12);
  EXPECT_EQ(m.Values().back().first, "precision_at_3");
}

TEST(EvalMetricsTest, TopKIsCappedAtTheClasses) {
  const std::vector<float> z = {1.0f, 0.0f};
  const std::vector<int32_t> labels = {1};
  EvalMetrics m(HeadType::kSoftmax, 2, 5);
  EXPECT_EQ(m.top_k(), 2);
  m.AddSoftmax(z.data(), labels.data(), nullptr, nullptr, 0, 1);
  EXPECT_DOUBLE_EQ(m.precision_at_k(), 0.5);
  EXPECT_EQ(m.Values().back().first, "precision_at_2");
}

TEST(EvalMetricsTest, Regression) {
  const std::vector<float> p = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> t = {1.5f, 2.0f, 1.0f, 5.0f};
  EvalMetrics m(HeadType::kRegression, 0);
  m.AddRegression(p.data(), t.data(), 4);
  // Squared errors 0.25, 0, 4, 1 -> MSE 1.3125.
  EXPECT_DOUBLE_EQ(m.loss(), 1.3125);
  EXPECT_DOUBLE_EQ(m.rmse(), std::sqrt(1.3125));
  EXPECT_TRUE(std::isnan(m.accuracy()));
  const auto values = m.Values();
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(values[0].first, "rmse");
  EXPECT_EQ(values[1].first, "loss");
}

TEST(EvalMetricsTest, EmptyIsNaN) {
  EvalMetrics m(HeadType::kBinary, 2);
  EXPECT_EQ(m.count(), 0);
  EXPECT_TRUE(std::isnan(m.loss()));
  EXPECT_TRUE(std::isnan(m.auc()));
  EXPECT_TRUE(std::isnan(m.accuracy()));
  EXPECT_TRUE(std::isnan(m.logloss()));
}

}  // namespace
}  // namespace shardwild
