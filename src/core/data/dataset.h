// A data set held in memory, ready for training: dense features, sparse
// fields (variable-length id lists with optional weights) and labels.
//
// Every reader (IDX images, Criteo TSV, libsvm, fastText-style text, CSV;
// core/data/readers.h) produces one, and the model (core/model/model.h) reads its
// batches from one. Records are addressed by index 0..count-1.
//
// Thread safety: a Dataset is immutable once loaded; any number of threads
// may read it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardwild {

// One sparse field (a Criteo categorical column, libsvm's features, the
// tokens of a text): for record r, the ids ids[offsets[r] .. offsets[r+1])
// with weights weights[...] at the same positions (libsvm values).
// A record may have no ids (a missing Criteo field, an empty text).
struct SparseField {
  std::string name;               // e.g. "C1", "features", "tokens", "ngrams"
  std::vector<int64_t> offsets;   // count + 1 entries, offsets[0] = 0, non-decreasing
  std::vector<uint64_t> ids;      // raw 64-bit ids: a Criteo hex value, a libsvm index - 1, a token hash
  std::vector<float> weights;     // empty = every weight is 1; else ids.size() entries
  int64_t size(int64_t r) const { return offsets[r + 1] - offsets[r]; }
};

// Rows a reader left out under data.on_error: skip, by reason ("wrong field
// count", "non-numeric value", "bad hex", "index 0", "unsorted indices", ...).
struct SkippedRows {
  std::map<std::string, int64_t> by_reason;
  // Rows skipped in each file, for data read from several files (only files
  // with skipped rows appear; empty for one file).
  std::map<std::string, int64_t> by_file;
  int64_t total() const {
    int64_t n = 0;
    for (const auto& [reason, k] : by_reason) n += k;
    return n;
  }
  void Add(const SkippedRows& o) {
    for (const auto& [reason, k] : o.by_reason) by_reason[reason] += k;
    for (const auto& [file, k] : o.by_file) by_file[file] += k;
  }
};

struct Dataset {
  int64_t count = 0;                     // records
  int64_t dense_dim = 0;                 // dense features per record (IDX: rows*cols pixels)
  std::vector<float> dense;              // [count x dense_dim], row-major, already transformed
  std::vector<std::string> dense_names;  // dense_dim names (e.g. I1..I13), may be empty (IDX)

  // Labels. Classification (binary 0/1 or K classes): labels[r] in
  // [0, num_classes). Regression: targets[r], labels empty.
  std::vector<int32_t> labels;
  std::vector<float> targets;
  int32_t num_classes = 0;               // 0 for regression
  // Class names when labels are strings (fastText "__label__X" -> "X");
  // labels[r] indexes this. Empty for numeric labels.
  std::vector<std::string> class_names;
  // Multi-label records (fastText text with several __label__ tokens):
  // record r's labels are label_sets[label_offsets[r] .. label_offsets[r+1]),
  // and labels[r] is the first of them. Both empty = one label per record.
  std::vector<int64_t> label_offsets;
  std::vector<int32_t> label_sets;

  std::vector<SparseField> fields;

  SkippedRows skipped;                   // rows left out by the reader
  int64_t tokens = 0;                    // text: tokens read (for tokens/s)

  // The field named `name`, or -1.
  int FieldIndex(const std::string& name) const {
    for (size_t i = 0; i < fields.size(); ++i) {
      if (fields[i].name == name) return static_cast<int>(i);
    }
    return -1;
  }
  bool multi_label() const { return !label_offsets.empty(); }
};

}  // namespace shardwild
