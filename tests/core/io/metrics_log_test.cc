#include "core/io/metrics_log.h"

#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

using nlohmann::json;

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The lines of `path`, without their '\n'; the file must end with one.
std::vector<std::string> Lines(const std::string& path) {
  const std::string text = ReadRaw(path);
  EXPECT_TRUE(text.empty() || text.back() == '\n') << text;
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  lines.pop_back();  // after the last '\n'
  return lines;
}

class MetricsLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/metrics_log_test_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
    path_ = dir_ + "/metrics.jsonl";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_, path_;
};

TEST_F(MetricsLogTest, LinesParseBackAndAreOnDiskAtOnce) {
  const double before = Now();
  absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(path_, /*append=*/false);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ((*log)->path(), path_);

  ASSERT_TRUE((*log)->Write({{"step", 1}, {"loss", 0.5}}).ok());
  // Flushed by Write: visible before Close.
  std::vector<std::string> lines = Lines(path_);
  ASSERT_EQ(lines.size(), 1u);

  ASSERT_TRUE((*log)->Write({{"step", 2}, {"time", 123.5}, {"phase", "eval"}}).ok());
  ASSERT_TRUE((*log)->Write({{"step", 3}, {"per_class", {0.25, 0.75}}, {"nan", std::nan("")}}).ok());
  lines = Lines(path_);
  ASSERT_EQ(lines.size(), 3u);

  const json first = json::parse(lines[0]);
  EXPECT_EQ(first["step"], 1);
  EXPECT_EQ(first["loss"], 0.5);
  ASSERT_TRUE(first["time"].is_number_float());
  EXPECT_GE(first["time"].get<double>(), before);
  EXPECT_LE(first["time"].get<double>(), Now());
  EXPECT_EQ(lines[1], R"({"phase":"eval","step":2,"time":123.5})");  // "time" kept as given
  const json third = json::parse(lines[2]);
  EXPECT_EQ(third["per_class"], json({0.25, 0.75}));
  EXPECT_TRUE(third["nan"].is_null());
  ASSERT_TRUE((*log)->Close().ok());
  EXPECT_EQ((*log)->Write({{"step", 4}}).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(MetricsLogTest, AppendKeepsOldLinesAndTruncateDropsThem) {
  {
    absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(path_, false);
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE((*log)->Write({{"step", 1}}).ok());
    ASSERT_TRUE((*log)->Write({{"step", 2}}).ok());
  }
  {
    absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(path_, /*append=*/true);
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE((*log)->Write({{"step", 3}}).ok());
  }
  std::vector<std::string> lines = Lines(path_);
  ASSERT_EQ(lines.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(json::parse(lines[i])["step"], i + 1);

  {
    absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(path_, /*append=*/false);
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE((*log)->Write({{"step", 10}}).ok());
  }
  lines = Lines(path_);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(json::parse(lines[0])["step"], 10);

  // Append creates a missing file.
  const std::string fresh = dir_ + "/fresh.jsonl";
  absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(fresh, /*append=*/true);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE((*log)->Write({{"step", 1}}).ok());
  EXPECT_EQ(Lines(fresh).size(), 1u);
}

TEST_F(MetricsLogTest, AppendingAfterATornLineStartsANewLine) {
  std::ofstream(path_) << "{\"step\":1}\n{\"step\":2,\"lo";  // a crash cut the second line
  {
    absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(path_, /*append=*/true);
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE((*log)->Write({{"step", 3}}).ok());
  }
  const std::vector<std::string> lines = Lines(path_);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1], "{\"step\":2,\"lo");
  EXPECT_EQ(json::parse(lines[2])["step"], 3);
}

TEST_F(MetricsLogTest, RejectsRecordsThatAreNotObjects) {
  absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(path_, false);
  ASSERT_TRUE(log.ok()) << log.status();
  for (const json& bad : {json(1), json("loss"), json::array({1, 2}), json()}) {
    absl::Status s = (*log)->Write(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(s.message(), path_)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "JSON object")) << s;
  }
  ASSERT_TRUE((*log)->Write(json::object()).ok());  // {} gets a time
  const std::vector<std::string> lines = Lines(path_);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(json::parse(lines[0]).contains("time"));
}

TEST_F(MetricsLogTest, InvalidUtf8IsReplacedNotFatal) {
  absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(path_, false);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE((*log)->Write({{"file", "bad\xff"}}).ok());
  const std::vector<std::string> lines = Lines(path_);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(json::parse(lines[0])["file"], "bad\xef\xbf\xbd");  // U+FFFD
}

TEST_F(MetricsLogTest, UnwritableLocationsNameThePath) {
  // A regular file where a directory should be.
  std::ofstream(dir_ + "/file") << "x";
  const std::string under_file = dir_ + "/file/metrics.jsonl";
  absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(under_file, true);
  ASSERT_FALSE(log.ok());
  EXPECT_TRUE(absl::StrContains(log.status().message(), under_file)) << log.status();
  // A missing directory.
  const std::string missing = dir_ + "/no/such/metrics.jsonl";
  log = MetricsLog::Open(missing, false);
  ASSERT_FALSE(log.ok());
  EXPECT_EQ(log.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(log.status().message(), missing)) << log.status();
  // A directory in place of the file.
  log = MetricsLog::Open(dir_, true);
  ASSERT_FALSE(log.ok());
  EXPECT_TRUE(absl::StrContains(log.status().message(), dir_)) << log.status();
}

TEST_F(MetricsLogTest, ConcurrentWritersNeverInterleaveLines) {
  absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(path_, false, {.fsync_each_line = false});
  ASSERT_TRUE(log.ok()) << log.status();
  std::vector<std::thread> threads;
  const std::string padding(300, 'p');
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) EXPECT_TRUE((*log)->Write({{"thread", t}, {"i", i}, {"pad", padding}}).ok());
    });
  }
  for (std::thread& th : threads) th.join();
  const std::vector<std::string> lines = Lines(path_);
  ASSERT_EQ(lines.size(), 800u);
  std::vector<int> next(4, 0);
  for (const std::string& line : lines) {
    const json j = json::parse(line);
    const int t = j["thread"];
    EXPECT_EQ(j["i"], next[t]++);  // each thread's lines in its order
  }
}

TEST_F(MetricsLogTest, FsyncEachLine) {
  absl::StatusOr<std::unique_ptr<MetricsLog>> log = MetricsLog::Open(path_, false, {.fsync_each_line = true});
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE((*log)->Write({{"step", 1}}).ok());
  EXPECT_EQ(Lines(path_).size(), 1u);
}

}  // namespace
}  // namespace shardwild
