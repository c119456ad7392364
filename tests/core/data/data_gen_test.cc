#include "core/data/data_gen.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/io/compressed.h"
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

// A missing folder is made (`--out data/train.tsv` in a fresh clone); one
// that cannot be (a file in its place) is an error naming the path.
TEST(DataGenTest, MakesTheFilesFolderOrNamesThePath) {
  TempDir dir;
  const std::string out = dir.File("no/such/dir/data.tsv");
  absl::StatusOr<DataGenResult> r = GenerateData(Options("criteo", 10, out));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Lines(ReadFile(out)).size(), 10u);
  DataGenOptions split = Options("text", 10, dir.File("parts/of/text.txt"));
  split.files = 2;
  r = GenerateData(split);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->files.size(), 2u);
  for (const auto& f : r->files) EXPECT_TRUE(fs::exists(f.path)) << f.path;
  std::ofstream(dir.File("a_file")) << "x\n";
  const std::string blocked = dir.File("a_file/sub/data.tsv");
  r = GenerateData(Options("criteo", 10, blocked));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(blocked), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("cannot be made"), std::string::npos) << r.status();
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

// Files of one model_seed are samples of one planted model (text: the words
// specific to class c0 in one file are specific to c0 in the other; criteo:
// below).
TEST(DataGenTest, SeedsSampleRowsModelSeedFixesTheModel) {
  TempDir dir;
  // word -> share of its uses that are in c0 documents (words used >= 20 times).
  auto c0_share = [&](uint64_t seed, uint64_t model_seed) {
    DataGenOptions o = Options("text", 4000, dir.File("t" + std::to_string(seed) + std::to_string(model_seed)), seed);
    o.model_seed = model_seed;
    EXPECT_TRUE(GenerateData(o).ok());
    std::map<std::string, std::pair<int, int>> counts;  // word -> (in c0 documents, in all)
    for (const std::string& line : Lines(ReadFile(o.out))) {
      const bool c0 = line.rfind("__label__c0 ", 0) == 0;
      std::istringstream in(line.substr(line.find(' ') + 1));
      std::string tok;
      while (in >> tok) {
        counts[tok].first += c0;
        ++counts[tok].second;
      }
    }
    std::map<std::string, double> share;
    for (const auto& [tok, k] : counts) {
      if (k.second >= 20) share[tok] = static_cast<double>(k.first) / k.second;
    }
    return share;
  };
  // Of the words at least 90% c0 in `a`, the share that are at least half c0 in `b`.
  auto agreement = [](const std::map<std::string, double>& a, const std::map<std::string, double>& b) {
    int specific = 0, kept = 0;
    for (const auto& [tok, sh] : a) {
      if (sh < 0.9) continue;
      ++specific;
      auto it = b.find(tok);
      kept += it != b.end() && it->second >= 0.5;
    }
    EXPECT_GE(specific, 10);
    return specific > 0 ? static_cast<double>(kept) / specific : 0.0;
  };
  const auto a = c0_share(1, 1);
  EXPECT_GT(agreement(a, c0_share(2, 1)), 0.8);
  EXPECT_GT(agreement(a, c0_share(3, 1)), 0.8);

  // Criteo: the positive rate of each frequent value of a field follows its
  // planted weight, so two samples of one model agree on which values are
  // above the field's mean rate; samples of two models do not.
  auto above_mean = [&](uint64_t seed, uint64_t model_seed) {
    DataGenOptions o = Options("criteo", 30000, dir.File("c" + std::to_string(seed) + std::to_string(model_seed)), seed);
    o.model_seed = model_seed;
    EXPECT_TRUE(GenerateData(o).ok());
    std::map<std::string, std::pair<int, int>> counts;  // C6 value -> (positives, rows)
    int positives = 0, rows = 0;
    for (const std::string& line : Lines(ReadFile(o.out))) {
      std::vector<std::string> f;
      std::istringstream in(line);
      for (std::string x; std::getline(in, x, '\t');) f.push_back(x);
      if (f.size() < 20 || f[19].empty()) continue;
      const bool y = f[0] == "1";
      counts[f[19]].first += y;
      ++counts[f[19]].second;
      positives += y;
      ++rows;
    }
    std::map<std::string, bool> above;
    for (const auto& [v, k] : counts) {
      if (k.second >= 300) above[v] = static_cast<double>(k.first) / k.second > static_cast<double>(positives) / rows;
    }
    return above;
  };
  auto agree = [](const std::map<std::string, bool>& x, const std::map<std::string, bool>& y) {
    int both = 0, same = 0;
    for (const auto& [v, b] : x) {
      if (auto it = y.find(v); it != y.end()) {
        ++both;
        same += it->second == b;
      }
    }
    EXPECT_GE(both, 8);
    return both > 0 ? static_cast<double>(same) / both : 0.0;
  };
  const auto m1 = above_mean(1, 1);
  const double same = agree(m1, above_mean(2, 1)), other = agree(m1, above_mean(1, 7));
  std::printf("criteo C6 values on the same side of the mean rate: same model %.2f, other model %.2f\n", same, other);
  EXPECT_GE(same, 0.75);
  EXPECT_LE(other, 0.65);
}

}  // namespace
}  // namespace shardwild

