#include "workers/store_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/model/optimizer.h"
#include "core/data/id_stream.h"
#include "core/base/prefetch.h"
#include "core/base/row_bound.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"
#include "ps_shm/huge_pages.h"
#include "ps_shm/shm_segment.h"
#include "ps_shm/shm_store.h"
#include "ps_shm/sync_aggregator.h"
#include "workers/topology.h"
#include "workers/worker_pool.h"

namespace shardwild {
namespace {

using Clock = std::chrono::steady_clock;

// Ids each thread draws before timing and then cycles through.
constexpr int64_t kIdsPerThread = int64_t{1} << 20;
// Rows requested ahead, as EmbeddingTable::Push does.
constexpr int kPrefetchDistance = 8;

// Dynamic tables see 64-bit ids: row x becomes x times an odd constant (a
// bijection on 64 bits), so the ids are not small consecutive integers.
inline uint64_t DynamicId(uint64_t x) { return x * 0x9e3779b97f4a7c15ULL; }

// Per-thread id sequences over rows [0, rows): uniform, or Zipf(1.05) ranks
// scattered over the table (core/data/id_stream.h).
std::vector<std::vector<uint64_t>> MakeIds(const StoreBenchOptions& o, int64_t per_thread) {
  std::vector<std::vector<uint64_t>> ids;
  const double zipf_s = o.ids == IdDistribution::kZipf ? 1.05 : 0.0;
  for (int t = 0; t < o.threads; ++t) ids.push_back(MakeIdStream(o.rows, zipf_s, per_thread, o.seed * 1000003 + t));
  return ids;
}

// Runs step(batch_index) on this thread for `seconds`; returns batches done
// and the elapsed time.
template <typename Step>
absl::Status TimedLoop(double seconds, int64_t num_batches, Step step, int64_t* batches, double* elapsed) {
  const auto start = Clock::now();
  int64_t b = 0;
  double e = 0;
  do {
    SW_RETURN_IF_ERROR(step(b % num_batches));
    ++b;
    e = SecondsSince(start);
  } while (e < seconds);
  *batches = b;
  *elapsed = e;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RandomRowBound> RandomRowBound::Create(const std::vector<RowRegion>& regions, int64_t row_bytes,
                                                      const std::vector<std::vector<uint64_t>>& rows_of) {
  uint64_t total = 0;
  std::vector<uint64_t> ends;  // the row space index past each region
  for (const RowRegion& r : regions) {
    if (r.first == nullptr || r.rows < 0 || row_bytes > r.stride) {
      return absl::InvalidArgumentError(absl::StrCat("random-row bound: a region of ", r.rows, " rows of stride ",
                                                     r.stride, " cannot hold rows of ", row_bytes, " bytes"));
    }
    total += static_cast<uint64_t>(r.rows);
    ends.push_back(total);
  }
  const uint64_t threads = rows_of.size();
  if (threads == 0 || total < threads) {
    return absl::InvalidArgumentError(
        absl::StrCat("random-row bound: ", total, " rows for ", threads, " threads (at least one row each)"));
  }
  if (row_bytes <= 0 || row_bytes % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("random-row bound: row_bytes must be a positive multiple of 4, got ", row_bytes));
  }
  RandomRowBound b;
  b.row_bytes_ = row_bytes;
  for (uint64_t t = 0; t < threads; ++t) {
    std::vector<char*>& out = b.addresses_.emplace_back();
    out.reserve(rows_of[t].size());
    for (uint64_t index : rows_of[t]) {
      if (index >= total) {
        return absl::InvalidArgumentError(
            absl::StrCat("random-row bound: row ", index, " is past the ", total, " rows of the regions"));
      }
      uint64_t row = index - index % threads + t;
      if (row >= total) row -= threads;
      const size_t region = static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), row) - ends.begin());
      const uint64_t local = row - (ends[region] - static_cast<uint64_t>(regions[region].rows));
      out.push_back(regions[region].first + local * static_cast<uint64_t>(regions[region].stride));
    }
    if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("random-row bound: no rows for thread ", t));
  }
  return b;
}

