// StreamFeed: one worker's reader for streamed training (data.stream), in the
// manner of tf.data's read -> shuffle(buffer) -> batch -> prefetch.
//
// A training task is a range of records of the columnar cache
// (core/data/column_cache.h) in storage order; the dispatcher shuffles the
// order of the tasks each epoch. For one task the feed's reader thread reads
// the records in windows of `window` records (pread from the page cache),
// puts each window in a random order (seeded by train.seed, the epoch, the
// task's first record and the window, so a re-queued task is trained in the
// same order wherever it runs), and cuts it into items of `item_records`
// records (a worker's TrainRange call: whole rounds of train.pull_every
// steps of train.batch_size records, up to kItemSteps steps),
// gathered into their own data sets. Up to `depth` items wait ready while the
// worker trains the one it holds; the reader stops while none is free. So a
// feed holds at most one window and depth + 1 items, whatever the task's
// size, and a worker waits on data only when its reader falls behind
// (wait_s counts those waits).
//
// Thread safety: Start, Next and Finish are called by the worker's thread
// (one task at a time); the reader thread shares only the queue, under mu_.
// wait_s and peak_bytes may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/mutex.h"
#include "core/config/options.h"
#include "core/data/column_cache.h"
#include "core/data/dataset.h"

namespace shardwild {

// The most steps of one item (StreamFeedOptionsFor).
inline constexpr int64_t kItemSteps = 32;

struct StreamFeedOptions {
  int64_t window = 16384;     // records read and shuffled together; a multiple of item_records
  int64_t item_records = 128; // records of one item (whole rounds of batch x pull_every)
  int depth = 8;              // items ready ahead of the one being trained; >= 1
  uint64_t seed = 1;          // train.seed
};

// The feed options of `config` for a cache of `bytes_per_record`, when
// `readers` feeds share data.memory_budget_mb: items of as many rounds
// (batch x pull_every records) as kItemSteps steps hold, at least one, and
// no more than a task's records, data.shuffle_buffer (where set) or the
// budget allow; depth ceil(prefetch_batches / the item's steps), at least
// 1; and the window data.shuffle_buffer (rounded up to whole items) or,
// when that is 0, the largest number of whole items that fits the budget
// (at most the records of a task). InvalidArgument naming the keys when
// even one window of items of one round, or the window asked for, does not
// fit.
absl::StatusOr<StreamFeedOptions> StreamFeedOptionsFor(const Config& config, double bytes_per_record, int readers);

class StreamFeed {
 public:
  StreamFeed(const ColumnCache& cache, const StreamFeedOptions& options);
  ~StreamFeed();
  StreamFeed(const StreamFeed&) = delete;
  StreamFeed& operator=(const StreamFeed&) = delete;

  // Starts reading the task: records [first, first + count) of the cache, in
  // `epoch`. The previous task must be finished.
  void Start(int epoch, int64_t first, int64_t count);
  // The next item of the task in training order (valid until the next call
  // of Next or Finish), or nullptr after its last one; the reader's error
  // (the file and what failed) when a read failed.
  absl::StatusOr<const Dataset*> Next();
  // Ends the task (early too: the reader stops at its next item) and joins
  // the reader.
  void Finish();

  // Seconds Next waited for an item, over the feed's life.
  double wait_s() const { return wait_ns_.load(std::memory_order_relaxed) * 1e-9; }
  // The most bytes the feed's window and items held at once.
  int64_t peak_bytes() const { return peak_bytes_.load(std::memory_order_relaxed); }
  const StreamFeedOptions& options() const { return options_; }

 private:
  void Read(int epoch, int64_t first, int64_t count);  // the reader thread: ReadTask, out of memory an error
  void ReadTask(int epoch, int64_t first, int64_t count);
  void NoteBytes() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ColumnCache& cache_;
  const StreamFeedOptions options_;
  std::thread reader_;
  Dataset window_;                 // the reader's only
  std::vector<int32_t> order_;     // the reader's only
  std::vector<Dataset> items_;     // depth + 1 slots

  Mutex mu_;
  CondVar changed_;
  std::deque<int> ready_ ABSL_GUARDED_BY(mu_);  // filled slots, in order
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);  // empty slots
  int held_ ABSL_GUARDED_BY(mu_) = -1;          // the slot the worker trains on
  bool end_ ABSL_GUARDED_BY(mu_) = false;       // the reader has put its last item
  bool stop_ ABSL_GUARDED_BY(mu_) = false;      // Finish before the end
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int64_t window_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  std::atomic<int64_t> wait_ns_{0};
  std::atomic<int64_t> peak_bytes_{0};
};

}  // namespace shardwild
