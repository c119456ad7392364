#include "ps_shm/shm_segment.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

// A name no other test, run or process uses: pid, a per-process nonce and a
// counter.
std::string UniqueName(const std::string& tag) {
  static const uint32_t nonce = std::random_device{}();
  static std::atomic<int> counter{0};
  return absl::StrCat("swtest-seg-", tag, "-", getpid(), "-", nonce, "-", counter.fetch_add(1));
}

// Exit codes of forked children. The children run no gtest assertions; they
// report what went wrong through their exit status.
constexpr int kChildOk = 0;
constexpr int kChildCreateFailed = 10;
constexpr int kChildSigactionFailed = 11;
constexpr int kChildPipeFailed = 12;

// Waits for `pid` and returns its raw wait status (or -1 on error).
int WaitFor(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

TEST(ShmSegmentTest, CreatedSegmentHasMode0600EvenWithPermissiveUmask) {
  const std::string name = UniqueName("mode");
  const mode_t old_umask = umask(0);
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Create(name, 4096);
  umask(old_umask);
  ASSERT_TRUE(seg.ok()) << seg.status();

  struct stat st;
  ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0) << std::strerror(errno);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_uid, geteuid());
}

TEST(ShmSegmentTest, CreateReportsSizeNameAndOwnership) {
  const std::string name = UniqueName("props");
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Create(name, 10000);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ((*seg)->name(), name);
  EXPECT_EQ((*seg)->size(), 10000u);
  EXPECT_TRUE((*seg)->owner());
  EXPECT_NE((*seg)->data(), nullptr);
  EXPECT_TRUE(ShmSegment::Exists(name));
}

TEST(ShmSegmentTest, CreateOnExistingNameIsAlreadyExists) {
  const std::string name = UniqueName("exists");
  absl::StatusOr<std::unique_ptr<ShmSegment>> first = ShmSegment::Create(name, 4096);
  ASSERT_TRUE(first.ok()) << first.status();
  static_cast<char*>((*first)->data())[0] = 42;

  absl::StatusOr<std::unique_ptr<ShmSegment>> second = ShmSegment::Create(name, 4096);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  EXPECT_NE(second.status().message().find(name), absl::string_view::npos) << second.status();

  // The failed Create must not have removed or truncated the first segment.
  EXPECT_TRUE(ShmSegment::Exists(name));
  EXPECT_EQ(static_cast<char*>((*first)->data())[0], 42);
}

TEST(ShmSegmentTest, MemoryReadsZerosAndIsWritable) {
  constexpr size_t kBytes = 3 * 4096 + 100;
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Create(UniqueName("zeros"), kBytes);
  ASSERT_TRUE(seg.ok()) << seg.status();
  unsigned char* p = static_cast<unsigned char*>((*seg)->data());
  for (size_t i = 0; i < kBytes; ++i) {
    ASSERT_EQ(p[i], 0) << "byte " << i;
  }
  for (size_t i = 0; i < kBytes; ++i) p[i] = static_cast<unsigned char>(i * 31 + 7);
  for (size_t i = 0; i < kBytes; ++i) {
    ASSERT_EQ(p[i], static_cast<unsigned char>(i * 31 + 7)) << "byte " << i;
  }
}

TEST(ShmSegmentTest, AttachMapsTheSameMemory) {
  const std::string name = UniqueName("attach");
  absl::StatusOr<std::unique_ptr<ShmSegment>> owner = ShmSegment::Create(name, 8192);
  ASSERT_TRUE(owner.ok()) << owner.status();
  absl::StatusOr<std::unique_ptr<ShmSegment>> other = ShmSegment::Attach(name);
  ASSERT_TRUE(other.ok()) << other.status();

  EXPECT_FALSE((*other)->owner());
  EXPECT_EQ((*other)->name(), name);
  EXPECT_EQ((*other)->size(), 8192u);
  EXPECT_NE((*other)->data(), (*owner)->data());  // two mappings of one object

  char* a = static_cast<char*>((*owner)->data());
  char* b = static_cast<char*>((*other)->data());
  a[0] = 'x';
  a[8191] = 'y';
  EXPECT_EQ(b[0], 'x');
  EXPECT_EQ(b[8191], 'y');
  b[4096] = 'z';
  EXPECT_EQ(a[4096], 'z');
}

TEST(ShmSegmentTest, AttachOnMissingNameIsNotFound) {
  const std::string name = UniqueName("missing");
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Attach(name);
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kNotFound) << seg.status();
  EXPECT_NE(seg.status().message().find(name), absl::string_view::npos) << seg.status();
  EXPECT_FALSE(ShmSegment::Exists(name));
}

