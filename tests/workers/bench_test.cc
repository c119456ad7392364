#include "workers/bench.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/cpu_features.h"
#include "core/base/status.h"
#include "gtest/gtest.h"
#include "ps_shm/param_store.h"
#include "workers/job.h"
#include "tests/workers/test_config.h"
#include "workers/worker_pool.h"

namespace shardwild {
namespace {

using testdata::HaveFashionMnist;
using testdata::LoadDefaultConfig;

// The default MLP on 2,000 records and 2 workers, `extra` settings after
// these; bench.steps 5 unless `extra` sets it.
std::vector<std::string> TinySets(const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"data.max_train_records=2000", "data.max_test_records=100", "train.workers=2",
                                   "bench.warmup_steps=2", "bench.steps=5", "bench.peak_seconds=0.05"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return sets;
}

// A job of TinySets(extra) and its bench.
struct TinyBench {
  Config config;
  std::unique_ptr<Job> job;
  BenchReport report;
};
absl::StatusOr<TinyBench> RunTinyBench(const std::vector<std::string>& extra) {
  TinyBench b;
  SW_ASSIGN_OR_RETURN(b.config, LoadDefaultConfig(TinySets(extra)));
  SW_ASSIGN_OR_RETURN(b.job, Job::Create(b.config));
  SW_ASSIGN_OR_RETURN(b.report, RunBench(*b.job));
  return b;
}

TEST(BenchTest, TinyRunReportsEveryFigure) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  absl::StatusOr<TinyBench> bench = RunTinyBench({});
  ASSERT_TRUE(bench.ok()) << bench.status();
  const std::unique_ptr<Job>& job = bench->job;
  const BenchReport* r = &bench->report;

  EXPECT_EQ(r->workers, 2);
  EXPECT_GE(r->intra_op_threads, 1);
  EXPECT_EQ(r->batch, bench->config.train.batch_size);
  EXPECT_EQ(r->warmup_steps, 2);
  EXPECT_EQ(r->steps, 5);
  // The first worker ran its 2 untimed and 5 timed steps; the other
  // stopped after the step it was in.
  EXPECT_GE(r->steps_done, 5);
  EXPECT_LE(r->steps_done, 2 * 5);
  // Every step of every worker, the warm-up's and the untimed ones too,
  // pushed once; the timed ones were counted.
  const int64_t ran = job->worker(0).counters().steps.load() + job->worker(1).counters().steps.load();
  EXPECT_EQ(job->store().version(), static_cast<uint64_t>(ran));
  EXPECT_GE(ran, 2 * 2 + 2 + 5);
  EXPECT_LE(r->steps_done, ran - 2 * 2 - 2);
  EXPECT_GT(r->wall_s, 0);
  EXPECT_GT(r->samples_per_s, 0);
  EXPECT_TRUE(std::isfinite(r->samples_per_s));
  EXPECT_DOUBLE_EQ(r->samples_per_s, r->steps_done * r->batch / r->wall_s);
  EXPECT_GT(r->step_ms, 0);
  EXPECT_GT(r->phases.total(), 0);
  EXPECT_GT(r->phases.forward, 0);
  EXPECT_GT(r->phases.backward, 0);
  EXPECT_GT(r->flops_per_step, 0);
  EXPECT_GT(r->model_gflops, 0);
  EXPECT_EQ(r->peak.m, r->peak.k);
  EXPECT_EQ(r->peak.threads, 2);
  EXPECT_EQ(r->peak.omp_threads_per_worker, r->intra_op_threads);
  EXPECT_GT(r->peak.gflops, 0);
  EXPECT_TRUE(std::isfinite(r->peak.gflops));
  EXPECT_GT(r->peak_fraction, 0);
  EXPECT_TRUE(std::isfinite(r->peak_fraction));