namespace shardwild {
namespace {

// Several files, compressed or not, hold exactly the rows of the one file
// (so a test of the files against the file compares the same data), named
// in order, with the same planted-model report.
TEST(DataGenTest, FilesSplitTheRowsOfOneFileAndCompress) {
  TempDir dir;
  for (const std::string kind : {"criteo", "text"}) {
    const absl::StatusOr<DataGenResult> one = GenerateData(Options(kind, 1003, dir.File(kind + "_all.tsv")));
    ASSERT_TRUE(one.ok()) << one.status();
    const std::string whole = ReadFile(dir.File(kind + "_all.tsv"));
    for (const std::string compress : {"none", "gz", "zst"}) {
      DataGenOptions o = Options(kind, 1003, dir.File(kind + "_day.tsv"));
      o.files = 4;
      o.compress = compress;
      o.threads = 2;
      const absl::StatusOr<DataGenResult> r = GenerateData(o);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->bayes_metric, one->bayes_metric);
      EXPECT_EQ(r->positive_rate, one->positive_rate);
      ASSERT_EQ(r->files.size(), 4u);
      const std::string suffix = compress == "none" ? "" : compress == "gz" ? ".gz" : ".zst";
      EXPECT_EQ(r->files[0].path, dir.File(kind + "_day-00000.tsv" + suffix));
      EXPECT_EQ(r->files[3].path, dir.File(kind + "_day-00003.tsv" + suffix));
      std::string joined;
      int64_t rows = 0, bytes = 0;
      for (const DataGenResult::File& f : r->files) {
        const std::string raw = ReadFile(f.path);
        EXPECT_EQ(static_cast<int64_t>(raw.size()), f.bytes);
        EXPECT_EQ(DetectCompression(raw), *ParseCompression(compress)) << f.path;
        absl::StatusOr<std::string> text = Decompress(raw, DetectCompression(raw), f.path);
        ASSERT_TRUE(text.ok()) << text.status();
        EXPECT_EQ(static_cast<int64_t>(Lines(*text).size()), f.rows);
        joined += *text;
        rows += f.rows;
        bytes += f.bytes;
      }
      EXPECT_EQ(rows, 1003);
      EXPECT_EQ(bytes, r->bytes);
      EXPECT_TRUE(joined == whole) << kind << " " << compress;
    }
  }
  DataGenOptions o = Options("criteo", 10, dir.File("x.tsv"));
  o.compress = "gz";
  EXPECT_EQ(o.Paths(), std::vector<std::string>{dir.File("x.tsv.gz")});
  o.out = dir.File("x.tsv.gz");
  EXPECT_EQ(o.Paths(), std::vector<std::string>{dir.File("x.tsv.gz")});
  o.files = 11;
  absl::StatusOr<DataGenResult> bad = GenerateData(o);
  EXPECT_NE(bad.status().message().find("files must be in [1, min(rows, 100000)], got 11"), std::string::npos);
  o.files = 2;
  o.compress = "bz2";
  bad = GenerateData(o);
  EXPECT_NE(bad.status().message().find("data gen: compression: expected gz, zst or none, got 'bz2'"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace shardwild
