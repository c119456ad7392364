#include "workers/bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/data/id_stream.h"
#include "core/model/hogwild_kernels.h"
#include "core/model/optimizer.h"
#include "core/model/partitioner.h"
#include "core/base/huge_page_allocator.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"
#include "core/base/cpu_features.h"
#include "core/base/median.h"
#include "core/base/mutex.h"
#include "oneapi/dnnl/dnnl.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "workers/store_bench.h"
#include "workers/trainer.h"

namespace shardwild {
namespace {
using Clock = std::chrono::steady_clock;
}

namespace {

// Runs make_once(size)'s call on every pool thread at once for about
// seconds / sizes.size() per size; the best total rate and its shape.
// make_once is called on each thread and returns the timed call, or an
// error; the call returns false if it failed.
template <class MakeOnce>
absl::StatusOr<MatmulPeak> BestMatmulRate(WorkerPool& pool, int omp_threads_per_worker,
                                          const std::vector<int64_t>& sizes, double seconds, const MakeOnce& make_once) {
  if (sizes.empty()) return absl::InvalidArgumentError("MeasureMatmulPeak: no sizes");
  MatmulPeak best;
  const double per_size = seconds / static_cast<double>(sizes.size());
  // The threads build their matmuls one at a time: oneDNN's primitive cache
  // is locked inside the library, where ThreadSanitizer cannot see it.
  Mutex build_mu;
  for (int64_t size : sizes) {
    std::vector<double> rates(pool.size(), 0.0);
    SW_RETURN_IF_ERROR(pool.RunAll([&](int i) -> absl::Status {
      auto built = [&] {
        MutexLock lock(&build_mu);
        return make_once(size);
      }();
      SW_RETURN_IF_ERROR(built.status());
      auto& once = *built;
      if (!once()) return absl::InternalError(absl::StrCat("matmul ", size, "^3 failed"));  // warm-up
      const auto start = Clock::now();
      int64_t calls = 0;
      double elapsed = 0;
      do {
        once();
        ++calls;
        elapsed = SecondsSince(start);
      } while (elapsed < per_size);
      rates[i] = 2.0 * size * size * size * calls / elapsed;
      return absl::OkStatus();
    }));
    double gflops = 0;
    for (double r : rates) gflops += r / 1e9;
    if (gflops > best.gflops) {
      best.m = best.n = best.k = size;
      best.gflops = gflops;
    }
  }
  best.threads = pool.size();
  best.omp_threads_per_worker = omp_threads_per_worker;
  return best;
}

// One thread's sgemm of size^3 on its own buffers.
struct Sgemm {
  int64_t size;
  std::vector<float> a, b, c;
  explicit Sgemm(int64_t n) : size(n), a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f) {}
  bool operator()() {
    return dnnl_sgemm('N', 'N', size, size, size, 1.0f, a.data(), size, b.data(), size, 0.0f, c.data(), size) ==
           dnnl_success;
  }
};

// One thread's bf16 matmul of size^3 (bf16 x bf16 -> f32) on its own buffers.
struct Bf16Matmul {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::memory a, b, c;
  dnnl::matmul prim;
  explicit Bf16Matmul(int64_t n) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc a_md({n, n}, dt::bf16, tag::ab), b_md({n, n}, dt::bf16, tag::ab),
        c_md({n, n}, dt::f32, tag::ab);
    a = dnnl::memory(a_md, engine);
    b = dnnl::memory(b_md, engine);
    c = dnnl::memory(c_md, engine);
    // bf16 0.5 and 0.25: the upper halves of the floats.
    std::fill_n(static_cast<uint16_t*>(a.get_data_handle()), n * n, uint16_t{0x3F00});
    std::fill_n(static_cast<uint16_t*>(b.get_data_handle()), n * n, uint16_t{0x3E80});
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), engine));
  }
  bool operator()() {
    prim.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
    return true;
  }
};

