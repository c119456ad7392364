// Drawing a static table's initial rows (UniformRowValues, the inner loop of
// creating a table) next to the bound measured in the same run: a plain fill
// of the same bytes with one value (std::fill_n, what writing the rows costs
// with nothing to compute). Both write rows of `dim` floats one after another
// over a region of `bytes` (its pages touched before timing), in cache
// (256 KiB) and far outside it (256 MiB), per dispatch target.
//
//   build/bench/ps_shm/init_benchmark --benchmark_counters_tabular=true
//
// Args: dim, bytes, what (0 the kernel a call a row, 2 the rows at once as a
// static table's creation draws them, 1 the fill). Counters: floats/s,
// bytes/s. Compare the kernel's bytes/s with the fill's at the same bytes.
//
// BM_CreateStore is the whole of creating a store of one static table (rows
// of 16 floats, SGD: 64 bytes a row, as configs/ctr_dlrm.yaml's), as a
// one-process job does (private memory, huge pages where granted, every
// hardware thread reserving and drawing): ShmParamStore::Create, timed,
// next to BM_FreshMemory, its bound in the same run: as many bytes of
// never-touched memory mapped, advised onto huge pages and reserved with
// MADV_POPULATE_WRITE 4 MiB at a time on as many threads, with nothing
// drawn. Both free their memory between iterations and, with `settle_ms`
// above 0, wait that long (untimed) first: on a virtual machine whose guest
// reports its free pages to the host (virtio-balloon free page reporting,
// which reports what was freed 2 s or more ago), the host takes those pages
// back, and the next first touch of each 4 KiB of them is a fault in the
// host: what a store created on a machine that has been quiet pays.
//
//   build/bench/ps_shm/init_benchmark --benchmark_filter='Create|Fresh' --benchmark_counters_tabular=true
//
// Args: rows, settle_ms (and huge: 1 advised onto huge pages, 0 not, for
// the bound). Counters: bytes/s (of the table's rows, or the bytes reserved).
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "bounds.h"
#include "core/model/hogwild_kernels.h"
#include "ps_shm/init_kernels.h"
#include "ps_shm/shm_store.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace shardwild {
namespace {

void BM_InitRows(benchmark::State& state, const std::string& target) {
  const int64_t dim = state.range(0), bytes = state.range(1), what = state.range(2);
  ScopedHogwildKernelTarget scoped(target);
  if (!scoped.ok()) {
    state.SkipWithError("target not supported here");
    return;
  }
  bench::Mapping m(static_cast<size_t>(bytes));
  if (m.data() == nullptr) {
    state.SkipWithError("mmap failed");
    return;
  }
  auto* out = static_cast<float*>(m.data());
  const int64_t rows = bytes / (dim * static_cast<int64_t>(sizeof(float)));
  std::fill_n(out, rows * dim, 0.0f);  // every page faulted in before timing
  uint64_t key = 0x0123456789abcdefULL;
  for (auto _ : state) {
    if (what == 2) {
      UniformRowsValues(key, 0, rows, dim, dim, -0.05f, 0.1f, out);
      benchmark::ClobberMemory();
      ++key;
      continue;
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (what == 0) {
        UniformRowValues(key + static_cast<uint64_t>(r), 0, dim, -0.05f, 0.1f, out + r * dim);
      } else {
        std::fill_n(out + r * dim, dim, 0.01f);
      }
    }
    benchmark::ClobberMemory();
    ++key;
  }
  state.counters["floats/s"] = benchmark::Counter(static_cast<double>(rows * dim), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes/s"] = benchmark::Counter(static_cast<double>(rows * dim * 4), benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1024);
  state.SetLabel(what == 0 ? "UniformRowValues, a call a row" : what == 2 ? "UniformRowsValues, the rows at once" : "bound: fill");
}

constexpr int64_t kRowBytes = 16 * sizeof(float);

// Waits `ms` with the timer paused (the host's reclaim of what the last
// iteration freed, where the guest reports free pages).
void Settle(benchmark::State& state, int64_t ms) {
  if (ms <= 0) return;
  state.PauseTiming();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  state.ResumeTiming();
}

void BM_CreateStore(benchmark::State& state) {
  const int64_t rows = state.range(0), settle_ms = state.range(1);
  OpenStoreOptions o;
  o.store.memory_kind = StoreMemoryKind::kPrivate;
  o.others_attach = false;
  o.optimizer.type = OptimizerType::kSgd;
  o.init_threads = 0;  // every hardware thread
  TableSpec t;
  t.name = "bench";
  t.dim = 16;
  t.capacity = rows;
  o.tables.push_back(t);
  // Unsettled, every iteration finds the memory the last one freed still
  // the guest's: so does the first, after one untimed creation.
  if (settle_ms <= 0) (void)ShmParamStore::Create(o, {});
  for (auto _ : state) {
    Settle(state, settle_ms);
    absl::StatusOr<std::unique_ptr<ShmParamStore>> store = ShmParamStore::Create(o, {});
    if (!store.ok()) {
      state.SkipWithError(std::string(store.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(store->get());
    state.PauseTiming();
    store->reset();
    state.ResumeTiming();
  }
  state.counters["bytes/s"] = benchmark::Counter(static_cast<double>(rows * kRowBytes),
                                                 benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1024);
  state.SetLabel("ShmParamStore::Create");
}

void BM_FreshMemory(benchmark::State& state) {
  const int64_t rows = state.range(0), settle_ms = state.range(1), huge = state.range(2);
  const auto bytes = static_cast<size_t>(rows * kRowBytes);
  constexpr size_t kPiece = size_t{4} << 20;
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  // Maps the bytes and reserves them; null if mmap failed.
  auto reserve = [&]() -> void* {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    if (huge != 0) madvise(p, bytes, MADV_HUGEPAGE);
    // Each thread a contiguous share of whole pieces, as the store's shards
    // are reserved.
    const size_t pieces = (bytes + kPiece - 1) / kPiece;
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) {
      pool.emplace_back([=] {
        for (size_t k = pieces * i / threads; k < pieces * (i + 1) / threads; ++k) {
          char* at = static_cast<char*>(p) + k * kPiece;
          const size_t len = std::min(kPiece, bytes - k * kPiece);
          // Touched by hand where the kernel has no MADV_POPULATE_WRITE.
          if (madvise(at, len, MADV_POPULATE_WRITE) != 0) {
            for (size_t b = 0; b < len; b += 4096) at[b] = 0;
          }
        }
      });
    }
    for (std::thread& th : pool) th.join();
    return p;
  };
  if (settle_ms <= 0) {  // as BM_CreateStore: the first iteration's memory the guest's too
    if (void* p = reserve()) munmap(p, bytes);
  }
  for (auto _ : state) {
    Settle(state, settle_ms);
    void* p = reserve();
    if (p == nullptr) {
      state.SkipWithError("mmap failed");
      return;
    }
    benchmark::ClobberMemory();
    state.PauseTiming();
    munmap(p, bytes);
    state.ResumeTiming();
  }
  state.counters["bytes/s"] = benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1024);
  state.SetLabel(huge != 0 ? "bound: fresh memory, huge pages" : "bound: fresh memory, 4 KiB pages");
}

// 8M rows (512 MiB), and configs/ctr_dlrm.yaml's 26M (1.6 GiB); settled
// 10 s: the guest reports what was freed in rounds 2 s apart, a share of its
// free pages each, so a few seconds leave part of the last iteration's memory
// still the guest's.
constexpr int64_t kStoreRows = int64_t{8} << 20, kDlrmRows = 26'050'000;
BENCHMARK(BM_CreateStore)
    ->ArgNames({"rows", "settle_ms"})
    ->Args({kStoreRows, 0})
    ->Args({kDlrmRows, 0})
    ->Args({kDlrmRows, 10'000})
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FreshMemory)
    ->ArgNames({"rows", "settle_ms", "huge"})
    ->Args({kStoreRows, 0, 1})
    ->Args({kDlrmRows, 0, 1})
    ->Args({kDlrmRows, 10'000, 1})
    ->Args({kDlrmRows, 10'000, 0})
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

bool RegisterAll() {
  for (const std::string& target : HogwildKernelTargets()) {
    for (int64_t what : {0, 2, 1}) {
      // The fill does not depend on the target: once, under the best one.
      if (what == 1 && target != HogwildKernelTargets().front()) continue;
      benchmark::RegisterBenchmark(("BM_InitRows/" + target).c_str(), BM_InitRows, target)
          ->ArgNames({"dim", "bytes", "what"})
          ->Args({16, int64_t{256} << 10, what})
          ->Args({16, int64_t{256} << 20, what})
          ->Args({64, int64_t{256} << 20, what});
    }
  }
  return true;
}
const bool g_registered = RegisterAll();

}  // namespace
}  // namespace shardwild
