#include "ps_shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace shardwild {
namespace {

constexpr const char* kTooSmall = "(is /dev/shm large enough?)";

// Names of the segments this process owns, for removal from a signal
// handler. A slot is claimed with a CAS on `state` (0 free, 1 being written,
// 2 valid); the pid and path are written before the release store of 2, and
// the handler reads them after an acquire load of 2. A forked child inherits
// a copy of the table, so the handler skips slots another pid registered.
constexpr int kMaxOwned = 4096;
constexpr size_t kPathMax = 256;
struct OwnedSlot {
  std::atomic<int> state{0};
  pid_t pid;
  char path[kPathMax];
};
OwnedSlot g_owned[kMaxOwned];

void RegisterOwned(const std::string& name) {
  const std::string path = "/dev/shm/" + name;
  if (path.size() >= kPathMax) return;
  for (OwnedSlot& s : g_owned) {
    int expected = 0;
    if (s.state.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
      s.pid = getpid();
      std::memcpy(s.path, path.c_str(), path.size() + 1);
      s.state.store(2, std::memory_order_release);
      return;
    }
  }
}

void UnregisterOwned(const std::string& name) {
  const std::string path = "/dev/shm/" + name;
  for (OwnedSlot& s : g_owned) {
    if (s.state.load(std::memory_order_acquire) == 2 && path == s.path) {
      s.state.store(0, std::memory_order_release);
      return;
    }
  }
}

absl::Status ErrnoFor(const std::string& described, const std::string& what, int err) {
  const std::string msg = absl::StrCat(described, ": ", what, ": ", std::strerror(err));
  switch (err) {
    case EEXIST: return absl::AlreadyExistsError(msg);
    case ENOENT: return absl::NotFoundError(msg);
    case ENOSPC:
    case ENOMEM: return absl::ResourceExhaustedError(msg);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(msg);
    default: return absl::InternalError(msg);
  }
}

absl::Status Errno(const std::string& what, const std::string& name, int err) {
  return ErrnoFor(absl::StrCat("shared memory /", name), what, err);
}

// MemAvailable of /proc/meminfo in bytes; nullopt when it cannot be read.
std::optional<uint64_t> MemAvailableBytes() {
  FILE* f = std::fopen("/proc/meminfo", "re");
  if (f == nullptr) return std::nullopt;
  char line[256];
  std::optional<uint64_t> result;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long long kb = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
      result = static_cast<uint64_t>(kb) * 1024;
      break;
    }
  }
  std::fclose(f);
  return result;
}

absl::Status CheckName(const std::string& name) {
  if (name.empty() || name.size() > 200 || name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("shared memory name '", name, "' must be 1..200 characters without '/'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name, size_t bytes,
                                                               Reservation reservation) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  if (bytes == 0) return absl::InvalidArgumentError("shared memory segment of 0 bytes");
  const std::string shm_name = "/" + name;
  const int fd = shm_open(shm_name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", name, errno);
  RegisterOwned(name);
  auto fail = [&](const std::string& what, int err) {
    close(fd);
    shm_unlink(shm_name.c_str());
    UnregisterOwned(name);
    return Errno(what, name, err);
  };
  // The umask may have removed bits but never adds any; make the mode exact.
  if (fchmod(fd, 0600) != 0) return fail("cannot set mode 0600", errno);
  const std::string reserve_what = absl::StrCat("cannot reserve ", bytes, " bytes ", kTooSmall);
  if (reservation == Reservation::kAll) {
    if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) return fail(reserve_what, err);
  } else {
    // Only sized here: the owner's threads reserve the pages (Reserve), a
    // range each, in parallel. posix_fallocate would allocate and zero them
    // all on this thread (DLRM's 1.67 GB: 0.36-0.48 s of a 1.2 s set-up).
    // The free space is checked first, so a store that cannot fit fails
    // before anything is allocated.
    struct statvfs vfs;
    if (fstatvfs(fd, &vfs) == 0 && static_cast<unsigned __int128>(vfs.f_bavail) * vfs.f_frsize < bytes) {
      return fail(reserve_what, ENOSPC);
    }
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail(reserve_what, errno);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("cannot map", errno);
  if (reservation == Reservation::kAll) {
    close(fd);
    return std::unique_ptr<ShmSegment>(new ShmSegment(name, p, bytes, /*owner=*/true));
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, p, bytes, /*owner=*/true, fd));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::CreatePrivate(const std::string& name, size_t bytes,
                                                                      bool huge_pages) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  if (bytes == 0) return absl::InvalidArgumentError("private memory of 0 bytes");
  const std::string described = absl::StrCat("private memory ", name);
  if (const std::optional<uint64_t> avail = MemAvailableBytes(); avail && *avail < bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(described, ": cannot reserve ", bytes, " bytes: only ", *avail,
                                                     " are available (MemAvailable in /proc/meminfo)"));
  }
  // The mapping is widened to whole pages (2 MiB ones with huge pages, made
  // to start on a 2 MiB boundary so that every part of it can be a huge
  // page) and gets an inaccessible guard page on each side: they catch a
  // stray access past either end, and keep the kernel from merging it with
  // a neighbouring anonymous mapping, so that smaps accounts for it alone
  // (huge_pages.h). Mapped longer by the alignment, the slack unmapped.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t align = huge_pages ? size_t{2} << 20 : page;
  const size_t map_bytes = (bytes + align - 1) / align * align;
  const size_t reserve = map_bytes + align + 2 * page;
  if (map_bytes < bytes || reserve < map_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(described, ": ", bytes, " bytes is too large"));
  }
  void* p = mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return ErrnoFor(described, absl::StrCat("cannot map ", bytes, " bytes"), errno);
  char* const base = static_cast<char*>(p);
  const uintptr_t first = reinterpret_cast<uintptr_t>(base) + page;
  char* const start = base + ((first + align - 1) / align * align - reinterpret_cast<uintptr_t>(base));
  char* const end = start + map_bytes;
  if (start - page > base) munmap(base, static_cast<size_t>(start - page - base));
  if (base + reserve > end + page) munmap(end + page, static_cast<size_t>(base + reserve - (end + page)));
  if (mprotect(start - page, page, PROT_NONE) != 0 || mprotect(end, page, PROT_NONE) != 0) {
    const int err = errno;
    munmap(start - page, map_bytes + 2 * page);
    return ErrnoFor(described, "cannot protect its guard pages", err);
  }
  // Best effort: a kernel without THP refuses the advice, and the pages are
  // small.
  if (huge_pages) (void)madvise(start, map_bytes, MADV_HUGEPAGE);
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, start, bytes, /*owner=*/true, /*fd=*/-1, map_bytes));
}

