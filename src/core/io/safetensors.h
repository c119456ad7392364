// Writer and reader for the safetensors file format (huggingface/safetensors),
// the format of Shardwild's checkpoint tensor files.
//
// Format (all integers little-endian):
//   bytes [0, 8)        N, a uint64: the length of the header
//   bytes [8, 8+N)      the header: a UTF-8 JSON object, starting with '{' and
//                       possibly padded at the end with spaces (0x20)
//   bytes [8+N, EOF)    the data region: every tensor's bytes, row-major,
//                       little-endian, without gaps
// The header maps each tensor name to
//   {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}
// where [BEGIN, END) is a byte range of the data region (offsets relative to
// its start). One optional key, "__metadata__", maps to an object of string
// values (free-form; Shardwild's checkpoints record step, shard, etc.).
// Valid files have END - BEGIN == product(shape) * dtype size for every
// tensor, and the ranges, sorted, tile the data region exactly: the first
// starts at 0, each starts where the previous ends, the last ends at EOF. A
// shape of [] is a scalar (one element); a dimension may be 0.
//
// SafetensorsWriter writes the header as compact JSON: "__metadata__" first
// (if any), then the tensors in the order they were added, each with its keys
// in the order dtype, shape, data_offsets. It pads the header with spaces so
// the data region starts at a multiple of 8 bytes, and lays the tensors' data
// out in the same order, contiguously. Alignment of each tensor within the
// region is therefore up to the caller: add 8-byte types first, or tensors
// whose byte sizes are multiples of 8, if readers should get aligned data.
//
// Files load with safetensors.numpy.load_file / safetensors.torch.load_file,
// and with a few lines of json + numpy (docs/safetensors_numpy.md).
// Only little-endian hosts are supported (checked at compile time).
//
// Thread safety: a SafetensorsWriter is not thread-safe. A SafetensorsReader
// is immutable after Open; all its const methods may be called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shardwild {

// The element types of the safetensors format. Values are not stored in files
// (files hold the names); order is free to change.
enum class SafetensorsDtype {
  kBool, kU8, kI8, kF8E5M2, kF8E4M3, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kF64, kI64, kU64,
};

// "F32", "BF16", "BOOL", ... as written in headers.
const char* SafetensorsDtypeName(SafetensorsDtype dtype);
// Bytes per element: 1, 2, 4 or 8.
size_t SafetensorsDtypeSize(SafetensorsDtype dtype);
// The dtype named `name` (case-sensitive, as in headers); InvalidArgument if
// none is.
absl::StatusOr<SafetensorsDtype> ParseSafetensorsDtype(absl::string_view name);

// The dtype of a C++ element type: SafetensorsDtypeOf<float>() == kF32.
template <typename T>
constexpr SafetensorsDtype SafetensorsDtypeOf();

// Size and CRC32C of a file as SafetensorsWriter wrote it, for a manifest.
struct SafetensorsFileInfo {
  uint64_t size = 0;    // bytes
  uint32_t crc32c = 0;  // Crc32c() of all `size` bytes of the file
};

struct SafetensorsWriteOptions {
  // fsync(2) the file before Write returns, so it survives a machine crash
  // (the caller still has to fsync the directory after renaming it).
  bool fsync = false;
};

// Collects tensors and metadata, then writes one file.
//
//   SafetensorsWriter w;
//   SW_RETURN_IF_ERROR(w.AddTensor("dense/w", {784, 10}, absl::MakeConstSpan(weights)));
//   SW_RETURN_IF_ERROR(w.SetMetadata("step", "1200"));
//   SW_ASSIGN_OR_RETURN(SafetensorsFileInfo info, w.Write(path, {.fsync = true}));
class SafetensorsWriter {
 public:
  // Receives a piece of a tensor's bytes; returns the writer's error (write
  // failure, or more bytes than the tensor holds) or OK.
  using Sink = std::function<absl::Status(absl::Span<const uint8_t> bytes)>;
  // Produces one tensor's bytes at Write time by calling `sink` with pieces of
  // any size, in order, whose sizes add up to exactly the tensor's byte size.
  // It should return the first non-OK status `sink` returns (the writer fails
  // even if it doesn't), or its own error, which makes Write fail.
  using Producer = std::function<absl::Status(const Sink& sink)>;

