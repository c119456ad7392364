#include "core/data/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/base/huge_page_allocator.h"
#include "core/base/parallel_for.h"
#include "core/base/status.h"

namespace shardwild {
namespace {

constexpr uint8_t kUnsignedByteType = 0x08;
constexpr int kMaxDims = 4;

// The payload buffer starts at this size (or the expected size, if smaller)
// and doubles as data arrives, so a corrupt header that claims a huge payload
// cannot make us allocate far more than the file really holds.
constexpr size_t kInitialPayloadBytes = size_t{64} << 20;

// The largest request passed to one gzread call (its length is an unsigned).
constexpr size_t kMaxReadChunk = size_t{1} << 30;

// zlib's internal buffer; larger than the 8 KiB default for fewer syscalls.
constexpr unsigned kGzBufferBytes = 1u << 18;

struct GzCloser {
  void operator()(gzFile file) const { gzclose(file); }
};
using GzFilePtr = std::unique_ptr<gzFile_s, GzCloser>;

// Reads up to `n` bytes into `buf`, stopping early only at end of input.
// Returns the number of bytes read. A truncated gzip stream is not an error
// here: zlib returns what it could decompress, and the caller reports the
// short read. Fails only on an I/O error or corrupt compressed data.
absl::StatusOr<size_t> ReadUpTo(gzFile file, const std::string& path,
                                uint8_t* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    const size_t want = std::min(n - got, kMaxReadChunk);
    const int r = gzread(file, buf + got, static_cast<unsigned>(want));
    if (r < 0) {
      int errnum = Z_OK;
      const char* msg = gzerror(file, &errnum);
      absl::string_view detail = msg != nullptr ? msg : "unknown error";
      if (errnum == Z_ERRNO) detail = std::strerror(errno);
      // zlib prefixes its messages with the path; we add our own.
      absl::ConsumePrefix(&detail, absl::StrCat(path, ": "));
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": read failed: ", detail));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

// A note appended to truncation errors when the gzip stream itself ended
// early (as opposed to a complete stream holding too few bytes).
std::string GzipEndNote(gzFile file) {
  int errnum = Z_OK;
  gzerror(file, &errnum);
  return errnum == Z_BUF_ERROR ? " (the gzip stream ends early)" : "";
}

std::string HexBytes(const uint8_t* bytes, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    absl::StrAppendFormat(&out, "%s0x%02X", i == 0 ? "" : " ", bytes[i]);
  }
  return out;
}

// Returns `first` if it exists, else `second` if it exists, else NotFound
// naming both.
absl::StatusOr<std::string> FirstExisting(const std::string& first,
                                          const std::string& second) {
  for (const std::string* candidate : {&first, &second}) {
    std::error_code ec;
    if (std::filesystem::exists(*candidate, ec)) return *candidate;
  }
  return absl::NotFoundError(
      absl::StrCat("neither ", first, " nor ", second, " exists"));
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdx(const std::string& path) {
  errno = 0;
  // gzopen reads gzip-compressed content when the file starts with the gzip
  // magic and passes any other content through unchanged.
  GzFilePtr file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": cannot open: ", err != 0 ? std::strerror(err) : "out of memory"));
  }
  gzbuffer(file.get(), kGzBufferBytes);

  // Magic: 0x00 0x00 <element type> <dimension count>.
  std::array<uint8_t, 4> magic{};
  SW_ASSIGN_OR_RETURN(size_t got,
                      ReadUpTo(file.get(), path, magic.data(), magic.size()));
  if (got < magic.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: truncated: expected a 4-byte IDX magic, found %d bytes%s", path,
        got, GzipEndNote(file.get())));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": bad magic: expected 0x00 0x00 <type> <dimension count>, found ",
        HexBytes(magic.data(), magic.size())));
  }
  if (magic[2] != kUnsignedByteType) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: bad magic: unsupported element type 0x%02X, expected 0x%02X "
        "(unsigned byte)",
        path, magic[2], kUnsignedByteType));
  }
  const int num_dims = magic[3];
  if (num_dims < 1 || num_dims > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: bad magic: dimension count %d, expected 1..%d",
                        path, num_dims, kMaxDims));
  }

  // Dimensions: one big-endian uint32 each.
  std::array<uint8_t, 4 * kMaxDims> dim_bytes{};
  const size_t dim_bytes_len = 4 * static_cast<size_t>(num_dims);
  SW_ASSIGN_OR_RETURN(
      got, ReadUpTo(file.get(), path, dim_bytes.data(), dim_bytes_len));
  if (got < dim_bytes_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: truncated: expected %d header bytes for %d dimensions after the "
        "magic, found %d%s",
        path, dim_bytes_len, num_dims, got, GzipEndNote(file.get())));
  }
  IdxArray array;
  array.dims.reserve(num_dims);
  int64_t expected = 1;
  for (int i = 0; i < num_dims; ++i) {
    const uint8_t* b = dim_bytes.data() + 4 * i;
    const int64_t dim = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) |
                        (int64_t{b[2]} << 8) | int64_t{b[3]};
    if (dim == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: dimension %d of %d is 0, expected > 0", path, i, num_dims));
    }
    constexpr int64_t kMaxBytes = static_cast<int64_t>(
        std::min<uint64_t>(std::numeric_limits<int64_t>::max(),
                           std::numeric_limits<size_t>::max()));
    if (expected > kMaxBytes / dim) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: dimensions %sx%d... describe more than %d bytes", path,
          absl::StrJoin(array.dims, "x"), dim, kMaxBytes));
    }
    expected *= dim;
    array.dims.push_back(dim);
  }

  // Payload: read into a buffer that grows with the data actually present.
  const size_t expected_bytes = static_cast<size_t>(expected);
  array.data.resize(std::min(expected_bytes, kInitialPayloadBytes));
  size_t filled = 0;
  while (filled < expected_bytes) {
    if (filled == array.data.size()) {
      array.data.resize(std::min(expected_bytes, 2 * array.data.size()));
    }
    SW_ASSIGN_OR_RETURN(got,
                        ReadUpTo(file.get(), path, array.data.data() + filled,
                                 array.data.size() - filled));
    filled += got;
    if (filled < array.data.size()) break;  // end of input
  }
  if (filled < expected_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: truncated: expected %d data bytes after the header, found %d%s",
        path, expected, filled, GzipEndNote(file.get())));
  }

  // Nothing may follow the payload.
  std::vector<uint8_t> scratch(size_t{1} << 16);
  size_t trailing = 0;
  while (true) {
    SW_ASSIGN_OR_RETURN(
        got, ReadUpTo(file.get(), path, scratch.data(), scratch.size()));
    trailing += got;
    if (got < scratch.size()) break;
  }
  if (trailing > 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: trailing data: expected %d data bytes after the header, found %d "
        "more",
        path, expected, trailing));
  }
  return array;
}

