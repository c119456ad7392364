// The loop of the random-row read-modify-write bound: what memory allows a
// pass over rows at random addresses, read and written back, with no index,
// no arithmetic and no atomics. `shardwild bench` and `bench store`
// (workers/store_bench.cc, RandomRowBound) and dense_benchmark's
// BM_InPlaceRows measure it next to the work it bounds.
//
// Thread safety: plain reads and writes of the rows; the caller gives each
// thread rows no other thread touches while it runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/base/prefetch.h"

namespace shardwild {

// `count` rows of the cyclic sequence a[0, n) from a[next] on, each one's
// first `words` 4-byte words read and written back as they were (XOR with a
// zero the compiler cannot see through, so floats and bf16 pairs alike keep
// every bit, and a live table's rows can be used), with the row `distance`
// ahead in the sequence asked for first, with intent to write
// (prefetch_bytes of it). Returns where the sequence goes on.
//
// A function of its arguments only, every value a local, so no store into a
// row can alias them: as a lambda over the caller's variables, called
// through a timing loop, it reloaded them after each store and ran at half
// the rate. (Inlined or not, the values stay locals.)
inline int64_t RewriteRows(char* const* a, int64_t n, int64_t next, int64_t count, int64_t words,
                           size_t prefetch_bytes, int64_t distance) {
  uint32_t zero = 0;
  asm volatile("" : "+r"(zero));
  for (int64_t c = 0; c < count; ++c) {
    int64_t ahead = next + distance;
    if (ahead >= n) ahead %= n;
    PrefetchLinesForWrite(a[ahead], prefetch_bytes);
    char* p = a[next];
    for (int64_t j = 0; j < words; ++j) {
      uint32_t w;
      std::memcpy(&w, p + 4 * j, 4);
      w ^= zero;
      std::memcpy(p + 4 * j, &w, 4);
    }
    if (++next == n) next = 0;
  }
  return next;
}

}  // namespace shardwild
