#include "workers/task_trainer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <omp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"
#include "ps_shm/shm_store.h"
#include "workers/checkpoint.h"
#include "workers/coordinator.h"
#include "workers/dispatcher.h"
#include "workers/live_metrics.h"
#include "workers/run_callbacks.h"
#include "workers/task_workers.h"
#include "workers/worker.h"

extern char** environ;

namespace shardwild {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// One end of the socket between the main process and a worker process.
class LineChannel final : public SlotChannel {
 public:
  explicit LineChannel(int fd) : fd_(fd) {}

  // Writes `line` and '\n'. False when the peer is gone (no SIGPIPE).
  bool Send(const std::string& line) override {
    const std::string msg = line + "\n";
    size_t off = 0;
    while (off < msg.size()) {
      const ssize_t n = ::send(fd_, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads once (blocking until something arrives) into the buffer. False on
  // EOF or an error.
  bool Fill() override {
    char chunk[4096];
    while (true) {
      const ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buf_.append(chunk, static_cast<size_t>(n));
      return true;
    }
  }
  // Blocks until a whole line arrives; nullopt on EOF or an error.
  std::optional<std::string> ReadLine() {
    std::string line;
    while (!NextLine(&line)) {
      if (!Fill()) return std::nullopt;
    }
    return line;
  }
  int fd() const override { return fd_; }

 private:
  int fd_;
};

std::string Real(double v) { return absl::StrFormat("%.17g", v); }

// ---- The worker process --------------------------------------------------

// The test hook of WorkerProcessArgs: whether this process is the one to
// die, claiming `marker` (created exclusively: only the first process does).
bool ClaimDeath(const std::string& marker) {
  const int fd = open(marker.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// Sets up, says ready, then serves tasks until `exit` or EOF. Errors are
// setup errors (task errors are sent as `fail`).
absl::Status ServeTasks(const Config& config, const WorkerProcessArgs& args, LineChannel& channel) {
  SW_RETURN_IF_ERROR(config.Validate());
  // Placement as the in-process worker `index` would have it (Job::Create).
  SW_ASSIGN_OR_RETURN(std::unique_ptr<Topology> topo, MakeTopology(config.topology));
  const int workers = topo->ResolveWorkers(config.train.workers);
  const int threads = topo->ResolveThreadsPerWorker(config.train.intra_op_threads, workers);
  if (args.index < 0 || args.index >= workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker index ", args.index, " is not in [0, ", workers, ")"));
  }
  // Live metrics on metrics.port + 1 + index, listening before the data
  // loads, so that a port in use fails the start at once.
  LiveMetrics live(MetricsRole::kWorker);
  SW_ASSIGN_OR_RETURN(const std::unique_ptr<MetricsServer> metrics_server,
                      ServeLiveMetrics(config.metrics, MetricsProcess::WorkerProcess(args.index), live));
  const Placement placement = topo->Plan(workers, topo->ResolveShards(config.ps.shards), threads);
  omp_set_dynamic(0);
  omp_set_num_threads(threads);
  if (config.train.pin_threads) SW_RETURN_IF_ERROR(topo->PinCurrentThread(placement.workers[args.index].cores));

  // Streamed: the columnar cache the main process built (valid, so opened
  // as it is); `train` is then the data set's shape.
  std::unique_ptr<ColumnCache> stream;
  Dataset train;
  if (config.data.stream) {
    SW_ASSIGN_OR_RETURN(stream, OpenTrainStream(config));
    train = stream->shape();
  } else {
    SW_ASSIGN_OR_RETURN(train, LoadDataset(config, config.data.train, config.data.max_train_records, nullptr));
  }
  std::optional<Dataset> test;
  if (InlineEvaluation(config)) {
    SW_ASSIGN_OR_RETURN(test, LoadDataset(config, config.data.test, config.data.max_test_records, &train));
    SW_RETURN_IF_ERROR(CheckTestData(train, *test));
  }
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ShmParamStore> store,
                      ShmParamStore::Attach(args.store, config.optimizer, config.sparse_optimizer));
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  SW_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, Worker::Create(args.index, config.model,
                                                                     config.train.batch_size, train, store.get(),
                                                                     engine, config.train.seed));
  WorkerUpdateOptions update;
  update.pull_every = config.train.pull_every;
  update.max_staleness = config.ps.max_staleness;
  update.hot_rows = config.ps.hot_rows;
  update.hot_rows_merge_every = config.ps.hot_rows_merge_every;
  if (config.sparse_optimizer) update.sparse_optimizer = &*config.sparse_optimizer;
  worker->set_update_options(update);
  worker->set_prefetch_burst_lines(PrefetchBurstLinesFor(config));
  const LiveMetrics::Attachment live_worker = live.AttachWorkers({&worker->counters()});
  TaskRunner runner(config, *worker, train, test ? &*test : nullptr);
  if (stream) {
    SW_ASSIGN_OR_RETURN(const StreamFeedOptions feed, StreamFeedOptionsFor(config, stream->bytes_per_record(), workers));
    runner.set_stream(stream.get(), feed);
  }
  if (!channel.Send(absl::StrCat("ready ", getpid(), " ", stream ? stream->records() : train.count, " ",
                                 test ? test->count : 0))) {
    return absl::OkStatus();  // parent gone
  }

  int eval_tasks = 0;
  while (std::optional<std::string> line = channel.ReadLine()) {
    if (*line == "exit") break;
    if (absl::StartsWith(*line, "eval ") && args.die_at_eval_task > 0 && ++eval_tasks == args.die_at_eval_task &&
        ClaimDeath(args.die_marker)) {
      raise(SIGKILL);  // the test hook: killed in the middle of an evaluation task
    }
    const std::optional<std::string> reply = runner.Run(*line, [&channel] { return channel.Send("hb"); });
    if (reply && !channel.Send(*reply)) break;
  }
  return absl::OkStatus();
}

// ---- The main process ----------------------------------------------------

std::string DescribeWaitStatus(int status) {
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  return absl::StrCat("wait status ", status);
}

// The worker processes; the destructor kills and reaps whatever still runs.
class WorkerProcesses final : public TaskWorkers {
 public:
  WorkerProcesses(std::vector<std::string> command, std::string store, int workers)
      : TaskWorkers(workers), command_(std::move(command)), store_(std::move(store)) {}
  ~WorkerProcesses() override {
    for (Slot& s : slots()) {
      if (s.pid > 0) Reap(s, /*kill_first=*/true);
    }
  }
  bool processes() const override { return true; }

  // Starts a process for `slot` (its previous one must be reaped).
  absl::Status Spawn(Slot& slot) override {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      return absl::InternalError(absl::StrCat("socketpair: ", std::strerror(errno)));
    }
    // The child's end goes to fd 3; keep it above 3 here so dup2 really copies
    // (and so clears close-on-exec).
    const int child_end = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
    close(sv[1]);
    if (child_end < 0) {
      close(sv[0]);
      return absl::InternalError(absl::StrCat("fcntl: ", std::strerror(errno)));
    }
    std::vector<std::string> args = command_;
    for (const std::string& a : {std::string("--store"), store_, std::string("--index"), std::to_string(slot.index),
                                 std::string("--fd"), std::string("3"), std::string("--parent"),
                                 std::to_string(getpid())}) {
      args.push_back(a);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, child_end, 3);
    // Nothing else of this process's descriptors reaches the worker (the
    // metrics server's accepted connections are not close-on-exec).
    posix_spawn_file_actions_addclosefrom_np(&actions, 4);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(child_end);
    if (rc != 0) {
      close(sv[0]);
      return absl::FailedPreconditionError(
          absl::StrCat("cannot start worker process '", command_[0], "': ", std::strerror(rc)));
    }
    Started(slot, pid, sv[0], std::make_unique<LineChannel>(sv[0]));
    return absl::OkStatus();
  }

  // Closes the socket and waits for the process (killing it first if
  // asked); returns its wait status. The slot has no process afterwards.
  int Reap(Slot& slot, bool kill_first) override {
    if (slot.fd >= 0) close(slot.fd);
    int status = 0;
    if (slot.pid > 0) {
      if (kill_first) kill(slot.pid, SIGKILL);
      while (waitpid(slot.pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    Cleared(slot);
    return status;
  }

  // Asks every process to exit and reaps them (SIGKILL after `grace`).
  void ExitAll(double grace_s) override {
    for (Slot& s : slots()) {
      if (s.pid > 0 && s.channel) s.channel->Send("exit");
    }
    const auto deadline = Clock::now() + std::chrono::duration<double>(grace_s);
    for (Slot& s : slots()) {
      if (s.pid <= 0) continue;
      if (s.fd >= 0) close(s.fd);
      s.fd = -1;
      s.channel.reset();
      int status = 0;
      while (true) {
        const pid_t r = waitpid(s.pid, &status, WNOHANG);
        if (r == s.pid || (r < 0 && errno != EINTR)) break;
        if (Clock::now() >= deadline) {
          kill(s.pid, SIGKILL);
          while (waitpid(s.pid, &status, 0) < 0 && errno == EINTR) {
          }
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      s.pid = -1;
    }
  }

 private:
  const std::vector<std::string> command_;
  const std::string store_;
};

// Runs a Coordinator function on the Job's pinned worker thread `index`
// (WorkerPool::RunOn), where its Worker was built and its OpenMP thread
// count and pinning are set. The coordinator's dispatch thread `index` is
// the only caller for that index, as RunOn requires.
class PoolThreadExecutor final : public WorkerExecutor {
 public:
  PoolThreadExecutor(WorkerPool* pool, int index) : pool_(pool), index_(index) {}
  absl::Status Run(absl::FunctionRef<absl::Status()> fn) override {
    return pool_->RunOn(index_, [&fn](int) { return fn(); });
  }

 private:
  WorkerPool* const pool_;  // the Job's; outlives the coordinator
  const int index_;
};

// An in-process slot's channel: Send schedules the task line as a
// Coordinator function, which runs it on some idle worker's TaskRunner (the
// slot is bookkeeping for the dispatcher; any worker can run any task) and
// posts the reply, and the heartbeats, to the inbox.
class InProcessChannel final : public SlotChannel {
 public:
  InProcessChannel(std::shared_ptr<Inbox> inbox, Coordinator* coordinator,
                   std::vector<std::unique_ptr<TaskRunner>>* runners)
      : inbox_(std::move(inbox)), coordinator_(coordinator), runners_(runners) {}
  ~InProcessChannel() override { inbox_->Close(); }

  bool Send(const std::string& line) override {
    if (line == "exit") return true;
    // The function's status is OK even when the task failed (the reply says
    // so); it has no RemoteValue to fetch.
    coordinator_->Schedule([inbox = inbox_, runners = runners_, line](const WorkerContext& ctx) {
      const std::optional<std::string> reply = (*runners)[ctx.worker_index()]->Run(line, [&inbox] {
        inbox->Post("hb");
        return true;
      });
      if (reply) inbox->Post(*reply);
    });
    return true;
  }
  bool Fill() override {
    inbox_->Drain(&buf_);
    return true;
  }
  int fd() const override { return inbox_->read_fd(); }

 private:
  const std::shared_ptr<Inbox> inbox_;
  Coordinator* const coordinator_;
  std::vector<std::unique_ptr<TaskRunner>>* const runners_;
};

// The Job's worker threads as task workers, through a Coordinator whose
// worker i runs on the Job's thread i. They cannot die as processes can: a
// slot given up on (silent past train.task_timeout_s) is closed, its task
// re-queued, and a function still running for it keeps its worker until it
// returns (threads cannot be killed).
class InProcessWorkers final : public TaskWorkers {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessWorkers>> Create(Job& job) {
    std::unique_ptr<InProcessWorkers> w(new InProcessWorkers(job.num_workers()));
    const Dataset* test = InlineEvaluation(job.config()) ? job.test() : nullptr;
    std::vector<std::unique_ptr<WorkerExecutor>> executors;
    std::optional<StreamFeedOptions> feed;
    if (job.stream() != nullptr) {
      SW_ASSIGN_OR_RETURN(feed, StreamFeedOptionsFor(job.config(), job.stream()->bytes_per_record(), job.num_workers()));
    }
    for (int i = 0; i < job.num_workers(); ++i) {
      w->runners_.push_back(std::make_unique<TaskRunner>(job.config(), job.worker(i), job.train(), test));
      if (feed) w->runners_.back()->set_stream(job.stream(), *feed);
      executors.push_back(std::make_unique<PoolThreadExecutor>(&job.pool(), i));
    }
    SW_ASSIGN_OR_RETURN(w->coordinator_, Coordinator::Create(std::move(executors)));
    w->ready_line_ = absl::StrCat("ready ", getpid(), " ", job.train_records(), " ", test ? test->count : 0);
    return w;
  }
  ~InProcessWorkers() override { ExitAll(0); }
  bool processes() const override { return false; }

  absl::Status Spawn(Slot& slot) override {
    SW_ASSIGN_OR_RETURN(std::shared_ptr<Inbox> inbox, Inbox::Create());
    const int fd = inbox->read_fd();
    inbox->Post(ready_line_);
    Started(slot, getpid(), fd, std::make_unique<InProcessChannel>(std::move(inbox), coordinator_.get(), &runners_));
    return absl::OkStatus();
  }
  int Reap(Slot& slot, bool /*kill_first*/) override {
    Cleared(slot);  // closes the inbox: replies still to come are dropped
    return 0;
  }
  // Waits for the functions still running (the slots' tasks are done or
  // dropped by then).
  void ExitAll(double /*grace_s*/) override {
    for (Slot& s : slots()) {
      if (s.pid > 0) Cleared(s);
    }
    if (coordinator_) (void)coordinator_->Join();
  }

 private:
  explicit InProcessWorkers(int workers) : TaskWorkers(workers) {}

  std::string ready_line_;
  std::vector<std::unique_ptr<TaskRunner>> runners_;  // [worker]; each used by its worker's thread only
  std::unique_ptr<Coordinator> coordinator_;          // after runners_: its threads stop first
};

struct EpochTotals {
  int64_t records = 0, steps = 0, correct = 0;
  double loss = 0;
};

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// The first multiple of `period` (> 0) above `steps`; kNever when period is 0.
int64_t NextMultiple(int64_t steps, int64_t period) { return period > 0 ? (steps / period + 1) * period : kNever; }

}  // namespace

int RunWorkerProcess(const absl::StatusOr<Config>& config, const WorkerProcessArgs& args) {
  // Never outlive the main process: killed when it dies, and if it died
  // before this line, leave at once.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (args.parent > 0 && getppid() != args.parent) return 1;
  if (args.fd < 0) return 1;
  LineChannel channel(args.fd);
  const absl::Status s = config.ok() ? ServeTasks(*config, args, channel) : config.status();
  if (!s.ok()) {
    channel.Send(absl::StrCat("fatal ", OneLine(s.message())));
    return 1;
  }
  return 0;
}

absl::StatusOr<TrainSummary> RunTaskTraining(Job& job, ProgressReporter& progress, const TrainRunOptions& options) {
  const Config& cfg = job.config();
  const ExternalTraining* const ext = options.external;
  LiveMetrics* const live = options.live_metrics;  // may be null
  const bool processes = ext == nullptr && cfg.train.worker_processes;
  if (processes && options.worker_command.empty()) {
    return absl::InvalidArgumentError(
        "train.worker_processes: no worker command to start (run training through the shardwild command line)");
  }
  if (cfg.ps.update == UpdateMode::kSync) {
    return absl::InvalidArgumentError("ps.update: sync trains in lockstep rounds, not in dispatcher tasks");
  }
  if (ext == nullptr && !job.has_local_store()) {
    return absl::InvalidArgumentError("task training: the job has no store and no external training was given");
  }
  if (processes && job.replicas().num_replicas() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ps.replication: resolved to ", ReplicationPolicyName(job.replicas().plan().policy), " (",
        job.replicas().num_replicas(), " replicas), but train.worker_processes needs one copy; set ps.replication "
        "per_machine"));
  }
  const int workers = ext != nullptr ? ext->workers : job.num_workers();
  // Streamed with the cache still being built (Job::stream_growing): epoch
  // 1's tasks grow as records become readable, and `n` is final once the
  // build has published every record.
  // (A cache already valid, or built by now, is all ready: its whole count
  // is known and epoch 1 is shuffled as any other.)
  bool growing = job.stream_growing() && !job.stream()->all_ready();
  int64_t n = job.train_records();
  const int64_t batch = cfg.train.batch_size;
  const int epochs = cfg.train.epochs;
  const CheckpointOptions& ck = cfg.checkpoint;
  const bool checkpointing = !ck.dir.empty();
  const std::string config_hash = TrainingConfigHash(cfg);

  TrainSummary summary;
  summary.epochs = epochs;
  summary.workers = workers;
  summary.intra_op_threads = job.placement().threads_per_worker;
  summary.shards = ext != nullptr ? ext->shards : job.store().layout().num_shards;
  summary.store_name = ext != nullptr ? ext->store_name : job.store().name();
  summary.store_bytes = ext != nullptr ? ext->store_bytes : job.replicas().total_bytes();
  // The model version: pushes applied (over the replicas; or on the ps tasks).
  auto model_version = [&]() -> uint64_t { return ext != nullptr ? ext->version() : job.replicas().version(); };

  DispatcherOptions dopts;
  dopts.records_per_task = cfg.data.records_per_task;
  dopts.task_timeout_s = cfg.train.task_timeout_s;
  dopts.max_task_retries = cfg.train.max_task_retries;
  dopts.epochs = epochs;
  dopts.seed = cfg.train.seed;
  // Inline evaluation runs as the dispatcher's evaluation rounds over the
  // test set, in the same tasks' size.
  const bool inline_eval = job.test() != nullptr && InlineEvaluation(cfg);
  const int64_t test_n = inline_eval ? job.test()->count : 0;
  std::vector<DataFile> eval_files;
  if (inline_eval) eval_files.push_back(DataFile{cfg.data.test, test_n});

  // Resume: parameters from the newest checkpoint, the dispatcher from its
  // cursor (or the saved epoch from its beginning).
  int first_epoch = 1;
  int64_t base_steps = 0;
  int64_t restored_records = 0;
  nlohmann::json restored_extra;
  std::unique_ptr<Dispatcher> dispatcher;
  {
    SW_ASSIGN_OR_RETURN(std::optional<CheckpointInfo> found, ResumeJob(job, options.fresh, progress, &summary, ext));
    if (found && growing) {
      // A resumed job continues from a cursor over the whole data: its
      // cache is built first.
      progress.Line(absl::StrCat("resuming: building the columnar cache of ", cfg.data.train, " first"));
      SW_RETURN_IF_ERROR(job.FinishStream());
      growing = false;
      n = job.train_records();
    }
    dopts.growing = growing;
    SW_ASSIGN_OR_RETURN(dispatcher, Dispatcher::Create(dopts, {DataFile{cfg.data.train, n}}, std::move(eval_files)));
    if (found) {
      const nlohmann::json& cur = found->state.data_cursor;
      restored_extra = found->state.extra;
      first_epoch = cur.value("epoch", 1);
      base_steps = restored_extra.value("steps", int64_t{0});
      restored_records = restored_extra.value("records_seen", int64_t{0});
      if (first_epoch <= epochs) {
        DataCursor dc = dispatcher->Cursor();  // the right task count; epoch 1, nothing done
        absl::Status restored = absl::UnknownError("no dispatcher cursor");
        // A cursor taken while the data grew (records -1) fits the grown data.
        const int64_t saved_records = cur.value("records", int64_t{0});
        if (cur.contains("dispatcher") &&
            (saved_records == n || (saved_records < 0 && cur["dispatcher"].value("growing", false)))) {
          absl::StatusOr<DataCursor> saved = DataCursor::FromJson(cur["dispatcher"].dump());
          restored = saved.ok() ? dispatcher->Restore(*saved) : saved.status();
        }
        if (!restored.ok()) {
          // An in-process checkpoint, or one of other data: the saved epoch
          // from its beginning, with an order of its own.
          if (cur.value("round", int64_t{0}) > 0 || cur.contains("dispatcher")) {
            progress.Line(absl::StrCat("warning: ", found->path, " cannot be continued task by task (",
                                       restored.message(), "); epoch ", first_epoch, " restarts from its beginning"));
          }
          dc.epoch = first_epoch;
          dc.rng_state = cfg.train.seed ^ (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(first_epoch));
          dc.done.clear();
          SW_RETURN_IF_ERROR(dispatcher->Restore(dc));
        }
      }
      summary.resumed_from_step = found->step;
      const DataCursor now = dispatcher->Cursor();
      progress.Line(absl::StrCat("resumed from ", found->path, ": epoch ", first_epoch,
                                 first_epoch <= epochs ? absl::StrCat(", ", now.done.size(), " of ", now.num_tasks,
                                                                      " tasks done")
                                                       : std::string(" (training was complete)")));
    }
  }

  // Metrics, early stopping (its state travels in checkpoints), epoch lines.
  SW_ASSIGN_OR_RETURN(std::unique_ptr<RunCallbacks> callbacks,
                      RunCallbacks::Create(cfg, summary.resumed_from_step.has_value(), restored_extra, &progress));
  if (options.on_metrics) callbacks->set_observer(options.on_metrics);
  int64_t run_steps = 0;  // steps of done tasks, this run

  // Averages the replicas (in-process ps.replication per_node / per_core),
  // so that evaluations, checkpoints and the next epoch see one model; a
  // no-op when no task has been done since the last call (or with one copy).
  int64_t averaged_at = -1;
  auto average = [&]() -> absl::Status {
    if (base_steps + run_steps == averaged_at) return absl::OkStatus();
    averaged_at = base_steps + run_steps;
    return ext != nullptr ? absl::OkStatus() : job.replicas().Average();
  };

  // "Every N steps" (checkpoint.every_steps, eval.every_steps): in-process,
  // N steps of each worker; here, N x workers steps of done tasks over all
  // worker processes, counted over the whole training (base_steps +
  // run_steps, which a checkpoint carries). Once the steps done plus those
  // of the tasks out reach the next multiple, no task is handed out; when
  // the last one out has reported, the checkpoint or evaluation runs with
  // every worker idle, and hand-outs resume. So each falls on the first task
  // boundary at or after its multiple (at the epoch's end if that comes
  // first, as part of the epoch's end).
  const int64_t ckpt_period = checkpointing && ck.every_steps > 0 ? ck.every_steps * workers : 0;
  const int64_t eval_period = inline_eval && cfg.eval.every_steps > 0 ? cfg.eval.every_steps * workers : 0;
  int64_t next_ckpt = NextMultiple(base_steps, ckpt_period);
  int64_t next_eval = NextMultiple(base_steps, eval_period);

  // Checkpoint of the quiescent job (no task out): training goes on in
  // `next_epoch`, with the tasks the dispatcher's cursor counts as done
  // (holding `epoch_records` records) left out of it; epochs + 1 when
  // training is over. The in-process trainer's "round" stays 0: it cannot
  // continue an epoch task by task, and restarts it.
  auto write_checkpoint = [&](int next_epoch, int64_t epoch_records) -> absl::Status {
    SW_RETURN_IF_ERROR(average());  // several replicas (in-process): save their mean
    const DispatcherCounters dc = dispatcher->counters();
    CheckpointState state;
    state.step = base_steps + run_steps;
    state.epoch = next_epoch - 1;
    state.config_hash = config_hash;
    state.data_cursor = {{"epoch", next_epoch}, {"round", 0},          {"workers", workers},
                         {"batch", batch},      {"records", growing ? int64_t{-1} : n},
                         {"epoch_records", epoch_records},
                         {"seed", cfg.train.seed},
                         {"dispatcher", json::parse(dispatcher->Cursor().ToJson())}};
    state.rng = {{"shuffle_seed", cfg.train.seed}, {"epoch", next_epoch}};
    state.extra = {{"records_seen", dc.records_seen},
                   {"steps", base_steps + run_steps},
                   {"final", next_epoch > epochs || callbacks->stopped()},
                   {"worker_processes", processes}};
    return WriteTrainingCheckpoint(job, std::move(state), *callbacks, options, &summary);
  };

  // Records per epoch: while the data grows, the cache's estimate (for the
  // learning-rate schedule's progress and the progress line; counts stay
  // exact through the dispatcher).
  auto epoch_n = [&]() -> int64_t {
    return growing ? std::max<int64_t>(job.stream()->estimated_records(), 1) : std::max<int64_t>(n, 1);
  };
  // Steps in one epoch over all tasks (for the progress line).
  const int64_t per_task = cfg.data.records_per_task;
  auto steps_in_epoch = [&]() -> int64_t {
    const int64_t m = epoch_n();
    return (m / per_task) * ((per_task + batch - 1) / batch) + ((m % per_task) + batch - 1) / batch;
  };
  // Grows epoch 1's tasks with the records the cache has made readable; a
  // build error (a bad row, I/O) stops the job.
  std::optional<Clock::time_point> first_task_at;
  auto grow = [&]() -> absl::Status {
    if (!growing) return absl::OkStatus();
    const ColumnCache& c = *job.stream();
    SW_RETURN_IF_ERROR(WithErrorKind(c.build_error(), ErrorKind::kData));
    const bool final = c.all_ready();  // before records(): final once this is seen
    const int64_t ready = c.records();
    SW_RETURN_IF_ERROR(dispatcher->GrowTraining(ready, final));
    if (final) {
      growing = false;
      n = ready;
    }
    return absl::OkStatus();
  };

  const auto run_start = Clock::now();
  double train_seconds = 0;
  int64_t run_records = 0;
  double data_wait_s = 0;                                    // streamed: waits of every task reported
  std::vector<int64_t> reader_peak(static_cast<size_t>(workers), 0);  // streamed: each slot's peak
  // Resumed from the final checkpoint: nothing to train; the workers start
  // only to evaluate the final model.
  const bool already_complete = first_epoch > epochs;
  std::optional<RunCallbacks::Evaluation> final_evaluation;
  if (already_complete) {
    progress.Line(absl::StrCat("the job was already complete (its final checkpoint is the newest in ",
                               cfg.checkpoint.dir, "): nothing to train",
                               inline_eval ? "; evaluating the final model" : ""));
  }
  if (!already_complete || inline_eval) {
    std::unique_ptr<TaskWorkers> procs_owner;
    if (ext != nullptr) {
      SW_ASSIGN_OR_RETURN(procs_owner, ext->make_workers());
    } else if (processes) {
      procs_owner = std::make_unique<WorkerProcesses>(options.worker_command, job.store().name(), workers);
    } else {
      SW_ASSIGN_OR_RETURN(procs_owner, InProcessWorkers::Create(job));
    }
    TaskWorkers& procs = *procs_owner;
    const char* const kWorkers = processes ? "worker process" : ext != nullptr ? "worker task" : "worker";
    auto start = [&](Slot& slot, const char* why) -> absl::Status {
      SW_RETURN_IF_ERROR(procs.Spawn(slot));
      if (processes) progress.Line(absl::StrCat("worker ", slot.index, ": pid ", slot.pid, why));
      return absl::OkStatus();
    };
    for (Slot& s : procs.slots()) SW_RETURN_IF_ERROR(start(s, ""));

    int epoch = dispatcher->counters().epoch;
    int completed = dispatcher->counters().epochs_completed;
    EpochTotals totals;
    auto epoch_start = Clock::now();
    bool epoch_started = false;
    auto last_tick = Clock::now();
    std::string last_death;
    std::vector<std::optional<EvalResult>> eval_parts;  // [evaluation task] of the open round, once each

    // A process is gone (or given up on): re-queue its task, restart it or
    // go on without it.
    auto died = [&](Slot& slot, bool kill_first, const std::string& why) -> absl::Status {
      const pid_t pid = slot.pid;
      const bool was_ready = slot.ready;
      const std::string fatal = slot.fatal;
      const int status = procs.Reap(slot, kill_first);
      const std::string how = why.empty() ? DescribeWaitStatus(status) : why;
      if (procs.start_failures_fatal() && (!fatal.empty() || (!was_ready && WIFEXITED(status) && why.empty()))) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker process ", slot.index, " (pid ", pid, ") failed to start: ",
            fatal.empty() ? how : fatal));
      }
      dispatcher->WorkerDied(slot.id);
      const std::string who =
          processes || ext != nullptr ? absl::StrCat("worker ", slot.index, " (pid ", pid, ")") : absl::StrCat("worker ", slot.index);
      last_death = absl::StrCat(who, " ", how);
      progress.Line(absl::StrCat(who, processes ? " died: " : " given up on: ", how,
                                 "; its task goes back to the queue"));
      slot.starts_failed = was_ready ? 0 : slot.starts_failed + 1;
      if (procs.start_failures_fatal() && slot.starts_failed > 3) {
        return absl::FailedPreconditionError(absl::StrCat("worker process ", slot.index, " died ",
                                                          slot.starts_failed, " times before it was ready; last: ",
                                                          how));
      }
      if (cfg.train.restart_workers) return start(slot, " (replacement)");
      if (procs.live() == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "no ", kWorkers, " is left (train.restart_workers is false); the last one: ", last_death));
      }
      return absl::OkStatus();
    };

    // One message from `slot`.
    auto handle = [&](Slot& slot, const std::string& line) -> absl::Status {
      slot.contact = Clock::now();
      const std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 7));
      if (f[0] == "hb") {
        dispatcher->Heartbeat(slot.id);
      } else if (f[0] == "ready" && f.size() >= 4) {
        int64_t records = -1, test_records = -1;
        if (!absl::SimpleAtoi(f[2], &records) || (!dopts.growing && records != n) ||
            !absl::SimpleAtoi(f[3], &test_records) ||
            test_records != test_n) {
          return absl::FailedPreconditionError(absl::StrCat("worker process ", slot.index, " loaded ", f[2],
                                                            " training and ", f[3], " test records, this process ",
                                                            n, " and ", test_n));
        }
        slot.ready = true;
        // A remote worker task's slot learns its process id here.
        if (pid_t pid = 0; ext != nullptr && absl::SimpleAtoi(f[1], &pid) && pid > 0) slot.pid = pid;
        if (processes || ext != nullptr) {
          progress.Line(absl::StrCat("worker ", slot.index, ": pid ", slot.pid, " ready"));
        }
      } else if (f[0] == "evaldone" && slot.busy) {
        uint64_t lease = 0;
        const std::vector<std::string> g = absl::StrSplit(line, ' ');
        absl::StatusOr<EvalResult> r = DecodeEvalResult(g, 2);
        if (g.size() < 2 || !absl::SimpleAtoi(g[1], &lease) || !r.ok()) {
          return absl::InternalError(absl::StrCat("worker ", slot.index, ": malformed reply '", line.substr(0, 200),
                                                  "' (", r.status().message(), ")"));
        }
        slot.busy = false;
        const int64_t index = slot.task_index;
        if (dispatcher->ReportDone(slot.id, lease) == ReportResult::kAccepted) {
          if (slot.task_type != TaskType::kEvaluation || index < 0 ||
              index >= static_cast<int64_t>(eval_parts.size()) || eval_parts[index].has_value()) {
            return absl::InternalError(absl::StrCat("worker ", slot.index, ": evaluation result for task ", index,
                                                    " that is not out"));
          }
          eval_parts[index] = *std::move(r);
        }
      } else if (f[0] == "done" && (f.size() == 6 || f.size() == 8) && slot.busy) {
        EpochTotals t;
        uint64_t lease = 0;
        double wait_s = 0;
        int64_t peak = 0;
        if (!absl::SimpleAtoi(f[1], &lease) || !absl::SimpleAtoi(f[2], &t.records) ||
            !absl::SimpleAtoi(f[3], &t.steps) || !absl::SimpleAtod(f[4], &t.loss) ||
            !absl::SimpleAtoi(f[5], &t.correct) ||
            (f.size() == 8 && (!absl::SimpleAtod(f[6], &wait_s) || !absl::SimpleAtoi(f[7], &peak)))) {
          return absl::InternalError(absl::StrCat("worker ", slot.index, ": malformed reply '", line, "'"));
        }
        // (Streamed data.) Waits count whether or not the report is stale.
        data_wait_s += wait_s;
        if (static_cast<size_t>(slot.index) < reader_peak.size()) {
          reader_peak[static_cast<size_t>(slot.index)] = std::max(reader_peak[static_cast<size_t>(slot.index)], peak);
        }
        slot.busy = false;
        if (dispatcher->ReportDone(slot.id, lease) == ReportResult::kAccepted) {
          totals.records += t.records;
          totals.steps += t.steps;
          totals.loss += t.loss;
          totals.correct += t.correct;
          run_steps += t.steps;
          run_records += t.records;
        }
      } else if (f[0] == "fail" && f.size() >= 2 && slot.busy) {
        uint64_t lease = 0;
        (void)absl::SimpleAtoi(f[1], &lease);
        slot.busy = false;
        const std::string msg = line.size() > 5 + f[1].size() + 1 ? line.substr(5 + f[1].size() + 1) : "";
        dispatcher->ReportFailed(slot.id, lease,
                                 absl::InternalError(absl::StrCat("worker ", slot.index, ": ", msg)));
      } else if (f[0] == "fatal") {
        slot.fatal = line.size() > 6 ? line.substr(6) : "unknown error";
      }
      return absl::OkStatus();
    };

