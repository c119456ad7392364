// CRC32C (core/io/crc32c.h), which checks every checkpoint file and data
// cache, beside its bound in the same run: a plain read of the same bytes
// (sums of its 8-byte words). In cache (64 KiB) and out of it (256 MiB).
//   what:0  Crc32c (the dispatched path: SSE4.2 where the CPU has it)
//   what:1  the read bound
//   what:2  the portable slicing-by-8 path
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/io/crc32c.h"

namespace shardwild {
namespace {

void BM_Crc32c(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const int64_t what = state.range(1);
  std::vector<uint64_t> words(bytes / 8);
  for (size_t i = 0; i < words.size(); ++i) words[i] = i * 0x9E3779B97F4A7C15ull;
  for (auto _ : state) {
    if (what == 0) {
      benchmark::DoNotOptimize(Crc32c(words.data(), bytes));
    } else if (what == 1) {
      // Four independent sums, so the adds are not one chain.
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (size_t i = 0; i + 4 <= words.size(); i += 4) {
        s0 += words[i];
        s1 += words[i + 1];
        s2 += words[i + 2];
        s3 += words[i + 3];
      }
      benchmark::DoNotOptimize(s0 + s1 + s2 + s3);
    } else {
      benchmark::DoNotOptimize(Crc32cExtendPortableForTest(0, words.data(), bytes));
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  state.SetLabel(what == 0 ? "Crc32c" : what == 1 ? "read bound" : "portable");
}
BENCHMARK(BM_Crc32c)->ArgNames({"bytes", "what"})->ArgsProduct({{64 << 10, 256 << 20}, {0, 1, 2}});

}  // namespace
}  // namespace shardwild
