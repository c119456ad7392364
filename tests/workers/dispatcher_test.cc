#include "workers/dispatcher.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/base/mutex.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

using Kind = Assignment::Kind;

// Whether `text` contains `part`, with both shown on failure.
::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

// A clock the test moves by hand; safe to read from any thread.
class FakeClock {
 public:
  absl::Time Now() const {
    MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    MutexLock lock(&mu_);
    now_ += d;
  }
  Dispatcher::Clock AsClock() {
    return [this] { return Now(); };
  }

 private:
  mutable Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'000'000);
};

DispatcherOptions Opts(int64_t records_per_task, int epochs = 1, uint64_t seed = 1) {
  DispatcherOptions o;
  o.records_per_task = records_per_task;
  o.epochs = epochs;
  o.seed = seed;
  return o;
}

std::unique_ptr<Dispatcher> Make(const DispatcherOptions& o, std::vector<DataFile> train,
                                 std::vector<DataFile> eval = {}, std::vector<DataFile> predict = {},
                                 Dispatcher::Clock clock = nullptr) {
  auto d = Dispatcher::Create(o, std::move(train), std::move(eval), std::move(predict), std::move(clock));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(d).value() : nullptr;
}

// GetTask that must hand out a task.
Task Take(Dispatcher& d, int worker) {
  absl::StatusOr<Assignment> a = d.GetTask(worker);
  EXPECT_TRUE(a.ok()) << a.status();
  if (!a.ok()) return Task{};
  EXPECT_EQ(a->kind, Kind::kTask);
  return a->task;
}

Kind KindOf(Dispatcher& d, int worker) {
  absl::StatusOr<Assignment> a = d.GetTask(worker);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? a->kind : Kind::kWait;
}

// Runs one worker to the end, reporting every task done; returns the
// training task ids in the order they were handed out, per epoch.
std::map<int, std::vector<int64_t>> DrainTraining(Dispatcher& d, int worker) {
  std::map<int, std::vector<int64_t>> order;
  for (;;) {
    absl::StatusOr<Assignment> a = d.GetTask(worker);
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok() || a->kind != Kind::kTask) {
      EXPECT_TRUE(a.ok() && a->kind == Kind::kEnd);
      break;
    }
    if (a->task.type == TaskType::kTraining) order[a->task.epoch].push_back(a->task.index);
    EXPECT_EQ(d.ReportDone(worker, a->task.lease), ReportResult::kAccepted);
  }
  return order;
}

// ---- options and splitting --------------------------------------------------

TEST(DispatcherOptionsTest, BadOptionsNameTheKey) {
  struct Case {
    DispatcherOptions o;
    const char* key;
  };
  std::vector<Case> cases;
  DispatcherOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.records_per_task = 0;
  cases.push_back({o, "data.records_per_task"});
  o = DispatcherOptions();
  o.task_timeout_s = 0;
  cases.push_back({o, "train.task_timeout_s"});
  o.task_timeout_s = std::numeric_limits<double>::quiet_NaN();
  cases.push_back({o, "train.task_timeout_s"});
  o.task_timeout_s = std::numeric_limits<double>::infinity();
  cases.push_back({o, "train.task_timeout_s"});
  o = DispatcherOptions();
  o.max_task_retries = -1;
  cases.push_back({o, "train.max_task_retries"});
  o = DispatcherOptions();
  o.epochs = -1;
  cases.push_back({o, "train.epochs"});
  for (const Case& c : cases) {
    const absl::Status s = c.o.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_TRUE(Contains(std::string(s.message()), c.key));
    auto d = Dispatcher::Create(c.o, {{"f", 10}});
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_TRUE(Contains(std::string(d.status().message()), c.key));
  }
  auto d = Dispatcher::Create(DispatcherOptions(), {{"neg", -1}});
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(d.status().message()), "neg"));
}

TEST(DispatcherTest, SplitsFilesIntoTasksAndSkipsEmptyFiles) {
  auto d = Make(Opts(10), {{"a", 25}, {"empty", 0}, {"c", 10}});
  std::vector<Task> tasks;
  for (int i = 0; i < 4; ++i) tasks.push_back(Take(*d, 0));
  EXPECT_EQ(KindOf(*d, 0), Kind::kWait);  // all four in doing
  std::sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.index < b.index; });
  const std::vector<std::tuple<std::string, int64_t, int64_t>> want = {
      {"a", 0, 10}, {"a", 10, 10}, {"a", 20, 5}, {"c", 0, 10}};
  ASSERT_EQ(tasks.size(), want.size());
  std::set<uint64_t> leases;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(tasks[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(tasks[i].file, std::get<0>(want[i]));
    EXPECT_EQ(tasks[i].first_record, std::get<1>(want[i]));
    EXPECT_EQ(tasks[i].records, std::get<2>(want[i]));
    EXPECT_EQ(tasks[i].type, TaskType::kTraining);
    EXPECT_EQ(tasks[i].epoch, 1);
    EXPECT_EQ(tasks[i].attempt, 0);
    leases.insert(tasks[i].lease);
  }
  EXPECT_EQ(leases.size(), 4u);
  for (const Task& t : tasks) EXPECT_EQ(d->ReportDone(0, t.lease), ReportResult::kAccepted);
  EXPECT_EQ(KindOf(*d, 0), Kind::kEnd);
  EXPECT_TRUE(d->finished());
  EXPECT_EQ(d->counters().records_seen, 35);
}

