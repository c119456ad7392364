#include "core/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status.h"
#include "core/io/writable_file.h"

namespace shardwild {

static_assert(std::endian::native == std::endian::little,
              "safetensors data are little-endian; big-endian hosts would need byte swapping");

namespace {

// Headers larger than this are rejected before parsing (as the reference
// implementation does), so a corrupt length cannot make us parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr absl::string_view kMetadataKey = "__metadata__";

struct DtypeInfo {
  SafetensorsDtype dtype;
  const char* name;
  size_t size;
};
constexpr std::array<DtypeInfo, 15> kDtypes = {{
    {SafetensorsDtype::kBool, "BOOL", 1},
    {SafetensorsDtype::kU8, "U8", 1},
    {SafetensorsDtype::kI8, "I8", 1},
    {SafetensorsDtype::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDtype::kF8E4M3, "F8_E4M3", 1},
    {SafetensorsDtype::kI16, "I16", 2},
    {SafetensorsDtype::kU16, "U16", 2},
    {SafetensorsDtype::kF16, "F16", 2},
    {SafetensorsDtype::kBF16, "BF16", 2},
    {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kU32, "U32", 4},
    {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kF64, "F64", 8},
    {SafetensorsDtype::kI64, "I64", 8},
    {SafetensorsDtype::kU64, "U64", 8},
}};

const DtypeInfo& Info(SafetensorsDtype dtype) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.dtype == dtype) return d;
  }
  return kDtypes[0];  // unreachable for valid enum values
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string RangeString(uint64_t begin, uint64_t end) { return absl::StrCat("[", begin, ", ", end, ")"); }

// product(shape) * element_size, or nullopt on overflow of uint64.
std::optional<uint64_t> ByteSize(absl::Span<const int64_t> shape, size_t element_size) {
  uint64_t n = element_size;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

// Whether `s` is valid UTF-8, as nlohmann::json's serialiser judges it.
bool IsValidUtf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

std::array<uint8_t, 8> LittleEndian64(uint64_t v) {
  std::array<uint8_t, 8> b;
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  return b;
}

uint64_t LoadLittleEndian64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// `s` with `prefix` before its message and `suffix` after it (the code kept).
absl::Status Annotate(const absl::Status& s, absl::string_view prefix, absl::string_view suffix = "") {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message(), suffix));
}

}  // namespace

const char* SafetensorsDtypeName(SafetensorsDtype dtype) { return Info(dtype).name; }

size_t SafetensorsDtypeSize(SafetensorsDtype dtype) { return Info(dtype).size; }

absl::StatusOr<SafetensorsDtype> ParseSafetensorsDtype(absl::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  std::vector<absl::string_view> known;
  for (const DtypeInfo& d : kDtypes) known.push_back(d.name);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name, "\" (expected one of ", absl::StrJoin(known, ", "), ")"));
}

int64_t SafetensorsTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- SafetensorsWriter ------------------------------------------------------

absl::StatusOr<uint64_t> SafetensorsWriter::CheckNew(const std::string& name, SafetensorsDtype dtype,
                                                     const std::vector<int64_t>& shape) const {
  if (name.empty()) return absl::InvalidArgumentError("safetensors: a tensor name must not be empty");
  if (name == kMetadataKey) {
    return absl::InvalidArgumentError("safetensors: \"__metadata__\" is reserved and can't name a tensor");
  }
  if (!IsValidUtf8(name)) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor name '", name, "' is not valid UTF-8"));
  }
  if (index_.count(name) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", name, "' was already added"));
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", name, "': shape ", ShapeString(shape),
                                                     " has a negative dimension at index ", i));
    }
  }
  std::optional<uint64_t> bytes = ByteSize(shape, SafetensorsDtypeSize(dtype));
  if (!bytes) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", name, "': shape ", ShapeString(shape),
                                                   " of ", SafetensorsDtypeName(dtype), " overflows 64 bits"));
  }
  return *bytes;
}

