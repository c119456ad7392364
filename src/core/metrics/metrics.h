// Evaluation metrics of one evaluation pass: loss for every head, plus exact
// ROC AUC and log-loss (binary), accuracy (binary, softmax), fastText's
// precision at k (softmax) and RMSE (regression).
//
// An EvalMetrics accumulates the predictions of the rows it is given; each
// worker (or task) keeps its own over its part of the evaluation set, and the
// coordinator Merges them at the end. Every metric is then that of all the
// rows added, whatever the split: sums are kept for the means, and for the
// AUC every row's (score, label) pair is kept (5 bytes a row) so that the AUC
// is exact, computed with one sort when auc() is called.
//
// Thread safety: none; one thread owns an EvalMetrics. Copyable.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config/options.h"

namespace shardwild {

class EvalMetrics {
 public:
  // `num_classes`: the softmax head's classes (>= 1); ignored otherwise.
  // `top_k` (>= 1) is the k of precision_at_k(); it is capped at num_classes.
  EvalMetrics(HeadType head, int num_classes, int top_k = 1);

  // Binary head: one logit per row (probability = sigmoid(logit)); labels
  // 0/1 (any non-zero label counts as positive).
  void AddBinary(const float* logits, const int32_t* labels, int64_t n);

  // Softmax head: logits [n x num_classes], row-major, for the records
  // first_record .. first_record + n - 1 of a data set. Single-label data
  // (label_offsets == nullptr): row i's label is labels[i]. Multi-label
  // data: row i's labels are label_sets[label_offsets[first_record + i] ..
  // label_offsets[first_record + i + 1]) (the data set's arrays, indexed by
  // record; an empty span falls back to labels[i]). Labels must lie in
  // [0, num_classes); others are ignored (as if the row had not that label).
  void AddSoftmax(const float* logits, const int32_t* labels, const int64_t* label_offsets,
                  const int32_t* label_sets, int64_t first_record, int64_t n);

  // Regression head: predictions and targets, n of each.
  void AddRegression(const float* predictions, const float* targets, int64_t n);

  // Adds everything `other` holds. Both must have the same head, classes and
  // top_k (checked with assert).
  void Merge(const EvalMetrics& other);

  HeadType head() const { return head_; }
  int top_k() const { return top_k_; }
  // Rows added (through Add* and Merge).
  int64_t count() const { return count_; }

  // Every value below is NaN when no row was added, or when the metric does
  // not belong to the head.

  // Mean loss of the head: binary cross-entropy from the logits (no
  // clamping), softmax cross-entropy against the row's label distribution
  // (uniform over its labels), or mean squared error.
  double loss() const;
  // Binary: exact ROC AUC of the logits against the labels over every row,
  // ties counted 1/2 (ExactAuc). NaN if one class is absent.
  double auc() const;
  // Binary: mean cross-entropy with the probabilities clamped to
  // [1e-7, 1 - 1e-7].
  double logloss() const;
  // Binary: share of rows with (probability > 0.5) == label. Softmax: share
  // of rows whose arg-max (the lowest index among equal maxima) is one of
  // the row's labels.
  double accuracy() const;
  // Softmax: fastText's P@k = (top-k predictions that are among the row's
  // labels) / (k * rows), k = min(top_k, num_classes).
  double precision_at_k() const;
  // Regression: sqrt(mean squared error).
  double rmse() const;

  // Every metric the head implies, in this order:
  //   binary:     "auc", "logloss", "accuracy", "loss"
  //   softmax:    "accuracy", "loss", and "precision_at_<k>" when k > 1
  //   regression: "rmse", "loss"
  std::vector<std::pair<std::string, double>> Values() const;

  // The whole state as bytes and back, so that a worker process can hand its
  // part of an evaluation to the process that merges them. The bytes are in
  // host byte order (for processes on one machine): a fixed header (magic,
  // head, classes, top_k, the sums) followed by the binary head's scores and
  // labels. Deserialize gives an EvalMetrics equal to the one serialized, or
  // InvalidArgument when `bytes` is not one (wrong magic, head, size).
  std::string Serialize() const;
  static absl::StatusOr<EvalMetrics> Deserialize(std::string_view bytes);

 private:
  // Constant after construction.
  HeadType head_;
  int num_classes_;
  int top_k_;  // capped at num_classes_ for softmax

  // Sums over the rows added.
  int64_t count_ = 0;
  double loss_sum_ = 0;     // per-row loss of the head
  double logloss_sum_ = 0;  // binary: clamped cross-entropy
  double sq_err_sum_ = 0;   // regression
  int64_t correct_ = 0;     // binary, softmax
  int64_t top_k_hits_ = 0;  // softmax
  // Binary: every row's logit and label, for the exact AUC.
  std::vector<float> scores_;
  std::vector<int8_t> labels_;
};

// Exact ROC AUC of `scores` against 0/1 `labels` (non-zero = positive): the
// probability that a random positive scores above a random negative, ties
// counting 1/2 (the Mann-Whitney U statistic with midranks, divided by
// positives x negatives). -0 and +0 tie; NaN scores rank below every other
// score and tie with each other. NaN if either class is absent. Sorts a
// copy: O(n log n) time, 8 bytes a row. The spans must have the same size.
double ExactAuc(std::span<const float> scores, std::span<const int32_t> labels);
double ExactAuc(std::span<const float> scores, std::span<const int8_t> labels);

}  // namespace shardwild
