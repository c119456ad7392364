#include "core/metrics/metrics.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace shardwild {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A key whose unsigned order is the order of the floats: NaN lowest (0),
// then -inf .. -0 = +0 .. +inf.
uint32_t OrderedBits(float f) {
  if (std::isnan(f)) return 0;
  if (f == 0.0f) f = 0.0f;  // -0 ties with +0
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <typename Label>
double ExactAucImpl(std::span<const float> scores, std::span<const Label> labels) {
  assert(scores.size() == labels.size());
  const size_t n = std::min(scores.size(), labels.size());
  // (score key, label) in one word: one sort of plain integers.
  std::vector<uint64_t> keys(n);
  for (size_t i = 0; i < n; ++i) {
    keys[i] = (uint64_t{OrderedBits(scores[i])} << 1) | (labels[i] != 0 ? 1u : 0u);
  }
  std::sort(keys.begin(), keys.end());
  // Walk the groups of equal scores from the lowest: each positive beats every
  // negative of the groups below and ties with those of its own group.
  // twice_u = 2 * U, exact in 64 bits for n < 6e9.
  uint64_t negatives_below = 0, positives = 0, twice_u = 0;
  for (size_t i = 0; i < n;) {
    const uint64_t score = keys[i] >> 1;
    uint64_t pos = 0, neg = 0;
    for (; i < n && (keys[i] >> 1) == score; ++i) ((keys[i] & 1) ? pos : neg) += 1;
    twice_u += pos * (2 * negatives_below + neg);
    negatives_below += neg;
    positives += pos;
  }
  if (positives == 0 || negatives_below == 0) return kNaN;
  return static_cast<double>(twice_u) / 2.0 / (static_cast<double>(positives) * static_cast<double>(negatives_below));
}

}  // namespace

double ExactAuc(std::span<const float> scores, std::span<const int32_t> labels) {
  return ExactAucImpl(scores, labels);
}

double ExactAuc(std::span<const float> scores, std::span<const int8_t> labels) {
  return ExactAucImpl(scores, labels);
}

EvalMetrics::EvalMetrics(HeadType head, int num_classes, int top_k)
    : head_(head),
      num_classes_(std::max(num_classes, 1)),
      top_k_(head == HeadType::kSoftmax ? std::clamp(top_k, 1, std::max(num_classes, 1)) : std::max(top_k, 1)) {}

void EvalMetrics::AddBinary(const float* logits, const int32_t* labels, int64_t n) {
  assert(head_ == HeadType::kBinary);
  scores_.insert(scores_.end(), logits, logits + n);
  labels_.reserve(labels_.size() + n);
  for (int64_t i = 0; i < n; ++i) {
    const double x = logits[i];
    const bool y = labels[i] != 0;
    labels_.push_back(y ? 1 : 0);
    // Cross-entropy from the logit: max(x, 0) - x*y + log(1 + exp(-|x|)).
    loss_sum_ += std::max(x, 0.0) - (y ? x : 0.0) + std::log1p(std::exp(-std::abs(x)));
    // sigmoid without overflow on either side.
    const double p = x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
    const double pc = std::clamp(p, 1e-7, 1.0 - 1e-7);
    logloss_sum_ -= y ? std::log(pc) : std::log(1.0 - pc);
    if ((x > 0) == y) ++correct_;
  }
  count_ += n;
}

