// Dense layer and MLP step throughput, next to the sgemm peak measured in the
// same binary run (BM_Sgemm). Compare the FLOP/s counters of the two. Also
// the sparse models' memory-bound kernels (EmbeddingBag, dot interaction),
// reported in bytes/s, and the in-place embedding kernels on rows outside the
// caches next to a plain random-row read-modify-write of the same rows
// (BM_InPlaceRows: compare their rows/s), and the text model's data phase
// next to the same bytes read in sequence (BM_DataPhase: records/s; the
// libsvm shape too), and the MLP's pixels widened from their bytes next to
// a copy of the floats they become (BM_BytesToUnitFloats).
//
//   build/bench/core/model/dense_benchmark --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <sys/mman.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/huge_page_allocator.h"
#include "core/base/prefetch.h"
#include "core/base/row_bound.h"
#include "core/data/data_kernels.h"
#include "core/data/dataset.h"
#include "core/data/prefetch_burst.h"
#include "core/model/hogwild_kernels.h"
#include "core/model/layers.h"
#include "core/model/model.h"
#include "core/model/sparse_layers.h"
#include "oneapi/dnnl/dnnl.h"

namespace shardwild {
namespace {

// The bound: a square sgemm, single-threaded as a worker's primitives run.
void BM_Sgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  for (auto _ : state) {
    dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Sgemm)->ArgName("size")->Arg(256)->Arg(1024);

// One Dense layer, forward + backward, at the default model's shapes.
void BM_DenseForwardBackward(benchmark::State& state) {
  const int64_t batch = state.range(0), in = state.range(1), out = state.range(2);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::vector<float> x(batch * in, 0.1f), y(batch * out), w(in * out, 0.01f), b(out), dy(batch * out, 0.01f),
      dx(batch * in), dw(in * out), db(out);
  DenseLayer::Buffers buf{x.data(), y.data(), w.data(), b.data(), dy.data(), dx.data(), dw.data(), db.data()};
  auto layer = DenseLayer::Create(engine, batch, in, out, Activation::kRelu, buf);
  if (!layer.ok()) {
    state.SkipWithError(std::string(layer.status().message()).c_str());
    return;
  }
  for (auto _ : state) {
    (*layer)->Forward(stream);
    (*layer)->Backward(stream);
  }
  state.counters["FLOP/s"] = benchmark::Counter((*layer)->ForwardFlops() + (*layer)->BackwardFlops(),
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DenseForwardBackward)->ArgNames({"batch", "in", "out"})->Args({128, 784, 256})->Args({128, 256, 128});

// The default MLP's full step (forward, loss, backward), no store.
void BM_MlpStep(benchmark::State& state) {
  const int64_t batch = state.range(0);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  ModelOptions opts;
  opts.layers = {{"dense", 256, Activation::kRelu}, {"dense", 128, Activation::kRelu}, {"dense", 10, Activation::kNone}};
  Dataset data;
  data.count = batch;
  data.dense_dim = 784;
  data.num_classes = 10;
  data.dense.assign(batch * 784, 0.5f);
  for (int64_t i = 0; i < batch; ++i) data.labels.push_back(static_cast<int32_t>(i % 10));
  auto mlp = Model::Create(opts, DataShape::Of(data), batch, engine, 1);
  if (!mlp.ok()) {
    state.SkipWithError(std::string(mlp.status().message()).c_str());
    return;
  }
  (*mlp)->LoadRange(data, 0, batch);
  for (auto _ : state) {
    (*mlp)->Forward(/*training=*/true, stream);
    benchmark::DoNotOptimize((*mlp)->Backward(batch, stream));
  }
  state.counters["FLOP/s"] = benchmark::Counter((*mlp)->ForwardFlops() + (*mlp)->BackwardFlops(),
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["samples/s"] = benchmark::Counter(batch, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MlpStep)->ArgName("batch")->Arg(128)->Arg(256);

// Bags of `bag` ids each, every row pulled for the batch (distinct rows, as
// in the model's pulled-rows buffer). Bytes: the rows read and the pooled
// output written (forward), the pooled gradient read and the row gradients
// written (backward).
struct BagData {
  int64_t dim, bag, batch;
  std::vector<float> rows, out, drows;
  std::vector<int64_t> offsets;
  BagData(int64_t d, int64_t b, int64_t n)
      : dim(d), bag(b), batch(n), rows(n * b * d, 0.5f), out(n * d, 0.0f), drows(n * b * d), offsets(n + 1) {
    for (int64_t i = 0; i <= n; ++i) offsets[i] = i * b;
  }
  int64_t Bytes() const { return static_cast<int64_t>((rows.size() + out.size()) * sizeof(float)); }
};

void BM_EmbeddingBagSum(benchmark::State& state) {
  BagData d(state.range(0), state.range(1), state.range(2));
  for (auto _ : state) {
    EmbeddingBagForward(d.rows.data(), d.dim, d.offsets.data(), nullptr, d.batch, Pooling::kSum, d.out.data(), d.dim);
    benchmark::DoNotOptimize(d.out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * d.Bytes());
  state.SetItemsProcessed(state.iterations() * d.batch * d.bag);  // ids pooled
}
BENCHMARK(BM_EmbeddingBagSum)
    ->ArgNames({"dim", "bag", "batch"})
    ->Args({16, 1, 2048})
    ->Args({16, 8, 2048})
    ->Args({64, 1, 2048})
    ->Args({64, 32, 256});

void BM_EmbeddingBagSumBackward(benchmark::State& state) {
  BagData d(state.range(0), state.range(1), state.range(2));
  for (auto _ : state) {
    EmbeddingBagBackward(d.out.data(), d.dim, d.dim, d.offsets.data(), nullptr, d.batch, d.batch, Pooling::kSum,
                         d.drows.data());
    benchmark::DoNotOptimize(d.drows.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * d.Bytes());
  state.SetItemsProcessed(state.iterations() * d.batch * d.bag);
}
BENCHMARK(BM_EmbeddingBagSumBackward)->ArgNames({"dim", "bag", "batch"})->Args({16, 1, 2048})->Args({64, 32, 256});

// DLRM's interaction: n vectors of width d per sample (the Criteo model: the
// bottom output and 26 embeddings, d 16), the dense vector kept. Bytes: z
// read and the interaction written (forward); z and the output gradient
// read and dz written (backward).
void BM_DotInteraction(benchmark::State& state) {
  const int64_t n = state.range(0), d = state.range(1), batch = state.range(2);
  const int64_t width = DotInteractionWidth(n, d, /*with_first=*/true);
  std::vector<float> z(batch * n * d, 0.25f), out(batch * width);
  for (auto _ : state) {
    DotInteractionForward(z.data(), batch, n, d, /*with_first=*/true, out.data(), width);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>((z.size() + out.size()) * sizeof(float)));
  state.SetItemsProcessed(state.iterations() * batch);  // samples
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * batch * d * (n * (n - 1) / 2), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DotInteraction)->ArgNames({"n", "d", "batch"})->Args({27, 16, 2048})->Args({9, 64, 2048});

void BM_DotInteractionBackward(benchmark::State& state) {
  const int64_t n = state.range(0), d = state.range(1), batch = state.range(2);
  const int64_t width = DotInteractionWidth(n, d, /*with_first=*/true);
  std::vector<float> z(batch * n * d, 0.25f), dout(batch * width, 0.5f), dz(batch * n * d);
  for (auto _ : state) {
    DotInteractionBackward(z.data(), dout.data(), width, batch, n, d, /*with_first=*/true, dz.data());
    benchmark::DoNotOptimize(dz.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() *
                          static_cast<int64_t>((2 * z.size() + dout.size()) * sizeof(float)));
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["FLOP/s"] =
      benchmark::Counter(4.0 * batch * d * (n * (n - 1) / 2), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DotInteractionBackward)->ArgNames({"n", "d", "batch"})->Args({27, 16, 2048})->Args({9, 64, 2048});

// The in-place embedding path of a DLRM step (Model::Forward's pooling and
// the fused backward and SGD, reading the store's rows where they lie): 26
// lookups of 128 one-id bags a step into z's rows of 27 vectors, over one
// array of `rows` rows (256 MB: outside any cache), uniform random ids, a new
// step's ids each iteration. The bound is RewriteRows (core/base/row_bound.h,
// the loop `shardwild bench` measures its bound with) over the same step's
// rows, prefetching 16 rows ahead as the kernels do. Args: dim, rows, what (0
// the forward's pooling, 1 the fused backward and SGD, 2 the bound).
// Counter: rows/s.
constexpr int64_t kLookups = 26, kBags = 128, kStreamSteps = 64, kKernelAhead = 16;

struct InPlaceRows {
  int64_t dim = 0, rows = 0;
  float* base = nullptr;
  std::vector<std::vector<float*>> addresses;  // [step * kLookups + lookup][bag]
  std::vector<std::vector<char*>> step_rows;   // [step]: its lookups' rows, in order (the bound's)
  std::vector<int64_t> offsets;
  std::vector<float> z;
  InPlaceRows(int64_t d, int64_t n) : dim(d), rows(n), offsets(kBags + 1), z(kBags * (kLookups + 1) * d, 0.5f) {
    void* p = mmap(nullptr, Bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return;
    base = static_cast<float*>(p);
    std::fill_n(base, rows * dim, 0.01f);
    std::mt19937_64 rng(7);
    step_rows.resize(kStreamSteps);
    for (int64_t i = 0; i < kStreamSteps * kLookups; ++i) {
      std::vector<float*> bags(kBags);
      for (float*& row : bags) {
        row = base + static_cast<int64_t>(rng() % static_cast<uint64_t>(rows)) * dim;
        step_rows[i / kLookups].push_back(reinterpret_cast<char*>(row));
      }
      addresses.push_back(std::move(bags));
    }
    for (int64_t b = 0; b <= kBags; ++b) offsets[b] = b;
  }
  ~InPlaceRows() {
    if (base != nullptr) munmap(base, Bytes());
  }
  InPlaceRows(const InPlaceRows&) = delete;
  InPlaceRows& operator=(const InPlaceRows&) = delete;
  size_t Bytes() const { return static_cast<size_t>(rows * dim) * sizeof(float); }
};

void BM_InPlaceRows(benchmark::State& state) {
  const int64_t dim = state.range(0), what = state.range(2);
  InPlaceRows d(dim, state.range(1));
  if (d.base == nullptr) {
    state.SkipWithError("mmap failed");
    return;
  }
  const int64_t zw = (kLookups + 1) * dim;
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  int64_t step = 0;
  for (auto _ : state) {
    if (what == 2) {
      const std::vector<char*>& rows = d.step_rows[step];
      const int64_t n = static_cast<int64_t>(rows.size());
      RewriteRows(rows.data(), n, 0, n, dim, std::min(row_bytes, 16 * kCacheLineBytes), kKernelAhead);
    } else {
      for (int64_t l = 0; l < kLookups; ++l) {
        std::vector<float*>& rows = d.addresses[step * kLookups + l];
        float* z = d.z.data() + (l + 1) * dim;
        if (what == 0) {
          HogwildEmbeddingBagForward(rows.data(), dim, d.offsets.data(), nullptr, kBags, Pooling::kSum, z, zw);
        } else {
          HogwildEmbeddingBagSgd(rows.data(), dim, d.offsets.data(), nullptr, kBags, kBags, Pooling::kSum, z, zw,
                                 /*scale=*/1.0f, /*lr=*/1e-6f);
        }
      }
    }
    benchmark::ClobberMemory();
    step = (step + 1) % kStreamSteps;
  }
  state.counters["rows/s"] = benchmark::Counter(kLookups * kBags, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(what == 0 ? "pooling" : what == 1 ? "fused sgd" : "bound: RewriteRows");
}
BENCHMARK(BM_InPlaceRows)
    ->ArgNames({"dim", "rows", "what"})
    ->ArgsProduct({{16}, {1 << 22}, {0, 1, 2}})
    ->ArgsProduct({{64}, {1 << 20}, {0, 1, 2}});

// What asking for lines a step ahead can save on this machine: 32 random
// lines of a 128 MiB array (a text batch's 16 records of 2 lines), as
// what 0: 32 independent loads, nothing asked for before (their misses
// overlap); 1: the 32 prefetches (PrefetchLine, as PrefetchBatch issues
// them) alone, timed as they are issued; 2: the 32 loads a step after their
// prefetches, with (untimed) a dependent chain of 3000 multiply-adds between,
// as a step's compute. A prefetch that costs nothing to issue makes 1 and 2
// small beside 0. (On the 2-core KVM guest, 2026-11-28, with a build beside
// it: 0 740 ns, 1 300 ns, 2 140 ns; a standalone loop gave 750, 330-470 and
// 170-240; each figure includes one clock read of 34 ns. Issuing the
// prefetch of a line outside the caches costs 8-14 ns there, about half of
// an overlapped miss, which is why the text config's data phase follows the
// lines a batch reads even when they were asked for.) 3: what 1 with the
// pages' address translations warm: each line loaded and flushed from the
// caches (untimed) before its prefetch, so the prefetch still misses but
// finds its page in the TLB. 1 against 3 is what translating a random
// address costs a prefetch here; 3 less a clock read is the limit on misses
// in flight (32 lines, more than L1 tracks at once). On that guest: 1 264-273
// ns, 3 183-184 ns, so about a third of the batch's prefetch cost is the
// translations and the rest the misses in flight (a standalone loop: 8 random
// prefetches, fewer than that limit, 308 ns cold and 37 ns warm).
// Counter: lines/s.
void BM_PrefetchLines(benchmark::State& state) {
  const int64_t what = state.range(0);
  constexpr size_t kBytes = size_t{128} << 20, kLines = kBytes / 64;
  constexpr int kBatchLines = 32, kBatches = 1 << 14;
  HugePageVector<char> a(kBytes, 1);
  std::mt19937_64 rng(5);
  std::vector<size_t> at(static_cast<size_t>(kBatches + 1) * kBatchLines);
  for (size_t& x : at) x = (rng() % kLines) * 64;
  int64_t b = 0;
  uint64_t sink = 0;
  float spin = 1.0f;
  for (auto _ : state) {
    const size_t* cur = at.data() + b * kBatchLines;
    const size_t* next = cur + kBatchLines;
    if (what == 2) {
      for (int i = 0; i < kBatchLines; ++i) PrefetchLine(a.data() + cur[i]);
      for (int i = 0; i < 3000; ++i) spin = spin * 0.999f + 0.5f;
      benchmark::DoNotOptimize(spin);
    }
    if (what == 3) {
#if defined(__x86_64__)
      for (int i = 0; i < kBatchLines; ++i) sink += static_cast<unsigned char>(a[next[i]]);
      benchmark::DoNotOptimize(sink);
      for (int i = 0; i < kBatchLines; ++i) _mm_clflush(a.data() + next[i]);
      _mm_mfence();
#else
      state.SkipWithError("x86-64 only (clflush)");
      return;
#endif
    }
    const auto start = std::chrono::steady_clock::now();
    if (what == 1 || what == 3) {
      for (int i = 0; i < kBatchLines; ++i) PrefetchLine(a.data() + next[i]);
    } else {
      for (int i = 0; i < kBatchLines; ++i) sink += static_cast<unsigned char>(a[cur[i]]);
    }
    benchmark::DoNotOptimize(sink);
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    b = (b + 1) % kBatches;
  }
  state.counters["lines/s"] = benchmark::Counter(kBatchLines, benchmark::Counter::kIsIterationInvariantRate);
  const char* labels[] = {"loads, not asked for", "prefetches issued", "loads, asked for a step ahead",
                          "prefetches issued, translations warm"};
  state.SetLabel(labels[what]);
}
BENCHMARK(BM_PrefetchLines)->ArgName("what")->DenseRange(0, 3)->UseManualTime();

// Whether prefetches issued in a burst bring their lines in: `lines` random
// lines of 128 MB (huge pages) are flushed, then either asked for with
// PrefetchLine all at once (what 1), or one every ~40 ns (what 2: the issue
// spaced by a dependent chain of multiply-adds), or not at all (what 0, the
// bound: the same loads cold); after a 20 us spin, the timed part loads them
// (independent loads, so their misses overlap). On a 2-core AMD EPYC KVM guest
// (2026-11-28) bursts past about 8 lines were mostly dropped: 192 lines
// loaded in 2.8 us after a burst, 3.3 us cold, 0.45 us after spaced prefetches.
// On a later host of that type (the same day), bursts up to 48 lines arrived
// (34 ns against 325 cold), 64 partly (98 ns; 33 after spaced prefetches,
// 472 cold) and 192 mostly not (655 ns; 89 spaced, 1090 cold): the worker
// asks for a batch in parts of about a burst, which it measures
// (core/data/prefetch_burst.h; Model::RecordsPerPrefetchBurst).
void BM_PrefetchBurst(benchmark::State& state) {
#if defined(__x86_64__)
  const int64_t what = state.range(0);
  const int64_t lines = state.range(1);
  constexpr size_t kBytes = size_t{128} << 20, kLines = kBytes / 64;
  HugePageVector<char> a(kBytes, 1);
  std::mt19937_64 rng(9);
  std::vector<size_t> at(static_cast<size_t>(lines));
  uint64_t sink = 0;
  float spin = 1.0f;
  for (auto _ : state) {
    for (size_t& x : at) x = (rng() % kLines) * 64;
    for (size_t x : at) _mm_clflush(a.data() + x);
    _mm_mfence();
    for (size_t x : at) {
      if (what == 0) break;
      PrefetchLine(a.data() + x);
      if (what == 2) {
        for (int i = 0; i < 40; ++i) spin = spin * 0.999f + 0.5f;
        benchmark::DoNotOptimize(spin);
      }
    }
    const auto spin_start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - spin_start < std::chrono::microseconds(20)) {
    }
    const auto start = std::chrono::steady_clock::now();
    for (size_t x : at) sink += static_cast<unsigned char>(a[x]);
    benchmark::DoNotOptimize(sink);
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  state.counters["lines/s"] =
      benchmark::Counter(static_cast<double>(lines), benchmark::Counter::kIsIterationInvariantRate);
  const char* labels[] = {"loads cold (bound)", "loads after a burst of prefetches", "loads after spaced prefetches"};
  state.SetLabel(labels[what]);
#else
  state.SkipWithError("x86-64 only (clflush)");
#endif
}
// A fixed count: the untimed spin is most of an iteration.
BENCHMARK(BM_PrefetchBurst)
    ->ArgNames({"what", "lines"})
    ->ArgsProduct({{0, 1, 2}, {8, 32, 48, 64, 192}})
    ->Iterations(20000)
    ->UseManualTime();

// A data phase over packed records (outside the caches), in a shuffled
// order. shape 0: the text model's (configs/text_bow.yaml: batches of 16 of
// 1M records of 1..35 token ids, 18 on average; about 150 MB); 1: sparse
// logistic regression's (configs/sparse_logreg.yaml: batches of 64 of 1M
// libsvm records of 4..32 weighted ids, 18 on average, each id with its
// weight; about 200 MB); 2: Wide & Deep's (configs/ctr_wide_deep.yaml:
// batches of 256 of 400k Criteo records of 13 dense floats and 26
// categorical fields of one id each, 8% of them missing, as in the
// generated data; about 80 MB). what 0: LoadBatch alone, nothing asked for
// before; 1: as a worker runs it, PrefetchBatch of the next batch after
// LoadBatch, then (untimed) a dependent chain of multiply-adds that touches
// no memory, as a step's compute (1000 for text, about 1 us; 8000 for
// libsvm and Criteo); both calls timed. 2: the same batch loaded again
// (every line in L1, or L2 for Criteo's 48 KB), told it was asked for as a
// worker's steady steps are (not re-read first: what 0's Asked::kNo added
// TouchBatch and a second request to every load). 3, the bound: the same
// bytes (blocks and labels, and dense values kept apart from the blocks)
// copied from a sequential layout, as a data set already gathered in the
// epoch's order would be read. 4 and 5: what 1 with only its LoadBatch
// timed (4) or only its PrefetchBatch (5). layout 0: the packed blocks one
// after the other, each found through its start word; 1: as PackRecords
// chooses (text: 128-byte slots, the records of more than 30 ids after
// them; libsvm: 128-byte slots of coded weights, those of more than 30
// after them; Criteo: 192-byte slots of the one-id layout, the dense
// values in them).
//   shape 3: the default MLP's (configs/fashion_mnist_mlp.yaml: batches of
// 128 of 60,000 images of 784 pixels, each k / 255, kept as bytes: 47 MB;
// no ids, so layout 0 only). Its worker asks for the next batch after the
// dense push, which moves more than an L2 (AskNextBatchAfterPush), so
// here the untimed gap comes before the ask, not between the ask and the
// load: a read-modify-write of one byte in every line of 8 MB (the push's
// 7.5 MB: it leaves the model's input floats outside L2, as in a step).
// what 1 is then the ask and the load of the same batch, back to back, as
// the worker runs them; 4 and 5 time its load and its ask apart (the
// ask's prefetches stall once the core's line fill buffers are full, and
// its misses are still arriving when the load starts); 3, the
// bound, widens 128 consecutive images (a data set gathered in the epoch's
// order) into a buffer of the input's size after the same gap. The data
// phase of a step is what 1. Counter: records/s.
void BM_DataPhase(benchmark::State& state) {
  const int64_t what = state.range(0);
  const int64_t layout = state.range(1);
  const bool libsvm = state.range(2) == 1, criteo = state.range(2) == 2, images = state.range(2) == 3;
  const int64_t kRecords = images ? 60000 : criteo ? 400000 : 1000000;
  const int64_t kBatch = images ? 128 : criteo ? 256 : libsvm ? 64 : 16;
  const int spin_steps = libsvm || criteo ? 8000 : 1000;
  Dataset data;
  data.count = kRecords;
  data.num_classes = images ? 10 : libsvm || criteo ? 2 : 4;
  std::mt19937_64 rng(3);
  ModelOptions opts;
  if (images) {
    constexpr int kPixels = 784;
    data.dense_dim = kPixels;
    data.dense.resize(static_cast<size_t>(kRecords) * kPixels);
    for (int64_t r = 0; r < kRecords; ++r) {
      data.labels.push_back(static_cast<int32_t>(rng() % 10));
      // About half the pixels black, as in Fashion-MNIST.
      for (int i = 0; i < kPixels; ++i) {
        const uint64_t x = rng();
        data.dense[r * kPixels + i] = x % 2 == 0 ? 0.0f : static_cast<float>((x >> 8) % 256) / 255.0f;
      }
    }
    opts.layers = {{"dense", 10, Activation::kNone}};
  } else if (criteo) {
    constexpr int kDense = 13, kFields = 26;
    constexpr int64_t kRows = 1000000;
    data.dense_dim = kDense;
    for (int f = 0; f < kFields; ++f) {
      SparseField& field = data.fields.emplace_back();
      field.name = absl::StrCat("C", f + 1);
      field.offsets.push_back(0);
      opts.tables.push_back({field.name, kRows, 8, false, false, 0.001f});
      opts.sparse.push_back({field.name, field.name, Pooling::kSum, false});
    }
    for (int64_t r = 0; r < kRecords; ++r) {
      data.labels.push_back(static_cast<int32_t>(rng() % 4 == 0));
      for (int i = 0; i < kDense; ++i) data.dense.push_back(std::log1p(static_cast<float>(rng() % 1000)));
      for (SparseField& field : data.fields) {
        if (rng() % 100 >= 8) field.ids.push_back(rng());
        field.offsets.push_back(static_cast<int64_t>(field.ids.size()));
      }
    }
    opts.head = HeadType::kBinary;
    opts.layers = {{"dense", 1, Activation::kNone}};
  } else {
    SparseField f;
    f.name = libsvm ? "features" : "tokens";
    f.offsets.push_back(0);
    const int64_t rows = libsvm ? 1048576 : 2000000;
    for (int64_t r = 0; r < kRecords; ++r) {
      data.labels.push_back(static_cast<int32_t>(rng() % data.num_classes));
      const int64_t n =
          libsvm ? 4 + static_cast<int64_t>(rng() % 15 + rng() % 15) : 1 + static_cast<int64_t>(rng() % 35);
      for (int64_t i = 0; i < n; ++i) {
        f.ids.push_back(rng() % static_cast<uint64_t>(rows));
        if (libsvm) f.weights.push_back(static_cast<float>(rng() % 1000) / 1000.0f);
      }
      f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
    }
    data.fields.push_back(std::move(f));
    if (libsvm) {
      opts.head = HeadType::kBinary;
      opts.tables = {{"features", rows, 1, false, false, 0.0001f}};
      opts.sparse = {{"features", "features", Pooling::kSum, true}};
      opts.layers = {{"dense", 1, Activation::kNone}};
    } else {
      opts.tables = {{"tokens", rows, 64, false, false, 0.015625f}};
      opts.sparse = {{"tokens", "tokens", Pooling::kMean, true}};
      opts.layers = {{"dense", 4, Activation::kNone}};
    }
  }
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  auto m = Model::Create(opts, DataShape::Of(data), kBatch, engine, 1);
  if (!m.ok()) {
    state.SkipWithError(std::string(m.status().message()).c_str());
    return;
  }
  const std::optional<PackedRecords> packed = (*m)->PackRecords(data, layout == 0 ? 0 : Model::kAutoStride);
  if (!packed) {
    state.SkipWithError("the records were not packed");
    return;
  }
  std::vector<int32_t> order(kRecords);
  for (int64_t i = 0; i < kRecords; ++i) order[i] = static_cast<int32_t>(i);
  std::shuffle(order.begin(), order.end(), rng);
  const size_t batch_words = kBatch * (packed->words.size() / kRecords + 1);
  std::vector<uint64_t> copy(batch_words + kBatch);
  // The dense values where the blocks do not hold them.
  std::vector<float> dense_copy(packed->dense_in_block() ? 0 : static_cast<size_t>(kBatch * data.dense_dim));
  const int64_t batches = kRecords / kBatch - 1;
  int64_t b = 0;
  float spin = 1.0f;
  // The batch is asked for in one request: told LoadBatch it came whole
  // where it is this machine's burst's worth (MachinePrefetchBurst: text
  // where bursts hold 32 lines), else LoadBatch asks again (libsvm; text
  // where bursts hold fewer, which a worker asks for in two parts).
  const Model::Asked asked =
      kBatch <= (*m)->RecordsPerPrefetchBurst(&*packed, MachinePrefetchBurst().lines) ? Model::Asked::kInBursts
                                                                                       : Model::Asked::kYes;
  if (images) {
    // The push's footprint, touched line by line between the steps.
    std::vector<char> push(size_t{8} << 20, 1);
    std::vector<float> widened(static_cast<size_t>(kBatch * data.dense_dim));
    const int64_t values = kBatch * data.dense_dim;
    for (auto _ : state) {
      if (what != 2) {
        for (size_t i = 0; i < push.size(); i += 64) push[i] = static_cast<char>(push[i] + 1);
        benchmark::ClobberMemory();
      }
      const int32_t* records = order.data() + b * kBatch;
      const auto s0 = std::chrono::steady_clock::now();
      if (what == 3) {
        const int64_t first = (b * kBatch) % (kRecords - kBatch);
        BytesToUnitFloats(packed->dense_bytes.data() + first * data.dense_dim, widened.data(), values);
        std::memcpy(copy.data(), data.labels.data() + first, kBatch * sizeof(int32_t));
      } else if (what == 1 || what == 4 || what == 5) {
        (*m)->PrefetchBatch(data, records, kBatch, &*packed);
      }
      const auto s1 = std::chrono::steady_clock::now();
      if (what != 3) {
        (*m)->LoadBatch(data, records, kBatch, &*packed, what == 0 ? Model::Asked::kNo : asked);
      }
      benchmark::ClobberMemory();
      const auto s2 = std::chrono::steady_clock::now();
      state.SetIterationTime(std::chrono::duration<double>(what == 4 ? s2 - s1 : what == 5 ? s1 - s0 : s2 - s0).count());
      if (what != 2) b = (b + 1) % batches;
    }
    benchmark::DoNotOptimize(push.data());
    state.counters["records/s"] = benchmark::Counter(kBatch, benchmark::Counter::kIsIterationInvariantRate);
    const char* labels[] = {"load, cold",
                            "ask + load, after an 8 MB push",
                            "load, in L2",
                            "bound: consecutive images widened, after an 8 MB push",
                            "ask + load, after an 8 MB push: the load's part",
                            "ask + load, after an 8 MB push: the ask's part"};
    state.SetLabel(absl::StrCat("images, ", labels[what]));
    return;
  }
  if (what == 1 || what >= 4) (*m)->PrefetchBatch(data, order.data(), kBatch, &*packed);
  for (auto _ : state) {
    if (what >= 4) {
      // What 1 does, one of its two calls timed.
      const int32_t* records = order.data() + b * kBatch;
      const auto s0 = std::chrono::steady_clock::now();
      (*m)->LoadBatch(data, records, kBatch, &*packed, asked);
      const auto s1 = std::chrono::steady_clock::now();
      (*m)->PrefetchBatch(data, records + kBatch, kBatch, &*packed);
      const auto s2 = std::chrono::steady_clock::now();
      state.SetIterationTime(std::chrono::duration<double>(what == 4 ? s1 - s0 : s2 - s1).count());
      for (int i = 0; i < spin_steps; ++i) spin = spin * 0.999f + 0.5f;
      benchmark::DoNotOptimize(spin);
      b = (b + 1) % batches;
      continue;
    }
    const int32_t* records = order.data() + b * kBatch;
    const auto start = std::chrono::steady_clock::now();
    if (what == 3) {
      // One batch's worth of a sequential stream, new lines each time.
      const uint64_t* from = packed->words.data() + (b * batch_words) % (packed->words.size() - batch_words);
      std::memcpy(copy.data(), from, batch_words * sizeof(uint64_t));
      std::memcpy(copy.data() + batch_words, data.labels.data() + b * kBatch, kBatch * sizeof(int32_t));
      if (!dense_copy.empty()) {
        std::memcpy(dense_copy.data(), data.dense.data() + (b * kBatch * data.dense_dim) % (data.dense.size() - dense_copy.size()),
                    dense_copy.size() * sizeof(float));
      }
    } else {
      (*m)->LoadBatch(data, records, kBatch, &*packed, what == 0 ? Model::Asked::kNo : asked);
    }
    if (what == 1) (*m)->PrefetchBatch(data, records + kBatch, kBatch, &*packed);
    benchmark::ClobberMemory();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (what == 1) {
      for (int i = 0; i < spin_steps; ++i) spin = spin * 0.999f + 0.5f;
      benchmark::DoNotOptimize(spin);
    }
    if (what != 2) b = (b + 1) % batches;
  }
  state.counters["records/s"] = benchmark::Counter(kBatch, benchmark::Counter::kIsIterationInvariantRate);
  const char* labels[] = {"load, cold",
                          "prefetch a step ahead + load",
                          "load, in L1",
                          "bound: sequential copy",
                          "load, asked for a step ahead",
                          "prefetch a step ahead"};
  state.SetLabel(absl::StrCat(criteo ? "criteo, " : libsvm ? "libsvm, " : "text, ", labels[what], ", ",
                              packed->stride_words > 0 ? absl::StrCat(packed->stride_words * 8, "-byte slots")
                                                       : std::string("blocks one after the other")));
}
// A batch of the default MLP's images (128 of 784 pixels, 100 KB of bytes
// in, 400 KB of floats out, both in L2) widened to unit floats on each
// target the CPU has (what 0), next to the bound (what 1): a copy of the
// same floats, what the batch gather did before the pixels were kept as
// bytes. Counter: the floats' bytes written per second.
void BM_BytesToUnitFloats(benchmark::State& state, const std::string& target, bool bound) {
  std::optional<ScopedHogwildKernelTarget> scoped;  // the copy has no target
  if (!bound && !scoped.emplace(target).ok()) {
    state.SkipWithError("target not supported");
    return;
  }
  constexpr int64_t kValues = 128 * 784;
  std::vector<uint8_t> bytes(kValues);
  for (int64_t i = 0; i < kValues; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + i / 256);
  std::vector<float> floats(kValues), out(kValues);
  BytesToUnitFloats(bytes.data(), floats.data(), kValues);
  for (auto _ : state) {
    if (bound) {
      std::memcpy(out.data(), floats.data(), kValues * sizeof(float));
    } else {
      BytesToUnitFloats(bytes.data(), out.data(), kValues);
    }
    benchmark::ClobberMemory();
  }
  state.counters["bytes/s"] =
      benchmark::Counter(static_cast<double>(kValues * sizeof(float)), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(bound ? std::string("bound: memcpy of the floats") : target);
}
[[maybe_unused]] const bool kBytesRegistered = [] {
  for (const std::string& target : HogwildKernelTargets()) {
    benchmark::RegisterBenchmark(("BM_BytesToUnitFloats/" + target).c_str(), BM_BytesToUnitFloats, target, false);
  }
  benchmark::RegisterBenchmark("BM_BytesToUnitFloats/bound", BM_BytesToUnitFloats, std::string(), true);
  return true;
}();

// sparse_logreg.yaml's batch decoded from its slots in L1 on each target
// the CPU has (DecodeCodedSlots: 64 records of 128-byte slots, 4 to 32
// coded entries each, 18 on average, ids of 20 bits and weights of 3
// decimals), next to the bound (what 1): the bytes it writes (a slot's 30
// ids and weights a record, each record's from the last one's count on)
// copied from a buffer of decoded entries, a memcpy a record. Counter:
// records/s. The data phase's share of the trainer's step is what this
// moves (BM_DataPhase what:2 shape:1 is the same work through the model).
void BM_DecodeCodedSlots(benchmark::State& state, const std::string& target, bool bound) {
  std::optional<ScopedHogwildKernelTarget> scoped;  // the copy has no target
  if (!bound && !scoped.emplace(target).ok()) {
    state.SkipWithError("target not supported");
    return;
  }
  constexpr int64_t kBatch = 64, kStrideWords = 16, kEntries = 2 * (kStrideWords - 1), kIdBits = 20;
  std::mt19937_64 rng(7);
  std::vector<uint64_t> words(kBatch * kStrideWords);
  std::vector<int32_t> records(kBatch);
  int64_t total = 0;
  for (int64_t s = 0; s < kBatch; ++s) {
    records[s] = static_cast<int32_t>((s * 37) % kBatch);  // scattered over the batch's slots
    const uint32_t count = 4 + static_cast<uint32_t>(rng() % 15 + rng() % 15);
    total += count;
    uint64_t* slot = words.data() + s * kStrideWords;
    slot[0] = count | uint64_t{static_cast<uint32_t>(rng() % 2)} << 32;
    uint32_t* entries = reinterpret_cast<uint32_t*>(slot + 1);
    for (uint32_t i = 0; i < count; ++i) {
      entries[i] = static_cast<uint32_t>(rng() % (1u << kIdBits)) | static_cast<uint32_t>(rng() % 1000) << kIdBits;
    }
  }
  const int64_t room = total + kEntries;
  std::vector<uint64_t> ids(room), decoded_ids(room);
  std::vector<float> weights(room), decoded_weights(room);
  std::vector<int32_t> labels(kBatch);
  std::vector<int64_t> offsets(kBatch + 1, 0);
  SlotBatch a{.words = words.data(),
              .stride_words = kStrideWords,
              .overflow_word = ~uint64_t{0},
              .records = records.data(),
              .n = kBatch,
              .entries = kEntries,
              .id_bits = kIdBits,
              .unit = 0.001,
              .ids = ids.data(),
              .weights = weights.data(),
              .room = room,
              .labels = labels.data(),
              .label_offsets = nullptr,
              .offsets = offsets.data()};
  // The bound's source: the batch decoded once, each record's entries
  // copied as the kernel writes them (a slot's worth from its count on).
  int64_t at = 0;
  DecodeCodedSlots(a, 0, &at);
  decoded_ids = ids;
  decoded_weights = weights;
  for (auto _ : state) {
    if (bound) {
      for (int64_t s = 0; s < kBatch; ++s) {
        const int64_t from = offsets[s];
        const int64_t n = std::min<int64_t>(kEntries, room - from);
        std::memcpy(ids.data() + from, decoded_ids.data() + from, n * sizeof(uint64_t));
        std::memcpy(weights.data() + from, decoded_weights.data() + from, n * sizeof(float));
        labels[s] = static_cast<int32_t>(words[records[s] * kStrideWords] >> 32);
      }
    } else {
      int64_t count = 0;
      DecodeCodedSlots(a, 0, &count);
      benchmark::DoNotOptimize(count);
    }
    benchmark::ClobberMemory();
  }
  state.counters["records/s"] = benchmark::Counter(kBatch, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(bound ? std::string("bound: the same bytes copied, a memcpy a record") : target);
}
[[maybe_unused]] const bool kDecodeRegistered = [] {
  for (const std::string& target : HogwildKernelTargets()) {
    benchmark::RegisterBenchmark(("BM_DecodeCodedSlots/" + target).c_str(), BM_DecodeCodedSlots, target, false);
  }
  benchmark::RegisterBenchmark("BM_DecodeCodedSlots/bound", BM_DecodeCodedSlots, std::string(), true);
  return true;
}();

BENCHMARK(BM_DataPhase)
    ->ArgNames({"what", "layout", "shape"})
    ->ArgsProduct({{0, 1, 2, 3, 4, 5}, {0, 1}, {0, 1, 2}})
    ->ArgsProduct({{0, 1, 2, 3, 4, 5}, {0}, {3}})
    ->UseManualTime();

}  // namespace
}  // namespace shardwild
