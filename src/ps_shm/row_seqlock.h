// Row seqlocks for update mode `row_lock` (ps.update), shared by the dense
// parts of a shard (shm_store.cc) and the rows of embedding tables
// (embedding_table.cc).
//
// Each row has a uint32 sequence word in shared memory, reached only through
// std::atomic_ref<uint32_t>. Even: no writer inside; odd: one writer is
// updating the row's params and slots. The row's floats are still read and
// written with relaxed std::atomic_ref (as in hogwild), so a reader racing a
// writer never has a data race, only a retry.
//
// Memory ordering:
//  - LockRow's CAS (even -> odd) is acquire: it pairs with the previous
//    writer's release in UnlockRow, so this writer's read-modify-write of the
//    row starts from the previous writer's complete result (mutual exclusion).
//  - LockRow then issues a release fence: it orders the odd value before the
//    data stores that follow. If a reader's relaxed load sees any of those
//    stores, the reader's acquire fence synchronises with this fence, so the
//    reader's re-load of the word sees the odd value (or a later one) and the
//    reader retries.
//  - UnlockRow stores odd + 1 with release: the row's new values happen
//    before any reader that loads that even value with acquire, so a read
//    that starts after the update sees all of it.
//  - A reader loads the word with acquire (skipping odd values), copies with
//    relaxed loads, issues an acquire fence (so the copies are not reordered
//    after the re-load) and re-loads the word; equal means the copy is whole.
// A 32-bit word wraps after 2^31 updates of one row; a reader would have to
// sleep through exactly that many for a torn read to pass unnoticed.
//
// The words live in shared memory, so they work across processes. A process
// that dies holding a row's lock leaves the row locked: writers and readers of
// that row then spin forever. The job restarts from a checkpoint.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "core/base/sanitizers.h"

namespace shardwild {

static_assert(std::atomic_ref<uint32_t>::is_always_lock_free, "row seqlocks need lock-free 32-bit atomics");

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Spin with a pause instruction; after a while yield the core, since on an
// oversubscribed machine the writer we wait for may be descheduled.
struct Backoff {
  int spins = 0;
  void Wait() {
    if (++spins < 128) {
      CpuRelax();
    } else {
      spins = 0;
      std::this_thread::yield();
    }
  }
};

// The seqlock's fences (see "Memory ordering" above). ThreadSanitizer does
// not model fences (GCC says so, -Wtsan, at every one), and every access they
// order is atomic (std::atomic_ref) or in a Hogwild kernel it does not see,
// so it has nothing to check here. Under it, on x86, where an acquire or a
// release fence is a compiler barrier and no instruction (x86-TSO already
// keeps loads with loads and stores with stores), the compiler barrier alone
// gives the same code without the warning.
inline void SeqlockFence(std::memory_order order) {
#if defined(SHARDWILD_TSAN) && (defined(__x86_64__) || defined(__i386__))
  std::atomic_signal_fence(order);
#else
  std::atomic_thread_fence(order);
#endif
}

// Takes row `seq`'s write lock; returns the odd value it stored.
inline uint32_t LockRow(uint32_t* seq) {
  std::atomic_ref<uint32_t> word(*seq);
  uint32_t cur = word.load(std::memory_order_relaxed);
  Backoff backoff;
  for (;;) {
    if ((cur & 1) == 0) {
      if (word.compare_exchange_weak(cur, cur + 1, std::memory_order_acquire, std::memory_order_relaxed)) break;
      continue;  // cur now holds the value seen
    }
    backoff.Wait();
    cur = word.load(std::memory_order_relaxed);
  }
  SeqlockFence(std::memory_order_release);
  return cur + 1;
}

// Gives the lock LockRow took back (`odd` is what LockRow returned).
inline void UnlockRow(uint32_t* seq, uint32_t odd) {
  std::atomic_ref<uint32_t>(*seq).store(odd + 1, std::memory_order_release);
}

// Runs copy() until it ran while no writer touched the row.
template <typename Copy>
inline void ReadRowConsistent(const uint32_t* seq, Copy copy) {
  std::atomic_ref<uint32_t> word(const_cast<uint32_t&>(*seq));
  Backoff backoff;
  for (;;) {
    const uint32_t before = word.load(std::memory_order_acquire);
    if (before & 1) {
      backoff.Wait();
      continue;
    }
    copy();
    SeqlockFence(std::memory_order_acquire);
    if (word.load(std::memory_order_relaxed) == before) return;
  }
}

}  // namespace shardwild
