#include "workers/worker_pool.h"

#include <algorithm>
#include <exception>

#include "absl/strings/str_cat.h"

namespace shardwild {

WorkerPool::WorkerPool(int num_threads, std::function<absl::Status(int)> init) : init_(std::move(init)) {
  {
    MutexLock lock(&mu_);
    init_status_.assign(num_threads, absl::OkStatus());
    mailboxes_.assign(num_threads, Mailbox());
  }
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this, i] { Loop(i); });
}

WorkerPool::~WorkerPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

namespace {
absl::Status Guarded(const std::function<absl::Status(int)>& fn, int i) {
  try {
    return fn(i);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("worker ", i, " threw: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat("worker ", i, " threw an unknown exception"));
  }
}
}  // namespace

void WorkerPool::Loop(int index) {
  const absl::Status init = init_ ? Guarded(init_, index) : absl::OkStatus();
  uint64_t seen = 0;  // the mailbox's generation starts at 0; each hand-out increments it
  {
    MutexLock lock(&mu_);
    init_status_[index] = init;
  }
  while (true) {
    const std::function<absl::Status(int)>* task = nullptr;
    {
      MutexLock lock(&mu_);
      work_cv_.Wait(&mu_, [this, index, &seen]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stop_ || mailboxes_[index].generation != seen;
      });
      if (stop_) return;
      seen = mailboxes_[index].generation;
      task = mailboxes_[index].task;
    }
    // A worker whose init failed does not run tasks; the caller gets the init error.
    const absl::Status result = init.ok() ? Guarded(*task, index) : init;
    {
      MutexLock lock(&mu_);
      Mailbox& box = mailboxes_[index];
      box.result = result;
      box.task = nullptr;
      box.busy = false;
    }
    done_cv_.SignalAll();
  }
}

void WorkerPool::HandOutLocked(int i, const std::function<absl::Status(int)>* fn) {
  Mailbox& box = mailboxes_[i];
  box.task = fn;
  box.busy = true;
  ++box.generation;
}

absl::Status WorkerPool::RunAll(const std::function<absl::Status(int)>& fn, absl::Duration period,
                                const std::function<void()>& tick) {
  {
    MutexLock lock(&mu_);
    for (int i = 0; i < size(); ++i) HandOutLocked(i, &fn);
  }
  work_cv_.SignalAll();
  auto finished = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return std::none_of(mailboxes_.begin(), mailboxes_.end(), [](const Mailbox& b) { return b.busy; });
  };
  while (true) {
    bool done;
    {
      MutexLock lock(&mu_);
      if (period == absl::InfiniteDuration()) {
        done_cv_.Wait(&mu_, finished);
        done = true;
      } else {
        done = done_cv_.WaitFor(&mu_, absl::ToChronoNanoseconds(period), finished);
      }
    }
    if (done) break;
    if (tick) tick();
  }
  MutexLock lock(&mu_);
  for (int i = 0; i < size(); ++i) {
    if (!init_status_[i].ok()) return init_status_[i];
    if (!mailboxes_[i].result.ok()) return mailboxes_[i].result;
  }
  return absl::OkStatus();
}

absl::Status WorkerPool::RunOn(int i, const std::function<absl::Status(int)>& fn) {
  if (i < 0 || i >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("worker pool: thread ", i, " is not in [0, ", size(), ")"));
  }
  {
    MutexLock lock(&mu_);
    HandOutLocked(i, &fn);
  }
  work_cv_.SignalAll();
  MutexLock lock(&mu_);
  done_cv_.Wait(&mu_, [this, i]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !mailboxes_[i].busy; });
  if (!init_status_[i].ok()) return init_status_[i];
  return mailboxes_[i].result;
}

}  // namespace shardwild
