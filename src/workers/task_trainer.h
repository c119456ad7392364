// Task training: the dispatcher (workers/dispatcher.h, ElasticDL's master)
// runs in the main process and hands out training and evaluation tasks to
// the workers, which run them and report back. RunTraining uses it for
// ps.update hogwild and row_lock (sync trains in lockstep rounds, trainer.h).
// The workers are one of three kinds, behind the same loop and line protocol
// (workers/task_workers.h):
//
//   * In-process (the default): the Job's own pinned worker threads, driven
//     through a Coordinator (workers/coordinator.h, TF's ClusterCoordinator)
//     whose worker i runs its functions on the Job's thread i
//     (WorkerPool::RunOn). A task sent to a slot is a scheduled function
//     that runs the task line on the worker's TaskRunner and posts the reply
//     to the slot's inbox (a pipe wakes the loop's poll). Threads cannot
//     die; a slot silent past train.task_timeout_s is given up on like a
//     dead process (its task re-queued, a fresh slot started), but the
//     function still running keeps its thread until it returns.
//   * Worker processes (train.worker_processes): each worker is its own
//     process, attached by name to the job's shared-memory store. A worker
//     can really die (SIGKILL, a crash): its task is re-queued and the job
//     goes on, with a replacement (train.restart_workers) or with fewer
//     workers.
//   * Remote worker tasks (a cluster's chief, TrainRunOptions::external;
//     src/net/chief.h): each thread of each worker task of the cluster is a
//     slot, its channel a gRPC session; a session that ends is a death.
//
// Processes. RunTaskTraining starts one worker process per worker with
// posix_spawn of TrainRunOptions::worker_command (the CLI passes
// {"/proc/self/exe", "worker", CONFIG, "--set", k=v, ...}) followed by
//   --store NAME --index I --fd 3 --parent PID
// and one end of a socketpair as fd 3. The child (the CLI's hidden `shardwild
// worker` subcommand, RunWorkerProcess below) sets PR_SET_PDEATHSIG to
// SIGKILL and checks that its parent is still PID, so it never outlives the
// main process (the death signal follows the thread that spawned it: call
// RunTraining on a thread that lives until it returns, as the CLI's main
// thread does). It loads the training data (the same data.train and
// data.max_train_records) and, when evaluation runs inline (data.test set,
// eval.sidecar false), the test data, attaches to the store with
// ShmParamStore::Attach(NAME, optimizer), pins itself as the in-process
// worker I would be (train.pin_threads, intra_op_threads), builds one Worker
// and serves tasks. Its stdout stays unused; warnings go to stderr.
//
// Protocol: text lines over the stream socket, one message per line, numbers
// in decimal (floating point with 17 significant digits, so they round-trip).
//   child -> parent
//     ready <pid> <records> <test>     set up; the training and test records it loaded
//     hb                               heartbeat, at most once a second while a task runs
//     done <lease> <records> <steps> <loss_sum> <correct>
//     evaldone <lease> <count> <correct> <loss_sum> <metrics>
//         an evaluation task's EvalResult; <metrics> is EvalMetrics::Serialize
//         in base64 ("-" when the head has none)
//     fail <lease> <message>           the task failed (Worker::TrainRange's or Evaluate's error)
//     fatal <message>                  setup failed; the child exits 1
//   parent -> child
//     task <lease> <epoch> <first> <count> <progress_begin> <progress_per_step>
//         train positions [first, first + count) of EpochOrder(records,
//         train.seed, epoch); step k uses optimizer.LrAt(progress_begin +
//         k * progress_per_step)
//     eval <lease> <first> <count>     evaluate test records [first, first + count)
//     exit                             (or EOF) the child exits 0
// A child runs a task as one Worker::TrainRange call and sends a heartbeat
// between its steps when a second has passed since its last message.
//
// Death and timeouts. EOF (or an error) on a worker's socket, or its exit,
// is a death: the parent reaps it and calls Dispatcher::WorkerDied, so its
// task goes back to the front of the queue (tasks_requeued and
// worker_failures grow). A busy worker silent for longer than
// train.task_timeout_s is killed with SIGKILL and handled as a death; so is
// one that does not say `ready` within that time. With
// train.restart_workers a replacement process starts in the same slot (a
// fresh dispatcher worker id); otherwise the job goes on with the rest and
// fails with a clear error when none is left. A task re-queued more than
// train.max_task_retries times fails the job (the dispatcher's error). A
// worker that dies before it is ready (setup error) fails the job with its
// message instead of being restarted.
//
// What is exact. Records are counted when a task is reported done
// (Dispatcher), so records_seen == epochs x records even when workers die,
// and the epoch's train loss / accuracy average exactly the records of done
// tasks. Steps count the steps of done tasks. The parameters, though, may
// also have received the pushes of a killed worker's partial task (at-least-
// once application of gradients, as in ElasticDL): model_version can exceed
// steps. tasks_requeued and worker_failures are the dispatcher's counters.
//
// Learning rate. A task is trained at the epoch progress when it is handed
// out: progress_begin = (epoch - 1 + r / n) / epochs, where r is the number
// of this epoch's records reported done so far and n the records per epoch,
// advancing by batch / (n x epochs) per step of the task. So the schedule
// advances through the epoch as tasks complete; a re-queued task runs at the
// progress of its new hand-out.
//
// Epochs, evaluation, checkpoints. Tasks are the dispatcher's (records per
// task: data.records_per_task), shuffled per epoch; epochs never overlap.
// At each epoch's end every worker is idle: the parent evaluates data.test
// (eval.every_epochs and the last epoch), writes metrics, applies
// early_stopping and writes checkpoints (checkpoint.every_epochs and the
// end). With several replicas (in-process ps.replication per_node /
// per_core) they are averaged first, so evaluation and checkpoints see one
// model.
//
// Evaluation is one evaluation round of the dispatcher over data.test, in
// tasks of data.records_per_task records, run by the workers while no
// training task is out (Dispatcher::GetEvaluationTask). A worker that dies
// during it has its evaluation task re-queued; each task's result counts
// once (the first accepted report; a stale one is dropped), and the parts
// are merged in task order, so every evaluation sees every test record
// exactly once (eval_records_seen == evaluations x test records).
//
// Every N steps (checkpoint.every_steps, eval.every_steps): N steps of each
// worker, that is N x workers (the job's worker count, also after a worker
// is lost without restart) steps over all workers, where a step counts when
// its task is
// reported done, over the whole training (resumes included: the count is
// TrainSummary::steps, which checkpoints carry). When the steps done plus
// those of the tasks out reach the next multiple, the parent stops handing
// out tasks (drains); once the last task out has reported (or its worker has
// died and the task gone back to the queue, which then resumes hand-outs
// until the multiple is reached again), every worker is idle and the parent
// evaluates (as at an epoch's end, reported through
// RunCallbacks::OnEvaluation, early stopping included: a stop ends the epoch
// and training there, with a final checkpoint) and then writes the
// checkpoint, and hand-outs resume. Each therefore happens at the first task
// boundary at or after its multiple, less than one task's steps late, and a
// period shorter than a task means one checkpoint or evaluation per task
// boundary; one that falls due at an epoch's end is that epoch end's
// (evaluation and checkpoint there even when eval.every_epochs /
// checkpoint.every_epochs would skip it). The drain idles the workers that
// finish first.
//
// Checkpoint data cursor. data_cursor["dispatcher"] is the dispatcher's
// cursor (the epoch, its shuffle state and the ids of its tasks done; tasks
// out are never part of it: checkpoints are written only with none out).
// Resuming from a checkpoint written in the middle of an epoch re-runs only
// the epoch's tasks not done, so records_seen stays exact (== epochs x
// records); the epoch's history entry then counts the records of this run
// only. The cursor does not depend on the kind of workers: a checkpoint of
// in-process task training resumes with worker processes and the other way.
// data_cursor["round"] is always 0 and ["epoch_records"] the records of the
// epoch's done tasks, so lockstep (sync) training resuming from a mid-epoch
// checkpoint of task training restarts the epoch, counting its records once.
// The other way, a mid-epoch checkpoint of lockstep training (a round, no
// dispatcher cursor) restarts that epoch here, with records_seen exact.
//
// Metrics. Every train.log_every_s, from the tasks reported done so far in
// the epoch, a progress line and a `kind: train` metrics record
// (RunCallbacks::OnProgress: the epoch's mean train loss and its samples/s,
// at the global step). With TrainRunOptions::live_metrics the loop also
// publishes that loss (and each epoch's) and the dispatcher's counters
// there; with metrics.port set, each worker process serves its own worker's
// counters on metrics.port + 1 + I (workers/live_metrics.h), listening
// before it loads its data, so that a port in use fails its start (`fatal`).
//
// Requirements (Config::Validate and RunTaskTraining): ps.update hogwild or
// row_lock (sync steps all workers together, trainer.h); worker processes
// also need one copy of the parameters (ps.replication per_machine, or auto
// resolving to it).
//
// Thread safety: RunTaskTraining runs its loop on the calling thread (and,
// in-process, the task functions on the Job's worker threads; the Job must
// not be used otherwise meanwhile); RunWorkerProcess is a process's main
// loop.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/options.h"
#include "workers/job.h"
#include "workers/progress.h"
#include "workers/task_workers.h"
#include "workers/trainer.h"

