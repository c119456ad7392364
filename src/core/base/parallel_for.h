// ParallelFor: one item at a time from a shared counter, on the calling
// thread and threads it starts for the call (which inherit its CPU and
// memory binding), joined before it returns, so every write fn makes is
// visible to the caller afterwards (and to ThreadSanitizer).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace shardwild {

// A thread-count option resolved: `requested` when > 0, else one per
// hardware thread (at least 1).
inline int ResolveThreads(int requested) {
  return requested > 0 ? requested : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Runs fn(i) once for every i in [0, n) on up to `threads` threads (0 = one
// per hardware thread). A thread that cannot be started leaves its share to
// the others.
inline void ParallelFor(int threads, int64_t n, const std::function<void(int64_t)>& fn) {
  threads = ResolveThreads(threads);
  std::atomic<int64_t> next{0};
  auto run = [&] {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  };
  const int helpers = static_cast<int>(std::min<int64_t>(threads, n)) - 1;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(std::max(helpers, 0)));
  for (int k = 0; k < helpers; ++k) {
    try {
      pool.emplace_back(run);
    } catch (const std::system_error&) {
      break;
    }
  }
  run();
  for (std::thread& t : pool) t.join();
}

// As ParallelFor, for work that can fail: every item runs, and the error of
// the lowest i that failed is returned.
inline absl::Status ParallelForStatus(int threads, int64_t n, const std::function<absl::Status(int64_t)>& fn) {
  std::vector<absl::Status> status(static_cast<size_t>(std::max<int64_t>(n, 0)));
  ParallelFor(threads, n, [&](int64_t i) { status[static_cast<size_t>(i)] = fn(i); });
  for (absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace shardwild
