#include "core/io/writable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/io/crc32c.h"
#include "core/base/status.h"

namespace shardwild {

absl::StatusOr<std::unique_ptr<WritableFile>> WritableFile::Open(const std::string& path,
                                                                 const WritableFileOptions& options) {
  if (options.buffer_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": WritableFileOptions.buffer_bytes must be >= 1"));
  }
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
  switch (options.mode) {
    case WritableFileOptions::Mode::kTruncate: flags |= O_TRUNC; break;
    case WritableFileOptions::Mode::kAppend: flags |= O_APPEND; break;
    case WritableFileOptions::Mode::kCreateExclusive: flags |= O_EXCL; break;
  }
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0666);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int error = errno;
    return absl::ErrnoToStatus(error, absl::StrCat(path, ": cannot open for writing"));
  }
  return std::unique_ptr<WritableFile>(new WritableFile(path, fd, options));
}

WritableFile::WritableFile(std::string path, int fd, const WritableFileOptions& options)
    : path_(std::move(path)), checksum_(options.checksum), fd_(fd), buffer_(options.buffer_bytes) {}

WritableFile::~WritableFile() {
  if (!closed_) Close().IgnoreError();
}

absl::Status WritableFile::Fail(const char* call, int error) {
  error_ = absl::ErrnoToStatus(error, absl::StrCat(path_, ": ", call));
  return error_;
}

absl::Status WritableFile::Append(absl::Span<const uint8_t> data) {
  if (closed_) return absl::FailedPreconditionError(absl::StrCat(path_, ": Append after Close"));
  SW_RETURN_IF_ERROR(error_);
  while (!data.empty()) {
    const size_t n = std::min(data.size(), buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, data.data(), n);
    // Checksum the copy: it is what reaches the file.
    if (checksum_) crc_ = Crc32cExtend(crc_, buffer_.data() + buffered_, n);
    buffered_ += n;
    bytes_appended_ += n;
    data.remove_prefix(n);
    if (buffered_ == buffer_.size()) SW_RETURN_IF_ERROR(WriteBuffer());
  }
  return absl::OkStatus();
}

absl::Status WritableFile::WriteBuffer() {
  const uint8_t* p = buffer_.data();
  size_t left = buffered_;
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Fail("write", errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  buffered_ = 0;
  return absl::OkStatus();
}

absl::Status WritableFile::Flush() {
  if (closed_) return absl::FailedPreconditionError(absl::StrCat(path_, ": Flush after Close"));
  SW_RETURN_IF_ERROR(error_);
  return WriteBuffer();
}

absl::Status WritableFile::Sync() {
  SW_RETURN_IF_ERROR(Flush());
  int rc;
  do {
    rc = ::fsync(fd_);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return Fail("fsync", errno);
  return absl::OkStatus();
}

absl::Status WritableFile::Close() {
  if (closed_) return error_;
  closed_ = true;
  if (error_.ok()) WriteBuffer().IgnoreError();  // sets error_ on failure
  // close(2) is not retried on EINTR: on Linux the descriptor is gone anyway.
  if (::close(fd_) != 0 && error_.ok()) Fail("close", errno).IgnoreError();
  fd_ = -1;
  return error_;
}

}  // namespace shardwild