// The random-row bound is measured between this many slices of the timed
// steps (fewer with fewer steps).
constexpr int kBoundSlices = 5;
// Untimed steps at the start of each slice's call.
constexpr int64_t kRewarmSteps = 2;
// The fewest dense parameters whose push is timed against its bound: a
// smaller push (a text model's softmax, 512 parameters; logistic
// regression's 2) is its calls' fixed cost, which the kernel alone does not
// bound (sparse_logreg: 0.2 us a step against 0.02).
constexpr int64_t kMinPushBoundParams = 16384;
// The most parameters the push's bound is timed over on each thread: 16
// MiB an array, 80 MiB a thread for Adam (parameters, two slots, gradient,
// copy), past any core's share of the caches.
constexpr int64_t kMaxPushBoundParams = int64_t{1} << 22;
// Rows each thread of the bound draws before timing and cycles through.
constexpr int64_t kBoundRowsPerThread = int64_t{1} << 20;

// Whether two workers may run on a core in common.
bool ShareACore(const WorkerPlacement& a, const WorkerPlacement& b) {
  for (int c : a.cores) {
    if (std::find(b.cores.begin(), b.cores.end(), c) != b.cores.end()) return true;
  }
  return false;
}

// The time a step spends on its embedding rows: pulling them, pooling them
// in place in the forward, and pushing them.
double EmbeddingSeconds(const PhaseTimes& p) { return p.pull_rows + p.rows_in_forward + p.push_rows; }

struct JobRows {
  RandomRowBound bound;
  int64_t row_bytes = 0;  // params and slots of one row
};

// The random-row bound on the job's own rows: every table as wide as the
// first, uniform rows over all of them, one sequence per worker thread.
// nullopt where there are no such rows to measure on in this process: no
// local store (a cluster's worker task), tables kept elsewhere
// (JobOptions::tables), a store of several replicas or hosting only some
// shards, a dynamic table of that width (its unused rows may be untouched
// pages), or tables of that width with different row sizes.
absl::StatusOr<std::optional<JobRows>> JobRowBound(Job& job, uint64_t seed) {
  if (!job.has_local_store() || job.tables_store() != nullptr || job.replicas().num_replicas() != 1) {
    return std::nullopt;
  }
  const ShmParamStore& store = job.store();
  const StoreLayout& layout = store.layout();
  if (layout.tables.empty() || store.partial()) return std::nullopt;
  const int64_t dim = layout.tables[0].dim;
  std::vector<RowRegion> regions;
  int64_t row_bytes = -1;
  for (int table = 0; table < static_cast<int>(layout.tables.size()); ++table) {
    const TableSpec& spec = layout.tables[table];
    if (spec.dim != dim) continue;
    if (spec.kind != EmbeddingKind::kStatic) return std::nullopt;
    for (int shard = store.first_hosted_shard(); shard < store.first_hosted_shard() + store.num_hosted_shards();
         ++shard) {
      const EmbeddingTable& e = store.table_shard(table, shard);
      const int64_t bytes = static_cast<int64_t>(e.params_bytes_per_row()) +
                            e.num_slots() * dim * static_cast<int64_t>(sizeof(float));
      if (row_bytes >= 0 && bytes != row_bytes) return std::nullopt;
      row_bytes = bytes;
      regions.push_back(RowRegion{reinterpret_cast<char*>(e.StaticRowParams(0)), e.capacity(),
                                  static_cast<int64_t>(e.row_stride())});
    }
  }
  int64_t total = 0;
  for (const RowRegion& r : regions) total += r.rows;
  if (total < job.num_workers()) return std::nullopt;
  std::vector<std::vector<uint64_t>> rows_of;
  for (int t = 0; t < job.num_workers(); ++t) {
    rows_of.push_back(MakeIdStream(total, 0.0, kBoundRowsPerThread, seed * 1000003 + static_cast<uint64_t>(t)));
  }
  SW_ASSIGN_OR_RETURN(RandomRowBound bound, RandomRowBound::Create(regions, row_bytes, rows_of));
  return JobRows{std::move(bound), row_bytes};
}

}  // namespace

absl::StatusOr<MatmulPeak> MeasureMatmulPeak(WorkerPool& pool, int omp_threads_per_worker,
                                             const std::vector<int64_t>& sizes, double seconds) {
  return BestMatmulRate(pool, omp_threads_per_worker, sizes, seconds,
                        [](int64_t size) -> absl::StatusOr<Sgemm> { return Sgemm(size); });
}