  // The dense push beside its same-run bound and the workers' line hand-off:
  // the MLP's 784x256 + 256 + 256x128 + 128 + 128x10 + 10 parameters.
  EXPECT_EQ(r->dense_params, 235146);
  EXPECT_GT(r->push_us, 0);
  EXPECT_DOUBLE_EQ(r->push_us, 1e6 * r->phases.push / r->steps_done);
  EXPECT_GT(r->push_bound_us, 0);
  EXPECT_TRUE(std::isfinite(r->push_bound_us));
  EXPECT_DOUBLE_EQ(r->push_ratio, r->push_us / r->push_bound_us);
  EXPECT_GT(r->line_handoff_ns, 0);
  EXPECT_TRUE(std::isfinite(r->line_handoff_ns));

  // The workers asked for the next batch in this machine's bursts (the
  // config leaves data.prefetch_burst_lines auto), and the report says so.
  EXPECT_FALSE(r->prefetch_burst_configured);
  EXPECT_EQ(r->prefetch_burst_lines, MachinePrefetchBurst().lines);
  EXPECT_EQ(job->worker(0).prefetch_burst_lines(), r->prefetch_burst_lines);
  EXPECT_EQ(job->worker(1).prefetch_burst_lines(), r->prefetch_burst_lines);
  EXPECT_EQ(r->prefetch_burst.measured, !r->prefetch_burst.sizes.empty());

  // The kernels ran on the best target this CPU offers, and the report says which.
  ASSERT_FALSE(r->kernel_targets.empty());
  EXPECT_EQ(r->kernel_target, r->kernel_targets.front());

  const std::string text = FormatBenchReport(*r);
  EXPECT_NE(text.find("samples/s"), std::string::npos) << text;
  EXPECT_NE(text.find("fraction of peak"), std::string::npos) << text;
  EXPECT_NE(text.find("update kernels: " + r->kernel_target), std::string::npos) << text;
  EXPECT_NE(text.find("push: "), std::string::npos) << text;
  EXPECT_NE(text.find("for 235146 dense parameters"), std::string::npos) << text;
  EXPECT_NE(text.find("line hand-off (same run): a cache line moves between workers 0 and 1's cores in"),
            std::string::npos)
      << text;

  // The bf16 peak beside the f32 one, where the CPU has bf16 instructions.
  if (DetectCpuFeatures().bf16()) {
    EXPECT_GT(r->bf16_peak.gflops, 0);
    EXPECT_EQ(r->bf16_peak.m, r->bf16_peak.k);
    EXPECT_EQ(r->bf16_peak.threads, 2);
    EXPECT_NE(text.find("bf16 matmul peak (same run"), std::string::npos) << text;
  } else {
    EXPECT_EQ(r->bf16_peak.gflops, 0);
    EXPECT_NE(text.find("bf16 matmul peak: not measured (no AVX512_BF16"), std::string::npos) << text;
  }
}

// Forwards to another store; once `hold` is set, a push from the thread
// `held` waits until `release_after` pushes from other threads have gone
// through in all.
class HoldingStore final : public ParamStore {
 public:
  explicit HoldingStore(ParamStore* base) : base_(base) {}
  const StoreLayout& layout() const override { return base_->layout(); }
  const std::string& name() const override { return base_->name(); }
  uint64_t version() const override { return base_->version(); }
  absl::Status Pull(absl::Span<const PullSlice> slices) override { return base_->Pull(slices); }
  absl::Status Push(absl::Span<const DenseGrad> grads, float lr) override {
    Gate();
    return base_->Push(grads, lr);
  }
  absl::Status PushPull(absl::Span<const DenseGrad> grads, float lr, absl::Span<const PullSlice> pulls) override {
    Gate();
    return base_->PushPull(grads, lr, pulls);
  }

  std::thread::id held;
  std::atomic<bool> hold{false};
  int64_t release_after = 0;
  std::atomic<int64_t> other_pushes{0};

