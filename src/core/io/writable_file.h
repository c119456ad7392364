// A file opened for writing through a user-space buffer, after leveldb's
// WritableFile: Append, Flush, Sync, Close. The safetensors, TensorBoard event
// and metrics-log writers are built on it.
//
// Append copies bytes into a fixed-size buffer, which goes to write(2) when it
// fills and on Flush/Sync/Close; short writes and EINTR are retried. With
// `checksum` on, a running CRC32C is computed over the buffered copy, i.e. over
// exactly the bytes handed to the kernel, even if the caller's memory changes
// while Append runs (Hogwild parameters being checkpointed).
//
// Errors are absl::Status values whose message names the path, the call that
// failed and errno's text ("/ckpt/x.safetensors: write: No space left on
// device"); the code follows errno (absl::ErrnoToStatusCode). After the first
// failure of Append, Flush, Sync or Close, every later call returns that same
// error: the file's content is then unknown.
//
// Thread safety: not thread-safe; callers serialise access to one object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shardwild {

struct WritableFileOptions {
  enum class Mode {
    kTruncate,         // create or truncate (O_CREAT | O_TRUNC)
    kAppend,           // create or append (O_CREAT | O_APPEND)
    kCreateExclusive,  // create; fail with AlreadyExists if it exists (O_EXCL)
  };
  Mode mode = Mode::kTruncate;
  // Keep a CRC32C of every byte appended through this object (crc32c()).
  bool checksum = false;
  // Size of the user-space buffer; >= 1.
  size_t buffer_bytes = size_t{1} << 20;
};

class WritableFile {
 public:
  // Opens `path` (mode 0666 less the umask). The parent directory must exist.
  // On failure the status names `path` and errno's reason.
  static absl::StatusOr<std::unique_ptr<WritableFile>> Open(const std::string& path,
                                                            const WritableFileOptions& options = {});

  // Closes the file if Close() was not called; an error at that point is lost,
  // so call Close() where it matters.
  ~WritableFile();

  WritableFile(const WritableFile&) = delete;
  WritableFile& operator=(const WritableFile&) = delete;

  // Appends `data`; may write(2) part of the buffer. `data` is not kept.
  absl::Status Append(absl::Span<const uint8_t> data);
  absl::Status Append(absl::string_view data) {
    return Append(absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  }

  // Hands every buffered byte to the kernel (write(2)); after it returns OK, a
  // crash of this process loses nothing appended so far.
  absl::Status Flush();

  // Flush, then fsync(2): the data survive a crash of the machine.
  absl::Status Sync();

  // Flush, then close(2). Later calls return FailedPrecondition. Calling
  // Close() again returns the first Close's result.
  absl::Status Close();

  const std::string& path() const { return path_; }
  // Bytes passed to Append through this object (written or still buffered).
  uint64_t bytes_appended() const { return bytes_appended_; }
  // CRC32C of those bytes; 0 unless options.checksum.
  uint32_t crc32c() const { return crc_; }

 private:
  WritableFile(std::string path, int fd, const WritableFileOptions& options);
  absl::Status WriteBuffer();
  absl::Status Fail(const char* call, int error);

  // Constant after construction.
  const std::string path_;
  const bool checksum_;
  // Mutable state, guarded by the caller (see "Thread safety").
  int fd_;
  std::vector<uint8_t> buffer_;
  size_t buffered_ = 0;
  uint64_t bytes_appended_ = 0;
  uint32_t crc_ = 0;
  absl::Status error_;  // first failure; OK until then
  bool closed_ = false;
};

}  // namespace shardwild
