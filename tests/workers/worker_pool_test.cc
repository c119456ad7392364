#include "workers/worker_pool.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

absl::Status NoInit(int) { return absl::OkStatus(); }

TEST(WorkerPoolTest, RunsEveryIndexOncePerCall) {
  constexpr int kThreads = 4;
  WorkerPool pool(kThreads, NoInit);
  EXPECT_EQ(pool.size(), kThreads);
  std::vector<std::atomic<int>> calls(kThreads);
  for (std::atomic<int>& c : calls) c.store(0);
  absl::Status s = pool.RunAll([&](int i) {
    calls[i].fetch_add(1);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(calls[i].load(), 1) << "index " << i;
}

TEST(WorkerPoolTest, ConsecutiveRunsEachRunOnce) {
  constexpr int kThreads = 3;
  constexpr int kRuns = 50;
  WorkerPool pool(kThreads, NoInit);
  std::vector<std::atomic<int>> calls(kThreads);
  for (std::atomic<int>& c : calls) c.store(0);
  for (int run = 1; run <= kRuns; ++run) {
    std::atomic<int> this_run{0};
    ASSERT_TRUE(pool
                    .RunAll([&](int i) {
                      calls[i].fetch_add(1);
                      this_run.fetch_add(1);
                      return absl::OkStatus();
                    })
                    .ok());
    // RunAll returns only after every worker finished this call.
    ASSERT_EQ(this_run.load(), kThreads) << "run " << run;
    for (int i = 0; i < kThreads; ++i) ASSERT_EQ(calls[i].load(), run) << "index " << i << ", run " << run;
  }
}

TEST(WorkerPoolTest, EachIndexRunsOnItsOwnThread) {
  constexpr int kThreads = 4;
  WorkerPool pool(kThreads, NoInit);
  std::vector<std::thread::id> first(kThreads), second(kThreads);
  ASSERT_TRUE(pool.RunAll([&](int i) {
                    first[i] = std::this_thread::get_id();
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(pool.RunAll([&](int i) {
                    second[i] = std::this_thread::get_id();
                    return absl::OkStatus();
                  })
                  .ok());
  // Writes by workers are visible to the caller after RunAll.
  EXPECT_EQ(first, second) << "slot i must stay on the same long-lived thread";
  std::set<std::thread::id> distinct(first.begin(), first.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kThreads));
  EXPECT_EQ(distinct.count(std::this_thread::get_id()), 0u);
}

// RunOn(i) runs on thread i (the thread RunAll uses for i), from several
// callers at once for different threads, and returns that call's status;
// an init failure and a bad index are reported.
TEST(WorkerPoolTest, RunOnRunsOnThatThreadConcurrentlyPerThread) {
  constexpr int kThreads = 3;
  WorkerPool pool(kThreads, [](int i) -> absl::Status {
    if (i == 2) return absl::PermissionDeniedError("cannot pin worker 2");
    return absl::OkStatus();
  });
  std::vector<std::thread::id> all(kThreads);
  (void)pool.RunAll([&](int i) {
    all[i] = std::this_thread::get_id();
    return absl::OkStatus();
  });
  constexpr int kCalls = 200;
  std::vector<int> count(2, 0);
  std::vector<bool> same_thread(2, true);
  std::vector<std::thread> callers;
  for (int i = 0; i < 2; ++i) {
    callers.emplace_back([&, i] {
      for (int k = 0; k < kCalls; ++k) {
        const absl::Status s = pool.RunOn(i, [&](int index) {
          if (index != i || std::this_thread::get_id() != all[i]) same_thread[i] = false;
          ++count[i];  // only thread i touches count[i]; RunOn orders it with the caller
          return k == 7 ? absl::DataLossError("seventh") : absl::OkStatus();
        });
        if (k == 7 ? s.code() != absl::StatusCode::kDataLoss : !s.ok()) same_thread[i] = false;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(count[i], kCalls) << i;
    EXPECT_TRUE(same_thread[i]) << "thread " << i << ": wrong thread, index or status";
  }
  bool ran = false;
  const absl::Status init = pool.RunOn(2, [&](int) {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_EQ(init.code(), absl::StatusCode::kPermissionDenied) << init;
  EXPECT_FALSE(ran);
  EXPECT_EQ(pool.RunOn(3, [](int) { return absl::OkStatus(); }).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.RunOn(-1, [](int) { return absl::OkStatus(); }).code(), absl::StatusCode::kInvalidArgument);
}

TEST(WorkerPoolTest, ReturnsFirstErrorInWorkerOrder) {
  WorkerPool pool(4, NoInit);
  std::atomic<int> ran{0};
  absl::Status s = pool.RunAll([&](int i) -> absl::Status {
    ran.fetch_add(1);
    // Worker 3 fails first in time; worker 2's error must still win.
    if (i == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return absl::DataLossError("worker 2 failed");
    }
    if (i == 3) return absl::UnavailableError("worker 3 failed");
    return absl::OkStatus();
  });
  EXPECT_EQ(ran.load(), 4) << "every worker runs even when some fail";
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message(), "worker 2 failed");
  // The pool is usable after a failed call, and old errors do not linger.
  EXPECT_TRUE(pool.RunAll([](int) { return absl::OkStatus(); }).ok());
}

TEST(WorkerPoolTest, ExceptionBecomesInternalError) {
  WorkerPool pool(3, NoInit);
  absl::Status s = pool.RunAll([](int i) -> absl::Status {
    if (i == 1) throw std::runtime_error("kaboom in the step");
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("kaboom in the step"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("worker 1"), absl::string_view::npos) << s;

  absl::Status unknown = pool.RunAll([](int i) -> absl::Status {
    if (i == 0) throw 42;
    return absl::OkStatus();
  });
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInternal) << unknown;

  // The threads survived.
  std::atomic<int> ran{0};
  EXPECT_TRUE(pool.RunAll([&](int) {
                    ran.fetch_add(1);
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_EQ(ran.load(), 3);
}

TEST(WorkerPoolTest, InitRunsOncePerThreadOnThatThread) {
  constexpr int kThreads = 3;
  std::vector<std::atomic<int>> inits(kThreads);
  for (std::atomic<int>& c : inits) c.store(0);
  std::vector<std::thread::id> init_thread(kThreads);
  WorkerPool pool(kThreads, [&](int i) {
    inits[i].fetch_add(1);
    init_thread[i] = std::this_thread::get_id();
    return absl::OkStatus();
  });
  std::vector<std::thread::id> run_thread(kThreads);
  for (int run = 0; run < 3; ++run) {
    ASSERT_TRUE(pool.RunAll([&](int i) {
                      run_thread[i] = std::this_thread::get_id();
                      return absl::OkStatus();
                    })
                    .ok());
  }
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(inits[i].load(), 1);
    EXPECT_EQ(init_thread[i], run_thread[i]);
  }
}

TEST(WorkerPoolTest, InitFailureIsReportedByRunAll) {
  std::atomic<int> ran{0};
  WorkerPool pool(3, [](int i) -> absl::Status {
    if (i == 1) return absl::PermissionDeniedError("cannot pin worker 1");
    return absl::OkStatus();
  });
  auto fn = [&](int) {
    ran.fetch_add(1);
    return absl::OkStatus();
  };
  absl::Status s = pool.RunAll(fn);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_EQ(s.message(), "cannot pin worker 1");
  EXPECT_EQ(ran.load(), 2) << "a worker whose init failed must not run tasks";
  // And it stays reported.
  EXPECT_EQ(pool.RunAll(fn).code(), absl::StatusCode::kPermissionDenied);
}

TEST(WorkerPoolTest, InitExceptionIsReported) {
  WorkerPool pool(2, [](int i) -> absl::Status {
    if (i == 0) throw std::runtime_error("init exploded");
    return absl::OkStatus();
  });
  absl::Status s = pool.RunAll([](int) { return absl::OkStatus(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("init exploded"), absl::string_view::npos) << s;
}

TEST(WorkerPoolTest, TicksWhileWaiting) {
  WorkerPool pool(2, NoInit);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> ticks{0};
  std::atomic<bool> tick_on_caller{true};
  absl::Status s = pool.RunAll(
      [&](int) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return absl::OkStatus();
      },
      absl::Milliseconds(5), [&] {
        ticks.fetch_add(1);
        if (std::this_thread::get_id() != caller) tick_on_caller.store(false);
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_GE(ticks.load(), 1);
  EXPECT_TRUE(tick_on_caller.load()) << "tick must run on the thread that called RunAll";
}

TEST(WorkerPoolTest, NoTickWithInfinitePeriod) {
  WorkerPool pool(2, NoInit);
  int ticks = 0;
  absl::Status s = pool.RunAll(
      [](int) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return absl::OkStatus();
      },
      absl::InfiniteDuration(), [&] { ++ticks; });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(ticks, 0);
}

TEST(WorkerPoolTest, DestructionJoinsCleanly) {
  // Never used.
  { WorkerPool idle(4, NoInit); }
  // Destroyed right after construction, before the threads may have finished init.
  for (int k = 0; k < 20; ++k) {
    WorkerPool quick(3, [](int) {
      std::this_thread::yield();
      return absl::OkStatus();
    });
  }
  // Destroyed after work.
  std::atomic<int> alive{0};
  {
    WorkerPool pool(4, [&](int) {
      alive.fetch_add(1);
      return absl::OkStatus();
    });
    ASSERT_TRUE(pool.RunAll([](int) { return absl::OkStatus(); }).ok());
    EXPECT_EQ(alive.load(), 4);
  }
  // Zero threads: RunAll has nothing to wait for.
  WorkerPool empty(0, NoInit);
  EXPECT_EQ(empty.size(), 0);
  EXPECT_TRUE(empty.RunAll([](int) { return absl::OkStatus(); }).ok());
}

}  // namespace
}  // namespace shardwild
