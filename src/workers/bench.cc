#include "workers/bench.h"

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/partitioner.h"
#include "core/status.h"
#include "oneapi/dnnl/dnnl.h"
#include "workers/trainer.h"

namespace shardwild {
namespace {
using Clock = std::chrono::steady_clock;
}

absl::StatusOr<MatmulPeak> MeasureMatmulPeak(WorkerPool& pool, int omp_threads_per_worker, int64_t size,
                                             double seconds) {
  MatmulPeak peak;
  peak.m = peak.n = peak.k = size;
  peak.threads = pool.size();
  peak.omp_threads_per_worker = omp_threads_per_worker;
  std::vector<double> rates(pool.size(), 0.0);
  SW_RETURN_IF_ERROR(pool.RunAll([&](int i) -> absl::Status {
    std::vector<float> a(size * size, 0.5f), b(size * size, 0.25f), c(size * size, 0.0f);
    auto once = [&] {
      return dnnl_sgemm('N', 'N', size, size, size, 1.0f, a.data(), size, b.data(), size, 0.0f, c.data(), size);
    };
    if (once() != dnnl_success) return absl::InternalError("dnnl_sgemm failed");  // warm-up
    const auto start = Clock::now();
    int64_t calls = 0;
    double elapsed = 0;
    do {
      once();
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < seconds);
    rates[i] = 2.0 * size * size * size * calls / elapsed;
    return absl::OkStatus();
  }));
  for (double r : rates) peak.gflops += r / 1e9;
  return peak;
}

absl::StatusOr<BenchReport> RunBench(Job& job) {
  const Config& cfg = job.config();
  BenchReport r;
  r.workers = job.num_workers();
  r.intra_op_threads = job.placement().threads_per_worker;
  r.batch = cfg.train.batch_size;
  r.warmup_steps = cfg.bench.warmup_steps;
  r.steps = cfg.bench.steps;
  const std::vector<int32_t> order = EpochOrder(job.train().count, cfg.train.seed, 1);
  const std::vector<RowRange> parts = FixedShardsDiv(job.train().count, r.workers);
  // The benchmark runs at the schedule's starting learning rate, `lr` (a
  // warmup would start it at warmup_start_lr, 0 by default).
  OptimizerOptions opt = cfg.optimizer;
  opt.schedule = LrSchedule::kConstant;
  opt.warmup = 0;
  // Warm-up: not timed.
  SW_RETURN_IF_ERROR(job.pool().RunAll([&](int i) {
    return job.worker(i).Train(order.data() + parts[i].begin, parts[i].size(), r.warmup_steps, opt, 0, 0, nullptr);
  }));
  std::vector<PhaseTimes> times(r.workers);
  int64_t pulls_before = 0;
  for (int i = 0; i < r.workers; ++i) pulls_before += job.worker(i).counters().pulls.load(std::memory_order_relaxed);
  const auto start = Clock::now();
  SW_RETURN_IF_ERROR(job.pool().RunAll([&](int i) {
    return job.worker(i).Train(order.data() + parts[i].begin, parts[i].size(), r.steps, opt, 0, 0, &times[i]);
  }));
  r.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  for (const PhaseTimes& t : times) r.phases.Add(t);
  for (int i = 0; i < r.workers; ++i) r.pulls += job.worker(i).counters().pulls.load(std::memory_order_relaxed);
  r.pulls -= pulls_before;
  r.update_mode = UpdateModeName(cfg.ps.update);
  const double total_steps = static_cast<double>(r.steps) * r.workers;
  r.samples_per_s = total_steps * r.batch / r.wall_s;
  r.step_ms = 1e3 * r.phases.total() / total_steps;
  const Mlp& model = job.worker(0).model();
  r.flops_per_step = model.ForwardFlops() + model.BackwardFlops();
  r.model_gflops = total_steps * r.flops_per_step / r.wall_s / 1e9;
  SW_ASSIGN_OR_RETURN(r.peak, MeasureMatmulPeak(job.pool(), r.intra_op_threads, 1024, cfg.bench.peak_seconds));
  r.peak_fraction = r.peak.gflops > 0 ? r.model_gflops / r.peak.gflops : 0;
  return r;
}

std::string FormatBenchReport(const BenchReport& r) {
  const double total = r.phases.total();
  auto pct = [&](double x) { return total > 0 ? 100.0 * x / total : 0.0; };
  std::string s;
  absl::StrAppendFormat(&s, "threading: %d workers x %d OpenMP threads each (oneDNN runs single-team per worker; total %d)\n",
                        r.workers, r.intra_op_threads, r.workers * r.intra_op_threads);
  absl::StrAppendFormat(&s, "steps: %d warm-up + %d timed per worker, batch %d\n", r.warmup_steps, r.steps, r.batch);
  absl::StrAppendFormat(&s, "throughput: %.0f samples/s, %.3f ms per step per worker, wall %.2f s\n", r.samples_per_s,
                        r.step_ms, r.wall_s);
  absl::StrAppendFormat(&s,
                        "phases: data %.1f%%  read params %.1f%%  forward %.1f%%  backward %.1f%%  push %.1f%%\n",
                        pct(r.phases.data), pct(r.phases.read_params), pct(r.phases.forward), pct(r.phases.backward),
                        pct(r.phases.push));
  absl::StrAppendFormat(&s, "updates: ps.update %s, %d of %d timed steps pulled the parameters\n", r.update_mode,
                        r.pulls, r.steps * r.workers);
  absl::StrAppendFormat(&s, "model: %.1f MFLOP per step (forward + backward), %.2f GFLOP/s achieved\n",
                        r.flops_per_step / 1e6, r.model_gflops);
  absl::StrAppendFormat(&s, "matmul peak (same run, sgemm %dx%dx%d on %d threads x %d OpenMP): %.2f GFLOP/s\n",
                        r.peak.m, r.peak.n, r.peak.k, r.peak.threads, r.peak.omp_threads_per_worker, r.peak.gflops);
  absl::StrAppendFormat(&s, "fraction of peak: %.3f\n", r.peak_fraction);
  return s;
}

}  // namespace shardwild
