// The columnar cache of streamed training: built in parts (byte ranges of a
// plain file, runs of gzip members, whole other files) and read back by
// record range, it holds exactly what ReadDatasetFiles reads, bad rows are
// reported as ReadDataset reports them, and it is reused while valid.
#include "core/data/column_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/data/data_gen.h"
#include "core/data/readers.h"
#include "core/io/compressed.h"
#include "gtest/gtest.h"
#include "tests/workers/test_config.h"

namespace shardwild {
namespace {

namespace fs = std::filesystem;
using testdata::TempDir;

std::string Write(const TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Criteo text with line `line` (1-based) made bad: an 'x' before its I1,
// a non-numeric integer field.
std::string WithBadI1(std::string text, int line) {
  size_t at = 0;
  for (int i = 1; i < line; ++i) at = text.find('\n', at) + 1;
  text.insert(text.find('\t', at) + 1, "x");
  return text;
}

// Records [a, b) of d.
Dataset Slice(const Dataset& d, int64_t a, int64_t b) {
  Dataset s;
  s.count = b - a;
  s.dense_dim = d.dense_dim;
  s.num_classes = d.num_classes;
  s.dense.assign(d.dense.begin() + a * d.dense_dim, d.dense.begin() + b * d.dense_dim);
  if (!d.labels.empty()) s.labels.assign(d.labels.begin() + a, d.labels.begin() + b);
  if (!d.targets.empty()) s.targets.assign(d.targets.begin() + a, d.targets.begin() + b);
  for (const SparseField& f : d.fields) {
    SparseField g;
    g.name = f.name;
    for (int64_t r = a; r <= b; ++r) g.offsets.push_back(f.offsets[r] - f.offsets[a]);
    g.ids.assign(f.ids.begin() + f.offsets[a], f.ids.begin() + f.offsets[b]);
    if (!f.weights.empty()) g.weights.assign(f.weights.begin() + f.offsets[a], f.weights.begin() + f.offsets[b]);
    s.fields.push_back(std::move(g));
  }
  return s;
}

void ExpectSameRecords(const Dataset& a, const Dataset& b) {
  ASSERT_EQ(a.count, b.count);
  EXPECT_EQ(a.dense_dim, b.dense_dim);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.targets, b.targets);
  ASSERT_EQ(a.fields.size(), b.fields.size());
  for (size_t f = 0; f < a.fields.size(); ++f) {
    EXPECT_EQ(a.fields[f].name, b.fields[f].name);
    EXPECT_EQ(a.fields[f].offsets, b.fields[f].offsets) << f;
    EXPECT_EQ(a.fields[f].ids, b.fields[f].ids) << f;
    EXPECT_EQ(a.fields[f].weights, b.fields[f].weights) << f;
  }
}

ReadOptions Opts(DataFormat format, const std::string& cache_dir, OnBadRow on_error = OnBadRow::kFail) {
  ReadOptions o;
  o.format = format;
  o.labels = LabelKind::kBinary;
  o.on_error = on_error;
  o.threads = 3;
  o.cache_dir = cache_dir;
  return o;
}

// Criteo rows from the generator: `rows` rows, `files` files, compressed or not.
std::vector<std::string> Generate(const TempDir& dir, const std::string& kind, int64_t rows, int files,
                                  const std::string& compress) {
  DataGenOptions g;
  g.kind = kind;
  g.rows = rows;
  g.out = dir.path() + "/" + kind + "_" + compress + ".txt";
  g.files = files;
  g.compress = compress;
  absl::StatusOr<DataGenResult> r = GenerateData(g);
  EXPECT_TRUE(r.ok()) << r.status();
  std::vector<std::string> paths;
  if (r.ok()) {
    for (const DataGenResult::File& f : r->files) paths.push_back(f.path);
  }
  return paths;
}

// Every kind of file, cut into many small parts and pieces, reads back as
// ReadDatasetFiles reads it, whole and by ranges that cross parts; a second
// open reuses the cache.
TEST(ColumnCacheTest, PartsReadBackAsTheFilesDo) {
  TempDir dir;
  ColumnCacheOptions co;
  co.part_bytes = 20000;
  co.piece_bytes = 4096;
  struct Case {
    std::string kind, compress;
    int files;
  };
  for (const Case& c : {Case{"criteo", "none", 1}, Case{"criteo", "gz", 2}, Case{"criteo", "zst", 3},
                        Case{"libsvm", "none", 2}}) {
    SCOPED_TRACE(c.kind + " " + c.compress);
    std::vector<std::string> files = Generate(dir, c.kind, 3001, c.files, c.compress);
    if (c.compress == "gz") {
      // One file of small SW members (splittable), one plain gzip stream (one part).
      std::string text = Decompress(Slurp(files[0]), Compression::kGzip, files[0]).value();
      std::string members;
      for (size_t at = 0; at < text.size(); at += 9000) members += CompressBlock(text.substr(at, 9000), Compression::kGzip).value();
      files[0] = Write(dir, "members.gz", members);
      ASSERT_EQ(std::system(("gzip -dc " + files[1] + " | gzip -c > " + dir.path() + "/plain.gz").c_str()), 0);
      files[1] = dir.path() + "/plain.gz";
    }
    const ReadOptions o = Opts(c.kind == "criteo" ? DataFormat::kCriteo : DataFormat::kLibsvm, dir.path() + "/cache");
    fs::create_directories(dir.path() + "/cache");
    const absl::StatusOr<Dataset> whole = ReadDatasetFiles(files, o);
    ASSERT_TRUE(whole.ok()) << whole.status();
    ColumnCacheStats st;
    absl::StatusOr<std::unique_ptr<ColumnCache>> cache = ColumnCache::Open(files, o, co, &st);
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_EQ(st.files_built, c.files);
    EXPECT_EQ((*cache)->records(), whole->count);
    if (c.compress != "zst") {
      EXPECT_GT(st.parts, c.files) << "the splittable files were not split";
    }
    EXPECT_EQ((*cache)->shape().dense_dim, whole->dense_dim);
    EXPECT_EQ((*cache)->shape().num_classes, whole->num_classes);
    Dataset got;
    ASSERT_TRUE((*cache)->Read(0, whole->count, &got).ok());
    ExpectSameRecords(got, *whole);
    for (const auto& [a, b] : {std::pair<int64_t, int64_t>{0, 1}, {17, 1500}, {999, 3001}, {3000, 3001}, {5, 5}}) {
      ASSERT_TRUE((*cache)->Read(a, b - a, &got).ok());
      ExpectSameRecords(got, Slice(*whole, a, b));
    }
    EXPECT_EQ((*cache)->Read(3000, 2, &got).code(), absl::StatusCode::kInvalidArgument);
    // Again: from the cache.
    cache = ColumnCache::Open(files, o, co, &st);
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_EQ(st.files_built, 0);
    EXPECT_EQ(st.files_cached, c.files);
    ASSERT_TRUE((*cache)->Read(100, 2000, &got).ok());
    ExpectSameRecords(got, Slice(*whole, 100, 2100));
    fs::remove_all(dir.path() + "/cache");
  }
}

// A bad row deep in a part is reported exactly as ReadDataset reports it
// (its file line counts every part before it); under skip the counts are
// ReadDatasetFiles', per file too.
TEST(ColumnCacheTest, BadRowsAsReadDatasetReportsThem) {
  TempDir dir;
  std::vector<std::string> files = Generate(dir, "criteo", 2000, 2, "none");
  files[1] = Write(dir, "bad.tsv", WithBadI1(Slurp(files[1]), 778));
  ColumnCacheOptions co;
  co.part_bytes = 15000;
  co.piece_bytes = 4096;
  ReadOptions o = Opts(DataFormat::kCriteo, "");
  const absl::StatusOr<Dataset> want = ReadDatasetFiles(files, o);
  ASSERT_FALSE(want.ok());
  absl::StatusOr<std::unique_ptr<ColumnCache>> cache = ColumnCache::Open(files, o, co);
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status(), want.status());
  EXPECT_NE(cache.status().message().find(files[1] + ":778:"), std::string::npos) << cache.status();
  EXPECT_FALSE(fs::exists(files[1] + ".swcols"));

