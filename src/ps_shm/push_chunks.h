// PushChunks: keeps concurrent dense pushes of one shared array apart.
//
// Hogwild workers push the same dense variables, each its own gradient over
// every element. Where two pushes run at once over the same lines, each
// line's writes go back and forth between the two cores, many times a push;
// where they run at different times, each line moves once. On a 2-core AMD
// EPYC VM, a model of the default MLP's step (235,146 Adam parameters; a
// 4 MiB sweep standing for the forward and backward, then the push, on each
// of 2 threads) measured pushes of 125-180 us where they overlapped at
// random, 105-115 us where they took turns, against 70 us for one thread.
//
// So a push walks its part in chunks, and a chunk another push is walking is
// left for later: each chunk has a flag; a push claims a free chunk, updates
// it and frees it, and skips a claimed one, coming back to it once it has
// been through the others. On its second visit it claims the chunk if it is
// free and updates it either way. Two pushes therefore leapfrog each other
// instead of writing the same lines side by side (same model: 104-122 us).
// In training the gain is as large as the overlap: none for the default MLP
// at batch 128, whose pushes seldom meet; push 140 -> 116 us at batch 32
// (README, "The hot path").
//
// This is a hint, not a lock: no push ever waits for a flag, the update of
// a skipped chunk still happens within the same push, and two pushes may
// still write one chunk at once (the Hogwild contract, in the optimizer
// kernels). The flags order nothing: nothing is read under them, so they
// are relaxed atomics. They live in the process, one set a store object: the
// threads pushing through one ShmParamStore see each other's; pushes of
// another process attached to the same shards do not.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace shardwild {

class PushChunks {
 public:
  // At most this many chunks for any size (ForEach's stack bitmap).
  static constexpr int kMaxChunks = 256;
  // Elements a chunk holds at least: 16 KiB of each array (Adam: 48 KiB of
  // parameters and slots a chunk), so a claim's two atomics cost little
  // next to the chunk's update. Chunks of 1,024 to 16,384 elements measured
  // alike.
  static constexpr int64_t kMinChunkElements = 4096;

  // The chunk size for an array of `n` elements: kMinChunkElements, or more
  // where that would make more than kMaxChunks chunks; always a multiple of
  // 16 elements (64 bytes of floats), so that a chunk starts where a vector
  // does.
  static int64_t ChunkElements(int64_t n);

  // Flags for an array of `n` >= 0 elements, all free.
  explicit PushChunks(int64_t n);

  int64_t chunk_elements() const { return chunk_; }
  int num_chunks() const { return num_chunks_; }

  // Calls update(begin, end) once for each chunk [begin, end) of [0, n),
  // as the comment at the top says: the chunks it can claim in order, each
  // freed after its update, then the chunks it found claimed, in order,
  // each claimed if free by then. Never waits; returns after the last
  // update. Thread-safe: any number of threads may call it at once. update
  // must not throw.
  template <typename Update>
  void ForEach(Update&& update);

  // Claims chunk c if it is free (true) or leaves it (false); Release frees
  // it. What ForEach does around each update; public so that tests can hold
  // a chunk as another push would.
  bool TryClaim(int c) {
    std::atomic<uint32_t>& busy = flags_[c].busy;
    return busy.load(std::memory_order_relaxed) == 0 && busy.exchange(1, std::memory_order_relaxed) == 0;
  }
  void Release(int c) { flags_[c].busy.store(0, std::memory_order_relaxed); }

 private:
  // A flag a cache line: a claim does not pull in the line of a chunk
  // another core is working on.
  struct alignas(64) Flag {
    std::atomic<uint32_t> busy{0};
  };

  // Constant after construction.
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int num_chunks_ = 0;
  // Atomics (relaxed: hints that order nothing, see the top).
  std::unique_ptr<Flag[]> flags_;
};

template <typename Update>
void PushChunks::ForEach(Update&& update) {
  auto update_chunk = [&](int c) {
    const int64_t begin = c * chunk_;
    update(begin, begin + chunk_ < n_ ? begin + chunk_ : n_);
  };
  uint64_t skipped[kMaxChunks / 64] = {};
  bool any_skipped = false;
  for (int c = 0; c < num_chunks_; ++c) {
    if (!TryClaim(c)) {
      skipped[c / 64] |= uint64_t{1} << (c % 64);
      any_skipped = true;
      continue;
    }
    update_chunk(c);
    Release(c);
  }
  if (!any_skipped) return;
  for (int c = 0; c < num_chunks_; ++c) {
    if (!((skipped[c / 64] >> (c % 64)) & 1)) continue;
    const bool claimed = TryClaim(c);
    update_chunk(c);
    if (claimed) Release(c);
  }
}

}  // namespace shardwild
