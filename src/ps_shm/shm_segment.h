// One POSIX shared-memory segment: created exclusively, its memory reserved
// (posix_fallocate, or by its owner's threads, a range each), mapped, and
// unlinked by its owner. Or, made by CreatePrivate, the same size of private
// memory of this process, which no other process can attach to.
//
// A segment is named "/<name>" (shm_open's convention; on Linux it appears as
// /dev/shm/<name>). Create() refuses a name that exists already, so two runs
// can never share a segment by accident, and gives it mode 0600 so other
// users cannot read or write the parameters.
//
// Thread safety: a ShmSegment object is immutable after construction; the
// memory it maps is shared, and its users define how it is accessed.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace shardwild {

class ShmSegment {
 public:
  // Creates "/<name>" with O_CREAT|O_EXCL and mode 0600, reserves `bytes`
  // with posix_fallocate (so a full /dev/shm is an error here, never a SIGBUS
  // later) and maps it read-write. The memory reads as zeros. The segment is
  // registered for removal if the process is killed by a signal the CLI
  // handles (see UnlinkAllOwnedSegmentsFromSignal) and is unlinked when the
  // returned object is destroyed.
  // AlreadyExists if the name is taken; ResourceExhausted if /dev/shm is full.
  //
  // With Reservation::kByOwner the pages are not reserved here: /dev/shm's
  // free space is checked (ResourceExhausted if it is smaller than `bytes`),
  // and the owner must Reserve every range before its first use, which
  // several threads may do at once (each range's pages are then allocated,
  // zeroed and mapped by the thread that reserves it, on its NUMA node).
  enum class Reservation { kAll, kByOwner };
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name, size_t bytes,
                                                            Reservation reservation = Reservation::kAll);

  // Reserves [offset, offset + bytes) of a segment created with
  // Reservation::kByOwner: allocates its pages and maps them into this
  // process (MADV_POPULATE_WRITE; posix_fallocate on a kernel without it), so
  // that using them later can never fault for want of memory. The range
  // reads as zeros. Thread-safe. ResourceExhausted if /dev/shm has filled
  // up; InvalidArgument for a range outside the segment.
  absl::Status Reserve(size_t offset, size_t bytes) const;

  // Private memory instead of a segment: `bytes` of anonymous memory of this
  // process (mmap MAP_PRIVATE | MAP_ANONYMOUS), reserved by its owner as with
  // Reservation::kByOwner. `name` only names it in messages: nothing appears
  // in /dev/shm, Exists(name) stays false and Attach cannot find it, and
  // nothing is left behind when the process dies however it dies. With
  // `huge_pages`, the mapping starts on a 2 MiB boundary and is marked
  // MADV_HUGEPAGE, so that where transparent_hugepage/enabled is "always" or
  // "madvise" Reserve populates it with huge pages (a fault and a zeroing
  // per 2 MiB instead of per 4 KiB: on a paravirtualised 2-core VM, 1 GiB
  // populated and first written in 0.07 s against 1.4-1.9 s for /dev/shm
  // pages). ResourceExhausted if MemAvailable in /proc/meminfo is smaller
  // than `bytes`, before anything is mapped.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> CreatePrivate(const std::string& name, size_t bytes,
                                                                   bool huge_pages);

  // Maps an existing segment read-write, without owning it (it is not
  // unlinked on destruction). NotFound if there is no such segment.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Attach(const std::string& name);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const std::string& name() const { return name_; }
  void* data() const { return data_; }
  size_t size() const { return size_; }
  bool owner() const { return owner_; }
  // Made by CreatePrivate.
  bool is_private() const { return map_bytes_ != 0; }
  // The length of the mapping at data(): size() rounded up to whole pages
  // (2 MiB ones for private memory with huge pages).
  size_t mapped_bytes() const;

  // Whether "/<name>" exists.
  static bool Exists(const std::string& name);

  // Unlinks every segment this process created and still owns. Only
  // async-signal-safe calls are made, so a signal handler may call it.
  static void UnlinkAllOwnedSegmentsFromSignal();

 private:
  ShmSegment(std::string name, void* data, size_t size, bool owner, int fd = -1, size_t map_bytes = 0)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner), fd_(fd), map_bytes_(map_bytes) {}

  // "shared memory /<name>" or "private memory <name>", for messages.
  std::string Describe() const;

  const std::string name_;
  void* const data_;
  const size_t size_;
  const bool owner_;
  const int fd_;  // open while its memory is reserved by its owner (Reserve's fallback), else -1
  const size_t map_bytes_;  // private memory: the length mapped at data_ (size_ rounded up); 0 = a segment
};

}  // namespace shardwild
