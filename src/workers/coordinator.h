// Coordinator: TensorFlow's ClusterCoordinator for Shardwild's workers.
//
// A Coordinator owns N workers and one dispatch thread per worker. Schedule()
// puts a function on a shared FIFO queue and returns a RemoteValue at once;
// the next available worker runs it. Join() waits until nothing is queued or
// running, Done() says whether that is already so, and RemoteValue::Fetch()
// waits for one function's result. The words and semantics are TF's
// (tf.distribute.coordinator.ClusterCoordinator):
//
// - Per-worker values. CreatePerWorkerDataset(dataset_fn) calls dataset_fn(i)
//   for every worker i and returns a PerWorker<Dataset>; MakeIterators() turns
//   it into a PerWorker<Iterator>. A PerWorker<T> passed to Schedule as an
//   argument reaches the function as the T& of the worker that runs it (TF's
//   PerWorkerValues), so each worker only ever sees its own iterator.
// - Worker failure. When a worker is lost (its WorkerExecutor, or the
//   function itself, returns a status built by WorkerLostError(), or a test
//   calls KillWorkerForTest), the function it was running is put back at the
//   front of the queue and runs again on another worker: functions run at
//   least once, so a function that a lost worker had half run may have had
//   some effects twice. A lost worker takes no more work until
//   RestartWorker() brings it back. When every worker is lost, everything
//   queued and everything scheduled afterwards fails with Unavailable.
// - Application errors. When a function returns any other error (or throws),
//   every function still queued is cancelled: its RemoteValue holds a
//   Cancelled error saying it was cancelled because an earlier function
//   failed and that it can be scheduled again. Functions already running
//   finish normally. The next Join() returns the first error, once; a later
//   Join() returns OK unless new errors happened. Schedule keeps working
//   throughout: functions scheduled after the error run.
//
// Functions are any callables. If fn accepts a `const WorkerContext&` first,
// it gets the running worker's context (index, per-worker values); otherwise
// it is called with the arguments only. Its return type decides the
// RemoteValue: `absl::StatusOr<U>` or a plain `U` gives RemoteValue<U>;
// `absl::Status` or `void` gives RemoteValue<void>, whose Fetch() returns an
// absl::Status. Arguments are copied (or moved) into the scheduled closure
// once and passed to fn as lvalues on every run, so a retried function sees
// the same arguments. PerWorker<T> arguments are not copied: the caller keeps
// them alive (and does not touch them) until the functions using them are done.
//
// ScheduleSteps(fn, steps, args...) is Keras's steps_per_execution: one
// scheduled closure runs fn `steps` times back to back on one worker, so the
// queue, hand-off and wake-up cost is paid once per `steps` steps.
//
// No exception escapes: a function that throws ends with an Internal error
// naming its schedule id ("function #17 threw: ...").
//
// Thread safety: every public member of Coordinator and RemoteValue may be
// called from any thread, including from inside a scheduled function, except
// Join() and the destructor, which must not be called from a scheduled
// function (they would wait for themselves). The queue is unbounded:
// Schedule never blocks. A PerWorker value is touched by
// at most one function at a time (a worker runs its functions one after
// another), so datasets and iterators need no locking of their own.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/base/mutex.h"
#include "core/base/status.h"

namespace shardwild {

// ---- Worker failure as a status ---------------------------------------------

// An Unavailable status marked (by an absl::Status payload) as "the worker
// itself failed", not the function: the coordinator reruns the function on
// another worker and stops using this one. Executors return it when their
// worker dies; a function may return it to report that its worker is unusable.
absl::Status WorkerLostError(absl::string_view message);

// Whether `status` was built by WorkerLostError (its payload survives copies).
bool IsWorkerLost(const absl::Status& status);

// ---- The worker seam ----------------------------------------------------------

// Where one worker's functions run. Today a worker is an in-process thread
// (the default executor runs the closure on the calling dispatch thread);
// a process or remote machine can implement the same interface.
class WorkerExecutor {
 public:
  virtual ~WorkerExecutor() = default;

  // Runs `fn` on the worker and returns its status, or a status for which
  // IsWorkerLost() holds if the worker failed (fn may then have run partly,
  // wholly or not at all). Called by this worker's dispatch thread only, one
  // closure at a time. Any other error returned without running fn also
  // counts as losing the worker.
  virtual absl::Status Run(absl::FunctionRef<absl::Status()> fn) = 0;

