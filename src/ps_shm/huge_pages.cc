#include "ps_shm/huge_pages.h"

#include <sys/mman.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1 (asm-generic/mman-common.h)
#endif

namespace shardwild {
namespace {

constexpr char kShmemEnabledPath[] = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
constexpr char kThpEnabledPath[] = "/sys/kernel/mm/transparent_hugepage/enabled";
constexpr char kShmMountPoint[] = "/dev/shm";

// The whole of a (proc or sys) file; nullopt if it cannot be opened.
std::optional<std::string> ReadWholeFile(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// "7f00-7f80 rw-s ..." -> [0x7f00, 0x7f80).
std::optional<MappedRange> ParseAreaHeader(absl::string_view first_token) {
  const size_t dash = first_token.find('-');
  if (dash == absl::string_view::npos) return std::nullopt;
  uint64_t begin = 0, end = 0;
  if (!absl::SimpleHexAtoi(first_token.substr(0, dash), &begin) ||
      !absl::SimpleHexAtoi(first_token.substr(dash + 1), &end) || end < begin) {
    return std::nullopt;
  }
  return MappedRange{static_cast<uintptr_t>(begin), static_cast<uintptr_t>(end)};
}

}  // namespace

std::string SelectedThpSetting(absl::string_view file_text) {
  const size_t open = file_text.find('[');
  if (open == absl::string_view::npos) return "";
  const size_t close = file_text.find(']', open);
  if (close == absl::string_view::npos) return "";
  return std::string(file_text.substr(open + 1, close - open - 1));
}

std::string TmpfsHugeOption(absl::string_view mounts_text, absl::string_view mount_point) {
  std::string result;
  for (absl::string_view line : absl::StrSplit(mounts_text, '\n', absl::SkipEmpty())) {
    // device mount_point type options dump pass
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 4 || f[1] != mount_point) continue;
    result = "never";  // a later mount of the same point hides the earlier one
    for (absl::string_view opt : absl::StrSplit(f[3], ',')) {
      if (absl::ConsumePrefix(&opt, "huge=")) result = std::string(opt);
    }
  }
  return result;
}

bool ShmHugePagesAllowed(absl::string_view shmem_enabled, absl::string_view tmpfs_huge) {
  if (shmem_enabled.empty() || shmem_enabled == "deny") return false;  // no THP, or off everywhere
  if (shmem_enabled == "force") return true;
  return tmpfs_huge == "always" || tmpfs_huge == "within_size" || tmpfs_huge == "advise";
}

bool PrivateHugePagesAllowed(absl::string_view thp_enabled) {
  return thp_enabled == "always" || thp_enabled == "madvise";
}

std::optional<uint64_t> PmdMappedBytes(absl::string_view smaps_text, absl::Span<const MappedRange> ranges,
                                       absl::string_view field) {
  uint64_t pmd_bytes = 0;
  uint64_t area_bytes = 0;      // of the areas inside `ranges`, to check they cover them
  bool in_area = false;         // the current area lies inside a range
  bool area_has_field = false;  // ... and its `field` line was seen
  for (absl::string_view line : absl::StrSplit(smaps_text, '\n', absl::SkipEmpty())) {
    const absl::string_view first = line.substr(0, line.find(' '));
    if (!first.empty() && first.back() == ':') {
      if (in_area && first == field) {
        // "ShmemPmdMapped:     2048 kB"
        absl::string_view value = absl::StripAsciiWhitespace(line.substr(first.size()));
        if (!absl::ConsumeSuffix(&value, " kB")) return std::nullopt;
        uint64_t kb = 0;
        if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(value), &kb)) return std::nullopt;
        pmd_bytes += kb * 1024;
        area_has_field = true;
      }
      continue;
    }
    const std::optional<MappedRange> area = ParseAreaHeader(first);
    if (!area) continue;
    if (in_area && !area_has_field) return std::nullopt;
    in_area = false;
    area_has_field = false;
    for (const MappedRange& r : ranges) {
      if (area->end <= r.begin || area->begin >= r.end) continue;              // disjoint
      if (area->begin < r.begin || area->end > r.end) return std::nullopt;    // straddles
      in_area = true;
      area_bytes += area->end - area->begin;
    }
  }
  if (in_area && !area_has_field) return std::nullopt;
  uint64_t range_bytes = 0;
  for (const MappedRange& r : ranges) range_bytes += r.end - r.begin;
  if (area_bytes != range_bytes) return std::nullopt;  // some of the ranges are not mapped
  return pmd_bytes;
}

HugePageSettings ReadHugePageSettings() {
  HugePageSettings s;
  if (std::optional<std::string> t = ReadWholeFile(kShmemEnabledPath)) s.shmem_enabled = SelectedThpSetting(*t);
  if (std::optional<std::string> t = ReadWholeFile("/proc/self/mounts")) {
    s.tmpfs_huge = TmpfsHugeOption(*t, kShmMountPoint);
  }
  if (std::optional<std::string> t = ReadWholeFile(kThpEnabledPath)) s.thp_enabled = SelectedThpSetting(*t);
  return s;
}

bool AdviseHugePages(void* addr, size_t bytes) { return madvise(addr, bytes, MADV_HUGEPAGE) == 0; }

void CollapseHugePages(void* addr, size_t bytes) { (void)madvise(addr, bytes, MADV_COLLAPSE); }

std::optional<std::string> ReadSelfSmaps() { return ReadWholeFile("/proc/self/smaps"); }

}  // namespace shardwild
