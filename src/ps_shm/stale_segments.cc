#include "ps_shm/stale_segments.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ps_shm/shard_format.h"

namespace shardwild {
namespace {

constexpr char kShmDir[] = "/dev/shm";

// The parts of "<job>-<pid>-<nonce>-s<k>" or "<job>-<pid>-<nonce>-meta".
struct SegmentName {
  pid_t pid = 0;
  uint32_t shard = 0;  // a shard's k
  bool meta = false;   // the store's metadata segment (store_metadata.h)
  std::string store;   // "<job>-<pid>-<nonce>"
};

// A decimal number as printf("%d") writes it: digits, no sign, no leading
// zero (except "0" itself), at most `max`.
std::optional<uint64_t> ParseDecimal(std::string_view s, uint64_t max) {
  if (s.empty() || s.size() > 10 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > max) return std::nullopt;
  return v;
}

// Parses `name` strictly as a segment of `job`. The pid has no '-' and the
// nonce is exactly 8 hex digits, so a segment of job "a" never parses as one
// of job "a-1" or the other way round.
std::optional<SegmentName> ParseSegmentName(std::string_view name, std::string_view job) {
  if (name.size() <= job.size() + 1 || name.substr(0, job.size()) != job || name[job.size()] != '-') return std::nullopt;
  std::string_view rest = name.substr(job.size() + 1);  // "<pid>-<nonce>-s<k>"
  const size_t dash = rest.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  const std::optional<uint64_t> pid = ParseDecimal(rest.substr(0, dash), 0x7fffffff);
  if (!pid || *pid == 0) return std::nullopt;
  rest.remove_prefix(dash + 1);  // "<nonce>-s<k>" or "<nonce>-meta"
  if (rest.size() < 8 + 3) return std::nullopt;
  for (char c : rest.substr(0, 8)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return std::nullopt;
  }
  SegmentName out;
  if (rest.substr(8) == "-meta") {
    out.meta = true;
  } else {
    if (rest.substr(8, 2) != "-s") return std::nullopt;
    const std::optional<uint64_t> shard = ParseDecimal(rest.substr(10), 4095);
    if (!shard) return std::nullopt;
    out.shard = static_cast<uint32_t>(*shard);
  }
  out.pid = static_cast<pid_t>(*pid);
  out.store = std::string(name.substr(0, name.size() - rest.size() + 8));
  return out;
}

// No process with this pid exists (in this pid namespace). EPERM means one
// exists that we may not signal: alive.
bool ProcessIsGone(pid_t pid) {
  if (pid == getpid()) return false;
  return kill(pid, 0) != 0 && errno == ESRCH;
}

// Whether the header of type H at the start of `fd` (a file of `size`
// bytes) passes `check`.
template <typename H, typename Check>
bool HeaderPasses(int fd, off_t size, const Check& check) {
  H h;
  return size >= static_cast<off_t>(sizeof(H)) && pread(fd, &h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h)) &&
         check(h);
}

// The checks that need the file: a regular file of ours holding a Shardwild
// header (a shard's, or a metadata segment's) that names `parsed`. Returns
// its size, or nullopt if any check fails or the file cannot be read.
std::optional<uint64_t> VerifyHeader(const std::string& name, const SegmentName& parsed) {
  const std::string path = absl::StrCat(kShmDir, "/", name);
  // O_NONBLOCK: never hang on a FIFO someone named like a segment.
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return std::nullopt;
  std::optional<uint64_t> result;
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) {
    bool ours = false;
    if (parsed.meta) {
      ours = HeaderPasses<StoreMetaHeader>(fd, st.st_size, [&](const StoreMetaHeader& h) {
        return h.magic == kStoreMetaMagic && h.owner_pid == parsed.pid &&
               std::memchr(h.store_name, 0, sizeof(h.store_name)) != nullptr && parsed.store == h.store_name;
      });
    } else {
      ours = HeaderPasses<ShardHeader>(fd, st.st_size, [&](const ShardHeader& h) {
        return h.magic == kShardMagic && h.owner_pid == parsed.pid &&
               // Segment k of a partial store holds global shard first_hosted_shard + k
               // (shard_format.h; the field reads 0 in format 3 segments, as it should).
               h.shard_index == static_cast<uint64_t>(parsed.shard) + h.first_hosted_shard &&
               std::memchr(h.store_name, 0, sizeof(h.store_name)) != nullptr && parsed.store == h.store_name;
      });
    }
    if (ours) result = static_cast<uint64_t>(st.st_size);
  }
  close(fd);
  return result;
}

