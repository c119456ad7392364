// A file that appears at its path complete or not at all: the bytes go to a
// temporary file beside it ("<path>.tmp.<pid>.<n>", unique per process and
// call, so two writers never share one), which Commit() closes (after
// fsync(2) when asked) and renames over `path`. Dropped without a Commit, or
// after a failed one, the temporary file is removed and `path` is as it was.
// A crash leaves at most a stray temporary file, never a half-written `path`.
//
// Used for every file whose readers must never see it half written: the
// prediction CSV, the data cache, generated data, sweep results.
//
// Thread safety: not thread-safe; one object per writer.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/io/writable_file.h"

namespace shardwild {

class AtomicFile {
 public:
  // Opens the temporary file for `path` (whose directory must exist).
  // `sync`: Commit fsyncs the file before the rename (the data survive a
  // crash of the machine, not only of the process).
  static absl::StatusOr<std::unique_ptr<AtomicFile>> Open(const std::string& path, bool sync = false);
  ~AtomicFile();  // removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Where to append the contents.
  WritableFile& file() { return *file_; }
  absl::Status Append(absl::string_view data) { return file_->Append(data); }

  // Flushes (and with `sync` fsyncs), closes and renames the file into
  // place. On error the temporary file is removed; the status names `path`
  // and what failed. Later calls return FailedPrecondition.
  absl::Status Commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return file_->path(); }

 private:
  AtomicFile(std::string path, std::unique_ptr<WritableFile> file, bool sync)
      : path_(std::move(path)), file_(std::move(file)), sync_(sync) {}

  const std::string path_;
  std::unique_ptr<WritableFile> file_;
  const bool sync_;
  bool done_ = false;  // committed, or the commit failed
};

// `contents` written to `path` through an AtomicFile.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents, bool sync = false);

}  // namespace shardwild
