// The cluster spec: which machines a job runs on, in which roles, and which
// ps task owns which shards.
//
// The spec is TensorFlow's TF_CONFIG JSON:
//   {"cluster": {"chief": ["host:port"], "ps": [...], "worker": [...], "evaluator": [...]},
//    "task": {"type": "worker", "index": 1}}
// A role's list may also be an object from index to address, as TF's
// ClusterSpec allows ({"0": "a:1", "1": "b:2"}); its indices must then be
// 0..n-1, each once. Unknown keys at the top and in "task" are ignored, since
// cloud launchers add their own ("environment", "rpc_layer", "task.trial",
// ...); a key under "cluster" names a role, and an unknown one is an error.
//
// Rules checked (each violation is one InvalidArgument line naming the
// source, the key and what was expected, e.g.
//   cluster.json: cluster.ps[1]: expected host:port with a port in 1..65535, got 'ps1:0'):
//   * every address is host:port, the host non-empty (IPv6 in brackets:
//     "[::1]:2222"), the port in 1..65535;
//   * roles are chief, ps, worker, evaluator: any other key under "cluster"
//     is an unknown role;
//   * no address appears twice (over all roles), no index twice;
//   * exactly one chief, and at least one ps task;
//   * task.type is a role the cluster has and task.index is in range.
//
// This file reads no environment: the CLI reads TF_CONFIG and passes its
// value down (ClusterSpecSources). Pure functions, thread-compatible types.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config/options.h"

namespace shardwild {

// A task's role in the cluster (TF_CONFIG's task "type"; not the dispatcher's
// workers/dispatcher.h TaskType, which says what a data task is for).
enum class Role { kChief, kPs, kWorker, kEvaluator };
inline constexpr int kNumRoles = 4;

// "chief", "ps", "worker", "evaluator".
const char* RoleName(Role t);
// The inverse of RoleName; nullopt for anything else.
std::optional<Role> RoleFromName(std::string_view name);

// A task's network address.
struct HostPort {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  int port = 0;      // 1..65535

  // "host:port", with brackets around an IPv6 host ("[::1]:2222").
  std::string ToString() const;
  // Whether the host is a loopback address: localhost, 127.0.0.0/8 or ::1.
  bool IsLoopback() const;
  bool operator==(const HostPort& o) const { return host == o.host && port == o.port; }
};

// Parses "host:port" or "[v6]:port". The error says what was expected and
// quotes `text`, without a source (callers prefix the key).
absl::StatusOr<HostPort> ParseHostPort(std::string_view text);

// Whether `host` (a name or an address, IPv6 with or without brackets) is
// loopback: localhost, 127.0.0.0/8 or ::1.
bool IsLoopbackHost(std::string_view host);

struct TaskId {
  Role type = Role::kChief;
  int index = 0;
  // "ps:1", as TF names tasks ("/job:ps/task:1").
  std::string ToString() const;
  bool operator==(const TaskId& o) const { return type == o.type && index == o.index; }
};

struct ClusterSpec {
  // tasks[type][i]: the address of task i of that role.
  std::array<std::vector<HostPort>, kNumRoles> tasks;
  // This process's task; nullopt when the spec gives none (cluster-info can
  // still print the cluster).
  std::optional<TaskId> task;
  // Where the spec came from, for messages: a file path, "TF_CONFIG",
  // "Slurm" or "Open MPI" (launch_env.h).
  std::string source;
  // train.strategy allreduce: where the ranks meet (cluster.rendezvous, or
  // rank 0's address); nullopt with strategy ps.
  std::optional<HostPort> rendezvous;

  int num_tasks(Role t) const { return static_cast<int>(tasks[static_cast<int>(t)].size()); }
  // The address of `id`, which must be in range.
  const HostPort& address(const TaskId& id) const { return tasks[static_cast<int>(id.type)][id.index]; }
};

// Parses TF_CONFIG JSON `text`; `source` names it in messages (a path, or
// "TF_CONFIG"). Checks every rule above; with `strategy` allreduce the
// chief is optional (at most one) and ps tasks too, but the cluster needs a
// chief or a worker.
absl::StatusOr<ClusterSpec> ParseClusterSpec(std::string_view text, const std::string& source,
                                             TrainStrategy strategy = TrainStrategy::kPs);

// train.strategy allreduce: the ranks of a cluster are its chief (if any),
// then its worker tasks in index order. AllreduceRankOf is nullopt for a
// task of another role (ps, evaluator).
int AllreduceWorldSize(const ClusterSpec& spec);
std::optional<int> AllreduceRankOf(const ClusterSpec& spec, const TaskId& task);
TaskId AllreduceTaskOfRank(const ClusterSpec& spec, int rank);

// The launchers' variables (launch_env.h), each as set (nullopt = unset).
struct LaunchEnv {
  std::optional<std::string> slurm_procid;          // SLURM_PROCID
  std::optional<std::string> slurm_ntasks;          // SLURM_STEP_NUM_TASKS, else SLURM_NTASKS
  std::optional<std::string> slurm_nodelist;        // SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST
  std::optional<std::string> slurm_tasks_per_node;  // SLURM_STEP_TASKS_PER_NODE, else SLURM_TASKS_PER_NODE
  std::optional<std::string> ompi_rank;             // OMPI_COMM_WORLD_RANK
  std::optional<std::string> ompi_size;             // OMPI_COMM_WORLD_SIZE
  std::optional<std::string> ompi_local_size;       // OMPI_COMM_WORLD_LOCAL_SIZE

  // Reads the variables above from this process's environment (the CLI's
  // edge; nothing below it reads the environment).
  static LaunchEnv FromEnviron();
};

// Where the spec of this process comes from, as the CLI found it.
struct ClusterSpecSources {
  std::string cluster_file;              // --cluster FILE; empty = none
  std::optional<std::string> tf_config;  // the value of TF_CONFIG, if set (and non-empty)
  std::optional<std::string> task_type;  // --task-type
  std::optional<int> task_index;         // --task-index
  LaunchEnv env;                         // Slurm's and Open MPI's variables
  // From the config: train.strategy and the cluster.* keys the launchers
  // use (launcher, base_port, ps_tasks, rendezvous).
  TrainStrategy strategy = TrainStrategy::kPs;
  ClusterOptions options;
};

// Whether `sources` place this process in a cluster at all: a file,
// TF_CONFIG, a task flag, or (cluster.launcher allowing) a Slurm or Open MPI
// world of more than one rank. InvalidArgument for malformed launcher
// variables.
absl::StatusOr<bool> HasClusterSource(const ClusterSpecSources& sources);

// The spec of this process, from the first source cluster.launcher allows:
// --cluster FILE, TF_CONFIG, Slurm, Open MPI (NotFound when there is none);
// the task from the flags where given (flags win, each on its own), else
// from the source. --task-index without a type anywhere is an error. With
// strategy allreduce the spec's rendezvous is set: cluster.rendezvous, or
// rank 0's address. Errors name the source (the file, "TF_CONFIG", the
// variable, or the flag) and the key.
absl::StatusOr<ClusterSpec> ResolveClusterSpec(const ClusterSpecSources& sources);

// The global shard map: the store's shards spread over the ps tasks by
// TensorFlow's "div" rule on contiguous blocks. S shards over P ps tasks
// give the first S % P tasks floor(S / P) + 1 shards and the others
// floor(S / P): 5 shards over 2 ps tasks -> ps:0 holds 0,1,2 and ps:1 holds
// 3,4. Each ps task hosts its block in its own shared memory.
class ShardMap {
 public:
  // num_shards >= num_ps >= 1 (every ps task gets at least one shard);
  // InvalidArgument otherwise, naming ps.shards.
  static absl::StatusOr<ShardMap> Make(int num_shards, int num_ps);

  int num_shards() const { return num_shards_; }
  int num_ps() const { return static_cast<int>(first_.size()) - 1; }
  // The ps task that owns `shard` (0 <= shard < num_shards).
  int OwnerOf(int shard) const;
  // The shards ps task `ps` owns: [first_shard(ps), first_shard(ps + 1)).
  int first_shard(int ps) const { return first_[ps]; }
  int num_shards_of(int ps) const { return first_[ps + 1] - first_[ps]; }

 private:
  int num_shards_ = 0;
  std::vector<int> first_;  // size num_ps + 1; first_[P] = num_shards
};

}  // namespace shardwild
