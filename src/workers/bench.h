// The training-step benchmark behind `shardwild bench CONFIG`.
//
// It times the config's real step (same model, data, store and workers as
// `train`) for a fixed number of steps after a warm-up, splits the time into
// phases, and measures in the same run, on the same pinned threads with the
// same OpenMP thread count, the dense matmul peak (oneDNN sgemm) that the
// model's FLOP rate is compared with.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/prefetch_burst.h"
#include "workers/job.h"
#include "workers/worker_pool.h"

namespace shardwild {

struct MatmulPeak {
  int64_t m = 0, n = 0, k = 0;   // sgemm shape each thread runs
  int threads = 0;               // worker threads running it at once
  int omp_threads_per_worker = 0;
  double gflops = 0;             // summed over the threads
};

// Runs a size^3 sgemm on every pool thread at once for about
// seconds / sizes.size(), for each size in turn, and returns the best total
// rate with the shape that reached it. No one shape is the peak on every
// machine: 1024^3 spills the L2 and, on some, runs 10-15% below 256^3-512^3
// (which stay in cache, as a training step's matmuls do); a model beating
// the "peak" would mean the bound was wrong.
absl::StatusOr<MatmulPeak> MeasureMatmulPeak(WorkerPool& pool, int omp_threads_per_worker,
                                             const std::vector<int64_t>& sizes, double seconds);
// The sizes `shardwild bench` tries.
inline const std::vector<int64_t> kPeakSizes = {256, 512, 1024};

// The same for a bf16 matmul (oneDNN matmul primitive: bf16 inputs, f32
// accumulation and output), the rate a bf16 step can reach. Only measured
// where the CPU has bf16 instructions (AVX512_BF16 or AMX): elsewhere
// oneDNN emulates them and the figure would bound nothing.
absl::StatusOr<MatmulPeak> MeasureBf16MatmulPeak(WorkerPool& pool, int omp_threads_per_worker,
                                                 const std::vector<int64_t>& sizes, double seconds);

// One cache line handed back and forth between pool threads 0 and 1 (each
// waits for the other's write to a std::atomic, then writes it): the
// median over rounds of the one-way time, in ns, measured for at least 3
// rounds of 20,000 hand-offs and at most `seconds` after that. What a push
// pays for each line of parameters another worker wrote since, where the
// line is still in that worker's caches. 0 for a pool of one thread.
absl::StatusOr<double> MeasureLineHandoff(WorkerPool& pool, double seconds);

// The bound of a step's dense push: the same optimizer update (`optimizer`,
// ApplyUpdate's kernels) over `params` parameters, their slots and a
// gradient, the worker's copy written in the same pass as the fused
// push-and-pull writes it (bf16 where `bf16_copy`, model.precision bf16),
// on arrays of each pool thread's own, every thread at once, for about
// `seconds`: what the push costs where no other worker has written its
// lines. The median over the threads of each one's median push, in us.
// Over at most 4,194,304 parameters (80 MiB a thread for Adam), scaled by
// params over them beyond: such arrays are past the caches, and the time
// grows with the bytes.
absl::StatusOr<double> MeasureDensePushBound(WorkerPool& pool, const OptimizerOptions& optimizer, int64_t params,
                                             bool bf16_copy, double seconds);

struct BenchReport {
  int workers = 0;
  int intra_op_threads = 0;
  int64_t batch = 0;
  int64_t warmup_steps = 0;     // per worker
  int64_t steps = 0;            // per worker, timed (bench.steps)
  // Timed steps run, all workers: the first worker to run `steps` ends the
  // call, the others after their current step, as a training run's
  // on-demand tasks never leave a fast core waiting on a slow one. So
  // steps_done <= steps x workers; samples_per_s and step_ms count these.
  int64_t steps_done = 0;
  double wall_s = 0;            // of the timed part
  double samples_per_s = 0;
  double step_ms = 0;           // mean wall time of one worker's step
  PhaseTimes phases;            // summed over workers
  int64_t pulls = 0;            // timed steps that pulled, summed over workers (train.pull_every)
  std::string update_mode;      // ps.update
  double flops_per_step = 0;    // forward + backward FLOPs of one full batch
  double model_gflops = 0;      // achieved, all workers
  MatmulPeak peak;
  // model_gflops over the peak of the precision the model computes in
  // (model.precision): peak.gflops for f32, bf16_peak.gflops for bf16.
  double peak_fraction = 0;
  std::string precision;        // model.precision
  // The implementation oneDNN chose for each dense layer's forward matmul
  // (worker 0's model; what ONEDNN_VERBOSE prints), bottom tower first.
  std::vector<std::string> layer_impls;
  // The same-run bf16 matmul peak beside the f32 one; gflops 0 where the
  // CPU has no bf16 instructions (CpuFeatures::bf16).
  MatmulPeak bf16_peak;
  // The instruction set the Hogwild kernels (optimizer updates, pulls, row
  // gathers; core/model/hogwild_kernels.h) ran on, and every one this CPU offers.
  std::string kernel_target;
  std::vector<std::string> kernel_targets;