TEST(DispatcherTest, NoRecordsMeansImmediateEnd) {
  auto d = Make(Opts(10, 3), {{"empty", 0}});
  EXPECT_EQ(KindOf(*d, 0), Kind::kEnd);
  EXPECT_EQ(d->counters().records_seen, 0);
}

// ---- ElasticDL's sequence -----------------------------------------------------

TEST(DispatcherTest, ElasticDlSequenceDoneFailedDeadThenExact) {
  auto d = Make(Opts(10), {{"f1", 40}, {"f2", 40}});  // 8 tasks
  std::vector<Task> w1;
  for (int i = 0; i < 7; ++i) w1.push_back(Take(*d, 1));
  const Task w2 = Take(*d, 2);
  EXPECT_EQ(KindOf(*d, 3), Kind::kWait);  // todo empty, 8 in doing

  for (int i = 0; i < 6; ++i) EXPECT_EQ(d->ReportDone(1, w1[i].lease), ReportResult::kAccepted);
  EXPECT_EQ(d->ReportFailed(1, w1[6].lease, absl::InternalError("bad batch")), ReportResult::kAccepted);
  d->WorkerDied(2);
  DispatcherCounters c = d->counters();
  EXPECT_EQ(c.records_seen, 60);
  EXPECT_EQ(c.tasks_requeued, 2);
  EXPECT_EQ(c.worker_failures, 1);

  // The failed and the orphaned task come back, each once.
  std::set<int64_t> again;
  for (int i = 0; i < 2; ++i) {
    const Task t = Take(*d, 3);
    EXPECT_EQ(t.attempt, 1);
    again.insert(t.index);
    EXPECT_EQ(d->ReportDone(3, t.lease), ReportResult::kAccepted);
  }
  EXPECT_EQ(again, (std::set<int64_t>{w1[6].index, w2.index}));
  EXPECT_EQ(KindOf(*d, 3), Kind::kEnd);
  c = d->counters();
  EXPECT_EQ(c.records_seen, 80);
  EXPECT_EQ(c.epochs_completed, 1);
  EXPECT_EQ(c.stale_reports, 0);
  // The dead worker's late report changes nothing.
  EXPECT_EQ(d->ReportDone(2, w2.lease), ReportResult::kStale);
  EXPECT_EQ(d->counters().records_seen, 80);
  EXPECT_EQ(d->counters().stale_reports, 1);
}

// ---- timeouts, retries, stale reports ---------------------------------------

TEST(DispatcherTest, SilentWorkerTimesOutWithFakeClockAndHeartbeatsKeepItAlive) {
  FakeClock clock;
  DispatcherOptions o = Opts(10);
  o.task_timeout_s = 10;
  auto d = Make(o, {{"f", 10}}, {}, {}, clock.AsClock());
  const Task t = Take(*d, 0);
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(d->CheckTimeouts(), 0);
  d->Heartbeat(0);
  clock.Advance(absl::Seconds(9));  // 14 s after hand-out, 9 after the heartbeat
  EXPECT_EQ(d->CheckTimeouts(), 0);
  EXPECT_EQ(KindOf(*d, 1), Kind::kWait);
  clock.Advance(absl::Seconds(2));  // 11 s of silence
  EXPECT_EQ(d->CheckTimeouts(), 1);
  EXPECT_EQ(d->counters().tasks_requeued, 1);

  const Task again = Take(*d, 1);
  EXPECT_EQ(again.index, t.index);
  EXPECT_EQ(again.attempt, 1);
  EXPECT_NE(again.lease, t.lease);
  EXPECT_EQ(d->ReportDone(0, t.lease), ReportResult::kStale);  // the silent worker wakes up
  EXPECT_EQ(d->counters().records_seen, 0);
  EXPECT_EQ(d->ReportDone(1, again.lease), ReportResult::kAccepted);
  EXPECT_EQ(d->counters().records_seen, 10);
  EXPECT_EQ(d->counters().stale_reports, 1);
  EXPECT_EQ(KindOf(*d, 0), Kind::kEnd);
}

TEST(DispatcherTest, GetTaskChecksTimeoutsItself) {
  FakeClock clock;
  DispatcherOptions o = Opts(10);
  o.task_timeout_s = 1;
  auto d = Make(o, {{"f", 10}}, {}, {}, clock.AsClock());
  const Task t = Take(*d, 0);
  // Worker 0 asking again does not keep its lost task alive.
  clock.Advance(absl::Milliseconds(1500));
  const Task again = Take(*d, 0);
  EXPECT_EQ(again.index, t.index);
  EXPECT_EQ(again.attempt, 1);
  EXPECT_EQ(d->ReportDone(0, t.lease), ReportResult::kStale);
  EXPECT_EQ(d->ReportDone(0, again.lease), ReportResult::kAccepted);
  EXPECT_EQ(d->counters().records_seen, 10);
}