void EvalMetrics::AddSoftmax(const float* logits, const int32_t* labels, const int64_t* label_offsets,
                             const int32_t* label_sets, int64_t first_record, int64_t n) {
  assert(head_ == HeadType::kSoftmax);
  const int k_classes = num_classes_;
  std::vector<int> top(top_k_);
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits + i * k_classes;
    // The row's labels.
    const int32_t* set = labels + i;
    int64_t set_size = 1;
    if (label_offsets != nullptr) {
      const int64_t b = label_offsets[first_record + i], e = label_offsets[first_record + i + 1];
      if (e > b) {
        set = label_sets + b;
        set_size = e - b;
      }
    }
    auto has_label = [&](int c) {
      for (int64_t j = 0; j < set_size; ++j) {
        if (set[j] == c) return true;
      }
      return false;
    };
    // log-sum-exp around the maximum; arg-max = the first maximum.
    int arg_max = 0;
    for (int c = 1; c < k_classes; ++c) {
      if (z[c] > z[arg_max]) arg_max = c;
    }
    const double m = z[arg_max];
    double sum = 0;
    for (int c = 0; c < k_classes; ++c) sum += std::exp(static_cast<double>(z[c]) - m);
    const double lse = m + std::log(sum);
    double label_logits = 0;
    int64_t valid = 0;
    for (int64_t j = 0; j < set_size; ++j) {
      if (set[j] >= 0 && set[j] < k_classes) {
        label_logits += z[set[j]];
        ++valid;
      }
    }
    if (valid > 0) loss_sum_ += lse - label_logits / static_cast<double>(valid);
    if (has_label(arg_max)) ++correct_;
    if (top_k_ == 1) {
      if (has_label(arg_max)) ++top_k_hits_;
      continue;
    }
    // The top_k_ classes, best first (higher logit, then lower index): an
    // insertion into a sorted array of top_k_ entries.
    int filled = 0;
    for (int c = 0; c < k_classes; ++c) {
      if (filled == top_k_ && !(z[c] > z[top[filled - 1]])) continue;
      int pos = filled < top_k_ ? filled++ : top_k_ - 1;
      while (pos > 0 && z[c] > z[top[pos - 1]]) {
        top[pos] = top[pos - 1];
        --pos;
      }
      top[pos] = c;
    }
    for (int j = 0; j < top_k_; ++j) {
      if (has_label(top[j])) ++top_k_hits_;
    }
  }
  count_ += n;
}

void EvalMetrics::AddRegression(const float* predictions, const float* targets, int64_t n) {
  assert(head_ == HeadType::kRegression);
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(predictions[i]) - static_cast<double>(targets[i]);
    sq_err_sum_ += d * d;
  }
  loss_sum_ = sq_err_sum_;
  count_ += n;
}

void EvalMetrics::Merge(const EvalMetrics& other) {
  assert(head_ == other.head_ && num_classes_ == other.num_classes_ && top_k_ == other.top_k_);
  count_ += other.count_;
  loss_sum_ += other.loss_sum_;
  logloss_sum_ += other.logloss_sum_;
  sq_err_sum_ += other.sq_err_sum_;
  correct_ += other.correct_;
  top_k_hits_ += other.top_k_hits_;
  scores_.insert(scores_.end(), other.scores_.begin(), other.scores_.end());
  labels_.insert(labels_.end(), other.labels_.begin(), other.labels_.end());
}

namespace {

constexpr uint32_t kMetricsMagic = 0x53574d31;  // "SWM1"

// The fixed part of a serialized EvalMetrics.
struct MetricsHeader {
  uint32_t magic;
  int32_t head;
  int32_t num_classes;
  int32_t top_k;
  int64_t count;
  double loss_sum;
  double logloss_sum;
  double sq_err_sum;
  int64_t correct;
  int64_t top_k_hits;
  int64_t pairs;  // scores and labels that follow
};

}  // namespace

std::string EvalMetrics::Serialize() const {
  MetricsHeader h{kMetricsMagic, static_cast<int32_t>(head_), num_classes_, top_k_, count_, loss_sum_,
                  logloss_sum_, sq_err_sum_, correct_, top_k_hits_, static_cast<int64_t>(scores_.size())};
  std::string out(sizeof h + scores_.size() * (sizeof(float) + sizeof(int8_t)), '\0');
  std::memcpy(out.data(), &h, sizeof h);
  if (!scores_.empty()) {
    std::memcpy(out.data() + sizeof h, scores_.data(), scores_.size() * sizeof(float));
    std::memcpy(out.data() + sizeof h + scores_.size() * sizeof(float), labels_.data(), labels_.size());
  }
  return out;
}

