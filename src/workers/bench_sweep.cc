#include "workers/bench_sweep.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"

extern char** environ;

namespace shardwild {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kSweepFormat[] = "shardwild-bench-sweep";
constexpr char kCompareFormat[] = "shardwild-bench-compare";
constexpr int kSweepVersion = 1;

// The phases of a step, as the bench's JSON names them, in the order of the step.
const std::vector<std::string>& PhaseNames() {
  static const std::vector<std::string> kNames = {"data",     "read_params", "pull_rows", "forward",
                                                  "backward", "push",        "push_rows"};
  return kNames;
}

std::string Now() { return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone()); }

// "k1=v1 k2=v2" for a grid object.
std::string Label(const json& grid_values, const json& grid) {
  std::vector<std::string> parts;
  for (const json& axis : grid) {
    const std::string key = axis.at("key").get<std::string>();
    parts.push_back(absl::StrCat(key, "=", grid_values.at(key).get<std::string>()));
  }
  return absl::StrJoin(parts, " ");
}

// A child process's exit, its standard output, and its standard error.
struct ChildResult {
  int status = 0;  // waitpid status
  std::string out, err;
};

// Starts argv, collects both output streams until they close, and waits.
absl::StatusOr<ChildResult> RunChild(const std::vector<std::string>& args) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);  // nothing else of ours
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (rc != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    return absl::FailedPreconditionError(absl::StrCat("cannot start '", args[0], "': ", std::strerror(rc)));
  }
  ChildResult r;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (const pollfd& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  while (waitpid(pid, &r.status, 0) < 0 && errno == EINTR) {
  }
  return r;
}

// The last non-empty line of `text`.
std::string LastLine(absl::string_view text) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n', absl::SkipWhitespace());
  return lines.empty() ? std::string() : std::string(absl::StripAsciiWhitespace(lines.back()));
}

bool IsSweepDir(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "results.json");
  if (!in) return false;
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("format") && j.at("format") == kSweepFormat;
}

// Median, minimum and maximum of `v` (non-empty).
json Stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  // (Halves first: the sum of two large values may overflow.)
  const double median = n % 2 == 1 ? v[n / 2] : 0.5 * v[n / 2 - 1] + 0.5 * v[n / 2];
  return {{"median", median}, {"min", v.front()}, {"max", v.back()}};
}

// Stats of runs[i][key] over `runs`, or null if any run lacks a number there.
json StatsOf(const std::vector<const json*>& runs, const std::string& key) {
  std::vector<double> v;
  for (const json* r : runs) {
    const auto it = r->find(key);
    if (it == r->end() || !it->is_number()) return nullptr;
    v.push_back(it->get<double>());
  }
  return v.empty() ? json(nullptr) : Stats(v);
}

// A CSV field: quoted when it holds a comma, quote or line break.
std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

std::string CsvValue(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return CsvField(v.get<std::string>());
  if (v.is_number_float()) return absl::StrFormat("%.6g", v.get<double>());
  if (v.is_array()) {
    std::vector<std::string> parts;
    for (const json& e : v) parts.push_back(e.is_string() ? e.get<std::string>() : e.dump());
    return CsvField(absl::StrJoin(parts, " "));
  }
  return CsvField(v.dump());
}

// The subset of a bench's JSON summary a sweep keeps per run.
json RunRecord(const json& bench) {
  json r;
  for (const char* key : {"workers", "intra_op_threads", "batch", "precision", "update", "samples_per_s", "step_ms",
                          "wall_s", "peak_fraction", "model_gflops", "peak_gflops", "bf16_peak_gflops",
                          "embedding_rows_per_s", "embedding_bound_rows_per_s", "embedding_rows_ratio",
                          "kernel_target"}) {
    r[key] = bench.contains(key) ? bench.at(key) : json(nullptr);
  }
  r["phases"] = bench.contains("phases") ? bench.at("phases") : json::object();
  return r;
}

}  // namespace

