#include "core/data_gen.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "shardwild_data_gen_test.XXXXXX").string();
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    parts.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

DataGenOptions Options(const std::string& kind, int64_t rows, const std::string& out, uint64_t seed = 1) {
  DataGenOptions o;
  o.kind = kind;
  o.rows = rows;
  o.out = out;
  o.seed = seed;
  return o;
}

bool AllDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

TEST(DataGenTest, SameSeedSameBytesOtherSeedOtherBytes) {
  TempDir dir;
  for (const std::string kind : {"criteo", "libsvm", "text"}) {
    SCOPED_TRACE(kind);
    const std::string a = dir.File(kind + ".a"), b = dir.File(kind + ".b"), c = dir.File(kind + ".c");
    absl::StatusOr<DataGenResult> ra = GenerateData(Options(kind, 500, a, 42));
    absl::StatusOr<DataGenResult> rb = GenerateData(Options(kind, 500, b, 42));
    absl::StatusOr<DataGenResult> rc = GenerateData(Options(kind, 500, c, 43));
    ASSERT_TRUE(ra.ok()) << ra.status();
    ASSERT_TRUE(rb.ok()) << rb.status();
    ASSERT_TRUE(rc.ok()) << rc.status();
    const std::string bytes_a = ReadFile(a);
    EXPECT_EQ(bytes_a, ReadFile(b));
    EXPECT_NE(bytes_a, ReadFile(c));
    EXPECT_EQ(ra->bayes_metric, rb->bayes_metric);
    EXPECT_EQ(ra->bytes, static_cast<int64_t>(bytes_a.size()));
    EXPECT_EQ(ra->rows, 500);
    // Rows come from per-row streams: a shorter file is a prefix.
    const std::string shorter = dir.File(kind + ".short");
    ASSERT_TRUE(GenerateData(Options(kind, 200, shorter, 42)).ok());
    const std::string bytes_short = ReadFile(shorter);
    EXPECT_EQ(bytes_a.substr(0, bytes_short.size()), bytes_short);
  }
  // Only the outputs: no temporary files left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
    ++files;
  }
  EXPECT_EQ(files, 12);
}

TEST(DataGenTest, CriteoFormat) {
  TempDir dir;
  const std::string out = dir.File("criteo.tsv");
  absl::StatusOr<DataGenResult> r = GenerateData(Options("criteo", 2000, out));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->metric_name, "bayes_auc");
  EXPECT_EQ(r->num_classes, 2);
  const std::string text = ReadFile(out);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const std::vector<std::string> lines = Lines(text);
  ASSERT_EQ(lines.size(), 2000u);
  int64_t positives = 0, missing_dense = 0, missing_cat = 0;
  for (const std::string& line : lines) {
    const std::vector<std::string> f = Split(line, '\t');
    ASSERT_EQ(f.size(), 40u) << line;
    ASSERT_TRUE(f[0] == "0" || f[0] == "1") << line;
    positives += f[0] == "1";
    for (int j = 1; j <= 13; ++j) {
      if (f[j].empty()) {
        ++missing_dense;
      } else {
        EXPECT_TRUE(AllDigits(f[j])) << f[j];
      }
    }
    for (int j = 14; j < 40; ++j) {
      if (f[j].empty()) {
        ++missing_cat;
        continue;
      }
      ASSERT_EQ(f[j].size(), 8u) << f[j];
      for (char c : f[j]) EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f')) << f[j];
    }
  }
  EXPECT_GT(missing_dense, 0);
  EXPECT_GT(missing_cat, 0);
  EXPECT_DOUBLE_EQ(r->positive_rate, static_cast<double>(positives) / 2000);
  EXPECT_GT(r->positive_rate, 0.2);
  EXPECT_LT(r->positive_rate, 0.3);
}

TEST(DataGenTest, LibsvmFormat) {
  TempDir dir;
  const std::string out = dir.File("data.libsvm");
  absl::StatusOr<DataGenResult> r = GenerateData(Options("libsvm", 1000, out));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->metric_name, "bayes_auc");
  const std::vector<std::string> lines = Lines(ReadFile(out));
  ASSERT_EQ(lines.size(), 1000u);
  for (const std::string& line : lines) {
    const std::vector<std::string> f = Split(line, ' ');
    ASSERT_TRUE(f[0] == "0" || f[0] == "1") << line;
    ASSERT_GE(f.size(), 2u) << line;
    EXPECT_LE(f.size(), 41u) << line;
    int64_t previous = 0;
    for (size_t i = 1; i < f.size(); ++i) {
      const size_t colon = f[i].find(':');
      ASSERT_NE(colon, std::string::npos) << f[i];
      const std::string index = f[i].substr(0, colon), value = f[i].substr(colon + 1);
      ASSERT_TRUE(AllDigits(index)) << f[i];
      const int64_t idx = std::stoll(index);
      EXPECT_GT(idx, previous) << line;  // 1-based, strictly increasing
      EXPECT_LE(idx, 100000);
      previous = idx;
      const double v = std::stod(value);
      EXPECT_GT(v, 0.0) << f[i];
      EXPECT_LE(v, 1.0) << f[i];
    }
  }
}

