// Embedding rows pulled and pushed through an EmbeddingTable, 1 and 2
// threads, in update mode hogwild (mode:0) and row_lock (mode:1, each row
// under its seqlock; sync mode needs an aggregator over a whole store, so it
// is in store_benchmark), next to the bounds measured in the same run:
//   BM_RandomRowRmw: plain code that reads and writes random rows of the same
//     stride over an array of the same size (no atomics, no index, no dedup,
//     no optimizer arithmetic; bounds.h). Compare a push with prefetch:1,
//     which requests rows ahead as the table does; prefetch:0 is the naive
//     loop. Compare BM_PushRows/kind:<k>/rows:<r>/dim:<d>/dist:<s>/opt:<o>
//     with BM_RandomRowRmw/rows:<r>/dim:<d>/dist:<s>/slots:NumSlots(o)/
//     prefetch:1 (opt 0 sgd -> slots 0, 3 adagrad -> 1, 2 adam -> 2) at the
//     same threads;
//   BM_StreamTriad: STREAM's a = b + s * c over arrays far larger than cache
//     (bounds.h).
// store_benchmark registers the same bounds beside the same pushes made
// through the whole ParamStore.
//
// Ratios are only meaningful between rows of one run on an otherwise idle
// machine. An Adam push may be bound by the optimizer kernel's arithmetic
// (core/model/optimizer.cc) rather than by memory; the RMW bound does no such work.
//
//   build/bench/ps_shm/embedding_benchmark --benchmark_counters_tabular=true --benchmark_filter='dim:64/'
//
// Ids come from a fixed stream per distribution: uniform over the rows, or
// Zipf(1.05) over ranks scattered across the rows. Every iteration pushes or
// pulls one batch of 1024 ids. Counters: rows/s (ids in the batches), unique/s
// (rows left after deduplication), bytes/s (the row bytes those unique rows
// move: params read for pull; params and slots read and written for push).
//
// Tables hold 2^20 rows. Set SHARDWILD_BENCH_LARGE_TABLES=1 to also register
// 10M-row tables (10M x 64 floats x 3 arrays = 7.7 GB; not run by default).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "core/model/optimizer.h"
#include "core/config/options.h"
#include "core/data/id_stream.h"
#include "ps_shm/embedding_table.h"
#include "bounds.h"

