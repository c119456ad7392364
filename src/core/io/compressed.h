// Compressed data files: gzip (RFC 1952) through zlib and zstd through
// libzstd, told apart by their magic bytes, never by the file name.
//
// Reading. A gzip file is one or more members, a zstd file one or more
// frames (skippable frames are skipped); either way the output is the
// concatenation of every member or frame, as `zcat` / `zstdcat` print it.
// Where the pieces can be found without decompressing them, they are
// decompressed in parallel straight into their place in the output:
//   - zstd frames, by their headers (every zstd file with several frames,
//     `zstd` and `pzstd` output alike);
//   - gzip members that carry Shardwild's "SW" extra subfield (the member's
//     size, written by CompressedFileWriter; other tools ignore the field,
//     so `zcat` reads these files). Another gzip file is inflated member by
//     member on one thread.
// Every member's CRC-32 and length (gzip) or checksum and content size
// (zstd, when the frame carries them) are checked. Damage is one
// InvalidArgument naming the file, the format, the byte offset of the
// member or frame, and what was wrong ("x.tsv.gz: gzip: the member at byte
// 1048603 is truncated"); data after the last member that is not another
// member is an error too, not ignored.
//
// Writing. CompressedFileWriter cuts its input into blocks of block_bytes
// and compresses each into its own gzip member (with the "SW" subfield) or
// zstd frame (with its content size), several blocks in parallel, then
// writes them in order, so the bytes do not depend on the thread count and a
// reader can decompress the blocks in parallel again.
//
// Thread safety: the functions are thread-safe; a CompressedFileWriter is
// used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardwild {

class AtomicFile;

enum class Compression { kNone, kGzip, kZstd };

// "none", "gzip", "zstd".
const char* CompressionName(Compression c);
// By the first bytes of a file (at least 4 are looked at; fewer = kNone).
Compression DetectCompression(std::string_view first_bytes);
// "gz" / "gzip" -> kGzip, "zst" / "zstd" -> kZstd, "none" / "" -> kNone;
// InvalidArgument otherwise.
absl::StatusOr<Compression> ParseCompression(std::string_view name);
// The file name suffix of a compression: ".gz", ".zst" or "".
const char* CompressionSuffix(Compression c);

struct DecompressOptions {
  // Threads for independent members or frames; 0 = one per hardware thread.
  int threads = 0;
  // The most bytes the output may hold; more = ResourceExhausted (a guard
  // against a small file that expands without bound).
  uint64_t max_output_bytes = uint64_t{1} << 40;
  // Read member by member on one thread even where the pieces could be
  // found up front (tests and the fuzzer compare the two ways).
  bool sequential = false;
};

// What Decompress did besides returning the bytes.
struct DecompressStats {
  int64_t pieces = 0;       // members or frames
  bool parallel = false;    // the pieces were found up front and decompressed in parallel
};

// The decompressed content of `data`, a whole file in format `c` (kNone
// returns a copy). `name` names the file in messages.
absl::StatusOr<std::string> Decompress(std::string_view data, Compression c, std::string_view name,
                                       const DecompressOptions& options = {}, DecompressStats* stats = nullptr);

// A gzip member whose size is known without decompressing it.
struct SizedGzipMember {
  int64_t offset = 0;      // in the file
  int64_t bytes = 0;       // of the member
  int64_t text_bytes = 0;  // decompressed (its ISIZE)
};
// Every member of the gzip file at `path` when each carries the "SW" size
// subfield (what CompressedFileWriter writes), found from their headers and
// trailers alone (a few pread calls per member); nullopt when one does not,
// or the chain does not end exactly at the end of the file.
absl::StatusOr<std::optional<std::vector<SizedGzipMember>>> ListSizedGzipMembers(const std::string& path);

// Reads bytes [begin, end) of a file (a run of whole gzip members or zstd
// frames, or any range of a plain file) decompressed, piece by piece, in
// bounded memory: the input goes through a 1 MiB buffer (pread), the output
// to the caller. Errors as Decompress's, with offsets in the file.
class DecompressingReader {
 public:
  // end < 0: to the end of the file.
  static absl::StatusOr<std::unique_ptr<DecompressingReader>> Open(const std::string& path, Compression c,
                                                                   int64_t begin = 0, int64_t end = -1);
  ~DecompressingReader();
  DecompressingReader(const DecompressingReader&) = delete;
  DecompressingReader& operator=(const DecompressingReader&) = delete;
  // Appends up to `max` (> 0) decompressed bytes to *out; returns how many,
  // 0 only at the end of the range.
  absl::StatusOr<size_t> Read(std::string* out, size_t max);

 private:
  DecompressingReader() = default;
  absl::Status Fill();  // more input into in_, if any is left

  std::string path_;
  Compression c_ = Compression::kNone;
  int fd_ = -1;
  int64_t pos_ = 0, end_ = 0;    // next input byte to read, end of the range
  std::string in_;               // input read, not yet consumed: in_[in_at_..)
  size_t in_at_ = 0;
  int64_t in_offset_ = 0;        // file offset of in_[0]
  int64_t member_at_ = 0;        // file offset of the member or frame being read
  bool member_open_ = false;     // inside a member / frame
  void* z_ = nullptr;            // z_stream (gzip)
  void* zstd_ = nullptr;         // ZSTD_DCtx
};

struct CompressedWriterOptions {
  Compression compression = Compression::kGzip;
  // zlib 1..9 (6 as gzip's default) or zstd 1..19 (3 as zstd's); 0 = that default.
  int level = 0;
  // Input bytes per member or frame; >= 4096.
  size_t block_bytes = size_t{4} << 20;
  // Blocks compressed at once; 0 = one per hardware thread.
  int threads = 0;
  // fsync before the rename (AtomicFile).
  bool sync = true;
};

// Writes `path` atomically (AtomicFile: a temporary file renamed at Commit)
// as a gzip or zstd file of independent blocks. kNone writes the bytes as
// they come.
class CompressedFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<CompressedFileWriter>> Open(const std::string& path,
                                                                    const CompressedWriterOptions& options);
  ~CompressedFileWriter();
  CompressedFileWriter(const CompressedFileWriter&) = delete;
  CompressedFileWriter& operator=(const CompressedFileWriter&) = delete;

  absl::Status Append(std::string_view bytes);
  // Compresses and writes what is left, then commits the file. Dropped
  // without Commit, the file is not written.
  absl::Status Commit();
  // Input bytes appended so far, and output bytes written (after Commit: the file's size).
  uint64_t bytes_in() const { return bytes_in_; }
  uint64_t bytes_out() const { return bytes_out_; }

 private:
  CompressedFileWriter() = default;
  // Compresses the full blocks in blocks_ (the last one too when `all`) and writes them in order.
  absl::Status Flush(bool all);

  CompressedWriterOptions options_;
  std::unique_ptr<AtomicFile> file_;
  std::vector<std::string> blocks_;  // input blocks waiting, the last one filling
  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
};

// One block compressed as CompressedFileWriter writes it (a gzip member
// with the "SW" subfield, or a zstd frame). For tests and the fuzzers' seeds.
absl::StatusOr<std::string> CompressBlock(std::string_view bytes, Compression c, int level = 0);

}  // namespace shardwild