  SafetensorsWriter() = default;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Adds a tensor whose bytes are `data` (row-major, little-endian). The
  // bytes are not copied: they must stay valid until the last Write returns.
  // Fails with InvalidArgument (and adds nothing) if `name` is empty,
  // "__metadata__", not valid UTF-8, or already added; if a dimension is
  // negative; or if data.size() != product(shape) * SafetensorsDtypeSize(dtype).
  absl::Status AddTensor(std::string name, SafetensorsDtype dtype, std::vector<int64_t> shape,
                         absl::Span<const uint8_t> data);
  // As above, for a span of a C++ element type (float, int64_t, ...).
  template <typename T>
  absl::Status AddTensor(std::string name, std::vector<int64_t> shape, absl::Span<const T> data) {
    return AddTensor(std::move(name), SafetensorsDtypeOf<T>(), std::move(shape),
                     absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()),
                                               data.size() * sizeof(T)));
  }
  // Adds a tensor whose bytes `producer` streams at Write time, so a huge
  // tensor (or one gathered from many shards) needs no contiguous copy.
  // Validation as above, except for the data size, which Write checks.
  absl::Status AddTensor(std::string name, SafetensorsDtype dtype, std::vector<int64_t> shape,
                         Producer producer);

  // Sets "__metadata__"[key] = value, replacing an earlier value of `key`.
  // InvalidArgument if key or value is not valid UTF-8.
  absl::Status SetMetadata(std::string key, std::string value);

  // Writes the file at `path` (created or truncated; the parent directory
  // must exist) with write(2), each tensor's bytes in the order added;
  // producers run in that order, on the calling thread. Returns the file's
  // size and the CRC32C of its bytes, computed from the bytes as they are
  // written (not by reading the file back). On failure returns the first error
  // (a producer's, or one naming `path` and the tensor involved) and removes
  // the partly written file. Write may be called again; producers run again.
  absl::StatusOr<SafetensorsFileInfo> Write(const std::string& path,
                                            const SafetensorsWriteOptions& options = {}) const;

  // Tensors added so far.
  size_t num_tensors() const { return tensors_.size(); }

 private:
  struct Entry {
    std::string name;
    SafetensorsDtype dtype;
    std::vector<int64_t> shape;
    uint64_t bytes;                  // product(shape) * dtype size
    absl::Span<const uint8_t> data;  // used if !producer
    Producer producer;
  };
  absl::StatusOr<uint64_t> CheckNew(const std::string& name, SafetensorsDtype dtype,
                                    const std::vector<int64_t>& shape) const;
  // The header JSON, padded; InvalidArgument naming `path` if it can't be built.
  absl::StatusOr<std::string> Header(const std::string& path) const;
  // Write without the clean-up; sets *created once the file exists.
  absl::StatusOr<SafetensorsFileInfo> WriteFile(const std::string& path, const SafetensorsWriteOptions& options,
                                                bool* created) const;

  std::vector<Entry> tensors_;                                // in the order added
  std::unordered_map<std::string, size_t> index_;             // name -> tensors_ index
  std::vector<std::pair<std::string, std::string>> metadata_; // in the order first set
};

// One tensor of an open file. Spans point into the reader's mapping and stay
// valid while the reader lives.
struct SafetensorsTensor {
  absl::string_view name;
  SafetensorsDtype dtype;
  absl::Span<const int64_t> shape;
  absl::Span<const uint8_t> data;  // exactly num_elements() * dtype size bytes
  int64_t num_elements() const;    // product(shape); 1 for a scalar
};