namespace shardwild {
namespace {

constexpr int64_t kBatch = 1024;
constexpr int64_t kDefaultRows = int64_t{1} << 20;
constexpr int64_t kLargeRows = 10'000'000;
constexpr int64_t kStreamIds = int64_t{1} << 21;

enum Dist { kUniformIds = 0, kZipfIds = 1 };

using bench::kPerIterationRate;
using bench::Mapping;

// A fixed id stream and, for each aligned batch of it, its unique-id count.
struct IdStream {
  std::vector<uint64_t> ids;
  std::vector<int32_t> unique_per_batch;
};

// Ranks 0..rows-1 drawn uniformly or Zipf(s = 1.05); rank r is row
// (r * 2654435761) mod rows, a bijection (the multiplier is a prime that
// divides neither 2^20 nor 10^7), so hot rows are spread over the table.
IdStream MakeStream(int64_t rows, Dist dist) {
  IdStream s;
  s.ids = MakeIdStream(rows, dist == kUniformIds ? 0.0 : 1.05, kStreamIds, 42 + dist);
  std::unordered_set<uint64_t> seen;
  for (int64_t b = 0; b < kStreamIds; b += kBatch) {
    seen.clear();
    seen.insert(s.ids.begin() + b, s.ids.begin() + b + kBatch);
    s.unique_per_batch.push_back(static_cast<int32_t>(seen.size()));
  }
  return s;
}

const IdStream& Stream(int64_t rows, Dist dist) {
  static std::unique_ptr<IdStream> cache[2];
  static int64_t cache_rows[2] = {0, 0};
  if (!cache[dist] || cache_rows[dist] != rows) {
    cache[dist] = std::make_unique<IdStream>(MakeStream(rows, dist));
    cache_rows[dist] = rows;
  }
  return *cache[dist];
}

// Dynamic tables see 64-bit ids: row id x becomes x * an odd constant, a
// bijection on 64 bits.
inline uint64_t DynamicId(uint64_t x) { return x * 0x9e3779b97f4a7c15ULL; }

// The dynamic-id copy of a stream.
const std::vector<uint64_t>& DynamicIds(int64_t rows, Dist dist) {
  static std::vector<uint64_t> cache[2];
  static const uint64_t* source[2] = {nullptr, nullptr};
  const IdStream& s = Stream(rows, dist);
  if (source[dist] != s.ids.data()) {
    cache[dist].resize(s.ids.size());
    for (size_t i = 0; i < s.ids.size(); ++i) cache[dist][i] = DynamicId(s.ids[i]);
    source[dist] = s.ids.data();
  }
  return cache[dist];
}

// One table shared by all threads of a run and by consecutive runs with the
// same shape. Built by thread 0 before its timing loop; the other threads
// read it after the loop has started (Google Benchmark starts all threads'
// loops together, after a barrier).
struct TableCache {
  std::tuple<int, int64_t, int64_t, int, float, bool> key{-1, 0, 0, 0, 0.0f, false};  // kind, rows, dim, slots, slot 0 init, row_lock
  std::unique_ptr<Mapping> memory;
  std::optional<EmbeddingTable> table;
  std::string error;
};
TableCache g_tables;

void SetUpTable(EmbeddingKind kind, int64_t rows, int64_t dim, const OptimizerOptions& opt, bool row_lock) {
  EmbeddingTableOptions o;
  o.name = "bench";
  o.kind = kind;
  o.dim = dim;
  o.capacity = rows;
  o.SetOptimizer(opt);
  o.row_lock = row_lock;
  const auto key = std::make_tuple(static_cast<int>(kind), rows, dim, o.num_slots, o.slot_init[0], row_lock);
  if (g_tables.key == key && g_tables.table) return;
  g_tables.table.reset();
  g_tables.memory.reset();
  g_tables.error.clear();
  g_tables.key = key;
  g_tables.memory = std::make_unique<Mapping>(EmbeddingTable::BytesFor(o));
  if (g_tables.memory->data() == nullptr) {
    g_tables.error = "mmap failed";
    return;
  }
  auto t = EmbeddingTable::Create(g_tables.memory->data(), g_tables.memory->size(), o);
  if (!t.ok()) {
    g_tables.error = std::string(t.status().message());
    return;
  }
  if (kind == EmbeddingKind::kDynamic) {
    // Insert every row, so the timed loop measures lookups and updates.
    std::vector<uint64_t> ids(4096);
    std::vector<float> out(ids.size() * dim);
    for (int64_t b = 0; b < rows; b += static_cast<int64_t>(ids.size())) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(ids.size()), rows - b);
      for (int64_t i = 0; i < n; ++i) ids[i] = DynamicId(static_cast<uint64_t>(b + i));
      if (auto s = t->Pull({ids.data(), static_cast<size_t>(n)}, out.data()); !s.ok()) {
        g_tables.error = std::string(s.message());
        return;
      }
    }
  }
  g_tables.table.emplace(std::move(*t));
}

// Where thread t starts in the id stream (aligned to a batch).
int64_t StartOffset(const benchmark::State& state) {
  return (kStreamIds / kBatch / state.threads() * state.thread_index()) * kBatch;
}

