// Same-run bounds shared by the ps_shm benchmarks (embedding_benchmark.cc,
// store_benchmark.cc): every figure they report is read next to one of these,
// measured by the same binary in the same run.
//
//   RunRandomRowRmw: the bound for a row push. Plain code reads and writes
//     random rows of a table's stride ((1 + slots) * dim floats touched per
//     row) over an array of the same number of rows: no atomics, no index, no
//     deduplication, no optimizer arithmetic. With prefetch it requests rows
//     8 ahead as EmbeddingTable does (the fair bound); without, it is the
//     naive loop, bound by memory latency.
//   BM_StreamTriad: STREAM's a = b + s * c over per-thread arrays of n floats.
//
// Header-only (inline), so each benchmark binary registers its own copies.
#pragma once

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "ps_shm/embedding_table.h"

namespace shardwild::bench {

// "x per iteration" as a rate over all threads. Google Benchmark sums a
// counter over threads and then multiplies it by the iterations of all
// threads, so a per-thread value must also be averaged over threads, or a
// 2-thread run reports twice its real rate. Register with UseRealTime():
// with CPU time the rate is divided by the threads' summed CPU time instead.
inline const auto kPerIterationRate =
    static_cast<benchmark::Counter::Flags>(benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kAvgThreads);

// An anonymous private mapping with transparent huge pages requested, the
// same for a table and for the bound. data() is null if mmap failed.
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

// The row stride of a static EmbeddingTable of `dim` floats and `slots` slot
// arrays per row (params and slots, padded as embedding_table.h says). The
// region grows by 64 strides from 64 to 128 rows (its header, side words and
// 64-byte rounding of the total stay the same).
inline size_t TableRowStride(int64_t dim, int slots) {
  EmbeddingTableOptions o;
  o.dim = dim;
  o.capacity = 64;
  o.num_slots = slots;
  const size_t base = EmbeddingTable::BytesFor(o);
  o.capacity = 128;
  return (EmbeddingTable::BytesFor(o) - base) / 64;
}

// The array the RMW bound works on, kept across runs of the same shape.
struct RmwArray {
  std::tuple<int64_t, size_t> key{0, 0};  // rows, stride
  std::unique_ptr<Mapping> memory;

  // Maps rows x stride bytes (unless this shape is mapped already) and fills
  // the first `floats` of every row. Call from thread 0 before its timing
  // loop; the caller frees what it no longer needs first, to make room.
  void Prepare(int64_t rows, size_t stride, int64_t floats) {
    if (memory && key == std::make_tuple(rows, stride)) return;
    memory.reset();
    memory = std::make_unique<Mapping>(static_cast<size_t>(rows) * stride);
    key = {rows, stride};
    if (char* base = static_cast<char*>(memory->data())) {
      for (int64_t r = 0; r < rows; ++r) std::fill_n(reinterpret_cast<float*>(base + r * stride), floats, 0.01f);
    }
  }
};

// The timing loop of the RMW bound. Every iteration updates the rows of
// ids[pos, pos + batch) of the id stream `ids` (stream_len ids, a multiple of
// batch; pos starts at `start` and wraps), each row's (1 + slots) * dim floats
// at `stride` bytes apart in `array` (prepared for `rows` rows). Thread t of
// T keeps to rows = t mod T, so the plain code has no data race (the push it
// bounds has Hogwild races instead). Sets the counters rows/s and bytes/s
// (row bytes read and written) as rates over all threads.
inline void RunRandomRowRmw(benchmark::State& state, const RmwArray& array, const uint64_t* ids, int64_t stream_len,
                            int64_t start, int64_t batch, int64_t rows, int64_t dim, int slots, size_t stride,
                            bool prefetch) {
  const int64_t n = (1 + slots) * dim;
  std::vector<float> grads(dim, 1e-3f);
  const uint64_t threads = static_cast<uint64_t>(state.threads());
  const uint64_t thread = static_cast<uint64_t>(state.thread_index());
  const int lines = static_cast<int>(std::min<size_t>(stride / 64, 16));
  auto row_of = [&](uint64_t id) {
    uint64_t r = id - id % threads + thread;
    return r >= static_cast<uint64_t>(rows) ? r - threads : r;
  };
  int64_t pos = start;
  for (auto _ : state) {
    char* base = static_cast<char*>(array.memory ? array.memory->data() : nullptr);
    if (base == nullptr) {
      state.SkipWithError("mmap failed");
      break;
    }
    const uint64_t* batch_ids = ids + pos;
    for (int64_t i = 0; i < batch; ++i) {
      if (prefetch && i + 8 < batch) {
        const char* next = base + row_of(batch_ids[i + 8]) * stride;
        for (int l = 0; l < lines; ++l) __builtin_prefetch(next + 64 * l, 1);
      }
      float* p = reinterpret_cast<float*>(base + row_of(batch_ids[i]) * stride);
      for (int a = 0; a <= slots; ++a, p += dim) {
        for (int64_t j = 0; j < dim; ++j) p[j] = 0.999f * p[j] - 1e-3f * grads[j];
      }
    }
    benchmark::ClobberMemory();
    pos = (pos + batch) % stream_len;
  }
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(batch), kPerIterationRate);
  state.counters["bytes/s"] =
      benchmark::Counter(2.0 * batch * n * sizeof(float), kPerIterationRate, benchmark::Counter::kIs1024);
}

// STREAM triad on per-thread arrays of n = range(0) floats each. Register
// with UseRealTime() (see kPerIterationRate).
inline void BM_StreamTriad(benchmark::State& state) {
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

}  // namespace shardwild::bench
