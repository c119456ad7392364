// A TensorBoard event file writer for scalar summaries (loss, accuracy,
// samples/s, ...), with no TensorFlow or protobuf dependency.
//
// File: "<dir>/events.out.tfevents.<unix seconds, 10 digits>.<hostname>", as
// TensorFlow names them; if that name exists, ".1", ".2", ... is appended.
// TensorBoard reads every file in a directory whose name contains "tfevents".
//
// Content: a sequence of TFRecords, each
//   uint64 length (little-endian), uint32 MaskCrc32c(Crc32c(those 8 bytes)),
//   `length` bytes of data, uint32 MaskCrc32c(Crc32c(data))   (little-endian)
// whose data is a serialised tensorflow.Event protobuf, encoded here by hand:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }   (simple_value is in
//                                                          a oneof: always sent)
// The first record is Event{wall_time = now, file_version = "brain.Event:2"}.
// As proto3 serialisers do, fields holding their default (step 0, wall_time
// 0.0) are omitted.
//
// Records are buffered in memory and reach the file on Flush(), Close(), the
// destructor, or when the buffer (64 KiB) fills; a crash loses at most what
// was added since the last Flush (TensorBoard ignores a torn last record).
//
// Thread safety: EventFileWriter is thread-safe; records from concurrent
// calls are whole and in some order. The Encode* functions are pure.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/base/mutex.h"
#include "core/io/writable_file.h"

namespace shardwild {

// One named scalar of an event. `tag` must be valid UTF-8 (TensorBoard's
// protobuf parser rejects anything else); "/" groups tags into sections, e.g.
// "train/loss".
struct ScalarValue {
  absl::string_view tag;
  float value = 0.0f;
};

struct EventFileOptions {
  // Flush() also fsync(2)s the file, so events survive a machine crash.
  bool fsync_on_flush = false;
};

class EventFileWriter {
 public:
  // Creates `dir` (and missing parents) if needed, then a new event file in
  // it, and writes the file_version record (to the buffer). Errors name `dir`
  // or the file and the reason (e.g. PermissionDenied, FailedPrecondition).
  static absl::StatusOr<std::unique_ptr<EventFileWriter>> Open(const std::string& dir,
                                                               const EventFileOptions& options = {});

  // Flushes and closes; errors at that point are lost (call Close() first
  // where they matter).
  ~EventFileWriter();

  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // The event file's path.
  const std::string& path() const { return path_; }

  // Adds one Event with one scalar. `wall_time` is in seconds since the Unix
  // epoch (fractions allowed). InvalidArgument if `tag` is empty or not valid
  // UTF-8; otherwise only a failed write (of an earlier buffer) fails it.
  absl::Status AddScalar(absl::string_view tag, int64_t step, float value, double wall_time);
  // As AddScalar, with the current time.
  absl::Status AddScalar(absl::string_view tag, int64_t step, float value);

  // Adds one Event holding every value in `values` (same step and time);
  // nothing is added if any tag is invalid. An empty `values` adds nothing.
  absl::Status AddScalars(absl::Span<const ScalarValue> values, int64_t step, double wall_time);

  // Writes every buffered record to the file (and fsyncs it if
  // options.fsync_on_flush).
  absl::Status Flush();

  // Flush, then close. Later Add*/Flush calls return FailedPrecondition.
  absl::Status Close();

 private:
  EventFileWriter(std::string path, std::unique_ptr<WritableFile> file, const EventFileOptions& options);
  absl::Status AppendRecord(absl::string_view data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const std::string path_;
  const EventFileOptions options_;

  Mutex mu_;
  std::unique_ptr<WritableFile> file_ ABSL_GUARDED_BY(mu_);  // null once closed
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
};

// ---- Encoding (exposed for tests and other writers) ----

// `data` framed as one TFRecord (length, masked CRCs).
std::string EncodeTfRecord(absl::string_view data);
// The serialised Event{wall_time, file_version = "brain.Event:2"}.
std::string EncodeFileVersionEvent(double wall_time);
// The serialised Event{wall_time, step, summary{value: [{tag, simple_value}...]}}.
std::string EncodeScalarsEvent(absl::Span<const ScalarValue> values, int64_t step, double wall_time);

}  // namespace shardwild
