// Embedding rows pulled and pushed through an EmbeddingTable, 1 and 2
// threads, in update mode hogwild (mode:0) and row_lock (mode:1, each row
// under its seqlock; sync mode needs an aggregator over a whole store, so it
// is in store_benchmark), next to the bounds measured in the same run:
//   BM_RandomRowRmw: plain code that reads and writes random rows of the same
//     stride over an array of the same size (no atomics, no index, no dedup,
//     no optimizer arithmetic). Compare a push with prefetch:1, which
//     requests rows ahead as the table does; prefetch:0 is the naive loop.
//     Compare BM_PushRows/opt:<o> with the RMW row of slots = NumSlots(o)
//     (sgd 0, adagrad 1, adam 2) and the same dist and threads;
//   BM_StreamTriad: STREAM's a = b + s * c over arrays far larger than cache.
//
// Ratios are only meaningful between rows of one run on an otherwise idle
// machine. An Adam push may be bound by the optimizer kernel's arithmetic
// (core/optimizer.cc) rather than by memory; the RMW bound does no such work.
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
#include <sys/mman.h>

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

#include "core/optimizer.h"
#include "core/options.h"
#include "core/id_stream.h"
#include "ps_shm/embedding_table.h"

namespace shardwild {
namespace {

constexpr int64_t kBatch = 1024;
constexpr int64_t kDefaultRows = int64_t{1} << 20;
constexpr int64_t kLargeRows = 10'000'000;
constexpr int64_t kStreamIds = int64_t{1} << 21;

enum Dist { kUniformIds = 0, kZipfIds = 1 };

// "x per iteration" as a rate over all threads. Google Benchmark sums a
// counter over threads and then multiplies it by the iterations of all
// threads, so a per-thread value must also be averaged over threads, or a
// 2-thread run reports twice its real rate.
const auto kPerIterationRate =
    static_cast<benchmark::Counter::Flags>(benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kAvgThreads);

// An anonymous private mapping with transparent huge pages requested, the
// same for the table and for the bound.
class Mapping {
 public:
  explicit Mapping(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : p;
    if (data_ != nullptr) madvise(data_, bytes_, MADV_HUGEPAGE);
  }
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  size_t bytes_;
  void* data_;
};

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

// The bound for a push: the same rows (the table's stride, (1 + slots) * dim
// floats touched per row) over the same number of rows, read and written by
// plain vectorisable code: no atomics, no index, no deduplication. With
// prefetch:1 it requests rows 8 ahead as EmbeddingTable does (the fair
// bound); prefetch:0 is the naive loop, bound by memory latency.
// Args: rows, dim, dist, slots, prefetch.
struct RmwArray {
  std::tuple<int64_t, size_t> key{0, 0};  // rows, stride
  std::unique_ptr<Mapping> memory;
};
RmwArray g_rmw;

void BM_RandomRowRmw(benchmark::State& state) {
  const int64_t rows = state.range(0), dim = state.range(1);
  const auto dist = static_cast<Dist>(state.range(2));
  const int slots = static_cast<int>(state.range(3));
  const bool prefetch = state.range(4) != 0;
  EmbeddingTableOptions o;
  o.dim = dim;
  o.capacity = 1;
  o.num_slots = slots;
  const size_t one = EmbeddingTable::BytesFor(o);
  o.capacity = 2;
  const size_t stride = EmbeddingTable::BytesFor(o) - one;  // the table's row stride
  const int64_t n = (1 + slots) * dim;
  if (state.thread_index() == 0 && g_rmw.key != std::make_tuple(rows, stride)) {
    g_tables.table.reset();  // make room
    g_tables.memory.reset();
    g_tables.key = {};
    g_rmw.memory = std::make_unique<Mapping>(rows * stride);
    g_rmw.key = {rows, stride};
    if (char* base = static_cast<char*>(g_rmw.memory->data())) {
      for (int64_t r = 0; r < rows; ++r) std::fill_n(reinterpret_cast<float*>(base + r * stride), n, 0.01f);
    }
  }
  const IdStream& stream = Stream(rows, dist);
  std::vector<float> grads(dim, 1e-3f);
  const uint64_t threads = static_cast<uint64_t>(state.threads());
  const uint64_t thread = static_cast<uint64_t>(state.thread_index());
  const int lines = static_cast<int>(std::min<size_t>(stride / 64, 16));
  // Thread t of T keeps to rows = t mod T, so the plain code has no data
  // race (the push it bounds has Hogwild races instead).
  auto row_of = [&](uint64_t id) {
    uint64_t r = id - id % threads + thread;
    return r >= static_cast<uint64_t>(rows) ? r - threads : r;
  };
  int64_t pos = StartOffset(state);
  for (auto _ : state) {
    char* base = static_cast<char*>(g_rmw.memory ? g_rmw.memory->data() : nullptr);
    if (base == nullptr) {
      state.SkipWithError("mmap failed");
      break;
    }
    const uint64_t* ids = stream.ids.data() + pos;
    for (int64_t i = 0; i < kBatch; ++i) {
      if (prefetch && i + 8 < kBatch) {
        const char* next = base + row_of(ids[i + 8]) * stride;
        for (int l = 0; l < lines; ++l) __builtin_prefetch(next + 64 * l, 1);
      }
      float* p = reinterpret_cast<float*>(base + row_of(ids[i]) * stride);
      for (int a = 0; a <= slots; ++a, p += dim) {
        for (int64_t j = 0; j < dim; ++j) p[j] = 0.999f * p[j] - 1e-3f * grads[j];
      }
    }
    benchmark::ClobberMemory();
    pos = (pos + kBatch) % kStreamIds;
  }
  state.counters["rows/s"] = benchmark::Counter(kBatch, kPerIterationRate);
  state.counters["bytes/s"] =
      benchmark::Counter(2.0 * kBatch * n * sizeof(float), kPerIterationRate, benchmark::Counter::kIs1024);
  state.SetLabel(std::string(dist == kUniformIds ? "uniform" : "zipf1.05") + "/slots:" + std::to_string(slots) +
                 (prefetch ? "/prefetch" : ""));
}

// STREAM triad on per-thread arrays of n floats each (3 x 64 MiB by default).
void BM_StreamTriad(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  for (auto _ : state) {
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.counters["bytes/s"] =
      benchmark::Counter(3.0 * n * sizeof(float), kPerIterationRate, benchmark::Counter::kIs1024);
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
  auto* triad = benchmark::RegisterBenchmark("BM_StreamTriad", BM_StreamTriad)->ArgName("n")->Arg(int64_t{1} << 24);
  for (auto* b : {pull, push, rmw, triad}) b->Threads(1)->Threads(2)->UseRealTime();
  return true;
}
const bool g_registered = RegisterAll();

}  // namespace
}  // namespace shardwild
