#include "core/data/idx_reader.h"

#include <stdlib.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

// Succeeds if the message of `status` contains every one of `parts`.
::testing::AssertionResult MessageContains(
    const absl::Status& status, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts) {
    if (status.message().find(part) == absl::string_view::npos) {
      return ::testing::AssertionFailure() << "message \"" << status.message()
                                           << "\" lacks \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

// Builds an IDX file image: magic 0x00 0x00 `type` <dims.size()>, big-endian
// uint32 dimensions, then `payload`.
std::vector<uint8_t> MakeIdx(const std::vector<uint32_t>& dims,
                             const std::vector<uint8_t>& payload,
                             uint8_t type = 0x08) {
  std::vector<uint8_t> out = {0x00, 0x00, type,
                              static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    out.push_back(static_cast<uint8_t>(d >> 24));
    out.push_back(static_cast<uint8_t>(d >> 16));
    out.push_back(static_cast<uint8_t>(d >> 8));
    out.push_back(static_cast<uint8_t>(d));
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// Bytes 0, 1, 2, ... (mod 256), `n` of them.
std::vector<uint8_t> Ramp(size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i * 7 + 3);
  return out;
}

// Each test gets a fresh directory under /tmp, removed afterwards.
class IdxReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/idx_reader_test_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
  }

  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Writes `bytes` uncompressed to dir_/name and returns the path.
  std::string WritePlain(const std::string& name,
                         const std::vector<uint8_t>& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good()) << path;
    return path;
  }

  // Writes `bytes` gzip-compressed to dir_/name and returns the path.
  std::string WriteGzip(const std::string& name,
                        const std::vector<uint8_t>& bytes) {
    const std::string path = dir_ + "/" + name;
    gzFile file = gzopen(path.c_str(), "wb");
    EXPECT_NE(file, nullptr) << path;
    if (file == nullptr) return path;
    if (!bytes.empty()) {
      EXPECT_EQ(
          gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
          static_cast<int>(bytes.size()));
    }
    EXPECT_EQ(gzclose(file), Z_OK);
    return path;
  }

  std::string dir_;
};

// ---------------------------------------------------------------- ReadIdx

TEST_F(IdxReaderTest, PlainThreeDimensionalFileRoundTrips) {
  const std::vector<uint8_t> payload = Ramp(2 * 3 * 4);
  const std::string path =
      WritePlain("a-idx3-ubyte", MakeIdx({2, 3, 4}, payload));
  absl::StatusOr<IdxArray> array = ReadIdx(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(array->data, payload);
}

TEST_F(IdxReaderTest, OneDimensionalFileRoundTrips) {
  const std::vector<uint8_t> payload = {9, 0, 4, 255, 1};
  const std::string path = WritePlain("l-idx1-ubyte", MakeIdx({5}, payload));
  absl::StatusOr<IdxArray> array = ReadIdx(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dims, (std::vector<int64_t>{5}));
  EXPECT_EQ(array->data, payload);
}

TEST_F(IdxReaderTest, GzipAndPlainGiveEqualResults) {
  // Large enough to span several internal zlib buffers.
  const std::vector<uint32_t> dims = {50, 100, 100};
  const std::vector<uint8_t> bytes = MakeIdx(dims, Ramp(50 * 100 * 100));
  absl::StatusOr<IdxArray> plain = ReadIdx(WritePlain("x-idx3-ubyte", bytes));
  absl::StatusOr<IdxArray> gz = ReadIdx(WriteGzip("x-idx3-ubyte.gz", bytes));
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(gz.ok()) << gz.status();
  EXPECT_EQ(plain->dims, gz->dims);
  EXPECT_EQ(plain->data, gz->data);
}

TEST_F(IdxReaderTest, CompressionIsDetectedByContentNotName) {
  const std::vector<uint8_t> payload = Ramp(6);
  const std::vector<uint8_t> bytes = MakeIdx({2, 3}, payload);
  absl::StatusOr<IdxArray> gz_without_suffix =
      ReadIdx(WriteGzip("gz-data", bytes));
  absl::StatusOr<IdxArray> plain_with_suffix =
      ReadIdx(WritePlain("plain.gz", bytes));
  ASSERT_TRUE(gz_without_suffix.ok()) << gz_without_suffix.status();
  ASSERT_TRUE(plain_with_suffix.ok()) << plain_with_suffix.status();
  EXPECT_EQ(gz_without_suffix->data, payload);
  EXPECT_EQ(plain_with_suffix->data, payload);
}

TEST_F(IdxReaderTest, TruncatedPayloadIsInvalidArgument) {
  std::vector<uint8_t> bytes = MakeIdx({4, 5, 6}, Ramp(4 * 5 * 6));
  bytes.resize(bytes.size() - 10);
  for (const std::string& path : {WritePlain("t-idx3-ubyte", bytes),
                                  WriteGzip("t-idx3-ubyte.gz", bytes)}) {
    absl::StatusOr<IdxArray> array = ReadIdx(path);
    ASSERT_FALSE(array.ok()) << path;
    EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(MessageContains(
        array.status(),
        {path, "truncated", "expected 120 data bytes", "found 110"}));
  }
}

TEST_F(IdxReaderTest, TruncatedGzipStreamIsInvalidArgument) {
  const std::vector<uint8_t> bytes = MakeIdx({20, 20, 20}, Ramp(20 * 20 * 20));
  const std::string path = WriteGzip("cut-idx3-ubyte.gz", bytes);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  absl::StatusOr<IdxArray> array = ReadIdx(path);
  ASSERT_FALSE(array.ok());
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(array.status(), {path}));
}