// Args: kind, rows, dim, dist, optimizer, mode (0 hogwild, 1 row_lock).
void BM_PushRows(benchmark::State& state) {
  const auto kind = static_cast<EmbeddingKind>(state.range(0));
  const int64_t rows = state.range(1), dim = state.range(2);
  const auto dist = static_cast<Dist>(state.range(3));
  OptimizerOptions opt;
  opt.type = static_cast<OptimizerType>(state.range(4));
  opt.lr = 1e-3f;
  const bool row_lock = state.range(5) == 1;
  if (state.thread_index() == 0) SetUpTable(kind, rows, dim, opt, row_lock);
  const IdStream& stream = Stream(rows, dist);
  const uint64_t* ids = kind == EmbeddingKind::kDynamic ? DynamicIds(rows, dist).data() : stream.ids.data();
  std::vector<float> grads(kBatch * dim, 1e-3f);
  EmbeddingTable::Scratch scratch;
  int64_t pos = StartOffset(state), unique = 0;
  for (auto _ : state) {
    if (!g_tables.table) {
      state.SkipWithError(("table: " + g_tables.error).c_str());
      break;
    }
    const absl::Status s = g_tables.table->Push({ids + pos, kBatch}, grads.data(), opt, opt.lr, &scratch);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    unique += stream.unique_per_batch[pos / kBatch];
    pos = (pos + kBatch) % kStreamIds;
  }
  const double row_bytes = 2.0 * (1 + NumSlots(opt.type)) * dim * sizeof(float);
  state.counters["rows/s"] = benchmark::Counter(kBatch, kPerIterationRate);
  state.counters["unique/s"] = benchmark::Counter(static_cast<double>(unique), benchmark::Counter::kIsRate);
  state.counters["bytes/s"] = benchmark::Counter(unique * row_bytes, benchmark::Counter::kIsRate,
                                                 benchmark::Counter::kIs1024);
  state.SetLabel(std::string(EmbeddingKindName(kind)) + "/" + OptimizerTypeName(opt.type) + "/" +
                 (dist == kUniformIds ? "uniform" : "zipf1.05") + (row_lock ? "/row_lock" : "/hogwild"));
}

// Args: kind, rows, dim, dist, mode (0 hogwild, 1 row_lock: every row is
// copied inside a seqlock read). Pulls from a table laid out for Adam
// (params and two slots per row), the usual case for embeddings.
void BM_PullRows(benchmark::State& state) {
  const auto kind = static_cast<EmbeddingKind>(state.range(0));
  const int64_t rows = state.range(1), dim = state.range(2);
  const auto dist = static_cast<Dist>(state.range(3));
  OptimizerOptions opt;
  opt.type = OptimizerType::kAdam;
  const bool row_lock = state.range(4) == 1;
  if (state.thread_index() == 0) SetUpTable(kind, rows, dim, opt, row_lock);
  const IdStream& stream = Stream(rows, dist);
  const uint64_t* ids = kind == EmbeddingKind::kDynamic ? DynamicIds(rows, dist).data() : stream.ids.data();
  std::vector<float> out(kBatch * dim);
  int64_t pos = StartOffset(state);
  for (auto _ : state) {
    if (!g_tables.table) {
      state.SkipWithError(("table: " + g_tables.error).c_str());
      break;
    }
    const absl::Status s = g_tables.table->Pull({ids + pos, kBatch}, out.data());
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
    pos = (pos + kBatch) % kStreamIds;
  }
  state.counters["rows/s"] = benchmark::Counter(kBatch, kPerIterationRate);
  state.counters["bytes/s"] =
      benchmark::Counter(kBatch * dim * sizeof(float), kPerIterationRate, benchmark::Counter::kIs1024);
  state.SetLabel(std::string(EmbeddingKindName(kind)) + "/" + (dist == kUniformIds ? "uniform" : "zipf1.05") +
                 (row_lock ? "/row_lock" : "/hogwild"));
}

// The bound for a push (bounds.h, RunRandomRowRmw): the table's stride over
// the same number of rows, the same id stream and start offsets.
// Args: rows, dim, dist, slots, prefetch.
bench::RmwArray g_rmw;