    // The steps of the tasks out.
    auto steps_out = [&]() {
      int64_t steps = 0;
      for (const Slot& slot : procs.slots()) {
        if (slot.pid > 0 && slot.busy) steps += slot.task_steps;
      }
      return steps;
    };

    const double timeout_s = cfg.train.task_timeout_s;
    // A callback stopped the run in the middle of an epoch: no more training
    // tasks go out, and the epoch ends once those out are back.
    bool draining = false;
    auto connected = Clock::now();  // the last time a worker was ready (remote workers connect when they can)
    bool finished = false;  // the dispatcher said kEnd: every training task is done

    // One turn of the loop: hands tasks to the idle workers, waits up to 50
    // ms for messages and handles them, and gives up on silent workers.
    // Training hands out training tasks (the next ones of the dispatcher)
    // unless enough steps are out to reach a checkpoint or evaluation due by
    // steps (then it drains); `evaluation` hands out only the open
    // evaluation round's tasks.
    auto pump = [&](bool evaluation) -> absl::Status {
      if (Interrupted(options)) return InterruptedError();
      SW_RETURN_IF_ERROR(grow());
      int64_t out = steps_out();
      for (Slot& slot : procs.slots()) {
        if (slot.pid <= 0 || !slot.ready || slot.busy) continue;
        if (!evaluation && (draining || base_steps + run_steps + out >= std::min(next_ckpt, next_eval))) break;
        SW_ASSIGN_OR_RETURN(Assignment a,
                            evaluation ? dispatcher->GetEvaluationTask(slot.id) : dispatcher->GetTask(slot.id));
        if (a.kind == Assignment::Kind::kEnd) {
          finished = true;
          break;
        }
        if (a.kind == Assignment::Kind::kWait) break;
        const Task& t = a.task;
        std::string message;
        slot.task_type = t.type;
        slot.task_index = t.index;
        if (t.type == TaskType::kEvaluation) {
          slot.task_steps = 0;
          message = absl::StrCat("eval ", t.lease, " ", t.first_record, " ", t.records);
        } else {
          if (!epoch_started) {  // the epoch's time runs from its first task (not the workers' start-up)
            epoch_started = true;
            epoch_start = Clock::now();
          }
          if (!first_task_at) {
            first_task_at = Clock::now();
            if (job.stream() != nullptr) summary.records_ready_at_first_task = job.stream()->records();
          }
          const int64_t m = epoch_n();
          const int64_t done_in_epoch = dispatcher->counters().records_seen - static_cast<int64_t>(t.epoch - 1) * n;
          const double progress_begin =
              (static_cast<double>(t.epoch - 1) + static_cast<double>(std::clamp<int64_t>(done_in_epoch, 0, m)) / m) /
              epochs;
          const double per_step = static_cast<double>(batch) / (static_cast<double>(m) * epochs);
          slot.task_steps = (t.records + batch - 1) / batch;
          out += slot.task_steps;
          message = absl::StrCat("task ", t.lease, " ", t.epoch, " ", t.first_record, " ", t.records, " ",
                                 Real(progress_begin), " ", Real(per_step));
        }
        slot.busy = true;
        slot.lease = t.lease;
        slot.contact = Clock::now();
        if (!slot.channel->Send(message)) SW_RETURN_IF_ERROR(died(slot, /*kill_first=*/true, ""));
      }
      if (finished) return absl::OkStatus();

      // Wait for messages.
      std::vector<pollfd> fds;
      std::vector<Slot*> polled;
      for (Slot& slot : procs.slots()) {
        if (slot.pid <= 0) continue;
        fds.push_back(pollfd{slot.fd, POLLIN, 0});
        polled.push_back(&slot);
      }
      if (fds.empty()) {
        return absl::FailedPreconditionError(absl::StrCat("no ", kWorkers, " is left; the last one: ", last_death));
      }
      const int ready = poll(fds.data(), fds.size(), 50);
      if (ready < 0 && errno != EINTR) return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
      for (size_t i = 0; i < fds.size() && ready > 0; ++i) {
        Slot& slot = *polled[i];
        if (fds[i].revents == 0 || slot.pid <= 0) continue;
        if (!slot.channel->Fill()) {
          // Whatever it said last still counts (a `done` before dying).
          std::string line;
          while (slot.channel->NextLine(&line)) SW_RETURN_IF_ERROR(handle(slot, line));
          SW_RETURN_IF_ERROR(died(slot, /*kill_first=*/false, ""));
          continue;
        }
        std::string line;
        while (slot.channel && slot.channel->NextLine(&line)) SW_RETURN_IF_ERROR(handle(slot, line));
      }

      // Silent workers: a task (or the start) out for too long.
      for (Slot& slot : procs.slots()) {
        if (slot.pid <= 0 || (slot.ready && !slot.busy) || procs.awaiting(slot)) continue;
        if (SecondsSince(slot.contact) > timeout_s) {
          SW_RETURN_IF_ERROR(died(slot, /*kill_first=*/true,
                                  absl::StrFormat("was silent for more than %g s (train.task_timeout_s); killed",
                                                  timeout_s)));
        }
      }
      if (ext != nullptr) {
        if (std::any_of(procs.slots().begin(), procs.slots().end(), [](const Slot& s) { return s.pid > 0 && s.ready; })) {
          connected = Clock::now();
        } else if (SecondsSince(connected) > timeout_s) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "no worker task has been connected for %g s (train.task_timeout_s); start them with `shardwild serve` "
              "(task type worker)",
              timeout_s));
        }
        if (ext->check) SW_RETURN_IF_ERROR(ext->check());
      }
      return absl::OkStatus();
    };

    // Evaluates data.test with every worker idle: one evaluation round of
    // the dispatcher, its tasks run by the workers (a worker that dies has
    // its task re-queued), the parts merged in task order once each.
    auto evaluate = [&]() -> absl::StatusOr<RunCallbacks::Evaluation> {
      SW_RETURN_IF_ERROR(average());  // several replicas (in-process): evaluate their mean
      EvalResult ev;
      if (test_n > 0) {
        SW_ASSIGN_OR_RETURN(const int round,
                            dispatcher->StartEvaluation(static_cast<int64_t>(model_version())));
        eval_parts.assign(static_cast<size_t>((test_n + cfg.data.records_per_task - 1) / cfg.data.records_per_task),
                          std::nullopt);
        while (!dispatcher->EvaluationDone(round)) {
          SW_RETURN_IF_ERROR(pump(/*evaluation=*/true));
          SW_RETURN_IF_ERROR(dispatcher->status());
        }
        for (size_t i = 0; i < eval_parts.size(); ++i) {
          if (!eval_parts[i]) {
            return absl::InternalError(absl::StrCat("evaluation round ", round, " ended without task ", i));
          }
          ev.Add(*eval_parts[i]);
        }
      }
      summary.eval_records_seen += ev.count;
      return RunCallbacks::Evaluation{ev.count ? ev.loss_sum / ev.count : 0.0,
                                      ev.count ? static_cast<double>(ev.correct) / ev.count : 0.0,
                                      ExtraTestMetrics(ev)};
    };

    // End of an epoch (every worker idle): statistics, evaluation, metrics,
    // early stopping, checkpoint; a checkpoint or evaluation due by steps
    // happens here too. `stopped_before`: early stopping asked to stop in
    // the middle of the epoch (an evaluation between tasks), so it ends
    // partial, without evaluating, and training ends.
    auto end_epoch = [&](bool stopped_before) -> absl::Status {
      // With several replicas (in-process), end the epoch on one model.
      SW_RETURN_IF_ERROR(average());
      const int64_t steps_now = base_steps + run_steps;
      const bool eval_due = steps_now >= next_eval;
      const bool ckpt_due = steps_now >= next_ckpt;
      if (eval_due) next_eval = NextMultiple(steps_now, eval_period);
      if (ckpt_due) next_ckpt = NextMultiple(steps_now, ckpt_period);
      const double seconds = SecondsSince(epoch_start);
      train_seconds += seconds;
      EpochResult er;
      er.epoch = epoch;
      er.records = totals.records;
      er.train_loss = er.records > 0 ? totals.loss / er.records : 0;
      er.train_accuracy = er.records > 0 ? static_cast<double>(totals.correct) / er.records : 0;
      er.seconds = seconds;
      er.samples_per_s = seconds > 0 ? er.records / seconds : 0;
      if (er.records > 0 && live != nullptr) live->SetTrainLoss(er.train_loss);
      const bool last_epoch = epoch == epochs;
      if (inline_eval && !stopped_before &&
          (last_epoch || eval_due || (cfg.eval.every_epochs > 0 && epoch % cfg.eval.every_epochs == 0))) {
        SW_ASSIGN_OR_RETURN(const RunCallbacks::Evaluation ev, evaluate());
        er.test_loss = ev.loss;
        er.test_accuracy = ev.accuracy;
        er.test_metrics = ev.extra;
      }
      summary.history.push_back(er);
      SW_ASSIGN_OR_RETURN(const bool stop, callbacks->OnEpochEnd(er, epochs, steps_now));
      if (stopped_before || stop) {
        summary.stopped_early_at_epoch = epoch;
        if (checkpointing) SW_RETURN_IF_ERROR(write_checkpoint(epochs + 1, 0));
        return absl::OkStatus();
      }
      if (checkpointing && (last_epoch || ckpt_due || (ck.every_epochs > 0 && epoch % ck.every_epochs == 0))) {
        SW_RETURN_IF_ERROR(write_checkpoint(epoch + 1, 0));
      }
      ++epoch;
      totals = EpochTotals();
      epoch_started = false;
      return absl::OkStatus();
    };

    // Every worker idle in the middle of the epoch with an evaluation or a
    // checkpoint due by steps: the evaluation first (early stopping may end
    // the epoch and training here, as in-process), then the checkpoint.
    auto between_tasks = [&]() -> absl::Status {
      const int64_t steps_now = base_steps + run_steps;
      if (steps_now >= next_eval) {
        next_eval = NextMultiple(steps_now, eval_period);
        SW_ASSIGN_OR_RETURN(const RunCallbacks::Evaluation ev, evaluate());
        SW_ASSIGN_OR_RETURN(const bool stop, callbacks->OnEvaluation(epoch, totals.steps, steps_in_epoch(), steps_now,
                                                                     ev.loss, ev.accuracy, ev.extra));
        if (stop) return end_epoch(/*stopped_before=*/true);
      }
      if (steps_now >= next_ckpt) {
        next_ckpt = NextMultiple(steps_now, ckpt_period);
        const int64_t epoch_records = dispatcher->counters().records_seen - static_cast<int64_t>(epoch - 1) * n;
        SW_RETURN_IF_ERROR(write_checkpoint(epoch, epoch_records));
      }
      return absl::OkStatus();
    };
    if (already_complete) {
      SW_ASSIGN_OR_RETURN(final_evaluation, evaluate());
    }
    while (!already_complete && !finished && !callbacks->stopped()) {
      SW_RETURN_IF_ERROR(pump(/*evaluation=*/false));
      if (finished) break;

      // An epoch ended: nothing is out, so every worker is idle.
      const DispatcherCounters dc = dispatcher->counters();
      if (live != nullptr) {
        live->SetTaskCounters(dc.tasks_requeued, dc.worker_failures);
        live->SetJobRecords(dc.records_seen);
      }
      if (dc.epochs_completed > completed) {
        completed = dc.epochs_completed;
        SW_RETURN_IF_ERROR(end_epoch(/*stopped_before=*/false));
        last_tick = Clock::now();
      } else if (base_steps + run_steps >= std::min(next_ckpt, next_eval) && steps_out() == 0 &&
                 !callbacks->stopped()) {
        SW_RETURN_IF_ERROR(between_tasks());
        last_tick = Clock::now();
      }
      if (!callbacks->stopped() && SecondsSince(last_tick) >= cfg.train.log_every_s && totals.records > 0) {
        last_tick = Clock::now();
        const double elapsed = SecondsSince(epoch_start);
        ProgressState s;
        s.epoch = epoch;
        s.epochs = epochs;
        s.step = totals.steps;
        s.steps = steps_in_epoch();
        s.samples_per_s = elapsed > 0 ? totals.records / elapsed : 0;
        s.loss = totals.loss / totals.records;
        const double per_step = s.step > 0 ? elapsed / s.step : 0;
        s.eta_s = per_step * ((s.steps - s.step) + s.steps * (epochs - epoch));
        progress.Update(s);
        if (live != nullptr) live->SetTrainLoss(s.loss);
        SW_RETURN_IF_ERROR(callbacks->OnProgress(epoch, base_steps + run_steps, s.loss, s.samples_per_s));
        if (callbacks->stopped()) {
          draining = true;
          while (std::any_of(procs.slots().begin(), procs.slots().end(),
                             [](const Slot& slot) { return slot.pid > 0 && slot.busy; })) {
            SW_RETURN_IF_ERROR(pump(/*evaluation=*/false));
          }
          SW_RETURN_IF_ERROR(end_epoch(/*stopped_before=*/true));
        }
      }
    }
    SW_RETURN_IF_ERROR(dispatcher->status());
    // A streamed cache whose records were all readable before its build was
    // over (data.max_train_records reached): the rest is built now, so the
    // next run finds it whole and its bad rows are reported. Before ExitAll:
    // a job that fails here is a failed job to its worker tasks too (a
    // chief tells late worker tasks the job is over only after ExitAll).
    SW_RETURN_IF_ERROR(job.FinishStream());
    procs.ExitAll(/*grace_s=*/5);
  } else {
    SW_RETURN_IF_ERROR(job.FinishStream());  // nothing to train: no worker to tell
  }
  if (first_task_at) {
    summary.first_task_after_ready_s = std::chrono::duration<double>(*first_task_at - job.ready_at()).count();
  }

  const DispatcherCounters dc = dispatcher->counters();
  if (live != nullptr) {
    live->SetTaskCounters(dc.tasks_requeued, dc.worker_failures);
    live->SetJobRecords(dc.records_seen);
  }
  summary.steps = base_steps + run_steps;
  summary.records_seen = first_epoch <= epochs ? dc.records_seen : restored_records;
  summary.data_wait_s = workers > 0 ? data_wait_s / workers : 0;
  for (int64_t p : reader_peak) summary.reader_peak_bytes += p;
  summary.tasks_requeued = dc.tasks_requeued;
  summary.worker_failures = dc.worker_failures;
  summary.samples_per_s = train_seconds > 0 ? run_records / train_seconds : 0;
  if (!summary.history.empty()) summary.train_loss = summary.history.back().train_loss;
  if (const auto& last = callbacks->last_evaluation()) {
    summary.test_loss = last->loss;
    summary.test_accuracy = last->accuracy;
    summary.test_metrics = last->extra;
  }
  summary.already_complete = already_complete;
  if (final_evaluation) {
    summary.test_loss = final_evaluation->loss;
    summary.test_accuracy = final_evaluation->accuracy;
    summary.test_metrics = final_evaluation->extra;
  }
  summary.model_version = model_version();
  summary.wall_s = SecondsSince(run_start);
  return summary;
}

}  // namespace shardwild