absl::StatusOr<SweepAxis> ParseSweepAxis(absl::string_view arg) {
  const size_t eq = arg.find('=');
  if (eq == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grid ", arg, ": expected KEY=V1,V2,... (a config key, '=', and comma-separated values)"));
  }
  SweepAxis axis;
  axis.key = std::string(absl::StripAsciiWhitespace(arg.substr(0, eq)));
  if (axis.key.empty()) return absl::InvalidArgumentError(absl::StrCat("--grid ", arg, ": the key before '=' is empty"));
  const absl::string_view list = arg.substr(eq + 1);
  if (absl::StripAsciiWhitespace(list).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grid ", arg, ": ", axis.key, " has an empty value list; expected at least one value"));
  }
  for (absl::string_view v : absl::StrSplit(list, ',')) {
    v = absl::StripAsciiWhitespace(v);
    if (v.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--grid ", arg, ": ", axis.key, " has an empty value"));
    }
    axis.values.emplace_back(v);
  }
  return axis;
}

std::vector<std::vector<std::string>> ExpandGrid(const std::vector<SweepAxis>& grid) {
  std::vector<std::vector<std::string>> points = {{}};
  for (const SweepAxis& axis : grid) {
    std::vector<std::vector<std::string>> next;
    for (const std::vector<std::string>& p : points) {
      for (const std::string& v : axis.values) {
        next.push_back(p);
        next.back().push_back(v);
      }
    }
    points = std::move(next);
  }
  return points;
}

BenchRunner ChildProcessBenchRunner(std::string exe) {
  // Warnings a run printed, so each is passed on once, not once per run.
  auto seen = std::make_shared<std::set<std::string>>();
  return [exe = std::move(exe), seen](const std::vector<std::string>& args) -> absl::StatusOr<json> {
    std::vector<std::string> argv = {exe, "bench"};
    argv.insert(argv.end(), args.begin(), args.end());
    SW_ASSIGN_OR_RETURN(ChildResult r, RunChild(argv));
    std::string error_line;
    for (absl::string_view line : absl::StrSplit(r.err, '\n', absl::SkipWhitespace())) {
      if (absl::StartsWith(line, "shardwild: error: ")) {
        error_line = std::string(line.substr(18));
      } else if (seen->insert(std::string(line)).second) {
        std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
      }
    }
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0) {
      const std::string how = WIFSIGNALED(r.status) ? absl::StrCat("was killed by signal ", WTERMSIG(r.status))
                                                    : absl::StrCat("exited with status ", WEXITSTATUS(r.status));
      return absl::AbortedError(error_line.empty() ? absl::StrCat("the bench ", how) : error_line);
    }
    json j = json::parse(LastLine(r.out), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("samples_per_s") || !j.at("samples_per_s").is_number()) {
      return absl::InternalError("the bench printed no JSON summary as its last line");
    }
    return j;
  };
}

absl::Status CheckSweep(const SweepOptions& options,
                        const std::function<absl::Status(const std::vector<std::string>& sets)>& check_config) {
  if (options.grid.empty()) {
    return absl::InvalidArgumentError("bench sweep: no --grid given; expected at least one --grid KEY=V1,V2,...");
  }
  if (options.repeats < 1) {
    return absl::InvalidArgumentError(absl::StrCat("bench sweep: --repeats ", options.repeats, ": expected 1 or more"));
  }
  std::set<std::string> keys;
  for (const SweepAxis& axis : options.grid) {
    if (axis.values.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--grid ", axis.key, ": an empty value list"));
    }
    if (!keys.insert(axis.key).second) {
      return absl::InvalidArgumentError(absl::StrCat("--grid ", axis.key, ": the key is given twice; give all its "
                                                     "values in one --grid"));
    }
  }
  for (const std::vector<std::string>& point : ExpandGrid(options.grid)) {
    std::vector<std::string> sets = options.sets;
    for (size_t a = 0; a < point.size(); ++a) sets.push_back(absl::StrCat(options.grid[a].key, "=", point[a]));
    if (absl::Status s = check_config(sets); !s.ok()) {
      std::vector<std::string> label;
      for (size_t a = 0; a < point.size(); ++a) label.push_back(absl::StrCat(options.grid[a].key, "=", point[a]));
      return absl::Status(s.code(), absl::StrCat("bench sweep: point ", absl::StrJoin(label, " "), ": ", s.message()));
    }
  }
  if (options.out_dir.empty()) return absl::InvalidArgumentError("bench sweep: --out DIR is required");
  std::error_code ec;
  const std::filesystem::path out(options.out_dir);
  if (std::filesystem::exists(out, ec)) {
    if (!std::filesystem::is_directory(out, ec)) {
      return absl::FailedPreconditionError(
          absl::StrCat(options.out_dir, ": exists and is not a directory; --out names a new or a sweep directory"));
    }
    if (!std::filesystem::is_empty(out, ec) && !IsSweepDir(options.out_dir)) {
      return absl::FailedPreconditionError(absl::StrCat(
          options.out_dir, ": exists and is not a sweep directory (no results.json of `shardwild bench sweep`); "
                           "nothing was written: choose a new --out DIR"));
    }
  }
  return absl::OkStatus();
}