absl::StatusOr<RandomRowBound::Rate> RandomRowBound::Measure(WorkerPool& pool, double warmup_seconds,
                                                            double seconds) const {
  if (pool.size() != threads()) {
    return absl::InvalidArgumentError(
        absl::StrCat("random-row bound: ", threads(), " row sequences for a pool of ", pool.size(), " threads"));
  }
  // Rows between two looks at the clock.
  constexpr int64_t kChunk = 1024;
  std::vector<int64_t> rows(threads(), 0);
  std::vector<double> elapsed(threads(), 0);
  SW_RETURN_IF_ERROR(pool.RunAll([&](int t) -> absl::Status {
    const std::vector<char*>& a = addresses_[t];
    // At most 16 lines ahead, as EmbeddingTable::PrefetchAhead.
    const size_t prefetch_bytes = static_cast<size_t>(std::min<int64_t>(row_bytes_, 16 * kCacheLineBytes));
    int64_t next = 0;  // the sequence's next row
    auto chunk = [&](int64_t /*chunk index*/) {
      next = RewriteRows(a.data(), static_cast<int64_t>(a.size()), next, kChunk, row_bytes_ / 4, prefetch_bytes,
                         kPrefetchDistance);
      return absl::OkStatus();
    };
    int64_t warm_chunks = 0, chunks = 0;
    double warm_elapsed = 0;
    if (warmup_seconds > 0) SW_RETURN_IF_ERROR(TimedLoop(warmup_seconds, 1, chunk, &warm_chunks, &warm_elapsed));
    SW_RETURN_IF_ERROR(TimedLoop(seconds, 1, chunk, &chunks, &elapsed[t]));
    rows[t] = chunks * kChunk;
    return absl::OkStatus();
  }));
  Rate r;
  for (int t = 0; t < threads(); ++t) {
    r.rows_per_s += static_cast<double>(rows[t]) / elapsed[t];
    r.wall_s = std::max(r.wall_s, elapsed[t]);
  }
  return r;
}

const char* IdDistributionName(IdDistribution d) { return d == IdDistribution::kUniform ? "uniform" : "zipf"; }

absl::Status StoreBenchOptions::Validate() const {
  auto bad = [](const char* flag, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", what));
  };
  if (dim < 1 || dim > (int64_t{1} << 20)) return bad("--dim", absl::StrCat("must be in [1, 2^20], got ", dim));
  if (threads < 1 || threads > 1024) return bad("--threads", absl::StrCat("must be in [1, 1024], got ", threads));
  if (rows < threads || rows > (int64_t{1} << 40)) {
    return bad("--rows", absl::StrCat("must be in [threads, 2^40], got ", rows));
  }
  if (shards < 1 || shards > 4096) return bad("--shards", absl::StrCat("must be in [1, 4096], got ", shards));
  if (batch < 1 || batch > (int64_t{1} << 20)) return bad("--batch", absl::StrCat("must be in [1, 2^20], got ", batch));
  if (!(seconds > 0) || !std::isfinite(seconds)) return bad("--seconds", absl::StrCat("must be > 0, got ", seconds));
  if (!(warmup_seconds >= 0) || !std::isfinite(warmup_seconds)) {
    return bad("warmup_seconds", absl::StrCat("must be >= 0, got ", warmup_seconds));
  }
  return absl::OkStatus();
}

