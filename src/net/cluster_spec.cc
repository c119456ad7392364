#include "net/cluster_spec.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstdlib>
#include <initializer_list>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status.h"
#include "net/launch_env.h"

namespace shardwild {
namespace {

using nlohmann::json;

constexpr Role kAllTypes[] = {Role::kChief, Role::kPs, Role::kWorker, Role::kEvaluator};
constexpr char kRoleList[] = "chief, ps, worker or evaluator";

absl::Status Bad(const std::string& source, const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, ": ", what));
}

std::string Describe(const json& j) {
  if (j.is_string()) return absl::StrCat("'", j.get<std::string>(), "'");
  if (j.is_number_integer() || j.is_number_unsigned()) return absl::StrCat("the number ", j.dump());
  if (j.is_number()) return absl::StrCat("the number ", j.dump());
  if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
  if (j.is_array()) return "a list";
  if (j.is_object()) return "an object";
  return "null";
}

// Collects duplicate object keys while nlohmann parses (it keeps the last
// one silently). Only keys under "cluster" and "task" matter; launchers'
// own sections are not ours to judge.
class DuplicateKeyFinder {
 public:
  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        frames_.push_back({true, {}, {}});
        break;
      case json::parse_event_t::array_start:
        frames_.push_back({false, {}, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames_.empty()) frames_.pop_back();
        break;
      case json::parse_event_t::key: {
        if (frames_.empty()) break;
        Frame& top = frames_.back();
        const std::string key = parsed.get<std::string>();
        top.key = key;
        if (!top.keys.insert(key).second && first_.empty()) {
          std::vector<std::string> path;
          for (size_t i = 0; i + 1 < frames_.size(); ++i) {
            if (frames_[i].object) path.push_back(frames_[i].key);
          }
          const bool ours = path.empty() ? (key == "cluster" || key == "task")
                                         : (path[0] == "cluster" || path[0] == "task");
          if (ours) {
            if (path.size() == 2 && path[0] == "cluster") {
              first_ = absl::StrCat(absl::StrJoin(path, "."), ": index ", key, " appears twice");
            } else if (path.size() == 1 && path[0] == "cluster") {
              first_ = absl::StrCat("cluster.", key, ": the role appears twice");
            } else {
              first_ = absl::StrCat(path.empty() ? key : absl::StrCat(absl::StrJoin(path, "."), ".", key),
                                    ": the key appears twice");
            }
          }
        }
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  }
  // "cluster.ps: index 1 appears twice", or empty.
  const std::string& first() const { return first_; }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;  // the key whose value is being parsed
  };
  std::vector<Frame> frames_;
  std::string first_;
};

// One role's tasks: a list of addresses, or an object {"0": addr, ...}.
absl::Status ParseRole(const std::string& source, const std::string& role, const json& value,
                       std::vector<HostPort>* out) {
  const std::string key = absl::StrCat("cluster.", role);
  std::vector<std::pair<std::string, const json*>> items;  // (key of the item, address)
  if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) items.emplace_back(absl::StrCat(key, "[", i, "]"), &value[i]);
  } else if (value.is_object()) {
    std::map<int, const json*> by_index;
    for (auto it = value.begin(); it != value.end(); ++it) {
      int index = -1;
      if (!absl::SimpleAtoi(it.key(), &index) || index < 0 || absl::StrCat(index) != it.key()) {
        return Bad(source, key, absl::StrCat("expected task indices 0, 1, ... as keys, got '", it.key(), "'"));
      }
      by_index[index] = &it.value();
    }
    int expect = 0;
    for (const auto& [index, addr] : by_index) {
      if (index != expect) {
        return Bad(source, key, absl::StrCat("index ", expect, " is missing (indices must be 0..", by_index.size() - 1,
                                             ", each once)"));
      }
      ++expect;
      items.emplace_back(absl::StrCat(key, "[", index, "]"), addr);
    }
  } else {
    return Bad(source, key, absl::StrCat("expected a list of host:port addresses, got ", Describe(value)));
  }
  for (const auto& [item_key, addr] : items) {
    if (!addr->is_string()) {
      return Bad(source, item_key, absl::StrCat("expected a host:port string, got ", Describe(*addr)));
    }
    absl::StatusOr<HostPort> hp = ParseHostPort(addr->get<std::string>());
    if (!hp.ok()) return Bad(source, item_key, std::string(hp.status().message()));
    out->push_back(*hp);
  }
  return absl::OkStatus();
}

