#include "core/io/atomic_file.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

std::string ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/atomic_file_test_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
    path_ = dir_ + "/f";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // The directory's entries other than `path_`.
  std::vector<std::string> Others() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      if (e.path().string() != path_) names.push_back(e.path().filename().string());
    }
    return names;
  }
  std::string dir_, path_;
};

TEST_F(AtomicFileTest, AppearsOnlyAtCommit) {
  { std::ofstream(path_) << "old"; }
  absl::StatusOr<std::unique_ptr<AtomicFile>> f = AtomicFile::Open(path_, /*sync=*/true);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->Append("new contents").ok());
  ASSERT_TRUE((*f)->file().Flush().ok());
  EXPECT_EQ(ReadRaw(path_), "old");  // written, not yet in place
  EXPECT_TRUE(absl::StartsWith((*f)->temp_path(), path_ + ".tmp."));
  ASSERT_TRUE((*f)->Commit().ok());
  EXPECT_EQ(ReadRaw(path_), "new contents");
  EXPECT_TRUE(Others().empty());
  absl::Status again = (*f)->Commit();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(AtomicFileTest, DroppedWithoutCommitLeavesThePathAlone) {
  { std::ofstream(path_) << "old"; }
  {
    absl::StatusOr<std::unique_ptr<AtomicFile>> f = AtomicFile::Open(path_);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE((*f)->Append("half of it").ok());
  }
  EXPECT_EQ(ReadRaw(path_), "old");
  EXPECT_TRUE(Others().empty());
}

TEST_F(AtomicFileTest, TwoWritersOfOnePathDoNotShareATemporaryFile) {
  absl::StatusOr<std::unique_ptr<AtomicFile>> a = AtomicFile::Open(path_);
  absl::StatusOr<std::unique_ptr<AtomicFile>> b = AtomicFile::Open(path_);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->temp_path(), (*b)->temp_path());
  ASSERT_TRUE((*a)->Append("a").ok());
  ASSERT_TRUE((*b)->Append("b").ok());
  ASSERT_TRUE((*a)->Commit().ok());
  ASSERT_TRUE((*b)->Commit().ok());
  EXPECT_EQ(ReadRaw(path_), "b");  // the last commit wins, whole
  EXPECT_TRUE(Others().empty());
}

TEST_F(AtomicFileTest, ErrorsNameThePathAndLeaveNoTemporaryFile) {
  absl::StatusOr<std::unique_ptr<AtomicFile>> missing = AtomicFile::Open(dir_ + "/no/such/dir/f");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir_ + "/no/such/dir/f"), std::string::npos) << missing.status();

  // The rename fails: the path is a directory with something in it.
  std::filesystem::create_directories(path_ + "/inside");
  absl::StatusOr<std::unique_ptr<AtomicFile>> f = AtomicFile::Open(path_);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->Append("x").ok());
  absl::Status s = (*f)->Commit();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path_ + ": rename from "), std::string::npos) << s;
  EXPECT_TRUE(Others().empty());
  EXPECT_TRUE(std::filesystem::is_directory(path_ + "/inside"));

  EXPECT_TRUE(WriteFileAtomically(dir_ + "/g", "whole", /*sync=*/false).ok());
  EXPECT_EQ(ReadRaw(dir_ + "/g"), "whole");
}

}  // namespace
}  // namespace shardwild
