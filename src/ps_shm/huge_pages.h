// Transparent huge pages (THP) for shard memory.
//
// Shards are files in /dev/shm, a tmpfs mount. Whether the kernel backs tmpfs
// pages with huge (PMD-size, 2 MiB on x86-64) pages is decided, as the
// kernel's admin-guide/mm/transhuge documentation says, by:
//   - /sys/kernel/mm/transparent_hugepage/shmem_enabled when it is "deny"
//     (off on every mount) or "force" (on everywhere). Its other values
//     (always, within_size, advise, never) govern only the kernel's internal
//     shm mount (SysV shm, memfd, shared anonymous memory), not /dev/shm;
//   - otherwise the huge= option of the /dev/shm mount ("never" when the
//     mount has none): always and within_size allocate huge pages by
//     themselves, advise only inside mappings marked MADV_HUGEPAGE.
// The store marks a shard's mapping MADV_HUGEPAGE before its threads reserve
// the pages (ShmSegment::Reserve), so under "advise" they can be huge from
// the start. Pages that came small (on a kernel that reserves by
// posix_fallocate, which sees no advice, or when no huge page was free) are
// then asked for with MADV_COLLAPSE (Linux 6.1+), which replaces them with
// huge pages synchronously where memory allows; both are requests, and the
// kernel may grant less.
//
// A store in private memory (ps.memory_kind; shm_segment.h CreatePrivate)
// is anonymous memory of its process: whether it may get huge pages is
// /sys/kernel/mm/transparent_hugepage/enabled's choice ("always" or
// "madvise": inside mappings marked MADV_HUGEPAGE; "never": not at all).
// Its huge pages show as AnonHugePages in smaps, a shared mapping's as
// ShmemPmdMapped.
//
// The parsing functions take file contents, so tests can feed them any
// machine's files; the Read* functions read this machine's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shardwild {

// What a store asked for and got. Returned by ShmParamStore::huge_pages().
struct HugePageStatus {
  // Every shard was marked with madvise(MADV_HUGEPAGE) (ps.huge_pages: auto
  // and the settings below allow huge pages on /dev/shm).
  bool requested = false;
  // The selected value of /sys/kernel/mm/transparent_hugepage/shmem_enabled
  // ("never", "advise", ...); empty when the file is absent (no THP).
  std::string shmem_enabled;
  // The huge= option of the /dev/shm mount ("never" when it has none); empty
  // when /dev/shm is not a mount point listed in /proc/self/mounts.
  std::string tmpfs_huge;
  // The selected value of /sys/kernel/mm/transparent_hugepage/enabled (which
  // governs a private store's pages, ShmParamStore::memory_kind); empty when
  // the file is absent.
  std::string thp_enabled;
  // Bytes of the shards mapped with PMD-size huge pages at the time of the
  // call (the ShmemPmdMapped lines of /proc/self/smaps for the shards'
  // mappings). Smaller multi-size THP folios are not counted. nullopt when it
  // cannot be told: smaps unreadable, or without that field.
  std::optional<uint64_t> granted_bytes;
};

// The value in brackets of a THP sysfs file ("always [advise] never" ->
// "advise"); empty if there is none.
std::string SelectedThpSetting(absl::string_view file_text);

// The huge= option of the last mount of `mount_point` in `mounts_text` (the
// format of /proc/self/mounts): "never" when that mount has no huge= option,
// empty when `mount_point` is not mounted.
std::string TmpfsHugeOption(absl::string_view mounts_text, absl::string_view mount_point);

// Whether a mapping of a file on a tmpfs mount with `tmpfs_huge` can get huge
// pages by asking, given `shmem_enabled` (rules above).
bool ShmHugePagesAllowed(absl::string_view shmem_enabled, absl::string_view tmpfs_huge);

// Whether anonymous memory marked MADV_HUGEPAGE can get huge pages, given
// transparent_hugepage/enabled ("always" or "madvise").
bool PrivateHugePagesAllowed(absl::string_view thp_enabled);

// A mapped address range [begin, end).
struct MappedRange {
  uintptr_t begin = 0;
  uintptr_t end = 0;
};

// Sums the `field` lines ("ShmemPmdMapped:" for shared memory,
// "AnonHugePages:" for private) over the areas of `smaps_text` (the format
// of /proc/self/smaps) that lie inside one of `ranges` (disjoint, each a
// whole mapping, so page-aligned). nullopt when the areas inside do not
// cover the ranges exactly, an area overlaps a range without lying inside
// it, or an area inside has no such line.
std::optional<uint64_t> PmdMappedBytes(absl::string_view smaps_text, absl::Span<const MappedRange> ranges,
                                       absl::string_view field);
inline std::optional<uint64_t> ShmemPmdMappedBytes(absl::string_view smaps_text,
                                                   absl::Span<const MappedRange> ranges) {
  return PmdMappedBytes(smaps_text, ranges, "ShmemPmdMapped:");
}

// This machine's settings: shmem_enabled, the huge= option of /dev/shm and
// transparent_hugepage/enabled. Fields that cannot be read are empty.
// Thread-safe.
struct HugePageSettings {
  std::string shmem_enabled;
  std::string tmpfs_huge;
  std::string thp_enabled;
  // Shared memory on /dev/shm can get huge pages.
  bool allowed() const { return ShmHugePagesAllowed(shmem_enabled, tmpfs_huge); }
  // Private (anonymous) memory can.
  bool private_allowed() const { return PrivateHugePagesAllowed(thp_enabled); }
};
HugePageSettings ReadHugePageSettings();

// madvise(MADV_HUGEPAGE) on [addr, addr + bytes); `addr` page-aligned. Returns
// whether the kernel accepted it.
bool AdviseHugePages(void* addr, size_t bytes);

// madvise(MADV_COLLAPSE) on [addr, addr + bytes): best effort, may take a
// while (it copies small pages into huge ones, compacting memory if needed).
// Failures (old kernel, no memory) are ignored: the pages stay small.
void CollapseHugePages(void* addr, size_t bytes);

// This process's /proc/self/smaps, for PmdMappedBytes; nullopt when it
// cannot be read. Reads the whole file (milliseconds in a large process):
// not for a hot path. Thread-safe.
std::optional<std::string> ReadSelfSmaps();

}  // namespace shardwild
