#include "ps_shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

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

absl::Status Errno(const std::string& what, const std::string& name, int err) {
  const std::string msg = absl::StrCat("shared memory /", name, ": ", what, ": ", std::strerror(err));
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

absl::Status ShmSegment::Reserve(size_t offset, size_t bytes) const {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory /", name_, ": Reserve on a segment not created with Reservation::kByOwner"));
  }
  if (offset > size_ || bytes > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("shared memory /", name_, ": cannot reserve [", offset, ", ",
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
  if (err == EINVAL) {
    // A kernel before 5.14: the pages are allocated, not yet mapped.
    err = posix_fallocate(fd_, static_cast<off_t>(begin), static_cast<off_t>(len));
    if (err == 0) return absl::OkStatus();
  }
  // A page that cannot be allocated (tmpfs full) makes the populate fail
  // with EFAULT, where a plain write would have raised SIGBUS.
  if (err == EFAULT) err = ENOSPC;
  return Errno(absl::StrCat("cannot reserve ", len, " bytes at offset ", begin, " ", kTooSmall), name_, err);
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