TEST(DispatcherTest, RetryCapStopsTheJobNamingTaskAndLastError) {
  DispatcherOptions o = Opts(5, 2);
  o.max_task_retries = 2;
  auto d = Make(o, {{"part-0", 5}}, {{"eval", 3}});
  // Epoch 1 passes; the task fails three times in epoch 2.
  Task t = Take(*d, 0);
  ASSERT_EQ(d->ReportDone(0, t.lease), ReportResult::kAccepted);
  for (int attempt = 0; attempt <= 2; ++attempt) {
    t = Take(*d, 0);
    EXPECT_EQ(t.epoch, 2);
    EXPECT_EQ(t.attempt, attempt);
    EXPECT_EQ(d->ReportFailed(0, t.lease, absl::DataLossError("disk on fire " + std::to_string(attempt))),
              ReportResult::kAccepted);
  }
  absl::StatusOr<Assignment> a = d->GetTask(1);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  const std::string msg(a.status().message());
  EXPECT_TRUE(Contains(msg, "\"part-0\""));
  EXPECT_TRUE(Contains(msg, "records 0-4"));
  EXPECT_TRUE(Contains(msg, "epoch 2"));
  EXPECT_TRUE(Contains(msg, "train.max_task_retries"));
  EXPECT_TRUE(Contains(msg, "last error: disk on fire 2"));
  EXPECT_EQ(d->status(), a.status());
  EXPECT_FALSE(d->finished());
  EXPECT_EQ(d->counters().tasks_requeued, 2);
  // A blocked worker learns at once, too.
  absl::StatusOr<Assignment> w = d->WaitForTask(2, std::chrono::steady_clock::now() + std::chrono::seconds(30));
  EXPECT_EQ(w.status(), a.status());
  EXPECT_EQ(d->StartEvaluation(1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DispatcherTest, DeathsAndTimeoutsCountAgainstTheRetryCap) {
  FakeClock clock;
  DispatcherOptions o = Opts(5);
  o.max_task_retries = 1;
  o.task_timeout_s = 1;
  auto d = Make(o, {{"f", 5}}, {}, {}, clock.AsClock());
  Take(*d, 0);
  d->WorkerDied(0);
  Take(*d, 1);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(d->CheckTimeouts(), 1);
  const absl::Status s = d->status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(std::string(s.message()), "worker 1 sent no report or heartbeat"));
}

TEST(DispatcherTest, StaleReportsAreIgnoredAndCounted) {
  auto d = Make(Opts(10), {{"f", 20}});
  const Task a = Take(*d, 0);
  const Task b = Take(*d, 1);
  EXPECT_EQ(d->ReportDone(0, b.lease), ReportResult::kStale);  // not worker 0's
  EXPECT_EQ(d->ReportDone(0, 12345), ReportResult::kStale);    // never issued
  d->WorkerDied(0);
  d->WorkerDied(0);  // no-op: already dead
  EXPECT_EQ(d->counters().worker_failures, 1);
  EXPECT_EQ(d->ReportDone(0, a.lease), ReportResult::kStale);  // re-queued
  EXPECT_EQ(d->ReportFailed(0, a.lease, absl::InternalError("x")), ReportResult::kStale);
  EXPECT_EQ(d->ReportDone(1, b.lease), ReportResult::kAccepted);
  EXPECT_EQ(d->ReportDone(1, b.lease), ReportResult::kStale);  // twice
  const Task a2 = Take(*d, 0);  // worker 0 is back
  EXPECT_EQ(a2.index, a.index);
  EXPECT_EQ(d->ReportDone(0, a2.lease), ReportResult::kAccepted);
  const DispatcherCounters c = d->counters();
  EXPECT_EQ(c.records_seen, 20);
  EXPECT_EQ(c.stale_reports, 5);
  EXPECT_EQ(c.tasks_requeued, 1);
  d->WorkerDied(0);  // died again after coming back: counts
  EXPECT_EQ(d->counters().worker_failures, 2);
}

// ---- epochs and shuffling ------------------------------------------------------

TEST(DispatcherTest, EpochsDoNotOverlap) {
  auto d = Make(Opts(1, 2), {{"f", 3}});
  const Task a = Take(*d, 0), b = Take(*d, 1), c = Take(*d, 2);
  EXPECT_EQ(d->ReportDone(0, a.lease), ReportResult::kAccepted);
  EXPECT_EQ(d->ReportDone(1, b.lease), ReportResult::kAccepted);
  EXPECT_EQ(KindOf(*d, 0), Kind::kWait);  // epoch 1's last task is still out
  EXPECT_EQ(d->counters().epoch, 1);
  EXPECT_EQ(d->ReportDone(2, c.lease), ReportResult::kAccepted);
  const Task next = Take(*d, 0);
  EXPECT_EQ(next.epoch, 2);
  EXPECT_EQ(d->counters().epochs_completed, 1);
}

// Reference implementation of the documented shuffle: SplitMix64 from the
// seed, running on across epochs; Fisher-Yates with next() % (i + 1).
std::vector<std::vector<int64_t>> ReferenceOrders(int64_t n, uint64_t seed, int epochs) {
  uint64_t state = seed;
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  std::vector<std::vector<int64_t>> orders;
  for (int e = 0; e < epochs; ++e) {
    std::vector<int64_t> order(n);
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[next() % static_cast<uint64_t>(i + 1)]);
    orders.push_back(order);
  }
  return orders;
}