absl::StatusOr<MatmulPeak> MeasureBf16MatmulPeak(WorkerPool& pool, int omp_threads_per_worker,
                                                 const std::vector<int64_t>& sizes, double seconds) {
  return BestMatmulRate(pool, omp_threads_per_worker, sizes, seconds,
                        [](int64_t size) -> absl::StatusOr<Bf16Matmul> {
                          try {
                            return Bf16Matmul(size);
                          } catch (const dnnl::error& e) {
                            return absl::InternalError(
                                absl::StrCat("oneDNN could not build a bf16 matmul ", size, "^3: ", e.what()));
                          }
                        });
}

absl::StatusOr<double> MeasureLineHandoff(WorkerPool& pool, double seconds) {
  if (pool.size() < 2) return 0.0;
  // Hand-offs a round: about 4.5 ms at the 225 ns of a 2-core EPYC VM's
  // two vCPUs, 0.5-1 ms where the cores share a cache.
  constexpr uint64_t kHandoffs = 20000;
  constexpr int kMinRounds = 3, kMaxRounds = 15;
  struct alignas(64) Line {
    std::atomic<uint64_t> value{0};
  };
  const auto deadline = Clock::now() + std::chrono::duration<double>(std::max(seconds, 0.0));
  std::vector<double> rounds;
  for (int round = 0; round < kMaxRounds; ++round) {
    if (round >= kMinRounds && Clock::now() >= deadline) break;
    Line line;
    double ns = 0;
    // Thread t waits for the value to reach k (k = t, t + 2, ...), then
    // writes k + 1: every write hands the line to the other thread's core.
    // It spins before it yields, so that two threads on one core (an
    // oversubscribed machine) still take turns.
    SW_RETURN_IF_ERROR(pool.RunAll([&](int t) -> absl::Status {
      if (t > 1) return absl::OkStatus();
      const auto start = Clock::now();
      for (uint64_t k = static_cast<uint64_t>(t); k < kHandoffs; k += 2) {
        for (int spins = 0; line.value.load(std::memory_order_acquire) != k;) {
          if (++spins == 4096) {
            spins = 0;
            std::this_thread::yield();
          }
        }
        line.value.store(k + 1, std::memory_order_release);
      }
      if (t == 0) ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
      return absl::OkStatus();
    }));
    // Thread 0's loop ends once it has written kHandoffs - 1: that many
    // hand-offs were waited for and made.
    rounds.push_back(ns / static_cast<double>(kHandoffs - 1));
  }
  return Median(rounds);
}

absl::StatusOr<double> MeasureDensePushBound(WorkerPool& pool, const OptimizerOptions& optimizer, int64_t params,
                                             bool bf16_copy, double seconds) {
  if (params <= 0) return absl::InvalidArgumentError("dense push bound: no parameters");
  const int slots = NumSlots(optimizer.type);
  // A larger push is timed over kMaxPushBoundParams and scaled: its arrays
  // are far past every cache either way, so its time grows with its bytes.
  const int64_t timed = std::min(params, kMaxPushBoundParams);
  std::vector<double> per_thread(static_cast<size_t>(pool.size()), 0);
  SW_RETURN_IF_ERROR(pool.RunAll([&](int t) -> absl::Status {
    // Allocated and first written on the pool thread, as a worker's arrays
    // and its shards' parts are on its node; on huge pages where the kernel
    // grants them, as the worker's copy and gradients (Model's dense arena)
    // and the shards are.
    const size_t n = static_cast<size_t>(timed);
    HugePageVector<float> p(n, 0.01f), g(n, 1e-3f), copy(bf16_copy ? 0 : n);
    HugePageVector<uint16_t> copy16(bf16_copy ? n : 0);
    std::vector<HugePageVector<float>> s(static_cast<size_t>(slots));
    std::vector<float*> slot_ptrs(static_cast<size_t>(slots), nullptr);
    for (int k = 0; k < slots; ++k) {
      s[k].assign(n, SlotInitialValue(optimizer, k));
      slot_ptrs[k] = s[k].data();
    }
    UpdateParams up;
    up.lr = optimizer.lr > 0 ? optimizer.lr : 1e-3f;
    up.step = 0;
    auto push = [&] {
      ++up.step;
      ApplyUpdate(optimizer, up, p.data(), slot_ptrs.data(), g.data(), timed, bf16_copy ? nullptr : copy.data(),
                  bf16_copy ? copy16.data() : nullptr);
    };
    for (int i = 0; i < 3; ++i) push();  // every line touched, the caches in their steady state
    std::vector<double> chunks;
    const auto end = Clock::now() + std::chrono::duration<double>(std::max(seconds, 0.0));
    do {
      // Chunks of 8 pushes, whose median leaves out those an interrupt or
      // another process cut into.
      const auto start = Clock::now();
      for (int i = 0; i < 8; ++i) push();
      chunks.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / 8);
    } while (Clock::now() < end || chunks.size() < 3);
    per_thread[static_cast<size_t>(t)] = Median(chunks);
    return absl::OkStatus();
  }));
  return Median(per_thread) * static_cast<double>(params) / static_cast<double>(timed);
}

