// The columnar cache that streamed training reads (data.stream): every
// training file parsed once into columns on disk, then read back by record
// range with pread(2), so the page cache, not the process, holds the data,
// and a cache larger than memory works (the kernel drops pages and reads
// them again).
//
// Layout. For a source file F the cache is the directory
// "<cache_dir or F's directory>/<F's name>.swcols/": index.json (the source's
// size and mtime, the parse options' hash, the format version, and each
// part's record and line counts, shape and skipped rows) and one directory
// per part, "part-00000", ..., holding one file per column: dense.f32
// ([records x dense_dim]), labels.i32 or targets.f32, and for sparse field i
// f<i>.off (int64, records + 1 offsets, the first 0), f<i>.ids (uint64) and,
// for weighted fields, f<i>.w (float). Values are in the machine's byte
// order (the cache is local to a machine).
//
// Parts. A file is cut into parts that are built in parallel, each read and
// parsed in pieces of about piece_bytes of text, so a build holds a few
// pieces per thread whatever the file's size:
//   - a plain text file (not CSV): byte ranges of about part_bytes; a part
//     owns the lines that start inside its range;
//   - a gzip file whose members carry their size (core/io/compressed.h,
//     `data gen --compress gz`): runs of whole members of about part_bytes
//     of text;
//   - any other compressed file, and every CSV file: one part, decompressed
//     as a stream.
// Records are numbered across the files in order, then across each file's
// parts in order: exactly the order ReadDatasetFiles gives them.
//
// Validity. A cache whose index does not match the source (size, mtime),
// the options or the format is rebuilt. A damaged one (a column file of
// another size than its index says) is DataLoss naming the directory to
// remove. A build writes "<F's name>.swcols.tmp.<pid>.<n>" and
// renames it into place, so a reader never sees half a cache; when another
// process got there first (the machine's other tasks of a cluster build the
// same files' caches at once), its valid cache is kept, never removed under
// its readers; a stale one is moved aside and replaced. Builds put their
// directories in place one at a time, under an flock on "<F's name>.swcols.lock"
// (a small file that stays next to the cache).
//
// Bad rows: as ReadDataset (file:line:column under fail, the first bad row
// in file order; counts by reason and by file under skip).
//
// Formats: criteo, libsvm and csv (text labels need every file read before
// the class list is known; text is InvalidArgument here).
//
// Reading while building. Begin returns before the build and makes each part
// readable as soon as it and every part before it are built, so Read sees a
// growing prefix of the records (records()); streamed training starts
// on the first part while the rest is parsed (workers/task_trainer.cc).
//
// Thread safety: the build runs on its own threads; Read and the ready
// accessors may be called from any number of threads at any time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/data/dataset.h"
#include "core/data/readers.h"

namespace shardwild {

struct ColumnCacheOptions {
  // Text bytes per part of a splittable file (parts are built in parallel).
  int64_t part_bytes = int64_t{64} << 20;
  // Text bytes parsed at a time while building a part.
  int64_t piece_bytes = int64_t{4} << 20;
  // Called on a builder thread before each part is built, with the part's
  // place over all files' parts (tests hold a build there to read what is
  // ready). Not called for parts skipped because the build was cancelled.
  std::function<void(size_t part)> before_part;
};

// What Open did.
struct ColumnCacheStats {
  int files_built = 0;      // files whose cache was (re)built
  int files_cached = 0;     // files whose cache was valid
  int parts = 0;            // parts over all files
  int64_t bytes = 0;        // bytes of every column file
  int64_t text_bytes = 0;   // text parsed by the builds (decompressed)
  int64_t source_bytes = 0; // bytes of the files built (as stored, compressed or not)
  int build_threads = 0;    // parts built at once
  double build_s = 0;       // seconds spent building
};

// What the first lines of the data say (PeekShape), so that a build can be
// read while it runs (ColumnCache::Begin).
struct ColumnCacheExpectation {
  Dataset shape;                // no records
  double bytes_per_record = 0;  // in memory, from the lines parsed
};

class ColumnCache {
 public:
  // The cache of `files` (ExpandDataFiles) read with `read` (format, labels,
  // on_error, transforms, csv; read.threads builds that many parts at once,
  // 0 = one per hardware thread; read.cache_dir; read.max_records keeps the
  // first N records). Builds what is missing or stale. Errors: as
  // ReadDataset's, plus InvalidArgument for the text format.
  static absl::StatusOr<std::unique_ptr<ColumnCache>> Open(const std::vector<std::string>& files,
                                                           const ReadOptions& read,
                                                           const ColumnCacheOptions& options = {},
                                                           ColumnCacheStats* stats = nullptr);
  // As Open, but returns as soon as the parts are planned and builds on a
  // thread of its own: records become readable in order, a prefix at a
  // time, as the parts before them are built (ready_records()), so training
  // can start on the first part while the others are parsed. The layout
  // Read gives is `expected`'s (PeekShape); a part of another shape stops
  // the build with an error. Wait for the end (Wait) before records(),
  // shape() and bytes_per_record() are final. Errors known before the build
  // starts (no such file, bad options) are returned here; the build's own
  // (bad rows, I/O) by build_error() and Wait().
  static absl::StatusOr<std::unique_ptr<ColumnCache>> Begin(const std::vector<std::string>& files,
                                                            const ReadOptions& read, const ColumnCacheOptions& options,
                                                            const ColumnCacheExpectation& expected);
  // Cancels a build still running (its partial directories are removed)
  // and waits for it.
  ~ColumnCache();
  ColumnCache(const ColumnCache&) = delete;
  ColumnCache& operator=(const ColumnCache&) = delete;