// Checks `type`/`index` against the cluster. `type_where` and `index_where`
// prefix the messages ("cluster.json: task.type" or "--task-type").
absl::Status CheckTask(const ClusterSpec& spec, const TaskId& id, const std::string& type_where,
                       const std::string& index_where) {
  const int n = spec.num_tasks(id.type);
  if (n == 0) {
    return absl::InvalidArgumentError(absl::StrCat(type_where, ": '", RoleName(id.type), "' but ", spec.source,
                                                   " has no ", RoleName(id.type), " tasks"));
  }
  if (id.index < 0 || id.index >= n) {
    return absl::InvalidArgumentError(absl::StrCat(index_where, ": ", id.index, " is out of range: cluster.",
                                                   RoleName(id.type), " in ", spec.source, " has ", n,
                                                   n == 1 ? " task (index 0)" : absl::StrCat(" tasks (0..", n - 1, ")")));
  }
  return absl::OkStatus();
}

absl::StatusOr<Role> ParseRoleName(const std::string& name, const std::string& where) {
  std::optional<Role> t = RoleFromName(name);
  if (!t) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unknown role '", name, "' (expected ", kRoleList, ")"));
  }
  return *t;
}

}  // namespace

const char* RoleName(Role t) {
  switch (t) {
    case Role::kChief:
      return "chief";
    case Role::kPs:
      return "ps";
    case Role::kWorker:
      return "worker";
    case Role::kEvaluator:
      return "evaluator";
  }
  return "?";
}

std::optional<Role> RoleFromName(std::string_view name) {
  for (Role t : kAllTypes) {
    if (name == RoleName(t)) return t;
  }
  return std::nullopt;
}

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

bool HostPort::IsLoopback() const { return IsLoopbackHost(host); }

bool IsLoopbackHost(std::string_view host) {
  std::string h(host);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (absl::AsciiStrToLower(h) == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    // ::ffff:127.x.y.z
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

absl::StatusOr<HostPort> ParseHostPort(std::string_view text) {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected host:port with a port in 1..65535, got '", std::string(text), "'", why.empty() ? "" : " (", why,
                     why.empty() ? "" : ")"));
  };
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return bad("no port");
  std::string_view host = text.substr(0, colon);
  const std::string_view port_text = text.substr(colon + 1);
  HostPort hp;
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad("an IPv6 host goes in brackets: [::1]:2222");
    host = host.substr(1, host.size() - 2);
    in6_addr v6{};
    if (inet_pton(AF_INET6, std::string(host).c_str(), &v6) != 1) return bad("not an IPv6 address in the brackets");
  } else {
    if (host.empty()) return bad("no host");
    if (host.find(':') != std::string_view::npos) return bad("an IPv6 host goes in brackets: [::1]:2222");
    for (char c : host) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') {
        return bad(absl::StrCat("the host has the character '", std::string(1, c), "'"));
      }
    }
  }
  hp.host = std::string(host);
  if (port_text.empty() || port_text.size() > 5) return bad("");
  for (char c : port_text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return bad("");
  }
  int port = 0;
  if (!absl::SimpleAtoi(std::string(port_text), &port) || port < 1 || port > 65535) return bad("");
  hp.port = port;
  return hp;
}

std::string TaskId::ToString() const { return absl::StrCat(RoleName(type), ":", index); }