absl::Status CheckBenchConfig(const Config& config) {
  if (config.data.stream) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source, ": data.stream: `shardwild bench` times steps over records held in memory; run it with "
                       "data.stream false (and data.max_train_records to bound them), or time streamed training with "
                       "`shardwild train --json` (samples_per_s, data_wait_s)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<BenchReport> RunBench(Job& job, const std::function<uint64_t()>& wire_bytes) {
  const Config& cfg = job.config();
  SW_RETURN_IF_ERROR(CheckBenchConfig(cfg));
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
  // With embedding rows the bound is measured between slices of the timed
  // steps, on the store's own rows where it can (JobRowBound): each slice's
  // embedding rate meets a bound measured right after it, on the same pages.
  SW_ASSIGN_OR_RETURN(std::optional<JobRows> job_bound, JobRowBound(job, cfg.train.seed));
  const int slices = job_bound ? static_cast<int>(std::clamp<int64_t>(r.steps, 1, kBoundSlices)) : 1;
  const uint64_t wire_before = wire_bytes ? wire_bytes() : 0;
  // Runs `untimed`, then `steps` steps on every worker, each going on where
  // its last call stopped in its part of the data. Times the `steps` into
  // `times`, and their wall time, from the first worker's first timed step,
  // into r.wall_s. The call ends once the first worker has run them all:
  // the others stop after the step they are in (Worker::set_stop). Cores of
  // one machine do not run equally fast (16 single-worker processes on a
  // 16-core VM ran at 55k-84k samples/s each), and training deals its tasks
  // on demand, so a fast worker never waits for a slow one there; a fixed
  // count of steps each would time the slowest core and leave the others
  // idle at the end.
  // Not under ps.update sync, whose workers step together anyway.
  std::vector<std::vector<int32_t>> part_order(r.workers);
  std::vector<int64_t> done_steps(r.workers, 0);  // per worker, all calls
  const bool stop_at_first = cfg.ps.update != UpdateMode::kSync;
  auto run = [&](int64_t untimed, int64_t steps, std::vector<PhaseTimes>* times) -> absl::Status {
    for (int i = 0; i < r.workers; ++i) {
      const int64_t size = parts[i].size();
      part_order[i].resize(size);
      const int64_t first = size > 0 ? done_steps[i] * r.batch % size : 0;
      for (int64_t j = 0; j < size; ++j) part_order[i][j] = order[parts[i].begin + (first + j) % size];
    }
    std::atomic<bool> first_done{false};
    std::vector<int64_t> before(r.workers);
    for (int i = 0; i < r.workers; ++i) {
      before[i] = job.worker(i).counters().steps.load(std::memory_order_relaxed);
      if (stop_at_first) job.worker(i).set_stop(&first_done);
    }
    const absl::Status status = job.pool().RunAll([&](int i) {
      const absl::Status s = job.worker(i).Train(part_order[i].data(), parts[i].size(), untimed + steps, opt, 0, 0,
                                                 &(*times)[i], untimed);
      // A worker that ran them all (not one with no records) or failed.
      const int64_t ran = job.worker(i).counters().steps.load(std::memory_order_relaxed) - before[i];
      if (!s.ok() || ran >= untimed + steps) first_done.store(true, std::memory_order_relaxed);
      return s;
    });
    const auto end = Clock::now();
    // The timed part began with the first worker's first timed step.
    std::optional<Clock::time_point> start;
    for (int i = 0; i < r.workers; ++i) {
      job.worker(i).set_stop(nullptr);
      const int64_t ran = job.worker(i).counters().steps.load(std::memory_order_relaxed) - before[i];
      done_steps[i] += ran;
      const std::optional<Clock::time_point> timed = job.worker(i).timed_start();
      if (timed && (!start || *timed < *start)) start = *timed;
    }
    SW_RETURN_IF_ERROR(status);
    for (const PhaseTimes& t : *times) r.steps_done += t.steps;
    if (start) r.wall_s += std::chrono::duration<double>(end - *start).count();
    return absl::OkStatus();
  };
  int64_t rows = 0;  // gathered in the timed steps, all workers
  std::vector<double> slice_bounds, slice_ratios;
  for (int slice = 0; slice < slices; ++slice) {
    // A few untimed steps begin each slice's call: the bound sweeps the
    // caches and the TLB, and a call's first step runs on a thread just
    // woken, its batch not asked for a step ahead. (sparse_logreg.yaml on
    // the 2-core EPYC VM, instrumented: the first steps of a run's 10 calls
    // took 33-217 us against 31 for a steady one. When the untimed steps
    // were a call of their own, each slice timed such a step; 8 alternating
    // rounds: data 1.031 -> 0.966 us a step, step 31.46 -> 31.28 us.)
    const int64_t steps = r.steps / slices + (slice < r.steps % slices ? 1 : 0);
    std::vector<PhaseTimes> times(r.workers);
    SW_RETURN_IF_ERROR(run(kRewarmSteps, steps, &times));
    PhaseTimes slice_phases;
    for (const PhaseTimes& t : times) slice_phases.Add(t);
    const int64_t slice_rows = slice_phases.rows;
    rows += slice_rows;
    r.pulls += slice_phases.pulls;
    r.phases.Add(slice_phases);
    if (job_bound) {
      // A short untimed warm-up before the first slice's bound only.
      SW_ASSIGN_OR_RETURN(const RandomRowBound::Rate rate,
                          job_bound->bound.Measure(job.pool(), slice == 0 ? 0.1 : 0.0, cfg.bench.peak_seconds / slices));
      const double embedding_s = EmbeddingSeconds(slice_phases) / r.workers;
      const double rate_in_phases = embedding_s > 0 ? static_cast<double>(slice_rows) / embedding_s : 0;
      slice_bounds.push_back(rate.rows_per_s);
      slice_ratios.push_back(rate.rows_per_s > 0 ? rate_in_phases / rate.rows_per_s : 0);
    }
  }
  if (wire_bytes) {
    // (with slices, the untimed steps between them are on the wire too)
    int64_t all_steps = 0;
    for (int64_t n : done_steps) all_steps += n;
    r.wire_bytes_per_step = static_cast<double>(wire_bytes() - wire_before) / static_cast<double>(all_steps);
  }
  r.update_mode = UpdateModeName(cfg.ps.update);
  const double total_steps = static_cast<double>(r.steps_done);
  r.samples_per_s = total_steps * r.batch / r.wall_s;
  r.step_ms = 1e3 * r.phases.total() / total_steps;
  const Model& model = job.worker(0).model();
  r.flops_per_step = model.ForwardFlops() + model.BackwardFlops();
  r.model_gflops = total_steps * r.flops_per_step / r.wall_s / 1e9;
  SW_ASSIGN_OR_RETURN(r.peak, MeasureMatmulPeak(job.pool(), r.intra_op_threads, kPeakSizes, cfg.bench.peak_seconds));
  if (DetectCpuFeatures().bf16()) {
    SW_ASSIGN_OR_RETURN(r.bf16_peak,
                        MeasureBf16MatmulPeak(job.pool(), r.intra_op_threads, kPeakSizes, cfg.bench.peak_seconds));
  }
  r.precision = PrecisionName(model.precision());
  r.layer_impls = model.ForwardImpls();
  const double bound = model.precision() == Precision::kBf16 ? r.bf16_peak.gflops : r.peak.gflops;
  r.peak_fraction = bound > 0 ? r.model_gflops / bound : 0;
  // The dense push next to its bounds, on the same pinned threads.
  for (int v = 0; v < model.num_variables(); ++v) r.dense_params += model.variable(v).size();
  if (r.dense_params >= kMinPushBoundParams && r.steps_done > 0) {
    r.push_us = 1e6 * r.phases.push / total_steps;
    SW_ASSIGN_OR_RETURN(r.push_bound_us,
                        MeasureDensePushBound(job.pool(), cfg.optimizer, r.dense_params,
                                              model.precision() == Precision::kBf16, cfg.bench.peak_seconds / 4));
    r.push_ratio = r.push_bound_us > 0 ? r.push_us / r.push_bound_us : 0;
  }
  // Not where workers 0 and 1 are pinned to a core in common (an
  // oversubscribed machine): there the ping-pong times the scheduler
  // switching threads (3 us a turn on one core of the 2-core VM), not a line.
  const std::vector<WorkerPlacement>& placed = job.placement().workers;
  const bool shared_core = cfg.train.pin_threads && placed.size() >= 2 && ShareACore(placed[0], placed[1]);
  if (!shared_core) {
    SW_ASSIGN_OR_RETURN(r.line_handoff_ns, MeasureLineHandoff(job.pool(), cfg.bench.peak_seconds / 10));
  }
  r.kernel_target = ActiveHogwildKernelTarget();
  r.kernel_targets = HogwildKernelTargets();
  r.prefetch_burst_lines = job.worker(0).prefetch_burst_lines();
  r.prefetch_burst_configured = cfg.data.prefetch_burst_lines > 0;
  if (!r.prefetch_burst_configured) r.prefetch_burst = MachinePrefetchBurst();
  r.data_load_s = job.data_load_seconds();
  r.data_pack_s = job.pack_seconds();
  r.data_records = job.train().count;
  if (job.train().tokens > 0 && job.train().count > 0) {
    r.tokens_per_s_per_worker =
        r.samples_per_s * static_cast<double>(job.train().tokens) / static_cast<double>(job.train().count) / r.workers;
  }
  const StoreLayout& layout = job.param_store().layout();
  if (rows > 0 && !layout.tables.empty()) {
    r.rows_per_s = static_cast<double>(rows) / r.wall_s;
    const TableSpec& t = layout.tables[0];
    r.embedding_dim = t.dim;
    if (job_bound) {
      r.bytes_per_row = job_bound->row_bytes;
      r.bound_memory = "the job's rows";
      r.bound_slices = slices;
      r.bound_rows_per_s = Median(slice_bounds);
      r.bound_rows_per_s_min = *std::min_element(slice_bounds.begin(), slice_bounds.end());
      r.bound_rows_per_s_max = *std::max_element(slice_bounds.begin(), slice_bounds.end());
      r.phase_rows_ratio = Median(slice_ratios);
      r.phase_rows_ratio_min = *std::min_element(slice_ratios.begin(), slice_ratios.end());
      r.phase_rows_ratio_max = *std::max_element(slice_ratios.begin(), slice_ratios.end());
    } else {
      // No local static rows to measure on (a cluster's tables, dynamic
      // tables): the store benchmark's bound, once, on memory of its own.
      const OptimizerOptions& sparse = cfg.sparse_optimizer ? *cfg.sparse_optimizer : cfg.optimizer;
      StoreBenchOptions so;
      so.dim = t.dim;
      // As many rows as the step's lookups spread over: every table of that
      // width (26 tables of 1M rows for DLRM), so the bound misses the caches
      // and TLB as often as the step does.
      so.rows = 0;
      for (const TableSpec& other : layout.tables) {
        if (other.dim == t.dim) so.rows += other.capacity;
      }
      so.optimizer = sparse.type;
      so.bf16 = t.bf16;
      so.threads = r.workers;
      so.seconds = cfg.bench.peak_seconds;
      so.warmup_seconds = 0.1;
      so.seed = cfg.train.seed;
      SW_ASSIGN_OR_RETURN(StoreBenchReport sb, RunStoreBench(so));
      r.bytes_per_row = sb.row_bytes;
      r.bound_memory = "a store of its own";
      r.bound_slices = 1;
      r.bound_rows_per_s = r.bound_rows_per_s_min = r.bound_rows_per_s_max = sb.bound_rows_per_s;
    }
    // Bytes per id: the gathered row (f32, whatever the table's dtype), and
    // the update reading and writing the row's params and slots (bf16
    // params count 2 bytes each).
    r.embedding_bytes_per_s =
        r.rows_per_s * (static_cast<double>(t.dim) * sizeof(float) + 2.0 * static_cast<double>(r.bytes_per_row));
    r.rows_ratio = r.bound_rows_per_s > 0 ? r.rows_per_s / r.bound_rows_per_s : 0;
    // Phase times are summed over the workers, which run at once.
    const double embedding_s = EmbeddingSeconds(r.phases) / r.workers;
    r.phase_rows_per_s = embedding_s > 0 ? static_cast<double>(rows) / embedding_s : 0;
    if (!job_bound) {
      r.phase_rows_ratio = r.bound_rows_per_s > 0 ? r.phase_rows_per_s / r.bound_rows_per_s : 0;
      r.phase_rows_ratio_min = r.phase_rows_ratio_max = r.phase_rows_ratio;
    }
  }
  return r;
}