void BM_RandomRowRmw(benchmark::State& state) {
  const int64_t rows = state.range(0), dim = state.range(1);
  const auto dist = static_cast<Dist>(state.range(2));
  const int slots = static_cast<int>(state.range(3));
  const bool prefetch = state.range(4) != 0;
  const size_t stride = bench::TableRowStride(dim, slots);
  if (state.thread_index() == 0 && g_rmw.key != std::make_tuple(rows, stride)) {
    g_tables.table.reset();  // make room
    g_tables.memory.reset();
    g_tables.key = {};
    g_rmw.Prepare(rows, stride, (1 + slots) * dim);
  }
  const IdStream& stream = Stream(rows, dist);
  bench::RunRandomRowRmw(state, g_rmw, stream.ids.data(), kStreamIds, StartOffset(state), kBatch, rows, dim, slots,
                         stride, prefetch);
  state.SetLabel(std::string(dist == kUniformIds ? "uniform" : "zipf1.05") + "/slots:" + std::to_string(slots) +
                 (prefetch ? "/prefetch" : ""));
}

std::vector<int64_t> Optimizers() {
  return {static_cast<int64_t>(OptimizerType::kSgd), static_cast<int64_t>(OptimizerType::kAdagrad),
          static_cast<int64_t>(OptimizerType::kAdam)};
}

// Registered in an order that lets consecutive runs share a table (kind,
// rows, dim, optimizer vary slowest).
bool RegisterAll() {
  std::vector<int64_t> row_counts = {kDefaultRows};
  if (const char* large = std::getenv("SHARDWILD_BENCH_LARGE_TABLES"); large != nullptr && large[0] == '1') {
    row_counts.push_back(kLargeRows);
  }
  const std::vector<int64_t> dims = {16, 64, 256};
  const std::vector<int64_t> dists = {kUniformIds, kZipfIds};
  const std::vector<int64_t> kinds = {static_cast<int64_t>(EmbeddingKind::kStatic),
                                      static_cast<int64_t>(EmbeddingKind::kDynamic)};
  // Explicit loops, not ArgsProduct (which varies the first argument fastest).
  auto* pull =
      benchmark::RegisterBenchmark("BM_PullRows", BM_PullRows)->ArgNames({"kind", "rows", "dim", "dist", "mode"});
  auto* push = benchmark::RegisterBenchmark("BM_PushRows", BM_PushRows)
                   ->ArgNames({"kind", "rows", "dim", "dist", "opt", "mode"});
  auto* rmw = benchmark::RegisterBenchmark("BM_RandomRowRmw", BM_RandomRowRmw)
                  ->ArgNames({"rows", "dim", "dist", "slots", "prefetch"});
  for (int64_t mode : {0, 1}) {
    for (int64_t kind : kinds) {
      for (int64_t rows : row_counts) {
        for (int64_t dim : dims) {
          for (int64_t dist : dists) pull->Args({kind, rows, dim, dist, mode});
          for (int64_t opt : Optimizers()) {
            for (int64_t dist : dists) push->Args({kind, rows, dim, dist, opt, mode});
          }
        }
      }
    }
  }
  for (int64_t rows : row_counts) {
    for (int64_t dim : dims) {
      for (int64_t slots : {0, 1, 2}) {
        for (int64_t dist : dists) {
          for (int64_t prefetch : {0, 1}) rmw->Args({rows, dim, dist, slots, prefetch});
        }
      }
    }
  }
  // configs/sparse_logreg.yaml's push: one weight a row, FTRL, Zipf ids
  // (about half of them repeat in a batch, so the deduplication is most of
  // the push), beside its bound (a row and FTRL's two slots).
  push->Args({static_cast<int64_t>(EmbeddingKind::kStatic), kDefaultRows, 1, kZipfIds,
              static_cast<int64_t>(OptimizerType::kFtrl), 0});
  rmw->Args({kDefaultRows, 1, kZipfIds, 2, 1});
  auto* triad = benchmark::RegisterBenchmark("BM_StreamTriad", bench::BM_StreamTriad)->ArgName("n")->Arg(int64_t{1} << 24);
  for (auto* b : {pull, push, rmw, triad}) b->Threads(1)->Threads(2)->UseRealTime();
  return true;
}
const bool g_registered = RegisterAll();

}  // namespace
}  // namespace shardwild