TEST(DispatcherTest, ShuffleIsDeterministicPerSeedAndDiffersPerEpoch) {
  const std::vector<DataFile> files = {{"a", 100}, {"b", 57}};  // 16 tasks of 10
  auto run = [&](uint64_t seed) {
    auto d = Make(Opts(10, 3, seed), files);
    return DrainTraining(*d, 0);
  };
  const auto first = run(7);
  const auto again = run(7);
  const auto other = run(8);
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
  EXPECT_NE(first.at(1), first.at(2));
  EXPECT_NE(first.at(2), first.at(3));
  const auto ref = ReferenceOrders(16, 7, 3);
  for (int e = 1; e <= 3; ++e) {
    EXPECT_EQ(first.at(e), ref[e - 1]) << "epoch " << e;
    std::vector<int64_t> sorted = first.at(e);
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(sorted[i], i);
  }
}

// ---- checkpoint cursor --------------------------------------------------------

TEST(DispatcherTest, CursorRoundTripMidEpochHandsOutExactlyTheRest) {
  const std::vector<DataFile> files = {{"a", 70}, {"b", 45}};  // 12 tasks of 10
  const int64_t total = 115;
  const DispatcherOptions o = Opts(10, 3, 42);
  auto reference = Make(o, files);
  const auto want = DrainTraining(*reference, 0);
  ASSERT_EQ(want.size(), 3u);

  // The first run: all of epoch 1, then 5 tasks of epoch 2 of which 4 are done.
  auto d = Make(o, files);
  for (int i = 0; i < 12; ++i) ASSERT_EQ(d->ReportDone(0, Take(*d, 0).lease), ReportResult::kAccepted);
  std::set<int64_t> done;
  for (int i = 0; i < 5; ++i) {
    const Task t = Take(*d, 0);
    EXPECT_EQ(t.epoch, 2);
    EXPECT_EQ(t.index, want.at(2)[i]);
    if (i == 2) continue;  // in flight at the checkpoint
    ASSERT_EQ(d->ReportDone(0, t.lease), ReportResult::kAccepted);
    done.insert(t.index);
  }
  const DataCursor cursor = d->Cursor();
  EXPECT_EQ(cursor.epoch, 2);
  EXPECT_EQ(std::set<int64_t>(cursor.done.begin(), cursor.done.end()), done);
  EXPECT_TRUE(std::is_sorted(cursor.done.begin(), cursor.done.end()));

  const std::string json = cursor.ToJson();
  absl::StatusOr<DataCursor> parsed = DataCursor::FromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->epoch, cursor.epoch);
  EXPECT_EQ(parsed->rng_state, cursor.rng_state);
  EXPECT_EQ(parsed->done, cursor.done);
  EXPECT_EQ(parsed->num_tasks, 12);
  EXPECT_EQ(parsed->records_per_task, 10);

  auto resumed = Make(o, files);
  ASSERT_TRUE(resumed->Restore(*parsed).ok());
  EXPECT_EQ(resumed->counters().records_seen, total + 40);
  const auto got = DrainTraining(*resumed, 0);
  std::vector<int64_t> rest;
  for (int64_t id : want.at(2)) {
    if (!done.count(id)) rest.push_back(id);
  }
  ASSERT_EQ(rest.size(), 8u);
  EXPECT_EQ(got.at(2), rest);
  EXPECT_EQ(got.at(3), want.at(3));
  EXPECT_EQ(got.count(1), 0u);
  EXPECT_EQ(resumed->counters().records_seen, 3 * total);
  EXPECT_EQ(resumed->counters().epochs_completed, 3);
}

// ---- growing training data (a streamed cache still being built) ----------

