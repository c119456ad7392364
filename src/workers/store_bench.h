// The embedding-row benchmark behind `shardwild bench store`.
//
// It creates a shared-memory store (ShmParamStore) holding one embedding
// table of `rows` rows of `dim` floats, and runs `threads` pinned threads
// that each push batches of ids with random gradients through
// ParamStore::PushRows for about `seconds`, after a short untimed warm-up.
// Ids are uniform over the rows or Zipf(1.05) over ranks scattered across the
// rows by a fixed random permutation; every thread's id sequence is drawn
// before timing into a buffer it cycles through.
//
// In the same run, on the same pinned threads, with the same id sequences,
// it measures the bound (RandomRowBound below): a random-row
// read-modify-write of rows of the same size (the table's row stride; params
// + slots bytes touched) over an array of the same number of rows (a
// shared-memory segment with the store's huge-page treatment).
//
// rows_per_s counts the ids in the pushed batches (repeats included); the
// push deduplicates them, the bound does not, so with Zipf ids the ratio may
// exceed 1. bytes_per_s = rows_per_s x the row's params and slots, read and
// written.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config/options.h"
#include "ps_shm/embedding_table.h"
#include "workers/worker_pool.h"

namespace shardwild {

enum class IdDistribution { kUniform, kZipf };

struct StoreBenchOptions {
  int64_t dim = 64;
  int64_t rows = 1000000;
  IdDistribution ids = IdDistribution::kUniform;
  OptimizerType optimizer = OptimizerType::kAdagrad;
  // hogwild: lock-free pushes; row_lock: each row under its seqlock; sync:
  // the threads are the workers of one SyncAggregator, each round's pushes
  // merged into one (rows_per_s counts the ids the threads contributed).
  UpdateMode update = UpdateMode::kHogwild;
  int threads = 1;
  EmbeddingKind kind = EmbeddingKind::kStatic;
  bool bf16 = false;  // bf16 parameters (TableSpec::bf16); the bound moves the same bytes
  int shards = 1;
  int64_t batch = 512;
  double seconds = 2.0;  // timed, for the push and again for the bound
  double warmup_seconds = 0.2;
  uint64_t seed = 1;
  // Errors name the CLI flag ("--rows: must be >= 1, got 0").
  absl::Status Validate() const;
};

struct StoreBenchReport {
  StoreBenchOptions options;
  std::string store_name;
  double rows_per_s = 0;        // ids pushed per second, all threads
  double bytes_per_s = 0;       // rows_per_s x 2 x (1 + slots) x dim x 4
  double bound_rows_per_s = 0;  // the same-run random-row RMW, all threads
  double ratio = 0;             // rows_per_s / bound_rows_per_s
  int64_t row_bytes = 0;        // params + slots bytes of one row (bf16 params: 2 bytes each)
  int64_t row_stride = 0;       // bytes between row blocks in the table
  double push_wall_s = 0;
  double bound_wall_s = 0;
  uint64_t store_bytes = 0;                     // shared memory of the store
  bool huge_pages_requested = false;            // the store asked for THP (ps.huge_pages auto, kernel allows)
  std::optional<uint64_t> huge_pages_granted_bytes;  // of the store, measured; unset if unknown
};

// Row blocks in memory: `rows` blocks of `stride` bytes from `first`.
struct RowRegion {
  char* first = nullptr;
  int64_t rows = 0;
  int64_t stride = 0;
};

// The random-row bound: a plain (non-atomic) read-modify-write of the first
// `row_bytes` bytes of random rows, prefetching rows ahead as the store does,
// with no index, deduplication or optimizer arithmetic. The regions form one
// row space, region after region. It writes back the bits it read, so it can
// run on a live table's rows (while no worker runs) and leave them as they
// were: the memory, its pages and its NUMA placement are the step's own.
// Thread t of T keeps to rows = t (mod T) of the row space, so the plain code
// has no data race.
class RandomRowBound {
 public:
  // rows_of[t]: thread t's row sequence (indices into the row space, which
  // must hold at least as many rows as there are threads; each index moves
  // to its nearest row = t mod T), turned into addresses here, before timing.
  // InvalidArgument for no rows, a row_bytes that is not a positive multiple
  // of 4 within every region's stride, or an index past the row space.
  static absl::StatusOr<RandomRowBound> Create(const std::vector<RowRegion>& regions, int64_t row_bytes,
                                               const std::vector<std::vector<uint64_t>>& rows_of);

  struct Rate {
    double rows_per_s = 0;  // all threads
    double wall_s = 0;      // the longest thread's timed seconds
  };
  // Runs thread t's sequence on pool thread t (pool.size() must equal the
  // sequences) for `seconds`, after `warmup_seconds` untimed, cycling
  // through the sequence.
  absl::StatusOr<Rate> Measure(WorkerPool& pool, double warmup_seconds, double seconds) const;

  int threads() const { return static_cast<int>(addresses_.size()); }
  // Test hook: thread t's row addresses, in its sequence's order.
  const std::vector<char*>& AddressesForTest(int t) const { return addresses_[t]; }

 private:
  std::vector<std::vector<char*>> addresses_;
  int64_t row_bytes_ = 0;
};

// Runs the benchmark. Errors: InvalidArgument for bad options, and the
// store's errors (ResourceExhausted when shared memory is too small).
absl::StatusOr<StoreBenchReport> RunStoreBench(const StoreBenchOptions& options);

// One readable block of text.
std::string FormatStoreBenchReport(const StoreBenchReport& r);

const char* IdDistributionName(IdDistribution d);

}  // namespace shardwild