  o.on_error = OnBadRow::kSkip;
  const absl::StatusOr<Dataset> skipped = ReadDatasetFiles(files, o);
  ASSERT_TRUE(skipped.ok());
  cache = ColumnCache::Open(files, o, co);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ((*cache)->records(), 1999);
  EXPECT_EQ((*cache)->shape().skipped.by_reason, skipped->skipped.by_reason);
  EXPECT_EQ((*cache)->shape().skipped.by_file, skipped->skipped.by_file);
}

// A changed source or other options rebuild the cache; max_records keeps
// the first records; a damaged column is one DataLoss naming the directory;
// text is refused.
TEST(ColumnCacheTest, StaleRebuiltDamagedRefused) {
  TempDir dir;
  const std::vector<std::string> files = Generate(dir, "criteo", 500, 1, "none");
  ReadOptions o = Opts(DataFormat::kCriteo, "");
  ColumnCacheStats st;
  ASSERT_TRUE(ColumnCache::Open(files, o, {}, &st).ok());
  EXPECT_EQ(st.files_built, 1);
  o.dense_transform = DenseTransform::kNone;
  ASSERT_TRUE(ColumnCache::Open(files, o, {}, &st).ok());
  EXPECT_EQ(st.files_built, 1);
  const std::string text = Slurp(files[0]);
  Write(dir, fs::path(files[0]).filename().string(), text + text.substr(0, text.find('\n') + 1));
  absl::StatusOr<std::unique_ptr<ColumnCache>> c = ColumnCache::Open(files, o, {}, &st);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(st.files_built, 1);
  EXPECT_EQ((*c)->records(), 501);
  o.max_records = 100;
  c = ColumnCache::Open(files, o, {}, &st);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(st.files_built, 0);
  EXPECT_EQ((*c)->records(), 100);
  o.max_records = 0;
  fs::resize_file(files[0] + ".swcols/part-00000/f3.ids", 8);
  c = ColumnCache::Open(files, o, {}, &st);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(c.status().message().find("remove " + files[0] + ".swcols"), std::string::npos) << c.status();
  o.format = DataFormat::kText;
  o.labels = LabelKind::kMultiClass;
  EXPECT_NE(ColumnCache::Open(files, o).status().message().find("data.stream: the text format"), std::string::npos);
}

// A gate a test holds a build at: the builder waits before part `at` until
// Open() is called.
class Gate {
 public:
  explicit Gate(size_t at) : at_(at) {}
  void Before(size_t part) {
    std::unique_lock<std::mutex> lock(mu_);
    if (part == at_) {
      reached_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
  }
  void WaitReached() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return reached_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  const size_t at_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool reached_ = false, open_ = false;
};

ColumnCacheExpectation Expect(const std::vector<std::string>& files, const ReadOptions& o) {
  ColumnCacheExpectation e;
  absl::StatusOr<std::optional<Dataset>> shape = PeekShape(files, o, &e.bytes_per_record);
  EXPECT_TRUE(shape.ok() && shape->has_value()) << shape.status();
  if (shape.ok() && shape->has_value()) e.shape = **shape;
  return e;
}

// Begin: the parts built so far (a prefix, in order) are readable while the
// rest is built; the records grow to exactly what Open gives; the cache is
// in place only when the whole build is over.
TEST(ColumnCacheTest, BeginReadsTheBuiltPartsWhileTheRestIsBuilt) {
  TempDir dir;
  std::vector<std::string> files = Generate(dir, "criteo", 3000, 2, "none");
  ReadOptions o = Opts(DataFormat::kCriteo, "");
  o.threads = 1;  // parts in order
  ColumnCacheOptions co;
  co.part_bytes = 30000;
  co.piece_bytes = 4096;
  const absl::StatusOr<Dataset> whole = ReadDatasetFiles(files, o);
  ASSERT_TRUE(whole.ok()) << whole.status();
  Gate gate(3);
  co.before_part = [&gate](size_t part) { gate.Before(part); };
  const ColumnCacheExpectation expected = Expect(files, o);
  EXPECT_GT(expected.bytes_per_record, 50);
  absl::StatusOr<std::unique_ptr<ColumnCache>> begun = ColumnCache::Begin(files, o, co, expected);
  ASSERT_TRUE(begun.ok()) << begun.status();
  ColumnCache& cache = **begun;
  gate.WaitReached();
  // Parts 0-2 are built; part 3 is held.
  for (int i = 0; i < 1000 && cache.records() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const int64_t ready = cache.records();
  EXPECT_GT(ready, 0);
  EXPECT_LT(ready, whole->count);
  EXPECT_FALSE(cache.all_ready());
  EXPECT_TRUE(cache.build_error().ok());
  EXPECT_GE(cache.estimated_records(), ready);
  EXPECT_LT(std::abs(cache.estimated_records() - whole->count), whole->count / 5) << cache.estimated_records();
  Dataset got;
  ASSERT_TRUE(cache.Read(0, ready, &got).ok());
  ExpectSameRecords(got, Slice(*whole, 0, ready));
  EXPECT_EQ(cache.Read(ready - 1, 2, &got).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(files[0] + ".swcols")) << "in place before the build is over";
  gate.Open();
  ColumnCacheStats st;
  ASSERT_TRUE(cache.Wait(&st).ok());
  EXPECT_TRUE(cache.all_ready());
  EXPECT_EQ(cache.records(), whole->count);
  EXPECT_EQ(cache.estimated_records(), whole->count);
  EXPECT_EQ(st.files_built, 2);
  EXPECT_GT(st.parts, 4);
  ASSERT_TRUE(cache.Read(0, whole->count, &got).ok());
  ExpectSameRecords(got, *whole);
  EXPECT_TRUE(fs::exists(files[0] + ".swcols/index.json"));
  EXPECT_TRUE(fs::exists(files[1] + ".swcols/index.json"));
  // A valid cache: everything readable at once, no build.
  begun = ColumnCache::Begin(files, o, co, expected);
  ASSERT_TRUE(begun.ok());
  EXPECT_TRUE((*begun)->all_ready());
  EXPECT_EQ((*begun)->records(), whole->count);
  ASSERT_TRUE((*begun)->Wait(&st).ok());
  EXPECT_EQ(st.files_cached, 2);
}

// Begin with a bad row: the records before the bad part stay readable, the
// build stops with exactly Open's (ReadDataset's) error, and nothing is left
// in place; a build cancelled by the cache's end leaves nothing behind.
TEST(ColumnCacheTest, BeginStopsAtABadRowAndCancelsCleanly) {
  TempDir dir;
  std::vector<std::string> files = Generate(dir, "criteo", 2000, 1, "none");
  const std::string bad = Write(dir, "bad.tsv", WithBadI1(Slurp(files[0]), 1501));
  ReadOptions o = Opts(DataFormat::kCriteo, "");
  o.threads = 2;
  ColumnCacheOptions co;
  co.part_bytes = 20000;
  co.piece_bytes = 4096;
  const absl::StatusOr<Dataset> want = ReadDatasetFiles({bad}, o);
  ASSERT_FALSE(want.ok());
  absl::StatusOr<std::unique_ptr<ColumnCache>> begun = ColumnCache::Begin({bad}, o, co, Expect({bad}, o));
  ASSERT_TRUE(begun.ok()) << begun.status();
  EXPECT_EQ((*begun)->Wait(), want.status());
  EXPECT_EQ((*begun)->build_error(), want.status());
  EXPECT_GT((*begun)->records(), 0);
  EXPECT_LT((*begun)->records(), 1500);
  EXPECT_FALSE((*begun)->all_ready());
  begun->reset();
  EXPECT_FALSE(fs::exists(bad + ".swcols"));

  // Cancelled: the cache is destroyed while part 2 is held.
  Gate gate(2);
  co.before_part = [&gate](size_t part) { gate.Before(part); };
  begun = ColumnCache::Begin(files, o, co, Expect(files, o));
  ASSERT_TRUE(begun.ok()) << begun.status();
  gate.WaitReached();
  std::thread opener([&gate] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate.Open();
  });
  begun->reset();  // cancels; waits for the held part
  opener.join();
  for (const fs::directory_entry& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".swcols"), std::string::npos) << e.path() << " left behind";
  }
}

