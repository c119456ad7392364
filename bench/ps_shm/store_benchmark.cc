// Dense pull and push through the shared-memory store, 1 and 2 threads,
// next to a STREAM triad measured in the same run; and embedding rows pulled
// and pushed through ParamStore::PullRows / PushRows (one table of 1M rows,
// dim 16/64/256, uniform or Zipf(1.05) ids, sgd/adagrad/adam, update mode
// hogwild (mode:0), row_lock (mode:1) or sync (mode:2: the threads are the
// workers of one SyncAggregator; each round's batches are averaged and
// pushed once by the last arrival)), next to the bounds measured in the same
// run (bounds.h, shared with embedding_benchmark):
//   BM_StreamTriad/n:235146: STREAM triad over arrays of the MLP's size
//     (in cache; the bound for BM_PullDense / BM_PushDense);
//   BM_StreamTriad/n:16777216: the same over arrays far larger than cache
//     (memory bandwidth);
//   BM_RandomRowRmw/rows:<r>/dim:<d>/dist:<s>/opt:<o>: plain code that reads
//     and writes random rows (prefetched 8 ahead) of the table's row stride
//     over an array of the same number of rows, with the same id stream: the
//     bound for BM_PushRows/rows:<r>/dim:<d>/dist:<s>/opt:<o>/mode:<m> at the
//     same threads (its label says the slots per row, NumSlots(o)). It moves
//     the same bytes a push counts; BM_PullRows with the same args moves a
//     third (adam) to all (sgd) of them, read only.
//
//   build/bench/ps_shm/store_benchmark --benchmark_counters_tabular=true --benchmark_filter='dim:64/dist:0/.*opt:3'
//
// Set SHARDWILD_BENCH_LARGE_TABLES=1 to also register 10M-row tables.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/data/id_stream.h"
#include "core/model/optimizer.h"
#include "ps_shm/shm_store.h"
#include "ps_shm/sync_aggregator.h"
#include "bounds.h"