TEST(ShmSegmentTest, DestroyingTheOwnerUnlinks) {
  const std::string name = UniqueName("unlink");
  {
    absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Create(name, 4096);
    ASSERT_TRUE(seg.ok()) << seg.status();
    EXPECT_TRUE(ShmSegment::Exists(name));
  }
  EXPECT_FALSE(ShmSegment::Exists(name));
  // The name is free again.
  absl::StatusOr<std::unique_ptr<ShmSegment>> again = ShmSegment::Create(name, 4096);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(ShmSegmentTest, DestroyingANonOwnerDoesNotUnlink) {
  const std::string name = UniqueName("nonowner");
  absl::StatusOr<std::unique_ptr<ShmSegment>> owner = ShmSegment::Create(name, 4096);
  ASSERT_TRUE(owner.ok()) << owner.status();
  static_cast<char*>((*owner)->data())[10] = 5;
  {
    absl::StatusOr<std::unique_ptr<ShmSegment>> other = ShmSegment::Attach(name);
    ASSERT_TRUE(other.ok()) << other.status();
  }
  EXPECT_TRUE(ShmSegment::Exists(name));
  EXPECT_EQ(static_cast<char*>((*owner)->data())[10], 5);
  absl::StatusOr<std::unique_ptr<ShmSegment>> again = ShmSegment::Attach(name);
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(ShmSegmentTest, ChildThatExitsNormallyLeavesNothingBehind) {
  const std::string name = UniqueName("child-exit");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    {
      absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Create(name, 4096);
      if (!seg.ok()) _exit(kChildCreateFailed);
      static_cast<char*>((*seg)->data())[0] = 1;
    }  // the destructor unlinks
    _exit(kChildOk);
  }
  const int status = WaitFor(pid);
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), kChildOk);
  EXPECT_FALSE(ShmSegment::Exists(name));
}

// What the CLI installs for SIGTERM: remove this process's segments, then die
// of the signal as usual.
void UnlinkAndDie(int sig) {
  ShmSegment::UnlinkAllOwnedSegmentsFromSignal();
  signal(sig, SIG_DFL);
  raise(sig);
}

TEST(ShmSegmentTest, ChildKilledBySignalUnlinksOnlyItsOwnSegments) {
  // The parent owns a segment when it forks: the child inherits a copy of the
  // registry, but its handler must remove only what the child created.
  const std::string parent_name = UniqueName("parent");
  absl::StatusOr<std::unique_ptr<ShmSegment>> parent_seg = ShmSegment::Create(parent_name, 4096);
  ASSERT_TRUE(parent_seg.ok()) << parent_seg.status();

  const std::string name1 = UniqueName("child-sig");
  const std::string name2 = UniqueName("child-sig");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0) << std::strerror(errno);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    close(ready[0]);
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = UnlinkAndDie;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, nullptr) != 0) _exit(kChildSigactionFailed);
    // Two segments, which the process never gets to destroy.
    absl::StatusOr<std::unique_ptr<ShmSegment>> seg1 = ShmSegment::Create(name1, 4096);
    absl::StatusOr<std::unique_ptr<ShmSegment>> seg2 = ShmSegment::Create(name2, 8192);
    if (!seg1.ok() || !seg2.ok()) _exit(kChildCreateFailed);
    const char byte = 1;
    if (write(ready[1], &byte, 1) != 1) _exit(kChildPipeFailed);
    for (;;) pause();
  }
  close(ready[1]);
  char byte = 0;
  const ssize_t n = read(ready[0], &byte, 1);
  close(ready[0]);
  if (n != 1) {
    // The child failed before it was ready; report how.
    const int status = WaitFor(pid);
    FAIL() << "child not ready; wait status " << status << " (exit code "
           << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << ")";
  }
  EXPECT_TRUE(ShmSegment::Exists(name1));
  EXPECT_TRUE(ShmSegment::Exists(name2));

  ASSERT_EQ(kill(pid, SIGTERM), 0) << std::strerror(errno);
  const int status = WaitFor(pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "wait status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_FALSE(ShmSegment::Exists(name1));
  EXPECT_FALSE(ShmSegment::Exists(name2));
  EXPECT_TRUE(ShmSegment::Exists(parent_name));
}

TEST(ShmSegmentTest, HugeCreateFailsCleanly) {
  const std::string name = UniqueName("huge");
  constexpr size_t kOnePiB = size_t{1} << 50;
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Create(name, kOnePiB);
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kResourceExhausted) << seg.status();
  EXPECT_NE(seg.status().message().find(name), absl::string_view::npos) << seg.status();
  EXPECT_FALSE(ShmSegment::Exists(name));
  // Nothing left registered either: the name can be created normally.
  absl::StatusOr<std::unique_ptr<ShmSegment>> small = ShmSegment::Create(name, 4096);
  EXPECT_TRUE(small.ok()) << small.status();
}

