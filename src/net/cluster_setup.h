// What the tasks of a cluster (ps_task.h, worker_task.h, chief_task.h)
// decide alike from the config and the cluster spec, so that every process
// computes the same layout, shard map and connections.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/dataset.h"
#include "core/config/options.h"
#include "net/cluster_spec.h"
#include "net/cluster_store.h"
#include "net/net_options.h"
#include "ps_shm/param_store.h"

namespace shardwild {

// Where a task's lines go (one whole line each; thread-safe).
using TaskLog = std::function<void(const std::string& line)>;

// The global shard count of a cluster: ps.shards, or with `auto` one shard
// per ps task (machines may differ in NUMA nodes, so `auto` cannot follow
// one machine's). InvalidArgument (the config's file, then ShardMap::Make's
// message naming ps.shards) when there are fewer shards than ps tasks.
absl::StatusOr<int> ClusterShards(const Config& config, const ClusterSpec& spec);

// The variables and tables of the model on this data, as every task
// computes them (Model::Describe on the training set's shape).
struct ModelLayout {
  std::vector<VariableSpec> variables;
  std::vector<TableSpec> tables;
};
absl::StatusOr<ModelLayout> DescribeModel(const Config& config, const Dataset& train);

// The client options of every ps task, in index order
// (MakePsClientOptions), with attempts enough that a call keeps retrying
// for at least cluster.deadline_s: a ps task restarted within its deadline
// is found again by the calls in flight.
absl::StatusOr<std::vector<PsClientOptions>> PsClientsOf(const Config& config, const ClusterSpec& spec);

// The parameters as a worker task (or any task computing) sees them: a
// ClusterParamStore over every ps task (ShardMap of ClusterShards), the ps
// tasks on this task's host attached through shared memory
// (AttachLocalPsStores), the others through gRPC. Pushes may be left in
// flight (ClusterStoreOptions::async_pushes: 2 per worker thread, at most
// 64: a step's dense push and its batch of row pushes): whoever trains on it
// calls Flush before reporting a task.
struct ClusterStoreConnection {
  LocalPsStores local;                       // declared first: outlives `store`
  std::unique_ptr<ClusterParamStore> store;
};
// Connects task `task` of `spec`; each ps task reached through gRPC after
// all although on this host is reported on `log` with the reason. A push
// returns with up to `async_pushes` of its remote parts in flight
// (ClusterStoreOptions; -1 = a worker task's Hogwild default, two per worker
// thread; 0 = every push waits for its ps tasks, as allreduce rounds need).
absl::StatusOr<std::unique_ptr<ClusterStoreConnection>> ConnectClusterStore(const Config& config,
                                                                            const ClusterSpec& spec,
                                                                            const TaskId& task, const TaskLog& log,
                                                                            int async_pushes = -1);

// The ps tasks' layout (ClusterParamStore::Connect has checked that every
// ps task serves the same one, with the shard map's blocks) against the
// model `who` ("the chief", "rank 0") expects of them: FailedPrecondition
// naming the first variable or table that differs.
absl::Status CheckPsLayout(const StoreLayout& got, const ModelLayout& want, const std::string& who);

// Tells every ps task of `store` that the job is done (ps.proto JobDone),
// `from` naming the sender: those srun or mpirun started exit. A ps task
// that cannot be told is reported on `log`; nothing fails.
void TellPsTasksJobDone(ClusterParamStore& store, const std::string& from, const TaskLog& log);

// The smallest number of attempts whose backoffs (initial, doubling, capped
// at max) add up to at least `seconds`, and at least options.max_attempts.
int AttemptsCovering(const PsClientOptions& options, double seconds);

}  // namespace shardwild