TEST_F(IdxReaderTest, TruncatedHeaderIsInvalidArgument) {
  std::vector<uint8_t> bytes = MakeIdx({4, 5, 6}, {});
  bytes.resize(7);  // magic plus part of the first dimension
  const std::string path = WritePlain("h-idx3-ubyte", bytes);
  absl::StatusOr<IdxArray> array = ReadIdx(path);
  ASSERT_FALSE(array.ok());
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(array.status(), {path, "truncated"}));

  const std::string empty = WritePlain("empty", {});
  array = ReadIdx(empty);
  ASSERT_FALSE(array.ok());
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(array.status(), {empty, "truncated"}));
}

TEST_F(IdxReaderTest, WrongMagicIsRejected) {
  std::vector<uint8_t> bytes = MakeIdx({3}, {1, 2, 3});
  bytes[0] = 0x12;
  bytes[1] = 0x34;
  const std::string path = WritePlain("m-idx1-ubyte", bytes);
  absl::StatusOr<IdxArray> array = ReadIdx(path);
  ASSERT_FALSE(array.ok());
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(array.status(), {path, "magic", "0x12 0x34"}));
}

TEST_F(IdxReaderTest, FloatElementTypeIsRejected) {
  const std::string path =
      WritePlain("f-idx1-float", MakeIdx({1}, {0, 0, 0, 0}, /*type=*/0x0D));
  absl::StatusOr<IdxArray> array = ReadIdx(path);
  ASSERT_FALSE(array.ok());
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(array.status(), {path, "element type 0x0D"}));
}

TEST_F(IdxReaderTest, DimensionCountOutsideOneToFourIsRejected) {
  const std::string none = WritePlain("d0", MakeIdx({}, {7}));
  const std::string five = WritePlain("d5", MakeIdx({1, 1, 1, 1, 1}, {7}));
  for (const std::string& path : {none, five}) {
    absl::StatusOr<IdxArray> array = ReadIdx(path);
    ASSERT_FALSE(array.ok()) << path;
    EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(MessageContains(array.status(), {path, "dimension count"}));
  }
}

TEST_F(IdxReaderTest, ZeroDimensionIsRejected) {
  const std::string path = WritePlain("z-idx3-ubyte", MakeIdx({2, 0, 3}, {}));
  absl::StatusOr<IdxArray> array = ReadIdx(path);
  ASSERT_FALSE(array.ok());
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(array.status(), {path, "dimension 1 of 3 is 0"}));
}

TEST_F(IdxReaderTest, TrailingBytesAreRejected) {
  std::vector<uint8_t> bytes = MakeIdx({2, 2}, {1, 2, 3, 4});
  bytes.push_back(0xAB);
  bytes.push_back(0xCD);
  for (const std::string& path : {WritePlain("tr-idx2-ubyte", bytes),
                                  WriteGzip("tr-idx2-ubyte.gz", bytes)}) {
    absl::StatusOr<IdxArray> array = ReadIdx(path);
    ASSERT_FALSE(array.ok()) << path;
    EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(
        MessageContains(array.status(), {path, "trailing", "found 2 more"}));
  }
}

