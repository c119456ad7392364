// A JSON-lines metrics log: one JSON object per line, e.g.
//   {"loss":0.412,"samples_per_s":183000.5,"step":1200,"time":1718000000.25}
// Each line is read back with any JSON parser (`jq`, pandas.read_json(...,
// lines=True)).
//
// Every Write hands its whole line to the kernel with one write(2) (for lines
// under 64 KiB) before it returns, so a crash of the process loses at most the
// line being written. Lines from threads sharing a MetricsLog never
// interleave (other processes appending to the same file get no such promise
// beyond what O_APPEND gives on a local file system). With
// fsync_each_line the line also survives a machine crash (slower). When a log
// is opened for appending and its last line was cut off by a crash, a newline
// is written first, so the torn line stays alone and the new ones parse.
//
// Values are written as nlohmann::json dumps them: keys in sorted order,
// non-finite numbers (NaN, inf) as null, invalid UTF-8 in strings replaced by
// U+FFFD.
//
// Thread safety: MetricsLog is thread-safe.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/mutex.h"
#include "core/io/writable_file.h"

namespace shardwild {

struct MetricsLogOptions {
  // fsync(2) after every line.
  bool fsync_each_line = false;
};

class MetricsLog {
 public:
  // Opens `path` for writing: appends to it if `append` (creating it if
  // missing), else truncates it. The parent directory must exist. Errors name
  // `path` and the reason (NotFound, PermissionDenied, FailedPrecondition...).
  static absl::StatusOr<std::unique_ptr<MetricsLog>> Open(const std::string& path, bool append,
                                                          const MetricsLogOptions& options = {});

  // Closes the file; errors at that point are lost.
  ~MetricsLog();

  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  const std::string& path() const { return path_; }

  // Appends `record` as one line and flushes it (see above). `record` must be
  // a JSON object, else InvalidArgument; a key/value list works directly:
  //   log->Write({{"step", 1200}, {"loss", 0.412}});
  // If it has no "time" key, "time" is set to the current Unix time in seconds
  // (a double). Fails with the file's error if the write fails.
  absl::Status Write(nlohmann::json record);

  // Closes the file. Later Writes return FailedPrecondition.
  absl::Status Close();

 private:
  MetricsLog(std::string path, std::unique_ptr<WritableFile> file, const MetricsLogOptions& options);

  // Constant after construction.
  const std::string path_;
  const MetricsLogOptions options_;

  Mutex mu_;
  std::unique_ptr<WritableFile> file_ ABSL_GUARDED_BY(mu_);  // null once closed
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardwild
