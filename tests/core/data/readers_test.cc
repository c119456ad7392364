// Tests for the Criteo, libsvm, text and CSV readers: hand-written files with
// every edge case (missing fields, -1/+1 labels, multi-label text, CRLF, a
// missing final newline, empty lines), each bad-row kind under both policies
// (file:line:column under fail, counts by reason under skip), parallel
// parsing against one thread, and the binary cache.
#include "core/data/readers.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/data/dataset.h"
#include "core/io/compressed.h"
#include "core/config/options.h"
#include "gtest/gtest.h"
#include "tests/workers/test_config.h"

namespace shardwild {
namespace {

namespace fs = std::filesystem;
using testdata::TempDir;

std::string Write(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

ReadOptions Opts(DataFormat format, LabelKind labels, OnBadRow on_error = OnBadRow::kFail) {
  ReadOptions o;
  o.format = format;
  o.labels = labels;
  o.on_error = on_error;
  o.threads = 1;
  return o;
}

// A Criteo line: label, 13 I fields, 26 C fields (empty strings are missing).
std::string CriteoLine(const std::string& label, std::vector<std::string> ints, std::vector<std::string> cats) {
  ints.resize(13);
  cats.resize(26);
  std::string s = label;
  for (const std::string& i : ints) s += "\t" + i;
  for (const std::string& c : cats) s += "\t" + c;
  return s;
}

std::vector<uint64_t> Ids(const SparseField& f, int64_t r) {
  return std::vector<uint64_t>(f.ids.begin() + f.offsets[r], f.ids.begin() + f.offsets[r + 1]);
}

// ---------------------------------------------------------------------------
// Criteo

TEST(CriteoReaderTest, FieldsTransformsMissingValuesAndLineEnds) {
  TempDir dir;
  // CRLF, an empty line, -1/+1 labels, and no final newline.
  const std::string text = CriteoLine("1", {"0", "3", "", "-5"}, {"68fd1e64", "", "ABCDEF01"}) + "\r\n\r\n" +
                           CriteoLine("-1", {}, {"0", "1"}) + "\n" + CriteoLine("+1", {"9"}, {}) ;
  const std::string path = Write(dir, "a.tsv", text);
  absl::StatusOr<Dataset> d = ReadDataset(path, Opts(DataFormat::kCriteo, LabelKind::kBinary));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->count, 3);
  EXPECT_EQ(d->labels, (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(d->num_classes, 2);
  ASSERT_EQ(d->dense_dim, 13);
  EXPECT_EQ(d->dense_names[0], "I1");
  EXPECT_EQ(d->dense_names[12], "I13");
  EXPECT_FLOAT_EQ(d->dense[0], 0.0f);
  EXPECT_FLOAT_EQ(d->dense[1], std::log1p(3.0f));
  EXPECT_FLOAT_EQ(d->dense[2], 0.0f);  // missing -> 0 -> log1p(0)
  EXPECT_FLOAT_EQ(d->dense[3], 0.0f);  // negative clamped to 0 (DLRM)
  EXPECT_FLOAT_EQ(d->dense[2 * 13], std::log1p(9.0f));
  ASSERT_EQ(d->fields.size(), 26u);
  EXPECT_EQ(d->fields[0].name, "C1");
  EXPECT_EQ(Ids(d->fields[0], 0), (std::vector<uint64_t>{0x68fd1e64}));
  EXPECT_TRUE(Ids(d->fields[1], 0).empty());  // missing C2
  EXPECT_EQ(Ids(d->fields[2], 0), (std::vector<uint64_t>{0xabcdef01}));  // upper case hex
  EXPECT_EQ(Ids(d->fields[0], 1), (std::vector<uint64_t>{0}));
  EXPECT_EQ(Ids(d->fields[1], 1), (std::vector<uint64_t>{1}));
  EXPECT_TRUE(Ids(d->fields[0], 2).empty());
  EXPECT_TRUE(d->fields[0].weights.empty());
  EXPECT_EQ(d->skipped.total(), 0);

  // The other transforms.
  ReadOptions o = Opts(DataFormat::kCriteo, LabelKind::kBinary);
  o.dense_transform = DenseTransform::kLog3;
  d = ReadDataset(path, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FLOAT_EQ(d->dense[1], std::log(6.0f));
  EXPECT_FLOAT_EQ(d->dense[3], std::log(1.0f));  // -5 clamped to -2
  o.dense_transform = DenseTransform::kNone;
  d = ReadDataset(path, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FLOAT_EQ(d->dense[3], -5.0f);
}

struct BadCase {
  std::string line;      // the bad line (line 2 of the file, after one good line)
  std::string reason;    // the skip reason
  int column;            // 1-based column in the fail message
  std::string message;   // part of the fail message
};

void ExpectBadRow(DataFormat format, LabelKind labels, const std::string& good, const BadCase& c,
                  const std::string& header = "") {
  SCOPED_TRACE(c.reason + ": " + c.line);
  TempDir dir;
  const std::string path = Write(dir, "bad.txt", header + good + "\n" + c.line + "\n" + good + "\n");
  const int line = header.empty() ? 2 : 3;
  ReadOptions o = Opts(format, labels, OnBadRow::kFail);
  if (format == DataFormat::kCsv) {
    o.csv.label = "y";
    o.csv.dense = {"a"};
    o.csv.categorical = {"b"};
  }
  absl::StatusOr<Dataset> d = ReadDataset(path, o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string where = absl::StrCat(path, ":", line, ":", c.column, ": ");
  EXPECT_EQ(std::string(d.status().message()).rfind(where, 0), 0u) << d.status() << "\nwant prefix " << where;
  EXPECT_NE(d.status().message().find(c.message), std::string::npos) << d.status();
  o.on_error = OnBadRow::kSkip;
  d = ReadDataset(path, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 2);
  EXPECT_EQ(d->skipped.total(), 1);
  EXPECT_EQ(d->skipped.by_reason.count(c.reason), 1u) << c.reason;
  for (const SparseField& f : d->fields) EXPECT_EQ(f.offsets.size(), 3u);
}

TEST(CriteoReaderTest, EachBadRowKindUnderBothPolicies) {
  const std::string good = CriteoLine("0", {"1"}, {"a1"});
  // Columns: the label is column 1; I1 starts at column 3 after "0\t".
  ExpectBadRow(DataFormat::kCriteo, LabelKind::kBinary, good,
               {CriteoLine("0", {"1"}, {"a1"}) + "\textra", "wrong field count", 1, "expected 40 tab-separated fields"});
  ExpectBadRow(DataFormat::kCriteo, LabelKind::kBinary, good,
               {CriteoLine("0", {"1", "x2"}, {"a1"}), "non-numeric value", 5, "field I2: expected an integer, got 'x2'"});
  ExpectBadRow(DataFormat::kCriteo, LabelKind::kBinary, good,
               {CriteoLine("0", {"1"}, {"a1", "zz"}), "bad hex", 20,
                "field C2: expected a hex value of at most 8 digits, got 'zz'"});
  ExpectBadRow(DataFormat::kCriteo, LabelKind::kBinary, good,
               {CriteoLine("0", {"1"}, {"123456789"}), "bad hex", 17, "got '123456789'"});
  ExpectBadRow(DataFormat::kCriteo, LabelKind::kBinary, good,
               {CriteoLine("2", {"1"}, {"a1"}), "bad label", 1, "expected 0/1 or -1/+1, got '2'"});
  ExpectBadRow(DataFormat::kCriteo, LabelKind::kBinary, good, {"0\t1\t2", "wrong field count", 1, "found 3"});
}

// ---------------------------------------------------------------------------
// libsvm

TEST(LibsvmReaderTest, LabelsIndicesValuesAndComments) {
  TempDir dir;
  const std::string path = Write(dir, "a.txt", "+1 1:0.5 3 10:2e-1 # a comment\n-1\n\n0 2:1 4:-3\r\n1 7:1");
  absl::StatusOr<Dataset> d = ReadDataset(path, Opts(DataFormat::kLibsvm, LabelKind::kBinary));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->count, 4);
  EXPECT_EQ(d->labels, (std::vector<int32_t>{1, 0, 0, 1}));
  ASSERT_EQ(d->fields.size(), 1u);
  const SparseField& f = d->fields[0];
  EXPECT_EQ(f.name, "features");
  EXPECT_EQ(Ids(f, 0), (std::vector<uint64_t>{0, 2, 9}));  // 1-based on input
  EXPECT_EQ(std::vector<float>(f.weights.begin(), f.weights.begin() + 3), (std::vector<float>{0.5f, 1.0f, 0.2f}));
  EXPECT_TRUE(Ids(f, 1).empty());
  EXPECT_EQ(Ids(f, 2), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(f.weights[4], -3.0f);
  EXPECT_EQ(d->dense_dim, 0);

  // Multi-class and regression labels.
  const std::string mc = Write(dir, "mc.txt", "3 1:1\n0 2:1\n7 1:1\n");
  d = ReadDataset(mc, Opts(DataFormat::kLibsvm, LabelKind::kMultiClass));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->labels, (std::vector<int32_t>{3, 0, 7}));
  EXPECT_EQ(d->num_classes, 8);
  const std::string rg = Write(dir, "rg.txt", "2.5 1:1\n-0.25 2:1\n");
  d = ReadDataset(rg, Opts(DataFormat::kLibsvm, LabelKind::kRegression));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->labels.empty());
  EXPECT_EQ(d->targets, (std::vector<float>{2.5f, -0.25f}));
  EXPECT_EQ(d->num_classes, 0);
}

TEST(LibsvmReaderTest, EachBadRowKindUnderBothPolicies) {
  const std::string good = "1 1:1 2:0.5";
  ExpectBadRow(DataFormat::kLibsvm, LabelKind::kBinary, good, {"1 0:1", "index 0", 3, "feature indices start at 1"});
  ExpectBadRow(DataFormat::kLibsvm, LabelKind::kBinary, good,
               {"1 2:1 2:3", "unsorted indices", 7, "feature indices must increase"});
  ExpectBadRow(DataFormat::kLibsvm, LabelKind::kBinary, good, {"1 5:1 3:1", "unsorted indices", 7, "was 5"});
  ExpectBadRow(DataFormat::kLibsvm, LabelKind::kBinary, good, {"1 x:1", "non-numeric value", 3, "feature index"});
  ExpectBadRow(DataFormat::kLibsvm, LabelKind::kBinary, good, {"1 4:abc", "non-numeric value", 5, "real feature value"});
  ExpectBadRow(DataFormat::kLibsvm, LabelKind::kBinary, good, {"yes 1:1", "bad label", 1, "got 'yes'"});
  ExpectBadRow(DataFormat::kLibsvm, LabelKind::kMultiClass, good, {"-2 1:1", "bad label", 1, "class number"});
}

// ---------------------------------------------------------------------------
// text

TEST(TextReaderTest, LabelsTokensNgramsAndMultiLabel) {
  TempDir dir;
  const std::string path =
      Write(dir, "a.txt", "__label__b hello world\r\n\n__label__a __label__c __label__a hello  there\n__label__c x");
  ReadOptions o = Opts(DataFormat::kText, LabelKind::kMultiClass);
  absl::StatusOr<Dataset> d = ReadDataset(path, o);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->count, 3);
  EXPECT_EQ(d->class_names, (std::vector<std::string>{"a", "b", "c"}));  // sorted
  EXPECT_EQ(d->num_classes, 3);
  EXPECT_EQ(d->labels, (std::vector<int32_t>{1, 0, 2}));  // the first label of each record
  ASSERT_TRUE(d->multi_label());
  EXPECT_EQ(d->label_offsets, (std::vector<int64_t>{0, 1, 3, 4}));  // the repeated __label__a dropped
  EXPECT_EQ(d->label_sets, (std::vector<int32_t>{1, 0, 2, 2}));
  EXPECT_EQ(d->tokens, 5);
  ASSERT_EQ(d->fields.size(), 1u);
  EXPECT_EQ(Ids(d->fields[0], 0), (std::vector<uint64_t>{Fnv1a64("hello"), Fnv1a64("world")}));
  EXPECT_EQ(Ids(d->fields[0], 1), (std::vector<uint64_t>{Fnv1a64("hello"), Fnv1a64("there")}));
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ULL);  // FNV-1a's offset basis
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cULL);

  // Bigrams: FNV-1a of "t_i \x01 t_{i+1}", in the tokens field or their own.
  o.text.word_ngrams = 2;
  d = ReadDataset(path, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(Ids(d->fields[0], 0),
            (std::vector<uint64_t>{Fnv1a64("hello"), Fnv1a64("world"), Fnv1a64(std::string("hello\x01world"))}));
  o.text.ngrams_field = true;
  d = ReadDataset(path, o);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->fields.size(), 2u);
  EXPECT_EQ(d->fields[1].name, "ngrams");
  EXPECT_EQ(Ids(d->fields[0], 0), (std::vector<uint64_t>{Fnv1a64("hello"), Fnv1a64("world")}));
  EXPECT_EQ(Ids(d->fields[1], 0), (std::vector<uint64_t>{Fnv1a64(std::string("hello\x01world"))}));
  EXPECT_TRUE(Ids(d->fields[1], 2).empty());

  // A test set maps its labels through the training set's names.
  const std::vector<std::string> names = {"a", "b", "c", "d"};
  const std::string test = Write(dir, "t.txt", "__label__d x\n__label__a y\n");
  o = Opts(DataFormat::kText, LabelKind::kMultiClass);
  o.class_names = &names;
  d = ReadDataset(test, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->labels, (std::vector<int32_t>{3, 0}));
  EXPECT_EQ(d->class_names, names);
  EXPECT_FALSE(d->multi_label());

  // Text labels are classes: another head is an error.
  EXPECT_FALSE(ReadDataset(path, Opts(DataFormat::kText, LabelKind::kBinary)).ok());
}

TEST(TextReaderTest, EachBadRowKindUnderBothPolicies) {
  const std::string good = "__label__a x y";
  ExpectBadRow(DataFormat::kText, LabelKind::kMultiClass, good, {"x y", "no label", 1, "expected __label__<name> first"});
  ExpectBadRow(DataFormat::kText, LabelKind::kMultiClass, good, {"__label__ x", "bad label", 1, "class name"});
  // An unknown label needs a dictionary (a test set).
  TempDir dir;
  const std::vector<std::string> names = {"a"};
  const std::string path = Write(dir, "t.txt", "__label__a x\n__label__zz y\n");
  ReadOptions o = Opts(DataFormat::kText, LabelKind::kMultiClass);
  o.class_names = &names;
  absl::StatusOr<Dataset> d = ReadDataset(path, o);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(path + ":2:1: label: expected a class of the training data, got '__label__zz'"), std::string::npos)
      << d.status();
  o.on_error = OnBadRow::kSkip;
  d = ReadDataset(path, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 1);
  EXPECT_EQ(d->skipped.by_reason.at("unknown label"), 1);
}

// ---------------------------------------------------------------------------
// CSV

TEST(CsvReaderTest, ColumnsByNameQuotesAndMissingValues) {
  TempDir dir;
  const std::string path = Write(dir, "a.csv",
                                 "id,b,a,y\r\n"
                                 "1,\"x,\"\"y\"\"\",2.5,1\n"
                                 "\n"
                                 "2,,,0\n"
                                 "3,plain,-1,1");
  ReadOptions o = Opts(DataFormat::kCsv, LabelKind::kBinary);
  o.csv.label = "y";
  o.csv.dense = {"a", "id"};
  o.csv.categorical = {"b"};
  o.dense_transform = DenseTransform::kNone;
  absl::StatusOr<Dataset> d = ReadDataset(path, o);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->count, 3);
  EXPECT_EQ(d->labels, (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(d->dense_dim, 2);
  EXPECT_EQ(d->dense_names, (std::vector<std::string>{"a", "id"}));
  EXPECT_EQ(d->dense, (std::vector<float>{2.5f, 1, 0, 2, -1, 3}));
  ASSERT_EQ(d->fields.size(), 1u);
  EXPECT_EQ(d->fields[0].name, "b");
  EXPECT_EQ(Ids(d->fields[0], 0), (std::vector<uint64_t>{Fnv1a64("x,\"y\"")}));
  EXPECT_TRUE(Ids(d->fields[0], 1).empty());
  EXPECT_EQ(Ids(d->fields[0], 2), (std::vector<uint64_t>{Fnv1a64("plain")}));

  // A column the header lacks.
  o.csv.dense = {"a", "nope"};
  d = ReadDataset(path, o);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("data.csv.dense: the header has no column 'nope'"), std::string::npos)
      << d.status();
}

TEST(CsvReaderTest, EachBadRowKindUnderBothPolicies) {
  const std::string header = "y,a,b\n";
  const std::string good = "1,0.5,x";
  ExpectBadRow(DataFormat::kCsv, LabelKind::kBinary, good, {"1,0.5", "wrong field count", 1, "expected 3 fields"},
               header);
  ExpectBadRow(DataFormat::kCsv, LabelKind::kBinary, good, {"1,abc,x", "non-numeric value", 3, "column a"}, header);
  ExpectBadRow(DataFormat::kCsv, LabelKind::kBinary, good, {"1,0.5,\"x", "bad quoting", 1, "quoted"}, header);
  ExpectBadRow(DataFormat::kCsv, LabelKind::kBinary, good, {"5,0.5,x", "bad label", 1, "got '5'"}, header);
}

// ---------------------------------------------------------------------------
// Parallel parsing, max_records, the cache

std::string BigText(int64_t rows, int bad_at1, int bad_at2) {
  std::string s;
  for (int64_t r = 0; r < rows; ++r) {
    if (r == bad_at1 || r == bad_at2) {
      s += "no_label_here x\n";
      continue;
    }
    absl::StrAppend(&s, "__label__c", r % 7, (r % 5 == 0) ? absl::StrCat(" __label__c", (r + 1) % 7) : "", " tok",
                    r % 1000, " word", r % 333, " w", r, "\n");
    if (r % 97 == 0) s += "\n";
  }
  return s;
}

void ExpectSameDataset(const Dataset& a, const Dataset& b) {
  EXPECT_EQ(a.count, b.count);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_EQ(a.num_classes, b.num_classes);
  EXPECT_EQ(a.class_names, b.class_names);
  EXPECT_EQ(a.label_offsets, b.label_offsets);
  EXPECT_EQ(a.label_sets, b.label_sets);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.skipped.by_reason, b.skipped.by_reason);
  ASSERT_EQ(a.fields.size(), b.fields.size());
  for (size_t f = 0; f < a.fields.size(); ++f) {
    EXPECT_EQ(a.fields[f].offsets, b.fields[f].offsets);
    EXPECT_EQ(a.fields[f].ids, b.fields[f].ids);
    EXPECT_EQ(a.fields[f].weights, b.fields[f].weights);
  }
}