// Bytes of /dev/shm/<name> that have pages (st_blocks), or -1.
int64_t AllocatedBytes(const std::string& name) {
  struct stat st;
  if (stat(("/dev/shm/" + name).c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_blocks) * 512;
}

// Two threads reserve the halves of `seg`'s `bytes` (the split not page
// aligned); then every byte must read as zero.
void ReserveHalvesInTwoThreadsAndCheckZeros(const ShmSegment& seg, size_t bytes) {
  const size_t half = bytes / 2 + 10;
  absl::Status first, second;
  std::thread t([&] { first = seg.Reserve(0, half); });
  second = seg.Reserve(half, bytes - half);
  t.join();
  ASSERT_TRUE(first.ok()) << first;
  ASSERT_TRUE(second.ok()) << second;
  const auto* data = static_cast<const unsigned char*>(seg.data());
  size_t nonzero = 0;
  for (size_t i = 0; i < bytes; ++i) nonzero += data[i] != 0;
  EXPECT_EQ(nonzero, 0u);
}

// A segment reserved by its owner has no pages until Reserve; two threads
// reserving halves (one range not page aligned) allocate them all, the
// memory reads as zeros, and what is written is what another mapping reads.
TEST(ShmSegmentTest, ReservedByOwnerHasItsPagesOnlyOnceReserved) {
  const std::string name = UniqueName("byowner");
  constexpr size_t kBytes = (size_t{3} << 20) + 100;
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg =
      ShmSegment::Create(name, kBytes, ShmSegment::Reservation::kByOwner);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ(AllocatedBytes(name), 0);
  ASSERT_NO_FATAL_FAILURE(ReserveHalvesInTwoThreadsAndCheckZeros(**seg, kBytes));
  EXPECT_GE(AllocatedBytes(name), static_cast<int64_t>(kBytes));
  auto* bytes = static_cast<unsigned char*>((*seg)->data());
  bytes[0] = 7;
  bytes[kBytes - 1] = 9;
  absl::StatusOr<std::unique_ptr<ShmSegment>> other = ShmSegment::Attach(name);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(static_cast<unsigned char*>((*other)->data())[0], 7);
  EXPECT_EQ(static_cast<unsigned char*>((*other)->data())[kBytes - 1], 9);
  // Ranges outside the segment, and Reserve where Create reserved all.
  EXPECT_EQ((*seg)->Reserve(kBytes - 10, 11).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*seg)->Reserve(kBytes + 1, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*seg)->Reserve(kBytes, 0).ok());
  absl::StatusOr<std::unique_ptr<ShmSegment>> all = ShmSegment::Create(UniqueName("all"), 4096);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ((*all)->Reserve(0, 4096).code(), absl::StatusCode::kFailedPrecondition);
}

// A segment larger than /dev/shm fails at Create with the reservation left
// to its owner too, before any page is allocated, and leaves nothing behind.
TEST(ShmSegmentTest, HugeCreateReservedByOwnerFailsCleanly) {
  const std::string name = UniqueName("hugebyowner");
  constexpr size_t kOnePiB = size_t{1} << 50;
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg =
      ShmSegment::Create(name, kOnePiB, ShmSegment::Reservation::kByOwner);
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kResourceExhausted) << seg.status();
  EXPECT_NE(seg.status().message().find(name), absl::string_view::npos) << seg.status();
  EXPECT_NE(seg.status().message().find("/dev/shm large enough"), absl::string_view::npos) << seg.status();
  EXPECT_FALSE(ShmSegment::Exists(name));
  absl::StatusOr<std::unique_ptr<ShmSegment>> small =
      ShmSegment::Create(name, 4096, ShmSegment::Reservation::kByOwner);
  EXPECT_TRUE(small.ok()) << small.status();
}

// ---- Private memory (CreatePrivate) -----------------------------------------

