#include "core/io/atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardwild {

absl::StatusOr<std::unique_ptr<AtomicFile>> AtomicFile::Open(const std::string& path, bool sync) {
  static std::atomic<uint64_t> sequence{0};
  const std::string tmp =
      absl::StrCat(path, ".tmp.", ::getpid(), ".", sequence.fetch_add(1, std::memory_order_relaxed));
  absl::StatusOr<std::unique_ptr<WritableFile>> f = WritableFile::Open(tmp);
  if (!f.ok()) return absl::Status(f.status().code(), absl::StrCat(path, ": cannot be written: ", f.status().message()));
  return std::unique_ptr<AtomicFile>(new AtomicFile(path, *std::move(f), sync));
}

AtomicFile::~AtomicFile() {
  if (done_) return;
  const std::string tmp = file_->path();
  file_.reset();  // closes it
  std::remove(tmp.c_str());
}

absl::Status AtomicFile::Commit() {
  if (done_) return absl::FailedPreconditionError(absl::StrCat(path_, ": already committed"));
  done_ = true;
  const std::string tmp = file_->path();
  absl::Status s = sync_ ? file_->Sync() : absl::OkStatus();
  if (absl::Status closed = file_->Close(); s.ok()) s = closed;
  if (s.ok() && std::rename(tmp.c_str(), path_.c_str()) != 0) {
    s = absl::ErrnoToStatus(errno, absl::StrCat(path_, ": rename from ", tmp));
  }
  if (!s.ok()) std::remove(tmp.c_str());
  return s;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents, bool sync) {
  absl::StatusOr<std::unique_ptr<AtomicFile>> f = AtomicFile::Open(path, sync);
  if (!f.ok()) return f.status();
  if (absl::Status s = (*f)->Append(contents); !s.ok()) return s;
  return (*f)->Commit();
}

}  // namespace shardwild
