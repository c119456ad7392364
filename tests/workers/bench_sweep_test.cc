// workers/bench_sweep: grid parsing and expansion, the checks before a sweep
// runs, the interleaved order of the runs, what results.json/results.csv
// hold, the point summaries (medians, min-max, parallel efficiency) and the
// comparison of two sweeps. The bench itself is faked by a BenchRunner; the
// CLI tests run the real one.
#include "workers/bench_sweep.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / absl::StrCat("bench_sweep_test_", getpid(), "_", counter_++);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string path() const { return path_.string(); }
  std::string Sub(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The value of `--set key=...` among a bench's arguments.
std::string SetValue(const std::vector<std::string>& args, const std::string& key) {
  std::string value;
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--set" && args[i + 1].rfind(key + "=", 0) == 0) value = args[i + 1].substr(key.size() + 1);
  }
  return value;
}

// A bench whose throughput is a function of its --set values: workers x 1000
// samples/s plus `jitter` per call, so the medians are known.
struct FakeBench {
  std::vector<std::vector<std::string>> calls;
  std::vector<double> jitter;  // added to the n-th call's samples/s (0 past the end)
  int fail_at = -1;            // this call fails

  BenchRunner Runner() {
    return [this](const std::vector<std::string>& args) -> absl::StatusOr<json> {
      const int n = static_cast<int>(calls.size());
      calls.push_back(args);
      if (n == fail_at) return absl::AbortedError("train.batch_size: too large for the data");
      const int workers = std::stoi(SetValue(args, "train.workers").empty() ? "1" : SetValue(args, "train.workers"));
      const double sps = 1000.0 * workers + (n < static_cast<int>(jitter.size()) ? jitter[n] : 0.0);
      return json{{"workers", workers},
                  {"intra_op_threads", 1},
                  {"batch", 64},
                  {"precision", "f32"},
                  {"update", "hogwild"},
                  {"samples_per_s", sps},
                  {"step_ms", 64e3 / sps},
                  {"wall_s", 1.0},
                  {"peak_fraction", 0.5},
                  {"model_gflops", 10.0},
                  {"peak_gflops", 20.0},
                  {"bf16_peak_gflops", nullptr},
                  {"phases", {{"data", 0.1}, {"forward", 0.4}, {"backward", 0.5}}},
                  {"machine", {{"cpu_model", "Test CPU, 2 GHz"}, {"cores", 2}, {"numa_nodes", 1},
                               {"isa", {"AVX2"}}, {"commit", "abc123"}}}};
    };
  }
};

SweepOptions Options(const std::string& out) {
  SweepOptions o;
  o.config_path = "configs/fashion_mnist_mlp.yaml";
  o.grid = {{"train.workers", {"1", "2"}}, {"train.batch_size", {"64", "128"}}};
  o.repeats = 2;
  o.out_dir = out;
  return o;
}

absl::Status AcceptAll(const std::vector<std::string>&) { return absl::OkStatus(); }

TEST(ParseSweepAxis, KeyAndValues) {
  absl::StatusOr<SweepAxis> a = ParseSweepAxis("train.workers=1, 2,4");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->key, "train.workers");
  EXPECT_EQ(a->values, (std::vector<std::string>{"1", "2", "4"}));
}

TEST(ParseSweepAxis, RejectsMalformed) {
  for (const char* bad : {"train.workers", "=1,2", "train.workers=", "train.workers=  ", "train.workers=1,,2"}) {
    absl::StatusOr<SweepAxis> a = ParseSweepAxis(bad);
    EXPECT_FALSE(a.ok()) << bad;
    EXPECT_NE(a.status().message().find("--grid"), std::string::npos) << a.status();
  }
  EXPECT_NE(ParseSweepAxis("train.workers=").status().message().find("empty value list"), std::string::npos);
}

TEST(ExpandGrid, FirstAxisVariesSlowest) {
  const auto points = ExpandGrid({{"a", {"1", "2"}}, {"b", {"x", "y", "z"}}});
  ASSERT_EQ(points.size(), 6u);
  EXPECT_EQ(points[0], (std::vector<std::string>{"1", "x"}));
  EXPECT_EQ(points[2], (std::vector<std::string>{"1", "z"}));
  EXPECT_EQ(points[3], (std::vector<std::string>{"2", "x"}));
}

