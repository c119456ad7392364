#include "net/launch_env.h"

#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/base/status.h"

namespace shardwild {
namespace {

absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The most hosts or tasks a launcher's list may expand to: far beyond any
// cluster, and small enough that a malformed variable ("n[0-99999]m[0-99999]",
// ten billion names) is an error rather than the machine's memory.
constexpr size_t kMaxExpanded = size_t{1} << 20;

absl::Status Bad(std::string_view key, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(AV(key), ": ", AV(what)));
}

// Splits `s` at commas outside brackets.
std::vector<std::string_view> SplitTopLevel(std::string_view s) {
  std::vector<std::string_view> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '[') ++depth;
    if (s[i] == ']') --depth;
    if (s[i] == ',' && depth == 0) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(s.substr(start));
  return out;
}

// A non-negative decimal, whole; nullopt otherwise.
std::optional<int64_t> Number(std::string_view s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(AV(s), &v)) return std::nullopt;
  return v;
}

// The values of one bracket group's body ("01-03,07"), padded as written.
absl::StatusOr<std::vector<std::string>> ExpandRanges(std::string_view body, std::string_view key) {
  std::vector<std::string> out;
  for (absl::string_view piece : absl::StrSplit(AV(body), ',')) {
    const std::string_view part(piece.data(), piece.size());
    const size_t dash = part.find('-');
    const std::string_view lo_text = dash == std::string_view::npos ? part : part.substr(0, dash);
    const std::string_view hi_text = dash == std::string_view::npos ? part : part.substr(dash + 1);
    const std::optional<int64_t> lo = Number(lo_text), hi = Number(hi_text);
    if (!lo || !hi) {
      return Bad(key, absl::StrCat("expected a number or a range a-b inside [...], got '", AV(part), "'"));
    }
    if (*hi < *lo) return Bad(key, absl::StrCat("range '", AV(part), "' ends below its start"));
    if (*hi - *lo >= 100000) return Bad(key, absl::StrCat("range '", AV(part), "' holds more than 100000 hosts"));
    const size_t width = lo_text.size();
    for (int64_t v = *lo; v <= *hi; ++v) {
      std::string n = absl::StrCat(v);
      if (n.size() < width) n.insert(0, width - n.size(), '0');
      out.push_back(std::move(n));
    }
  }
  return out;
}

// One host expression ("rack[1-2]-n[01-02]") -> its hosts, bracket groups
// expanded left to right (the last one varying fastest, as Slurm lists them).
absl::StatusOr<std::vector<std::string>> ExpandOne(std::string_view expr, std::string_view key) {
  std::vector<std::string> hosts = {""};
  size_t i = 0;
  while (i < expr.size()) {
    const size_t open = expr.find('[', i);
    const size_t close_before = expr.find(']', i);
    if (close_before != std::string_view::npos && (open == std::string_view::npos || close_before < open)) {
      return Bad(key, absl::StrCat("']' without '[' in '", AV(expr), "'"));
    }
    const std::string_view literal = expr.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i);
    for (std::string& h : hosts) h.append(literal);
    if (open == std::string_view::npos) break;
    const size_t close = expr.find(']', open);
    if (close == std::string_view::npos) return Bad(key, absl::StrCat("'[' without ']' in '", AV(expr), "'"));
    SW_ASSIGN_OR_RETURN(std::vector<std::string> values, ExpandRanges(expr.substr(open + 1, close - open - 1), key));
    if (hosts.size() * values.size() > kMaxExpanded) {
      return Bad(key, absl::StrCat("'", AV(expr), "' expands to more than ", kMaxExpanded, " hosts"));
    }
    std::vector<std::string> next;
    next.reserve(hosts.size() * values.size());
    for (const std::string& h : hosts) {
      for (const std::string& v : values) next.push_back(absl::StrCat(h, v));
    }
    hosts = std::move(next);
    i = close + 1;
  }
  return hosts;
}

// A rank, or a world size, as a launcher variable gives it.
absl::StatusOr<int> ParseCount(const std::optional<std::string>& text, std::string_view key, int min) {
  if (!text) return Bad(key, "missing");
  const std::optional<int64_t> v = Number(*text);
  if (!v || *v < min || *v > (1 << 20)) {
    return Bad(key, absl::StrCat("expected an integer >= ", min, ", got '", *text, "'"));
  }
  return static_cast<int>(*v);
}

