#include "core/io/tfevents.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/io/crc32c.h"
#include "core/base/status.h"

namespace shardwild {
namespace {

constexpr char kFileVersion[] = "brain.Event:2";
constexpr size_t kBufferBytes = size_t{64} << 10;
constexpr int kMaxNameAttempts = 1000;

// Protobuf wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutKey(std::string* out, uint32_t field, uint32_t wire_type) { PutVarint(out, (field << 3) | wire_type); }

void PutLittleEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

void PutDouble(std::string* out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  PutKey(out, field, kFixed64);
  PutLittleEndian(out, bits, 8);
}

void PutFloat(std::string* out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  PutKey(out, field, kFixed32);
  PutLittleEndian(out, bits, 4);
}

void PutBytes(std::string* out, uint32_t field, absl::string_view bytes) {
  PutKey(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

// Event.wall_time (1) and Event.step (2), each omitted at its default as
// proto3 does (+0.0 is the default; -0.0 is not).
void PutEventHeader(std::string* out, double wall_time, int64_t step) {
  uint64_t bits;
  std::memcpy(&bits, &wall_time, sizeof(bits));
  if (bits != 0) PutDouble(out, 1, wall_time);
  if (step != 0) {
    PutKey(out, 2, kVarint);
    PutVarint(out, static_cast<uint64_t>(step));  // negative: 10 bytes, as protobuf
  }
}

// Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF),
// as protobuf requires of proto3 strings.
bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int n;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0) { n = 1; cp = c & 0x1f; min = 0x80; }
    else if ((c & 0xf0) == 0xe0) { n = 2; cp = c & 0x0f; min = 0x800; }
    else if ((c & 0xf8) == 0xf0) { n = 3; cp = c & 0x07; min = 0x10000; }
    else return false;
    if (i + n >= s.size()) return false;  // truncated sequence
    for (int k = 1; k <= n; ++k) {
      const uint8_t d = static_cast<uint8_t>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

absl::Status CheckTag(absl::string_view tag) {
  if (tag.empty()) return absl::InvalidArgumentError("tfevents: a scalar tag must not be empty");
  if (!IsValidUtf8(tag)) {
    return absl::InvalidArgumentError(absl::StrCat("tfevents: scalar tag '", tag, "' is not valid UTF-8"));
  }
  return absl::OkStatus();
}

double UnixSecondsNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string HostName() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string host(buf.data());
  for (char& c : host) {
    if (c == '/') c = '_';
  }
  return host;
}

}  // namespace

std::string EncodeTfRecord(absl::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  PutLittleEndian(&out, data.size(), 8);
  PutLittleEndian(&out, MaskCrc32c(Crc32c(out.data(), 8)), 4);
  out.append(data.data(), data.size());
  PutLittleEndian(&out, MaskCrc32c(Crc32c(data.data(), data.size())), 4);
  return out;
}

std::string EncodeFileVersionEvent(double wall_time) {
  std::string out;
  PutEventHeader(&out, wall_time, 0);
  PutBytes(&out, 3, kFileVersion);
  return out;
}

std::string EncodeScalarsEvent(absl::Span<const ScalarValue> values, int64_t step, double wall_time) {
  std::string summary;
  for (const ScalarValue& v : values) {
    std::string value;
    PutBytes(&value, 1, v.tag);          // Value.tag
    PutFloat(&value, 2, v.value);        // Value.simple_value
    PutBytes(&summary, 1, value);        // Summary.value
  }
  std::string out;
  PutEventHeader(&out, wall_time, step);
  PutBytes(&out, 5, summary);            // Event.summary
  return out;
}

absl::StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Open(const std::string& dir,
                                                                       const EventFileOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat(dir, ": cannot create the event directory"));

  const double now = UnixSecondsNow();
  const std::string base = absl::StrFormat("%s/events.out.tfevents.%010d.%s", dir,
                                           static_cast<int64_t>(std::floor(now)), HostName());
  WritableFileOptions file_options;
  file_options.mode = WritableFileOptions::Mode::kCreateExclusive;
  file_options.buffer_bytes = kBufferBytes;
  for (int attempt = 0; attempt < kMaxNameAttempts; ++attempt) {
    std::string path = attempt == 0 ? base : absl::StrCat(base, ".", attempt);
    absl::StatusOr<std::unique_ptr<WritableFile>> file = WritableFile::Open(path, file_options);
    if (absl::IsAlreadyExists(file.status())) continue;
    SW_RETURN_IF_ERROR(file.status());
    std::unique_ptr<EventFileWriter> writer(new EventFileWriter(std::move(path), *std::move(file), options));
    {
      MutexLock lock(&writer->mu_);
      SW_RETURN_IF_ERROR(writer->AppendRecord(EncodeFileVersionEvent(now)));
    }
    // The file is a valid event file from here on.
    SW_RETURN_IF_ERROR(writer->Flush());
    return writer;
  }
  return absl::AlreadyExistsError(
      absl::StrCat(base, ": this name and ", kMaxNameAttempts - 1, " numbered variants all exist"));
}

EventFileWriter::EventFileWriter(std::string path, std::unique_ptr<WritableFile> file,
                                 const EventFileOptions& options)
    : path_(std::move(path)), options_(options), file_(std::move(file)) {}

EventFileWriter::~EventFileWriter() { Close().IgnoreError(); }

absl::Status EventFileWriter::AppendRecord(absl::string_view data) {
  if (file_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(path_, ": the event file is closed"));
  return file_->Append(EncodeTfRecord(data));
}

absl::Status EventFileWriter::AddScalar(absl::string_view tag, int64_t step, float value, double wall_time) {
  const ScalarValue v{tag, value};
  return AddScalars(absl::MakeConstSpan(&v, 1), step, wall_time);
}

absl::Status EventFileWriter::AddScalar(absl::string_view tag, int64_t step, float value) {
  return AddScalar(tag, step, value, UnixSecondsNow());
}

absl::Status EventFileWriter::AddScalars(absl::Span<const ScalarValue> values, int64_t step, double wall_time) {
  for (const ScalarValue& v : values) SW_RETURN_IF_ERROR(CheckTag(v.tag));
  if (values.empty()) return absl::OkStatus();
  const std::string event = EncodeScalarsEvent(values, step, wall_time);
  MutexLock lock(&mu_);
  return AppendRecord(event);
}

absl::Status EventFileWriter::Flush() {
  MutexLock lock(&mu_);
  if (file_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(path_, ": the event file is closed"));
  return options_.fsync_on_flush ? file_->Sync() : file_->Flush();
}

absl::Status EventFileWriter::Close() {
  MutexLock lock(&mu_);
  if (file_ == nullptr) return close_status_;
  if (options_.fsync_on_flush) close_status_ = file_->Sync();
  const absl::Status closed = file_->Close();
  if (close_status_.ok()) close_status_ = closed;
  file_.reset();
  return close_status_;
}

}  // namespace shardwild