TEST(CheckSweep, RejectsBadOptionsBeforeAnythingRuns) {
  TempDir dir;
  SweepOptions o = Options(dir.Sub("out"));
  o.grid.push_back({"train.workers", {"4"}});
  EXPECT_NE(CheckSweep(o, AcceptAll).message().find("given twice"), std::string::npos);
  o = Options(dir.Sub("out"));
  o.repeats = 0;
  EXPECT_FALSE(CheckSweep(o, AcceptAll).ok());
  o = Options(dir.Sub("out"));
  o.grid.clear();
  EXPECT_FALSE(CheckSweep(o, AcceptAll).ok());
}

TEST(CheckSweep, EveryPointsConfigIsCheckedAndNamed) {
  TempDir dir;
  std::vector<std::vector<std::string>> seen;
  const absl::Status s = CheckSweep(Options(dir.Sub("out")), [&](const std::vector<std::string>& sets) {
    seen.push_back(sets);
    if (sets.back() == "train.batch_size=128" && sets.front() == "train.workers=2") {
      return absl::InvalidArgumentError("--set train.batch_size=128: too large");
    }
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("point train.workers=2 train.batch_size=128: --set train.batch_size=128: too large"),
            std::string::npos)
      << s;
  EXPECT_EQ(seen.size(), 4u);
  EXPECT_FALSE(fs::exists(dir.Sub("out")));
}

TEST(CheckSweep, OutputDirectoryRules) {
  TempDir dir;
  // Absent and empty directories are fine.
  EXPECT_TRUE(CheckSweep(Options(dir.Sub("absent")), AcceptAll).ok());
  fs::create_directories(dir.Sub("empty"));
  EXPECT_TRUE(CheckSweep(Options(dir.Sub("empty")), AcceptAll).ok());
  // A directory with other files, or a file: refused, untouched.
  fs::create_directories(dir.Sub("other"));
  std::ofstream(dir.Sub("other/notes.txt")) << "keep me";
  std::ofstream(dir.Sub("other/results.json")) << "{\"format\": \"something else\"}";
  const absl::Status s = CheckSweep(Options(dir.Sub("other")), AcceptAll);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("is not a sweep directory"), std::string::npos) << s;
  EXPECT_EQ(ReadFile(dir.Sub("other/notes.txt")), "keep me");
  std::ofstream(dir.Sub("file")) << "x";
  EXPECT_EQ(CheckSweep(Options(dir.Sub("file")), AcceptAll).code(), absl::StatusCode::kFailedPrecondition);
  // An earlier sweep's directory may be written again.
  FakeBench bench;
  ASSERT_TRUE(RunSweep(Options(dir.Sub("sweep")), bench.Runner(), nullptr).ok());
  EXPECT_TRUE(CheckSweep(Options(dir.Sub("sweep")), AcceptAll).ok());
}

TEST(RunSweep, RunsInterleavedAndWritesEveryRun) {
  TempDir dir;
  FakeBench bench;
  std::vector<SweepProgress> progress;
  absl::StatusOr<json> r =
      RunSweep(Options(dir.Sub("out")), bench.Runner(), [&](const SweepProgress& p) { progress.push_back(p); });
  ASSERT_TRUE(r.ok()) << r.status();
  // Repeat 0 of the four points, then repeat 1: never one point twice in a row.
  ASSERT_EQ(bench.calls.size(), 8u);
  const std::vector<std::pair<std::string, std::string>> expected = {{"1", "64"}, {"1", "128"}, {"2", "64"}, {"2", "128"}};
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(SetValue(bench.calls[i], "train.workers"), expected[i % 4].first) << i;
    EXPECT_EQ(SetValue(bench.calls[i], "train.batch_size"), expected[i % 4].second) << i;
    EXPECT_EQ(bench.calls[i].front(), "configs/fashion_mnist_mlp.yaml");
    EXPECT_EQ(bench.calls[i].back(), "--json");
  }
  ASSERT_EQ(progress.size(), 8u);
  EXPECT_EQ(progress.back().done, 8);
  EXPECT_EQ(progress.back().total, 8);
  EXPECT_EQ(progress[5].label, "train.workers=1 train.batch_size=128");
  EXPECT_EQ(progress.back().eta_s, 0);

  // results.json on disk equals what was returned, with the machine.
  const json on_disk = json::parse(ReadFile(dir.Sub("out/results.json")));
  EXPECT_EQ(on_disk, *r);
  EXPECT_EQ(on_disk["format"], "shardwild-bench-sweep");
  EXPECT_EQ(on_disk["runs"].size(), 8u);
  EXPECT_EQ(on_disk["points"].size(), 4u);
  EXPECT_EQ(on_disk["machine"]["commit"], "abc123");
  EXPECT_FALSE(on_disk["finished"].is_null());
  EXPECT_EQ(on_disk["runs"][6]["point"], 2);
  EXPECT_EQ(on_disk["runs"][6]["repeat"], 1);
  EXPECT_EQ(on_disk["runs"][6]["grid"], (json{{"train.workers", "2"}, {"train.batch_size", "64"}}));

  // results.csv: a header and 8 rows, the grid values first, the machine's
  // comma-holding model quoted.
  std::vector<std::string> lines = absl::StrSplit(ReadFile(dir.Sub("out/results.csv")), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 9u);
  EXPECT_EQ(lines[0].rfind("point,repeat,order,train.workers,train.batch_size,workers,", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("phase_forward"), std::string::npos);
  EXPECT_NE(lines[0].find(",peak_fraction,"), std::string::npos);
  EXPECT_EQ(lines[3].rfind("2,0,2,2,64,2,", 0), 0u) << lines[3];
  EXPECT_NE(lines[3].find("\"Test CPU, 2 GHz\""), std::string::npos) << lines[3];
}

