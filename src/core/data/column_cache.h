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
// remove. A build writes "<F's name>.swcols.tmp.<pid>" and
// renames it into place, so a reader never sees half a cache; when another
// process got there first, its cache is used.
//
// Bad rows: as ReadDataset (file:line:column under fail, the first bad row
// in file order; counts by reason and by file under skip).
//
// Formats: criteo, libsvm and csv (text labels need every file read before
// the class list is known; text is InvalidArgument here).
//
// Thread safety: Open builds with its own threads; a ColumnCache is
// immutable once open and Read may be called from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
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
  ~ColumnCache();
  ColumnCache(const ColumnCache&) = delete;
  ColumnCache& operator=(const ColumnCache&) = delete;

  // Records over all files (after max_records).
  int64_t records() const { return records_; }
  // The data set's shape with no records: dense_dim and names, num_classes
  // (the largest over the files), the sparse fields' names (no ids) with
  // weights or not; skipped rows of every file.
  const Dataset& shape() const { return shape_; }
  // Bytes one record takes in memory on average (columns over records).
  double bytes_per_record() const { return bytes_per_record_; }
  // The cache directories, one per file.
  const std::vector<std::string>& dirs() const { return dirs_; }

  // Records [first, first + count) into *out (replaced; its vectors keep
  // their capacity): a Dataset of `count` records with shape()'s layout.
  // InvalidArgument outside [0, records()); the I/O error naming the file
  // otherwise.
  absl::Status Read(int64_t first, int64_t count, Dataset* out) const;

 private:
  struct Column;  // one open column file
  struct Part;
  ColumnCache();

  std::vector<std::unique_ptr<Part>> parts_;  // over all files, in record order
  std::vector<int64_t> part_first_;           // first global record of each part, then records_
  int64_t records_ = 0;
  Dataset shape_;
  double bytes_per_record_ = 0;
  std::vector<std::string> dirs_;
};

// The shape ColumnCache::Open will give `files` (dense features and names,
// sparse fields, num_classes; no records), from the first lines of the
// first file alone (up to 64 KiB of its text), so that work that needs
// only the shape (creating the store) can run while the cache is built.
// nullopt for multiclass labels, whose class count needs every record.
absl::StatusOr<std::optional<Dataset>> PeekShape(const std::vector<std::string>& files, const ReadOptions& read);

// Records rows[0..n) of `from` (indices into it) into *out, in that order
// (replaced; its vectors keep their capacity): the batches streamed
// training assembles from a shuffled window.
void GatherRecords(const Dataset& from, const int32_t* rows, int64_t n, Dataset* out);

// Bytes a data set's vectors hold (their capacity), for memory accounting.
int64_t DatasetBytes(const Dataset& d);

}  // namespace shardwild