absl::StatusOr<EvalMetrics> EvalMetrics::Deserialize(std::string_view bytes) {
  MetricsHeader h;
  if (bytes.size() < sizeof h) {
    return absl::InvalidArgumentError(absl::StrCat("eval metrics: ", bytes.size(), " bytes, less than a header"));
  }
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kMetricsMagic) return absl::InvalidArgumentError("eval metrics: bad magic");
  if (h.head < static_cast<int32_t>(HeadType::kSoftmax) || h.head > static_cast<int32_t>(HeadType::kRegression) ||
      h.num_classes < 1 || h.top_k < 1 || h.count < 0 || h.pairs < 0 ||
      (h.pairs > 0 && h.head != static_cast<int32_t>(HeadType::kBinary))) {
    return absl::InvalidArgumentError("eval metrics: bad header");
  }
  const uint64_t want = sizeof h + static_cast<uint64_t>(h.pairs) * (sizeof(float) + sizeof(int8_t));
  if (static_cast<uint64_t>(h.pairs) > bytes.size() || bytes.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval metrics: ", bytes.size(), " bytes for ", h.pairs, " scores, expected ", want));
  }
  EvalMetrics m(static_cast<HeadType>(h.head), h.num_classes, h.top_k);
  if (m.num_classes_ != h.num_classes || m.top_k_ != h.top_k) {
    return absl::InvalidArgumentError("eval metrics: classes and top_k do not fit the head");
  }
  m.count_ = h.count;
  m.loss_sum_ = h.loss_sum;
  m.logloss_sum_ = h.logloss_sum;
  m.sq_err_sum_ = h.sq_err_sum;
  m.correct_ = h.correct;
  m.top_k_hits_ = h.top_k_hits;
  m.scores_.resize(h.pairs);
  m.labels_.resize(h.pairs);
  if (h.pairs > 0) {
    std::memcpy(m.scores_.data(), bytes.data() + sizeof h, h.pairs * sizeof(float));
    std::memcpy(m.labels_.data(), bytes.data() + sizeof h + h.pairs * sizeof(float), h.pairs);
  }
  return m;
}

double EvalMetrics::loss() const { return count_ > 0 ? loss_sum_ / static_cast<double>(count_) : kNaN; }

double EvalMetrics::auc() const {
  if (head_ != HeadType::kBinary || count_ == 0) return kNaN;
  return ExactAuc(std::span<const float>(scores_), std::span<const int8_t>(labels_));
}

double EvalMetrics::logloss() const {
  if (head_ != HeadType::kBinary || count_ == 0) return kNaN;
  return logloss_sum_ / static_cast<double>(count_);
}

double EvalMetrics::accuracy() const {
  if (head_ == HeadType::kRegression || count_ == 0) return kNaN;
  return static_cast<double>(correct_) / static_cast<double>(count_);
}

double EvalMetrics::precision_at_k() const {
  if (head_ != HeadType::kSoftmax || count_ == 0) return kNaN;
  return static_cast<double>(top_k_hits_) / (static_cast<double>(top_k_) * static_cast<double>(count_));
}

double EvalMetrics::rmse() const {
  if (head_ != HeadType::kRegression || count_ == 0) return kNaN;
  return std::sqrt(sq_err_sum_ / static_cast<double>(count_));
}

std::vector<std::pair<std::string, double>> EvalMetrics::Values() const {
  switch (head_) {
    case HeadType::kBinary:
      return {{"auc", auc()}, {"logloss", logloss()}, {"accuracy", accuracy()}, {"loss", loss()}};
    case HeadType::kSoftmax: {
      std::vector<std::pair<std::string, double>> v = {{"accuracy", accuracy()}, {"loss", loss()}};
      if (top_k_ > 1) v.emplace_back(absl::StrCat("precision_at_", top_k_), precision_at_k());
      return v;
    }
    case HeadType::kRegression:
      return {{"rmse", rmse()}, {"loss", loss()}};
  }
  return {};
}

}  // namespace shardwild
