// A cluster's chief (`shardwild train CONFIG` with task type chief): runs
// the dispatcher and the task loop (workers/task_trainer.h) for the whole
// cluster. Its workers are the worker tasks' threads (chief.h,
// RemoteWorkers); its parameters live on the ps tasks.
//
// Checkpoints (checkpoint.dir): with every worker idle, the chief asks each
// ps task to save its shards as ckpt-<step> under <checkpoint.dir>/ps-<i>
// on its machine, and only when all have, writes its own manifest-only
// checkpoint ckpt-<step> in checkpoint.dir (workers/checkpoint.h
// WriteStateCheckpoint): the data cursor, the step and the ps tasks'
// paths. The chief's checkpoint is the commit point, so a crash between
// the two leaves ps checkpoints nobody resumes from. Resuming (a restarted
// cluster), the chief finds its newest checkpoint and asks every ps task to
// load that step.
//
// ps tasks failing. The chief watches every ps task (a GetLayout call
// about four times a second, the store name telling one start of a ps task
// from the next):
//   * a ps task unreachable for longer than cluster.deadline_s stops the job
//     with Unavailable naming it; `shardwild train` resumes from the last
//     checkpoint once the cluster is restarted;
//   * a ps task that comes back (restarted within that time) is told to load
//     the last checkpoint's shards, and the job goes on without restarting
//     the chief; the updates its shards had since that checkpoint are lost
//     (the other shards keep theirs: Hogwild's tolerance of stale values).
//     Calls the workers made meanwhile are retried for cluster.deadline_s
//     (cluster_setup.h PsClientsOf); a task that failed is re-queued.
//
// Worker tasks failing: their slots' sessions end, their tasks are
// re-queued (exact record counts), and they rejoin when restarted (see
// chief.h).
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "core/config/options.h"
#include "net/cluster_spec.h"
#include "workers/job.h"
#include "workers/progress.h"
#include "workers/trainer.h"

namespace shardwild {

class ClusterCoordinator;

// Trains as the chief of `spec` (spec.task must be chief:0). `job` holds
// the data only (Job::Create with JobOptions workers false). `options` as
// for RunTraining (its `external` is set here). Errors: the config's
// (ps.update sync), a ps task's layout that differs from the chief's, an
// unreachable ps task (Unavailable naming it), and RunTaskTraining's.
//
// `before_training`, if set, runs once every worker task has connected for
// scheduled functions (within train.task_timeout_s), before the first task
// is handed out (after a resume's restore), with a ClusterCoordinator over
// the worker tasks (cluster_functions.h); the functions it scheduled are
// joined after it returns. Its error, or the join's, stops the job.
absl::StatusOr<TrainSummary> RunChief(
    Job& job, const ClusterSpec& spec, ProgressReporter& progress, TrainRunOptions options,
    const std::function<absl::Status(ClusterCoordinator&)>& before_training = nullptr);

}  // namespace shardwild
