#include "core/data/data_gen.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/metrics/metrics.h"
#include "core/base/random.h"
#include "core/base/parallel_for.h"
#include "core/base/status.h"
#include "core/io/atomic_file.h"
#include "core/io/compressed.h"
#include "core/io/writable_file.h"

namespace shardwild {
namespace {

// ---- Fixed random generators -------------------------------------------------


// A 64-bit hash of a few words.
uint64_t Mix(std::initializer_list<uint64_t> words) {
  uint64_t h = 0x243f6a8885a308d3ull;
  for (uint64_t w : words) {
    uint64_t s = h ^ w;
    h = SplitMix64(s);
  }
  return h;
}

// Stream tags, so that no two uses of the seed share a stream.
enum Tag : uint64_t { kTagRow = 1, kTagPilot = 2, kTagWeight = 3 };

// xoshiro256** (Blackman and Vigna), seeded through SplitMix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& w : s_) w = SplitMix64(seed);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1), 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [lo, hi].
  int64_t UniformInt(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Uniform() * static_cast<double>(hi - lo + 1));
  }
  // Standard normal, Marsaglia's polar method (the second value is dropped).
  double Normal() {
    double u, v, s;
    do {
      u = 2 * Uniform() - 1;
      v = 2 * Uniform() - 1;
      s = u * u + v * v;
    } while (s >= 1 || s == 0);
    return u * std::sqrt(-2 * std::log(s) / s);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Ranks 0..n-1 with P(rank) proportional to (rank + 1)^-exponent.
class Zipf {
 public:
  Zipf(int64_t n, double exponent) : cdf_(n) {
    double sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      sum += std::pow(static_cast<double>(k + 1), -exponent);
      cdf_[k] = sum;
    }
  }
  int64_t Draw(Rng& rng) const {
    const double u = rng.Uniform() * cdf_.back();
    const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
    return std::min<int64_t>(it - cdf_.begin(), static_cast<int64_t>(cdf_.size()) - 1);
  }

 private:
  std::vector<double> cdf_;
};

// A fixed permutation of 0..n-1 (n <= 2^31): i -> (i * a + b) mod n with
// gcd(a, n) = 1.
class Permutation {
 public:
  explicit Permutation(int64_t n) : n_(n), b_(n / 3) {
    a_ = static_cast<uint64_t>(static_cast<double>(n) * 0.6180339887498949) | 1;
    while (std::gcd(a_, n_) != 1) a_ += 2;
  }
  int64_t operator()(int64_t i) const { return static_cast<int64_t>((static_cast<uint64_t>(i) * a_ + b_) % n_); }

 private:
  uint64_t n_, a_, b_;
};

double Sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }

// The bias b with mean(sigmoid(b + x)) = rate over the pilot logits x.
double CalibrateBias(const std::vector<double>& x, double rate) {
  double lo = -30, hi = 30;
  for (int it = 0; it < 100; ++it) {
    const double mid = (lo + hi) / 2;
    double sum = 0;
    for (double v : x) sum += Sigmoid(mid + v);
    (sum / static_cast<double>(x.size()) < rate ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

void AppendInt(std::string* s, int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  s->append(buf, r.ptr);
}

// Gathers the labels and true logits of the rows written, for the result.
// What a range of rows tells about the planted model: binary kinds keep
// every row's true logit and label (for ExactAuc), text counts the rows
// whose arg-max class is the label. Ranges of one data set merge in order.
struct Tally {
  std::vector<float> logits;
  std::vector<int8_t> labels;
  int64_t positives = 0;
  int64_t correct = 0;
  int64_t rows = 0;
  void Add(double logit, bool label) {
    logits.push_back(static_cast<float>(logit));
    labels.push_back(label ? 1 : 0);
    positives += label;
    ++rows;
  }
  void Merge(const Tally& o) {
    logits.insert(logits.end(), o.logits.begin(), o.logits.end());
    labels.insert(labels.end(), o.labels.begin(), o.labels.end());
    positives += o.positives;
    correct += o.correct;
    rows += o.rows;
  }
  void FinishBinary(DataGenResult* r) const {
    r->metric_name = "bayes_auc";
    r->bayes_metric = ExactAuc(std::span<const float>(logits), std::span<const int8_t>(labels));
    r->positive_rate = labels.empty() ? 0 : static_cast<double>(positives) / static_cast<double>(labels.size());
    r->num_classes = 2;
  }
};

// Where the generated lines go.
using LineSink = CompressedFileWriter;

// ---- criteo ------------------------------------------------------------------

constexpr int kCriteoDense = 13;
constexpr int kCriteoFields = 26;
constexpr double kCriteoPositiveRate = 0.25;
constexpr int64_t kCriteoHead = 64;
constexpr double kCriteoDecay = 20;

// I_j = round(exp(N(mu, sigma))), missing with probability `missing`;
// logit term v * log1p(I_j).
struct DenseSpec {
  double mu, sigma, missing, v;
};
constexpr DenseSpec kDense[kCriteoDense] = {
    {1.0, 1.2, 0.45, 0.40}, {2.0, 1.5, 0.00, -0.16}, {0.5, 1.0, 0.20, 0.00},  {2.5, 1.2, 0.20, -0.24},
    {6.0, 2.0, 0.03, 0.16}, {3.0, 1.5, 0.22, -0.08}, {1.5, 1.3, 0.04, 0.32},  {2.5, 1.0, 0.00, 0.00},
    {4.0, 1.5, 0.04, -0.16}, {0.3, 0.8, 0.45, 0.48}, {1.0, 1.0, 0.04, 0.24}, {0.2, 0.7, 0.75, 0.32},
    {2.0, 1.3, 0.20, -0.13}};

// A categorical field: `vocab` values drawn Zipf(`exponent`), missing with
// probability `missing`. Value rank r < kCriteoHead carries a weight
// N(0, (scale / sqrt(1 + r / kCriteoDecay))^2); the rarer ones none, so that
// the signal sits in values a trainer sees often.
struct FieldSpec {
  int64_t vocab;
  double exponent, missing, scale;
};
constexpr FieldSpec kFields[kCriteoFields] = {
    {1500, 1.18, 0.00, 0.21}, {600, 1.05, 0.00, 0.14}, {100000, 1.18, 0.03, 0.32},
    {40000, 1.20, 0.03, 0.24}, {300, 1.20, 0.00, 0.17}, {25, 1.18, 0.12, 0.28},
    {15000, 1.18, 0.00, 0.21}, {60, 1.20, 0.00, 0.10}, {3, 1.05, 0.00, 0.14},
    {80000, 1.18, 0.00, 0.28}, {6000, 1.20, 0.00, 0.21}, {60000, 1.18, 0.03, 0.24},
    {4000, 1.20, 0.00, 0.14}, {27, 1.05, 0.00, 0.17}, {10000, 1.18, 0.00, 0.21},
    {100000, 1.18, 0.03, 0.28}, {10, 1.05, 0.00, 0.24}, {2500, 1.20, 0.00, 0.17},
    {1000, 1.18, 0.44, 0.21}, {4, 1.05, 0.44, 0.21}, {25000, 1.18, 0.03, 0.21},
    {15, 1.18, 0.00, 0.10}, {40, 1.18, 0.00, 0.21}, {10000, 1.18, 0.00, 0.21},
    {100, 1.20, 0.44, 0.17}, {250, 1.18, 0.44, 0.14}};

// murmur3's 32-bit finaliser: a bijection, so distinct (field, rank) give
// distinct ids.
uint32_t Fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

class CriteoModel {
 public:
  explicit CriteoModel(uint64_t seed) {
    for (int f = 0; f < kCriteoFields; ++f) {
      zipf_.emplace_back(kFields[f].vocab, kFields[f].exponent);
      std::vector<float>& w = weights_.emplace_back(std::min(kCriteoHead, kFields[f].vocab));
      for (int64_t r = 0; r < static_cast<int64_t>(w.size()); ++r) {
        Rng rng(Mix({seed, kTagWeight, static_cast<uint64_t>(f), static_cast<uint64_t>(r)}));
        w[r] = static_cast<float>(kFields[f].scale / std::sqrt(1.0 + static_cast<double>(r) / kCriteoDecay) * rng.Normal());
      }
    }
    std::vector<double> pilot(20000);
    for (size_t i = 0; i < pilot.size(); ++i) {
      Rng rng(Mix({seed, kTagPilot, i}));
      pilot[i] = DrawRow(rng, nullptr);
    }
    bias_ = CalibrateBias(pilot, kCriteoPositiveRate);
  }

  // Draws one row; appends its features to `line` (when not null) as
  // "\tI1..\tC26" and returns its logit less the bias.
  double DrawRow(Rng& rng, std::string* line) const {
    double logit = 0;
    for (const DenseSpec& d : kDense) {
      const bool missing = rng.Uniform() < d.missing;
      const double g = rng.Normal();
      if (line) line->push_back('\t');
      if (missing) continue;
      const int64_t value = std::llround(std::exp(std::min(d.mu + d.sigma * g, 20.0)));
      logit += d.v * std::log1p(static_cast<double>(value));
      if (line) AppendInt(line, value);
    }
    for (int f = 0; f < kCriteoFields; ++f) {
      const bool missing = rng.Uniform() < kFields[f].missing;
      const int64_t rank = zipf_[f].Draw(rng);
      if (line) line->push_back('\t');
      if (missing) continue;
      if (rank < static_cast<int64_t>(weights_[f].size())) logit += weights_[f][rank];
      if (line) {
        const uint32_t id = Fmix32((static_cast<uint32_t>(f) << 20) | static_cast<uint32_t>(rank));
        static constexpr char kHex[] = "0123456789abcdef";
        for (int shift = 28; shift >= 0; shift -= 4) line->push_back(kHex[(id >> shift) & 0xf]);
      }
    }
    return logit;
  }
  double bias() const { return bias_; }

 private:
  std::vector<Zipf> zipf_;
  std::vector<std::vector<float>> weights_;  // [field][rank < head]
  double bias_ = 0;
};

absl::Status GenerateCriteo(const DataGenOptions& o, int64_t first, int64_t end, LineSink* file, Tally* tally) {
  const CriteoModel model(o.model_seed);
  std::string line, features;
  for (int64_t r = first; r < end; ++r) {
    Rng rng(Mix({o.seed, kTagRow, static_cast<uint64_t>(r)}));
    features.clear();
    const double logit = model.bias() + model.DrawRow(rng, &features);
    const bool label = rng.Uniform() < Sigmoid(logit);
    tally->Add(logit, label);
    line.clear();
    line.push_back(label ? '1' : '0');
    line.append(features);
    line.push_back('\n');
    SW_RETURN_IF_ERROR(file->Append(line));
  }
  return absl::OkStatus();
}

// ---- libsvm ------------------------------------------------------------------

constexpr double kLibsvmPositiveRate = 0.35;
constexpr double kLibsvmExponent = 1.2;
// Rank r < kLibsvmHead has a weight N(0, (kLibsvmScale / sqrt(1 + r /
// kLibsvmDecay))^2); the rarer ranks none.
constexpr int64_t kLibsvmHead = 400;
constexpr double kLibsvmScale = 1.0;
constexpr double kLibsvmDecay = 50;

// One feature of a row: 0-based index, its Zipf rank, value in thousandths.
struct LibsvmEntry {
  int64_t index, rank;
  int value;
};

class LibsvmModel {
 public:
  LibsvmModel(uint64_t seed, int64_t features) : zipf_(features, kLibsvmExponent), index_of_rank_(features) {
    const int64_t head = std::min(kLibsvmHead, features);
    weights_.resize(head);
    for (int64_t r = 0; r < head; ++r) {
      Rng rng(Mix({seed, kTagWeight, static_cast<uint64_t>(r)}));
      weights_[r] = kLibsvmScale / std::sqrt(1.0 + static_cast<double>(r) / kLibsvmDecay) * rng.Normal();
    }
    std::vector<double> pilot(20000);
    std::vector<LibsvmEntry> scratch;
    for (size_t i = 0; i < pilot.size(); ++i) {
      Rng rng(Mix({seed, kTagPilot, i}));
      pilot[i] = DrawRow(rng, &scratch);
    }
    bias_ = CalibrateBias(pilot, kLibsvmPositiveRate);
  }

  // Draws one row's features, sorted by index, into `row`; returns its logit
  // less the bias.
  double DrawRow(Rng& rng, std::vector<LibsvmEntry>* row) const {
    row->clear();
    const int64_t n = rng.UniformInt(10, 40);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t rank = zipf_.Draw(rng);
      const int value = static_cast<int>(rng.UniformInt(50, 1000));
      row->push_back({index_of_rank_(rank), rank, value});
    }
    // Distinct indices: a later draw of an index is dropped.
    std::stable_sort(row->begin(), row->end(), [](const LibsvmEntry& a, const LibsvmEntry& b) { return a.index < b.index; });
    row->erase(std::unique(row->begin(), row->end(),
                           [](const LibsvmEntry& a, const LibsvmEntry& b) { return a.index == b.index; }),
               row->end());
    double logit = 0;
    for (const LibsvmEntry& e : *row) {
      if (e.rank < static_cast<int64_t>(weights_.size())) logit += weights_[e.rank] * e.value / 1000.0;
    }
    return logit;
  }
  double bias() const { return bias_; }

 private:
  Zipf zipf_;
  Permutation index_of_rank_;
  std::vector<double> weights_;  // [rank < head]
  double bias_ = 0;
};

absl::Status GenerateLibsvm(const DataGenOptions& o, int64_t first, int64_t end, LineSink* file, Tally* tally) {
  const LibsvmModel model(o.model_seed, o.libsvm_features);
  std::string line;
  std::vector<LibsvmEntry> row;
  for (int64_t r = first; r < end; ++r) {
    Rng rng(Mix({o.seed, kTagRow, static_cast<uint64_t>(r)}));
    const double logit = model.bias() + model.DrawRow(rng, &row);
    const bool label = rng.Uniform() < Sigmoid(logit);
    tally->Add(logit, label);
    line.clear();
    line.push_back(label ? '1' : '0');
    for (const auto& [index, rank, value] : row) {
      line.push_back(' ');
      AppendInt(&line, index + 1);
      line.push_back(':');
      AppendInt(&line, value / 1000);
      line.push_back('.');
      const int frac = value % 1000;
      line.push_back(static_cast<char>('0' + frac / 100));
      line.push_back(static_cast<char>('0' + frac / 10 % 10));
      line.push_back(static_cast<char>('0' + frac % 10));
    }
    line.push_back('\n');
    SW_RETURN_IF_ERROR(file->Append(line));
  }
  return absl::OkStatus();
}

// ---- text --------------------------------------------------------------------

constexpr int64_t kTopicWords = 250;     // per class (fewer for a small vocabulary)
constexpr double kTopicExponent = 0.8;   // Zipf of a class's topic words
constexpr double kSharedExponent = 1.0;  // Zipf of the shared words
constexpr double kTopicScale = 8.0;      // primary weight of a topic word: kTopicScale * U(0.5, 1.5)

class TextModel {
 public:
  TextModel(uint64_t seed, int classes, int64_t vocab)
      : classes_(classes),
        topic_words_(std::min<int64_t>(kTopicWords, vocab / (4 * classes))),
        shared_(vocab - topic_words_ * classes, kSharedExponent),
        topic_(topic_words_, kTopicExponent),
        token_of_(vocab),
        weights_(static_cast<size_t>(topic_words_ * classes) * classes, 0.0f) {
    // Topic word (c, r) is token slot c * topic_words_ + r; its row of W has
    // a primary weight on c and, for half of them, a smaller one on another
    // class. Shared words (slots beyond) have W = 0.
    for (int c = 0; c < classes_; ++c) {
      for (int64_t r = 0; r < topic_words_; ++r) {
        Rng rng(Mix({seed, kTagWeight, static_cast<uint64_t>(c), static_cast<uint64_t>(r)}));
        float* w = &weights_[(c * topic_words_ + r) * classes_];
        const double a = kTopicScale * (0.5 + rng.Uniform());
        w[c] = static_cast<float>(a);
        const int other = static_cast<int>((c + 1 + rng.UniformInt(0, classes_ - 2)) % classes_);
        if (rng.Uniform() < 0.5) w[other] = static_cast<float>(0.5 * a * rng.Uniform());
      }
    }
    // Class prior of a document's topic: mildly unbalanced.
    double sum = 0;
    for (int c = 0; c < classes_; ++c) prior_.push_back(sum += 1.0 / (1.0 + 0.1 * c));
  }

  // Draws one document's token slots into `slots`; writes the mean of their
  // rows of W into `logits` (classes_ entries).
  void DrawDoc(Rng& rng, std::vector<int64_t>* slots, std::vector<double>* logits) const {
    slots->clear();
    const int64_t length = rng.UniformInt(5, 30);
    const double u = rng.Uniform() * prior_.back();
    const int topic = static_cast<int>(std::upper_bound(prior_.begin(), prior_.end(), u) - prior_.begin());
    const int second = static_cast<int>(rng.UniformInt(0, classes_ - 1));
    const double second_share = rng.Uniform() < 0.3 ? 0.3 : 0.0;
    const double topical = 0.3 + 0.6 * rng.Uniform();  // share of topic words
    logits->assign(classes_, 0.0);
    for (int64_t i = 0; i < length; ++i) {
      if (rng.Uniform() < topical) {
        const int c = rng.Uniform() < second_share ? second : topic;
        const int64_t slot = c * topic_words_ + topic_.Draw(rng);
        slots->push_back(slot);
        const float* w = &weights_[slot * classes_];
        for (int k = 0; k < classes_; ++k) (*logits)[k] += w[k];
      } else {
        slots->push_back(topic_words_ * classes_ + shared_.Draw(rng));
      }
    }
    for (double& l : *logits) l /= static_cast<double>(length);
  }
  // The token written for a slot: "w<id>", ids a fixed permutation of slots.
  int64_t TokenId(int64_t slot) const { return token_of_(slot); }

 private:
  int classes_;
  int64_t topic_words_;
  Zipf shared_, topic_;
  Permutation token_of_;
  std::vector<float> weights_;  // [topic slot x classes]
  std::vector<double> prior_;   // cumulative
};

absl::Status GenerateText(const DataGenOptions& o, int64_t first, int64_t end, LineSink* file, Tally* tally) {
  const TextModel model(o.model_seed, o.text_classes, o.text_vocab);
  const int k = o.text_classes;
  std::string line;
  std::vector<int64_t> slots;
  std::vector<double> logits, cumulative(k);
  int64_t correct = 0;
  for (int64_t r = first; r < end; ++r) {
    Rng rng(Mix({o.seed, kTagRow, static_cast<uint64_t>(r)}));
    model.DrawDoc(rng, &slots, &logits);
    const double m = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (int c = 0; c < k; ++c) cumulative[c] = sum += std::exp(logits[c] - m);
    const double u = rng.Uniform() * sum;
    const int label =
        std::min(k - 1, static_cast<int>(std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin()));
    const int arg_max = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    correct += arg_max == label;
    line.clear();
    line.append("__label__c");
    AppendInt(&line, label);
    for (int64_t slot : slots) {
      line.append(" w");
      AppendInt(&line, model.TokenId(slot));
    }
    line.push_back('\n');
    SW_RETURN_IF_ERROR(file->Append(line));
  }
  tally->correct += correct;
  tally->rows += end - first;
  return absl::OkStatus();
}

}  // namespace

absl::Status DataGenOptions::Validate() const {
  if (kind != "criteo" && kind != "libsvm" && kind != "text") {
    return absl::InvalidArgumentError(
        absl::StrCat("data gen: kind must be criteo, libsvm or text, got '", kind, "'"));
  }
  if (rows < 1) return absl::InvalidArgumentError(absl::StrCat("data gen: rows must be >= 1, got ", rows));
  if (out.empty()) return absl::InvalidArgumentError("data gen: out (the file to write) is required");
  if (text_classes < 2 || text_classes > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("data gen: text_classes must be in [2, 1000], got ", text_classes));
  }
  if (text_vocab < 64 * static_cast<int64_t>(text_classes) || text_vocab > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("data gen: text_vocab must be in [64 * text_classes = ",
                                                   64 * text_classes, ", 2^31], got ", text_vocab));
  }
  if (files < 1 || files > 100000 || files > rows) {
    return absl::InvalidArgumentError(absl::StrCat("data gen: files must be in [1, min(rows, 100000)], got ", files));
  }
  if (const absl::StatusOr<Compression> c = ParseCompression(compress); !c.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("data gen: ", c.status().message()));
  }
  if (libsvm_features < 1000 || libsvm_features > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data gen: libsvm_features must be in [1000, 2^31], got ", libsvm_features));
  }
  return absl::OkStatus();
}