size_t ShmSegment::mapped_bytes() const {
  if (is_private()) return map_bytes_;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (size_ + page - 1) / page * page;
}

std::string ShmSegment::Describe() const {
  return is_private() ? absl::StrCat("private memory ", name_) : absl::StrCat("shared memory /", name_);
}

absl::Status ShmSegment::Reserve(size_t offset, size_t bytes) const {
  if (fd_ < 0 && !is_private()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(), ": Reserve on a segment not created with Reservation::kByOwner"));
  }
  if (offset > size_ || bytes > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(), ": cannot reserve [", offset, ", ",
                                                   offset + bytes, "): the segment has ", size_, " bytes"));
  }
  if (bytes == 0) return absl::OkStatus();
  // madvise wants a page-aligned start; the range is widened to the page
  // holding `offset` (the segment's start is page aligned).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  char* const start = static_cast<char*>(data_) + begin;
  const size_t len = offset + bytes - begin;
  int err = 0;
  // EINTR (a signal while populating) and EAGAIN (a transient failure to
  // fault a page in) are retried: the pages already populated stay.
  for (int attempt = 0; attempt < 16; ++attempt) {
    if (madvise(start, len, MADV_POPULATE_WRITE) == 0) return absl::OkStatus();
    err = errno;
    if (err != EINTR && err != EAGAIN) break;
  }
  if (is_private()) {
    // A kernel before 5.14 cannot populate: the pages come at their first
    // write instead (zeroed, as they would have been here).
    if (err == EINVAL) return absl::OkStatus();
    if (err == EFAULT) err = ENOMEM;
    return ErrnoFor(Describe(), absl::StrCat("cannot reserve ", len, " bytes at offset ", begin,
                                             " (is there enough free memory?)"), err);
  }
  if (err == EINVAL) {
    // A kernel before 5.14: the pages are allocated, not yet mapped.
    err = posix_fallocate(fd_, static_cast<off_t>(begin), static_cast<off_t>(len));
    if (err == 0) return absl::OkStatus();
  }
  // A page that cannot be allocated (tmpfs full) makes the populate fail
  // with EFAULT, where a plain write would have raised SIGBUS.
  if (err == EFAULT) err = ENOSPC;
  return ErrnoFor(Describe(), absl::StrCat("cannot reserve ", len, " bytes at offset ", begin, " ", kTooSmall), err);
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Attach(const std::string& name) {
  if (absl::Status s = CheckName(name); !s.ok()) return s;
  const std::string shm_name = "/" + name;
  const int fd = shm_open(shm_name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return Errno("cannot attach", name, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return Errno("cannot stat", name, err);
  }
  if (st.st_size <= 0) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("shared memory /", name, " is empty"));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) return Errno("cannot map", name, err);
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, p, bytes, /*owner=*/false));
}

ShmSegment::~ShmSegment() {
  if (is_private()) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    munmap(static_cast<char*>(data_) - page, map_bytes_ + 2 * page);  // with its guard pages
    return;
  }
  munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  if (owner_) {
    shm_unlink(("/" + name_).c_str());
    UnregisterOwned(name_);
  }
}

bool ShmSegment::Exists(const std::string& name) {
  const int fd = shm_open(("/" + name).c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return errno != ENOENT;
  close(fd);
  return true;
}

void ShmSegment::UnlinkAllOwnedSegmentsFromSignal() {
  const pid_t self = getpid();  // async-signal-safe
  for (OwnedSlot& s : g_owned) {
    if (s.state.load(std::memory_order_acquire) == 2 && s.pid == self) unlink(s.path);
  }
}

}  // namespace shardwild
