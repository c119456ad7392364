// Launchers: how a process started by a cluster's own scheduler learns its
// place, with no launcher of ours. Three sources besides TF_CONFIG
// (cluster_spec.h), each turned into the same ClusterSpec:
//
//   Slurm (`srun shardwild train CONFIG`): SLURM_PROCID is the rank,
//     SLURM_NTASKS the world, SLURM_JOB_NODELIST the hosts (in Slurm's
//     compressed form, "node[01-03,07],gpu5") and SLURM_TASKS_PER_NODE how
//     many ranks each host runs ("2(x3),1"), ranks placed block by block as
//     srun's default distribution does. The step's own variables
//     (SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE)
//     win where srun sets them.
//   Open MPI (`mpirun -np N shardwild train CONFIG`): OMPI_COMM_WORLD_RANK and
//     OMPI_COMM_WORLD_SIZE; OMPI_COMM_WORLD_LOCAL_SIZE equal to the size
//     means every rank is on this host. Open MPI does not say which host the
//     other ranks are on, so across hosts it needs cluster.rendezvous (and
//     trains allreduce, whose ranks find each other there).
//
// Ranks become tasks; P is cluster.ps_tasks as resolved for the strategy
// (ClusterOptions::PsTasksFor: by default 1 under ps, 0 under allreduce).
// With train.strategy allreduce the first W = size - P ranks train: rank r
// < W is worker:r, and the ranks meet at cluster.rendezvous, or at rank 0's
// address (as with P = 0). Ranks W..size-1 are ps:0..ps:P-1, which host the
// model's embedding tables while its dense variables stay on the training
// ranks. With train.strategy ps rank 0 is chief:0, ranks 1..P are the ps
// tasks and the rest are worker tasks. Every rank runs `shardwild train`,
// which serves the roles that do not train (under ps all but the chief,
// under allreduce the ps tasks). Rank r's address is its host with port
// cluster.base_port + r. A world of one rank is no cluster: the variables of
// an allocation do not turn a plain run into a cluster task.
//
// This file reads no environment: the CLI copies the variables into a
// LaunchEnv (FromEnviron) and passes it down. Pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config/options.h"
#include "net/cluster_spec.h"

namespace shardwild {

// Expands a Slurm host list ("node[01-03,07],gpu5", "rack[1-2]-n[1-2]") into
// its hosts, in order, keeping the zero padding of each range's lower bound.
// InvalidArgument naming `key` for unbalanced brackets, an empty name, a
// range whose end is below its start, or more than 2^20 hosts in all.
absl::StatusOr<std::vector<std::string>> ExpandSlurmHostlist(std::string_view list, std::string_view key);

// Expands SLURM_TASKS_PER_NODE ("2(x3),1" -> 2,2,2,1). InvalidArgument
// naming `key` for anything else.
absl::StatusOr<std::vector<int>> ParseSlurmTasksPerNode(std::string_view text, std::string_view key);

// What a launcher says about this process: its rank, the world, and each
// rank's host (empty where the launcher does not say).
struct LaunchWorld {
  std::string source;  // "Slurm" or "Open MPI", for messages and cluster-info
  int rank = 0;
  int size = 1;
  std::vector<std::string> hosts;  // size entries, or empty (hosts unknown)
};

// The world of Slurm's variables; nullopt when SLURM_PROCID is unset or the
// world is one rank. InvalidArgument naming the variable when one is
// malformed, missing, or disagrees with another (a rank outside the world,
// tasks per node that do not add up to the world).
absl::StatusOr<std::optional<LaunchWorld>> SlurmWorld(const LaunchEnv& env);
// The same for Open MPI's variables.
absl::StatusOr<std::optional<LaunchWorld>> MpiWorld(const LaunchEnv& env);

// The cluster spec of `world` under `strategy` (the rules at the top), with
// this process's task set. InvalidArgument naming the cluster.* key when
// the world is too small for its roles (ps needs a chief, P ps tasks and a
// worker; allreduce needs P ps tasks and a rank that trains), a port would
// pass 65535, or hosts are unknown where they are needed (every task's
// under ps, the ps tasks' under allreduce).
absl::StatusOr<ClusterSpec> ClusterSpecOfWorld(const LaunchWorld& world, TrainStrategy strategy,
                                               const ClusterOptions& cluster);

}  // namespace shardwild