  // Brings a lost worker back (reconnect, respawn). Called by
  // Coordinator::RestartWorker when no Run is in progress. Default: OK.
  virtual absl::Status Restart() { return absl::OkStatus(); }
};

// ---- Per-worker values ----------------------------------------------------------

// One T per worker, index i belonging to worker i (TF's PerWorkerValues).
// Move-only, so iterator state is never silently duplicated; moving keeps
// the values' addresses, so an iterator may point into its dataset.
template <typename T>
class PerWorker {
 public:
  PerWorker() = default;
  explicit PerWorker(std::vector<T> values) : values_(std::move(values)) {}
  PerWorker(PerWorker&&) noexcept = default;
  PerWorker& operator=(PerWorker&&) noexcept = default;
  PerWorker(const PerWorker&) = delete;
  PerWorker& operator=(const PerWorker&) = delete;

  int num_workers() const { return static_cast<int>(values_.size()); }

  // Worker `worker`'s value; 0 <= worker < num_workers(). Not synchronised:
  // touch it from outside scheduled functions only when none that use it runs.
  T& local(int worker) { return values_[worker]; }
  const T& local(int worker) const { return values_[worker]; }

  // For a per-worker dataset: one iterator per worker, made by calling
  // local(i).MakeIterator() (TF: iter(per_worker_dataset)). The iterators may
  // refer to the datasets, so keep this PerWorker alive while they are used.
  auto MakeIterators() {
    using Iterator = std::decay_t<decltype(std::declval<T&>().MakeIterator())>;
    std::vector<Iterator> iterators;
    iterators.reserve(values_.size());
    for (T& value : values_) iterators.push_back(value.MakeIterator());
    return PerWorker<Iterator>(std::move(iterators));
  }

 private:
  std::vector<T> values_;
};

// What a scheduled function learns about where it runs.
class WorkerContext {
 public:
  WorkerContext(int worker_index, int num_workers, uint64_t function_id)
      : worker_index_(worker_index), num_workers_(num_workers), function_id_(function_id) {}

  int worker_index() const { return worker_index_; }
  int num_workers() const { return num_workers_; }
  // The schedule id of the running function (1, 2, ... in Schedule order).
  uint64_t function_id() const { return function_id_; }

  // This worker's value of a per-worker value.
  template <typename T>
  T& Local(PerWorker<T>& values) const {
    return values.local(worker_index_);
  }
  template <typename T>
  const T& Local(const PerWorker<T>& values) const {
    return values.local(worker_index_);
  }

 private:
  int worker_index_;
  int num_workers_;
  uint64_t function_id_;
};

// ---- RemoteValue ----------------------------------------------------------------

// What Fetch() returns: absl::StatusOr<T>, or absl::Status for T = void.
template <typename T>
using FetchResult = std::conditional_t<std::is_void_v<T>, absl::Status, absl::StatusOr<T>>;

namespace coordinator_internal {

// The result slot shared by a RemoteValue and the coordinator (like a
// future's shared state; either side may be dropped first, hence shared_ptr).
// The result crosses threads (set by a dispatch thread, fetched by others),
// so each side keeps a DeepCopy (core/base/status.h) of its own.
template <typename T>
class RemoteValueState {
 public:
  // Sets the result; only the first call counts.
  void Set(FetchResult<T> result) {
    {
      MutexLock lock(&mu_);
      if (result_.has_value()) return;
      result_.emplace(DeepCopy(result));
    }
    ready_.SignalAll();
  }
  FetchResult<T> Get() {
    MutexLock lock(&mu_);
    ready_.Wait(&mu_, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return result_.has_value(); });
    return DeepCopy(*result_);
  }
  bool WaitFor(absl::Duration timeout) {
    MutexLock lock(&mu_);
    return ready_.WaitFor(&mu_, absl::ToChronoNanoseconds(timeout),
                          [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return result_.has_value(); });
  }
  bool ready() {
    MutexLock lock(&mu_);
    return result_.has_value();
  }

 private:
  Mutex mu_;
  CondVar ready_;  // signalled when result_ is set
  std::optional<FetchResult<T>> result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace coordinator_internal

// The future result of a scheduled function. Copies share one result.
// A default-constructed RemoteValue holds nothing; Fetch() returns
// FailedPrecondition for it.
template <typename T>
class RemoteValue {
 public:
  RemoteValue() = default;

  // Blocks until the function has finished (or was cancelled or failed) and
  // returns its result: the value, the function's error, Cancelled (an
  // earlier function failed; schedule it again), or Unavailable (no worker
  // left). May be called any number of times; T must be copyable.
  FetchResult<T> Fetch() const {
    if (!state_) return absl::FailedPreconditionError("Fetch() on an empty RemoteValue");
    return state_->Get();
  }
  // Waits at most `timeout` for the result; returns whether it is ready.
  bool WaitFor(absl::Duration timeout) const { return state_ != nullptr && state_->WaitFor(timeout); }
  // Whether Fetch() would return at once.
  bool ready() const { return state_ != nullptr && state_->ready(); }

 private:
  friend class Coordinator;
  explicit RemoteValue(std::shared_ptr<coordinator_internal::RemoteValueState<T>> state) : state_(std::move(state)) {}
  std::shared_ptr<coordinator_internal::RemoteValueState<T>> state_;
};

// ---- Closures (internal) -----------------------------------------------------------

namespace coordinator_internal {

// A scheduled function with its arguments and result slot. Runs on one
// worker at a time: after a worker is lost, the closure is queued again only
// once that worker's Run has returned.
class ClosureBase {
 public:
  virtual ~ClosureBase() = default;
  uint64_t id() const { return id_; }
  void set_id(uint64_t id) { id_ = id; }
  // Runs the function once on the calling thread for worker `ctx`, keeping
  // its result for Publish(); returns the function's status.
  virtual absl::Status Run(const WorkerContext& ctx) = 0;
  // Hands the result of the last Run to the RemoteValue.
  virtual void Publish() = 0;
  // Ends the closure without (another) run: the RemoteValue gets `status`.
  virtual void Fail(absl::Status status) = 0;

 private:
  uint64_t id_ = 0;
};

std::string ThrewMessage(uint64_t id, const char* what);

template <typename T>
class Closure final : public ClosureBase {
 public:
  using Body = absl::AnyInvocable<FetchResult<T>(const WorkerContext&)>;
  Closure(Body body, std::shared_ptr<RemoteValueState<T>> state) : body_(std::move(body)), state_(std::move(state)) {}

  absl::Status Run(const WorkerContext& ctx) override {
    try {
      result_.emplace(body_(ctx));
    } catch (const std::exception& e) {
      result_.emplace(absl::InternalError(ThrewMessage(id(), e.what())));
    } catch (...) {
      result_.emplace(absl::InternalError(ThrewMessage(id(), nullptr)));
    }
    if constexpr (std::is_void_v<T>) {
      return *result_;
    } else {
      return result_->status();
    }
  }
  void Publish() override { state_->Set(std::move(*result_)); }
  void Fail(absl::Status status) override { state_->Set(std::move(status)); }