std::vector<std::string> DataGenOptions::Paths() const {
  const Compression c = ParseCompression(compress).value_or(Compression::kNone);
  const std::string suffix = CompressionSuffix(c);
  auto with_suffix = [&](const std::string& p) {
    return suffix.empty() || (p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0)
               ? p
               : p + suffix;
  };
  if (files <= 1) return {with_suffix(out)};
  const size_t slash = out.rfind('/');
  const size_t name_at = slash == std::string::npos ? 0 : slash + 1;
  size_t dot = out.find('.', name_at);
  if (dot == std::string::npos || dot == name_at) dot = out.size();
  std::vector<std::string> paths;
  for (int i = 0; i < files; ++i) {
    char index[16];
    std::snprintf(index, sizeof index, "-%05d", i);
    paths.push_back(with_suffix(out.substr(0, dot) + index + out.substr(dot)));
  }
  return paths;
}

absl::StatusOr<DataGenResult> GenerateData(const DataGenOptions& options) {
  SW_RETURN_IF_ERROR(options.Validate());
  SW_ASSIGN_OR_RETURN(const Compression compression, ParseCompression(options.compress));
  const std::vector<std::string> paths = options.Paths();
  // The files' folder is made where it is missing (`--out data/train.tsv` in
  // a fresh clone, as the shipped configs say), as `mkdir -p` would.
  for (const std::string& path : paths) {
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (dir.empty()) continue;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);  // (no error where it is there already)
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": cannot be written: its folder ", dir.string(), " cannot be made: ", ec.message()));
    }
  }
  const int n = static_cast<int>(paths.size());
  const int hw = ResolveThreads(0);
  const int parallel = std::min(n, ResolveThreads(options.threads));
  // File i holds rows [i * rows / n, (i + 1) * rows / n): row r is drawn from
  // its own stream, so the files together are the one file of `rows` rows.
  std::vector<Tally> tallies(static_cast<size_t>(n));
  std::vector<uint64_t> bytes(static_cast<size_t>(n));
  std::vector<std::unique_ptr<LineSink>> sinks(static_cast<size_t>(n));
  SW_RETURN_IF_ERROR(ParallelForStatus(parallel, n, [&](int64_t i) -> absl::Status {
    const int64_t first = options.rows * i / n, end = options.rows * (i + 1) / n;
    CompressedWriterOptions wo;
    wo.compression = compression;
    wo.threads = std::max(1, hw / parallel);
    SW_ASSIGN_OR_RETURN(sinks[i], CompressedFileWriter::Open(paths[i], wo));
    LineSink* sink = sinks[i].get();
    if (options.kind == "criteo") return GenerateCriteo(options, first, end, sink, &tallies[i]);
    if (options.kind == "libsvm") return GenerateLibsvm(options, first, end, sink, &tallies[i]);
    return GenerateText(options, first, end, sink, &tallies[i]);
  }));
  // Every file written, then every one committed: an error leaves none.
  for (int i = 0; i < n; ++i) {
    SW_RETURN_IF_ERROR(sinks[i]->Commit());
    bytes[i] = sinks[i]->bytes_out();
  }
  Tally all;
  for (const Tally& t : tallies) all.Merge(t);
  DataGenResult result;
  result.rows = options.rows;
  if (options.kind == "text") {
    result.metric_name = "bayes_accuracy";
    result.bayes_metric = static_cast<double>(all.correct) / static_cast<double>(options.rows);
    result.positive_rate = 0;
    result.num_classes = options.text_classes;
  } else {
    all.FinishBinary(&result);
  }
  for (int i = 0; i < n; ++i) {
    result.bytes += static_cast<int64_t>(bytes[i]);
    result.files.push_back({paths[i], options.rows * (i + 1) / n - options.rows * i / n, static_cast<int64_t>(bytes[i])});
  }
  return result;
}

}  // namespace shardwild