absl::Status CheckRank(int rank, int size, std::string_view rank_key, std::string_view size_key) {
  if (rank >= size) {
    return Bad(rank_key, absl::StrCat("rank ", rank, " is outside the world of ", size, " ranks (", AV(size_key),
                                      "); expected 0..", size - 1));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandSlurmHostlist(std::string_view list, std::string_view key) {
  std::vector<std::string> hosts;
  int depth = 0;
  for (char c : list) {
    depth += c == '[' ? 1 : c == ']' ? -1 : 0;
    if (depth < 0 || depth > 1) return Bad(key, absl::StrCat("unbalanced or nested brackets in '", AV(list), "'"));
  }
  if (depth != 0) return Bad(key, absl::StrCat("'[' without ']' in '", AV(list), "'"));
  for (std::string_view expr : SplitTopLevel(list)) {
    if (expr.empty()) return Bad(key, absl::StrCat("empty host name in '", AV(list), "'"));
    SW_ASSIGN_OR_RETURN(std::vector<std::string> part, ExpandOne(expr, key));
    if (hosts.size() + part.size() > kMaxExpanded) {
      return Bad(key, absl::StrCat("expands to more than ", kMaxExpanded, " hosts"));
    }
    for (std::string& h : part) {
      if (h.empty()) return Bad(key, absl::StrCat("empty host name in '", AV(list), "'"));
      hosts.push_back(std::move(h));
    }
  }
  return hosts;
}

absl::StatusOr<std::vector<int>> ParseSlurmTasksPerNode(std::string_view text, std::string_view key) {
  std::vector<int> out;
  for (absl::string_view piece : absl::StrSplit(AV(text), ',')) {
    const std::string_view part(piece.data(), piece.size());
    int64_t repeat = 1;
    std::string_view count_text = part;
    if (const size_t paren = part.find('('); paren != std::string_view::npos) {
      // "2(x3)"
      if (part.size() < paren + 4 || part.substr(paren, 2) != "(x" || part.back() != ')') {
        return Bad(key, absl::StrCat("expected N or N(xM), got '", AV(part), "'"));
      }
      const std::optional<int64_t> r = Number(part.substr(paren + 2, part.size() - paren - 3));
      if (!r || *r < 1 || *r > 100000) return Bad(key, absl::StrCat("expected N or N(xM), got '", AV(part), "'"));
      repeat = *r;
      count_text = part.substr(0, paren);
    }
    const std::optional<int64_t> n = Number(count_text);
    if (!n || *n < 1 || *n > 100000) {
      return Bad(key, absl::StrCat("expected a task count >= 1, got '", AV(part), "'"));
    }
    if (out.size() + static_cast<size_t>(repeat) > kMaxExpanded) {
      return Bad(key, absl::StrCat("gives more than ", kMaxExpanded, " nodes"));
    }
    for (int64_t i = 0; i < repeat; ++i) out.push_back(static_cast<int>(*n));
  }
  return out;
}

absl::StatusOr<std::optional<LaunchWorld>> SlurmWorld(const LaunchEnv& env) {
  if (!env.slurm_procid) return std::optional<LaunchWorld>();
  SW_ASSIGN_OR_RETURN(const int size, ParseCount(env.slurm_ntasks, "SLURM_NTASKS", 1));
  SW_ASSIGN_OR_RETURN(const int rank, ParseCount(env.slurm_procid, "SLURM_PROCID", 0));
  if (size == 1) {
    if (rank != 0) SW_RETURN_IF_ERROR(CheckRank(rank, size, "SLURM_PROCID", "SLURM_NTASKS"));
    return std::optional<LaunchWorld>();  // one rank: no cluster
  }
  SW_RETURN_IF_ERROR(CheckRank(rank, size, "SLURM_PROCID", "SLURM_NTASKS"));
  if (!env.slurm_nodelist) return Bad("SLURM_JOB_NODELIST", "missing (Slurm sets it inside an allocation)");
  SW_ASSIGN_OR_RETURN(std::vector<std::string> nodes, ExpandSlurmHostlist(*env.slurm_nodelist, "SLURM_JOB_NODELIST"));
  std::vector<int> per_node;
  if (env.slurm_tasks_per_node) {
    SW_ASSIGN_OR_RETURN(per_node, ParseSlurmTasksPerNode(*env.slurm_tasks_per_node, "SLURM_TASKS_PER_NODE"));
    if (per_node.size() != nodes.size()) {
      return Bad("SLURM_TASKS_PER_NODE", absl::StrCat("gives ", per_node.size(), " node(s), but SLURM_JOB_NODELIST '",
                                                      *env.slurm_nodelist, "' lists ", nodes.size()));
    }
  } else if (nodes.size() == 1) {
    per_node = {size};
  } else {
    return Bad("SLURM_TASKS_PER_NODE", absl::StrCat("missing, and SLURM_JOB_NODELIST lists ", nodes.size(),
                                                    " nodes: cannot tell which rank runs where"));
  }
  int64_t placed = 0;
  for (int t : per_node) placed += t;
  if (placed != size) {
    return Bad("SLURM_TASKS_PER_NODE", absl::StrCat("places ", placed, " tasks, but SLURM_NTASKS is ", size));
  }
  LaunchWorld w;
  w.source = "Slurm";
  w.rank = rank;
  w.size = size;
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (int t = 0; t < per_node[n]; ++t) w.hosts.push_back(nodes[n]);
  }
  return std::optional<LaunchWorld>(std::move(w));
}

absl::StatusOr<std::optional<LaunchWorld>> MpiWorld(const LaunchEnv& env) {
  if (!env.ompi_rank) return std::optional<LaunchWorld>();
  SW_ASSIGN_OR_RETURN(const int size, ParseCount(env.ompi_size, "OMPI_COMM_WORLD_SIZE", 1));
  SW_ASSIGN_OR_RETURN(const int rank, ParseCount(env.ompi_rank, "OMPI_COMM_WORLD_RANK", 0));
  SW_RETURN_IF_ERROR(CheckRank(rank, size, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"));
  if (size == 1) return std::optional<LaunchWorld>();
  LaunchWorld w;
  w.source = "Open MPI";
  w.rank = rank;
  w.size = size;
  if (env.ompi_local_size) {
    SW_ASSIGN_OR_RETURN(const int local, ParseCount(env.ompi_local_size, "OMPI_COMM_WORLD_LOCAL_SIZE", 1));
    if (local > size) {
      return Bad("OMPI_COMM_WORLD_LOCAL_SIZE",
                 absl::StrCat(local, " ranks on this host, more than OMPI_COMM_WORLD_SIZE ", size));
    }
    // Every rank on this host: they meet on loopback.
    if (local == size) w.hosts.assign(size, "127.0.0.1");
  }
  return std::optional<LaunchWorld>(std::move(w));
}

absl::StatusOr<ClusterSpec> ClusterSpecOfWorld(const LaunchWorld& world, TrainStrategy strategy,
                                               const ClusterOptions& cluster) {
  if (cluster.base_port + world.size - 1 > 65535) {
    return Bad("cluster.base_port", absl::StrCat(cluster.base_port, " + ", world.size - 1,
                                                 " ranks would pass port 65535; lower it"));
  }
  ClusterSpec spec;
  spec.source = world.source;
  auto address = [&](int rank) { return HostPort{world.hosts.empty() ? std::string() : world.hosts[rank],
                                                 cluster.base_port + rank}; };
  auto& chief = spec.tasks[static_cast<int>(Role::kChief)];
  auto& ps = spec.tasks[static_cast<int>(Role::kPs)];
  auto& worker = spec.tasks[static_cast<int>(Role::kWorker)];
  const int num_ps = cluster.PsTasksFor(strategy);
  if (strategy == TrainStrategy::kAllreduce) {
    // The ps tasks come last, so that rank 0 (the rendezvous) and the
    // training ranks' numbers are those of a world without them.
    const int num_workers = world.size - num_ps;
    if (num_workers < 1) {
      return Bad("cluster.ps_tasks",
                 absl::StrCat(world.source, " starts ", world.size, " ranks; train.strategy allreduce with ", num_ps,
                              " ps task(s) needs at least one more rank to train (", num_ps + 1, " ranks)"));
    }
    if (num_ps > 0 && world.hosts.empty()) {
      return Bad("cluster.ps_tasks",
                 absl::StrCat(world.source, " does not say which host each rank runs on, and the ranks must reach "
                                            "the ", num_ps, " ps task(s) at their addresses: start the ranks on one "
                                            "host, give TF_CONFIG or --cluster, or set cluster.ps_tasks to 0"));
    }
    for (int r = 0; r < num_workers; ++r) worker.push_back(address(r));
    for (int r = num_workers; r < world.size; ++r) ps.push_back(address(r));
    spec.task = world.rank < num_workers ? TaskId{Role::kWorker, world.rank}
                                         : TaskId{Role::kPs, world.rank - num_workers};
    return spec;
  }
  if (num_ps < 1) {
    return Bad("cluster.ps_tasks", absl::StrCat("train.strategy ps needs at least one ps task, got ", num_ps));
  }
  if (world.hosts.empty()) {
    return Bad("cluster.launcher",
               absl::StrCat(world.source, " does not say which host each rank runs on, and train.strategy ps "
                                          "needs every task's address: start the ranks on one host, give "
                                          "TF_CONFIG or --cluster, or train with train.strategy allreduce"));
  }
  if (world.size < num_ps + 2) {
    return Bad("cluster.ps_tasks",
               absl::StrCat(world.source, " starts ", world.size, " ranks; train.strategy ps needs a chief, ",
                            num_ps, " ps task(s) and at least one worker task (", num_ps + 2, " ranks)"));
  }
  chief.push_back(address(0));
  for (int r = 1; r <= num_ps; ++r) ps.push_back(address(r));
  for (int r = num_ps + 1; r < world.size; ++r) worker.push_back(address(r));
  if (world.rank == 0) {
    spec.task = TaskId{Role::kChief, 0};
  } else if (world.rank <= num_ps) {
    spec.task = TaskId{Role::kPs, world.rank - 1};
  } else {
    spec.task = TaskId{Role::kWorker, world.rank - num_ps - 1};
  }
  return spec;
}

}  // namespace shardwild