TEST_F(IdxReaderTest, MissingFileIsNotFound) {
  const std::string path = dir_ + "/does-not-exist-idx3-ubyte.gz";
  absl::StatusOr<IdxArray> array = ReadIdx(path);
  ASSERT_FALSE(array.ok());
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageContains(array.status(), {path}));
}

TEST_F(IdxReaderTest, DirectoryIsInvalidArgument) {
  absl::StatusOr<IdxArray> array = ReadIdx(dir_);
  ASSERT_FALSE(array.ok());
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(array.status(), {dir_}));
}

// ---------------------------------------------------- LoadIdxImageDataset

// Writes "<dir_>/<name>-images-idx3-ubyte.gz" holding `count` images of
// rows x cols pixels and "<dir_>/<name>-labels-idx1-ubyte.gz" holding
// `labels`; returns the prefix.
class LoadIdxImageDatasetTest : public IdxReaderTest {
 protected:
  std::string WriteDataset(const std::string& name, uint32_t count,
                           uint32_t rows, uint32_t cols,
                           const std::vector<uint8_t>& pixels,
                           const std::vector<uint8_t>& labels) {
    WriteGzip(name + "-images-idx3-ubyte.gz",
              MakeIdx({count, rows, cols}, pixels));
    WriteGzip(name + "-labels-idx1-ubyte.gz",
              MakeIdx({static_cast<uint32_t>(labels.size())}, labels));
    return dir_ + "/" + name;
  }
};

TEST_F(LoadIdxImageDatasetTest, ScalesPixelsToUnitInterval) {
  const std::vector<uint8_t> pixels = {0, 255, 51, 102, 0, 0, 255, 255};
  const std::string prefix = WriteDataset("s", 2, 2, 2, pixels, {3, 1});
  absl::StatusOr<Dataset> ds =
      LoadIdxImageDataset(prefix, /*expected_features=*/4);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->count, 2);
  EXPECT_EQ(ds->dense_dim, 4);
  ASSERT_EQ(ds->dense.size(), 8u);
  EXPECT_EQ(ds->dense[0], 0.0f);
  EXPECT_EQ(ds->dense[1], 1.0f);
  EXPECT_FLOAT_EQ(ds->dense[2], 0.2f);
  EXPECT_FLOAT_EQ(ds->dense[3], 0.4f);
  EXPECT_EQ(ds->dense[6], 1.0f);
  for (float v : ds->dense) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LE(v, 1.0f);
  }
  EXPECT_EQ(ds->labels, (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(ds->num_classes, 4);
}

// The pixels are scaled on every hardware thread, 2^20 values a part:
// more values than one part, and a prefix of the records that ends inside
// the second part, each give every pixel exactly as p / 255.0f.
TEST_F(LoadIdxImageDatasetTest, ScalesEveryPartOfALargeSet) {
  constexpr uint32_t kImages = 1100, kSide = 32;  // 1,126,400 values
  std::vector<uint8_t> pixels(size_t{kImages} * kSide * kSide);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i * 131 + i / 977) % 256);
  const std::vector<uint8_t> labels(kImages, 2);
  const std::string prefix = WriteDataset("large", kImages, kSide, kSide, pixels, labels);
  for (const int64_t max_records : {int64_t{0}, int64_t{1050}}) {
    absl::StatusOr<Dataset> ds = LoadIdxImageDataset(prefix, 0, max_records);
    ASSERT_TRUE(ds.ok()) << ds.status();
    const size_t values = static_cast<size_t>(max_records > 0 ? max_records : kImages) * kSide * kSide;
    ASSERT_EQ(ds->dense.size(), values);
    size_t wrong = 0;
    for (size_t i = 0; i < values; ++i) wrong += ds->dense[i] != static_cast<float>(pixels[i]) / 255.0f;
    EXPECT_EQ(wrong, 0u) << max_records;
  }
}

