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
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardwild {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;
inline constexpr size_t kHugePageMinBytes = size_t{256} << 10;

// Whether HugePageAllocator gives `bytes` whole, aligned 2 MiB pages.
constexpr bool OnHugePages(size_t bytes) { return bytes >= kHugePageMinBytes; }

// *v replaced by n value-initialised elements in a block whose whole 2 MiB
// pages are marked MADV_HUGEPAGE before the resize first writes them, for a
// std::vector (whose allocator cannot be HugePageAllocator) about to be
// written whole: where the kernel grants huge pages, that first touch
// faults 2 MiB at a time instead of 4 KiB (on the 2-core Zen 5 VM, where a
// first write to a page is slow, 256 MiB by one thread: 0.70 s small,
// 0.38-0.42 s huge). A request only, as for HugePageAllocator; the block's
// ends outside whole 2 MiB pages stay small.
template <typename T>
void ResetOnHugePages(std::vector<T>* v, size_t n) {
  v->clear();
  v->reserve(n);
  const auto begin = reinterpret_cast<uintptr_t>(v->data());
  const uintptr_t first = (begin + kHugePageBytes - 1) & ~uintptr_t{kHugePageBytes - 1};
  const uintptr_t last = (begin + n * sizeof(T)) & ~uintptr_t{kHugePageBytes - 1};
  if (v->data() != nullptr && last > first) {
    (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
  v->resize(n);
}

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

// HugePageAllocator whose vectors' resize(n) and vector(n) leave the new
// elements default-initialised (indeterminate, for arithmetic T) rather than
// zeroed: for an array whose every element is then written, in parts, each
// by the thread that first touches it (PackedRecords' words, written by
// Model::PackRecords on all cores). A value given (assign(n, v), resize(n,
// v)) is still copied in.
template <typename T>
struct UninitHugePageAllocator : HugePageAllocator<T> {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = UninitHugePageAllocator<U>;
  };
  UninitHugePageAllocator() = default;
  template <typename U>
  explicit UninitHugePageAllocator(const UninitHugePageAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
using UninitHugePageVector = std::vector<T, UninitHugePageAllocator<T>>;

}  // namespace shardwild