  // Waits for the build (if any) to end. OK, or its error. Then records()
  // is every record, and shape() and bytes_per_record() are final; `stats`
  // says what was built.
  absl::Status Wait(ColumnCacheStats* stats = nullptr);
  // Records readable now (a prefix, after max_records); all of them once
  // all_ready(). Any thread.
  int64_t records() const { return ready_records_.load(std::memory_order_acquire); }
  // Whether records() is final: every part is built, or max_records is
  // reached. Any thread.
  bool all_ready() const { return all_ready_.load(std::memory_order_acquire); }
  // The error that stopped the build, once it is known (OK before and
  // without one). Any thread.
  absl::Status build_error() const;
  // The records there will be, estimated while the build runs from the
  // records of the parts built and their share of the files' bytes (exact
  // once all_ready()). Any thread.
  int64_t estimated_records() const;
  // The data set's shape with no records: dense_dim and names, num_classes
  // (the largest over the files), the sparse fields' names (no ids) with
  // weights or not; skipped rows of every file. Final after Wait.
  const Dataset& shape() const { return shape_; }
  // Bytes one record takes in memory on average (columns over records;
  // the expectation's while a Begin build runs).
  double bytes_per_record() const { return bytes_per_record_; }
  // The cache directories, one per file.
  const std::vector<std::string>& dirs() const { return dirs_; }

  // Records [first, first + count) into *out (replaced; its vectors keep
  // their capacity): a Dataset of `count` records with shape()'s layout.
  // InvalidArgument outside [0, records()); the I/O error naming the file
  // otherwise. Any thread, also while the build runs.
  absl::Status Read(int64_t first, int64_t count, Dataset* out) const;

 private:
  struct Column;  // one open column file
  struct Part;
  struct Build;   // the planned build and its progress
  ColumnCache();
  static absl::StatusOr<std::unique_ptr<ColumnCache>> Plan(const std::vector<std::string>& files,
                                                           const ReadOptions& read, const ColumnCacheOptions& options,
                                                           const ColumnCacheExpectation* expected);
  // Builds every part to build (on the builder thread, or the caller's).
  void RunBuild();

  std::unique_ptr<Build> build_;
  std::thread builder_;
  // One entry per planned part, over all files in record order (a part
  // without records has no columns); entries below ready_parts_ are set
  // and never change.
  std::vector<std::unique_ptr<Part>> parts_;
  std::vector<int64_t> part_first_;  // first global record of each part, then the total
  std::atomic<size_t> ready_parts_{0};
  std::atomic<int64_t> ready_records_{0};  // after max_records
  std::atomic<bool> all_ready_{false};
  // What Read lays records out as: set before the first part is readable.
  int dense_dim_ = 0;
  int num_classes_ = 0;
  bool regression_ = false;
  std::vector<std::string> field_names_;
  Dataset shape_;
  double bytes_per_record_ = 0;
  std::vector<std::string> dirs_;
};

// The shape ColumnCache::Open will give `files` (dense features and names,
// sparse fields, num_classes; no records), from the first lines of the
// first file alone (up to 64 KiB of its text), so that work that needs
// only the shape (creating the store) can run while the cache is built.
// nullopt for multiclass labels, whose class count needs every record.
// `bytes_per_record`, when given, gets the lines' records' bytes in memory
// on average (0 without records).
absl::StatusOr<std::optional<Dataset>> PeekShape(const std::vector<std::string>& files, const ReadOptions& read,
                                                 double* bytes_per_record = nullptr);

// Records rows[0..n) of `from` (indices into it) into *out, in that order
// (replaced; its vectors keep their capacity): the batches streamed
// training assembles from a shuffled window.
void GatherRecords(const Dataset& from, const int32_t* rows, int64_t n, Dataset* out);

// Bytes a data set's vectors hold (their capacity), for memory accounting.
int64_t DatasetBytes(const Dataset& d);

}  // namespace shardwild