namespace shardwild {
namespace {

// The default MLP's variables: 784x256, 256, 256x128, 128, 128x10, 10.
std::vector<VariableSpec> MlpVariables() {
  return {{"k0", 784, 256}, {"b0", 256, 1}, {"k1", 256, 128}, {"b1", 128, 1}, {"k2", 128, 10}, {"b2", 10, 1}};
}

int64_t TotalParams(const std::vector<VariableSpec>& v) {
  int64_t n = 0;
  for (const auto& s : v) n += s.size();
  return n;
}

// One store shared by all threads of a benchmark run (created by thread 0).
struct Shared {
  std::unique_ptr<ShmParamStore> store;
};
Shared g_shared;

void SetUpStore(const benchmark::State& state, OptimizerType type) {
  if (state.thread_index() != 0) return;
  OpenStoreOptions o;
  o.optimizer.type = type;
  o.num_shards = static_cast<int>(state.range(1));
  auto st = ShmParamStore::Create(o, MlpVariables());
  g_shared.store = st.ok() ? std::move(*st) : nullptr;
}

// The dense bound at the MLP's size (235146 floats) and the memory bound.
BENCHMARK(bench::BM_StreamTriad)
    ->Name("BM_StreamTriad")
    ->ArgName("n")
    ->Arg(235146)
    ->Arg(int64_t{1} << 24)
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();

void BM_PullDense(benchmark::State& state) {
  SetUpStore(state, OptimizerType::kSgd);
  // Thread 0 creates the store before the loop; Google Benchmark starts the
  // loop of every thread together, after that.
  const auto vars = MlpVariables();
  std::vector<std::vector<float>> out;
  for (const auto& v : vars) out.emplace_back(v.size());
  std::vector<PullSlice> slices;
  for (int i = 0; i < static_cast<int>(vars.size()); ++i) slices.push_back({i, 0, vars[i].rows, out[i].data()});
  for (auto _ : state) {
    if (!g_shared.store || !g_shared.store->Pull(slices).ok()) {
      state.SkipWithError("store");
      break;
    }
  }
  state.counters["bytes/s"] =
      benchmark::Counter(2.0 * TotalParams(vars) * sizeof(float), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kAvgThreads);
  if (state.thread_index() == 0) g_shared.store.reset();
}

void BM_PushDense(benchmark::State& state) {
  const OptimizerType type = static_cast<OptimizerType>(state.range(0));
  SetUpStore(state, type);
  const auto vars = MlpVariables();
  std::vector<std::vector<float>> grads;
  for (const auto& v : vars) grads.emplace_back(v.size(), 1e-3f);
  std::vector<DenseGrad> push;
  for (int i = 0; i < static_cast<int>(vars.size()); ++i) push.push_back({i, grads[i].data()});
  for (auto _ : state) {
    if (!g_shared.store || !g_shared.store->Push(push, 1e-3f).ok()) {
      state.SkipWithError("store");
      break;
    }
  }
  const double bytes = (2.0 * (1 + NumSlots(type)) + 1.0) * TotalParams(vars) * sizeof(float);
  state.counters["bytes/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kAvgThreads);
  state.counters["params/s"] = benchmark::Counter(TotalParams(vars), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kAvgThreads);
  state.SetLabel(OptimizerTypeName(type));
  if (state.thread_index() == 0) g_shared.store.reset();
}

BENCHMARK(BM_PullDense)->ArgNames({"unused", "shards"})->Args({0, 1})->Args({0, 4})->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_PushDense)
    ->ArgNames({"optimizer", "shards"})
    ->ArgsProduct({{static_cast<int>(OptimizerType::kSgd), static_cast<int>(OptimizerType::kAdam)}, {1, 4}})
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();

// ---- Embedding rows through the ParamStore ---------------------------------

constexpr int64_t kRowBatch = 1024;
constexpr int64_t kRowStreamIds = int64_t{1} << 21;

// "x per iteration" as a rate over all threads (bounds.h).
using bench::kPerIterationRate;

// A fixed id stream: ranks uniform or Zipf(1.05), sent to row
// (rank * 2654435761) mod rows (a bijection: that prime divides neither 2^20,
// 10^6 nor 10^7), so hot rows are spread over the table.
const std::vector<uint64_t>& RowIds(int64_t rows, int dist) {
  static std::vector<uint64_t> cache[2];
  static int64_t cache_rows[2] = {0, 0};
  std::vector<uint64_t>& ids = cache[dist];
  if (cache_rows[dist] == rows) return ids;
  ids = MakeIdStream(rows, dist == 0 ? 0.0 : 1.05, kRowStreamIds, 42 + dist);
  cache_rows[dist] = rows;
  return ids;
}

// One store with one static table, shared by the threads of a run and by
// consecutive runs of the same shape; built by thread 0 before its loop.
// In sync mode it also holds the aggregator of the run's threads (its group
// re-forms after every run, when all threads have left).
struct TableStore {
  std::tuple<int64_t, int64_t, int, int, int> key{0, 0, -1, -1, 0};  // rows, dim, optimizer, mode, threads
  std::unique_ptr<SyncAggregator> sync;
  std::unique_ptr<ShmParamStore> store;
  std::string error;
};
TableStore g_table_store;

constexpr UpdateMode kModes[] = {UpdateMode::kHogwild, UpdateMode::kRowLock, UpdateMode::kSync};

void SetUpTableStore(int64_t rows, int64_t dim, OptimizerType type, int mode, int threads) {
  const auto key = std::make_tuple(rows, dim, static_cast<int>(type), mode, threads);
  if (g_table_store.key == key && g_table_store.store) return;
  g_table_store.sync.reset();
  g_table_store.store.reset();
  g_table_store.error.clear();
  g_table_store.key = key;
  OpenStoreOptions o;
  o.store.update = kModes[mode];
  o.optimizer.type = type;
  o.optimizer.lr = 1e-3f;
  TableSpec t;
  t.name = "bench";
  t.dim = dim;
  t.capacity = rows;
  o.tables.push_back(t);
  auto st = ShmParamStore::Create(o, {});
  if (st.ok()) {
    g_table_store.store = std::move(*st);
    if (kModes[mode] == UpdateMode::kSync) {
      g_table_store.sync = std::make_unique<SyncAggregator>(g_table_store.store.get(), threads);
    }
  } else {
    g_table_store.error = std::string(st.status().message());
  }
}

int64_t RowStart(const benchmark::State& state) {
  return (kRowStreamIds / kRowBatch / state.threads() * state.thread_index()) * kRowBatch;
}

std::string RowLabel(int dist, OptimizerType type, int mode) {
  return std::string(dist == 0 ? "uniform" : "zipf1.05") + "/" + OptimizerTypeName(type) + "/" +
         UpdateModeName(kModes[mode]);
}

// Args: rows, dim, dist (0 uniform, 1 zipf), optimizer, mode (0 hogwild,
// 1 row_lock, 2 sync).
void BM_PushRows(benchmark::State& state) {
  const int64_t rows = state.range(0), dim = state.range(1);
  const int dist = static_cast<int>(state.range(2));
  const auto type = static_cast<OptimizerType>(state.range(3));
  const int mode = static_cast<int>(state.range(4));
  if (state.thread_index() == 0) SetUpTableStore(rows, dim, type, mode, state.threads());
  const std::vector<uint64_t>& ids = RowIds(rows, dist);
  std::vector<float> grads(kRowBatch * dim, 1e-3f);
  RowScratch scratch;
  int64_t pos = RowStart(state);
  for (auto _ : state) {
    if (!g_table_store.store) {
      state.SkipWithError(("store: " + g_table_store.error).c_str());
      break;
    }
    const absl::Span<const uint64_t> batch(ids.data() + pos, static_cast<size_t>(kRowBatch));
    absl::Status s;
    if (g_table_store.sync) {
      const RowGrad rg{0, batch, grads.data()};
      s = g_table_store.sync->Contribute(state.thread_index(), {}, 1e-3f, {&rg, 1}, 1e-3f);
    } else {
      s = g_table_store.store->PushRows(0, batch, grads.data(), 1e-3f, &scratch);
    }
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    pos = (pos + kRowBatch) % kRowStreamIds;
  }
  // Leave (even after an error) so the other threads' rounds complete and
  // the group re-forms for the next run.
  if (g_table_store.sync) (void)g_table_store.sync->Leave(state.thread_index());
  const double row_bytes = 2.0 * (1 + NumSlots(type)) * dim * sizeof(float);
  state.counters["rows/s"] = benchmark::Counter(kRowBatch, kPerIterationRate);
  state.counters["bytes/s"] = benchmark::Counter(kRowBatch * row_bytes, kPerIterationRate, benchmark::Counter::kIs1024);
  state.SetLabel(RowLabel(dist, type, mode));
}

// Args: rows, dim, dist, optimizer (it sizes the rows' slots), mode (0
// hogwild, 1 row_lock; a sync store pulls as hogwild does).
void BM_PullRows(benchmark::State& state) {
  const int64_t rows = state.range(0), dim = state.range(1);
  const int dist = static_cast<int>(state.range(2));
  const auto type = static_cast<OptimizerType>(state.range(3));
  const int mode = static_cast<int>(state.range(4));
  if (state.thread_index() == 0) SetUpTableStore(rows, dim, type, mode, state.threads());
  const std::vector<uint64_t>& ids = RowIds(rows, dist);
  std::vector<float> out(kRowBatch * dim);
  RowScratch scratch;
  int64_t pos = RowStart(state);
  for (auto _ : state) {
    if (!g_table_store.store) {
      state.SkipWithError(("store: " + g_table_store.error).c_str());
      break;
    }
    const absl::Status s = g_table_store.store->PullRows(0, {ids.data() + pos, static_cast<size_t>(kRowBatch)},
                                                         out.data(), PullMode::kInsert, &scratch);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
    pos = (pos + kRowBatch) % kRowStreamIds;
  }
  state.counters["rows/s"] = benchmark::Counter(kRowBatch, kPerIterationRate);
  state.counters["bytes/s"] =
      benchmark::Counter(kRowBatch * dim * sizeof(float), kPerIterationRate, benchmark::Counter::kIs1024);
  state.SetLabel(RowLabel(dist, type, mode));
}

// The bound for BM_PushRows with the same args (bounds.h, RunRandomRowRmw):
// the table's row stride for NumSlots(opt) slots, the same rows, id stream
// and per-thread start offsets, prefetch on. The table store is freed first
// to make room. Args: rows, dim, dist, optimizer.
bench::RmwArray g_rmw;

void BM_RandomRowRmw(benchmark::State& state) {
  const int64_t rows = state.range(0), dim = state.range(1);
  const int dist = static_cast<int>(state.range(2));
  const auto type = static_cast<OptimizerType>(state.range(3));
  const int slots = NumSlots(type);
  const size_t stride = bench::TableRowStride(dim, slots);
  if (state.thread_index() == 0 && g_rmw.key != std::make_tuple(rows, stride)) {
    g_table_store.sync.reset();
    g_table_store.store.reset();
    g_table_store.key = {0, 0, -1, -1, 0};
    g_rmw.Prepare(rows, stride, (1 + slots) * dim);
  }
  const std::vector<uint64_t>& ids = RowIds(rows, dist);
  bench::RunRandomRowRmw(state, g_rmw, ids.data(), kRowStreamIds, RowStart(state), kRowBatch, rows, dim, slots, stride,
                         /*prefetch=*/true);
  state.SetLabel(std::string(dist == 0 ? "uniform" : "zipf1.05") + "/" + OptimizerTypeName(type) +
                 "/slots:" + std::to_string(slots) + "/prefetch");
}

// Registered so that consecutive runs share a store (rows, dim, optimizer
// vary slowest).
bool RegisterRowBenchmarks() {
  std::vector<int64_t> row_counts = {1'000'000};
  if (const char* large = std::getenv("SHARDWILD_BENCH_LARGE_TABLES"); large != nullptr && large[0] == '1') {
    row_counts.push_back(10'000'000);
  }
  auto* pull =
      benchmark::RegisterBenchmark("BM_PullRows", BM_PullRows)->ArgNames({"rows", "dim", "dist", "opt", "mode"});
  auto* push =
      benchmark::RegisterBenchmark("BM_PushRows", BM_PushRows)->ArgNames({"rows", "dim", "dist", "opt", "mode"});
  for (int64_t mode : {0, 1, 2}) {
    for (int64_t rows : row_counts) {
      for (int64_t dim : {16, 64, 256}) {
        for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kAdagrad, OptimizerType::kAdam}) {
          for (int64_t dist : {0, 1}) {
            push->Args({rows, dim, dist, static_cast<int64_t>(type), mode});
            if (mode < 2) pull->Args({rows, dim, dist, static_cast<int64_t>(type), mode});
          }
        }
      }
    }
  }
  auto* rmw =
      benchmark::RegisterBenchmark("BM_RandomRowRmw", BM_RandomRowRmw)->ArgNames({"rows", "dim", "dist", "opt"});
  for (int64_t rows : row_counts) {
    for (int64_t dim : {16, 64, 256}) {
      for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kAdagrad, OptimizerType::kAdam}) {
        for (int64_t dist : {0, 1}) rmw->Args({rows, dim, dist, static_cast<int64_t>(type)});
      }
    }
  }
  for (auto* b : {pull, push, rmw}) b->Threads(1)->Threads(2)->UseRealTime();
  return true;
}
const bool g_rows_registered = RegisterRowBenchmarks();

}  // namespace
}  // namespace shardwild