absl::Status SafetensorsWriter::AddTensor(std::string name, SafetensorsDtype dtype, std::vector<int64_t> shape,
                                          absl::Span<const uint8_t> data) {
  SW_ASSIGN_OR_RETURN(const uint64_t bytes, CheckNew(name, dtype, shape));
  if (data.size() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", name, "': shape ", ShapeString(shape),
                                                   " of ", SafetensorsDtypeName(dtype), " needs ", bytes,
                                                   " bytes, got ", data.size()));
  }
  index_.emplace(name, tensors_.size());
  tensors_.push_back(Entry{std::move(name), dtype, std::move(shape), bytes, data, nullptr});
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::AddTensor(std::string name, SafetensorsDtype dtype, std::vector<int64_t> shape,
                                          Producer producer) {
  SW_ASSIGN_OR_RETURN(const uint64_t bytes, CheckNew(name, dtype, shape));
  if (!producer) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", name, "': the producer is empty"));
  }
  index_.emplace(name, tensors_.size());
  tensors_.push_back(Entry{std::move(name), dtype, std::move(shape), bytes, {}, std::move(producer)});
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: metadata '", key, "': key and value must be valid UTF-8"));
  }
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return absl::OkStatus();
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
  return absl::OkStatus();
}

absl::StatusOr<std::string> SafetensorsWriter::Header(const std::string& path) const {
  std::string text;
  try {
    // ordered_json keeps insertion order: the layout documented in the header.
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata_.empty()) {
      nlohmann::ordered_json& m = header[std::string(kMetadataKey)] = nlohmann::ordered_json::object();
      for (const auto& [k, v] : metadata_) m[k] = v;
    }
    uint64_t offset = 0;
    for (const Entry& e : tensors_) {
      nlohmann::ordered_json entry = nlohmann::ordered_json::object();
      entry["dtype"] = SafetensorsDtypeName(e.dtype);
      entry["shape"] = e.shape;
      entry["data_offsets"] = nlohmann::ordered_json::array({offset, offset + e.bytes});
      header[e.name] = std::move(entry);
      offset += e.bytes;
    }
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // Names and metadata were checked when added; this is a safety net.
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot build the safetensors header: ", e.what()));
  }
  // Spaces so that the data region (at 8 + header size) is 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

absl::StatusOr<SafetensorsFileInfo> SafetensorsWriter::Write(const std::string& path,
                                                             const SafetensorsWriteOptions& options) const {
  bool created = false;
  absl::StatusOr<SafetensorsFileInfo> info = WriteFile(path, options, &created);
  // Leave no half-written file behind under the final name (only ever a
  // regular file: never unlink a device such as /dev/full).
  struct stat st;
  if (!info.ok() && created && ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::unlink(path.c_str());
  return info;
}

absl::StatusOr<SafetensorsFileInfo> SafetensorsWriter::WriteFile(const std::string& path,
                                                                 const SafetensorsWriteOptions& options,
                                                                 bool* created) const {
  SW_ASSIGN_OR_RETURN(const std::string header, Header(path));
  uint64_t expected_size = 8 + header.size();
  for (const Entry& e : tensors_) expected_size += e.bytes;

  WritableFileOptions file_options;
  file_options.mode = WritableFileOptions::Mode::kTruncate;
  file_options.checksum = true;
  SW_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, WritableFile::Open(path, file_options));
  *created = true;

  const std::array<uint8_t, 8> length = LittleEndian64(header.size());
  SW_RETURN_IF_ERROR(file->Append(absl::MakeConstSpan(length)));
  SW_RETURN_IF_ERROR(file->Append(header));

  for (const Entry& e : tensors_) {
    const std::string where = absl::StrCat(path, ": tensor '", e.name, "': ");
    if (!e.producer) {
      absl::Status s = file->Append(e.data);
      if (!s.ok()) return Annotate(s, "", absl::StrCat(" (writing tensor '", e.name, "')"));
      continue;
    }
    uint64_t delivered = 0;
    absl::Status sink_error;  // sticky: the first failure the sink saw
    const Sink sink = [&](absl::Span<const uint8_t> bytes) -> absl::Status {
      if (!sink_error.ok()) return sink_error;
      if (bytes.size() > e.bytes - delivered) {
        sink_error = absl::InvalidArgumentError(absl::StrCat(
            where, "the producer delivered more than the ", e.bytes, " bytes of shape ", ShapeString(e.shape),
            " of ", SafetensorsDtypeName(e.dtype)));
        return sink_error;
      }
      delivered += bytes.size();
      absl::Status s = file->Append(bytes);
      if (!s.ok()) sink_error = Annotate(s, "", absl::StrCat(" (writing tensor '", e.name, "')"));
      return sink_error;
    };
    const absl::Status produced = e.producer(sink);
    SW_RETURN_IF_ERROR(sink_error);
    if (!produced.ok()) return Annotate(produced, where);
    if (delivered != e.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the producer delivered ", delivered, " bytes, but shape ",
                                                     ShapeString(e.shape), " of ", SafetensorsDtypeName(e.dtype),
                                                     " needs ", e.bytes));
    }
  }
  if (options.fsync) SW_RETURN_IF_ERROR(file->Sync());
  SW_RETURN_IF_ERROR(file->Close());
  if (file->bytes_appended() != expected_size) {  // a bug here, not the caller's
    return absl::InternalError(absl::StrCat(path, ": wrote ", file->bytes_appended(), " bytes, expected ",
                                            expected_size));
  }
  return SafetensorsFileInfo{file->bytes_appended(), file->crc32c()};
}

