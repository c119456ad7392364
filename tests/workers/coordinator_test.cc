#include "workers/coordinator.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "core/base/mutex.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

// Waits are bounded only as a failure guard: a correct coordinator answers in
// microseconds; a broken one makes the test fail instead of hang.
constexpr absl::Duration kGuard = absl::Seconds(30);

// A one-shot event on core/base/mutex.h (absl::Notification is not visible to TSan
// in Debian's build).
class Gate {
 public:
  void Open() {
    {
      MutexLock lock(&mu_);
      open_ = true;
    }
    cv_.SignalAll();
  }
  // Returns false if the guard expired first.
  bool Wait() {
    MutexLock lock(&mu_);
    return cv_.WaitFor(&mu_, absl::ToChronoNanoseconds(kGuard), [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return open_; });
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

std::unique_ptr<Coordinator> MakeCoordinator(int workers) {
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator = Coordinator::Create(CoordinatorOptions{.num_workers = workers});
  EXPECT_TRUE(coordinator.ok()) << coordinator.status();
  return *std::move(coordinator);
}

TEST(CoordinatorTest, RejectsBadOptions) {
  EXPECT_EQ(Coordinator::Create(CoordinatorOptions{.num_workers = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Coordinator::Create(std::vector<std::unique_ptr<WorkerExecutor>>{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CoordinatorTest, ScheduleAndFetchValues) {
  auto coordinator = MakeCoordinator(3);
  RemoteValue<int> plain = coordinator->Schedule([](int a, int b) { return a * b; }, 6, 7);
  RemoteValue<int> with_context =
      coordinator->Schedule([](const WorkerContext& ctx, int x) { return ctx.num_workers() * 100 + x; }, 5);
  RemoteValue<std::string> status_or =
      coordinator->Schedule([](const std::string& s) -> absl::StatusOr<std::string> { return s + "!"; }, std::string("hi"));
  std::atomic<int> touched{0};
  RemoteValue<void> status_only = coordinator->Schedule([&touched]() -> absl::Status {
    touched.fetch_add(1);
    return absl::OkStatus();
  });
  RemoteValue<void> returns_void = coordinator->Schedule([&touched] { touched.fetch_add(1); });
  // Move-only arguments are moved into the closure and passed as lvalues.
  RemoteValue<int> move_only = coordinator->Schedule([](std::unique_ptr<int>& p) { return *p + 1; }, std::make_unique<int>(41));

  ASSERT_TRUE(plain.WaitFor(kGuard));
  EXPECT_EQ(plain.Fetch().value(), 42);
  EXPECT_EQ(plain.Fetch().value(), 42) << "Fetch may be called again";
  EXPECT_EQ(with_context.Fetch().value(), 305);
  EXPECT_EQ(status_or.Fetch().value(), "hi!");
  EXPECT_TRUE(status_only.Fetch().ok());
  EXPECT_TRUE(returns_void.Fetch().ok());
  EXPECT_EQ(move_only.Fetch().value(), 42);
  EXPECT_EQ(touched.load(), 2);
  EXPECT_TRUE(coordinator->Join().ok());
  EXPECT_TRUE(coordinator->Done());

  EXPECT_EQ(RemoteValue<int>().Fetch().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator->ScheduleSteps([] { return 1; }, 0).Fetch().status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CoordinatorTest, ExceptionBecomesInternalErrorNamingTheFunction) {
  auto coordinator = MakeCoordinator(1);
  RemoteValue<int> first = coordinator->Schedule([] { return 1; });  // function #1
  RemoteValue<int> thrower = coordinator->Schedule([]() -> int { throw std::runtime_error("boom"); });  // #2
  EXPECT_TRUE(first.Fetch().ok());
  absl::StatusOr<int> result = thrower.Fetch();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(result.status().message(), "function #2 threw: boom")) << result.status();
  EXPECT_EQ(coordinator->Join().code(), absl::StatusCode::kInternal);
}

TEST(CoordinatorTest, JoinWaitsForEverything) {
  auto coordinator = MakeCoordinator(4);
  Gate gate;
  std::atomic<int> finished{0};
  std::vector<RemoteValue<int>> values;
  for (int i = 0; i < 200; ++i) {
    values.push_back(coordinator->Schedule([&gate, &finished, i] {
      EXPECT_TRUE(gate.Wait());
      // A little work, so a Join that returned early would see it unfinished.
      for (int k = 0; k < 100; ++k) std::this_thread::yield();
      finished.fetch_add(1);
      return i;
    }));
  }
  EXPECT_FALSE(coordinator->Done()) << "everything is blocked on the gate";
  gate.Open();
  EXPECT_TRUE(coordinator->Join().ok());
  EXPECT_EQ(finished.load(), 200);
  EXPECT_TRUE(coordinator->Done());
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(values[i].ready()) << i;
    EXPECT_EQ(values[i].Fetch().value(), i);
  }
}

// A dataset whose iterator yields worker * 1000 + 0, 1, 2, ...
struct CountingDataset {
  int worker;
  struct Iterator {
    int worker;
    int next = 0;
    int GetNext() { return worker * 1000 + next++; }
  };
  Iterator MakeIterator() const { return Iterator{worker}; }
};

TEST(CoordinatorTest, PerWorkerDatasetIteratorsAreResolvedPerWorker) {
  constexpr int kWorkers = 3;
  auto coordinator = MakeCoordinator(kWorkers);
  std::vector<int> built_for;
  absl::StatusOr<PerWorker<CountingDataset>> datasets = coordinator->CreatePerWorkerDataset([&built_for](int worker) {
    built_for.push_back(worker);
    return CountingDataset{worker};
  });
  ASSERT_TRUE(datasets.ok()) << datasets.status();
  EXPECT_EQ(built_for, (std::vector<int>{0, 1, 2})) << "dataset_fn runs once per worker";
  PerWorker<CountingDataset::Iterator> iterators = datasets->MakeIterators();
  ASSERT_EQ(iterators.num_workers(), kWorkers);

  struct Seen {
    int worker;
    int value;
  };
  // The first kWorkers functions wait for each other, so every worker must take one.
  Mutex mu;
  int arrived = 0;
  Gate all_arrived;
  auto barrier = [&] {
    bool last;
    {
      MutexLock lock(&mu);
      last = ++arrived == kWorkers;
    }
    if (last) all_arrived.Open();
    EXPECT_TRUE(all_arrived.Wait());
  };
  std::vector<RemoteValue<Seen>> seen;
  for (int i = 0; i < 90; ++i) {
    seen.push_back(coordinator->Schedule(
        [&iterators, &barrier, i](const WorkerContext& ctx, CountingDataset::Iterator& it) {
          if (i < kWorkers) barrier();
          EXPECT_EQ(&it, &ctx.Local(iterators)) << "the argument is this worker's own iterator";
          return Seen{ctx.worker_index(), it.GetNext()};
        },
        iterators));
  }
  // steps_per_execution: one closure advances its worker's iterator 5 times.
  RemoteValue<Seen> stepped = coordinator->ScheduleSteps(
      [](const WorkerContext& ctx, CountingDataset::Iterator& it) { return Seen{ctx.worker_index(), it.GetNext()}; }, 5,
      iterators);
  ASSERT_TRUE(coordinator->Join().ok());

  std::map<int, std::vector<int>> per_worker;
  for (RemoteValue<Seen>& v : seen) {
    absl::StatusOr<Seen> s = v.Fetch();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->value / 1000, s->worker) << "a worker saw another worker's iterator";
    per_worker[s->worker].push_back(s->value % 1000);
  }
  absl::StatusOr<Seen> last = stepped.Fetch();
  ASSERT_TRUE(last.ok());
  per_worker[last->worker].push_back(last->value % 1000);  // the 5th of its steps
  int total = 0;
  for (int w = 0; w < kWorkers; ++w) {
    std::vector<int>& values = per_worker[w];
    std::sort(values.begin(), values.end());
    const int steps = iterators.local(w).next;
    EXPECT_GT(steps, 0) << "worker " << w << " ran nothing";
    total += steps;
    // Each worker's iterator advanced once per function it ran (5 for the stepped one): no value twice, none skipped.
    std::vector<int> expected;
    for (int k = 0; k < steps; ++k) {
      if (w != last->worker || k < steps - 5 || k == steps - 1) expected.push_back(k);
    }
    EXPECT_EQ(values, expected) << "worker " << w;
  }
  EXPECT_EQ(total, 90 + 5);

  absl::StatusOr<PerWorker<CountingDataset>> failed =
      coordinator->CreatePerWorkerDataset([](int worker) -> absl::StatusOr<CountingDataset> {
        if (worker == 1) return absl::NotFoundError("no shard");
        return CountingDataset{worker};
      });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "dataset_fn(1)")) << failed.status();
}

TEST(CoordinatorTest, LostWorkerReschedulesItsFunctionAndTakesNoMoreWork) {
  constexpr int kWorkers = 3;
  constexpr int kFunctions = 50;
  auto coordinator = MakeCoordinator(kWorkers);
  std::atomic<int> lost_worker{-1};
  std::atomic<int> completions{0};
  // The first function run reports that its worker died.
  RemoteValue<int> flaky = coordinator->Schedule([&](const WorkerContext& ctx) -> absl::StatusOr<int> {
    int expected = -1;
    if (lost_worker.compare_exchange_strong(expected, ctx.worker_index())) {
      return WorkerLostError("simulated crash");
    }
    completions.fetch_add(1);
    return ctx.worker_index();
  });
  std::vector<RemoteValue<int>> others;
  for (int i = 0; i < kFunctions; ++i) {
    others.push_back(coordinator->Schedule([&](const WorkerContext& ctx) {
      completions.fetch_add(1);
      return ctx.worker_index();
    }));
  }
  EXPECT_TRUE(coordinator->Join().ok()) << "a lost worker is not an application error";
  absl::StatusOr<int> rerun_on = flaky.Fetch();
  ASSERT_TRUE(rerun_on.ok()) << rerun_on.status();
  EXPECT_NE(*rerun_on, lost_worker.load()) << "the function ran again on another worker";
  EXPECT_EQ(completions.load(), kFunctions + 1);
  EXPECT_EQ(coordinator->live_workers(), kWorkers - 1);
  // The flaky function was the first one any worker took, so the lost worker ran nothing else.
  for (RemoteValue<int>& v : others) EXPECT_NE(v.Fetch().value(), lost_worker.load());
}

TEST(CoordinatorTest, KilledWorkersRunningFunctionRunsAgainAndRestartBringsItBack) {
  auto coordinator = MakeCoordinator(2);
  Gate started, release;
  std::atomic<int> runs{0};
  std::atomic<int> first_worker{-1};
  RemoteValue<int> value = coordinator->Schedule([&](const WorkerContext& ctx) {
    if (runs.fetch_add(1) == 0) {
      first_worker.store(ctx.worker_index());
      started.Open();
      EXPECT_TRUE(release.Wait());
    }
    return ctx.worker_index();
  });
  ASSERT_TRUE(started.Wait());
  const int killed = first_worker.load();
  coordinator->KillWorkerForTest(killed);
  EXPECT_EQ(coordinator->live_workers(), 1);
  release.Open();  // the killed worker's run returns; its result is discarded
  absl::StatusOr<int> result = value.Fetch();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, 1 - killed) << "the value comes from the rerun on the surviving worker";
  EXPECT_EQ(runs.load(), 2);
  EXPECT_TRUE(coordinator->Join().ok());

  // Restart: with the other worker killed, only the restarted one can run work.
  ASSERT_TRUE(coordinator->RestartWorker(killed).ok());
  coordinator->KillWorkerForTest(1 - killed);
  EXPECT_EQ(coordinator->live_workers(), 1);
  EXPECT_EQ(coordinator->Schedule([](const WorkerContext& ctx) { return ctx.worker_index(); }).Fetch().value(), killed);
  EXPECT_TRUE(coordinator->Join().ok());
  EXPECT_EQ(coordinator->RestartWorker(7).code(), absl::StatusCode::kInvalidArgument);
}

// An executor whose worker dies on its first call, before running anything.
class DiesOnceExecutor final : public WorkerExecutor {
 public:
  absl::Status Run(absl::FunctionRef<absl::Status()> fn) override {
    if (!died_) {
      died_ = true;  // only this worker's dispatch thread calls Run
      return WorkerLostError("connection reset");
    }
    return fn();
  }

 private:
  bool died_ = false;
};

TEST(CoordinatorTest, ExecutorReportingLossReschedules) {
  std::vector<std::unique_ptr<WorkerExecutor>> executors;
  executors.push_back(std::make_unique<DiesOnceExecutor>());
  executors.push_back(std::make_unique<DiesOnceExecutor>());
  executors.push_back(std::make_unique<DiesOnceExecutor>());
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator = Coordinator::Create(std::move(executors));
  ASSERT_TRUE(coordinator.ok());
  // Each executor dies on its first call: the function moves on until no worker is left.
  RemoteValue<int> value = (*coordinator)->Schedule([] { return 1; });
  absl::StatusOr<int> result = value.Fetch();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(result.status().message(), "connection reset")) << result.status();
  // Restarted workers run it (their executors have died once already).
  ASSERT_TRUE((*coordinator)->Join().code() == absl::StatusCode::kUnavailable);
  ASSERT_TRUE((*coordinator)->RestartWorker(2).ok());
  EXPECT_EQ((*coordinator)->Schedule([] { return 2; }).Fetch().value(), 2);
  EXPECT_TRUE((*coordinator)->Join().ok());
}

TEST(CoordinatorTest, ApplicationErrorCancelsPendingAndJoinReturnsItOnce) {
  auto coordinator = MakeCoordinator(2);
  Gate fail_now, finish_running;
  Gate failing_started, running_started;
  // Two functions take both workers; everything after them stays queued.
  RemoteValue<int> failing = coordinator->Schedule([&]() -> absl::StatusOr<int> {
    failing_started.Open();
    EXPECT_TRUE(fail_now.Wait());
    return absl::DataLossError("bad batch");
  });
  RemoteValue<int> running = coordinator->Schedule([&] {
    running_started.Open();
    EXPECT_TRUE(finish_running.Wait());
    return 7;
  });
  std::atomic<int> ran_pending{0};
  std::vector<RemoteValue<int>> pending;
  for (int i = 0; i < 10; ++i) {
    pending.push_back(coordinator->Schedule([&ran_pending, i] {
      ran_pending.fetch_add(1);
      return i;
    }));
  }
  ASSERT_TRUE(failing_started.Wait());
  ASSERT_TRUE(running_started.Wait());
  fail_now.Open();
  // Once the failure is visible, the queue has been cancelled.
  EXPECT_EQ(failing.Fetch().status().code(), absl::StatusCode::kDataLoss);
  finish_running.Open();

  const absl::Status joined = coordinator->Join();
  EXPECT_EQ(joined.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(joined.message(), "bad batch");
  EXPECT_TRUE(coordinator->Join().ok()) << "the error is returned once";

  EXPECT_EQ(running.Fetch().value(), 7) << "a function running at the time finishes normally";
  EXPECT_EQ(ran_pending.load(), 0);
  for (RemoteValue<int>& v : pending) {
    absl::StatusOr<int> r = v.Fetch();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
    EXPECT_TRUE(absl::StrContains(r.status().message(), "cancelled because an earlier function (#1) failed"))
        << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "can be scheduled again")) << r.status();
  }

