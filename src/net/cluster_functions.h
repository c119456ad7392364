// Scheduled functions on a cluster's worker tasks: TF's
// ClusterCoordinator.schedule for functions that run on another machine.
//
// TF sends a traced function to the worker; every Shardwild role runs the
// same binary, so a function is sent by name instead. A worker task offers
// the functions of its FunctionRegistry (the built-ins below, and whatever
// a program built on this library registers before it calls RunWorkerTask);
// the chief schedules them with a ClusterCoordinator, whose workers are the
// worker tasks. Arguments and results are bytes, encoded as the function
// likes.
//
// The wire (chief.proto Functions): each worker task keeps one stream to
// the chief open (FunctionServer), reconnecting when it ends, and runs the
// calls it receives one after another. The chief's side is
// RemoteWorkers::CallFunction (chief.h).
//
// Failures, as the single-machine Coordinator has them: a worker task whose
// stream ends (it died, its machine vanished and keepalive noticed, the
// network dropped it) is lost; the function it was running runs again on
// another worker task (at least once), and the lost one takes work again
// once its stream is back (ClusterCoordinator::Schedule and Join look).
// A function's own error is an application error: what is queued is
// cancelled and Join() returns it once.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/data/dataset.h"
#include "core/base/mutex.h"
#include "core/config/options.h"
#include "net/chief.h"
#include "net/cluster_setup.h"
#include "net/net_options.h"
#include "ps_shm/param_store.h"
#include "workers/coordinator.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace shardwild {

// What a function running on a worker task sees. Not owned; valid while the
// worker task serves.
struct FunctionContext {
  int task = 0;                     // the worker task's index
  const Config* config = nullptr;   // the job's config
  ParamStore* store = nullptr;      // the cluster's parameters (thread-safe, Hogwild)
  const Dataset* train = nullptr;   // the worker task's training data
  const Dataset* test = nullptr;    // its test data, or null
};

// A function's value from its arguments, or its error.
using RemoteFunction = std::function<absl::StatusOr<std::string>(const FunctionContext&, absl::string_view args)>;

// Functions by name. Register everything before serving; then read-only
// (Call is thread-safe).
class FunctionRegistry {
 public:
  // InvalidArgument for an empty name or a null function; AlreadyExists
  // for a name taken.
  absl::Status Register(const std::string& name, RemoteFunction fn);
  // Runs function `name`: its value or error; NotFound naming the
  // function and those there are; Internal for an exception it threw.
  absl::StatusOr<std::string> Call(const FunctionContext& context, const std::string& name,
                                   absl::string_view args) const;
  std::vector<std::string> names() const;

 private:
  std::map<std::string, RemoteFunction> functions_;
};

// The functions every worker task of `shardwild serve` offers:
//   "version"  ""              -> the store's model version, in decimal
//   "records"  ""              -> "<training records> <test records>"
//   "pull"     variable name   -> its values as float32 bytes (row-major,
//                                 this machine's byte order), as the
//                                 worker task reads them from the ps tasks
//   "pull_rows" "<table> <id> <id>..." -> the rows (read-only: a missing
//                                 dynamic id reads as its initial value),
//                                 float32 bytes, ids.size() x dim
absl::Status AddBuiltinFunctions(FunctionRegistry* registry);

// A worker task's side of the Functions stream: connects to the chief,
// says hello, runs each call with `registry` and answers it, until Stop().
// A stream that ends is opened again (backoff as the chief's options say);
// one the chief refuses for good (a wrong token, a task out of range) ends
// Run with that error, logged. Thread-safe: Stop may be called from any
// thread, once Run has started or before.
class FunctionServer {
 public:
  FunctionServer(const PsClientOptions& chief, const FunctionRegistry& registry, FunctionContext context,
                 TaskLog log);
  // Serves until Stop(); OK then, or the chief's final refusal.
  absl::Status Run();
  void Stop();

 private:
  const PsClientOptions chief_;
  const FunctionRegistry& registry_;
  const FunctionContext context_;
  const TaskLog log_;

  Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* call_ ABSL_GUARDED_BY(mu_) = nullptr;  // the open stream's, to cancel
};

// A Coordinator (workers/coordinator.h) whose workers are the worker tasks
// served by `workers` (the chief's RemoteWorkers): worker i is worker task
// i, and a function scheduled on it is a call of a registered function
// there.
class ClusterCoordinator {
 public:
  // `workers` is not owned and must outlive the coordinator.
  static absl::StatusOr<std::unique_ptr<ClusterCoordinator>> Create(RemoteWorkers* workers);

  // Waits up to `timeout_s` until every worker task's function stream is
  // open; Unavailable naming those that are not.
  absl::Status WaitForWorkers(double timeout_s);
  // Schedules function `name` with `args` on the next free worker task;
  // returns at once. Fetch() gives the function's value, its error,
  // Cancelled, or Unavailable when no worker task is left.
  RemoteValue<std::string> Schedule(const std::string& name, std::string args = "");
  // Every worker task's stream open at this moment runs `name` once (TF's
  // per-worker calls): one value per worker task, in task order; a worker
  // task not connected, or lost while running it, gives Unavailable.
  std::vector<absl::StatusOr<std::string>> CallOnEach(const std::string& name, const std::string& args = "");
  // Coordinator::Join and Done, after bringing back lost worker tasks whose
  // streams are open again.
  absl::Status Join();
  bool Done();
  int live_workers() const { return coordinator_->live_workers(); }

 private:
  explicit ClusterCoordinator(RemoteWorkers* workers) : workers_(workers) {}
  // Coordinator::RestartWorker for each lost worker task that is back.
  void BringBack();

  RemoteWorkers* const workers_;
  std::unique_ptr<Coordinator> coordinator_;
};

}  // namespace shardwild
