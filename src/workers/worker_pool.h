// WorkerPool: one long-lived thread per worker.
//
// Each thread first runs `init(i)` (pinning, OpenMP thread count), then
// waits for work. RunAll() hands the same function to every thread and blocks
// until all have returned; RunOn() hands a function to one thread. A worker's
// failure comes back as a Status, never as a silent death (fastText keeps an
// exception_ptr per worker for the same reason); exceptions thrown by the
// function are turned into Internal errors.
//
// Thread safety: each thread has one mailbox, so at most one call may use a
// thread at a time: RunAll() (all threads) must not overlap any other call,
// and concurrent RunOn() calls must name different threads (the
// coordinator's dispatch thread i is the only caller of RunOn(i), see
// PoolThreadExecutor). Calls are not reentrant.
#pragma once

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/base/mutex.h"

namespace shardwild {

class WorkerPool {
 public:
  WorkerPool(int num_threads, std::function<absl::Status(int)> init);
  ~WorkerPool();  // stops and joins every thread
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }

  // Runs fn(i) on thread i for every i and waits for all of them. While
  // waiting, calls tick() on the calling thread every `period`. Returns the
  // first failure in worker order (an init failure counts), or OK.
  absl::Status RunAll(const std::function<absl::Status(int)>& fn, absl::Duration period = absl::InfiniteDuration(),
                      const std::function<void()>& tick = nullptr);

  // Runs fn(i) on thread i (0 <= i < size()) and waits for it; returns its
  // status, or thread i's init error (fn then does not run).
  absl::Status RunOn(int i, const std::function<absl::Status(int)>& fn);

 private:
  // One thread's work: the function to run next and how it ended.
  struct Mailbox {
    const std::function<absl::Status(int)>* task = nullptr;  // set while busy
    uint64_t generation = 0;  // incremented for each hand-out
    bool busy = false;        // handed out, not yet returned
    absl::Status result;      // of the last hand-out
  };

  void Loop(int index);
  // Hands `fn` to thread i; its mailbox must not be busy.
  void HandOutLocked(int i, const std::function<absl::Status(int)>* fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  std::function<absl::Status(int)> init_;
  std::vector<std::thread> threads_;

  // State below is protected by mu_.
  Mutex mu_;
  CondVar work_cv_;  // signalled when a mailbox gets work or stop_ is set
  CondVar done_cv_;  // signalled when a mailbox's work has returned
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::Status> init_status_ ABSL_GUARDED_BY(mu_);
  std::vector<Mailbox> mailboxes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardwild
