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
// never-touched private memory reserved as the store reserves its own
// (ShmSegment::CreatePrivate and Reserve, MADV_POPULATE_WRITE 4 MiB at a
// time on as many threads), with nothing drawn. Both free their memory between iterations and, with `settle_ms`
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

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <memory>
#include <thread>

#include "bounds.h"
#include "core/base/parallel_for.h"
#include "core/base/status.h"
#include "core/model/hogwild_kernels.h"
#include "ps_shm/init_kernels.h"
#include "ps_shm/shm_segment.h"
#include "ps_shm/shm_store.h"

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
  constexpr size_t kPiece = size_t{4} << 20;  // as the store reserves its shards
  const auto pieces = static_cast<int64_t>((bytes + kPiece - 1) / kPiece);
  // The store's own memory and reservation (ShmSegment::CreatePrivate, then
  // Reserve a piece at a time on every hardware thread), with nothing drawn.
  auto reserve = [&]() -> absl::StatusOr<std::unique_ptr<ShmSegment>> {
    absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::CreatePrivate("fresh_memory", bytes, huge != 0);
    if (!seg.ok()) return seg.status();
    const ShmSegment& s = **seg;
    SW_RETURN_IF_ERROR(ParallelForStatus(0, pieces, [&](int64_t k) {
      const size_t at = static_cast<size_t>(k) * kPiece;
      return s.Reserve(at, std::min(kPiece, bytes - at));
    }));
    return seg;
  };
  if (settle_ms <= 0) (void)reserve();  // as BM_CreateStore: the first iteration's memory the guest's too
  for (auto _ : state) {
    Settle(state, settle_ms);
    absl::StatusOr<std::unique_ptr<ShmSegment>> seg = reserve();
    if (!seg.ok()) {
      state.SkipWithError(std::string(seg.status().message()).c_str());
      return;
    }
    benchmark::ClobberMemory();
    state.PauseTiming();
    seg->reset();
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