  // Usable again: new functions run, and a new error is reported again.
  EXPECT_EQ(coordinator->Schedule([] { return 3; }).Fetch().value(), 3);
  EXPECT_TRUE(coordinator->Join().ok());
  coordinator->Schedule([] { return absl::AbortedError("second"); });
  EXPECT_EQ(coordinator->Join().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(coordinator->Join().ok());
}

TEST(CoordinatorTest, AllWorkersLostFailsPendingAndNewFunctionsWithUnavailable) {
  auto coordinator = MakeCoordinator(2);
  // Every run kills its worker: both go, and what is queued fails instead of waiting forever.
  std::vector<RemoteValue<int>> values;
  for (int i = 0; i < 5; ++i) {
    values.push_back(coordinator->Schedule([]() -> absl::StatusOr<int> { return WorkerLostError("out of memory"); }));
  }
  const absl::Status joined = coordinator->Join();
  EXPECT_EQ(joined.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(IsWorkerLost(joined)) << "the final error is not a retryable worker loss";
  EXPECT_EQ(coordinator->live_workers(), 0);
  for (RemoteValue<int>& v : values) {
    absl::StatusOr<int> r = v.Fetch();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(absl::StrContains(r.status().message(), "all 2 workers of the coordinator are lost")) << r.status();
  }
  RemoteValue<int> late = coordinator->Schedule([] { return 1; });
  ASSERT_TRUE(late.ready()) << "fails at once";
  EXPECT_EQ(late.Fetch().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(coordinator->Join().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(coordinator->Done());
}

TEST(CoordinatorTest, DestructorCancelsQueuedFunctions) {
  auto coordinator = MakeCoordinator(1);
  Gate started, release;
  RemoteValue<int> running = coordinator->Schedule([&] {
    started.Open();
    EXPECT_TRUE(release.Wait());
    return 1;
  });
  RemoteValue<int> queued = coordinator->Schedule([] { return 2; });
  ASSERT_TRUE(started.Wait());
  std::thread destroyer([&coordinator] { coordinator.reset(); });
  ASSERT_TRUE(queued.WaitFor(kGuard));
  EXPECT_EQ(queued.Fetch().status().code(), absl::StatusCode::kCancelled);
  release.Open();
  destroyer.join();
  EXPECT_EQ(running.Fetch().value(), 1);
}

TEST(CoordinatorTest, StressManySmallFunctionsFromTwoThreads) {
  constexpr int kPerThread = 5000;
  auto coordinator = MakeCoordinator(4);
  std::atomic<int64_t> sum{0};
  std::vector<RemoteValue<int>> values[2];
  std::vector<std::thread> schedulers;
  for (int t = 0; t < 2; ++t) {
    schedulers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        values[t].push_back(coordinator->Schedule(
            [&sum](int x) {
              sum.fetch_add(x, std::memory_order_relaxed);
              return x;
            },
            t * kPerThread + i));
        if (i % 997 == 0) (void)coordinator->Done();
        if (t == 1 && i % 1999 == 0) {
          EXPECT_TRUE(coordinator->Join().ok());  // Join while the other thread schedules
        }
      }
    });
  }
  for (std::thread& s : schedulers) s.join();
  EXPECT_TRUE(coordinator->Join().ok());
  const int64_t n = 2 * kPerThread;
  EXPECT_EQ(sum.load(), n * (n - 1) / 2);
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < kPerThread; ++i) EXPECT_EQ(values[t][i].Fetch().value(), t * kPerThread + i);
  }
}

}  // namespace
}  // namespace shardwild
