// Stale segments: shared memory that a run which is gone left behind.
//
// A store's segments are "/dev/shm/<job>-<pid>-<nonce>-s<k>" (<pid> the
// creator in decimal, <nonce> 8 lowercase hex digits; shm_store.cc), and each
// starts with a ShardHeader recording owner_pid (shard_format.h). A run that
// returns or dies by a signal the CLI handles unlinks its segments; one that
// is SIGKILLed (or crashes hard) leaves them, holding memory until reboot.
//
// A store may also have a metadata segment "J-<pid>-<nonce>-meta"
// (store_metadata.h), starting with a StoreMetaHeader.
//
// A segment of job J is stale when all of these hold:
//   - its name is exactly "J-<pid>-<nonce>-s<k>" or "J-<pid>-<nonce>-meta";
//   - it is a regular file owned by this process's effective user;
//   - a shard starts with a ShardHeader with kShardMagic, owner_pid == <pid>,
//     shard_index == k and store_name == "J-<pid>-<nonce>" (any format
//     version: a segment of an older build is stale all the same); a
//     metadata segment with a StoreMetaHeader with kStoreMetaMagic,
//     owner_pid == <pid> and the same store_name (any format version);
//   - kill(<pid>, 0) fails with ESRCH: no such process.
// Anything else is never listed and never removed: another user's segment,
// one that cannot be read, a file with other content (including a segment
// whose creator died before writing its header), and every segment whose
// pid names a process that exists: this one, one of another user (EPERM), or
// a zombie not yet reaped.
//
// Limitations (pids are not unique in time or space):
//   - A pid reused by an unrelated live process makes a stale segment look
//     alive. It is then kept, which is the safe direction; a later run
//     removes it once that process is gone.
//   - A process in another pid namespace that shares this /dev/shm (two
//     containers with a shared IPC mount) is invisible here, so its live
//     segments would look stale. Give such runs distinct ps.job_name values.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardwild {

struct StaleSegment {
  std::string name;    // without the leading '/': the file is /dev/shm/<name>
  pid_t pid = 0;       // the process that created it, which no longer exists
  uint64_t bytes = 0;  // its size
};

// Lists the stale segments of `job_name` (rules above), sorted by name. An
// empty list when there are none or there is no /dev/shm. Reads the directory
// and the first bytes of each candidate; changes nothing.
// Errors: InvalidArgument for an empty job name or one holding '/';
// PermissionDenied or Internal when /dev/shm cannot be listed.
// Thread-safe.
absl::StatusOr<std::vector<StaleSegment>> FindStaleSegments(const std::string& job_name);

// Unlinks `segments` (from FindStaleSegments). Each is checked again just
// before: one that is no longer stale by the rules above is kept, and one
// that is already gone (another run removed it first) is fine. Processes that
// still map a removed segment keep their mapping.
// Returns OK unless unlinking a stale segment failed; the error then names
// every such segment and why.
// Thread-safe.
absl::Status RemoveStaleSegments(absl::Span<const StaleSegment> segments);

// "/dev/shm/a-12-0badf00d-s0 (pid 12, 4096 bytes), ..." for messages; lists at
// most `max_listed` and then says how many more there are.
std::string DescribeStaleSegments(absl::Span<const StaleSegment> segments, int max_listed = 8);

}  // namespace shardwild