  // The dense push (models with at least 16,384 dense parameters, 64 KiB;
  // zero otherwise, dense_params aside): the parameters a push updates, its
  // time a step of one worker (phases.push over steps_done), the same-run
  // bound (MeasureDensePushBound on the workers' threads, for
  // bench.peak_seconds / 4) and push_us over it. A ratio well above 1 with
  // a long line hand-off is the workers' sharing of the lines, not the
  // update's arithmetic.
  int64_t dense_params = 0;
  double push_us = 0;
  double push_bound_us = 0;
  double push_ratio = 0;
  // The one-way line hand-off between workers 0 and 1's cores, measured
  // after the steps (MeasureLineHandoff, for at most bench.peak_seconds /
  // 10 past its 3 rounds); 0 with one worker, and where the two are
  // pinned to a core in common (more threads than cores).
  double line_handoff_ns = 0;
  // The most lines of the next batch a worker asked for at once
  // (Worker::prefetch_burst_lines), and where it came from: the probe
  // (MachinePrefetchBurst, its timings in `prefetch_burst`), its default
  // where nothing was measured, or data.prefetch_burst_lines (configured;
  // the probe then does not run).
  int prefetch_burst_lines = 0;
  bool prefetch_burst_configured = false;
  PrefetchBurstProbe prefetch_burst;

  // Embedding tables (models with sparse features; zero otherwise).
  // rows_per_s: ids gathered per second (= ids whose gradients were pushed),
  // all workers. embedding_bytes_per_s: the gather (dim floats per id) plus
  // the update (the row's params and slots read and written per id; an
  // upper bound, as repeated ids of a batch are updated once).
  double rows_per_s = 0;
  double embedding_bytes_per_s = 0;
  int64_t embedding_dim = 0;          // of the first table
  // The same-run random-row bound (workers/store_bench.h: a plain random-row
  // read-modify-write of rows with the first table's stride, over as many
  // rows as all tables of that width hold together, on as many pinned
  // threads as there are workers, uniform ids).
  //
  // Where the job's rows are local, static and of one size (bench.cc's
  // JobRowBound), the bound runs on those rows themselves (it writes back
  // the bits it read), so it meets the step's own pages, TLB reach and NUMA
  // placement; it is measured after each of bound_slices slices of the
  // timed steps, for bench.peak_seconds / bound_slices each. Elsewhere
  // (a cluster's tables, dynamic tables) `shardwild bench store`'s bound
  // runs once after the steps on an array of its own (bound_slices 1).
  // bound_rows_per_s is the median over the slices; _min and _max their range.
  double bound_rows_per_s = 0;
  double bound_rows_per_s_min = 0, bound_rows_per_s_max = 0;
  int bound_slices = 0;
  std::string bound_memory;           // "the job's rows" or "a store of its own"
  int64_t bytes_per_row = 0;          // the params and slots one update reads and writes
  double rows_ratio = 0;              // rows_per_s / bound_rows_per_s
  // The same ids over the time spent in the embedding phases only (pull rows
  // + push rows, and with rows in place the forward's pooling of them,
  // PhaseTimes::rows_in_forward): how fast the store serves the model's rows, whatever the
  // share of the step the MLP takes.
  double phase_rows_per_s = 0;
  // phase_rows_per_s / bound_rows_per_s: with slices, the median of each
  // slice's ratio (the slice's rows over its embedding phases' time, over
  // the bound measured right after it); _min and _max their range.
  double phase_rows_ratio = 0;
  double phase_rows_ratio_min = 0, phase_rows_ratio_max = 0;
  // Text data: tokens per second per worker thread.
  double tokens_per_s_per_worker = 0;
  // Reading and parsing the training data when the job was built (before
  // the timed steps), for the phase comparison.
  double data_load_s = 0;
  // Seconds spent packing the training set for the workers' loads
  // (Job::pack_seconds); 0 where it is not packed.
  double data_pack_s = 0;
  int64_t data_records = 0;
  // A store reached over the network (a cluster's worker task): bytes of
  // the pull and push messages per timed step of one worker (sent and
  // received), from RunBench's `wire_bytes`; -1 when not measured. The
  // share of the step time spent in the store (read_params, pull_rows,
  // push, push_rows: the bridge, on a cluster) is phases' to tell.
  double wire_bytes_per_step = -1;
};

// Times the job's step. `wire_bytes`, if given, returns the bytes the
// store has sent and received over the network so far (read before and
// after the timed steps).
// InvalidArgument (one line naming the key) for a config `shardwild bench`
// cannot time: streamed data. Checked by RunBench; call it before creating
// the Job to fail before the store and the data are set up.
absl::Status CheckBenchConfig(const Config& config);
absl::StatusOr<BenchReport> RunBench(Job& job, const std::function<uint64_t()>& wire_bytes = nullptr);

// A human-readable report.
std::string FormatBenchReport(const BenchReport& r);

}  // namespace shardwild