// A validated, memory-mapped (read-only) safetensors file.
class SafetensorsReader {
 public:
  // Maps `path` and validates it completely (see the format above). Errors:
  // NotFound if `path` doesn't exist; FailedPrecondition if it can't be opened
  // or mapped; InvalidArgument for any format violation. Messages start with
  // `path`, name the tensor or key involved, and say what was expected and
  // what was found, e.g. "/ckpt/a.safetensors: tensor 'w': data_offsets
  // [0, 12) hold 12 bytes, but shape [2, 3] of F32 needs 24".
  // The file must not be truncated while the reader is open (the mapping
  // would fault); checkpoint files are never changed after they are written.
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);

  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }

  // Tensor names in the order of their data in the file; for files from
  // SafetensorsWriter, the order they were added.
  const std::vector<std::string>& names() const { return names_; }
  bool Contains(absl::string_view name) const;
  // NotFound naming the path and `name` if there is no such tensor.
  absl::StatusOr<SafetensorsTensor> Get(absl::string_view name) const;
  // The tensor's elements as T. InvalidArgument if its dtype is not
  // SafetensorsDtypeOf<T>() or its data are not aligned for T (then copy
  // Get(name)->data instead); NotFound as Get.
  template <typename T>
  absl::StatusOr<absl::Span<const T>> GetAs(absl::string_view name) const;

  // "__metadata__"; empty if the file has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    SafetensorsDtype dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;  // within the data region
  };
  SafetensorsReader(std::string path, const uint8_t* base, uint64_t size);
  // Validates the mapped file and fills the members below; called once by Open.
  absl::Status Parse();

  // Constant after Open.
  const std::string path_;
  const uint8_t* const base_;  // the mapping; null for an empty file
  const uint64_t size_;
  uint64_t data_start_ = 0;
  std::vector<std::string> names_;
  std::unordered_map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// ---- implementation details ----

template <typename T>
constexpr SafetensorsDtype SafetensorsDtypeOf() {
  if constexpr (std::is_same_v<T, bool>) return SafetensorsDtype::kBool;
  else if constexpr (std::is_same_v<T, uint8_t>) return SafetensorsDtype::kU8;
  else if constexpr (std::is_same_v<T, int8_t>) return SafetensorsDtype::kI8;
  else if constexpr (std::is_same_v<T, int16_t>) return SafetensorsDtype::kI16;
  else if constexpr (std::is_same_v<T, uint16_t>) return SafetensorsDtype::kU16;
  else if constexpr (std::is_same_v<T, int32_t>) return SafetensorsDtype::kI32;
  else if constexpr (std::is_same_v<T, uint32_t>) return SafetensorsDtype::kU32;
  else if constexpr (std::is_same_v<T, float>) return SafetensorsDtype::kF32;
  else if constexpr (std::is_same_v<T, double>) return SafetensorsDtype::kF64;
  else if constexpr (std::is_same_v<T, int64_t>) return SafetensorsDtype::kI64;
  else if constexpr (std::is_same_v<T, uint64_t>) return SafetensorsDtype::kU64;
  else static_assert(sizeof(T) == 0, "no safetensors dtype for this C++ type");
}

template <typename T>
absl::StatusOr<absl::Span<const T>> SafetensorsReader::GetAs(absl::string_view name) const {
  absl::StatusOr<SafetensorsTensor> t = Get(name);
  if (!t.ok()) return t.status();
  constexpr SafetensorsDtype want = SafetensorsDtypeOf<T>();
  if (t->dtype != want) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name, "' is ",
                                                   SafetensorsDtypeName(t->dtype), ", not ",
                                                   SafetensorsDtypeName(want)));
  }
  if (t->data.empty()) return absl::Span<const T>();
  if (reinterpret_cast<uintptr_t>(t->data.data()) % alignof(T) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor '", name, "' data at file offset ",
                     static_cast<uint64_t>(t->data.data() - base_), " are not aligned to ", alignof(T),
                     " bytes; copy Get(name)->data instead"));
  }
  return absl::Span<const T>(reinterpret_cast<const T*>(t->data.data()),
                             t->data.size() / sizeof(T));
}

}  // namespace shardwild