absl::StatusOr<json> RunSweep(const SweepOptions& options, const BenchRunner& run,
                              const std::function<void(const SweepProgress&)>& progress) {
  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(options.out_dir, ": cannot create the directory: ", ec.message()));
  const std::vector<std::vector<std::string>> points = ExpandGrid(options.grid);
  json results = {{"format", kSweepFormat}, {"version", kSweepVersion}, {"config", options.config_path},
                  {"sets", options.sets},   {"repeats", options.repeats},  {"machine", nullptr},
                  {"started", Now()},       {"finished", nullptr},        {"runs", json::array()},
                  {"points", json::array()}};
  json grid = json::array();
  for (const SweepAxis& axis : options.grid) grid.push_back({{"key", axis.key}, {"values", axis.values}});
  results["grid"] = grid;
  const std::string json_path = (std::filesystem::path(options.out_dir) / "results.json").string();
  const std::string csv_path = (std::filesystem::path(options.out_dir) / "results.csv").string();
  auto save = [&]() -> absl::Status {
    results["points"] = SummarisePoints(results);
    SW_RETURN_IF_ERROR(WriteFileAtomically(json_path, results.dump(1) + "\n"));
    return WriteFileAtomically(csv_path, SweepCsv(results));
  };
  SW_RETURN_IF_ERROR(save());

  const int total = static_cast<int>(points.size()) * options.repeats;
  const auto start = Clock::now();
  int done = 0;
  for (int repeat = 0; repeat < options.repeats; ++repeat) {
    for (size_t p = 0; p < points.size(); ++p) {
      json values = json::object();
      std::vector<std::string> args = {options.config_path};
      for (const std::string& s : options.sets) args.insert(args.end(), {"--set", s});
      for (size_t a = 0; a < points[p].size(); ++a) {
        values[options.grid[a].key] = points[p][a];
        args.insert(args.end(), {"--set", absl::StrCat(options.grid[a].key, "=", points[p][a])});
      }
      args.push_back("--json");
      const std::string label = Label(values, grid);
      absl::StatusOr<json> bench = run(args);
      if (!bench.ok()) {
        return absl::Status(bench.status().code(),
                            absl::StrCat("bench sweep: point ", p, " (", label, "), repeat ", repeat, ": ",
                                         bench.status().message(), " (the ", done, " runs before it are in ",
                                         json_path, ")"));
      }
      json record = {{"point", p}, {"repeat", repeat}, {"order", done}, {"grid", values}};
      record.update(RunRecord(*bench));
      if (results["machine"].is_null() && bench->contains("machine")) results["machine"] = bench->at("machine");
      results["runs"].push_back(record);
      ++done;
      if (done == total) results["finished"] = Now();
      SW_RETURN_IF_ERROR(save());
      if (progress) {
        const double elapsed = SecondsSince(start);
        SweepProgress pr;
        pr.done = done;
        pr.total = total;
        pr.point = static_cast<int>(p);
        pr.repeat = repeat;
        pr.label = label;
        pr.samples_per_s = record.value("samples_per_s", 0.0);
        pr.eta_s = elapsed / done * (total - done);
        progress(pr);
      }
    }
  }
  return results;
}

