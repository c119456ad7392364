// Software prefetch of a line or a byte range, for reading or writing.
//
// Thread safety: pure functions; a prefetch is a hint with no effect on any
// value, and no fault on any address.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardwild {

inline constexpr size_t kCacheLineBytes = 64;

// The cache lines that [begin, begin + bytes) touches: `count` lines from
// the one holding `begin`. Counts the last line too when `begin` is not on a
// line's start (a range of 64 bytes at offset 40 touches 2 lines, not 1).
struct CacheLines {
  uintptr_t first = 0;  // the first line's address
  size_t count = 0;
};
constexpr CacheLines CacheLinesOf(uintptr_t begin, size_t bytes) {
  if (bytes == 0) return {};
  const uintptr_t first = begin & ~uintptr_t{kCacheLineBytes - 1};
  const uintptr_t last = (begin + bytes - 1) & ~uintptr_t{kCacheLineBytes - 1};
  return {first, static_cast<size_t>((last - first) / kCacheLineBytes) + 1};
}

// Asks for the line holding `p` to be brought into L1, for reading.
// Locality 3, prefetcht0: with prefetcht1 the lines a worker asked for after
// its forward were missed again at the next batch's copy (text config on the
// Zen 4 VM: data phase 1.4 -> 0.85 us a step). On x86 through asm volatile: GCC takes __builtin_prefetch
// for free of side effects and, once a loop of them is known to end, deletes
// the whole loop: written with the count of lines as its bound, this loop
// vanished from Model::PrefetchRecord, and the data phase of the text config
// doubled. A single prefetch inlined into a caller's loop of nothing else
// is as much at risk, so the project's prefetches go through here (the
// kernels' hwy::Prefetch calls sit in loops that also load and store, which
// GCC keeps).
inline void PrefetchLine(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

// Asks for the line holding `p` with intent to write (prefetchw: the line
// comes in exclusive, so the store that follows needs no second request).
// Through asm volatile on x86 for the reason above. On x86 CPUs without
// PRFCHW the instruction is a no-op.
inline void PrefetchLineForWrite(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

// Line(a) for every line a of [begin, begin + bytes).
template <void (*Line)(const void*)>
inline void EachLine(const void* begin, size_t bytes) {
  const CacheLines lines = CacheLinesOf(reinterpret_cast<uintptr_t>(begin), bytes);
  const char* p = reinterpret_cast<const char*>(lines.first);
  for (size_t i = 0; i < lines.count; ++i) Line(p + kCacheLineBytes * i);
}

// Every line of [begin, begin + bytes), for reading or for writing.
inline void PrefetchLines(const void* begin, size_t bytes) { EachLine<PrefetchLine>(begin, bytes); }
inline void PrefetchLinesForWrite(const void* begin, size_t bytes) { EachLine<PrefetchLineForWrite>(begin, bytes); }

}  // namespace shardwild
