#include "core/io/writable_file.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/match.h"
#include "core/io/crc32c.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

std::string ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class WritableFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/writable_file_test_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
    path_ = dir_ + "/f";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_, path_;
};

TEST_F(WritableFileTest, BuffersUntilFlushAndChecksumsEverything) {
  WritableFileOptions options;
  options.checksum = true;
  options.buffer_bytes = 7;  // small, so appends span several buffers
  absl::StatusOr<std::unique_ptr<WritableFile>> f = WritableFile::Open(path_, options);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->Append("abc").ok());
  EXPECT_EQ(ReadRaw(path_), "");  // still buffered
  ASSERT_TRUE((*f)->Append("defghijklmnopqrstuvwxyz").ok());
  EXPECT_EQ(ReadRaw(path_), "abcdefghijklmnopqrstu");  // three full buffers went out
  ASSERT_TRUE((*f)->Flush().ok());
  EXPECT_EQ(ReadRaw(path_), "abcdefghijklmnopqrstuvwxyz");
  ASSERT_TRUE((*f)->Append("0123456789").ok());
  ASSERT_TRUE((*f)->Sync().ok());
  ASSERT_TRUE((*f)->Close().ok());
  const std::string all = "abcdefghijklmnopqrstuvwxyz0123456789";
  EXPECT_EQ(ReadRaw(path_), all);
  EXPECT_EQ((*f)->bytes_appended(), all.size());
  EXPECT_EQ((*f)->crc32c(), Crc32c(all.data(), all.size()));
  EXPECT_TRUE((*f)->Close().ok());
  EXPECT_EQ((*f)->Append("x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*f)->Flush().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(WritableFileTest, Modes) {
  std::ofstream(path_) << "old\n";
  WritableFileOptions options;
  options.mode = WritableFileOptions::Mode::kAppend;
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> f = WritableFile::Open(path_, options);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE((*f)->Append("new\n").ok());
  }  // the destructor flushes and closes
  EXPECT_EQ(ReadRaw(path_), "old\nnew\n");

  options.mode = WritableFileOptions::Mode::kCreateExclusive;
  absl::StatusOr<std::unique_ptr<WritableFile>> f = WritableFile::Open(path_, options);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(absl::StrContains(f.status().message(), path_)) << f.status();

  options.mode = WritableFileOptions::Mode::kTruncate;
  f = WritableFile::Open(path_, options);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ(ReadRaw(path_), "");

  options.buffer_bytes = 0;
  EXPECT_EQ(WritableFile::Open(path_, options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(WritableFileTest, OpenErrorsNameThePath) {
  const std::string missing = dir_ + "/no/such/file";
  absl::StatusOr<std::unique_ptr<WritableFile>> f = WritableFile::Open(missing);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(f.status().message(), missing)) << f.status();
}

TEST_F(WritableFileTest, WriteErrorsAreSticky) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  WritableFileOptions options;
  options.buffer_bytes = 4;
  absl::StatusOr<std::unique_ptr<WritableFile>> f = WritableFile::Open("/dev/full", options);
  ASSERT_TRUE(f.ok()) << f.status();
  const absl::Status first = (*f)->Append("12345678");
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.code(), absl::StatusCode::kResourceExhausted) << first;  // ENOSPC
  EXPECT_TRUE(absl::StrContains(first.message(), "/dev/full: write")) << first;
  EXPECT_EQ((*f)->Append("x"), first);
  EXPECT_EQ((*f)->Flush(), first);
  EXPECT_EQ((*f)->Close(), first);
}

}  // namespace
}  // namespace shardwild
