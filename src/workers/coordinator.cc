#include "workers/coordinator.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace shardwild {

namespace {

// The payload that marks a status as "the worker was lost".
constexpr absl::string_view kWorkerLostUrl = "type.shardwild.dev/WorkerLost";

// The in-process worker: its dispatch thread is the worker.
class InProcessExecutor final : public WorkerExecutor {
 public:
  absl::Status Run(absl::FunctionRef<absl::Status()> fn) override { return fn(); }
};

}  // namespace

absl::Status WorkerLostError(absl::string_view message) {
  absl::Status status = absl::UnavailableError(message);
  status.SetPayload(kWorkerLostUrl, absl::Cord("1"));
  return status;
}

bool IsWorkerLost(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kWorkerLostUrl).has_value();
}

namespace coordinator_internal {
std::string ThrewMessage(uint64_t id, const char* what) {
  if (what == nullptr) return absl::StrCat("function #", id, " threw an unknown exception");
  return absl::StrCat("function #", id, " threw: ", what);
}
}  // namespace coordinator_internal

absl::Status CoordinatorOptions::Validate() const {
  if (num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("coordinator: num_workers must be >= 1, got ", num_workers));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(const CoordinatorOptions& options) {
  if (absl::Status status = options.Validate(); !status.ok()) return status;
  std::vector<std::unique_ptr<WorkerExecutor>> workers;
  for (int i = 0; i < options.num_workers; ++i) workers.push_back(std::make_unique<InProcessExecutor>());
  return Create(std::move(workers));
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(std::vector<std::unique_ptr<WorkerExecutor>> workers) {
  if (workers.empty()) return absl::InvalidArgumentError("coordinator: no workers");
  for (size_t i = 0; i < workers.size(); ++i) {
    if (workers[i] == nullptr) return absl::InvalidArgumentError(absl::StrCat("coordinator: worker ", i, " is null"));
  }
  return std::unique_ptr<Coordinator>(new Coordinator(std::move(workers)));
}

Coordinator::Coordinator(std::vector<std::unique_ptr<WorkerExecutor>> executors) : executors_(std::move(executors)) {
  {
    MutexLock lock(&mu_);
    workers_.assign(executors_.size(), WorkerState{});
    live_ = num_workers();
  }
  threads_.reserve(executors_.size());
  for (int i = 0; i < num_workers(); ++i) threads_.emplace_back([this, i] { DispatchLoop(i); });
}

Coordinator::~Coordinator() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    FailQueuedLocked(absl::StatusCode::kCancelled, [](uint64_t id) {
      return absl::StrCat("function #", id, " was cancelled because the coordinator is shutting down");
    });
  }
  work_cv_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

void Coordinator::Enqueue(std::unique_ptr<coordinator_internal::ClosureBase> closure) {
  {
    MutexLock lock(&mu_);
    closure->set_id(next_id_++);
    if (live_ == 0) {
      const absl::Status status = absl::UnavailableError(AllLostMessageLocked(closure->id()));
      RecordErrorLocked(status);
      closure->Fail(status);
      return;
    }
    queue_.push_back(std::move(closure));
  }
  work_cv_.SignalAll();
}

void Coordinator::DispatchLoop(int worker) {
  WorkerExecutor* const executor = executors_[worker].get();
  while (true) {
    std::unique_ptr<coordinator_internal::ClosureBase> closure;
    uint64_t generation;
    {
      MutexLock lock(&mu_);
      work_cv_.Wait(&mu_, [this, worker]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stop_ || (!workers_[worker].lost && !queue_.empty());
      });
      if (stop_) return;
      closure = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
      workers_[worker].busy = true;
      generation = workers_[worker].generation;
    }

    const WorkerContext ctx(worker, num_workers(), closure->id());
    bool ran = false;
    absl::Status fn_status;
    const absl::Status run_status = executor->Run([&] {
      ran = true;
      fn_status = closure->Run(ctx);
      return fn_status;
    });

    {
      MutexLock lock(&mu_);
      --running_;
      workers_[worker].busy = false;
      const bool killed = workers_[worker].generation != generation;
      if (killed || IsWorkerLost(run_status) || !ran || (!run_status.ok() && run_status != fn_status)) {
        // The worker, not the function, failed: forget this run, go again elsewhere.
        if (!killed) {
          MarkLostLocked(worker, run_status.ok() ? absl::UnavailableError("the executor did not run the function")
                                                 : run_status);
        }
        if (stop_) {
          closure->Fail(absl::CancelledError(absl::StrCat(
              "function #", closure->id(), " was cancelled because the coordinator is shutting down")));
        } else if (live_ == 0) {
          const absl::Status status = absl::UnavailableError(AllLostMessageLocked(closure->id()));
          RecordErrorLocked(status);
          closure->Fail(status);
        } else {
          queue_.push_front(std::move(closure));
        }
      } else if (fn_status.ok()) {
        closure->Publish();
      } else {
        // An application error: cancel what is queued before the failed
        // function's own RemoteValue is ready, so a caller that fetched the
        // error sees the cancellations done.
        RecordErrorLocked(fn_status);
        const uint64_t failed_id = closure->id();
        FailQueuedLocked(absl::StatusCode::kCancelled, [failed_id](uint64_t id) {
          return absl::StrCat("function #", id, " was cancelled because an earlier function (#", failed_id,
                              ") failed; it did not run and can be scheduled again");
        });
        closure->Publish();
      }
    }
    // Wake a worker for a re-queued closure, and Join/RestartWorker waiters.
    work_cv_.SignalAll();
    state_cv_.SignalAll();
  }
}

void Coordinator::MarkLostLocked(int worker, const absl::Status& why) {
  WorkerState& state = workers_[worker];
  if (state.lost) return;
  state.lost = true;
  ++state.generation;
  --live_;
  last_loss_ = absl::StrCat("worker ", worker, ": ", why.message());
  if (live_ == 0) {
    FailQueuedLocked(absl::StatusCode::kUnavailable, [this](uint64_t id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return AllLostMessageLocked(id);
    });
  }
}

void Coordinator::FailQueuedLocked(absl::StatusCode code, const std::function<std::string(uint64_t)>& message_fn) {
  while (!queue_.empty()) {
    std::unique_ptr<coordinator_internal::ClosureBase> closure = std::move(queue_.front());
    queue_.pop_front();
    const absl::Status status(code, message_fn(closure->id()));
    if (code == absl::StatusCode::kUnavailable) RecordErrorLocked(status);
    closure->Fail(status);
  }
  state_cv_.SignalAll();
}

std::string Coordinator::AllLostMessageLocked(uint64_t id) const {
  return absl::StrCat("function #", id, " cannot run: all ", num_workers(), " workers of the coordinator are lost (",
                      last_loss_, ")");
}

void Coordinator::RecordErrorLocked(const absl::Status& status) {
  if (error_.ok()) error_ = DeepCopy(status);  // Join hands it to another thread
}

absl::Status Coordinator::Join() {
  MutexLock lock(&mu_);
  state_cv_.Wait(&mu_, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return IdleLocked(); });
  absl::Status error = std::move(error_);
  error_ = absl::OkStatus();
  return error;
}

bool Coordinator::Done() const {
  MutexLock lock(&mu_);
  return IdleLocked();
}

int Coordinator::live_workers() const {
  MutexLock lock(&mu_);
  return live_;
}

void Coordinator::KillWorkerForTest(int worker) {
  if (worker < 0 || worker >= num_workers()) return;
  {
    MutexLock lock(&mu_);
    MarkLostLocked(worker, absl::UnavailableError("killed by KillWorkerForTest"));
  }
  state_cv_.SignalAll();
}

absl::Status Coordinator::RestartWorker(int worker) {
  if (worker < 0 || worker >= num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("RestartWorker: no worker ", worker, " (", num_workers(), " workers)"));
  }
  {
    MutexLock lock(&mu_);
    if (!workers_[worker].lost) return absl::OkStatus();
    state_cv_.Wait(&mu_, [this, worker]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !workers_[worker].busy; });
  }
  // The lost worker's dispatch thread is waiting and runs nothing, so the
  // executor is not in use.
  absl::Status status = executors_[worker]->Restart();
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("RestartWorker(", worker, "): ", status.message()));
  }
  {
    MutexLock lock(&mu_);
    if (workers_[worker].lost) {
      workers_[worker].lost = false;
      ++live_;
    }
  }
  work_cv_.SignalAll();
  return absl::OkStatus();
}

}  // namespace shardwild
