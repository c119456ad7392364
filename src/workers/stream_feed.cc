#include "workers/stream_feed.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <new>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/random.h"

namespace shardwild {

absl::StatusOr<StreamFeedOptions> StreamFeedOptionsFor(const Config& config, double bytes_per_record, int readers) {
  const DataOptions& d = config.data;
  StreamFeedOptions o;
  o.seed = config.train.seed;
  // One round: the steps between two pulls (a TrainRange call's first step
  // always pulls, so an item is whole rounds).
  const int64_t round = config.train.batch_size * config.train.pull_every;
  const double budget = static_cast<double>(d.memory_budget_mb) * (1 << 20) / std::max(readers, 1);
  const double bpr = std::max(bytes_per_record, 1.0);
  const int64_t task = std::max<int64_t>(d.records_per_task, 1);
  auto depth_for = [&](int64_t rounds) {
    const int64_t steps = rounds * config.train.pull_every;
    return static_cast<int>(std::max<int64_t>(1, (d.prefetch_batches + steps - 1) / steps));
  };
  auto items_bytes_for = [&](int64_t rounds) {
    return static_cast<double>(depth_for(rounds) + 1) * static_cast<double>(rounds * round) * bpr;
  };
  // data.shuffle_buffer in whole items of `item` records, at most a task's.
  auto asked_window = [&](int64_t item) {
    return std::min((d.shuffle_buffer + item - 1) / item, (task + item - 1) / item) * item;
  };
  // The window of items of `rounds` rounds: the asked window, or the most
  // whole items the budget leaves room for, at most a task's items. 0 where
  // it does not fit.
  auto window_for = [&](int64_t rounds) -> int64_t {
    const int64_t item = rounds * round;
    const int64_t task_items = (task + item - 1) / item;
    if (d.shuffle_buffer > 0) {
      const int64_t window = asked_window(item);
      return static_cast<double>(window) * bpr + items_bytes_for(rounds) > budget ? 0 : window;
    }
    const double fit = std::floor((budget - items_bytes_for(rounds)) / (bpr * static_cast<double>(item)));
    return fit < 1 ? 0 : std::min(static_cast<int64_t>(fit), task_items) * item;
  };
  // Items of as many rounds as kItemSteps steps hold (at least one): a
  // TrainRange call for each, so that its steps ask for the next batch a
  // step ahead and fuse each pull into the last push, which the first step
  // of a call cannot (one round an item before 2026-11-29: sparse_logreg
  // streamed, 4 epochs, 6 alternating pairs, 2.57M -> 2.66M samples/s,
  // medians; its tasks of 1024 records make items of 16 steps). No longer
  // than a task (rounded up to a round), nor than data.shuffle_buffer where
  // it is set, and never at the window's cost: halved, down to one round,
  // while the window would be smaller than with items of one round (a
  // tight budget).
  int64_t rounds = std::max<int64_t>(1, kItemSteps / config.train.pull_every);
  rounds = std::min(rounds, (task + round - 1) / round);
  if (d.shuffle_buffer > 0) rounds = std::min(rounds, std::max<int64_t>(1, (d.shuffle_buffer + round - 1) / round));
  const int64_t one_round_window = window_for(1);
  while (rounds > 1 && window_for(rounds) < std::max<int64_t>(one_round_window, 1)) rounds /= 2;
  o.item_records = rounds * round;
  o.depth = depth_for(rounds);
  o.window = window_for(rounds);
  if (o.window > 0) return o;
  // Not even items of one round fit: say what does not.
  const double items_bytes = items_bytes_for(rounds);
  auto describe = [&](int64_t window) {
    return absl::StrFormat(
        "data.memory_budget_mb %d shared by %d reader%s is %.1f MiB each, and a window of %d records of about %.0f "
        "bytes plus %d prepared items of %d records (data.prefetch_batches, train.batch_size x train.pull_every) "
        "need %.1f MiB",
        d.memory_budget_mb, readers, readers == 1 ? "" : "s", budget / (1 << 20), window, bpr, o.depth + 1,
        o.item_records, (static_cast<double>(window) * bpr + items_bytes) / (1 << 20));
  };
  if (d.shuffle_buffer > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.source, ": data.shuffle_buffer: ", describe(asked_window(o.item_records)),
                     "; lower data.shuffle_buffer or data.prefetch_batches, or raise data.memory_budget_mb"));
  }
  return absl::InvalidArgumentError(absl::StrCat(config.source, ": data.memory_budget_mb: ", describe(o.item_records),
                                                 "; raise data.memory_budget_mb or lower data.prefetch_batches"));
}

StreamFeed::StreamFeed(const ColumnCache& cache, const StreamFeedOptions& options)
    : cache_(cache), options_(options), items_(static_cast<size_t>(options.depth) + 1) {}

StreamFeed::~StreamFeed() { Finish(); }

void StreamFeed::Start(int epoch, int64_t first, int64_t count) {
  Finish();
  {
    MutexLock lock(&mu_);
    ready_.clear();
    free_.clear();
    for (int i = 0; i <= options_.depth; ++i) free_.push_back(i);
    held_ = -1;
    end_ = false;
    stop_ = false;
    error_ = absl::OkStatus();
  }
  reader_ = std::thread([this, epoch, first, count] { Read(epoch, first, count); });
}

void StreamFeed::Finish() {
  if (!reader_.joinable()) return;
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  changed_.SignalAll();
  reader_.join();
}

absl::StatusOr<const Dataset*> StreamFeed::Next() {
  const auto start = std::chrono::steady_clock::now();
  MutexLock lock(&mu_);
  if (held_ >= 0) {
    free_.push_back(held_);
    held_ = -1;
    changed_.SignalAll();
  }
  changed_.Wait(&mu_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !ready_.empty() || end_ || !error_.ok(); });
  wait_ns_.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count(),
      std::memory_order_relaxed);
  if (!error_.ok()) return error_;
  if (ready_.empty()) return nullptr;  // end_
  held_ = ready_.front();
  ready_.pop_front();
  return &items_[static_cast<size_t>(held_)];
}

void StreamFeed::NoteBytes() {
  int64_t bytes = window_bytes_;
  for (const Dataset& d : items_) bytes += DatasetBytes(d);
  if (bytes > peak_bytes_.load(std::memory_order_relaxed)) peak_bytes_.store(bytes, std::memory_order_relaxed);
}

void StreamFeed::Read(int epoch, int64_t first, int64_t count) {
  try {
    ReadTask(epoch, first, count);
  } catch (const std::bad_alloc&) {
    MutexLock lock(&mu_);
    error_ = absl::ResourceExhaustedError(
        "streamed data: out of memory while reading a window (lower data.shuffle_buffer or data.prefetch_batches)");
    changed_.SignalAll();
  }
}

void StreamFeed::ReadTask(int epoch, int64_t first, int64_t count) {
  const int64_t w = std::max<int64_t>(options_.window, 1);
  for (int64_t at = 0, k = 0; at < count; at += w, ++k) {
    const int64_t n = std::min(w, count - at);
    absl::Status read = cache_.Read(first + at, n, &window_);
    {
      MutexLock lock(&mu_);
      window_bytes_ = DatasetBytes(window_);
      if (!read.ok()) {
        error_ = read;
        changed_.SignalAll();
        return;
      }
      if (stop_) return;
    }
    // Fisher-Yates from SplitMix64, seeded by the task and window alone.
    order_.resize(static_cast<size_t>(n));
    std::iota(order_.begin(), order_.end(), 0);
    uint64_t state = SplitMix64Mix(options_.seed ^ SplitMix64Mix(static_cast<uint64_t>(epoch) * 0x9e3779b97f4a7c15ULL ^
                                                                 SplitMix64Mix(static_cast<uint64_t>(first + at))));
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(SplitMix64(state) % static_cast<uint64_t>(i + 1));
      std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(j)]);
    }
    for (int64_t off = 0; off < n; off += options_.item_records) {
      int slot = -1;
      {
        MutexLock lock(&mu_);
        changed_.Wait(&mu_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !free_.empty() || stop_; });
        if (stop_) return;
        slot = free_.back();
        free_.pop_back();
      }
      // The slot is the reader's alone until it is put in ready_.
      GatherRecords(window_, order_.data() + off, std::min(options_.item_records, n - off),
                    &items_[static_cast<size_t>(slot)]);
      MutexLock lock(&mu_);
      ready_.push_back(slot);
      NoteBytes();
      changed_.SignalAll();
    }
  }
  MutexLock lock(&mu_);
  end_ = true;
  changed_.SignalAll();
}

}  // namespace shardwild