// ---- SafetensorsReader ------------------------------------------------------

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::FailedPreconditionError(absl::StrCat(path, ": cannot open: ", std::strerror(error)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": fstat: ", std::strerror(error)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: the file has ", size,
                                                   " bytes, fewer than the 8-byte header length"));
  }
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int error = errno;
  ::close(fd);  // the mapping keeps the file open
  if (base == MAP_FAILED) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": mmap of ", size, " bytes: ", std::strerror(error)));
  }
  std::unique_ptr<SafetensorsReader> reader(
      new SafetensorsReader(path, static_cast<const uint8_t*>(base), size));
  SW_RETURN_IF_ERROR(reader->Parse());
  return reader;
}

SafetensorsReader::SafetensorsReader(std::string path, const uint8_t* base, uint64_t size)
    : path_(std::move(path)), base_(base), size_(size) {}

SafetensorsReader::~SafetensorsReader() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

absl::Status SafetensorsReader::Parse() {
  auto error = [this](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", parts...));
  };
  const uint64_t header_size = LoadLittleEndian64(base_);
  if (header_size > size_ - 8) {
    return error("header length ", header_size, " exceeds the file: only ", size_ - 8,
                 " bytes follow the 8-byte length prefix (truncated file or not safetensors)");
  }
  if (header_size > kMaxHeaderBytes) {
    return error("header length ", header_size, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  }
  if (header_size == 0 || base_[8] != '{') {
    return error("the header must be a JSON object starting with '{', found ",
                 header_size == 0 ? std::string("an empty header")
                                  : absl::StrCat("byte 0x", absl::Hex(base_[8], absl::kZeroPad2)));
  }
  // nlohmann::json stops at a NUL byte as if the input ended there, which
  // would let anything after it through; the format allows only spaces.
  if (const void* nul = std::memchr(base_ + 8, '\0', header_size); nul != nullptr) {
    return error("the header has a NUL byte at offset ",
                 8 + (static_cast<const uint8_t*>(nul) - (base_ + 8)),
                 "; it must be JSON padded with spaces");
  }
  data_start_ = 8 + header_size;
  const uint64_t data_size = size_ - data_start_;

  nlohmann::json header;
  std::string duplicate;
  try {
    std::set<std::string> seen;
    // Reject repeated tensor names: a plain parse keeps only the last one.
    nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                     nlohmann::json& parsed) {
      if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string() &&
          !seen.insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
      return true;
    };
    const char* begin = reinterpret_cast<const char*>(base_ + 8);
    header = nlohmann::json::parse(begin, begin + header_size, on_event);
  } catch (const nlohmann::json::exception& e) {
    return error("the header is not valid JSON: ", e.what());
  }
  if (!duplicate.empty()) return error("the header has key '", duplicate, "' more than once");
  if (!header.is_object()) return error("the header is a JSON ", header.type_name(), ", expected an object");

  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& value = it.value();
    if (name == kMetadataKey) {
      if (!value.is_object()) return error("__metadata__: expected an object of strings, got a ", value.type_name());
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string()) {
          return error("__metadata__['", m.key(), "']: expected a string, got a ", m.value().type_name());
        }
        metadata_.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor '", name, "': ");
    if (!value.is_object()) {
      return error(where, "expected an object with dtype, shape and data_offsets, got a ", value.type_name());
    }
    Entry entry;
    // dtype
    auto dtype = value.find("dtype");
    if (dtype == value.end()) return error(where, "missing \"dtype\"");
    if (!dtype->is_string()) return error(where, "\"dtype\" must be a string, got a ", dtype->type_name());
    absl::StatusOr<SafetensorsDtype> parsed = ParseSafetensorsDtype(dtype->get<std::string>());
    if (!parsed.ok()) return error(where, parsed.status().message());
    entry.dtype = *parsed;
    // shape
    auto shape = value.find("shape");
    if (shape == value.end()) return error(where, "missing \"shape\"");
    if (!shape->is_array()) return error(where, "\"shape\" must be an array, got a ", shape->type_name());
    for (size_t i = 0; i < shape->size(); ++i) {
      const nlohmann::json& d = (*shape)[i];
      if (!d.is_number_integer() || (d.is_number_unsigned() ? d.get<uint64_t>() > INT64_MAX : d.get<int64_t>() < 0)) {
        return error(where, "shape[", i, "] is ", d.dump(), ", expected a non-negative integer");
      }
      entry.shape.push_back(d.get<int64_t>());
    }
    // data_offsets
    auto offsets = value.find("data_offsets");
    if (offsets == value.end()) return error(where, "missing \"data_offsets\"");
    if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
        !(*offsets)[1].is_number_unsigned()) {
      return error(where, "\"data_offsets\" is ", offsets->dump(), ", expected [BEGIN, END] of non-negative integers");
    }
    entry.begin = (*offsets)[0].get<uint64_t>();
    entry.end = (*offsets)[1].get<uint64_t>();
    const std::string range = RangeString(entry.begin, entry.end);
    if (entry.begin > entry.end) return error(where, "data_offsets ", range, " end before they begin");
    if (entry.end > data_size) {
      return error(where, "data_offsets ", range, " extend past the data region, which has ", data_size,
                   " bytes (truncated file?)");
    }
    std::optional<uint64_t> bytes = ByteSize(entry.shape, SafetensorsDtypeSize(entry.dtype));
    if (!bytes) {
      return error(where, "shape ", ShapeString(entry.shape), " of ", SafetensorsDtypeName(entry.dtype),
                   " overflows 64 bits");
    }
    if (entry.end - entry.begin != *bytes) {
      return error(where, "data_offsets ", range, " hold ", entry.end - entry.begin, " bytes, but shape ",
                   ShapeString(entry.shape), " of ", SafetensorsDtypeName(entry.dtype), " needs ", *bytes);
    }
    const auto inserted = entries_.emplace(name, std::move(entry)).first;
    ranges.push_back(Range{inserted->second.begin, inserted->second.end, &inserted->first});
  }

  // The ranges must tile [0, data_size): no overlap, no gap, nothing after.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Range* previous = nullptr;
  for (const Range& r : ranges) {
    if (r.begin < covered) {
      return error("tensors '", *previous->name, "' ", RangeString(previous->begin, previous->end), " and '",
                   *r.name, "' ", RangeString(r.begin, r.end), " overlap in the data region");
    }
    if (r.begin > covered) {
      return error("bytes ", RangeString(covered, r.begin), " of the data region belong to no tensor (gap before '",
                   *r.name, "')");
    }
    covered = r.end;
    previous = &r;
    names_.push_back(*r.name);
  }
  if (covered != data_size) {
    return error("the data region has ", data_size, " bytes, but the tensors cover only the first ", covered,
                 " (", data_size - covered, " trailing bytes)");
  }
  return absl::OkStatus();
}

bool SafetensorsReader::Contains(absl::string_view name) const {
  return entries_.count(std::string(name)) != 0;
}

absl::StatusOr<SafetensorsTensor> SafetensorsReader::Get(absl::string_view name) const {
  auto it = entries_.find(std::string(name));
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "' (the file has ", names_.size(),
                                            " tensors)"));
  }
  const Entry& e = it->second;
  return SafetensorsTensor{it->first, e.dtype, e.shape,
                           absl::Span<const uint8_t>(base_ + data_start_ + e.begin, e.end - e.begin)};
}

}  // namespace shardwild