namespace shardwild {

// A cluster's chief (src/net, `shardwild train` with a cluster spec): the
// task loop runs here, but the parameters live on the ps tasks and the
// workers are remote worker tasks. RunTaskTraining then uses these instead
// of the Job's store and workers (the Job holds the data only: JobOptions
// workers false), and never averages replicas.
struct ExternalTraining {
  // The worker slots, and the workers that fill them.
  int workers = 0;
  std::function<absl::StatusOr<std::unique_ptr<TaskWorkers>>()> make_workers;
  // Writes the checkpoint of `state` with every worker idle (the
  // parameters first, then the chief's record of them) and returns its
  // path.
  std::function<absl::StatusOr<std::string>(const CheckpointState& state, const CheckpointWriteOptions& options)>
      write_checkpoint;
  // Loads the parameters of a checkpoint write_checkpoint wrote.
  std::function<absl::Status(const CheckpointInfo& checkpoint)> restore_params;
  // The model version (pushes applied).
  std::function<uint64_t()> version;
  // Called every turn of the loop (about every 50 ms): a non-OK status
  // stops the job with it (a ps task unreachable past its deadline).
  std::function<absl::Status()> check;
  // For the summary.
  std::string store_name;
  int shards = 0;
  uint64_t store_bytes = 0;
};

// Trains `job` in dispatcher tasks (see above): with options.external on
// its workers (a cluster's chief), else on worker processes when
// config.train.worker_processes is set (options.worker_command must name the
// worker program), else on the job's worker threads. Called by RunTraining
// for ps.update hogwild and row_lock; options as for RunTraining. Errors:
// InvalidArgument for an unusable config or command (ps.update sync
// included); the dispatcher's error when a task is out of retries;
// FailedPrecondition when no worker is left or a worker fails to start (its
// message). Worker processes still running are killed and reaped on every
// return.
absl::StatusOr<TrainSummary> RunTaskTraining(Job& job, ProgressReporter& progress, const TrainRunOptions& options);

// The arguments the parent appends to worker_command.
struct WorkerProcessArgs {
  std::string store;  // --store: the store's name()
  int index = 0;      // --index: which worker (placement, Worker index)
  int fd = -1;        // --fd: the socket to the parent
  pid_t parent = 0;   // --parent: the main process
  // Test hooks (--die-at-eval-task K --die-marker FILE): the first worker
  // process to create FILE (exclusively) kills itself with SIGKILL when its
  // K-th evaluation task arrives, before running it; 0 = never.
  int die_at_eval_task = 0;
  std::string die_marker;
};

// The worker process's main loop (the CLI's `shardwild worker`): returns
// the process exit code, 0 after `exit` or EOF. Setup errors (a config that
// did not load included) are sent as `fatal` and returned as 1.
int RunWorkerProcess(const absl::StatusOr<Config>& config, const WorkerProcessArgs& args);

}  // namespace shardwild