 private:
  void Gate() {
    if (std::this_thread::get_id() != held) {
      other_pushes.fetch_add(1);
      return;
    }
    if (!hold.load()) return;
    while (other_pushes.load() < release_after) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  ParamStore* base_;
};

// Training deals its tasks on demand, so a slow core never idles a fast
// one; the bench's timed steps end once the first worker has run its
// bench.steps, not when the slowest has. Here worker 1's first timed push
// waits until worker 0 has pushed all its 200 timed steps: worker 0
// finishes first, worker 1 then ends after the step it is in (a few more
// at most, until it reads the stop), and the bench counts the steps that
// ran.
TEST(BenchTest, TheFirstWorkerToFinishStopsTheOthers) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  absl::StatusOr<Config> config = LoadDefaultConfig(TinySets({"train.intra_op_threads=1", "bench.steps=200"}));
  ASSERT_TRUE(config.ok()) << config.status();
  // A job of the same model, only for its store.
  absl::StatusOr<std::unique_ptr<Job>> holder = Job::Create(*config);
  ASSERT_TRUE(holder.ok()) << holder.status();
  HoldingStore store(&(*holder)->param_store());
  JobOptions options;
  options.store = &store;
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(*config, options);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->pool().RunOn(1, [&](int) {
    store.held = std::this_thread::get_id();
    return absl::OkStatus();
  }).ok());
  // Worker 1's warm-up pushes go through; its next one waits for worker
  // 0's 2 warm-up, 2 untimed and 200 timed pushes.
  store.release_after = 2 + 2 + 200;
  std::atomic<bool> warm{false};
  std::thread arm([&] {
    while (!warm.load()) {
      if ((*job)->worker(1).counters().steps.load(std::memory_order_relaxed) >= 2) {
        store.hold.store(true);
        warm.store(true);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  absl::StatusOr<BenchReport> r = RunBench(**job);
  warm.store(true);
  arm.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(r->steps_done, 200);
  // Both workers to the end would be exactly 400.
  EXPECT_LT(r->steps_done, 300) << "the slow worker ran on after the fast one had finished";
  EXPECT_DOUBLE_EQ(r->samples_per_s, r->steps_done * r->batch / r->wall_s);
}

TEST(BenchTest, MatmulPeakOnBarePool) {
  WorkerPool pool(1, [](int) { return absl::OkStatus(); });
  absl::StatusOr<MatmulPeak> peak = MeasureMatmulPeak(pool, 1, {128}, 0.01);
  ASSERT_TRUE(peak.ok()) << peak.status();
  EXPECT_EQ(peak->m, 128);
  EXPECT_EQ(peak->n, 128);
  EXPECT_EQ(peak->k, 128);
  EXPECT_EQ(peak->threads, 1);
  EXPECT_GT(peak->gflops, 0);
}

// The peak is the best of the sizes tried, whichever comes first: a 4^3
// sgemm is all call overhead, about a hundred times below a 192^3 one (0.1 s
// each: over 0.02 s an OpenMP hiccup once let 8^3 beat 128^3).
TEST(BenchTest, MatmulPeakIsTheBestSize) {
  WorkerPool pool(1, [](int) { return absl::OkStatus(); });
  for (const std::vector<int64_t>& sizes : {std::vector<int64_t>{4, 192}, std::vector<int64_t>{192, 4}}) {
    absl::StatusOr<MatmulPeak> peak = MeasureMatmulPeak(pool, 1, sizes, 0.2);
    ASSERT_TRUE(peak.ok()) << peak.status();
    EXPECT_EQ(peak->m, 192) << sizes[0];
    EXPECT_EQ(peak->k, 192) << sizes[0];
  }
  EXPECT_FALSE(MeasureMatmulPeak(pool, 1, {}, 0.01).ok());
}

// One worker has no other core to hand a line to; two (or more: the third
// idles) take turns on one line and report a one-way time, whatever their
// cores (on one core they yield to each other).
TEST(BenchTest, LineHandoff) {
  WorkerPool one(1, [](int) { return absl::OkStatus(); });
  absl::StatusOr<double> alone = MeasureLineHandoff(one, 0.01);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(*alone, 0);
  for (int threads : {2, 3}) {
    WorkerPool pool(threads, [](int) { return absl::OkStatus(); });
    absl::StatusOr<double> ns = MeasureLineHandoff(pool, 0.01);
    ASSERT_TRUE(ns.ok()) << ns.status();
    EXPECT_GT(*ns, 0) << threads;
    EXPECT_TRUE(std::isfinite(*ns)) << threads;
  }
}

// data.prefetch_burst_lines set: the workers ask in bursts of that many
// lines, and the report says it was configured.
TEST(BenchTest, AConfiguredPrefetchBurstIsTheWorkers) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  absl::StatusOr<TinyBench> bench = RunTinyBench({"data.prefetch_burst_lines=5"});
  ASSERT_TRUE(bench.ok()) << bench.status();
  for (int i = 0; i < bench->job->num_workers(); ++i) EXPECT_EQ(bench->job->worker(i).prefetch_burst_lines(), 5);
  EXPECT_EQ(bench->report.prefetch_burst_lines, 5);
  EXPECT_TRUE(bench->report.prefetch_burst_configured);
  EXPECT_NE(FormatBenchReport(bench->report).find("prefetch bursts: 5 lines (data.prefetch_burst_lines)"),
            std::string::npos);
}

// Two workers pinned to a core in common (2 OpenMP threads each on a
// machine of fewer than 4 cores) would time the scheduler, not a line: the
// hand-off is measured only where their cores differ.
TEST(BenchTest, NoHandoffWhereWorkersShareACore) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  absl::StatusOr<TinyBench> bench = RunTinyBench({"train.intra_op_threads=2"});
  ASSERT_TRUE(bench.ok()) << bench.status();
  const Placement& placement = bench->job->placement();
  ASSERT_EQ(placement.workers.size(), 2u);
  bool shared = false;
  for (int c : placement.workers[0].cores) {
    for (int d : placement.workers[1].cores) shared = shared || c == d;
  }
  EXPECT_EQ(bench->report.line_handoff_ns == 0, shared) << placement.ToString();
}

// The report's push and hand-off lines appear only where they were measured.
TEST(BenchTest, PushAndHandoffLinesOnlyWhereMeasured) {
  BenchReport r;
  r.dense_params = 100;
  std::string text = FormatBenchReport(r);
  EXPECT_EQ(text.find("push: "), std::string::npos) << text;
  EXPECT_EQ(text.find("line hand-off"), std::string::npos) << text;
  r.dense_params = 20000;
  r.push_us = 30;
  r.push_bound_us = 20;
  r.push_ratio = 1.5;
  r.line_handoff_ns = 123;
  text = FormatBenchReport(r);
  EXPECT_NE(text.find("push: 30.0 us a step for 20000 dense parameters"), std::string::npos) << text;
  EXPECT_NE(text.find("(same run): 20.0 us, ratio 1.50\n"), std::string::npos) << text;
  EXPECT_NE(text.find("cores in 123 ns"), std::string::npos) << text;
  // The prefetch burst: configured, measured (each size's lost share), or
  // the default where nothing was measured.
  r.prefetch_burst_lines = 24;
  r.prefetch_burst_configured = true;
  EXPECT_NE(FormatBenchReport(r).find("prefetch bursts: 24 lines (data.prefetch_burst_lines)\n"), std::string::npos);
  r.prefetch_burst_configured = false;
  r.prefetch_burst_lines = 32;
  EXPECT_NE(FormatBenchReport(r).find("prefetch bursts: 32 lines (not measured on this machine)\n"),
            std::string::npos);
  r.prefetch_burst_lines = 8;
  r.prefetch_burst.measured = true;
  r.prefetch_burst.lines = 8;
  r.prefetch_burst.sizes = {{.lines = 8, .cold_ns = 230, .asked_ns = 30, .cached_ns = 30},
                            {.lines = 16, .cold_ns = 260, .asked_ns = 145, .cached_ns = 30}};
  EXPECT_NE(FormatBenchReport(r).find("prefetch bursts: 8 lines, measured (lines asked for in one burst, of a miss "
                                      "left: 8: 0% 16: 50%)\n"),
            std::string::npos)
      << FormatBenchReport(r);
}

// The data line says how long the data took to read before training, and
// to pack where it was packed.
TEST(BenchTest, DataLineNamesThePackingWhereThereWasOne) {
  BenchReport r;
  r.data_records = 1000;
  r.data_load_s = 0.5;
  EXPECT_NE(FormatBenchReport(r).find("data: read and parsed 1000 records in 0.50 s before training (2000 records/s)\n"),
            std::string::npos)
      << FormatBenchReport(r);
  r.data_pack_s = 0.25;
  EXPECT_NE(FormatBenchReport(r).find("(2000 records/s), packed for the workers' loads in 0.25 s\n"), std::string::npos)
      << FormatBenchReport(r);
}

// The dense push's bound runs every optimizer, with an f32 or a bf16 copy,
// on every pool thread; a push of nothing is an error.
TEST(BenchTest, DensePushBound) {
  WorkerPool pool(2, [](int) { return absl::OkStatus(); });
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kMomentum, OptimizerType::kAdagrad,
                             OptimizerType::kAdam, OptimizerType::kRmsprop, OptimizerType::kFtrl}) {
    OptimizerOptions opt;
    opt.type = type;
    opt.lr = 0.01f;
    for (bool bf16_copy : {false, true}) {
      absl::StatusOr<double> us = MeasureDensePushBound(pool, opt, 20000, bf16_copy, 0.005);
      ASSERT_TRUE(us.ok()) << us.status();
      EXPECT_GT(*us, 0) << OptimizerTypeName(type) << " bf16 copy " << bf16_copy;
      EXPECT_TRUE(std::isfinite(*us)) << OptimizerTypeName(type);
    }
  }
  OptimizerOptions adam;
  adam.type = OptimizerType::kAdam;
  EXPECT_FALSE(MeasureDensePushBound(pool, adam, 0, false, 0.005).ok());
  // A push of a billion parameters is timed over 4M of them and scaled by
  // 256, instead of allocating its 20 GB a thread (more than this machine
  // has). The band is 4x either way of 256 times the 4M push measured
  // apart, far wider than two timings of the same arrays differ, and far
  // narrower than no scaling (1x) or the whole billion timed.
  absl::StatusOr<double> capped = MeasureDensePushBound(pool, adam, int64_t{1} << 22, false, 0.05);
  absl::StatusOr<double> huge = MeasureDensePushBound(pool, adam, int64_t{1} << 30, false, 0.05);
  ASSERT_TRUE(capped.ok()) << capped.status();
  ASSERT_TRUE(huge.ok()) << huge.status();
  EXPECT_GT(*huge / *capped, 64.0);
  EXPECT_LT(*huge / *capped, 1024.0);
}

// The bf16 matmul builds, runs and reports one of its sizes (how fast it is
// belongs in `shardwild bench`, not in a test).
TEST(BenchTest, Bf16MatmulPeak) {
  if (!DetectCpuFeatures().bf16()) GTEST_SKIP() << "no bf16 instructions on this CPU";
  WorkerPool pool(1, [](int) { return absl::OkStatus(); });
  absl::StatusOr<MatmulPeak> bf16 = MeasureBf16MatmulPeak(pool, 1, {128, 256}, 0.1);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_TRUE(bf16->m == 128 || bf16->m == 256) << bf16->m;
  EXPECT_EQ(bf16->threads, 1);
  EXPECT_GT(bf16->gflops, 0);
  EXPECT_FALSE(MeasureBf16MatmulPeak(pool, 1, {}, 0.01).ok());
}

}  // namespace
}  // namespace shardwild