TEST(ReaderParallelTest, ChunksGiveTheSameDatasetAndTheFirstBadRow) {
  TempDir dir;
  const std::string text = BigText(120000, -1, -1);
  ASSERT_GT(text.size(), 2u << 20);
  const std::string path = Write(dir, "big.txt", text);
  ReadOptions o = Opts(DataFormat::kText, LabelKind::kMultiClass);
  ReadStats one, four;
  absl::StatusOr<Dataset> a = ReadDataset(path, o, &one);
  o.threads = 4;
  absl::StatusOr<Dataset> b = ReadDataset(path, o, &four);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(one.chunks, 1);
  EXPECT_EQ(four.chunks, 4);
  EXPECT_EQ(a->count, 120000);
  ExpectSameDataset(*a, *b);

  // max_records keeps the first N good records, whatever the chunks.
  o.max_records = 70001;
  absl::StatusOr<Dataset> c = ReadDataset(path, o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->count, 70001);
  EXPECT_EQ(c->labels, std::vector<int32_t>(a->labels.begin(), a->labels.begin() + 70001));
  EXPECT_EQ(c->fields[0].offsets.back(), a->fields[0].offsets[70001]);

  // Two bad rows in different chunks: the first in the file is reported,
  // with its line number counted across chunk boundaries (empty lines too).
  const int first_bad = 90000, second_bad = 100000;
  const std::string bad_text = BigText(120000, first_bad, second_bad);
  const std::string bad = Write(dir, "bad.txt", bad_text);
  int64_t line = 1;
  {
    // The file line of record `first_bad`.
    size_t pos = 0;
    for (int64_t r = 0; r < first_bad; ++r) {
      const size_t nl = bad_text.find('\n', pos);
      pos = nl + 1;
      ++line;
      if (r % 97 == 0) {
        pos = bad_text.find('\n', pos) + 1;
        ++line;
      }
    }
  }
  o.max_records = 0;
  absl::StatusOr<Dataset> e = ReadDataset(bad, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find(absl::StrCat(bad, ":", line, ":1: expected __label__<name> first")),
            std::string::npos)
      << e.status() << " (want line " << line << ")";
  o.threads = 1;
  absl::StatusOr<Dataset> e1 = ReadDataset(bad, o);
  ASSERT_FALSE(e1.ok());
  EXPECT_EQ(e1.status().message(), e.status().message());
  o.on_error = OnBadRow::kSkip;
  o.threads = 3;
  absl::StatusOr<Dataset> s = ReadDataset(bad, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->count, 120000 - 2);
  EXPECT_EQ(s->skipped.by_reason.at("no label"), 2);
}

// A Criteo file of `rows` records with every kind of line: missing I and C
// values, -1/+1 labels, negative integers, upper-case hex, CRLF line ends and
// empty lines, and no final newline. Records listed in `bad` get a bad hex in C3.
std::string CriteoFile(int rows, const std::vector<int>& bad = {}) {
  std::string s;
  uint64_t x = 12345;
  auto next = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  for (int r = 0; r < rows; ++r) {
    std::vector<std::string> ints, cats;
    for (int j = 0; j < 13; ++j) ints.push_back(next() % 5 == 0 ? "" : std::to_string(static_cast<int>(next() % 3000) - 3));
    for (int j = 0; j < 26; ++j) {
      const uint64_t v = next();
      cats.push_back(v % 7 == 0 ? "" : absl::StrCat(absl::Hex(v & 0xffffffff)));
    }
    if (r % 11 == 0) cats[4] = "ABCDEF12";
    if (std::find(bad.begin(), bad.end(), r) != bad.end()) cats[2] = "zz12";
    const char* labels[] = {"0", "1", "-1", "+1"};
    s += CriteoLine(labels[next() % 4], ints, cats);
    if (r + 1 < rows) s += r % 13 == 0 ? "\r\n" : "\n";
    if (r % 101 == 0) s += "\n";
  }
  return s;
}

// The 1-based file line of record `record` of CriteoFile (empty lines counted).
int64_t CriteoFileLine(int record) {
  int64_t line = 1;
  for (int r = 0; r < record; ++r) line += r % 101 == 0 ? 2 : 1;
  return line;
}

TEST(ReaderParallelTest, CriteoChunksGiveTheSameDatasetAsOneThread) {
  TempDir dir;
  const std::string text = CriteoFile(4000);
  const std::string path = Write(dir, "c.tsv", text);
  ReadOptions o = Opts(DataFormat::kCriteo, LabelKind::kBinary);
  ReadStats st1, st4;
  absl::StatusOr<Dataset> a = ReadDataset(path, o, &st1);
  o.threads = 4;
  absl::StatusOr<Dataset> b = ReadDataset(path, o, &st4);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(st1.chunks, 1);
  EXPECT_EQ(st4.chunks, 4) << text.size() << " bytes";
  EXPECT_EQ(a->count, 4000);
  EXPECT_EQ(a->skipped.total(), 0);  // empty lines are not bad rows
  ExpectSameDataset(*a, *b);
  // ParseBuffer parses the same on one thread.
  absl::StatusOr<Dataset> c = ParseBuffer(text, "c.tsv", 1, Opts(DataFormat::kCriteo, LabelKind::kBinary));
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectSameDataset(*a, *c);
}

TEST(ReaderParallelTest, CriteoFirstBadRowInFileOrder) {
  TempDir dir;
  ReadOptions o = Opts(DataFormat::kCriteo, LabelKind::kBinary);
  o.threads = 4;
  const std::string got = "field C3: expected a hex value of at most 8 digits, got 'zz12'";
  // Only a late chunk has a bad row.
  {
    const std::string path = Write(dir, "late.tsv", CriteoFile(4000, {3500}));
    ReadStats st;
    absl::StatusOr<Dataset> d = ReadDataset(path, o, &st);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(st.chunks, 4);
    const std::string text = CriteoFile(4000, {3500});
    // The column of C3: after the label and 15 tabs-separated fields.
    size_t line_start = 0;
    for (int64_t l = 1; l < CriteoFileLine(3500); ++l) line_start = text.find('\n', line_start) + 1;
    const size_t col = text.find("zz12", line_start) - line_start + 1;
    EXPECT_EQ(d.status().message(), absl::StrCat(path, ":", CriteoFileLine(3500), ":", col, ": ", got));
  }
  // Two chunks with bad rows: the earlier one wins, whatever the threads.
  const std::string path = Write(dir, "two.tsv", CriteoFile(4000, {1500, 3900}));
  for (int threads : {1, 2, 4}) {
    o.threads = threads;
    o.on_error = OnBadRow::kFail;
    absl::StatusOr<Dataset> d = ReadDataset(path, o);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(std::string(d.status().message()).rfind(absl::StrCat(path, ":", CriteoFileLine(1500), ":"), 0), 0u)
        << d.status();
    EXPECT_NE(d.status().message().find(got), std::string::npos) << d.status();
    o.on_error = OnBadRow::kSkip;
    d = ReadDataset(path, o);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->count, 3998);
    EXPECT_EQ(d->skipped.by_reason, (std::map<std::string, int64_t>{{"bad hex", 2}}));
  }
  // max_records counts good records only.
  o.max_records = 1600;
  absl::StatusOr<Dataset> d = ReadDataset(path, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 1600);
  for (const SparseField& f : d->fields) EXPECT_EQ(f.offsets.size(), 1601u);
  EXPECT_EQ(d->dense.size(), 1600u * 13);
}

TEST(ParseBufferTest, LinesCountFromTheGivenFirstLine) {
  ReadOptions o = Opts(DataFormat::kLibsvm, LabelKind::kBinary);
  absl::StatusOr<Dataset> d = ParseBuffer("1 1:1\n\n1 0:1\n", "part.txt", 41, o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), "part.txt:43:3: feature indices start at 1, got '0:1'");
  o = Opts(DataFormat::kCsv, LabelKind::kBinary);
  o.csv.label = "y";
  d = ParseBuffer("\ny\n1\n2\n", "p.csv", 10, o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), "p.csv:13:1: label: expected 0/1 or -1/+1, got '2'");
  // kIdx is not a text format.
  o.format = DataFormat::kIdx;
  EXPECT_EQ(ParseBuffer("", "x", 1, o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ReaderNumbersTest, NothingIsSilentlyCoerced) {
  // A sign after '+', values beyond float, inf/nan and hex floats are bad rows.
  ReadOptions o = Opts(DataFormat::kLibsvm, LabelKind::kRegression, OnBadRow::kSkip);
  absl::StatusOr<Dataset> d =
      ParseBuffer("1 1:+-2\n1 1:1e39\n1e39 1:1\n+-1 1:1\n1 1:inf\nnan 1:1\n1 1:0x10\n1 +-1:1\n1 1: 2\n"
                  "+2.5 1:-1e38 2:+3 3:1e-3\n",
                  "n.txt", 1, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 1);
  EXPECT_EQ(d->targets, (std::vector<float>{2.5f}));
  EXPECT_EQ(d->fields[0].weights, (std::vector<float>{-1e38f, 3.0f, 1e-3f}));
  EXPECT_EQ(d->skipped.total(), 9);
  EXPECT_EQ(d->skipped.by_reason.at("bad label"), 3);
  // Criteo integers: no fractions, no "+-".
  o = Opts(DataFormat::kCriteo, LabelKind::kBinary, OnBadRow::kSkip);
  d = ParseBuffer(CriteoLine("1", {"1.5"}, {}) + "\n" + CriteoLine("1", {"+-3"}, {}) + "\n" +
                      CriteoLine("1", {"+3", "-3"}, {"0x12"}) + "\n" + CriteoLine("1", {"+3", "-3"}, {"-12"}) + "\n",
                  "c.tsv", 1, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 0);
  EXPECT_EQ(d->skipped.by_reason, (std::map<std::string, int64_t>{{"bad hex", 2}, {"non-numeric value", 2}}));
  // CSV dense values beyond float are bad; with a log transform they are fine.
  o = Opts(DataFormat::kCsv, LabelKind::kRegression, OnBadRow::kSkip);
  o.csv.label = "y";
  o.csv.dense = {"a"};
  o.dense_transform = DenseTransform::kNone;
  d = ParseBuffer("y,a\n1,1e300\n2,3\n", "a.csv", 1, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->dense, (std::vector<float>{3.0f}));
  EXPECT_EQ(d->skipped.by_reason.at("non-numeric value"), 1);
  o.dense_transform = DenseTransform::kLog1p;
  d = ParseBuffer("y,a\n1,1e300\n", "a.csv", 1, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FLOAT_EQ(d->dense[0], static_cast<float>(std::log1p(1e300)));
}

TEST(CsvReaderTest, DelimiterQuotedHeaderLabelKindsAndWhitespaceLines) {
  ReadOptions o = Opts(DataFormat::kCsv, LabelKind::kMultiClass);
  o.csv.label = "the label";
  o.csv.dense = {"x"};
  o.csv.categorical = {"c;d", "e"};
  o.csv.delimiter = ';';
  o.dense_transform = DenseTransform::kLog3;
  absl::StatusOr<Dataset> d = ParseBuffer(
      "\"the label\";x;\"c;d\";e\r\n"
      "3;-5;\"a;b\";\"\"\r\n"
      "\r\n"
      "0;;\"\";q\r\n"
      "2;1;\"\"\"\";q",
      "s.csv", 1, o);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->count, 3);
  EXPECT_EQ(d->labels, (std::vector<int32_t>{3, 0, 2}));
  EXPECT_EQ(d->num_classes, 4);
  EXPECT_EQ(d->dense_names, (std::vector<std::string>{"x"}));
  EXPECT_FLOAT_EQ(d->dense[0], std::log(1.0f));  // -5 clamped to -2
  EXPECT_FLOAT_EQ(d->dense[1], std::log(3.0f));  // missing = 0
  EXPECT_FLOAT_EQ(d->dense[2], std::log(4.0f));
  ASSERT_EQ(d->fields.size(), 2u);
  EXPECT_EQ(d->fields[0].name, "c;d");
  EXPECT_EQ(d->fields[0].offsets, (std::vector<int64_t>{0, 1, 1, 2}));  // "" = no id
  EXPECT_EQ(d->fields[0].ids, (std::vector<uint64_t>{Fnv1a64("a;b"), Fnv1a64("\"")}));
  EXPECT_EQ(d->fields[1].offsets, (std::vector<int64_t>{0, 0, 1, 2}));
  EXPECT_EQ(d->fields[1].ids, (std::vector<uint64_t>{Fnv1a64("q"), Fnv1a64("q")}));
  EXPECT_TRUE(d->fields[0].weights.empty());

  // Regression labels, and a header that names a missing label column.
  o = Opts(DataFormat::kCsv, LabelKind::kRegression);
  o.csv.label = "t";
  d = ParseBuffer("t,u\n-1.5,1\n", "r.csv", 1, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->targets, (std::vector<float>{-1.5f}));
  EXPECT_TRUE(d->labels.empty());
  o.csv.label = "nope";
  d = ParseBuffer("t,u\n-1.5,1\n", "r.csv", 1, o);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("data.csv.label: the header has no column 'nope'"), std::string::npos)
      << d.status();
}

TEST(TextReaderTest, SingleLabelAfterMaxRecordsAndTokensCount) {
  // Multi-label arrays only when a kept record has several labels.
  ReadOptions o = Opts(DataFormat::kText, LabelKind::kMultiClass);
  o.max_records = 2;
  absl::StatusOr<Dataset> d = ParseBuffer("__label__x a b c\n__label__y d\n__label__x __label__y e\n", "t", 1, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 2);
  EXPECT_FALSE(d->multi_label());
  EXPECT_EQ(d->class_names, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(d->labels, (std::vector<int32_t>{0, 1}));
  // Skipped rows' tokens are not counted.
  o = Opts(DataFormat::kText, LabelKind::kMultiClass, OnBadRow::kSkip);
  d = ParseBuffer("__label__x a b c\nno label\n__label__x\n", "t", 1, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 2);
  EXPECT_EQ(d->tokens, 3);
  EXPECT_EQ(d->fields[0].offsets, (std::vector<int64_t>{0, 3, 3}));  // a record with no tokens
  EXPECT_EQ(d->skipped.by_reason.at("no label"), 1);
}

TEST(ReaderCacheTest, UsedWhileValidRewrittenOtherwise) {
  TempDir dir;
  const std::string path = Write(dir, "a.tsv", CriteoLine("1", {"4"}, {"ff"}) + "\n" + CriteoLine("0", {}, {"1"}) + "\n");
  ReadOptions o = Opts(DataFormat::kCriteo, LabelKind::kBinary);
  o.cache = true;
  ReadStats st;
  absl::StatusOr<Dataset> a = ReadDataset(path, o, &st);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(st.from_cache);
  EXPECT_TRUE(st.cache_written);
  EXPECT_EQ(st.cache_path, path + ".swcache");
  ASSERT_TRUE(fs::exists(st.cache_path));
  absl::StatusOr<Dataset> b = ReadDataset(path, o, &st);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(st.from_cache);
  ExpectSameDataset(*a, *b);

  // Another parse option: parsed again.
  o.dense_transform = DenseTransform::kNone;
  b = ReadDataset(path, o, &st);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(st.from_cache);
  EXPECT_FLOAT_EQ(b->dense[0], 4.0f);
  b = ReadDataset(path, o, &st);
  EXPECT_TRUE(st.from_cache);

  // The source changes (new mtime and size): parsed again.
  Write(dir, "a.tsv", CriteoLine("0", {"7"}, {"ff"}) + "\n");
  b = ReadDataset(path, o, &st);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(st.from_cache);
  EXPECT_EQ(b->count, 1);
  EXPECT_FLOAT_EQ(b->dense[0], 7.0f);

  // A damaged cache is ignored and rewritten.
  {
    std::fstream f(st.cache_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  b = ReadDataset(path, o, &st);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(st.from_cache);
  EXPECT_TRUE(st.cache_written);
  EXPECT_FLOAT_EQ(b->dense[0], 7.0f);
  fs::resize_file(st.cache_path, 20);  // truncated inside the header
  b = ReadDataset(path, o, &st);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(st.from_cache);
  b = ReadDataset(path, o, &st);
  EXPECT_TRUE(st.from_cache);
  // Truncated inside the payload, and a byte after the payload: the payload
  // must run exactly to the file's end.
  const uintmax_t whole = fs::file_size(st.cache_path);
  fs::resize_file(st.cache_path, whole - 5);
  b = ReadDataset(path, o, &st);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(st.from_cache);
  EXPECT_EQ(fs::file_size(st.cache_path), whole);  // rewritten
  {
    std::ofstream f(st.cache_path, std::ios::app | std::ios::binary);
    f.put('\0');
  }
  b = ReadDataset(path, o, &st);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(st.from_cache);
  EXPECT_EQ(fs::file_size(st.cache_path), whole);
  b = ReadDataset(path, o, &st);
  EXPECT_TRUE(st.from_cache);
  EXPECT_FLOAT_EQ(b->dense[0], 7.0f);

  // cache_dir.
  o.cache_dir = dir.path() + "/cache";
  fs::create_directory(o.cache_dir);
  b = ReadDataset(path, o, &st);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(st.cache_path, o.cache_dir + "/a.tsv.swcache");
  EXPECT_TRUE(fs::exists(st.cache_path));
}

// A cache's arrays of 64 KiB or more are copied on several threads once
// its payload's structure is read, each array whole by one of them: a data
// set whose ids, weights, offsets and labels are all that large, and some
// arrays that are not (its dense part is empty), reads back from the cache
// as it was parsed, on 1, 2 and 7 threads. A damaged byte in one of those
// arrays is still caught (and the file parsed again).
TEST(ReaderCacheTest, LargeArraysReadBackOnSeveralThreads) {
  TempDir dir;
  std::string text;
  uint32_t x = 12345;
  auto next = [&x] { return x = x * 1664525u + 1013904223u; };
  constexpr int kRecords = 20000;
  for (int r = 0; r < kRecords; ++r) {
    absl::StrAppend(&text, next() % 2);
    const int n = 1 + static_cast<int>(next() % 9);
    int index = 0;
    for (int k = 0; k < n; ++k) {
      index += 1 + static_cast<int>(next() % 1000);
      absl::StrAppend(&text, " ", index, ":", next() % 100, ".", next() % 10);
    }
    text += "\n";
  }
  const std::string path = Write(dir, "big.svm", text);
  ReadOptions o = Opts(DataFormat::kLibsvm, LabelKind::kBinary);
  o.cache = true;
  ReadStats st;
  const absl::StatusOr<Dataset> parsed = ReadDataset(path, o, &st);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(st.cache_written);
  ASSERT_EQ(parsed->count, kRecords);
  ASSERT_GE(parsed->fields[0].offsets.size() * sizeof(int64_t), size_t{64} << 10);
  ASSERT_GE(parsed->labels.size() * sizeof(int32_t), size_t{64} << 10);
  for (int threads : {1, 2, 7}) {
    o.threads = threads;
    const absl::StatusOr<Dataset> cached = ReadDataset(path, o, &st);
    ASSERT_TRUE(cached.ok()) << cached.status();
    EXPECT_TRUE(st.from_cache) << threads;
    ExpectSameDataset(*parsed, *cached);
  }
  {
    std::fstream f(st.cache_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(st.cache_path) / 2));
    f.put('\x55');
  }
  const absl::StatusOr<Dataset> again = ReadDataset(path, o, &st);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(st.from_cache);
  ExpectSameDataset(*parsed, *again);
}

TEST(ReaderCacheTest, MtimeAndEveryResultOptionInvalidate) {
  TempDir dir;
  const std::string path = Write(dir, "t.txt", "__label__a x y\n__label__b y z\n");
  ReadOptions o = Opts(DataFormat::kText, LabelKind::kMultiClass);
  o.cache = true;
  ReadStats st;
  ASSERT_TRUE(ReadDataset(path, o, &st).ok());
  ASSERT_TRUE(st.cache_written);
  ASSERT_TRUE(ReadDataset(path, o, &st).ok());
  EXPECT_TRUE(st.from_cache);
  // Touched (same size and bytes, new mtime): parsed again, then cached again.
  fs::last_write_time(path, fs::last_write_time(path) + std::chrono::seconds(5));
  ASSERT_TRUE(ReadDataset(path, o, &st).ok());
  EXPECT_FALSE(st.from_cache);
  ASSERT_TRUE(ReadDataset(path, o, &st).ok());
  EXPECT_TRUE(st.from_cache);
  // Each option that changes the result misses the cache; threads don't.
  const std::vector<std::string> names = {"a", "b", "c"};
  std::vector<std::function<void(ReadOptions*)>> changes = {
      [](ReadOptions* x) { x->text.word_ngrams = 2; },
      [](ReadOptions* x) { x->text.word_ngrams = 2, x->text.ngrams_field = true; },
      [](ReadOptions* x) { x->max_records = 1; },
      [](ReadOptions* x) { x->on_error = OnBadRow::kSkip; },
      [&](ReadOptions* x) { x->class_names = &names; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    SCOPED_TRACE(i);
    ReadOptions changed = o;
    changes[i](&changed);
    absl::StatusOr<Dataset> d = ReadDataset(path, changed, &st);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_FALSE(st.from_cache);
    d = ReadDataset(path, changed, &st);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(st.from_cache);
  }
  // One cache file per source: the last options' data set is in it.
  absl::StatusOr<Dataset> d = ReadDataset(path, o, &st);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(st.from_cache);
  ReadOptions threads = o;
  threads.threads = 3;
  d = ReadDataset(path, threads, &st);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(st.from_cache);
  EXPECT_EQ(d->class_names, (std::vector<std::string>{"a", "b"}));
  // A cache that can't be written is not an error.
  o.cache_dir = dir.path() + "/missing";
  d = ReadDataset(path, o, &st);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(st.cache_written);
  // A failed parse writes no cache.
  const std::string bad = Write(dir, "bad.txt", "nolabel\n");
  o.cache_dir.clear();
  EXPECT_FALSE(ReadDataset(bad, o, &st).ok());
  EXPECT_FALSE(fs::exists(bad + ".swcache"));
}

TEST(ReaderErrorsTest, MissingFileAndBadOptions) {
  absl::StatusOr<Dataset> d = ReadDataset("/nonexistent/x.tsv", Opts(DataFormat::kCriteo, LabelKind::kBinary));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(d.status().message().find("/nonexistent/x.tsv"), std::string::npos);
  TempDir dir;
  const std::string path = Write(dir, "a.csv", "y\n1\n");
  ReadOptions o = Opts(DataFormat::kCsv, LabelKind::kBinary);
  d = ReadDataset(path, o);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("data.csv.label"), std::string::npos) << d.status();
  // An empty CSV has no header.
  o.csv.label = "y";
  d = ReadDataset(Write(dir, "e.csv", "\n\n"), o);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("header"), std::string::npos) << d.status();
  // An empty data file is an empty data set.
  d = ReadDataset(Write(dir, "e.tsv", ""), Opts(DataFormat::kCriteo, LabelKind::kBinary));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 0);
}