 private:
  Body body_;
  std::shared_ptr<RemoteValueState<T>> state_;
  std::optional<FetchResult<T>> result_;  // of the last Run
};

template <typename T>
struct IsPerWorker : std::false_type {};
template <typename T>
struct IsPerWorker<PerWorker<T>> : std::true_type {};

template <typename T>
struct IsStatusOr : std::false_type {};
template <typename T>
struct IsStatusOr<absl::StatusOr<T>> : std::true_type {};

// How one argument is kept in the closure and handed to the function:
// a copy, passed as an lvalue; or, for a PerWorker, a pointer resolved to the
// running worker's value.
template <typename A, bool = IsPerWorker<std::remove_cvref_t<A>>::value>
struct ArgSlot {
  std::decay_t<A> value;
  std::decay_t<A>& Resolve(int /*worker*/) { return value; }
};
template <typename A>
struct ArgSlot<A, true> {
  static_assert(std::is_lvalue_reference_v<A>,
                "pass a PerWorker to Schedule as an lvalue; the coordinator keeps a pointer to it");
  std::remove_reference_t<A>* values;
  auto& Resolve(int worker) { return values->local(worker); }
};
template <typename A>
ArgSlot<A> MakeArgSlot(A&& arg) {
  if constexpr (IsPerWorker<std::remove_cvref_t<A>>::value) {
    return ArgSlot<A>{&arg};
  } else {
    return ArgSlot<A>{std::forward<A>(arg)};
  }
}
template <typename A>
using Resolved = decltype(std::declval<ArgSlot<A>&>().Resolve(0));

// Whether fn takes the WorkerContext first.
template <typename F, typename... Args>
inline constexpr bool kTakesContext = std::is_invocable_v<F&, const WorkerContext&, Resolved<Args>...>;

template <typename F, typename... Args>
struct CallResult {
  static_assert(kTakesContext<F, Args...> || std::is_invocable_v<F&, Resolved<Args>...>,
                "Schedule(fn, args...): fn must be callable as fn(const WorkerContext&, args...) or fn(args...), "
                "where a PerWorker<T> argument arrives as T&");
  using Type = std::remove_cvref_t<typename std::conditional_t<kTakesContext<F, Args...>,
                                                               std::invoke_result<F&, const WorkerContext&, Resolved<Args>...>,
                                                               std::invoke_result<F&, Resolved<Args>...>>::type>;
};

// The RemoteValue type for a function returning R.
template <typename R>
struct ValueOf {
  using Type = R;
};
template <>
struct ValueOf<void> {
  using Type = void;
};
template <>
struct ValueOf<absl::Status> {
  using Type = void;
};
template <typename U>
struct ValueOf<absl::StatusOr<U>> {
  using Type = U;
};

// Calls fn once and turns what it returns into a FetchResult<T>.
template <typename T, typename F, typename... As>
FetchResult<T> CallOnce(F& fn, const WorkerContext& ctx, As&&... args) {
  auto call = [&]() -> decltype(auto) {
    if constexpr (std::is_invocable_v<F&, const WorkerContext&, As...>) {
      return std::invoke(fn, ctx, std::forward<As>(args)...);
    } else {
      return std::invoke(fn, std::forward<As>(args)...);
    }
  };
  using R = std::remove_cvref_t<decltype(call())>;
  if constexpr (std::is_void_v<R>) {
    call();
    return absl::OkStatus();
  } else {
    return FetchResult<T>(call());
  }
}

}  // namespace coordinator_internal

// ---- Coordinator -------------------------------------------------------------------

struct CoordinatorOptions {
  int num_workers = 1;  // in-process worker threads, >= 1

  // InvalidArgument naming the field if a value is out of range.
  absl::Status Validate() const;
};

class Coordinator {
 public:
  // In-process workers: options.num_workers threads.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(const CoordinatorOptions& options);
  // Workers behind the given executors (at least one; none null), one
  // dispatch thread each; the coordinator owns them.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(std::vector<std::unique_ptr<WorkerExecutor>> workers);

  // Cancels what is still queued (Cancelled: the coordinator is shutting
  // down), waits for running functions to finish and joins the threads.
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  int num_workers() const { return static_cast<int>(executors_.size()); }

  // Queues fn(args...) to run on the next available worker and returns at
  // once. See the file comment for how fn is called and what it may return.
  template <typename F, typename... Args>
  auto Schedule(F&& fn, Args&&... args) {
    return ScheduleSteps(std::forward<F>(fn), 1, std::forward<Args>(args)...);
  }

  // As Schedule, but one closure runs fn `steps` times in a row on one worker
  // (Keras's steps_per_execution), stopping at the first error. The result is
  // that of the last step run. steps < 1: the RemoteValue holds
  // InvalidArgument and nothing is queued.
  template <typename F, typename... Args>
  auto ScheduleSteps(F&& fn, int steps, Args&&... args) {
    namespace ci = coordinator_internal;
    using T = typename ci::ValueOf<typename ci::CallResult<std::decay_t<F>, Args...>::Type>::Type;
    auto state = std::make_shared<ci::RemoteValueState<T>>();
    RemoteValue<T> value(state);
    if (steps < 1) {
      state->Set(absl::InvalidArgumentError(absl::StrCat("ScheduleSteps: steps must be >= 1, got ", steps)));
      return value;
    }
    auto body = [fn = std::forward<F>(fn), slots = std::make_tuple(ci::MakeArgSlot<Args>(std::forward<Args>(args))...),
                 steps](const WorkerContext& ctx) mutable -> FetchResult<T> {
      std::optional<FetchResult<T>> result;
      for (int step = 0; step < steps; ++step) {
        result.emplace(std::apply(
            [&](auto&... slot) { return ci::CallOnce<T>(fn, ctx, slot.Resolve(ctx.worker_index())...); }, slots));
        if (!result->ok()) break;
      }
      return *std::move(result);
    };
    Enqueue(std::make_unique<ci::Closure<T>>(std::move(body), std::move(state)));
    return value;
  }

