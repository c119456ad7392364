// Drawing a static table's initial rows (UniformRowValues, the inner loop of
// creating a table) next to the bound measured in the same run: a plain fill
// of the same bytes with one value (std::fill_n, what writing the rows costs
// with nothing to compute). Both write rows of `dim` floats one after another
// over a region of `bytes` (its pages touched before timing), in cache
// (256 KiB) and far outside it (256 MiB), per dispatch target.
//
//   build/bench/ps_shm/init_benchmark --benchmark_counters_tabular=true
//
// Args: dim, bytes, what (0 the kernel, 1 the fill). Counters: floats/s,
// bytes/s. Compare the kernel's bytes/s with the fill's at the same bytes.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "bounds.h"
#include "core/model/hogwild_kernels.h"
#include "ps_shm/init_kernels.h"

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
  state.SetLabel(what == 0 ? "UniformRowValues" : "bound: fill");
}

bool RegisterAll() {
  for (const std::string& target : HogwildKernelTargets()) {
    for (int64_t what : {0, 1}) {
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
