// One rank of a train.strategy allreduce job (`shardwild train CONFIG`
// started by TF_CONFIG, srun or mpirun; net/launch_env.h): every rank
// trains the whole dense model on its own machine's store, in lock-step
// rounds with every other rank. Inside the process the workers' gradients
// meet in the sync barrier (ps_shm/sync_aggregator.h); across processes the
// barrier's sums go through Gloo's ring allreduce (net/allreduce.h), and
// every rank applies the same mean to identical parameters.
//
// Before the first step the ranks compare their model layouts and their
// parameters (FailedPrecondition on every rank when they differ: another
// config, model or data; a rank resumed from other checkpoints). After the
// last, they compare the parameters again. Rank 0 alone writes checkpoints.
//
// Elastic: rank 0 of the first generation keeps the membership (it must
// outlive the job). A member that dies fails the others' collective; they
// re-form without it within a grace period, take rank 0's parameters and
// optimizer state, and split what is left of the epoch among themselves
// (workers/trainer.h ElasticGroup); cluster.min_workers stops the job when
// too few are left. A process started later (with the same config and the
// launcher's variables of any rank) joins at the next segment boundary and
// takes the state by broadcast. summary.records_seen counts the group's
// records, worker_failures the members lost, and the JSON summary's
// membership_changes the re-formings.
//
// Embedding tables live on the cluster's ps tasks (`shardwild serve`, which
// host the tables only under allreduce): every rank reaches them through
// `tables` (the Job's JobOptions::tables), pushes its own workers' rows each
// round (ps_shm/sync_aggregator.h), and rank 0 opens them. The dense
// parameters stay bit-identical on every rank; the tables are one copy.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "net/cluster_spec.h"
#include "workers/job.h"
#include "workers/progress.h"
#include "workers/trainer.h"

namespace shardwild {

class ClusterParamStore;

struct AllreduceStats {
  int rank = 0;
  int world = 1;
  int64_t local_records = 0;    // this rank's
  uint64_t payload_bytes = 0;   // summed by this rank's collectives
  double collective_s = 0;      // spent in them
  uint64_t collectives = 0;
  uint64_t params_fingerprint = 0;  // of the final parameters, equal on every rank
  int64_t membership_changes = 0;   // re-formings this rank took part in
  int64_t generation = 0;           // the group's at the end
  // Collectives of the dense gradient per round: one per layer with
  // cluster.allreduce_overlap (each overlapping the backward of the layers
  // below), else 1.
  int buckets = 1;
  // Of this rank's workers' buckets, those handed over during the backward.
  uint64_t buckets_during_backward = 0;
  int ps_tasks = 0;  // hosting the embedding tables (0: a dense model)
};

// Runs rank AllreduceRankOf(spec, *spec.task) of the job on `job` (a job
// of this machine's store, train.strategy allreduce). `tables`: the ps
// tasks' store the Job keeps its embedding tables in (JobOptions::tables),
// null for a dense model. InvalidArgument when the task is not a rank (ps,
// evaluator), when the model has tables and the cluster no ps task, or ps
// tasks and no tables; FailedPrecondition when the ps tasks host other
// tables than the model's; Unavailable when the ranks cannot meet or one is
// lost.
absl::StatusOr<TrainSummary> RunAllreduceRank(Job& job, const ClusterSpec& spec, ProgressReporter& progress,
                                              TrainRunOptions options, AllreduceStats* stats,
                                              ClusterParamStore* tables = nullptr);

// `shardwild bench` with train.strategy allreduce, on every rank: the
// allreduce of the model's dense gradient (`floats` floats, as a training
// round sums it) timed over `iterations` calls after 3 warm-up calls, next
// to the same run's loopback TCP bandwidth (rank 0 streams 256 MiB through
// a 127.0.0.1 connection to itself while the other ranks wait).
struct AllreduceBench {
  int rank = 0;
  int world = 1;
  int64_t floats = 0;
  int64_t iterations = 0;
  double seconds = 0;            // of the timed calls
  double algorithm_bytes_per_s = 0;  // payload bytes per call / seconds per call
  // What each rank sends and receives in a ring allreduce, 2 (n-1)/n of the
  // payload per call, per second: the figure comparable with a link's
  // bandwidth (nccl-tests' "bus bandwidth").
  double bus_bytes_per_s = 0;
  double tcp_loopback_bytes_per_s = 0;  // measured by rank 0, shared with every rank
};
absl::StatusOr<AllreduceBench> RunAllreduceBench(const Config& config, const ClusterSpec& spec, int64_t floats,
                                                 int64_t iterations, ProgressReporter& progress);

// Bytes per second through one loopback TCP connection (127.0.0.1), a
// writer thread to a reader, `bytes` in 1 MiB writes.
absl::StatusOr<double> LoopbackTcpBytesPerS(int64_t bytes);

}  // namespace shardwild