  // Blocks until nothing is queued or running, then returns the first error
  // raised since the last Join() (application error, or Unavailable because
  // every worker was lost) and forgets it; OK if none.
  absl::Status Join();

  // Whether nothing is queued or running now. Errors are reported by Join().
  bool Done() const;

  // Calls dataset_fn(i) for every worker i, in index order, on the calling
  // thread, and returns the datasets as a per-worker value. dataset_fn may
  // return a Dataset or an absl::StatusOr<Dataset>; the first error is
  // returned. Blocks only for dataset_fn. (Per-worker values live in this
  // process today; workers in other processes will build their own.)
  template <typename DatasetFn>
  auto CreatePerWorkerDataset(DatasetFn&& dataset_fn) {
    using R = std::remove_cvref_t<std::invoke_result_t<DatasetFn&, int>>;
    using Dataset = typename coordinator_internal::ValueOf<R>::Type;
    static_assert(!std::is_void_v<Dataset>, "dataset_fn must return a dataset");
    absl::StatusOr<PerWorker<Dataset>> result;
    std::vector<Dataset> datasets;
    datasets.reserve(num_workers());
    for (int i = 0; i < num_workers(); ++i) {
      if constexpr (coordinator_internal::IsStatusOr<R>::value) {
        R dataset = dataset_fn(i);
        if (!dataset.ok()) {
          result = absl::Status(dataset.status().code(),
                                absl::StrCat("dataset_fn(", i, "): ", dataset.status().message()));
          return result;
        }
        datasets.push_back(*std::move(dataset));
      } else {
        datasets.push_back(dataset_fn(i));
      }
    }
    result = PerWorker<Dataset>(std::move(datasets));
    return result;
  }

  // Brings lost worker `worker` back: waits until the function it was
  // running when lost (if any) has returned, calls its executor's Restart(),
  // and lets it take work again. Per-worker values are kept (they live in
  // this process). OK if the worker was not lost; InvalidArgument for a bad
  // index; the executor's error if Restart fails (the worker stays lost).
  // Must not be called from a function running on `worker` itself.
  absl::Status RestartWorker(int worker);

  // Workers not lost now.
  int live_workers() const;

  // Test hook: worker `worker` is lost from now on, as if its executor had
  // reported it. It takes no more work; the function it is running, if any,
  // keeps running (a thread cannot be killed), its result is discarded when
  // it returns, and it is queued again to run elsewhere.
  void KillWorkerForTest(int worker);

 private:
  explicit Coordinator(std::vector<std::unique_ptr<WorkerExecutor>> executors);

  struct WorkerState {
    bool lost = false;
    bool busy = false;        // a Run is in progress (maybe stale, on a lost worker)
    uint64_t generation = 0;  // incremented when the worker is lost
  };

  // Assigns the closure its id and queues it, or fails it at once if every
  // worker is lost.
  void Enqueue(std::unique_ptr<coordinator_internal::ClosureBase> closure);
  void DispatchLoop(int worker);
  // Marks `worker` lost; if it was the last one, fails everything queued.
  void MarkLostLocked(int worker, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails every queued closure with `status`, which names its function via
  // `message_fn(id)`.
  void FailQueuedLocked(absl::StatusCode code, const std::function<std::string(uint64_t)>& message_fn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string AllLostMessageLocked(uint64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordErrorLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && running_ == 0; }

  // Constant after construction.
  std::vector<std::unique_ptr<WorkerExecutor>> executors_;
  std::vector<std::thread> threads_;  // written by the constructor, joined by the destructor

  // State below is protected by mu_.
  mutable Mutex mu_;
  CondVar work_cv_;   // queue_, a worker's lost flag, or stop_ changed
  CondVar state_cv_;  // a closure finished or a worker became idle
  std::deque<std::unique_ptr<coordinator_internal::ClosureBase>> queue_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // closures inside some executor's Run
  std::vector<WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_loss_ ABSL_GUARDED_BY(mu_);  // why the last worker was lost
  absl::Status error_ ABSL_GUARDED_BY(mu_);     // first error not yet returned by Join
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardwild
