// Checkpoints written by training and resumed by it, on the real
// Fashion-MNIST files (skipped when they are absent): a sync run stopped
// right after a checkpoint and started again ends bit-identical to an
// uninterrupted run, with exact record counts; a damaged newest checkpoint
// falls back to the one before; --fresh ignores them.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/config/config.h"
#include "core/data/data_gen.h"
#include "nlohmann/json.hpp"
#include "gtest/gtest.h"
#include "tests/workers/test_config.h"
#include "workers/checkpoint.h"
#include "workers/job.h"
#include "workers/progress.h"
#include "workers/trainer.h"

namespace shardwild {
namespace {

namespace fs = std::filesystem;
using testdata::HaveFashionMnist;
using testdata::LoadConfigWithSets;
using testdata::LoadDefaultConfig;

using testdata::TempDir;

struct RunOutcome {
  absl::Status status;
  TrainSummary summary;
  std::vector<std::vector<float>> params;
};

// A small deterministic job: sync, 2 workers, 3 epochs over 3000 records,
// a checkpoint every 5 steps of each worker.
std::vector<std::string> Sets(const std::string& dir, const std::string& update = "sync") {
  return {"ps.update=" + update,     "train.workers=2",          "train.epochs=3",
          "data.max_train_records=3000", "data.max_test_records=500", "checkpoint.dir=" + dir,
          "checkpoint.every_steps=5", "checkpoint.keep=3",        "ps.shards=2"};
}

RunOutcome TrainOnce(const std::vector<std::string>& sets, const TrainRunOptions& options = {}) {
  RunOutcome run;
  absl::StatusOr<Config> config = LoadDefaultConfig(sets);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return run;
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(*config);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return run;
  ProgressReporter silent = ProgressReporter::Silent();
  absl::StatusOr<TrainSummary> s = RunTraining(**job, silent, options);
  run.status = s.status();
  if (s.ok()) run.summary = *s;
  const StoreLayout& layout = (*job)->store().layout();
  for (int v = 0; v < static_cast<int>(layout.variables.size()); ++v) {
    run.params.emplace_back(layout.variables[v].size());
    EXPECT_TRUE((*job)->store().PullVariable(v, run.params.back().data()).ok());
  }
  return run;
}

bool BitEqual(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t v = 0; v < a.size(); ++v) {
    if (a[v].size() != b[v].size() || std::memcmp(a[v].data(), b[v].data(), a[v].size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

TEST(ResumeTest, StoppedSyncRunResumesBitIdentical) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  TempDir a, b;
  const RunOutcome whole = TrainOnce(Sets(a.path()));
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  EXPECT_EQ(whole.summary.records_seen, 3 * 3000);
  EXPECT_FALSE(whole.summary.resumed_from_step.has_value());
  // 3000 records / 2 workers / batch 128 = 12 steps each per epoch: 36 in
  // all, checkpoints at 5, 10, 15, ... and at the end of each epoch.
  EXPECT_GT(whole.summary.checkpoints_written, 7);

  // Stopped right after its 4th checkpoint (step 15 of each worker, in the
  // second epoch), then started again on the same directory, twice more.
  TrainRunOptions stop;
  stop.stop_after_checkpoints = 4;
  const RunOutcome first = TrainOnce(Sets(b.path()), stop);
  ASSERT_EQ(first.status.code(), absl::StatusCode::kAborted) << first.status;
  TrainRunOptions stop_again;
  stop_again.stop_after_checkpoints = 3;
  const RunOutcome second = TrainOnce(Sets(b.path()), stop_again);
  ASSERT_EQ(second.status.code(), absl::StatusCode::kAborted) << second.status;
  const RunOutcome last = TrainOnce(Sets(b.path()));
  ASSERT_TRUE(last.status.ok()) << last.status;
  ASSERT_TRUE(last.summary.resumed_from_step.has_value());
  EXPECT_GT(*last.summary.resumed_from_step, 0);
  EXPECT_EQ(last.summary.records_seen, whole.summary.records_seen) << "records are counted exactly once";
  EXPECT_EQ(last.summary.steps, whole.summary.steps);
  EXPECT_EQ(last.summary.model_version, whole.summary.model_version);
  EXPECT_TRUE(BitEqual(last.params, whole.params)) << "the resumed run must end where the uninterrupted one did";
  ASSERT_TRUE(last.summary.test_accuracy.has_value());
  EXPECT_EQ(*last.summary.test_accuracy, *whole.summary.test_accuracy);
  EXPECT_LE(ListCheckpoints(b.path()).size(), 3u) << "checkpoint.keep";

  // A finished job started again resumes at its end and trains nothing.
  const RunOutcome again = TrainOnce(Sets(b.path()));
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_TRUE(again.summary.history.empty());
  EXPECT_EQ(again.summary.records_seen, whole.summary.records_seen);
  EXPECT_TRUE(BitEqual(again.params, whole.params));

  // --fresh starts over from the initial values.
  TrainRunOptions fresh;
  fresh.fresh = true;
  const RunOutcome over = TrainOnce(Sets(b.path()), fresh);
  ASSERT_TRUE(over.status.ok()) << over.status;
  EXPECT_FALSE(over.summary.resumed_from_step.has_value());
  EXPECT_EQ(over.summary.history.size(), 3u);
  EXPECT_TRUE(BitEqual(over.params, whole.params)) << "sync runs are deterministic";
}

TEST(ResumeTest, DamagedNewestCheckpointFallsBackWithAWarning) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  TempDir a, b;
  const RunOutcome whole = TrainOnce(Sets(a.path()));
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  TrainRunOptions stop;
  stop.stop_after_checkpoints = 5;
  ASSERT_EQ(TrainOnce(Sets(b.path()), stop).status.code(), absl::StatusCode::kAborted);
  // Flip a byte in the newest checkpoint's tensors.
  const std::vector<std::string> all = ListCheckpoints(b.path());
  ASSERT_GE(all.size(), 2u);
  const std::string newest = all.back();
  {
    std::fstream f(newest + "/dense.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  const RunOutcome last = TrainOnce(Sets(b.path()));
  ASSERT_TRUE(last.status.ok()) << last.status;
  ASSERT_EQ(last.summary.skipped_checkpoints.size(), 1u);
  EXPECT_NE(last.summary.skipped_checkpoints[0].find(fs::path(newest).filename().string()), std::string::npos)
      << last.summary.skipped_checkpoints[0];
  // It resumed from the one before, and still ends where the uninterrupted run did.
  EXPECT_TRUE(BitEqual(last.params, whole.params));
  EXPECT_EQ(last.summary.records_seen, whole.summary.records_seen);
}

TEST(ResumeTest, HogwildRunResumesWithExactRecordCounts) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  TempDir dir;
  TrainRunOptions stop;
  stop.stop_after_checkpoints = 2;
  ASSERT_EQ(TrainOnce(Sets(dir.path(), "hogwild"), stop).status.code(), absl::StatusCode::kAborted);
  const RunOutcome last = TrainOnce(Sets(dir.path(), "hogwild"));
  ASSERT_TRUE(last.status.ok()) << last.status;
  ASSERT_TRUE(last.summary.resumed_from_step.has_value());
  EXPECT_EQ(last.summary.records_seen, 3 * 3000);
  ASSERT_TRUE(last.summary.test_accuracy.has_value());
  EXPECT_GT(*last.summary.test_accuracy, 0.6);
}

// In-process task training (hogwild, tasks of 500 records: 6 tasks of 4
// steps per epoch): checkpoint.every_steps 5 of each worker is every 10
// steps over both, at the first task boundary at or after it, so the first
// checkpoint falls after 3 of epoch 1's tasks (12 steps, 1500 records). A
// run stopped there resumes in epoch 1 with only the 3 tasks not done, and
// counts every record once. Lockstep (sync) training cannot continue an
// epoch task by task: resuming from the same checkpoint restarts epoch 1 and
// still counts every record once.
TEST(ResumeTest, TaskTrainingResumesMidEpochWithTheTasksNotDone) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  TempDir dir, copy;
  std::vector<std::string> sets = Sets(dir.path(), "hogwild");
  sets.push_back("data.records_per_task=500");
  TrainRunOptions stop;
  stop.stop_after_checkpoints = 1;
  ASSERT_EQ(TrainOnce(sets, stop).status.code(), absl::StatusCode::kAborted);
  absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(dir.path(), nullptr);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  const nlohmann::json& cur = (*found)->state.data_cursor;
  EXPECT_EQ((*found)->step, 12);
  EXPECT_EQ(cur["epoch"], 1);
  EXPECT_EQ(cur["epoch_records"], 1500);
  ASSERT_TRUE(cur.contains("dispatcher")) << cur.dump();
  EXPECT_EQ(cur["dispatcher"]["done"].size(), 3u) << cur.dump();
  EXPECT_EQ((*found)->state.extra["records_seen"], 1500);
  fs::copy(dir.path(), copy.path(), fs::copy_options::recursive | fs::copy_options::overwrite_existing);

  const RunOutcome rest = TrainOnce(sets);
  ASSERT_TRUE(rest.status.ok()) << rest.status;
  ASSERT_TRUE(rest.summary.resumed_from_step.has_value());
  EXPECT_EQ(*rest.summary.resumed_from_step, 12);
  EXPECT_EQ(rest.summary.records_seen, 3 * 3000);
  EXPECT_EQ(rest.summary.steps, 3 * 24);
  ASSERT_EQ(rest.summary.history.size(), 3u);
  EXPECT_EQ(rest.summary.history[0].records, 1500) << "only the tasks not done are trained again";
  EXPECT_EQ(rest.summary.history[1].records, 3000);
  EXPECT_EQ(rest.summary.tasks_requeued, 0);
  EXPECT_EQ(rest.summary.eval_records_seen, 3 * 500);

  std::vector<std::string> sync_sets = Sets(copy.path(), "sync");
  const RunOutcome lockstep = TrainOnce(sync_sets);
  ASSERT_TRUE(lockstep.status.ok()) << lockstep.status;
  ASSERT_TRUE(lockstep.summary.resumed_from_step.has_value());
  EXPECT_EQ(lockstep.summary.records_seen, 3 * 3000) << "the restarted epoch's records count once";
  ASSERT_EQ(lockstep.summary.history.size(), 3u);
  EXPECT_EQ(lockstep.summary.history[0].records, 3000);
}

// A streamed first run checkpointed while its cache is still being built
// (the build held before part 2, so epoch 1 has only the first parts' tasks)
// and stopped: the checkpoint's cursor says the data was growing; the next
// run builds the cache first, then goes on with exactly the tasks not done.
TEST(ResumeTest, StreamedRunCheckpointedWhileItsCacheIsBuiltResumesExactly) {
  TempDir dir, ckpt;
  for (const auto& [name, rows, seed] : {std::tuple{"cold.tsv", 24000, 1}, std::tuple{"test.tsv", 2000, 2}}) {
    DataGenOptions g;
    g.kind = "criteo";
    g.rows = rows;
    g.seed = static_cast<uint64_t>(seed);
    g.out = dir.path() + "/" + name;
    ASSERT_TRUE(GenerateData(g).ok());
  }
  const absl::StatusOr<Config> config = LoadConfigWithSets(
      SHARDWILD_SOURCE_DIR "/configs/ctr_dlrm.yaml",
      {"data.train=" + dir.path() + "/cold.tsv", "data.test=" + dir.path() + "/test.tsv", "model.sparse.0.rows=1000",
       "model.bottom.0.units=32", "model.layers.0.units=32", "data.cache=false", "train.pin_threads=false",
       "train.workers=2", "train.epochs=2", "ps.update=hogwild", "data.stream=true", "data.cache_part_mb=1",
       "data.reader_threads=1", "data.records_per_task=1000", "checkpoint.dir=" + ckpt.path(),
       "checkpoint.every_steps=4"});
  ASSERT_TRUE(config.ok()) << config.status();

  std::mutex mu;
  std::condition_variable cv;
  bool held = false, open = false;
  JobOptions jo;
  jo.stream_before_part = [&](size_t part) {
    if (part != 2) return;
    std::unique_lock<std::mutex> lock(mu);
    held = true;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
  };
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(*config, jo);
  ASSERT_TRUE(job.ok()) << job.status();
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return held; });
  }
  ProgressReporter silent = ProgressReporter::Silent();
  TrainRunOptions stop;
  stop.stop_after_checkpoints = 1;
  EXPECT_EQ(RunTraining(**job, silent, stop).status().code(), absl::StatusCode::kAborted);
  // The job ends with its build still held: the build is cancelled (the
  // gate opens only once the cancel is in) and leaves nothing behind.
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  });
  job->reset();
  opener.join();
  EXPECT_FALSE(fs::exists(dir.path() + "/cold.tsv.swcols"));

  absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(ckpt.path(), nullptr);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  const nlohmann::json& cur = (*found)->state.data_cursor;
  EXPECT_EQ(cur["epoch"], 1);
  EXPECT_EQ(cur["records"], -1) << cur.dump();
  ASSERT_TRUE(cur.contains("dispatcher")) << cur.dump();
  EXPECT_EQ(cur["dispatcher"]["growing"], true) << cur.dump();
  const int64_t done = (*found)->state.extra["records_seen"].get<int64_t>();
  EXPECT_GT(done, 0);
  EXPECT_LT(done, 24000);
  EXPECT_EQ(done % 1000, 0) << "whole tasks of the parts built";

  job = Job::Create(*config);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<TrainSummary> rest = RunTraining(**job, silent);
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_TRUE(rest->resumed_from_step.has_value());
  EXPECT_EQ(*rest->resumed_from_step, (*found)->step);
  EXPECT_EQ(rest->records_seen, 2 * 24000);
  ASSERT_EQ(rest->history.size(), 2u);
  EXPECT_EQ(rest->history[0].records, 24000 - done) << "only the tasks not done are trained again";
  EXPECT_EQ(rest->history[1].records, 24000);
  EXPECT_TRUE(fs::exists(dir.path() + "/cold.tsv.swcols/index.json"));
}

}  // namespace
}  // namespace shardwild