absl::StatusOr<ClusterSpec> ParseClusterSpec(std::string_view text, const std::string& source,
                                             TrainStrategy strategy) {
  DuplicateKeyFinder dups;
  json root;
  try {
    root = json::parse(text.begin(), text.end(),
                       [&dups](int depth, json::parse_event_t event, json& parsed) {
                         return dups(depth, event, parsed);
                       });
  } catch (const json::parse_error& e) {
    // e.what(): "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    std::string what = e.what();
    const size_t close = what.find("] ");
    if (close != std::string::npos) what = what.substr(close + 2);
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON: ", what));
  }
  if (!dups.first().empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", dups.first()));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON object with \"cluster\" and \"task\", got ", Describe(root)));
  }
  ClusterSpec spec;
  spec.source = source;
  auto cluster = root.find("cluster");
  if (cluster == root.end()) return Bad(source, "cluster", "missing (the roles and their host:port addresses)");
  if (!cluster->is_object()) {
    return Bad(source, "cluster", absl::StrCat("expected an object of roles, got ", Describe(*cluster)));
  }
  for (auto it = cluster->begin(); it != cluster->end(); ++it) {
    SW_ASSIGN_OR_RETURN(const Role type, ParseRoleName(it.key(), absl::StrCat(source, ": cluster.", it.key())));
    SW_RETURN_IF_ERROR(ParseRole(source, it.key(), it.value(), &spec.tasks[static_cast<int>(type)]));
  }
  // No address twice, over all roles.
  std::map<std::string, std::string> seen;  // address -> key
  for (Role t : kAllTypes) {
    const std::vector<HostPort>& list = spec.tasks[static_cast<int>(t)];
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string key = absl::StrCat("cluster.", RoleName(t), "[", i, "]");
      auto [it, fresh] = seen.emplace(list[i].ToString(), key);
      if (!fresh) {
        return Bad(source, key, absl::StrCat("address ", list[i].ToString(), " is already used by ", it->second));
      }
    }
  }
  if (strategy == TrainStrategy::kAllreduce) {
    if (spec.num_tasks(Role::kChief) > 1) {
      return Bad(source, "cluster.chief",
                 absl::StrCat("expected at most one chief, got ", spec.num_tasks(Role::kChief)));
    }
    if (AllreduceWorldSize(spec) == 0) {
      return Bad(source, "cluster.worker",
                 "missing (train.strategy allreduce trains on the chief and the worker tasks: give at least one)");
    }
  } else {
    if (spec.num_tasks(Role::kChief) == 0) {
      return Bad(source, "cluster.chief", "missing (a cluster needs exactly one chief)");
    }
    if (spec.num_tasks(Role::kChief) > 1) {
      return Bad(source, "cluster.chief",
                 absl::StrCat("expected exactly one chief, got ", spec.num_tasks(Role::kChief)));
    }
    if (spec.num_tasks(Role::kPs) == 0) {
      return Bad(source, "cluster.ps", "missing (a cluster needs at least one ps task to hold the shards)");
    }
  }
  auto task = root.find("task");
  if (task != root.end() && !task->is_null()) {
    if (!task->is_object()) return Bad(source, "task", absl::StrCat("expected an object, got ", Describe(*task)));
    auto type = task->find("type");
    if (type == task->end()) return Bad(source, "task.type", "missing (one of chief, ps, worker, evaluator)");
    if (!type->is_string()) {
      return Bad(source, "task.type", absl::StrCat("expected a role name, got ", Describe(*type)));
    }
    TaskId id;
    SW_ASSIGN_OR_RETURN(id.type, ParseRoleName(type->get<std::string>(), absl::StrCat(source, ": task.type")));
    auto index = task->find("index");  // TF defaults a missing index to 0
    if (index == task->end()) {
    } else if (!index->is_number_integer() && !index->is_number_unsigned()) {
      return Bad(source, "task.index", absl::StrCat("expected an integer >= 0, got ", Describe(*index)));
    } else {
      const int64_t v = index->get<int64_t>();
      if (v < 0 || v > (1 << 30)) {
        return Bad(source, "task.index", absl::StrCat("expected an integer >= 0, got ", v));
      }
      id.index = static_cast<int>(v);
    }
    SW_RETURN_IF_ERROR(
        CheckTask(spec, id, absl::StrCat(source, ": task.type"), absl::StrCat(source, ": task.index")));
    spec.task = id;
  }
  return spec;
}