json SummarisePoints(const json& results) {
  const json& grid = results.at("grid");
  std::map<int, std::vector<const json*>> by_point;
  for (const json& r : results.at("runs")) by_point[r.at("point").get<int>()].push_back(&r);
  json points = json::array();
  bool workers_axis = false;
  for (const json& axis : grid) workers_axis |= axis.at("key") == "train.workers";
  for (const auto& [p, runs] : by_point) {
    const int workers = runs.front()->value("workers", 0);
    const int intra = runs.front()->value("intra_op_threads", 1);
    json pt = {{"point", p},           {"grid", runs.front()->at("grid")}, {"runs", runs.size()},
               {"workers", workers}, {"intra_op_threads", intra},        {"threads", workers * std::max(intra, 1)}};
    for (const char* key : {"samples_per_s", "step_ms", "peak_fraction", "model_gflops", "peak_gflops",
                            "bf16_peak_gflops", "embedding_rows_per_s", "embedding_bound_rows_per_s"}) {
      pt[key] = StatsOf(runs, key);
    }
    json phases = json::object();
    for (const std::string& phase : PhaseNames()) {
      std::vector<double> v;
      for (const json* r : runs) {
        const json& ph = r->at("phases");
        if (ph.contains(phase) && ph.at(phase).is_number()) v.push_back(ph.at(phase).get<double>());
      }
      phases[phase] = v.empty() ? 0.0 : Stats(v).at("median").get<double>();
    }
    pt["phases"] = phases;
    pt["parallel_efficiency"] = nullptr;
    points.push_back(pt);
  }
  if (!workers_axis) return points;
  // Parallel efficiency within each series (the points whose other grid
  // values agree) against its point with the fewest workers: throughput per
  // thread (workers x OpenMP threads each) over the base point's. With one
  // thread per worker (train.intra_op_threads: 1) that is throughput per
  // worker; with the default (the cores shared out among the workers) every
  // point uses every core, and it says what more workers gain on them.
  auto others = [&](const json& values) {
    json o = values;
    o.erase("train.workers");
    return o.dump();
  };
  std::map<std::string, const json*> base;
  for (const json& pt : points) {
    if (pt.at("samples_per_s").is_null() || pt.at("threads").get<int>() <= 0) continue;
    const json*& b = base[others(pt.at("grid"))];
    if (b == nullptr || pt.at("workers").get<int>() < b->at("workers").get<int>()) b = &pt;
  }
  for (json& pt : points) {
    const auto it = base.find(others(pt.at("grid")));
    if (it == base.end() || pt.at("samples_per_s").is_null() || pt.at("threads").get<int>() <= 0) continue;
    const json& b = *it->second;
    const double per_thread = pt.at("samples_per_s").at("median").get<double>() / pt.at("threads").get<int>();
    const double base_per_thread = b.at("samples_per_s").at("median").get<double>() / b.at("threads").get<int>();
    if (base_per_thread > 0) pt["parallel_efficiency"] = per_thread / base_per_thread;
  }
  return points;
}

std::string SweepCsv(const json& results) {
  std::vector<std::string> keys;
  for (const json& axis : results.at("grid")) keys.push_back(axis.at("key").get<std::string>());
  static const std::vector<std::string> kRunColumns = {
      "workers",       "intra_op_threads", "batch",       "precision",        "update",
      "samples_per_s", "step_ms",          "wall_s",      "peak_fraction",    "model_gflops",
      "peak_gflops",   "bf16_peak_gflops", "embedding_rows_per_s", "embedding_bound_rows_per_s", "kernel_target"};
  std::vector<std::string> header = {"point", "repeat", "order"};
  for (const std::string& k : keys) header.push_back(CsvField(k));
  header.insert(header.end(), kRunColumns.begin(), kRunColumns.end());
  for (const std::string& phase : PhaseNames()) header.push_back("phase_" + phase);
  for (const char* m : {"cpu_model", "cores", "numa_nodes", "isa", "commit"}) header.push_back(m);
  std::string csv = absl::StrJoin(header, ",") + "\n";
  // A field of an object, or null where it has none (a results.json read
  // back may lack what RunSweep always writes).
  static const json kNull;
  auto field = [](const json& o, const std::string& key) -> const json& {
    return o.is_object() && o.contains(key) ? o.at(key) : kNull;
  };
  const json& machine = field(results, "machine");
  for (const json& r : results.at("runs")) {
    std::vector<std::string> row = {CsvValue(field(r, "point")), CsvValue(field(r, "repeat")),
                                    CsvValue(field(r, "order"))};
    for (const std::string& k : keys) row.push_back(CsvValue(field(field(r, "grid"), k)));
    for (const std::string& c : kRunColumns) row.push_back(CsvValue(field(r, c)));
    for (const std::string& phase : PhaseNames()) row.push_back(CsvValue(field(field(r, "phases"), phase)));
    for (const char* m : {"cpu_model", "cores", "numa_nodes", "isa", "commit"}) row.push_back(CsvValue(field(machine, m)));
    csv += absl::StrJoin(row, ",") + "\n";
  }
  return csv;
}

absl::StatusOr<json> LoadSweep(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "results.json").string();
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read it (", std::strerror(errno),
                                            "); expected the directory of a `shardwild bench sweep`"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseSweep(text.str(), path);
}

absl::StatusOr<json> ParseSweep(absl::string_view text, const std::string& path) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  if (!j.is_object() || !j.contains("format") || j.at("format") != kSweepFormat) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": format: expected \"", kSweepFormat, "\""));
  }
  if (!j.contains("version") || j.at("version") != kSweepVersion) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": version: expected ", kSweepVersion));
  }
  for (const char* key : {"grid", "runs"}) {
    if (!j.contains(key) || !j.at(key).is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, ": expected an array"));
    }
  }
  // What the summaries and the comparison read: grid keys, and each run's
  // point, grid values (strings) and numbers.
  for (const json& axis : j.at("grid")) {
    if (!axis.is_object() || !axis.contains("key") || !axis.at("key").is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": grid: expected objects with a string \"key\""));
    }
  }
  for (size_t i = 0; i < j.at("runs").size(); ++i) {
    const json& r = j.at("runs")[i];
    bool ok = r.is_object() && r.contains("point") && r.at("point").is_number_integer() && r.contains("grid") &&
              r.at("grid").is_object() && (!r.contains("phases") || r.at("phases").is_object());
    if (ok) {
      for (const json& axis : j.at("grid")) {
        const auto v = r.at("grid").find(axis.at("key").get<std::string>());
        ok = ok && v != r.at("grid").end() && v->is_string();
      }
      for (const auto& [key, value] : r.at("grid").items()) ok = ok && value.is_string();
      // Thread counts as a machine has them (their product must not overflow).
      for (const char* key : {"workers", "intra_op_threads"}) {
        ok = ok && (!r.contains(key) || (r.at(key).is_number_integer() && r.at(key).get<int64_t>() >= 0 &&
                                         r.at(key).get<int64_t>() <= (1 << 16)));
      }
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": runs[", i, "]: expected an object with an integer \"point\" and a \"grid\" of string values "
                              "for every grid key"));
    }
  }
  // One grid per point, and one point per grid (the comparison matches
  // points by their grid values).
  std::map<int64_t, std::string> grid_of;
  std::map<std::string, int64_t> point_of;
  for (size_t i = 0; i < j.at("runs").size(); ++i) {
    const json& r = j.at("runs")[i];
    const int64_t p = r.at("point").get<int64_t>();
    const std::string g = r.at("grid").dump();
    const auto [gi, new_point] = grid_of.emplace(p, g);
    const auto [pi, new_grid] = point_of.emplace(g, p);
    if ((!new_point && gi->second != g) || (!new_grid && pi->second != p)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": runs[", i, "]: point ", p, " with grid ", g,
          ": each point has one set of grid values, and no two points the same"));
    }
  }
  try {
    j["points"] = SummarisePoints(j);  // recomputed, so a hand-edited file cannot disagree with its runs
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": runs: not as a sweep writes them (", e.what(), ")"));
  }
  return j;
}

