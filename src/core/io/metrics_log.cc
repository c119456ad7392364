#include "core/io/metrics_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status.h"

namespace shardwild {
namespace {

constexpr size_t kBufferBytes = size_t{64} << 10;

double UnixSecondsNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Whether `path` exists, is non-empty, and its last byte is not '\n': the
// last line was cut off, e.g. by a crash during a write. Any error reading
// reports false; opening for writing then reports it properly.
bool EndsWithTornLine(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool torn = false;
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    char last = '\n';
    torn = ::pread(fd, &last, 1, st.st_size - 1) == 1 && last != '\n';
  }
  ::close(fd);
  return torn;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsLog>> MetricsLog::Open(const std::string& path, bool append,
                                                             const MetricsLogOptions& options) {
  WritableFileOptions file_options;
  file_options.mode = append ? WritableFileOptions::Mode::kAppend : WritableFileOptions::Mode::kTruncate;
  file_options.buffer_bytes = kBufferBytes;
  const bool torn = append && EndsWithTornLine(path);
  SW_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, WritableFile::Open(path, file_options));
  if (torn) {
    SW_RETURN_IF_ERROR(file->Append("\n"));
    SW_RETURN_IF_ERROR(file->Flush());
  }
  return std::unique_ptr<MetricsLog>(new MetricsLog(path, std::move(file), options));
}

MetricsLog::MetricsLog(std::string path, std::unique_ptr<WritableFile> file, const MetricsLogOptions& options)
    : path_(std::move(path)), options_(options), file_(std::move(file)) {}

MetricsLog::~MetricsLog() { Close().IgnoreError(); }

absl::Status MetricsLog::Write(nlohmann::json record) {
  if (!record.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": a metrics record must be a JSON object, got a ", record.type_name()));
  }
  if (!record.contains("time")) record["time"] = UnixSecondsNow();
  std::string line;
  try {
    line = record.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
  } catch (const nlohmann::json::exception& e) {  // not expected with error_handler_t::replace
    return absl::InvalidArgumentError(absl::StrCat(path_, ": cannot serialise a metrics record: ", e.what()));
  }
  line.push_back('\n');
  MutexLock lock(&mu_);
  if (file_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(path_, ": the metrics log is closed"));
  SW_RETURN_IF_ERROR(file_->Append(line));
  return options_.fsync_each_line ? file_->Sync() : file_->Flush();
}

absl::Status MetricsLog::Close() {
  MutexLock lock(&mu_);
  if (file_ == nullptr) return close_status_;
  close_status_ = file_->Close();
  file_.reset();
  return close_status_;
}

}  // namespace shardwild