// Builds of the same file at once (the tasks of a cluster on one machine,
// two jobs of one process): each reads what the file holds, the first cache
// put in place is kept (not removed under its readers), and nothing else is
// left behind; a stale cache in the way is replaced.
TEST(ColumnCacheTest, ConcurrentBuildsOfOneFileKeepTheFirstValidCache) {
  TempDir dir;
  const std::vector<std::string> files = Generate(dir, "criteo", 3000, 1, "none");
  ReadOptions o = Opts(DataFormat::kCriteo, "");
  ColumnCacheOptions co;
  co.part_bytes = 50000;
  co.piece_bytes = 4096;
  const absl::StatusOr<Dataset> whole = ReadDatasetFiles(files, o);
  ASSERT_TRUE(whole.ok()) << whole.status();
  // A stale cache (of other parse options) in the way.
  ReadOptions other = o;
  other.dense_transform = DenseTransform::kNone;
  ASSERT_TRUE(ColumnCache::Open(files, other, co).ok());
  std::vector<absl::StatusOr<std::unique_ptr<ColumnCache>>> caches(4);
  {
    std::vector<std::thread> threads;
    for (auto& c : caches) threads.emplace_back([&] { c = ColumnCache::Open(files, o, co); });
    for (std::thread& t : threads) t.join();
  }
  for (auto& c : caches) {
    ASSERT_TRUE(c.ok()) << c.status();
    Dataset got;
    ASSERT_TRUE((*c)->Read(0, whole->count, &got).ok());
    ExpectSameRecords(got, *whole);
  }
  ColumnCacheStats st;
  ASSERT_TRUE(ColumnCache::Open(files, o, co, &st).ok());
  EXPECT_EQ(st.files_cached, 1);
  for (const fs::directory_entry& e : fs::directory_iterator(dir.path())) {
    EXPECT_TRUE(e.path().extension() == ".txt" || e.path().extension() == ".swcols" || e.path().extension() == ".lock")
        << e.path() << " left behind";
  }
}

