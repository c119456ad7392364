// Readers for the text formats of the field: Criteo TSV, libsvm/svmlight,
// fastText-style text and CSV, into a Dataset (core/dataset.h).
//
// A file is parsed in parallel: it is split into chunks at line boundaries,
// each chunk is parsed by its own thread into flat arrays, and the chunks are
// joined in file order, so the result does not depend on the thread count.
// With `cache` the parsed data set is also written to a binary cache file,
// which later reads use while the source file and every parse option are
// unchanged (the second epoch of a job never re-parses anyway: the data set
// stays in memory).
//
// Layouts (what the model reads):
//   criteo  `label \t I1..I13 \t C1..C26`: dense I1..I13 (transformed; empty
//           = 0 before the transform); fields C1..C26, one id each, the 32-bit
//           hex value (empty = no id).
//   libsvm  `label idx[:val] ...` (1-based, strictly increasing indices; `#`
//           starts a comment): field "features", ids idx - 1, weights val (1
//           when absent).
//   text    `__label__A [__label__B ...] tok tok ...`: field "tokens" with the
//           64-bit FNV-1a hash of each token; with word_ngrams 2 also
//           FNV-1a(t_i + '\x01' + t_{i+1}) for each adjacent pair, in "tokens"
//           or in a field "ngrams" (text.ngrams_field). Class names from the
//           training file, sorted; several labels make a multi-label record.
//   csv     a header line, then rows; csv.dense columns (transformed, empty =
//           0) and one field per csv.categorical column (FNV-1a of the value;
//           empty = no id). Double quotes with "" escapes; no newlines inside
//           a field.
// Every format accepts CRLF line ends and a missing final newline, and
// skips empty lines.
//
// Bad rows (wrong field count, non-numeric value, bad hex, index 0,
// unsorted indices, no label, unknown label, bad quoting, bad label) follow
// on_error: kFail returns InvalidArgument "<file>:<line>:<column>: <what was
// expected>, got '<text>'" for the first bad row in file order; kSkip leaves
// the row out and counts it in Dataset::skipped under that reason.
//
// Thread safety: every function is thread-safe; none keeps state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dataset.h"
#include "core/options.h"

namespace shardwild {

struct ReadOptions {
  DataFormat format = DataFormat::kCriteo;  // not kIdx (core/idx_reader.h reads those)
  LabelKind labels = LabelKind::kBinary;
  OnBadRow on_error = OnBadRow::kFail;
  DenseTransform dense_transform = DenseTransform::kLog1p;
  TextOptions text;
  CsvOptions csv;
  int64_t max_records = 0;  // keep only the first N good records; 0 = all
  int threads = 0;          // parser threads; 0 = one per hardware thread
  bool cache = false;
  std::string cache_dir;    // empty = the source file's directory
  // Text: the training set's class names. Given, a label maps through them
  // (one not among them is a bad row, "unknown label"); nullptr = the reader
  // collects the names (sorted) into Dataset::class_names. Not owned.
  const std::vector<std::string>* class_names = nullptr;
};

// The read options of data.* for labels of `labels` kind.
ReadOptions MakeReadOptions(const DataOptions& data, LabelKind labels);

// What a read did besides returning the data.
struct ReadStats {
  bool from_cache = false;      // the data came from a valid cache file
  bool cache_written = false;   // a cache file was (re)written
  std::string cache_path;       // the cache file used or written ("" without cache)
  int chunks = 0;               // chunks parsed in parallel (0 from cache)
};

// Reads the file at `path`. NotFound when it does not exist, InvalidArgument
// for a bad row (kFail) or bad options, and the I/O error otherwise. A cache
// that can't be written is a warning on stderr, not an error.
absl::StatusOr<Dataset> ReadDataset(const std::string& path, const ReadOptions& options, ReadStats* stats = nullptr);

// Parses `bytes`, the whole content of a file, on the calling thread;
// messages name `file_name` and lines from 1. (ReadDataset's parser; the
// fuzzers call it directly.)
absl::StatusOr<Dataset> ParseBuffer(std::string_view bytes, std::string_view file_name, const ReadOptions& options);

// 64-bit FNV-1a, the hash of text tokens and CSV categorical values.
uint64_t Fnv1a64(std::string_view bytes);

}  // namespace shardwild
