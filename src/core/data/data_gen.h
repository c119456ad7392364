// Synthetic data sets from a planted model, in the real file formats the
// readers take (Criteo TSV, libsvm, fastText text), so that readers and
// trainers can be tested end to end against a known optimum: the generator
// reports the Bayes-optimal metric of the planted model on the very rows it
// wrote (its true probabilities scored against the sampled labels).
//
//   criteo: "label\tI1..I13\tC1..C26\n". logit = bias + sum_j v_j log1p(I_j)
//           + sum_f w_f[C_f]. I_j = round(exp(N(mu_j, sigma_j))), missing
//           (empty; log1p(0) in the model, as the reader maps it to 0) with a
//           per-feature probability (0 .. 0.75). C_f: a Zipf-drawn rank
//           (exponent 1.05 .. 1.2) over a per-field vocabulary (3 .. 100k
//           values), written as 8 lowercase hex digits = a fixed bijective
//           32-bit hash of (field, rank); six fields are sometimes empty.
//           Only the 64 most frequent values of a field carry a weight,
//           w_f[rank] ~ N(0, (s_f / sqrt(1 + rank / 20))^2), s_f in
//           0.1 .. 0.32, so that a model trained on a few 100k rows can
//           learn it. The bias is set for a positive rate of 0.25.
//           Bayes AUC ~0.77 .. 0.79.
//   libsvm: "label idx:val ...\n" with labels 0/1 and sorted, distinct,
//           1-based indices over `libsvm_features` indices; 10..40 draws a
//           row of Zipf(1.2) ranks, mapped to indices by a fixed
//           permutation; values in {0.050, 0.051, ..., 1.000}. logit = bias
//           + sum w[idx] val with w[rank] ~ N(0, 1 / (1 + rank / 50)) for
//           the 400 most frequent ranks, 0 beyond. Positive rate 0.35,
//           Bayes AUC ~0.80 .. 0.81.
//   text:   "__label__c<k> w<id> w<id> ...\n": `text_classes` classes, a
//           vocabulary of `text_vocab` tokens, 5..30 tokens a document. Each
//           class owns min(250, text_vocab / (4 * text_classes)) topic words
//           (Zipf(0.8) among them); a document
//           has a latent topic (mildly unbalanced prior; 30% of documents
//           borrow 30% of their topic words from a second one), and each
//           token is a topic word with probability U(0.3, 0.9) for the
//           document, else a shared word (Zipf(1.0) over the rest of the
//           vocabulary). Planted model: p(class | doc) = softmax_c(mean over
//           the doc's tokens of W[token, c]), where a topic word's row of W
//           is 8 * U(0.5, 1.5) on its class (and, for half of them, up to
//           half that on another class) and a shared word's row is 0:
//           fastText's model class (mean-pooled embeddings, then a linear
//           softmax without bias). The label is sampled from that softmax.
//           Bayes accuracy ~0.81 .. 0.82 with 8 classes.
//
// The output is deterministic for (options, seed, model_seed): the planted
// model is drawn from model_seed alone, and rows from a per-row random stream
// of seed, so the first n rows of a longer file equal the file of n rows, and
// files of different seeds are independent samples of the same model. Only
// fixed, written-out generators are used (SplitMix64, xoshiro256**,
// Marsaglia's polar method), never std:: distributions, whose output differs
// between standard libraries.
//
// Thread safety: GenerateData may run in several threads at once on distinct
// output paths.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardwild {

struct DataGenOptions {
  std::string kind;                   // "criteo", "libsvm" or "text"
  int64_t rows = 0;                   // records to write; >= 1
  std::string out;                    // the file to write; replaced atomically
  uint64_t seed = 1;                  // the rows: a training and a test file take different seeds
  // The planted model (weights, vocabulary, permutations). Files written
  // with the same model_seed (and kind options) come from one model, so one
  // can be the training set and another the test set.
  uint64_t model_seed = 1;
  int text_classes = 8;               // text: classes, in [2, 1000]
  int64_t text_vocab = 20000;         // text: tokens, >= 64 * text_classes
  int64_t libsvm_features = 100000;   // libsvm: feature indices 1..N, N >= 1000
  // Files to split the rows into, in order (Paths() names them); the rows
  // are the same as in one file of `rows` rows. In [1, min(rows, 100000)].
  int files = 1;
  // "none", "gz" or "zst": each file compressed in independent blocks
  // (core/io/compressed.h), its name ending in .gz / .zst.
  std::string compress = "none";
  // Files written at once; 0 = one per hardware thread.
  int threads = 0;
  // The files written: `out` (with the compression's suffix added when it
  // lacks it), or for several files `out` with "-00000", "-00001", ...
  // before its first '.' in the file name ("day.tsv" -> "day-00000.tsv.gz").
  std::vector<std::string> Paths() const;

  // OK, or InvalidArgument naming the first bad field.
  absl::Status Validate() const;
};

struct DataGenResult {
  int64_t rows = 0;
  int64_t bytes = 0;          // size of the files written
  struct File {
    std::string path;
    int64_t rows = 0;
    int64_t bytes = 0;
  };
  std::vector<File> files;    // in row order
  // "bayes_auc" (criteo, libsvm) or "bayes_accuracy" (text): the metric of
  // the planted model's true probabilities against the labels written (AUC:
  // ExactAuc; accuracy: arg-max, the lowest class among equal maxima).
  std::string metric_name;
  double bayes_metric = 0;
  double positive_rate = 0;   // criteo, libsvm: share of label 1; text: 0
  int num_classes = 0;        // 2 for criteo and libsvm; text_classes for text
};

// Writes options.rows records of options.kind to options.Paths(), several
// files in parallel: each to a temporary file next to it, synced, and
// renamed over its path once every file is written, so that each path is
// either absent/unchanged or complete. Blocks until done.
// Errors: InvalidArgument for bad options; an I/O error naming the path (the
// temporary file is then removed).
absl::StatusOr<DataGenResult> GenerateData(const DataGenOptions& options);

}  // namespace shardwild