// PeekShape: the first lines give the shape the whole cache will have
// (what lets the store be created while the cache is built), except for
// multiclass labels.
TEST(ColumnCacheTest, PeekShapeIsTheCachesShape) {
  TempDir dir;
  for (const std::string kind : {"criteo", "libsvm"}) {
    const std::vector<std::string> files = Generate(dir, kind, 2000, 2, "gz");
    ReadOptions o = Opts(kind == "criteo" ? DataFormat::kCriteo : DataFormat::kLibsvm, "");
    absl::StatusOr<std::optional<Dataset>> peek = PeekShape(files, o);
    ASSERT_TRUE(peek.ok()) << peek.status();
    ASSERT_TRUE(peek->has_value());
    absl::StatusOr<std::unique_ptr<ColumnCache>> c = ColumnCache::Open(files, o);
    ASSERT_TRUE(c.ok());
    const Dataset& want = (*c)->shape();
    EXPECT_EQ((*peek)->dense_dim, want.dense_dim);
    EXPECT_EQ((*peek)->num_classes, want.num_classes);
    ASSERT_EQ((*peek)->fields.size(), want.fields.size());
    for (size_t f = 0; f < want.fields.size(); ++f) EXPECT_EQ((*peek)->fields[f].name, want.fields[f].name);
    o.labels = LabelKind::kMultiClass;
    peek = PeekShape(files, o);
    ASSERT_TRUE(peek.ok());
    EXPECT_FALSE(peek->has_value());
  }
  ReadOptions o = Opts(DataFormat::kCsv, "");
  o.csv.label = "y";
  o.csv.categorical = {"c", "d"};
  const std::string csv = Write(dir, "p.csv", "y,c,d\n1,a,b\n");
  absl::StatusOr<std::optional<Dataset>> peek = PeekShape({csv}, o);
  ASSERT_TRUE(peek.ok() && peek->has_value());
  ASSERT_EQ((*peek)->fields.size(), 2u);
  EXPECT_EQ((*peek)->fields[1].name, "d");
  EXPECT_EQ(PeekShape({dir.path() + "/none.csv"}, o).status().code(), absl::StatusCode::kNotFound);
}

TEST(ColumnCacheTest, CsvFilesKeepTheirHeaderForEveryPiece) {
  TempDir dir;
  std::string csv = "y,a,c\n";
  for (int i = 0; i < 3000; ++i) absl::StrAppend(&csv, i % 2, ",", i, ",v", i % 17, "\n");
  const std::vector<std::string> files = {Write(dir, "d.csv", csv), Write(dir, "d2.csv.gz", CompressBlock(csv, Compression::kGzip).value())};
  ReadOptions o = Opts(DataFormat::kCsv, "");
  o.csv.label = "y";
  o.csv.dense = {"a"};
  o.csv.categorical = {"c"};
  ColumnCacheOptions co;
  co.piece_bytes = 4096;
  const absl::StatusOr<Dataset> whole = ReadDatasetFiles(files, o);
  ASSERT_TRUE(whole.ok()) << whole.status();
  absl::StatusOr<std::unique_ptr<ColumnCache>> c = ColumnCache::Open(files, o, co);
  ASSERT_TRUE(c.ok()) << c.status();
  Dataset got;
  ASSERT_TRUE((*c)->Read(0, (*c)->records(), &got).ok());
  ExpectSameRecords(got, *whole);
}

}  // namespace
}  // namespace shardwild