absl::StatusOr<Dataset> LoadIdxImageDataset(const std::string& prefix,
                                                 int64_t expected_features,
                                                 int64_t max_records) {
  const std::string images_base = prefix + "-images-idx3-ubyte";
  const std::string labels_base = prefix + "-labels-idx1-ubyte";
  SW_ASSIGN_OR_RETURN(const std::string images_path,
                      FirstExisting(images_base + ".gz", images_base));
  SW_ASSIGN_OR_RETURN(const std::string labels_path,
                      FirstExisting(labels_base + ".gz", labels_base));
  SW_ASSIGN_OR_RETURN(IdxArray images, ReadIdx(images_path));
  SW_ASSIGN_OR_RETURN(IdxArray labels, ReadIdx(labels_path));

  if (images.dims.size() != 3) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected 3 dimensions (count, rows, cols), found %d (%s)",
        images_path, images.dims.size(), absl::StrJoin(images.dims, "x")));
  }
  if (labels.dims.size() != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected 1 dimension (count), found %d (%s)", labels_path,
        labels.dims.size(), absl::StrJoin(labels.dims, "x")));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "record counts disagree: %s holds %d images, %s holds %d labels",
        images_path, images.dims[0], labels_path, labels.dims[0]));
  }
  const int64_t features = images.dims[1] * images.dims[2];
  if (expected_features > 0 && features != expected_features) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: image dimension mismatch: expected %d features per image, found "
        "%d (%dx%d)",
        images_path, expected_features, features, images.dims[1],
        images.dims[2]));
  }

  Dataset dataset;
  dataset.count = images.dims[0];
  if (max_records > 0) dataset.count = std::min(dataset.count, max_records);
  dataset.dense_dim = features;

  const size_t num_values = static_cast<size_t>(dataset.count * features);
  // Four times the image bytes (Fashion-MNIST's training set: 188 MB), on
  // huge pages where the kernel grants them, so that the resize's first
  // touch faults 2 MiB at a time, then converted on every hardware thread.
  ResetOnHugePages(&dataset.dense, num_values);
  const uint8_t* src = images.data.data();
  float* dst = dataset.dense.data();
  // Division (not multiplication by 1/255) keeps 255 -> exactly 1.0f; the loop
  // is simple enough for the compiler to vectorise.
  constexpr size_t kPart = size_t{1} << 20;  // values
  ParallelFor(0, static_cast<int64_t>((num_values + kPart - 1) / kPart), [&](int64_t g) {
    const size_t begin = static_cast<size_t>(g) * kPart, end = std::min(begin + kPart, num_values);
    for (size_t i = begin; i < end; ++i) dst[i] = static_cast<float>(src[i]) / 255.0f;
  });

  // The class count comes from every label in the file, so that keeping a
  // prefix of the records does not change the shape of the model.
  const uint8_t max_label =
      *std::max_element(labels.data.begin(), labels.data.end());
  dataset.num_classes = int32_t{max_label} + 1;
  dataset.labels.assign(labels.data.begin(),
                        labels.data.begin() + dataset.count);
  return dataset;
}

}  // namespace shardwild