// A class named only on rows that are skipped is no class: no record has it.
TEST(TextReaderTest, ASkippedRowNamesNoClass) {
  ReadOptions o = Opts(DataFormat::kText, LabelKind::kMultiClass, OnBadRow::kSkip);
  // Line 2 names zz, then has an empty label: skipped.
  absl::StatusOr<Dataset> d =
      ParseBuffer("__label__b x\n__label__zz __label__ y\n__label__a __label__b z\n", "t.txt", 1, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 2);
  EXPECT_EQ(d->class_names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(d->num_classes, 2);
  EXPECT_EQ(d->labels, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(d->label_offsets, (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(d->label_sets, (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(d->skipped.by_reason, (std::map<std::string, int64_t>{{"bad label", 1}}));
  // Named again on a kept row, it is a class.
  d = ParseBuffer("__label__b x\n__label__zz __label__ y\n__label__zz w\n", "t.txt", 1, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->class_names, (std::vector<std::string>{"b", "zz"}));
  EXPECT_EQ(d->labels, (std::vector<int32_t>{0, 1}));
  EXPECT_FALSE(d->multi_label());
}

// svmlight files may have comment lines; like blank lines they are empty
// lines, not rows without a label (scikit-learn reads them so too).
TEST(LibsvmReaderTest, CommentAndBlankLinesAreEmptyLines) {
  ReadOptions o = Opts(DataFormat::kLibsvm, LabelKind::kBinary);
  absl::StatusOr<Dataset> d =
      ParseBuffer("# written by hand\n1 1:1 # note\n \t \n  # indented\r\n0 2:0.5\n#", "a.svm", 1, o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count, 2);
  EXPECT_EQ(d->labels, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(d->fields[0].offsets, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(d->fields[0].ids, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(d->fields[0].weights, (std::vector<float>{1.0f, 0.5f}));
  EXPECT_EQ(d->skipped.total(), 0);
  // They still count as lines.
  d = ParseBuffer("# c\n \n1 0:1\n", "a.svm", 1, o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), "a.svm:3:3: feature indices start at 1, got '0:1'");
}

}  // namespace
}  // namespace shardwild

// ---------------------------------------------------------------------------
// Compressed files and several files.

namespace shardwild {
namespace {

std::string Compressed(const std::string& text, Compression c) {
  absl::StatusOr<std::string> b = CompressBlock(text, c);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *b : "";
}

// A gzip or zstd file reads as its text does (told by its bytes, not its
// name), from the cache too; a bad row names the compressed file and the line
// in its text.
TEST(CompressedReaderTest, GzipAndZstdReadAsTheirText) {
  TempDir dir;
  const std::string text = CriteoFile(900);
  ReadOptions o = Opts(DataFormat::kCriteo, LabelKind::kBinary);
  o.threads = 3;
  const absl::StatusOr<Dataset> plain = ReadDataset(Write(dir, "plain.tsv", text), o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (Compression c : {Compression::kGzip, Compression::kZstd}) {
    // Three blocks (members / frames), and a misleading name.
    const std::string bytes = Compressed(text.substr(0, 30000), c) + Compressed(text.substr(30000, 40000), c) +
                              Compressed(text.substr(70000), c);
    const std::string path = Write(dir, std::string("data_") + CompressionName(c) + ".tsv", bytes);
    ReadOptions co = o;
    co.cache = true;
    ReadStats st;
    absl::StatusOr<Dataset> d = ReadDataset(path, co, &st);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(st.compression, CompressionName(c));
    EXPECT_FALSE(st.from_cache);
    ExpectSameDataset(*d, *plain);
    d = ReadDataset(path, co, &st);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(st.from_cache);
    ExpectSameDataset(*d, *plain);

    const std::string bad = CriteoFile(900, {700});
    const std::string bad_path = Write(dir, std::string("bad") + CompressionSuffix(c), Compressed(bad, c));
    d = ReadDataset(bad_path, o);
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find(absl::StrCat(bad_path, ":", CriteoFileLine(700), ":")), std::string::npos)
        << d.status();
    const std::string cut = Write(dir, std::string("cut") + CompressionSuffix(c), bytes.substr(0, bytes.size() - 50));
    d = ReadDataset(cut, o);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find(cut + ": " + CompressionName(c) + ": "), std::string::npos) << d.status();
  }
}

// Several files (a list, or globs) read as their concatenation does;
// max_records counts over all of them; skipped rows are also counted per
// file.
TEST(MultiFileReaderTest, FilesJoinAsTheirConcatenation) {
  TempDir dir;
  std::vector<std::string> lines;
  {
    const std::string text = CriteoFile(1000, {10, 510, 720});
    size_t at = 0;
    while (at < text.size()) {
      size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size() - 1;
      lines.push_back(text.substr(at, nl + 1 - at));
      at = nl + 1;
    }
  }
  auto part = [&](size_t b, size_t e) {
    std::string s;
    for (size_t i = b; i < e; ++i) s += lines[i];
    if (s.back() != '\n') s += '\n';
    return s;
  };
  const size_t n = lines.size(), a = n / 3, b = 2 * n / 3;
  const std::string whole = part(0, n);
  Write(dir, "day_1.tsv", part(0, a));
  Write(dir, "day_2.tsv.gz", Compressed(part(a, b), Compression::kGzip));
  Write(dir, "day_3.tsv.zst", Compressed(part(b, n), Compression::kZstd));
  const std::string all_path = Write(dir, "all.tsv", whole);
  ReadOptions o = Opts(DataFormat::kCriteo, LabelKind::kBinary, OnBadRow::kSkip);
  const absl::StatusOr<Dataset> one = ReadDataset(all_path, o);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->skipped.total(), 3);

  const std::string spec = dir.path() + "/day_1.tsv, " + dir.path() + "/day_[23].*";
  absl::StatusOr<std::vector<std::string>> files = ExpandDataFiles(spec, "data.train");
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 3u);
  EXPECT_EQ((*files)[2], dir.path() + "/day_3.tsv.zst");
  ReadStats st;
  absl::StatusOr<Dataset> d = ReadDatasetFiles(*files, o, &st);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(st.files, 3);
  ExpectSameDataset(*d, *one);
  EXPECT_EQ(d->skipped.by_file, (std::map<std::string, int64_t>{{(*files)[0], 1}, {(*files)[1], 1}, {(*files)[2], 1}}));

  o.max_records = 500;
  d = ReadDatasetFiles(*files, o);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<Dataset> first = ReadDataset(all_path, o);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(d->count, 500);
  // (Files past the cap are not read, so their bad rows are not counted.)
  d->skipped = first->skipped = SkippedRows();
  ExpectSameDataset(*d, *first);

  // Under fail, the first bad row names its file and its line there.
  o.on_error = OnBadRow::kFail;
  o.max_records = 0;
  d = ReadDatasetFiles(std::vector<std::string>(files->begin() + 1, files->end()), o);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find((*files)[1] + ":"), std::string::npos) << d.status();

  EXPECT_NE(ExpandDataFiles(dir.path() + "/nothing_*.tsv", "data.train").status().message().find(
                "data.train: '" + dir.path() + "/nothing_*.tsv' matches no file"),
            std::string::npos);
  EXPECT_NE(ExpandDataFiles("a.tsv,,b.tsv", "data.test").status().message().find("data.test: an empty file name"),
            std::string::npos);
}

// Text labels: each file's class names merge into one sorted list, the
// labels mapped onto it, as if the files were one.
TEST(MultiFileReaderTest, TextClassNamesMergeAcrossFiles) {
  TempDir dir;
  const std::string a = "__label__zeta x y\n__label__alpha y\n__label__zeta __label__mid z\n";
  const std::string b = "__label__beta x\n__label__alpha q\n";
  const std::vector<std::string> files = {Write(dir, "a.txt", a), Write(dir, "b.txt", b)};
  const std::string whole = Write(dir, "ab.txt", a + b);
  const ReadOptions o = Opts(DataFormat::kText, LabelKind::kMultiClass);
  const absl::StatusOr<Dataset> one = ReadDataset(whole, o);
  ASSERT_TRUE(one.ok()) << one.status();
  const absl::StatusOr<Dataset> two = ReadDatasetFiles(files, o);
  ASSERT_TRUE(two.ok()) << two.status();
  ExpectSameDataset(*two, *one);
  EXPECT_EQ(two->class_names, (std::vector<std::string>{"alpha", "beta", "mid", "zeta"}));
}

TEST(MultiFileReaderTest, FilesOfAnotherShapeAreOneError) {
  TempDir dir;
  ReadOptions o = Opts(DataFormat::kCsv, LabelKind::kBinary);
  o.csv.label = "y";
  o.csv.dense = {"a"};
  const std::vector<std::string> files = {Write(dir, "1.csv", "y,a\n1,2\n"), Write(dir, "2.csv", "y,a\n0,3\n")};
  ASSERT_TRUE(ReadDatasetFiles(files, o).ok());
  o.csv.categorical = {"c"};
  const std::vector<std::string> mixed = {Write(dir, "3.csv", "y,a,c\n1,2,x\n"), Write(dir, "4.csv", "y,a\n0,3\n")};
  const absl::StatusOr<Dataset> d = ReadDatasetFiles(mixed, o);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(mixed[1]), std::string::npos) << d.status();
}

}  // namespace
}  // namespace shardwild