int AllreduceWorldSize(const ClusterSpec& spec) {
  return spec.num_tasks(Role::kChief) + spec.num_tasks(Role::kWorker);
}

std::optional<int> AllreduceRankOf(const ClusterSpec& spec, const TaskId& task) {
  if (task.type == Role::kChief) return task.index;
  if (task.type == Role::kWorker) return spec.num_tasks(Role::kChief) + task.index;
  return std::nullopt;
}

TaskId AllreduceTaskOfRank(const ClusterSpec& spec, int rank) {
  const int chiefs = spec.num_tasks(Role::kChief);
  return rank < chiefs ? TaskId{Role::kChief, rank} : TaskId{Role::kWorker, rank - chiefs};
}

LaunchEnv LaunchEnv::FromEnviron() {
  auto get = [](std::initializer_list<const char*> names) -> std::optional<std::string> {
    for (const char* name : names) {
      if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return std::string(v);
    }
    return std::nullopt;
  };
  LaunchEnv e;
  e.slurm_procid = get({"SLURM_PROCID"});
  e.slurm_ntasks = get({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"});
  e.slurm_nodelist = get({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"});
  e.slurm_tasks_per_node = get({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  e.ompi_rank = get({"OMPI_COMM_WORLD_RANK"});
  e.ompi_size = get({"OMPI_COMM_WORLD_SIZE"});
  e.ompi_local_size = get({"OMPI_COMM_WORLD_LOCAL_SIZE"});
  return e;
}

namespace {

// The launcher world `sources` allow and give, if any.
absl::StatusOr<std::optional<LaunchWorld>> LauncherWorld(const ClusterSpecSources& sources) {
  const ClusterLauncher l = sources.options.launcher;
  if (l == ClusterLauncher::kAuto || l == ClusterLauncher::kSlurm) {
    SW_ASSIGN_OR_RETURN(std::optional<LaunchWorld> w, SlurmWorld(sources.env));
    if (w || l == ClusterLauncher::kSlurm) return w;
  }
  if (l == ClusterLauncher::kAuto || l == ClusterLauncher::kMpi) return MpiWorld(sources.env);
  return std::optional<LaunchWorld>();
}

bool TfConfigAllowed(const ClusterSpecSources& sources) {
  return sources.options.launcher == ClusterLauncher::kAuto || sources.options.launcher == ClusterLauncher::kTfConfig;
}

// With strategy allreduce: cluster.rendezvous, else rank 0's address.
absl::Status SetRendezvous(const ClusterSpecSources& sources, ClusterSpec* spec) {
  if (sources.strategy != TrainStrategy::kAllreduce) return absl::OkStatus();
  if (!sources.options.rendezvous.empty()) {
    absl::StatusOr<HostPort> hp = ParseHostPort(sources.options.rendezvous);
    if (!hp.ok()) return absl::InvalidArgumentError(absl::StrCat("cluster.rendezvous: ", hp.status().message()));
    spec->rendezvous = *hp;
    return absl::OkStatus();
  }
  if (spec->rendezvous) return absl::OkStatus();  // the launcher's
  if (AllreduceWorldSize(*spec) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(spec->source, ": cluster.worker: no ranks to meet"));
  }
  const HostPort& first = spec->address(AllreduceTaskOfRank(*spec, 0));
  if (first.host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster.rendezvous: missing: ", spec->source,
        " does not say which host rank 0 is on; set cluster.rendezvous to host:port of rank 0's host"));
  }
  spec->rendezvous = first;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> HasClusterSource(const ClusterSpecSources& sources) {
  if (!sources.cluster_file.empty() || sources.task_type || sources.task_index) return true;
  if (sources.tf_config && !sources.tf_config->empty() && TfConfigAllowed(sources)) return true;
  SW_ASSIGN_OR_RETURN(std::optional<LaunchWorld> w, LauncherWorld(sources));
  return w.has_value();
}

absl::StatusOr<ClusterSpec> ResolveClusterSpec(const ClusterSpecSources& sources) {
  ClusterSpec spec;
  if (!sources.cluster_file.empty()) {
    std::ifstream in(sources.cluster_file, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat(sources.cluster_file, ": cannot open cluster spec: ", std::strerror(errno)));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    SW_ASSIGN_OR_RETURN(spec, ParseClusterSpec(ss.str(), sources.cluster_file, sources.strategy));
  } else if (sources.tf_config && !sources.tf_config->empty() && TfConfigAllowed(sources)) {
    SW_ASSIGN_OR_RETURN(spec, ParseClusterSpec(*sources.tf_config, "TF_CONFIG", sources.strategy));
  } else {
    SW_ASSIGN_OR_RETURN(std::optional<LaunchWorld> world, LauncherWorld(sources));
    if (!world) {
      return absl::NotFoundError(
          "no cluster spec: give --cluster FILE, set TF_CONFIG to the TF_CONFIG JSON "
          "({\"cluster\": {\"chief\": [...], \"ps\": [...], ...}, \"task\": {...}}), or start the tasks with "
          "srun or mpirun");
    }
    SW_ASSIGN_OR_RETURN(spec, ClusterSpecOfWorld(*world, sources.strategy, sources.options));
  }
  if (!sources.task_type && !sources.task_index) {
    SW_RETURN_IF_ERROR(SetRendezvous(sources, &spec));
    return spec;
  }
  if (!sources.task_type && !sources.task_index) return spec;
  TaskId id;
  std::string type_where = absl::StrCat(spec.source, ": task.type");
  std::string index_where = absl::StrCat(spec.source, ": task.index");
  if (sources.task_type) {
    SW_ASSIGN_OR_RETURN(id.type, ParseRoleName(*sources.task_type, "--task-type"));
    type_where = absl::StrCat("--task-type ", *sources.task_type);
  } else if (spec.task) {
    id.type = spec.task->type;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--task-index: needs --task-type (", spec.source, " gives no task.type)"));
  }
  if (sources.task_index) {
    id.index = *sources.task_index;
    index_where = absl::StrCat("--task-index ", *sources.task_index);
  } else if (spec.task) {
    id.index = spec.task->index;
  } else {
    id.index = 0;  // as TF: a task without an index is task 0
  }
  SW_RETURN_IF_ERROR(CheckTask(spec, id, type_where, index_where));
  spec.task = id;
  SW_RETURN_IF_ERROR(SetRendezvous(sources, &spec));
  return spec;
}

absl::StatusOr<ShardMap> ShardMap::Make(int num_shards, int num_ps) {
  if (num_ps < 1) return absl::InvalidArgumentError("cluster.ps: a cluster needs at least one ps task");
  if (num_shards < num_ps) {
    return absl::InvalidArgumentError(
        absl::StrCat("ps.shards: ", num_shards, " shard", num_shards == 1 ? "" : "s", " over ", num_ps,
                     " ps tasks would leave ps:", num_ps - 1, " without a shard (need ps.shards >= ", num_ps, ")"));
  }
  ShardMap m;
  m.num_shards_ = num_shards;
  m.first_.resize(num_ps + 1);
  const int base = num_shards / num_ps, extra = num_shards % num_ps;
  for (int p = 0; p < num_ps; ++p) m.first_[p + 1] = m.first_[p] + base + (p < extra ? 1 : 0);
  return m;
}

int ShardMap::OwnerOf(int shard) const {
  // first_ is sorted; the owner is the last p with first_[p] <= shard.
  int lo = 0, hi = num_ps() - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_[mid] <= shard) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace shardwild
