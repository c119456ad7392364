// Task training's seams: the line channel of a worker slot, the slots, the
// kinds of task workers, and the runner that executes a task line on a
// Worker. The task loop (task_trainer.h, RunTaskTraining) drives them; the
// gRPC bridge (src/net) adds remote worker tasks as a third kind of
// TaskWorkers behind the same loop and line protocol (task_trainer.h).
//
// Thread safety: SlotChannel, Slot and TaskWorkers are used by the loop's
// thread only; Inbox is thread-safe; a TaskRunner by one thread at a time.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/data/dataset.h"
#include "core/base/mutex.h"
#include "core/config/options.h"
#include "workers/dispatcher.h"
#include "workers/evaluator.h"
#include "workers/stream_feed.h"
#include "workers/worker.h"

namespace shardwild {

// A message on one line: newlines become spaces.
std::string OneLine(absl::string_view text);

// Whether evaluation runs inline, as tasks (the main process and its workers
// decide it alike): data.test set and eval.sidecar false.
bool InlineEvaluation(const Config& config);

// An evaluation task's result as `evaldone` carries it after the lease:
// count, correct, loss_sum (17 digits) and the metrics' bytes in base64
// ("-" when absent); and back from the split line, starting at field `at`.
std::string EncodeEvalResult(const EvalResult& r);
absl::StatusOr<EvalResult> DecodeEvalResult(const std::vector<std::string>& f, size_t at);

// One slot's line channel (see the protocol in task_trainer.h): whole lines
// out, lines in, buffered. A worker process's is its socket (LineChannel);
// an in-process slot's is an inbox filled by Coordinator functions
// (InProcessChannel); a remote worker task's is its gRPC session (src/net).
class SlotChannel {
 public:
  virtual ~SlotChannel() = default;
  // Sends `line` (and '\n'). False when the worker is gone.
  virtual bool Send(const std::string& line) = 0;
  // Moves what has arrived into the buffer: a socket blocks until something
  // arrives (call it when poll() says fd() is readable); an inbox never
  // blocks. False on EOF or an error.
  virtual bool Fill() = 0;
  // Readable when a message may have arrived (for poll()).
  virtual int fd() const = 0;
  // The next complete line in the buffer, without its '\n'.
  bool NextLine(std::string* line) {
    const size_t nl = buf_.find('\n');
    if (nl == std::string::npos) return false;
    line->assign(buf_, 0, nl);
    buf_.erase(0, nl + 1);
    return true;
  }

 protected:
  std::string buf_;
};

// One worker slot: the process (or in-process worker) now serving worker
// `index`.
struct Slot {
  int index = 0;
  pid_t pid = -1;      // -1: no worker (given up, restart_workers false); in-process: this process's pid
  int fd = -1;         // the channel's fd (for poll)
  int id = -1;         // the dispatcher's worker id of this process
  bool ready = false;  // said `ready`
  bool busy = false;   // a task is out
  uint64_t lease = 0;
  TaskType task_type = TaskType::kTraining;  // of the task out (while busy)
  int64_t task_index = 0;                    // Task::index of the task out
  int64_t task_steps = 0;  // the steps of the task out (while busy; 0 for evaluation)
  int starts_failed = 0;  // consecutive deaths before `ready`
  std::chrono::steady_clock::time_point contact;  // spawn or last message
  std::string fatal;          // its `fatal` message, if any
  std::unique_ptr<SlotChannel> channel;
};

// The workers the task loop hands tasks to, one Slot each: processes
// (WorkerProcesses), the Job's own worker threads (InProcessWorkers), or
// remote worker tasks (src/net's RemoteWorkers).
// Used by the loop's thread only.
class TaskWorkers {
 public:
  explicit TaskWorkers(int workers) : slots_(workers) {
    for (int i = 0; i < workers; ++i) slots_[i].index = i;
  }
  virtual ~TaskWorkers() = default;
  TaskWorkers(const TaskWorkers&) = delete;
  TaskWorkers& operator=(const TaskWorkers&) = delete;

  std::vector<Slot>& slots() { return slots_; }
  int live() const {
    return static_cast<int>(std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.pid > 0; }));
  }
  // Starts a worker in `slot` (its previous one must be reaped), under a
  // fresh dispatcher worker id; it says `ready` once set up.
  virtual absl::Status Spawn(Slot& slot) = 0;
  // Ends the worker of `slot` (killing it first if asked) and returns its
  // wait status; the slot has no worker afterwards.
  virtual int Reap(Slot& slot, bool kill_first) = 0;
  // Asks every worker to exit and waits for them (killing after `grace_s`).
  virtual void ExitAll(double grace_s) = 0;
  // Whether the workers are processes (what progress lines say).
  virtual bool processes() const = 0;
  // Whether a worker that ends before it said `ready` is a setup error that
  // fails the job (a process started here: its `fatal`, or it exited). A
  // remote worker task sets itself up before it connects, so its session
  // ending early is an ordinary death.
  virtual bool start_failures_fatal() const { return true; }
  // Whether `slot` is waiting for its worker to come (a remote worker task
  // to connect): not silent, however long that takes.
  virtual bool awaiting(const Slot& slot) const { return false; }

 protected:
  // Fills in a newly started slot.
  void Started(Slot& slot, pid_t pid, int fd, std::unique_ptr<SlotChannel> channel) {
    slot.pid = pid;
    slot.fd = fd;
    slot.id = next_id_++;
    slot.ready = false;
    slot.busy = false;
    slot.lease = 0;
    slot.fatal.clear();
    slot.contact = std::chrono::steady_clock::now();
    slot.channel = std::move(channel);
  }
  static void Cleared(Slot& slot) {
    slot.fd = -1;
    slot.channel.reset();
    slot.pid = -1;
    slot.busy = false;
    slot.ready = false;
  }

 private:
  std::vector<Slot> slots_;
  int next_id_ = 0;
};

// A slot's incoming lines, posted by other threads: the Coordinator
// functions of an in-process slot (which may outlive the slot: a slot given
// up on is closed, and what its functions post later is dropped), or the
// gRPC session of a remote worker (src/net). A byte on the pipe says that
// lines (or the end) are waiting. Thread-safe.
class Inbox {
 public:
  static absl::StatusOr<std::shared_ptr<Inbox>> Create();
  ~Inbox();
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // Any thread: queues `line` and wakes the reader (unless closed or ended).
  void Post(std::string line);
  // Any thread: no line follows (the sender is gone); wakes the reader.
  void End();
  // The reader: appends every queued line (with '\n') to `out`, emptying
  // the pipe first (a line posted after that leaves a byte for the next
  // poll). False once End() was called and every line before it drained.
  bool Drain(std::string* out);
  // Drops what is queued and everything posted from now on.
  void Close();
  int read_fd() const { return read_fd_; }

 private:
  Inbox(int read_fd, int write_fd) : read_fd_(read_fd), write_fd_(write_fd) {}

  // Constant after construction.
  const int read_fd_;
  const int write_fd_;

  Mutex mu_;
  std::deque<std::string> lines_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

// Runs the parent's `task` and `eval` messages on one Worker. Worker
// processes, in-process slots and remote worker tasks (src/net) share it, so
// a task computes the same wherever it runs. Not thread-safe: one thread
// (the worker's) at a time.
class TaskRunner {
 public:
  // `test` may be null (no evaluation tasks then). `flush`, if given, runs
  // after a training task's steps and before its `done` (a store whose
  // pushes may still be in flight makes them land first, so a checkpoint
  // taken once the task is reported holds them); its error fails the task.
  TaskRunner(const Config& config, Worker& worker, const Dataset& train, const Dataset* test,
             std::function<absl::Status()> flush = nullptr)
      : config_(config), worker_(worker), train_(train), test_(test), flush_(std::move(flush)) {}

  // The reply to `line` (`done`, `evaldone` or `fail`; an exception becomes
  // `fail`), or nullopt when the line is no task (unknown messages are
  // ignored, for forward compatibility) or `heartbeat` returned false (the
  // parent is gone).
  // Between the steps of a training task, heartbeat() is called when a second
  // has passed since the last message this runner knows of.
  std::optional<std::string> Run(const std::string& line, const std::function<bool()>& heartbeat);

  // Streamed training (data.stream): training tasks are record ranges of
  // `cache` in storage order, fed to the worker by a StreamFeed of
  // `options`; `train` (given to the constructor) is then only the data
  // set's shape. The `done` reply gains the seconds this task waited on data
  // and the feed's peak bytes so far. Call before the first Run.
  void set_stream(const ColumnCache* cache, const StreamFeedOptions& options);

 private:
  std::optional<std::string> Train(const std::vector<std::string>& f, const std::string& line,
                                   const std::function<bool()>& heartbeat);
  std::string Evaluate(const std::vector<std::string>& f, const std::string& line);

  const Config& config_;
  Worker& worker_;
  const Dataset& train_;
  const Dataset* const test_;
  const std::function<absl::Status()> flush_;
  // Streamed training: one window at a time.
  std::optional<std::string> TrainStreamed(uint64_t lease, int epoch, int64_t first, int64_t count,
                                           double progress_begin, double per_step,
                                           const std::function<bool()>& heartbeat);
  std::unique_ptr<StreamFeed> feed_;
  const ColumnCache* stream_ = nullptr;  // the cache (its records grow while it is built)
  std::vector<int32_t> order_;  // EpochOrder of order_epoch_ (streamed: 0, 1, ...)
  int order_epoch_ = -1;
  std::chrono::steady_clock::time_point last_sent_ = std::chrono::steady_clock::now();
};

}  // namespace shardwild