// The job part of "<job>-<pid>-<nonce>-s<k>" (or "-meta"): everything before
// the third '-' from the end (the nonce is hex and the pid and k are decimal,
// so none of them holds a '-').
std::optional<std::string> JobOf(std::string_view name) {
  size_t end = name.size();
  for (int i = 0; i < 3; ++i) {
    if (end == 0) return std::nullopt;
    end = name.rfind('-', end - 1);
    if (end == std::string_view::npos || end == 0) return std::nullopt;
  }
  return std::string(name.substr(0, end));
}

// All the rules of the header comment for one directory entry.
std::optional<StaleSegment> CheckStale(const std::string& name, const std::string& job) {
  const std::optional<SegmentName> parsed = ParseSegmentName(name, job);
  if (!parsed || !ProcessIsGone(parsed->pid)) return std::nullopt;
  const std::optional<uint64_t> bytes = VerifyHeader(name, *parsed);
  if (!bytes) return std::nullopt;
  return StaleSegment{name, parsed->pid, *bytes};
}

}  // namespace

absl::StatusOr<std::vector<StaleSegment>> FindStaleSegments(const std::string& job_name) {
  if (job_name.empty() || job_name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("stale segments: bad job name '", job_name, "'"));
  }
  std::vector<StaleSegment> out;
  DIR* dir = opendir(kShmDir);
  if (dir == nullptr) {
    const int err = errno;
    if (err == ENOENT) return out;
    const std::string msg = absl::StrCat("cannot list ", kShmDir, ": ", std::strerror(err));
    return err == EACCES || err == EPERM ? absl::PermissionDeniedError(msg) : absl::InternalError(msg);
  }
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = readdir(dir)) {
    const std::string_view n(e->d_name);
    if (n.size() > job_name.size() && n.substr(0, job_name.size()) == job_name) names.emplace_back(n);
  }
  const int err = errno;
  closedir(dir);
  if (err != 0) return absl::InternalError(absl::StrCat("cannot list ", kShmDir, ": ", std::strerror(err)));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (std::optional<StaleSegment> s = CheckStale(name, job_name)) out.push_back(*std::move(s));
  }
  return out;
}

absl::Status RemoveStaleSegments(absl::Span<const StaleSegment> segments) {
  std::vector<std::string> failures;
  for (const StaleSegment& s : segments) {
    const std::optional<std::string> job = JobOf(s.name);
    if (!job || !CheckStale(s.name, *job)) continue;
    if (shm_unlink(absl::StrCat("/", s.name).c_str()) != 0 && errno != ENOENT) {
      failures.push_back(absl::StrCat(kShmDir, "/", s.name, ": ", std::strerror(errno)));
    }
  }
  if (failures.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cannot remove stale shared memory ", absl::StrJoin(failures, ", ")));
}

std::string DescribeStaleSegments(absl::Span<const StaleSegment> segments, int max_listed) {
  std::string out;
  const size_t listed = std::min(segments.size(), static_cast<size_t>(std::max(max_listed, 0)));
  for (size_t i = 0; i < listed; ++i) {
    const StaleSegment& s = segments[i];
    absl::StrAppend(&out, i > 0 ? ", " : "", kShmDir, "/", s.name, " (pid ", s.pid, ", ", s.bytes, " bytes)");
  }
  if (segments.size() > listed) absl::StrAppend(&out, listed > 0 ? ", " : "", "and ", segments.size() - listed, " more");
  return out;
}

}  // namespace shardwild