TEST(DataGenTest, TextFormat) {
  TempDir dir;
  const std::string out = dir.File("data.txt");
  DataGenOptions o = Options("text", 1000, out);
  o.text_classes = 5;
  absl::StatusOr<DataGenResult> r = GenerateData(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->metric_name, "bayes_accuracy");
  EXPECT_EQ(r->num_classes, 5);
  const std::vector<std::string> lines = Lines(ReadFile(out));
  ASSERT_EQ(lines.size(), 1000u);
  std::vector<int> seen(5, 0);
  for (const std::string& line : lines) {
    const std::vector<std::string> f = Split(line, ' ');
    ASSERT_EQ(f[0].rfind("__label__c", 0), 0u) << line;
    const int label = std::stoi(f[0].substr(10));
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 5);
    ++seen[label];
    EXPECT_GE(f.size(), 6u) << line;   // 5..30 tokens
    EXPECT_LE(f.size(), 31u) << line;
    for (size_t i = 1; i < f.size(); ++i) {
      ASSERT_EQ(f[i][0], 'w') << f[i];
      EXPECT_TRUE(AllDigits(f[i].substr(1))) << f[i];
      EXPECT_LT(std::stoll(f[i].substr(1)), 20000);
    }
  }
  for (int c = 0; c < 5; ++c) EXPECT_GT(seen[c], 0) << c;
}

// The planted models' Bayes metrics sit in their documented ranges (with
// room for sampling noise at this size), and are reproducible.
TEST(DataGenTest, BayesMetricInRangeAndReproducible) {
  TempDir dir;
  struct Case {
    std::string kind;
    double lo, hi;
  };
  for (const Case& c : {Case{"criteo", 0.74, 0.83}, Case{"libsvm", 0.76, 0.85}, Case{"text", 0.76, 0.87}}) {
    SCOPED_TRACE(c.kind);
    absl::StatusOr<DataGenResult> r1 = GenerateData(Options(c.kind, 20000, dir.File(c.kind + "1")));
    absl::StatusOr<DataGenResult> r2 = GenerateData(Options(c.kind, 20000, dir.File(c.kind + "2")));
    ASSERT_TRUE(r1.ok()) << r1.status();
    ASSERT_TRUE(r2.ok()) << r2.status();
    EXPECT_GE(r1->bayes_metric, c.lo);
    EXPECT_LE(r1->bayes_metric, c.hi);
    EXPECT_EQ(r1->bayes_metric, r2->bayes_metric);
    EXPECT_EQ(r1->positive_rate, r2->positive_rate);
  }
}

TEST(DataGenTest, RejectsBadOptions) {
  TempDir dir;
  const std::string out = dir.File("x");
  absl::StatusOr<DataGenResult> r = GenerateData(Options("csv", 10, out));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("kind"), std::string::npos) << r.status();
  r = GenerateData(Options("criteo", 0, out));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rows"), std::string::npos) << r.status();
  r = GenerateData(Options("criteo", 10, ""));
  ASSERT_FALSE(r.ok());
  DataGenOptions o = Options("text", 10, out);
  o.text_classes = 1;
  r = GenerateData(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("text_classes"), std::string::npos) << r.status();
  EXPECT_FALSE(fs::exists(out));
}

TEST(DataGenTest, UnwritableDirectoryIsAnErrorNamingThePath) {
  TempDir dir;
  const std::string out = dir.File("no/such/dir/data.tsv");
  absl::StatusOr<DataGenResult> r = GenerateData(Options("criteo", 10, out));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no/such/dir"), std::string::npos) << r.status();
}

TEST(DataGenTest, ReplacesAnExistingFile) {
  TempDir dir;
  const std::string out = dir.File("data.txt");
  std::ofstream(out) << "old content\n";
  ASSERT_TRUE(GenerateData(Options("text", 10, out)).ok());
  const std::vector<std::string> lines = Lines(ReadFile(out));
  ASSERT_EQ(lines.size(), 10u);
  EXPECT_EQ(lines[0].rfind("__label__", 0), 0u);
}

}  // namespace
}  // namespace shardwild