json CompareSweeps(const json& a, const json& b, const std::string& a_name, const std::string& b_name) {
  std::map<std::string, const json*> in_a, in_b;
  for (const json& p : a.at("points")) in_a[p.at("grid").dump()] = &p;
  for (const json& p : b.at("points")) in_b[p.at("grid").dump()] = &p;
  json rows = json::array(), only_a = json::array(), only_b = json::array();
  // In b's order (the newer sweep, usually), then what a alone has.
  for (const json& pb : b.at("points")) {
    const auto it = in_a.find(pb.at("grid").dump());
    if (it == in_a.end()) {
      only_b.push_back(pb.at("grid"));
      continue;
    }
    const json& sa = it->second->at("samples_per_s");
    const json& sb = pb.at("samples_per_s");
    if (sa.is_null() || sb.is_null()) continue;
    const double ma = sa.at("median").get<double>(), mb = sb.at("median").get<double>();
    const double ratio = ma > 0 ? mb / ma : 0;
    const bool overlap = sa.at("min").get<double>() <= sb.at("max").get<double>() &&
                         sb.at("min").get<double>() <= sa.at("max").get<double>();
    rows.push_back({{"grid", pb.at("grid")},
                    {"a", sa},
                    {"b", sb},
                    {"ratio", ratio},
                    {"overlap", overlap},
                    {"verdict", overlap ? "within noise" : (ratio > 1 ? "faster" : "slower")}});
  }
  for (const json& pa : a.at("points")) {
    if (!in_b.count(pa.at("grid").dump())) only_a.push_back(pa.at("grid"));
  }
  json keys = json::array();  // b's grid keys in its order, for labels
  for (const json& axis : b.at("grid")) keys.push_back(axis.at("key"));
  return {{"format", kCompareFormat}, {"version", kSweepVersion}, {"a", a_name},          {"b", b_name},
          {"metric", "samples_per_s"}, {"keys", keys},              {"rows", rows},         {"only_in_a", only_a},
          {"only_in_b", only_b}};
}

std::string FormatComparison(const json& c) {
  // The grid values in the sweep's key order, then any other key.
  std::vector<std::string> order;
  if (c.contains("keys")) {
    for (const json& k : c.at("keys")) order.push_back(k.get<std::string>());
  }
  auto grid_label = [&](const json& g) {
    std::vector<std::string> parts;
    for (const std::string& k : order) {
      if (g.contains(k)) parts.push_back(absl::StrCat(k, "=", g.at(k).get<std::string>()));
    }
    for (const auto& [k, v] : g.items()) {
      if (std::find(order.begin(), order.end(), k) == order.end()) {
        parts.push_back(absl::StrCat(k, "=", v.get<std::string>()));
      }
    }
    return parts.empty() ? std::string("(default)") : absl::StrJoin(parts, " ");
  };
  std::vector<std::string> labels;
  size_t width = 5;
  for (const json& r : c.at("rows")) {
    labels.push_back(grid_label(r.at("grid")));
    width = std::max(width, labels.back().size());
  }
  std::string s = absl::StrFormat("samples/s, median [min-max] over the repeats; A = %s, B = %s\n",
                                  c.at("a").get<std::string>(), c.at("b").get<std::string>());
  absl::StrAppendFormat(&s, "%-*s  %28s  %28s  %6s  %s\n", static_cast<int>(width), "point", "A", "B", "B/A", "verdict");
  auto range = [](const json& st) {
    return absl::StrFormat("%.0f [%.0f-%.0f]", st.at("median").get<double>(), st.at("min").get<double>(),
                           st.at("max").get<double>());
  };
  const json& rows = c.at("rows");
  for (size_t i = 0; i < rows.size(); ++i) {
    absl::StrAppendFormat(&s, "%-*s  %28s  %28s  %6.3f  %s\n", static_cast<int>(width), labels[i],
                          range(rows[i].at("a")), range(rows[i].at("b")), rows[i].at("ratio").get<double>(),
                          rows[i].at("verdict").get<std::string>());
  }
  for (const char* side : {"only_in_a", "only_in_b"}) {
    for (const json& g : c.at(side)) {
      absl::StrAppendFormat(&s, "%s: %s\n", side[8] == 'a' ? "only in A" : "only in B", grid_label(g));
    }
  }
  return s;
}

absl::Status RunReportScript(const std::string& python, const std::string& script, const std::string& mode,
                             const std::string& dir) {
  SW_ASSIGN_OR_RETURN(ChildResult r, RunChild({python, script, mode, dir}));
  std::fputs(r.out.c_str(), stdout);
  if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) return absl::OkStatus();
  std::string line = LastLine(r.err);
  if (line.empty()) line = "no message";
  return absl::InternalError(absl::StrCat("report: ", python, " ", script, " ", mode, " ", dir, " failed: ", line));
}

}  // namespace shardwild
