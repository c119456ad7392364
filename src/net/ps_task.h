// A cluster's ps task (`shardwild serve CONFIG` with task type ps): hosts
// its block of the global shards (ShardMap) in this machine's shared memory
// and serves them (PsServer) until told to stop.
//
// Under train.strategy allreduce a ps task hosts the model's embedding
// tables only: the dense variables stay on each rank, which allreduces
// their gradients. A model without tables is an error there.
//
// Every task derives the same layout: the model is described on the
// training set's shape (the ps task reads data.train for it, as far as
// data.max_train_records says), ps.shards gives the global shard count
// (cluster_setup.h ClusterShards) and the partitioner is ps.partitioner.
// Initial values come from train.seed, so a fresh cluster starts from the
// values one machine would.
//
// Checkpoints: SaveShard and RestoreShard read and write
// <checkpoint.dir>/ps-<index> on this machine (no checkpoint.dir: both
// refuse). The ps task loads nothing by itself when it starts: the chief
// tells it which checkpoint to load (when a job resumes, or when it notices
// that this ps task was restarted), so a fresh job never sees old values.
#pragma once

#include <atomic>

#include "absl/status/status.h"
#include "core/config/options.h"
#include "net/cluster_setup.h"
#include "net/cluster_spec.h"

namespace shardwild {

// Runs ps task `index` of `spec` until `stop` becomes true (the CLI sets it
// on SIGTERM or SIGINT), or, when srun or mpirun started it (spec.source
// Slurm or Open MPI), until the chief or rank 0 says the job is done
// (ps.proto JobDone), then shuts the server down. Errors: the data's,
// the config's (ps.shards fewer than ps tasks), the store's, the server's
// (Unavailable when its address cannot be bound).
absl::Status RunPsTask(const Config& config, const ClusterSpec& spec, int index, const std::atomic<bool>& stop,
                       const TaskLog& log);

}  // namespace shardwild