TEST(RunSweep, AFailedRunStopsTheSweepAndKeepsTheRunsBefore) {
  TempDir dir;
  FakeBench bench;
  bench.fail_at = 5;
  absl::StatusOr<json> r = RunSweep(Options(dir.Sub("out")), bench.Runner(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("point 1 (train.workers=1 train.batch_size=128), repeat 1: "
                                      "train.batch_size: too large for the data"),
            std::string::npos)
      << r.status();
  const json on_disk = json::parse(ReadFile(dir.Sub("out/results.json")));
  EXPECT_EQ(on_disk["runs"].size(), 5u);
  EXPECT_TRUE(on_disk["finished"].is_null());
  EXPECT_EQ(bench.calls.size(), 6u);
}

TEST(SummarisePoints, MediansRangesAndEfficiency) {
  TempDir dir;
  FakeBench bench;
  // Point 0 (1 worker) gets +100 then +300: median 1200, min 1100, max 1300.
  // Point 2 (2 workers) gets +0 then +600: median 2300.
  bench.jitter = {100, 0, 0, 0, 300, 0, 600, 0};
  absl::StatusOr<json> r = RunSweep(Options(dir.Sub("out")), bench.Runner(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  const json& p0 = (*r)["points"][0];
  EXPECT_EQ(p0["runs"], 2);
  EXPECT_DOUBLE_EQ(p0["samples_per_s"]["median"].get<double>(), 1200);
  EXPECT_DOUBLE_EQ(p0["samples_per_s"]["min"].get<double>(), 1100);
  EXPECT_DOUBLE_EQ(p0["samples_per_s"]["max"].get<double>(), 1300);
  EXPECT_DOUBLE_EQ(p0["phases"]["forward"].get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(p0["phases"]["push"].get<double>(), 0.0);
  EXPECT_TRUE(p0["bf16_peak_gflops"].is_null());
  EXPECT_DOUBLE_EQ(p0["parallel_efficiency"].get<double>(), 1.0);
  const json& p2 = (*r)["points"][2];
  EXPECT_EQ(p2["workers"], 2);
  // Per worker: 2300 / 2 over 1200 / 1, within the series batch_size=64.
  EXPECT_DOUBLE_EQ(p2["parallel_efficiency"].get<double>(), 1150.0 / 1200.0);
  // The batch_size=128 series has its own base.
  EXPECT_DOUBLE_EQ((*r)["points"][3]["parallel_efficiency"].get<double>(), 1.0);
}

TEST(SummarisePoints, NoEfficiencyWithoutAWorkersAxis) {
  TempDir dir;
  FakeBench bench;
  SweepOptions o = Options(dir.Sub("out"));
  o.grid = {{"train.batch_size", {"64", "128"}}};
  o.repeats = 1;
  absl::StatusOr<json> r = RunSweep(o, bench.Runner(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const json& p : (*r)["points"]) EXPECT_TRUE(p["parallel_efficiency"].is_null());
}

TEST(LoadSweep, ReadsASweepAndNamesTheFileOtherwise) {
  TempDir dir;
  FakeBench bench;
  ASSERT_TRUE(RunSweep(Options(dir.Sub("out")), bench.Runner(), nullptr).ok());
  absl::StatusOr<json> loaded = LoadSweep(dir.Sub("out"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)["points"].size(), 4u);

  EXPECT_EQ(LoadSweep(dir.Sub("absent")).status().code(), absl::StatusCode::kNotFound);
  fs::create_directories(dir.Sub("bad"));
  std::ofstream(dir.Sub("bad/results.json")) << "{not json";
  const absl::Status s = LoadSweep(dir.Sub("bad")).status();
  EXPECT_NE(s.message().find("bad/results.json: not valid JSON"), std::string::npos) << s;
  std::ofstream(dir.Sub("bad/results.json"), std::ios::trunc) << "{\"format\": \"shardwild-bench-sweep\", \"version\": 7}";
  EXPECT_NE(LoadSweep(dir.Sub("bad")).status().message().find("version"), std::string::npos);
  // Runs that a sweep does not write: named, not thrown.
  json doc = json::parse(ReadFile(dir.Sub("out/results.json")));
  for (const auto& [where, value] : std::vector<std::pair<std::string, json>>{
           {"/runs/3/grid/train.workers", 2}, {"/runs/0/point", "zero"}, {"/runs/1/grid", json::array()},
           {"/runs/2/phases", 7}, {"/grid/0/key", 5}, {"/runs/4/workers", "two"}}) {
    json broken = doc;
    broken[json::json_pointer(where)] = value;
    std::ofstream(dir.Sub("bad/results.json"), std::ios::trunc) << broken.dump();
    const absl::Status st = LoadSweep(dir.Sub("bad")).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << where << ": " << st;
    EXPECT_NE(st.message().find("bad/results.json: "), std::string::npos) << st;
  }
  // Fields of the wrong type where a value() would throw, and thread counts
  // whose product would overflow: errors too (ParseSweep never throws).
  for (const auto& [where, value] : std::vector<std::pair<std::string, json>>{
           {"/format", 1}, {"/version", "1"}, {"/runs/0/workers", int64_t{1} << 40}, {"/runs/0/intra_op_threads", -1}}) {
    json broken = doc;
    broken[json::json_pointer(where)] = value;
    EXPECT_EQ(ParseSweep(broken.dump(), "x.json").status().code(), absl::StatusCode::kInvalidArgument) << where;
  }
  EXPECT_TRUE(ParseSweep(doc.dump(), "x.json").ok());
  // A point whose runs disagree on its grid values, or two points with the
  // same values (the comparison matches points by them).
  json twice = doc;
  twice["runs"][1]["grid"] = twice["runs"][0]["grid"];
  EXPECT_NE(ParseSweep(twice.dump(), "x.json").status().message().find("no two points the same"), std::string::npos);
  json moved = doc;
  moved["runs"][4]["grid"] = moved["runs"][1]["grid"];
  EXPECT_FALSE(ParseSweep(moved.dump(), "x.json").ok());
  // Without the machine (or other fields a sweep always writes but nothing
  // needs), it still reads and writes CSV.
  json bare = doc;
  bare.erase("machine");
  absl::StatusOr<json> read = ParseSweep(bare.dump(), "x.json");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_NE(SweepCsv(*read).find("\n0,0,0,1,64,"), std::string::npos);
}

TEST(CompareSweeps, ASweepAgainstItselfIsOneWithinNoise) {
  TempDir dir;
  FakeBench bench;
  bench.jitter = {100, 0, 0, 0, 300, 0, 600, 0};
  absl::StatusOr<json> r = RunSweep(Options(dir.Sub("out")), bench.Runner(), nullptr);
  ASSERT_TRUE(r.ok());
  const json c = CompareSweeps(*r, *r, "A", "A");
  ASSERT_EQ(c["rows"].size(), 4u);
  for (const json& row : c["rows"]) {
    EXPECT_DOUBLE_EQ(row["ratio"].get<double>(), 1.0);
    EXPECT_TRUE(row["overlap"].get<bool>());
    EXPECT_EQ(row["verdict"], "within noise");
  }
  EXPECT_TRUE(c["only_in_a"].empty());
  const std::string table = FormatComparison(c);
  EXPECT_NE(table.find("1.000  within noise"), std::string::npos) << table;
}

TEST(CompareSweeps, RatiosOverlapAndMissingPoints) {
  TempDir dir;
  FakeBench before, after;
  SweepOptions o = Options(dir.Sub("a"));
  o.grid = {{"train.workers", {"1", "2"}}};
  ASSERT_TRUE(RunSweep(o, before.Runner(), nullptr).ok());
  // B: 1 worker 10% faster beyond the ranges, 2 workers within noise (A's
  // runs are exact, B's straddle them), and a 4-worker point A lacks.
  o.out_dir = dir.Sub("b");
  o.grid = {{"train.workers", {"1", "2", "4"}}};
  after.jitter = {100, -50, 0, 100, 50, 0};
  ASSERT_TRUE(RunSweep(o, after.Runner(), nullptr).ok());
  absl::StatusOr<json> a = LoadSweep(dir.Sub("a")), b = LoadSweep(dir.Sub("b"));
  ASSERT_TRUE(a.ok() && b.ok());
  const json c = CompareSweeps(*a, *b, "a", "b");
  ASSERT_EQ(c["rows"].size(), 2u);
  EXPECT_DOUBLE_EQ(c["rows"][0]["ratio"].get<double>(), 1100.0 / 1000.0);
  EXPECT_EQ(c["rows"][0]["verdict"], "faster");
  EXPECT_FALSE(c["rows"][0]["overlap"].get<bool>());
  EXPECT_EQ(c["rows"][1]["verdict"], "within noise");
  ASSERT_EQ(c["only_in_b"].size(), 1u);
  EXPECT_EQ(c["only_in_b"][0]["train.workers"], "4");
  const json reversed = CompareSweeps(*b, *a, "b", "a");
  EXPECT_EQ(reversed["rows"][0]["verdict"], "slower");
  EXPECT_NE(FormatComparison(c).find("only in B: train.workers=4"), std::string::npos);
}

// A stand-in for the shardwild binary: a shell script that prints what a
// bench prints, or fails as a bench fails.
std::string FakeBinary(const TempDir& dir, const std::string& body) {
  const std::string path = dir.Sub("fake_shardwild.sh");
  std::ofstream(path) << "#!/bin/sh\n" << body;
  fs::permissions(path, fs::perms::owner_all);
  return path;
}

TEST(ChildProcessBenchRunner, ReadsTheLastLineAsJson) {
  TempDir dir;
  const std::string exe = FakeBinary(dir,
                                     "echo \"report for $2 $3 $4\"\n"
                                     "echo 'shardwild: warning: a note' >&2\n"
                                     "echo '{\"samples_per_s\": 1234.5, \"args\": \"'\"$*\"'\"}'\n");
  absl::StatusOr<json> j = ChildProcessBenchRunner(exe)({"cfg.yaml", "--set", "a=1", "--json"});
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_DOUBLE_EQ((*j)["samples_per_s"].get<double>(), 1234.5);
  EXPECT_EQ((*j)["args"], "bench cfg.yaml --set a=1 --json");
}

TEST(ChildProcessBenchRunner, ABenchsErrorLineBecomesTheError) {
  TempDir dir;
  const std::string exe =
      FakeBinary(dir, "echo 'shardwild: error: train.batch_size: expected a positive integer' >&2\nexit 1\n");
  absl::StatusOr<json> j = ChildProcessBenchRunner(exe)({"cfg.yaml", "--json"});
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().message(), "train.batch_size: expected a positive integer");
  // No JSON line, or killed by a signal: said so.
  const std::string silent = FakeBinary(dir, "echo 'no json here'\n");
  EXPECT_NE(ChildProcessBenchRunner(silent)({"x"}).status().message().find("no JSON summary"), std::string::npos);
  const std::string killed = FakeBinary(dir, "kill -9 $$\n");
  EXPECT_NE(ChildProcessBenchRunner(killed)({"x"}).status().message().find("killed by signal 9"), std::string::npos);
  EXPECT_FALSE(ChildProcessBenchRunner(dir.Sub("absent"))({"x"}).ok());
}

TEST(RunReportScript, PassesTheScriptsErrorLineOn) {
  TempDir dir;
  const std::string ok_script = dir.Sub("ok.sh"), bad_script = dir.Sub("bad.sh");
  std::ofstream(ok_script) << "test \"$1\" = sweep && test -d \"$2\"\n";
  std::ofstream(bad_script) << "echo 'bench_report.py: error: x/results.json: not valid JSON' >&2\nexit 1\n";
  EXPECT_TRUE(RunReportScript("/bin/sh", ok_script, "sweep", dir.path()).ok());
  const absl::Status s = RunReportScript("/bin/sh", bad_script, "sweep", dir.path());
  EXPECT_NE(s.message().find("failed: bench_report.py: error: x/results.json: not valid JSON"), std::string::npos)
      << s;
}

}  // namespace
}  // namespace shardwild
