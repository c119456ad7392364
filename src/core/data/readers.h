// Readers for the text formats of the field: Criteo TSV, libsvm/svmlight,
// fastText-style text and CSV, into a Dataset (core/data/dataset.h).
//
// A file is mapped and parsed in parallel: it is split into chunks (of at
// least 64 KiB) at line boundaries, each chunk is parsed by its own thread
// into flat arrays, and the chunks are joined in file order, so the result
// does not depend on the thread count. With `cache` the parsed data set is
// also written to a binary cache file, "<cache_dir or the file's
// directory>/<file name>.swcache" (written to a temporary name, fsynced,
// renamed), which later reads use while the source file (size, mtime) and
// every option that affects the result are unchanged; a damaged cache (its
// CRC32C or shapes) is ignored and rewritten. (The second epoch of a job never
// re-parses anyway: the data set stays in memory.)
//
// Layouts (what the model reads):
//   criteo  `label \t I1..I13 \t C1..C26`: dense I1..I13 (integers,
//           transformed; empty = 0 before the transform); fields C1..C26,
//           one id each, the hex value (1..8 digits, either case; empty = no
//           id). No weights.
//   libsvm  `label idx[:val] ...` (1-based, strictly increasing indices; `#`
//           starts a comment): field "features", ids idx - 1, weights val (1
//           when absent).
//   text    `__label__A [__label__B ...] tok tok ...` (labels multiclass
//           only): field "tokens" with Fnv1a64(token) of each token, in
//           order; with word_ngrams 2 also, for each adjacent pair,
//           Fnv1a64(t_i + '\x01' + t_{i+1}) (the bytes of t_i, one 0x01 byte,
//           the bytes of t_{i+1}): in "tokens" right after t_{i+1}'s id, or
//           in a field "ngrams" (text.ngrams_field). Class names: the given
//           dictionary, or the file's names sorted. A record with several
//           (distinct) labels makes the data set multi-label; repeats of a
//           label in a record count once. Dataset::tokens counts the words
//           of the records kept.
//   csv     a header line, then rows; csv.dense columns (transformed, empty =
//           0) and one field per csv.categorical column (FNV-1a of the value;
//           empty = no id). Double quotes with "" escapes; no newlines inside
//           a field.
// Labels (libsvm, csv, criteo) by LabelKind: binary 0/1 or -1/+1 (and "+1"),
// multiclass integers 0..2^24 (num_classes = the largest + 1), regression
// any real within float range (targets). Numbers are strict: no spaces, no
// "+-1", no inf/nan/hex floats, and a value must fit a float.
// Every format accepts CRLF line ends and a missing final newline, and
// skips empty lines (which are not bad rows but count as file lines).
//
// Bad rows (wrong field count, non-numeric value, bad hex, index 0,
// unsorted indices, no label, unknown label, bad quoting, bad label) follow
// on_error: kFail returns InvalidArgument "<file>:<line>:<column>: <what was
// expected>, got '<text>'" for the first bad row in file order; kSkip leaves
// the row out and counts it in Dataset::skipped under that reason.
//
// A file compressed with gzip or zstd (told by its first bytes, whatever its
// name) is decompressed first (core/io/compressed.h: in parallel where its
// members or frames can be found up front), then parsed the same way; its
// messages name the compressed file and the line in its decompressed text.
//
// Thread safety: every function is thread-safe; none keeps state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/dataset.h"
#include "core/config/options.h"

namespace shardwild {

// data.dense_transform applied to one raw dense value, as the Criteo and CSV
// readers apply it (log1p and log3 clamp below 0 and -2).
float ApplyDenseTransform(double x, DenseTransform t);

struct ReadOptions {
  DataFormat format = DataFormat::kCriteo;  // not kIdx (core/data/idx_reader.h reads those)
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
  std::string compression;      // "gzip" / "zstd" for a compressed file, else "none"
  int files = 0;                // files read (ReadDatasetFiles)
};

// The files a data.train / data.test value names: entries separated by
// commas (a YAML list is joined so), each a path, or a glob pattern (with
// `*`, `?` or `[`) standing for the files it matches in sorted order.
// InvalidArgument naming `key` for an empty entry or a pattern that matches
// no file; a plain path is returned as given (reading it says whether it
// exists).
absl::StatusOr<std::vector<std::string>> ExpandDataFiles(const std::string& spec, std::string_view key);

// Reads the file at `path`: from its cache when `cache` is set and a valid
// one exists, else parsed in parallel (options.threads plain std::threads,
// started and joined inside the call; the calling thread parses the first
// chunk). The result does not depend on the thread count. Returns NotFound
// when the file does not exist, InvalidArgument for a bad row under kFail
// (the first in file order) or bad options, ResourceExhausted when memory
// runs out, and the I/O error otherwise. A cache that can't be written is a
// warning on stderr, not an error. `stats` (may be null) gets what the read
// did. Blocks until done.
absl::StatusOr<Dataset> ReadDataset(const std::string& path, const ReadOptions& options, ReadStats* stats = nullptr);

// Reads every file of `files` (ExpandDataFiles) as ReadDataset does, each
// with its own cache, and joins them in order into one data set: record
// counts add up, max_records counts over all of them, skipped rows add up
// (and are also counted per file in skipped.by_file), and text class names
// collected from the files merge into one sorted list with the labels
// mapped onto it. The files must agree in shape (dense features, sparse
// fields; InvalidArgument naming the file that differs). `stats` gets the
// last file's read with `files` set, and from_cache only when every file
// came from its cache.
absl::StatusOr<Dataset> ReadDatasetFiles(const std::vector<std::string>& files, const ReadOptions& options,
                                         ReadStats* stats = nullptr);

// Parses `bytes` on the calling thread (ReadDataset's parser, and the
// fuzzers'). `bytes` is whole lines of a file, starting at its line
// `first_line_number` (1-based; 1 for a whole file); a CSV buffer starts with
// the header. Messages name `file_name` and file lines. options.threads,
// cache and cache_dir are ignored.
absl::StatusOr<Dataset> ParseBuffer(std::string_view bytes, std::string_view file_name, int64_t first_line_number,
                                    const ReadOptions& options);

// The read options that change what the rows parse to (format, labels,
// on_error, dense transform, text and csv options) as a string: the key of
// the caches (with max_records and the class names for the binary cache).
std::string ParseOptionsKey(const ReadOptions& options);

// 64-bit FNV-1a, the hash of text tokens and CSV categorical values: h =
// 0xcbf29ce484222325, then for each byte b: h = (h ^ b) * 0x100000001b3
// (mod 2^64).
uint64_t Fnv1a64(std::string_view bytes);

}  // namespace shardwild