TEST_F(LoadIdxImageDatasetTest, MaxRecordsKeepsTheFirstRecords) {
  const std::vector<uint8_t> pixels = Ramp(5 * 3 * 2);
  const std::string prefix =
      WriteDataset("m", 5, 3, 2, pixels, {0, 1, 2, 3, 9});
  absl::StatusOr<Dataset> ds =
      LoadIdxImageDataset(prefix, /*expected_features=*/0, /*max_records=*/2);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->count, 2);
  EXPECT_EQ(ds->dense_dim, 6);
  ASSERT_EQ(ds->dense.size(), 12u);
  for (size_t i = 0; i < ds->dense.size(); ++i) {
    EXPECT_EQ(ds->dense[i], static_cast<float>(pixels[i]) / 255.0f) << i;
  }
  EXPECT_EQ(ds->labels, (std::vector<int32_t>{0, 1}));
  // The class count reflects the whole file, not just the kept prefix.
  EXPECT_EQ(ds->num_classes, 10);

  // A limit above the record count keeps everything.
  ds = LoadIdxImageDataset(prefix, 0, /*max_records=*/100);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->count, 5);
  EXPECT_EQ(ds->dense.size(), 30u);
  EXPECT_EQ(ds->labels.size(), 5u);
}

TEST_F(LoadIdxImageDatasetTest, MismatchedCountsNameBothFilesAndCounts) {
  const std::string prefix =
      WriteDataset("c", 3, 2, 2, Ramp(12), {0, 1, 2, 3, 4, 5, 6});
  absl::StatusOr<Dataset> ds = LoadIdxImageDataset(prefix);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(
      ds.status(), {prefix + "-images-idx3-ubyte.gz",
                    prefix + "-labels-idx1-ubyte.gz", "3 images", "7 labels"}));
}

TEST_F(LoadIdxImageDatasetTest, WrongExpectedFeaturesIsRejected) {
  const std::string prefix = WriteDataset("f", 2, 2, 3, Ramp(12), {0, 1});
  absl::StatusOr<Dataset> ds =
      LoadIdxImageDataset(prefix, /*expected_features=*/784);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(ds.status(), {"dimension", "784", "6"}));
}

TEST_F(LoadIdxImageDatasetTest, ImagesMustBeThreeDimensional) {
  WritePlain("r-images-idx3-ubyte", MakeIdx({2, 4}, Ramp(8)));
  WritePlain("r-labels-idx1-ubyte", MakeIdx({2}, {0, 1}));
  absl::StatusOr<Dataset> ds = LoadIdxImageDataset(dir_ + "/r");
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(ds.status(), {"expected 3 dimensions"}));
}

TEST_F(LoadIdxImageDatasetTest, LabelsMustBeOneDimensional) {
  WritePlain("q-images-idx3-ubyte", MakeIdx({2, 2, 2}, Ramp(8)));
  WritePlain("q-labels-idx1-ubyte", MakeIdx({2, 1}, {0, 1}));
  absl::StatusOr<Dataset> ds = LoadIdxImageDataset(dir_ + "/q");
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(ds.status(), {"expected 1 dimension"}));
}

TEST_F(LoadIdxImageDatasetTest, PrefersGzipNameThenPlainName) {
  // Plain images only; both names for labels, with different contents.
  WritePlain("p-images-idx3-ubyte", MakeIdx({2, 1, 1}, {0, 255}));
  WriteGzip("p-labels-idx1-ubyte.gz", MakeIdx({2}, {4, 5}));
  WritePlain("p-labels-idx1-ubyte", MakeIdx({2}, {1, 1}));
  absl::StatusOr<Dataset> ds = LoadIdxImageDataset(dir_ + "/p");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->dense, (std::vector<float>{0.0f, 1.0f}));
  EXPECT_EQ(ds->labels, (std::vector<int32_t>{4, 5}));
}

TEST_F(LoadIdxImageDatasetTest, MissingFilesAreNotFound) {
  const std::string prefix = dir_ + "/absent";
  absl::StatusOr<Dataset> ds = LoadIdxImageDataset(prefix);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageContains(ds.status(), {prefix + "-images-idx3-ubyte.gz",
                                            prefix + "-images-idx3-ubyte"}));
}

TEST(LoadIdxImageDatasetRealTest, FashionMnistTestSet) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST not found under " << dir;
  }
  absl::StatusOr<Dataset> ds =
      LoadIdxImageDataset(dir + "/t10k", /*expected_features=*/784);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->count, 10000);
  EXPECT_EQ(ds->dense_dim, 784);
  EXPECT_EQ(ds->num_classes, 10);
  EXPECT_EQ(ds->dense.size(), 10000u * 784u);
  EXPECT_EQ(ds->labels.size(), 10000u);
  for (int32_t label : ds->labels) {
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 10);
  }
}

}  // namespace
}  // namespace shardwild
