// `shardwild bench sweep`, `bench compare` and `bench report`: the training
// step benchmark (workers/bench.h) over a grid of config values.
//
// A sweep runs `shardwild bench CONFIG --set KEY=VALUE... --json` once per
// point of the grid per repeat, each in a fresh process (so every run starts
// from the same state: its own store, thread pool and OpenMP runtime), with
// the repeats interleaved: repeat 0 of every point, then repeat 1 of every
// point, ..., so a slow minute of a noisy machine spreads over the points
// instead of landing on one. It keeps each run's figures as the bench
// printed them (throughput, phase split, fraction of peak, the same-run
// bounds, the machine) and the medians with min and max per point.
//
// A sweep directory holds:
//   results.json  {"format": "shardwild-bench-sweep", "version": 1, config,
//                  grid, repeats, machine, started, finished, runs[], points[]}
//   results.csv   one row per run (the grid values first)
//   report.html   the figures (drawn by tools/bench_report.py with matplotlib)
//   figures/      the same figures as PNG files
// results.json and results.csv are rewritten (atomically) after every run, so
// an interrupted sweep keeps the runs it finished.
//
// Nothing here is thread-safe; a sweep is one thread starting processes one
// at a time.
#pragma once

#include <functional>
#include <string>
#include "core/io/atomic_file.h"  // WriteFileAtomically (results.json, results.csv, compare.json)
#include "absl/strings/string_view.h"
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardwild {

// One --grid argument: a config key (the dotted keys of --set) and the values
// it takes, in the order given.
struct SweepAxis {
  std::string key;
  std::vector<std::string> values;
};

// Parses "KEY=V1,V2,...". InvalidArgument, naming the argument, for a missing
// '=', an empty key, an empty value list or an empty value ("a=1,,2").
absl::StatusOr<SweepAxis> ParseSweepAxis(absl::string_view arg);

// Every combination of the axes' values, the first axis varying slowest:
// point p holds one value per axis, in axis order.
std::vector<std::vector<std::string>> ExpandGrid(const std::vector<SweepAxis>& grid);

struct SweepOptions {
  std::string config_path;
  std::vector<SweepAxis> grid;     // at least one axis, keys distinct
  std::vector<std::string> sets;   // "key=value" applied to every point before the grid's
  int repeats = 1;                 // runs per point, >= 1
  std::string out_dir;
};

// What a sweep reports after each run (for a progress line).
struct SweepProgress {
  int done = 0;            // runs finished
  int total = 0;           // runs in the sweep
  int point = 0;           // of the run just finished
  int repeat = 0;
  std::string label;       // "train.workers=2 train.batch_size=64"
  double samples_per_s = 0;
  double eta_s = 0;        // mean run time so far x runs left
};

// Runs one benchmark: `args` are what follows `shardwild bench` (the config,
// its --set overrides and --json). Returns the JSON summary the bench printed
// as its last line, or an error carrying the bench's own error line.
using BenchRunner = std::function<absl::StatusOr<nlohmann::json>(const std::vector<std::string>& args)>;

// A runner that starts `exe bench ARGS...` as a child process (its stderr
// passes through; stdout is read for the JSON line) and waits for it.
BenchRunner ChildProcessBenchRunner(std::string exe);

// Checks a sweep before anything runs: the options' own rules (an axis at
// all, distinct keys, repeats >= 1), then `check_config` on every point's
// overrides (the CLI loads the config with them, which rejects an unknown key
// or a bad value, naming them), then the output directory: it may be absent,
// empty, or a sweep directory (one holding a results.json of a sweep, whose
// files are replaced); anything else is FailedPrecondition and nothing in it
// is touched.
absl::Status CheckSweep(const SweepOptions& options,
                        const std::function<absl::Status(const std::vector<std::string>& sets)>& check_config);

// Runs the sweep (after CheckSweep), writing results.json and results.csv
// after every run; returns results.json's contents. Stops at the first run
// that fails, with that run's point, its grid values and its error; the runs
// before it stay written. `progress` may be empty.
absl::StatusOr<nlohmann::json> RunSweep(const SweepOptions& options, const BenchRunner& run,
                                        const std::function<void(const SweepProgress&)>& progress);

// The points of a sweep from its runs: per point the medians, minima and
// maxima over the repeats, the median phase split, and the parallel
// efficiency where train.workers is a grid key (throughput per thread,
// workers x intra-op threads, over that of the fewest workers with the same
// other grid values).
nlohmann::json SummarisePoints(const nlohmann::json& results);

// results.csv's text: a header and one row per run.
std::string SweepCsv(const nlohmann::json& results);

// Reads DIR/results.json of a sweep. NotFound or InvalidArgument naming the
// file otherwise.
absl::StatusOr<nlohmann::json> LoadSweep(const std::string& dir);
// The same from the file's text (`path` names it in errors): a sweep as
// RunSweep writes it, with its points recomputed from its runs; any other
// text, however malformed, is InvalidArgument, never an exception.
absl::StatusOr<nlohmann::json> ParseSweep(absl::string_view text, const std::string& path);

// For each point present in both sweeps (the same grid values), the ratio of
// the median samples/s (b over a), whether the min-max ranges overlap, and a
// verdict: "within noise" where they overlap, else "faster" or "slower".
// Also the points only one of them has.
nlohmann::json CompareSweeps(const nlohmann::json& a, const nlohmann::json& b, const std::string& a_name,
                             const std::string& b_name);
// The comparison as a table for the terminal.
std::string FormatComparison(const nlohmann::json& comparison);

// Runs `PYTHON SCRIPT MODE DIR` (tools/bench_report.py) to draw DIR's
// report: MODE "sweep" writes DIR/report.html from results.json, "compare"
// DIR/compare.html from compare.json. The script's error line on failure.
absl::Status RunReportScript(const std::string& python, const std::string& script, const std::string& mode,
                             const std::string& dir);

}  // namespace shardwild