// Private memory is reserved by its owner like a segment reserved by its
// owner, reads as zeros, and leaves no trace in /dev/shm: no other process
// can find it.
TEST(ShmSegmentTest, PrivateMemoryIsReservedZeroedAndInvisibleToOthers) {
  const std::string name = UniqueName("private");
  constexpr size_t kBytes = (size_t{3} << 20) + 100;
  for (bool huge : {false, true}) {
    SCOPED_TRACE(huge ? "huge pages" : "small pages");
    absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::CreatePrivate(name, kBytes, huge);
    ASSERT_TRUE(seg.ok()) << seg.status();
    EXPECT_TRUE((*seg)->is_private());
    EXPECT_EQ((*seg)->size(), kBytes);
    EXPECT_EQ((*seg)->name(), name);
    const size_t align = huge ? size_t{2} << 20 : static_cast<size_t>(sysconf(_SC_PAGESIZE));
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*seg)->data()) % align, 0u);
    EXPECT_EQ((*seg)->mapped_bytes() % align, 0u);
    EXPECT_GE((*seg)->mapped_bytes(), kBytes);
    EXPECT_LT((*seg)->mapped_bytes(), kBytes + align);
    EXPECT_FALSE(ShmSegment::Exists(name));
    EXPECT_EQ(AllocatedBytes(name), -1);
    EXPECT_EQ(ShmSegment::Attach(name).status().code(), absl::StatusCode::kNotFound);
    ASSERT_NO_FATAL_FAILURE(ReserveHalvesInTwoThreadsAndCheckZeros(**seg, kBytes));
    auto* bytes = static_cast<unsigned char*>((*seg)->data());
    // Reserving again keeps what is there.
    bytes[5] = 7;
    ASSERT_TRUE((*seg)->Reserve(0, 4096).ok());
    EXPECT_EQ(bytes[5], 7);
    EXPECT_EQ((*seg)->Reserve(kBytes - 10, 11).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE((*seg)->Reserve(kBytes, 0).ok());
  }
}

// The guard pages on both sides of private memory catch a stray access.
TEST(ShmSegmentDeathTest, PrivateMemoryHasGuardPages) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::CreatePrivate(UniqueName("guard"), 5000, false);
  ASSERT_TRUE(seg.ok()) << seg.status();
  auto* bytes = static_cast<volatile unsigned char*>((*seg)->data());
  bytes[(*seg)->mapped_bytes() - 1] = 1;  // the last byte mapped is usable
  EXPECT_DEATH(bytes[(*seg)->mapped_bytes()] = 1, "");
  EXPECT_DEATH(bytes[-1] = 1, "");
}

// More than this machine has available fails before anything is mapped,
// naming the memory: a size that mmap would grant (MAP_NORESERVE, well inside
// the address space) but MemAvailable does not cover, so only the check
// refuses it.
TEST(ShmSegmentTest, PrivateCreateBeyondMemAvailableFailsCleanly) {
  std::ifstream meminfo("/proc/meminfo");
  uint64_t avail_kb = 0;
  for (std::string key; meminfo >> key;) {
    if (key == "MemAvailable:") {
      meminfo >> avail_kb;
      break;
    }
  }
  if (avail_kb == 0) GTEST_SKIP() << "no MemAvailable in /proc/meminfo";
  const std::string name = UniqueName("hugeprivate");
  const size_t bytes = static_cast<size_t>(avail_kb) * 1024 * 2 + (size_t{1} << 30);
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::CreatePrivate(name, bytes, true);
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kResourceExhausted) << seg.status();
  EXPECT_NE(seg.status().message().find("private memory " + name), absl::string_view::npos) << seg.status();
  EXPECT_NE(seg.status().message().find("MemAvailable"), absl::string_view::npos) << seg.status();
  EXPECT_EQ(ShmSegment::CreatePrivate(name, 0, false).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShmSegmentTest, ZeroBytesIsInvalidArgument) {
  const std::string name = UniqueName("zero");
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Create(name, 0);
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kInvalidArgument) << seg.status();
  EXPECT_FALSE(ShmSegment::Exists(name));
}

TEST(ShmSegmentTest, InvalidNamesAreRejected) {
  for (const std::string& name : {std::string("a/b"), std::string(""), std::string("/lead"),
                                  std::string(201, 'n')}) {
    SCOPED_TRACE("name '" + name + "'");
    absl::StatusOr<std::unique_ptr<ShmSegment>> created = ShmSegment::Create(name, 4096);
    EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument) << created.status();
    absl::StatusOr<std::unique_ptr<ShmSegment>> attached = ShmSegment::Attach(name);
    EXPECT_EQ(attached.status().code(), absl::StatusCode::kInvalidArgument) << attached.status();
  }
}

TEST(ShmSegmentTest, LongestValidNameWorks) {
  std::string name = UniqueName("long");
  name.append(200 - name.size(), 'x');
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Create(name, 4096);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_TRUE(ShmSegment::Exists(name));
  seg->reset();
  EXPECT_FALSE(ShmSegment::Exists(name));
}

}  // namespace
}  // namespace shardwild
