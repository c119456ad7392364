// Reader for the IDX format used by MNIST and Fashion-MNIST.
//
// An IDX file is a 4-byte magic (0x00 0x00 <element type> <dimension count>),
// then one big-endian uint32 per dimension, then the elements in row-major
// order. Only the unsigned-byte element type (0x08) is supported; that covers
// the image and label files of both data sets.
//
// Files may be gzip-compressed or plain. Compression is detected from the
// content (the gzip magic 0x1f 0x8b), never from the file name.
//
// Thread safety: every function here is thread-safe; none keeps state between
// calls.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/data/dataset.h"

namespace shardwild {

// The content of one unsigned-byte IDX file.
struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28} or {60000}; each > 0
  std::vector<uint8_t> data;  // row-major, exactly product(dims) bytes
};

// Reads the IDX file at `path` (gzip-compressed or plain) whose element type
// is unsigned byte (0x08).
//
// Checks the magic (two zero bytes, type byte 0x08, then a dimension count in
// 1..4), that every dimension is > 0, and that the payload holds exactly
// product(dims) bytes: a truncated file and trailing bytes are both errors.
//
// On failure returns NotFound if `path` does not exist and InvalidArgument
// otherwise (unreadable file, corrupt gzip stream, bad header, wrong size).
// Every message starts with `path` and says what was expected and what was
// found, e.g. "/x/train-images-idx3-ubyte.gz: truncated: expected 47040000
// data bytes after the header, found 123".
absl::StatusOr<IdxArray> ReadIdx(const std::string& path);


// Loads "<prefix>-images-idx3-ubyte[.gz]" and "<prefix>-labels-idx1-ubyte[.gz]"
// (for each, the ".gz" name is used if it exists, else the plain one), e.g.
// prefix "/data/fashion-mnist/t10k".
//
// Checks that the images are 3-D (count, rows, cols), the labels 1-D (count),
// and that both counts agree (the error names both files and both counts).
// If `expected_features` > 0, checks that rows*cols equals it. If
// `max_records` > 0, keeps only the first `max_records` records (all of them
// when there are fewer); values <= 0 disable the check and the limit.
//
// Errors: NotFound when neither name of a file exists (the message names
// both), otherwise the errors of ReadIdx or InvalidArgument for a failed check.
absl::StatusOr<Dataset> LoadIdxImageDataset(const std::string& prefix,
                                                 int64_t expected_features = 0,
                                                 int64_t max_records = 0);

}  // namespace shardwild