// Tasks appear as records become readable, cut exactly as the final file's
// (whole tasks only until the end is known); epoch 1 does not end before
// the final count; later epochs shuffle the whole list as an ungrown epoch
// 1 would have; counts are exact.
TEST(DispatcherTest, GrowingTrainingHandsOutReadableTasksAndEndsEpochOneAtTheFinalCount) {
  DispatcherOptions o = Opts(10, 3, 5);
  const auto want = DrainTraining(*Make(o, {{"t", 95}}), 0);  // 10 tasks, the last of 5 records
  o.growing = true;
  auto d = Make(o, {{"t", 14}});  // 14 readable: one whole task
  ASSERT_TRUE(d->growing());
  Task t = Take(*d, 0);
  EXPECT_EQ(t.epoch, 1);
  EXPECT_EQ(t.index, 0);
  EXPECT_EQ(t.first_record, 0);
  EXPECT_EQ(t.records, 10);
  EXPECT_EQ(KindOf(*d, 1), Kind::kWait);  // records 10-13 wait for a whole task or the end
  ASSERT_EQ(d->ReportDone(0, t.lease), ReportResult::kAccepted);
  EXPECT_EQ(KindOf(*d, 0), Kind::kWait) << "epoch 1 ended before its data was complete";
  EXPECT_EQ(d->counters().epochs_completed, 0);
  // A cursor taken now says so, and holds the tasks known.
  DataCursor mid = d->Cursor();
  EXPECT_TRUE(mid.growing);
  EXPECT_EQ(mid.num_tasks, 1);
  EXPECT_EQ(mid.done, std::vector<int64_t>{0});
  absl::StatusOr<DataCursor> parsed = DataCursor::FromJson(mid.ToJson());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->growing);
  EXPECT_EQ(d->Restore(mid).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(d->GrowTraining(13, false).code(), absl::StatusCode::kInvalidArgument);  // shrank

  ASSERT_TRUE(d->GrowTraining(62, false).ok());  // tasks 1-5
  std::set<int64_t> seen = {0};
  for (int i = 0; i < 5; ++i) {
    t = Take(*d, 0);
    EXPECT_EQ(t.records, 10);
    EXPECT_EQ(t.first_record, t.index * 10);
    EXPECT_TRUE(seen.insert(t.index).second);
    ASSERT_EQ(d->ReportDone(0, t.lease), ReportResult::kAccepted);
  }
  EXPECT_EQ(KindOf(*d, 0), Kind::kWait);
  ASSERT_TRUE(d->GrowTraining(95, true).ok());  // tasks 6-9, the last of 5 records
  EXPECT_FALSE(d->growing());
  EXPECT_EQ(d->GrowTraining(95, true).code(), absl::StatusCode::kFailedPrecondition);
  const auto rest = DrainTraining(*d, 0);
  ASSERT_EQ(rest.at(1).size(), 4u);
  for (int64_t id : rest.at(1)) EXPECT_TRUE(seen.insert(id).second);
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(rest.at(2), want.at(1)) << "epoch 2 shuffles as an ungrown epoch 1";
  EXPECT_EQ(rest.at(3), want.at(2));
  EXPECT_EQ(d->counters().records_seen, 3 * 95);
  EXPECT_EQ(d->counters().epochs_completed, 3);

  // The growing cursor restores into the grown data's dispatcher: its done
  // tasks are left out of epoch 1, and the counts stay exact.
  o.growing = false;
  auto resumed = Make(o, {{"t", 95}});
  ASSERT_TRUE(resumed->Restore(*parsed).ok());
  EXPECT_EQ(resumed->counters().records_seen, 10);
  const auto after = DrainTraining(*resumed, 0);
  EXPECT_EQ(after.at(1).size(), 9u);
  EXPECT_EQ(std::count(after.at(1).begin(), after.at(1).end(), 0), 0);
  EXPECT_EQ(resumed->counters().records_seen, 3 * 95);
  // Not onto another epoch, nor onto fewer tasks.
  DataCursor wrong = mid;
  wrong.epoch = 2;
  EXPECT_EQ(Make(o, {{"t", 95}})->Restore(wrong).code(), absl::StatusCode::kInvalidArgument);
  wrong = mid;
  wrong.num_tasks = 11;
  EXPECT_EQ(Make(o, {{"t", 95}})->Restore(wrong).code(), absl::StatusCode::kInvalidArgument);
  // Not growing on a dispatcher that is not; more than one file is refused.
  EXPECT_EQ(resumed->GrowTraining(100, true).code(), absl::StatusCode::kFailedPrecondition);
  o.growing = true;
  EXPECT_EQ(Dispatcher::Create(o, {{"a", 1}, {"b", 1}}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Growing with workers that die: a task that was out goes back and is done
// once; a data set that turns out empty ends at once.
TEST(DispatcherTest, GrowingTrainingStaysExactThroughDeathsAndEmptyData) {
  DispatcherOptions o = Opts(4, 1, 9);
  o.growing = true;
  auto d = Make(o, {{"t", 0}});
  EXPECT_EQ(KindOf(*d, 0), Kind::kWait);
  ASSERT_TRUE(d->GrowTraining(8, false).ok());
  const Task a = Take(*d, 0);
  const Task b = Take(*d, 1);
  d->WorkerDied(0);
  ASSERT_TRUE(d->GrowTraining(10, true).ok());
  ASSERT_EQ(d->ReportDone(1, b.lease), ReportResult::kAccepted);
  EXPECT_EQ(d->ReportDone(0, a.lease), ReportResult::kStale);
  const auto rest = DrainTraining(*d, 2);
  ASSERT_EQ(rest.at(1).size(), 2u);  // a's task again, and the last (2 records)
  EXPECT_EQ(d->counters().records_seen, 10);
  EXPECT_EQ(d->counters().tasks_requeued, 1);
  EXPECT_TRUE(d->finished());

  auto empty = Make(o, {{"t", 0}});
  EXPECT_EQ(KindOf(*empty, 0), Kind::kWait);
  ASSERT_TRUE(empty->GrowTraining(0, true).ok());
  EXPECT_EQ(KindOf(*empty, 0), Kind::kEnd);
  EXPECT_EQ(empty->counters().epochs_completed, 1);
}

TEST(DispatcherTest, RestoreRejectsMismatchesAndLateCalls) {
  const DispatcherOptions o = Opts(10, 2);
  auto d = Make(o, {{"a", 30}});
  DataCursor c = d->Cursor();
  c.num_tasks = 4;
  EXPECT_EQ(d->Restore(c).code(), absl::StatusCode::kInvalidArgument);
  c = d->Cursor();
  c.records_per_task = 5;
  EXPECT_EQ(d->Restore(c).code(), absl::StatusCode::kInvalidArgument);
  c = d->Cursor();
  c.epoch = 3;
  EXPECT_EQ(d->Restore(c).code(), absl::StatusCode::kInvalidArgument);
  c = d->Cursor();
  c.done = {1, 1};
  EXPECT_EQ(d->Restore(c).code(), absl::StatusCode::kInvalidArgument);
  c.done = {3};
  EXPECT_EQ(d->Restore(c).code(), absl::StatusCode::kInvalidArgument);
  Take(*d, 0);
  EXPECT_EQ(d->Restore(d->Cursor()).code(), absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(DataCursor::FromJson("{").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DataCursor::FromJson("[]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DataCursor::FromJson(R"({"epoch":1,"num_tasks":3,"records_per_task":10,"done":[]})").status().code(),
            absl::StatusCode::kInvalidArgument);  // no rng_state
  EXPECT_EQ(
      DataCursor::FromJson(R"({"epoch":1,"rng_state":"x","num_tasks":3,"records_per_task":10,"done":[]})")
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  // The full 64-bit state survives.
  DataCursor big;
  big.rng_state = 0xfedcba9876543210ULL;
  EXPECT_EQ(DataCursor::FromJson(big.ToJson())->rng_state, 0xfedcba9876543210ULL);
}

TEST(DispatcherTest, RestoreAtAnEpochsEndMovesOn) {
  const DispatcherOptions o = Opts(10, 2, 3);
  auto reference = Make(o, {{"a", 30}});
  const auto want = DrainTraining(*reference, 0);
  DataCursor c = Make(o, {{"a", 30}})->Cursor();
  c.done = {0, 1, 2};  // epoch 1 complete
  auto d = Make(o, {{"a", 30}});
  ASSERT_TRUE(d->Restore(c).ok());
  const auto got = DrainTraining(*d, 0);
  EXPECT_EQ(got.count(1), 0u);
  EXPECT_EQ(got.at(2), want.at(2));
  EXPECT_EQ(d->counters().records_seen, 60);
}

// ---- evaluation and prediction ----------------------------------------------

TEST(DispatcherTest, EvaluationSeesEveryRecordOnceWhenAWorkerDiesMidRound) {
  auto d = Make(Opts(10), {{"train", 100}}, {{"e1", 30}, {"e2", 25}});  // 6 eval tasks
  const Task train = Take(*d, 0);
  EXPECT_EQ(train.type, TaskType::kTraining);
  absl::StatusOr<int> round = d->StartEvaluation(42);
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_EQ(*round, 1);
  EXPECT_EQ(d->StartEvaluation(43).status().code(), absl::StatusCode::kFailedPrecondition);

  // Evaluation goes first.
  std::vector<Task> w1 = {Take(*d, 1), Take(*d, 1)};
  std::vector<Task> w2 = {Take(*d, 2), Take(*d, 2), Take(*d, 2), Take(*d, 2)};
  for (const Task& t : w1) {
    EXPECT_EQ(t.type, TaskType::kEvaluation);
    EXPECT_EQ(t.model_version, 42);
    EXPECT_EQ(t.round, 1);
  }
  for (const Task& t : w2) EXPECT_EQ(t.type, TaskType::kEvaluation);
  EXPECT_EQ(Take(*d, 3).type, TaskType::kTraining);  // round's todo is empty: training interleaves

  EXPECT_EQ(d->ReportDone(2, w2[0].lease), ReportResult::kAccepted);
  d->WorkerDied(1);
  EXPECT_EQ(d->ReportDone(1, w1[0].lease), ReportResult::kStale);
  for (size_t i = 1; i < w2.size(); ++i) EXPECT_EQ(d->ReportDone(2, w2[i].lease), ReportResult::kAccepted);
  EXPECT_FALSE(d->EvaluationDone(1));
  for (int i = 0; i < 2; ++i) {
    const Task t = Take(*d, 2);
    EXPECT_EQ(t.type, TaskType::kEvaluation);
    EXPECT_EQ(t.attempt, 1);
    EXPECT_EQ(d->ReportDone(2, t.lease), ReportResult::kAccepted);
  }
  EXPECT_TRUE(d->EvaluationDone(1));
  const DispatcherCounters c = d->counters();
  EXPECT_EQ(c.eval_records_seen, 55);
  EXPECT_EQ(c.eval_rounds_completed, 1);
  EXPECT_EQ(c.records_seen, 0);
  // A second round is allowed now and counts again.
  EXPECT_EQ(*d->StartEvaluation(50), 2);
}

// GetEvaluationTask hands out the open round's tasks only: training tasks
// stay queued (kWait) before, during and after the round, and a re-queued
// evaluation task is handed out again.
TEST(DispatcherTest, GetEvaluationTaskLeavesTrainingTasksQueued) {
  auto d = Make(Opts(10), {{"train", 30}}, {{"e", 20}});  // 3 training, 2 eval tasks
  absl::StatusOr<Assignment> a = d->GetEvaluationTask(0);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->kind, Kind::kWait) << "no round is open";
  ASSERT_TRUE(d->StartEvaluation(3).ok());
  a = d->GetEvaluationTask(0);
  ASSERT_TRUE(a.ok() && a->kind == Kind::kTask);
  const Task e0 = a->task;
  a = d->GetEvaluationTask(1);
  ASSERT_TRUE(a.ok() && a->kind == Kind::kTask);
  const Task e1 = a->task;
  EXPECT_EQ(e0.type, TaskType::kEvaluation);
  EXPECT_EQ(e1.type, TaskType::kEvaluation);
  a = d->GetEvaluationTask(2);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, Kind::kWait) << "the round's tasks are out; training tasks are not handed out";
  d->WorkerDied(1);
  a = d->GetEvaluationTask(2);
  ASSERT_TRUE(a.ok() && a->kind == Kind::kTask);
  EXPECT_EQ(a->task.index, e1.index);
  EXPECT_EQ(a->task.attempt, 1);
  EXPECT_EQ(d->ReportDone(0, e0.lease), ReportResult::kAccepted);
  EXPECT_EQ(d->ReportDone(2, a->task.lease), ReportResult::kAccepted);
  EXPECT_TRUE(d->EvaluationDone(1));
  EXPECT_EQ(d->counters().eval_records_seen, 20);
  EXPECT_EQ(d->counters().records_seen, 0);
  a = d->GetEvaluationTask(0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, Kind::kWait);
  EXPECT_EQ(Take(*d, 0).type, TaskType::kTraining) << "GetTask still hands out training";
}

TEST(DispatcherTest, OpenEvaluationRoundKeepsTheJobFromEnding) {
  auto d = Make(Opts(10), {{"train", 10}}, {{"e", 10}});
  const Task t = Take(*d, 0);
  ASSERT_TRUE(d->StartEvaluation(7).ok());
  EXPECT_EQ(d->ReportDone(0, t.lease), ReportResult::kAccepted);
  EXPECT_FALSE(d->finished());
  const Task e = Take(*d, 0);
  EXPECT_EQ(e.type, TaskType::kEvaluation);
  EXPECT_EQ(KindOf(*d, 1), Kind::kWait);
  EXPECT_EQ(d->ReportDone(0, e.lease), ReportResult::kAccepted);
  EXPECT_EQ(KindOf(*d, 1), Kind::kEnd);
  // A final round after training: the job is unfinished until it is done.
  ASSERT_TRUE(d->StartEvaluation(8).ok());
  EXPECT_FALSE(d->finished());
  const Task last = Take(*d, 1);
  EXPECT_EQ(last.type, TaskType::kEvaluation);
  EXPECT_EQ(last.model_version, 8);
  EXPECT_EQ(d->StartEvaluation(9).status().code(), absl::StatusCode::kFailedPrecondition) << "a round is open";
  EXPECT_EQ(d->ReportDone(1, last.lease), ReportResult::kAccepted);
  EXPECT_TRUE(d->finished());
  EXPECT_EQ(KindOf(*d, 0), Kind::kEnd);
  EXPECT_EQ(d->counters().eval_records_seen, 20);
}

TEST(DispatcherTest, PredictionTasksCarryTheirInputIndex) {
  auto d = Make(Opts(10, 0), {}, {}, {{"p1", 25}, {"p2", 10}});
  std::vector<Task> tasks;
  for (int i = 0; i < 4; ++i) tasks.push_back(Take(*d, i % 2));
  const std::vector<std::tuple<std::string, int64_t, int64_t>> want = {
      {"p1", 0, 10}, {"p1", 10, 10}, {"p1", 20, 5}, {"p2", 0, 10}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(tasks[i].type, TaskType::kPrediction);
    EXPECT_EQ(tasks[i].index, i);  // handed out in input order
    EXPECT_EQ(tasks[i].file, std::get<0>(want[i]));
    EXPECT_EQ(tasks[i].first_record, std::get<1>(want[i]));
    EXPECT_EQ(tasks[i].records, std::get<2>(want[i]));
  }
  EXPECT_EQ(d->ReportFailed(1, tasks[1].lease, absl::UnavailableError("oops")), ReportResult::kAccepted);
  const Task again = Take(*d, 0);
  EXPECT_EQ(again.index, 1);
  EXPECT_EQ(again.first_record, 10);
  for (int i : {0, 2, 3}) EXPECT_EQ(d->ReportDone(i % 2, tasks[i].lease), ReportResult::kAccepted);
  EXPECT_EQ(KindOf(*d, 1), Kind::kWait);
  EXPECT_EQ(d->ReportDone(0, again.lease), ReportResult::kAccepted);
  EXPECT_EQ(KindOf(*d, 1), Kind::kEnd);
  EXPECT_EQ(d->counters().predict_records_seen, 35);
}

// ---- blocking -----------------------------------------------------------------

TEST(DispatcherTest, WaitForTaskWakesOnRequeue) {
  auto d = Make(Opts(10), {{"f", 10}});
  const Task t = Take(*d, 0);
  // Short deadline: kWait.
  absl::StatusOr<Assignment> w = d->WaitForTask(1, std::chrono::steady_clock::now() + std::chrono::milliseconds(20));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->kind, Kind::kWait);

  absl::StatusOr<Assignment> got;
  std::thread waiter([&] { got = d->WaitForTask(1, std::chrono::steady_clock::now() + std::chrono::seconds(60)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(d->ReportFailed(0, t.lease, absl::InternalError("retry me")), ReportResult::kAccepted);
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kind, Kind::kTask);
  EXPECT_EQ(got->task.index, t.index);
  EXPECT_EQ(got->task.attempt, 1);
}

TEST(DispatcherTest, WaitForTaskReturnsEndWhenTheLastTaskIsDone) {
  auto d = Make(Opts(10), {{"f", 10}});
  const Task t = Take(*d, 0);
  absl::StatusOr<Assignment> got;
  std::thread waiter([&] { got = d->WaitForTask(1, std::chrono::steady_clock::now() + std::chrono::seconds(60)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(d->ReportDone(0, t.lease), ReportResult::kAccepted);
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind, Kind::kEnd);
}

// ---- stress -------------------------------------------------------------------

// Four worker threads take tasks and report them done, failed, die holding
// them, or drop them silently (they come back by timeout, driven by a fake
// clock that waiting workers move on). One evaluation round is open from the
// start and worker 0 opens more now and then. Every training task must be
// accepted exactly once per epoch and every eval task once per round.
TEST(DispatcherStressTest, FourThreadsWithFailuresAndDeathsCountExactly) {
  FakeClock clock;
  DispatcherOptions o = Opts(7, 3, 99);
  o.max_task_retries = 1'000'000;
  o.task_timeout_s = 5;
  const std::vector<DataFile> train = {{"a", 100}, {"b", 53}, {"c", 0}, {"d", 211}};
  const int64_t train_total = 364;
  const std::vector<DataFile> eval = {{"e1", 40}, {"e2", 33}};
  const int64_t eval_total = 73;
  auto d = Make(o, train, eval, {}, clock.AsClock());
  ASSERT_NE(d, nullptr);

  Mutex mu;
  std::map<std::tuple<int, int, int64_t>, int> accepted;  // (type, epoch or round, index) -> count
  int64_t stale_seen = 0, deaths = 0, rounds_started = 0;
  bool failed = false;

  auto worker_loop = [&](int id) {
    std::mt19937_64 rng(1234 + id);
    std::uniform_real_distribution<double> roll(0.0, 1.0);
    int64_t my_stale = 0, my_deaths = 0, my_rounds = 0;
    std::vector<std::tuple<int, int, int64_t>> mine;
    for (int iter = 0; iter < 200'000; ++iter) {
      if (id == 0 && iter % 15 == 14) {
        if (d->StartEvaluation(iter).ok()) ++my_rounds;
      }
      absl::StatusOr<Assignment> a =
          d->WaitForTask(id, std::chrono::steady_clock::now() + std::chrono::milliseconds(20));
      if (!a.ok()) {
        MutexLock lock(&mu);
        failed = true;
        ADD_FAILURE() << a.status();
        break;
      }
      if (a->kind == Kind::kEnd) break;
      if (a->kind == Kind::kWait) {
        // Whatever is out may be lost: let it time out.
        clock.Advance(absl::Seconds(6));
        d->CheckTimeouts();
        continue;
      }
      const Task& t = a->task;
      const auto key = std::make_tuple(static_cast<int>(t.type), t.type == TaskType::kEvaluation ? t.round : t.epoch,
                                       t.index);
      const double r = roll(rng);
      if (r < 0.75) {
        if (d->ReportDone(id, t.lease) == ReportResult::kAccepted) {
          mine.push_back(key);
        } else {
          ++my_stale;
        }
      } else if (r < 0.87) {
        if (d->ReportFailed(id, t.lease, absl::UnavailableError("flaky")) == ReportResult::kStale) ++my_stale;
      } else if (r < 0.93) {
        d->WorkerDied(id);
        ++my_deaths;
        EXPECT_EQ(d->ReportDone(id, t.lease), ReportResult::kStale);
        ++my_stale;
      } else {
        // Dropped silently.
      }
    }
    MutexLock lock(&mu);
    for (const auto& k : mine) ++accepted[k];
    stale_seen += my_stale;
    deaths += my_deaths;
    rounds_started += my_rounds;
  };

  // One round open from the start; worker 0 opens more as it goes.
  ASSERT_TRUE(d->StartEvaluation(0).ok());
  rounds_started = 1;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(worker_loop, i);
  for (std::thread& t : threads) t.join();

  MutexLock lock(&mu);
  ASSERT_FALSE(failed);
  ASSERT_TRUE(d->finished());
  const DispatcherCounters c = d->counters();
  EXPECT_EQ(c.records_seen, 3 * train_total);
  EXPECT_EQ(c.epochs_completed, 3);
  EXPECT_EQ(c.eval_rounds_started, rounds_started);
  EXPECT_EQ(c.eval_rounds_completed, rounds_started);
  EXPECT_EQ(c.eval_records_seen, rounds_started * eval_total);
  EXPECT_EQ(c.stale_reports, stale_seen);
  EXPECT_EQ(c.worker_failures, deaths);
  EXPECT_GT(c.tasks_requeued, 0);
  EXPECT_GT(deaths, 0);
  EXPECT_GT(rounds_started, 0);
  EXPECT_GE(c.stale_reports, deaths);

  // Exactly once, task by task.
  const int64_t train_tasks = 15 + 8 + 31;  // ceil(100/7) + ceil(53/7) + ceil(211/7)
  const int64_t eval_tasks = 6 + 5;
  for (int e = 1; e <= 3; ++e) {
    for (int64_t i = 0; i < train_tasks; ++i) {
      EXPECT_EQ((accepted[{static_cast<int>(TaskType::kTraining), e, i}]), 1)
          << "epoch " << e << " task " << i;
    }
  }
  for (int r = 1; r <= rounds_started; ++r) {
    for (int64_t i = 0; i < eval_tasks; ++i) {
      EXPECT_EQ((accepted[{static_cast<int>(TaskType::kEvaluation), r, i}]), 1)
          << "round " << r << " task " << i;
    }
  }
  int64_t keys = 0;
  for (const auto& [k, n] : accepted) keys += n > 0;
  EXPECT_EQ(keys, 3 * train_tasks + rounds_started * eval_tasks);
}

}  // namespace
}  // namespace shardwild
