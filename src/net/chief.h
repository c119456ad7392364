// The chief's side of remote worker tasks: RemoteWorkers, the third kind of
// TaskWorkers (workers/task_workers.h) behind the task loop
// (workers/task_trainer.h), served by the chief's session service
// (chief.proto).
//
// Slots. A cluster with W worker tasks, each running T worker threads
// (train.workers, resolved alike on every task), has W x T slots; slot
// w * T + t is thread t of worker task w. Spawn opens a slot for a session;
// the slot is `awaiting` (never silent, however long that takes) until the
// worker task's thread connects and says hello, then `ready`. When its
// session ends (the worker task died, was killed, or the network dropped
// it) the loop sees the end of the slot's channel as a death: its task goes
// back to the queue, and with train.restart_workers the slot is opened
// again for the worker task's return. A hello for a slot that is not open
// (given up on) is refused with FAILED_PRECONDITION; one for a slot whose
// previous session the loop has not reaped yet, with ABORTED (the worker
// retries), as is one for a slot the loop has not opened yet (the chief is
// still setting up). Liveness between tasks is the task loop's heartbeat
// rule.
//
// Scheduled functions: besides its slots' sessions, each worker task keeps
// one Functions stream open (cluster_functions.h); CallFunction sends a call
// on it and waits for the answer.
//
// Security: the server binds options.server.bind_address (loopback unless
// configured otherwise; a non-loopback bind needs a token), checks the token
// of every session before reading it (PERMISSION_DENIED), and serves TLS
// when given a certificate, as PsServer does.
//
// Thread safety: the TaskWorkers methods are the loop's (one thread); the
// gRPC session handlers run on gRPC's threads and meet the loop under a
// mutex and through each slot's Inbox.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "net/net_options.h"
#include "workers/task_workers.h"

namespace shardwild {

struct ChiefServerOptions {
  // Where and how to serve (the chief's address from the cluster spec,
  // made with MakePsServerOptions for task chief:0).
  PsServerOptions server;
  int worker_tasks = 1;      // W >= 1
  int threads_per_task = 1;  // T >= 1
  // When the job is over (ExitAll, then the destructor), how long after
  // Start the chief keeps answering "the job is over" for the slots whose
  // worker thread never joined, so a worker task that started late exits
  // cleanly instead of finding no chief and failing after its own
  // train.task_timeout_s. The chief task passes train.task_timeout_s, the
  // worker tasks' patience; 0 waits for no one.
  double late_join_wait_s = 0;
  // The setting late_join_wait_s came from, as the chief's log lines name it
  // (the chief task: "train.task_timeout_s").
  std::string late_join_wait_setting = "late_join_wait_s";
  // Where the chief says what it waits for (a progress line); may be empty.
  std::function<void(const std::string&)> log;
};

class RemoteWorkers final : public TaskWorkers {
 public:
  // Starts the session server on its own gRPC threads; no slot is open yet.
  // InvalidArgument for bad options; Unavailable when the address cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<RemoteWorkers>> Start(const ChiefServerOptions& options);
  // After ExitAll (a job that ended), first waits for the slots that never
  // had a session, until options.late_join_wait_s after Start or until each
  // has been told the job is over; then ends every session and shuts the
  // server down. The trainer's summary is complete by then (its wall_s
  // does not count this wait).
  ~RemoteWorkers() override;

  absl::Status Spawn(Slot& slot) override;
  int Reap(Slot& slot, bool kill_first) override;
  // Sends `exit` to every connected slot and waits up to `grace_s` for the
  // sessions to end; then ends the rest. From here on a hello is answered
  // "the job is over" (FAILED_PRECONDITION, which a worker task takes as
  // its end); the destructor waits for the slots that never had one.
  void ExitAll(double grace_s) override;
  bool processes() const override { return true; }
  bool start_failures_fatal() const override { return false; }
  bool awaiting(const Slot& slot) const override;

  // The port the server listens on.
  int port() const;

  // Scheduled functions (chief.proto Functions; cluster_functions.h). Each
  // worker task keeps a function stream open while it serves; these may be
  // called from any thread.
  int worker_tasks() const;
  // Whether worker task `task`'s function stream is open now.
  bool FunctionsConnected(int task) const;
  // Waits until it is open, or `deadline`; whether it is.
  bool WaitForFunctions(int task, std::chrono::steady_clock::time_point deadline) const;
  // Runs registered function `name` with `args` on worker task `task` and
  // waits for its value or error (the worker task's, with its code). A
  // task without an open stream, or whose stream ends before it answers,
  // gives a WorkerLostError (workers/coordinator.h) naming the task.
  absl::StatusOr<std::string> CallFunction(int task, const std::string& name, const std::string& args);

  class Impl;

 private:
  RemoteWorkers(int slots, std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardwild
