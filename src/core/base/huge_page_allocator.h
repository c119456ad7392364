// An allocator for large, long-lived arrays that the hot path reads at
// random (a data set packed for batch loads): a block of at least
// kHugePageMinBytes starts on a 2 MiB boundary, spans whole 2 MiB pages and is
// marked MADV_HUGEPAGE, so that with transparent huge pages in "madvise" or
// "always" mode (/sys/kernel/mm/transparent_hugepage/enabled) a random read
// of it does not also miss the TLB. A request only: the kernel may back the
// block with small pages, and the values are the same either way.
//
// Smaller blocks come from operator new, as std::allocator's do (rounding
// them up to 2 MiB would cost more memory than the few TLB entries save),
// aligned to a cache line: either way a block starts on one, which
// PackedRecords' slots rely on for speed (never for correctness).
//
// Thread safety: stateless.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace shardwild {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;
inline constexpr size_t kHugePageMinBytes = size_t{256} << 10;

// Whether HugePageAllocator gives `bytes` whole, aligned 2 MiB pages.
constexpr bool OnHugePages(size_t bytes) { return bytes >= kHugePageMinBytes; }

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  static_assert(alignof(T) <= kHugePageBytes);
  static constexpr size_t kSmallAlign = alignof(T) > 64 ? alignof(T) : 64;

  HugePageAllocator() = default;
  template <typename U>
  explicit HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    if (!OnHugePages(bytes)) return static_cast<T*>(::operator new(bytes, std::align_val_t{kSmallAlign}));
    const size_t rounded = (bytes + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
    void* p = std::aligned_alloc(kHugePageBytes, rounded);
    if (p == nullptr) throw std::bad_alloc();
    // Before the first touch, so the first faults may already take huge pages.
    madvise(p, rounded, MADV_HUGEPAGE);
    return static_cast<T*>(p);
  }

  void deallocate(T* p, size_t n) noexcept {
    if (!OnHugePages(n * sizeof(T))) {
      ::operator delete(p, std::align_val_t{kSmallAlign});
    } else {
      std::free(p);
    }
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

template <typename T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace shardwild