absl::StatusOr<StoreBenchReport> RunStoreBench(const StoreBenchOptions& options) {
  SW_RETURN_IF_ERROR(options.Validate());
  const StoreBenchOptions& o = options;
  StoreBenchReport r;
  r.options = o;

  SW_ASSIGN_OR_RETURN(std::unique_ptr<Topology> topo, Topology::Detect());
  const Placement plan = topo->Plan(o.threads, o.shards, 1);
  WorkerPool pool(o.threads, [&](int i) { return topo->PinCurrentThread(plan.workers[i].cores); });

  OpenStoreOptions so;
  so.store.update = o.update;
  so.store.job_name = "shardwild-bench-store";
  so.optimizer.type = o.optimizer;
  so.seed = o.seed;
  so.num_shards = o.shards;
  so.placer = topo.get();
  TableSpec table;
  table.name = "bench";
  table.kind = o.kind;
  table.dim = o.dim;
  table.capacity = o.rows;
  table.bf16 = o.bf16;
  so.tables.push_back(table);
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ShmParamStore> store, ShmParamStore::Create(so, {}));
  r.store_name = store->name();
  const int slots = NumSlots(o.optimizer);
  const EmbeddingTable& shard0 = store->table_shard(0, 0);
  r.row_bytes = static_cast<int64_t>(shard0.params_bytes_per_row()) + slots * o.dim * static_cast<int64_t>(sizeof(float));
  // The bound's read-modify-write covers the row's bytes as floats.
  const int64_t floats_per_row = r.row_bytes / static_cast<int64_t>(sizeof(float));
  r.row_stride = static_cast<int64_t>(shard0.row_stride());
  const float lr = so.optimizer.lr;

  // Ids (and, for a dynamic table, their 64-bit form), drawn before timing.
  const int64_t num_batches = std::max<int64_t>(1, kIdsPerThread / o.batch);
  std::vector<std::vector<uint64_t>> rows_of = MakeIds(o, num_batches * o.batch);
  std::vector<std::vector<uint64_t>> ids = rows_of;
  if (o.kind == EmbeddingKind::kDynamic) {
    for (auto& v : ids) {
      for (uint64_t& id : v) id = DynamicId(id);
    }
    // Insert every row first, so the timed pushes measure lookups and updates.
    SW_RETURN_IF_ERROR(pool.RunAll([&](int t) -> absl::Status {
      RowScratch scratch;
      std::vector<uint64_t> batch(4096);
      std::vector<float> out(batch.size() * o.dim);
      const int64_t step = static_cast<int64_t>(batch.size());
      for (int64_t b = t * step; b < o.rows; b += o.threads * step) {
        const int64_t n = std::min<int64_t>(step, o.rows - b);
        for (int64_t i = 0; i < n; ++i) batch[i] = DynamicId(static_cast<uint64_t>(b + i));
        SW_RETURN_IF_ERROR(
            store->PullRows(0, {batch.data(), static_cast<size_t>(n)}, out.data(), PullMode::kInsert, &scratch));
      }
      return absl::OkStatus();
    }));
  }

  // The pushes. In sync mode every thread is a worker of one SyncAggregator:
  // each contributes its batch, and the round's last arrival pushes all of
  // them as one batch.
  std::unique_ptr<SyncAggregator> sync;
  if (o.update == UpdateMode::kSync) sync = std::make_unique<SyncAggregator>(store.get(), o.threads);
  std::vector<int64_t> batches(o.threads, 0);
  std::vector<double> elapsed(o.threads, 0);
  SW_RETURN_IF_ERROR(pool.RunAll([&](int t) -> absl::Status {
    std::mt19937 rng(static_cast<uint32_t>(o.seed + 17 * t));
    std::normal_distribution<float> normal(0.0f, 1e-2f);
    std::vector<float> grads(o.batch * o.dim);
    for (float& g : grads) g = normal(rng);
    RowScratch scratch;
    const uint64_t* my_ids = ids[t].data();
    auto step = [&](int64_t b) {
      const absl::Span<const uint64_t> batch(my_ids + b * o.batch, static_cast<size_t>(o.batch));
      if (sync != nullptr) {
        const RowGrad rows{0, batch, grads.data()};
        return sync->Contribute(t, {}, lr, {&rows, 1}, lr);
      }
      return store->PushRows(0, batch, grads.data(), lr, &scratch);
    };
    int64_t warm_batches = 0;
    double warm_elapsed = 0;
    absl::Status s = TimedLoop(o.warmup_seconds, num_batches, step, &warm_batches, &warm_elapsed);
    if (s.ok()) s = TimedLoop(o.seconds, num_batches, step, &batches[t], &elapsed[t]);
    if (sync != nullptr) {
      // Leave even after an error, so the other threads' rounds complete.
      absl::Status left = sync->Leave(t);
      if (s.ok()) s = std::move(left);
    }
    return s;
  }));
  for (int t = 0; t < o.threads; ++t) {
    r.rows_per_s += static_cast<double>(batches[t] * o.batch) / elapsed[t];
    r.push_wall_s = std::max(r.push_wall_s, elapsed[t]);
  }
  const HugePageStatus huge = store->huge_pages();
  r.huge_pages_requested = huge.requested;
  r.huge_pages_granted_bytes = huge.granted_bytes;
  r.store_bytes = store->total_bytes();
  store.reset();  // give its memory back before the bound's array is touched

  // The bound: the same rows, strides and ids, plain code, in memory of the
  // same kind: a shared-memory segment given the huge pages the store asked
  // for (so the bound does not win by page size alone).
  const size_t stride = static_cast<size_t>(r.row_stride);
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ShmSegment> segment,
                      ShmSegment::Create(absl::StrCat(r.store_name, "-bound"), static_cast<size_t>(o.rows) * stride));
  if (r.huge_pages_requested) AdviseHugePages(segment->data(), segment->size());
  char* const array = static_cast<char*>(segment->data());
  // First touch by the threads that use it (rows = t mod T).
  SW_RETURN_IF_ERROR(pool.RunAll([&](int t) -> absl::Status {
    for (int64_t row = t; row < o.rows; row += o.threads) {
      std::fill_n(reinterpret_cast<float*>(array + row * stride), floats_per_row, 0.01f);
    }
    return absl::OkStatus();
  }));
  if (r.huge_pages_requested) CollapseHugePages(segment->data(), segment->size());
  SW_ASSIGN_OR_RETURN(const RandomRowBound bound,
                      RandomRowBound::Create({RowRegion{array, o.rows, r.row_stride}}, r.row_bytes, rows_of));
  SW_ASSIGN_OR_RETURN(const RandomRowBound::Rate rate, bound.Measure(pool, o.warmup_seconds, o.seconds));
  r.bound_rows_per_s = rate.rows_per_s;
  r.bound_wall_s = rate.wall_s;
  r.bytes_per_s = r.rows_per_s * 2.0 * static_cast<double>(r.row_bytes);
  r.ratio = r.bound_rows_per_s > 0 ? r.rows_per_s / r.bound_rows_per_s : 0;
  return r;
}

std::string FormatStoreBenchReport(const StoreBenchReport& r) {
  const StoreBenchOptions& o = r.options;
  std::string s;
  absl::StrAppendFormat(&s, "table: %s, %d rows x dim %d over %d shard(s); row %d bytes (%s params + %d slot(s)), stride %d\n",
                        EmbeddingKindName(o.kind), o.rows, o.dim, o.shards, r.row_bytes, o.bf16 ? "bf16" : "f32",
                        NumSlots(o.optimizer), r.row_stride);
  absl::StrAppendFormat(&s, "push: %s, ps.update %s, %s ids, batch %d, %d thread(s), %.2f s timed\n",
                        OptimizerTypeName(o.optimizer), UpdateModeName(o.update), IdDistributionName(o.ids), o.batch,
                        o.threads, r.push_wall_s);
  absl::StrAppendFormat(&s, "pushed:  %.3g rows/s, %.3g GB/s of params and slots read and written\n", r.rows_per_s,
                        r.bytes_per_s / 1e9);
  absl::StrAppendFormat(&s, "bound:   %.3g rows/s (same-run random-row read-modify-write, same ids and rows)\n",
                        r.bound_rows_per_s);
  absl::StrAppendFormat(&s, "ratio:   %.3f of the bound\n", r.ratio);
  absl::StrAppendFormat(&s, "memory:  %.1f MiB shared; huge pages %s", r.store_bytes / 1048576.0,
                        r.huge_pages_requested ? "requested" : "not requested");
  if (r.huge_pages_granted_bytes) {
    absl::StrAppendFormat(&s, ", %.1f MiB granted", *r.huge_pages_granted_bytes / 1048576.0);
  }
  s += " (the bound's array alike)\n";
  return s;
}

}  // namespace shardwild