std::string FormatBenchReport(const BenchReport& r) {
  const double total = r.phases.total();
  auto pct = [&](double x) { return total > 0 ? 100.0 * x / total : 0.0; };
  std::string s;
  absl::StrAppendFormat(&s, "threading: %d workers x %d OpenMP threads each (oneDNN runs single-team per worker; total %d)\n",
                        r.workers, r.intra_op_threads, r.workers * r.intra_op_threads);
  absl::StrAppendFormat(&s,
                        "steps: %d warm-up + %d timed per worker, batch %d; %d timed steps run in all (the first "
                        "worker to finish stops the others)\n",
                        r.warmup_steps, r.steps, r.batch, r.steps_done);
  absl::StrAppendFormat(&s, "throughput: %.0f samples/s, %.3f ms per step per worker, wall %.2f s\n", r.samples_per_s,
                        r.step_ms, r.wall_s);
  absl::StrAppendFormat(&s,
                        "phases: data %.1f%%  read params %.1f%%  pull rows %.1f%%  forward %.1f%%  backward %.1f%%  "
                        "push %.1f%%  push rows %.1f%%\n",
                        pct(r.phases.data), pct(r.phases.read_params), pct(r.phases.pull_rows), pct(r.phases.forward),
                        pct(r.phases.backward), pct(r.phases.push), pct(r.phases.push_rows));
  if (r.push_bound_us > 0) {
    absl::StrAppendFormat(&s,
                          "push: %.1f us a step for %d dense parameters; the same update on arrays of each "
                          "worker's own, all workers at once (same run): %.1f us, ratio %.2f",
                          r.push_us, r.dense_params, r.push_bound_us, r.push_ratio);
    s += "\n";
  }
  if (r.line_handoff_ns > 0) {
    absl::StrAppendFormat(&s,
                          "line hand-off (same run): a cache line moves between workers 0 and 1's cores in %.0f ns "
                          "(what each line of shared parameters or rows another worker wrote since costs)\n",
                          r.line_handoff_ns);
  }
  if (r.prefetch_burst_configured) {
    absl::StrAppendFormat(&s, "prefetch bursts: %d lines (data.prefetch_burst_lines)\n", r.prefetch_burst_lines);
  } else if (r.prefetch_burst.measured) {
    absl::StrAppendFormat(&s, "prefetch bursts: %d lines, measured (lines asked for in one burst, of a miss left:",
                          r.prefetch_burst_lines);
    for (const BurstTiming& t : r.prefetch_burst.sizes) {
      absl::StrAppendFormat(&s, " %d: %.0f%%", t.lines, 100 * t.LostShare());
    }
    s += ")\n";
  } else {
    absl::StrAppendFormat(&s, "prefetch bursts: %d lines (not measured on this machine)\n", r.prefetch_burst_lines);
  }
  absl::StrAppendFormat(&s, "data: read and parsed %d records in %.2f s before training (%.0f records/s)",
                        r.data_records, r.data_load_s, r.data_load_s > 0 ? r.data_records / r.data_load_s : 0.0);
  if (r.data_pack_s > 0) absl::StrAppendFormat(&s, ", packed for the workers' loads in %.2f s", r.data_pack_s);
  s += "\n";
  if (r.rows_per_s > 0) {
    const std::string bound_how =
        r.bound_slices > 1
            ? absl::StrFormat("median of %d, one after each slice of the steps, on %s; range %.3g-%.3g", r.bound_slices,
                              r.bound_memory, r.bound_rows_per_s_min, r.bound_rows_per_s_max)
            : absl::StrFormat("once after the steps, on %s", r.bound_memory);
    const std::string ratio_range =
        r.bound_slices > 1 ? absl::StrFormat(" (slices %.3f-%.3f)", r.phase_rows_ratio_min, r.phase_rows_ratio_max)
                           : std::string();
    absl::StrAppendFormat(&s,
                          "embeddings: %.3g rows/s gathered and updated (dim %d), %.2f GB/s moved; same-run random-row "
                          "bound %.3g rows/s (%s): ratio %.3f; in the embedding phases alone %.3g rows/s: ratio "
                          "%.3f%s%s\n",
                          r.rows_per_s, r.embedding_dim, r.embedding_bytes_per_s / 1e9, r.bound_rows_per_s, bound_how,
                          r.rows_ratio, r.phase_rows_per_s, r.phase_rows_ratio, ratio_range,
                          r.phases.rows_in_forward > 0
                              ? absl::StrFormat(" (rows in place: the forward's pooling, %.1f%% of the step, counted too)",
                                                pct(r.phases.rows_in_forward))
                              : std::string());
  }
  if (r.tokens_per_s_per_worker > 0) {
    absl::StrAppendFormat(&s, "text: %.0f tokens/s per worker thread\n", r.tokens_per_s_per_worker);
  }
  absl::StrAppendFormat(&s, "updates: ps.update %s, %d of %d timed steps pulled the parameters\n", r.update_mode,
                        r.pulls, r.steps_done);
  absl::StrAppendFormat(&s, "model: %.1f MFLOP per step (forward + backward), %.2f GFLOP/s achieved\n",
                        r.flops_per_step / 1e6, r.model_gflops);
  absl::StrAppendFormat(&s, "matmul peak (same run, sgemm %dx%dx%d on %d threads x %d OpenMP): %.2f GFLOP/s\n",
                        r.peak.m, r.peak.n, r.peak.k, r.peak.threads, r.peak.omp_threads_per_worker, r.peak.gflops);
  if (r.bf16_peak.gflops > 0) {
    absl::StrAppendFormat(&s, "bf16 matmul peak (same run, bf16 x bf16 -> f32 %dx%dx%d on %d threads x %d OpenMP): "
                          "%.2f GFLOP/s, %.2fx the f32 peak\n",
                          r.bf16_peak.m, r.bf16_peak.n, r.bf16_peak.k, r.bf16_peak.threads,
                          r.bf16_peak.omp_threads_per_worker, r.bf16_peak.gflops,
                          r.peak.gflops > 0 ? r.bf16_peak.gflops / r.peak.gflops : 0.0);
  } else {
    s += "bf16 matmul peak: not measured (no AVX512_BF16 or AMX_BF16 on this CPU)\n";
  }
  absl::StrAppendFormat(&s, "fraction of peak: %.3f (of the %s peak: model.precision %s)\n", r.peak_fraction,
                        r.precision == "bf16" ? "bf16" : "f32", r.precision);
  absl::StrAppendFormat(&s, "dense layers: oneDNN runs their forward matmuls as %s\n",
                        r.layer_impls.empty() ? std::string("(none)") : absl::StrJoin(r.layer_impls, ", "));
  absl::StrAppendFormat(&s, "update kernels: %s (this CPU: %s)\n", r.kernel_target, absl::StrJoin(r.kernel_targets, " "));
  if (r.wire_bytes_per_step >= 0) {
    const double t = r.phases.total();
    const double store = r.phases.read_params + r.phases.pull_rows + r.phases.push + r.phases.push_rows;
    absl::StrAppendFormat(&s, "bridge: %.1f KiB on the wire per step (pull and push messages, sent + received); "
                              "store access (read params, pull rows, push, push rows) %.1f%% of the step\n",
                          r.wire_bytes_per_step / 1024, t > 0 ? 100 * store / t : 0.0);
  }
  return s;
}

}  // namespace shardwild
