#include "ps_shm/stale_segments.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/config/options.h"
#include "core/model/variable.h"
#include "gtest/gtest.h"
#include "ps_shm/param_store.h"
#include "ps_shm/shard_format.h"
#include "ps_shm/shm_segment.h"
#include "ps_shm/shm_store.h"
#include "ps_shm/store_metadata.h"

namespace shardwild {
namespace {

// Every name in /dev/shm that starts with `prefix`, sorted.
std::vector<std::string> ShmEntries(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (const dirent* e = readdir(dir)) {
    const std::string n = e->d_name;
    if (n.rfind(prefix, 0) == 0) out.push_back(n);
  }
  closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> Names(const std::vector<StaleSegment>& segments) {
  std::vector<std::string> out;
  for (const StaleSegment& s : segments) out.push_back(s.name);
  return out;
}

std::vector<std::string> SegmentNames(const std::string& store, int shards) {
  std::vector<std::string> out;
  for (int s = 0; s < shards; ++s) out.push_back(absl::StrCat(store, "-s", s));
  std::sort(out.begin(), out.end());
  return out;
}

int WaitFor(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

// The pid of a child that has exited and been reaped: no process has it
// (until the kernel hands it out again, which takes a full cycle of pids).
pid_t DeadPid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  WaitFor(pid);
  return pid;
}

OpenStoreOptions Options(const std::string& job, StaleSegmentPolicy policy, int shards = 1) {
  OpenStoreOptions o;
  o.store.job_name = job;
  o.store.stale_segments = policy;
  o.optimizer.type = OptimizerType::kSgd;
  o.num_shards = shards;
  return o;
}

std::vector<VariableSpec> Variables() { return {VariableSpec{"w", 8, 4, InitKind::kZeros}}; }

// How a crashed run ends.
enum class Crash { kExit, kSigkill };

// A run that crashed: its pid and its store's name.
struct CrashedRun {
  pid_t pid = -1;
  std::string store;
};

// Forks a child that creates a store of `job` with `shards` shards and then
// either _exit()s (no destructors run, as in a crash) or is SIGKILLed by us.
// Waits for the child (reaps it) unless `reap` is false; then it is a zombie
// until the caller waits for it.
CrashedRun CrashAfterCreate(const std::string& job, int shards, Crash how, bool reap = true) {
  CrashedRun run;
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return run;
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[0]);
    // The child runs no gtest assertions; an empty name tells the parent it failed.
    absl::StatusOr<std::unique_ptr<ShmParamStore>> store =
        ShmParamStore::Create(Options(job, StaleSegmentPolicy::kReport, shards), Variables());
    const std::string name = store.ok() ? (*store)->name() : std::string();
    const char len = static_cast<char>(name.size());
    if (write(pipe_fds[1], &len, 1) != 1 || write(pipe_fds[1], name.data(), name.size()) != static_cast<ssize_t>(name.size())) {
      _exit(2);
    }
    if (how == Crash::kSigkill) {
      for (;;) pause();
    }
    _exit(0);  // skips ~ShmParamStore: the segments stay
  }
  close(pipe_fds[1]);
  char len = 0;
  std::string name;
  if (pid > 0 && read(pipe_fds[0], &len, 1) == 1) {
    name.resize(static_cast<unsigned char>(len));
    if (read(pipe_fds[0], name.data(), name.size()) != static_cast<ssize_t>(name.size())) name.clear();
  }
  close(pipe_fds[0]);
  if (pid > 0 && how == Crash::kSigkill) kill(pid, SIGKILL);
  if (pid > 0 && reap) WaitFor(pid);
  run.pid = pid;
  run.store = name;
  return run;
}

// Writes /dev/shm/<name> with `bytes` of content.
bool WriteShmFile(const std::string& name, const void* bytes, size_t size) {
  const int fd = open(("/dev/shm/" + name).c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const bool ok = write(fd, bytes, size) == static_cast<ssize_t>(size);
  close(fd);
  return ok;
}

// A header as a store would write it for shard 0 of `store`, created by `pid`.
ShardHeader FakeHeader(const std::string& store, pid_t pid) {
  ShardHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kShardMagic;
  h.format_version = kShardFormatVersion;
  h.header_bytes = 4096;
  h.total_bytes = sizeof(h);
  h.owner_pid = pid;
  h.shard_index = 0;
  h.num_shards = 1;
  std::snprintf(h.store_name, sizeof(h.store_name), "%s", store.c_str());
  return h;
}

class StaleSegmentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    job_ = absl::StrCat("swstale", getpid(), "x", counter.fetch_add(1));
  }
  // Removes everything this test's job names left in /dev/shm.
  void TearDown() override {
    for (const std::string& n : ShmEntries(job_)) unlink(("/dev/shm/" + n).c_str());
  }

  std::string job_;
};

TEST_F(StaleSegmentsTest, FindsExactlyTheSegmentsOfACrashedRun) {
  const CrashedRun crashed = CrashAfterCreate(job_, 3, Crash::kExit);
  ASSERT_FALSE(crashed.store.empty());
  ASSERT_EQ(ShmEntries(crashed.store), SegmentNames(crashed.store, 3));

  // A live store of the same job (this process) is not stale.
  absl::StatusOr<std::unique_ptr<ShmParamStore>> live =
      ShmParamStore::Create(Options(job_, StaleSegmentPolicy::kReport, 2), Variables());
  ASSERT_TRUE(live.ok()) << live.status();

  absl::StatusOr<std::vector<StaleSegment>> stale = FindStaleSegments(job_);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ(Names(*stale), SegmentNames(crashed.store, 3));
  for (const StaleSegment& s : *stale) {
    EXPECT_EQ(s.pid, crashed.pid);
    EXPECT_GE(s.bytes, sizeof(ShardHeader));
  }
  // Finding changes nothing.
  EXPECT_EQ(ShmEntries(crashed.store), SegmentNames(crashed.store, 3));
}

TEST_F(StaleSegmentsTest, FindsTheSegmentsOfASigkilledRun) {
  const CrashedRun crashed = CrashAfterCreate(job_, 2, Crash::kSigkill);
  ASSERT_FALSE(crashed.store.empty());
  absl::StatusOr<std::vector<StaleSegment>> stale = FindStaleSegments(job_);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ(Names(*stale), SegmentNames(crashed.store, 2));
}

// An exited process that is not yet reaped still holds its pid: its segments
// are kept until it is gone.
TEST_F(StaleSegmentsTest, ZombieCountsAsAlive) {
  const CrashedRun crashed = CrashAfterCreate(job_, 1, Crash::kExit, /*reap=*/false);
  ASSERT_FALSE(crashed.store.empty());
  siginfo_t info;
  ASSERT_EQ(waitid(P_PID, crashed.pid, &info, WEXITED | WNOWAIT), 0) << std::strerror(errno);
  absl::StatusOr<std::vector<StaleSegment>> stale = FindStaleSegments(job_);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_TRUE(stale->empty()) << Names(*stale).size();

  WaitFor(crashed.pid);
  stale = FindStaleSegments(job_);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ(Names(*stale), SegmentNames(crashed.store, 1));
}

TEST_F(StaleSegmentsTest, RemoveUnlinksOnlyStaleSegments) {
  const CrashedRun crashed = CrashAfterCreate(job_, 2, Crash::kExit);
  ASSERT_FALSE(crashed.store.empty());
  absl::StatusOr<std::unique_ptr<ShmParamStore>> live =
      ShmParamStore::Create(Options(job_, StaleSegmentPolicy::kReport), Variables());
  ASSERT_TRUE(live.ok()) << live.status();
  absl::StatusOr<std::vector<StaleSegment>> stale = FindStaleSegments(job_);
  ASSERT_TRUE(stale.ok()) << stale.status();
  ASSERT_EQ(stale->size(), 2u);

  // A forged entry naming the live store is refused: it is checked again.
  std::vector<StaleSegment> with_live = *stale;
  with_live.push_back(StaleSegment{(*live)->name() + "-s0", getpid(), 4096});
  EXPECT_TRUE(RemoveStaleSegments(with_live).ok());
  EXPECT_EQ(ShmEntries(crashed.store), std::vector<std::string>{});
  EXPECT_TRUE(ShmSegment::Exists((*live)->name() + "-s0"));
  // Removing them again (already gone) is fine.
  EXPECT_TRUE(RemoveStaleSegments(*stale).ok());
  stale = FindStaleSegments(job_);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_TRUE(stale->empty());
}

TEST_F(StaleSegmentsTest, PolicyFailNamesTheStaleSegments) {
  const CrashedRun crashed = CrashAfterCreate(job_, 1, Crash::kExit);
  ASSERT_FALSE(crashed.store.empty());
  absl::StatusOr<std::unique_ptr<ShmParamStore>> store =
      ShmParamStore::Create(Options(job_, StaleSegmentPolicy::kFail), Variables());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("/dev/shm/" + crashed.store + "-s0"), absl::string_view::npos)
      << store.status();
  EXPECT_NE(store.status().message().find("ps.stale_segments"), absl::string_view::npos) << store.status();
  // Nothing was removed, and the failed Create left nothing of its own.
  EXPECT_EQ(ShmEntries(job_), SegmentNames(crashed.store, 1));
}

TEST_F(StaleSegmentsTest, PolicyReportKeepsAndExposesThem) {
  const CrashedRun crashed = CrashAfterCreate(job_, 2, Crash::kExit);
  ASSERT_FALSE(crashed.store.empty());
  absl::StatusOr<std::unique_ptr<ShmParamStore>> store =
      ShmParamStore::Create(Options(job_, StaleSegmentPolicy::kReport), Variables());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(Names((*store)->reported_stale_segments()), SegmentNames(crashed.store, 2));
  EXPECT_TRUE((*store)->removed_stale_segments().empty());
  EXPECT_EQ(ShmEntries(crashed.store), SegmentNames(crashed.store, 2));
}

TEST_F(StaleSegmentsTest, PolicyRemoveRemovesAndExposesThem) {
  const CrashedRun crashed = CrashAfterCreate(job_, 2, Crash::kExit);
  ASSERT_FALSE(crashed.store.empty());
  // The default policy is remove.
  OpenStoreOptions options = Options(job_, StaleSegmentPolicy::kRemove);
  EXPECT_EQ(options.store.stale_segments, StoreOptions{}.stale_segments);
  absl::StatusOr<std::unique_ptr<ShmParamStore>> store = ShmParamStore::Create(options, Variables());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(Names((*store)->removed_stale_segments()), SegmentNames(crashed.store, 2));
  EXPECT_TRUE((*store)->reported_stale_segments().empty());
  EXPECT_EQ(ShmEntries(crashed.store), std::vector<std::string>{});
  // Only the new store's segment is left.
  EXPECT_EQ(ShmEntries(job_), SegmentNames((*store)->name(), 1));
}

// Files named like segments of a dead pid but not holding a matching
// Shardwild header are never listed nor removed.
TEST_F(StaleSegmentsTest, LeavesFilesThatAreNotItsShardsAlone) {
  const pid_t dead = DeadPid();
  const std::string store = absl::StrCat(job_, "-", dead, "-0badf00d");
  std::vector<std::string> files;
  // Garbage of header size.
  std::vector<char> garbage(sizeof(ShardHeader) + 100, 'x');
  files.push_back(store + "-s0");
  ASSERT_TRUE(WriteShmFile(files.back(), garbage.data(), garbage.size()));
  // Too short to hold a header.
  files.push_back(store + "-s1");
  ASSERT_TRUE(WriteShmFile(files.back(), "SWHARDS1", 8));
  // A Shardwild header that names another process.
  ShardHeader other_pid = FakeHeader(store, dead == 1 ? 2 : 1);
  other_pid.shard_index = 2;
  files.push_back(store + "-s2");
  ASSERT_TRUE(WriteShmFile(files.back(), &other_pid, sizeof(other_pid)));
  // A Shardwild header of another store.
  ShardHeader other_store = FakeHeader(absl::StrCat(job_, "-", dead, "-0badf00e"), dead);
  other_store.shard_index = 3;
  files.push_back(store + "-s3");
  ASSERT_TRUE(WriteShmFile(files.back(), &other_store, sizeof(other_store)));
  // A good header whose shard index disagrees with the name.
  files.push_back(store + "-s4");
  const ShardHeader shard0 = FakeHeader(store, dead);
  ASSERT_TRUE(WriteShmFile(files.back(), &shard0, sizeof(shard0)));
  std::sort(files.begin(), files.end());

  absl::StatusOr<std::vector<StaleSegment>> stale = FindStaleSegments(job_);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_TRUE(stale->empty()) << stale->front().name;

  // Even when handed to RemoveStaleSegments, or met by Create.
  std::vector<StaleSegment> forged;
  for (const std::string& f : files) forged.push_back(StaleSegment{f, dead, 0});
  EXPECT_TRUE(RemoveStaleSegments(forged).ok());
  absl::StatusOr<std::unique_ptr<ShmParamStore>> created =
      ShmParamStore::Create(Options(job_, StaleSegmentPolicy::kRemove), Variables());
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE((*created)->removed_stale_segments().empty());
  for (const std::string& f : files) EXPECT_TRUE(ShmSegment::Exists(f)) << f;
}

// A header written the way a store writes it, for a dead pid, is stale; the
// same for a live pid (init, or this process) is not.
TEST_F(StaleSegmentsTest, LivenessIsTheOwnerPid) {
  const pid_t dead = DeadPid();
  const std::string dead_store = absl::StrCat(job_, "-", dead, "-0badf00d");
  const ShardHeader dead_header = FakeHeader(dead_store, dead);
  ASSERT_TRUE(WriteShmFile(dead_store + "-s0", &dead_header, sizeof(dead_header)));
  for (const pid_t live : {pid_t{1}, getpid()}) {
    const std::string live_store = absl::StrCat(job_, "-", live, "-0badf00d");
    const ShardHeader live_header = FakeHeader(live_store, live);
    ASSERT_TRUE(WriteShmFile(live_store + "-s0", &live_header, sizeof(live_header)));
  }
  absl::StatusOr<std::vector<StaleSegment>> stale = FindStaleSegments(job_);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ(Names(*stale), std::vector<std::string>{dead_store + "-s0"});
  ASSERT_TRUE(RemoveStaleSegments(*stale).ok());
  EXPECT_FALSE(ShmSegment::Exists(dead_store + "-s0"));
  EXPECT_TRUE(ShmSegment::Exists(absl::StrCat(job_, "-1-0badf00d-s0")));
  EXPECT_TRUE(ShmSegment::Exists(absl::StrCat(job_, "-", getpid(), "-0badf00d-s0")));
}

// Names must match "<job>-<pid>-<8 hex>-s<k>" exactly, so a job never claims
// the segments of another job whose name it prefixes.
TEST_F(StaleSegmentsTest, MatchesTheJobNameExactly) {
  const CrashedRun sub = CrashAfterCreate(job_ + "-sub", 1, Crash::kExit);
  ASSERT_FALSE(sub.store.empty());
  const CrashedRun digits = CrashAfterCreate(job_ + "-12", 1, Crash::kExit);
  ASSERT_FALSE(digits.store.empty());
  absl::StatusOr<std::vector<StaleSegment>> stale = FindStaleSegments(job_);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_TRUE(stale->empty()) << stale->front().name;
  stale = FindStaleSegments(job_ + "-sub");
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ(Names(*stale), SegmentNames(sub.store, 1));
  stale = FindStaleSegments(job_ + "-12");
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ(Names(*stale), SegmentNames(digits.store, 1));

  // Malformed variants of a good segment's name, with a good header inside.
  const pid_t dead = DeadPid();
  for (const std::string& store : {absl::StrCat(job_, "-0", dead, "-0badf00d"),   // leading zero
                                   absl::StrCat(job_, "-", dead, "-0BADF00D"),    // upper-case hex
                                   absl::StrCat(job_, "-", dead, "-0badf00"),     // 7 hex digits
                                   absl::StrCat(job_, "-+", dead, "-0badf00d")}) {  // sign
    const ShardHeader h = FakeHeader(store, dead);
    ASSERT_TRUE(WriteShmFile(store + "-s0", &h, sizeof(h)));
  }
  stale = FindStaleSegments(job_);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_TRUE(stale->empty()) << stale->front().name;
}

// A store's metadata segment (store_metadata.h) goes with its shards: stale
// when its header names a dead creator and its store, kept otherwise.
TEST_F(StaleSegmentsTest, MetadataSegmentsOfADeadCreator) {
  const pid_t dead = DeadPid();
  const std::string store = absl::StrCat(job_, "-", dead, "-0badf00d");
  auto meta_header = [](const std::string& store_name, pid_t pid) {
    StoreMetaHeader h;
    std::memset(&h, 0, sizeof(h));
    h.magic = kStoreMetaMagic;
    h.format_version = kStoreMetaFormatVersion;
    h.owner_pid = pid;
    std::snprintf(h.store_name, sizeof(h.store_name), "%s", store_name.c_str());
    return h;
  };
  const ShardHeader shard0 = FakeHeader(store, dead);
  ASSERT_TRUE(WriteShmFile(store + "-s0", &shard0, sizeof(shard0)));
  const StoreMetaHeader good = meta_header(store, dead);
  ASSERT_TRUE(WriteShmFile(store + "-meta", &good, sizeof(good)));
  // Named like metadata, but naming another store, another pid, or not
  // metadata at all (a shard header, garbage): kept.
  const std::string other = absl::StrCat(job_, "-", dead, "-0badf00e");
  const StoreMetaHeader wrong_store = meta_header(store, dead);
  ASSERT_TRUE(WriteShmFile(other + "-meta", &wrong_store, sizeof(wrong_store)));
  const std::string other2 = absl::StrCat(job_, "-", dead, "-0badf00f");
  const StoreMetaHeader wrong_pid = meta_header(other2, dead == 1 ? 2 : 1);
  ASSERT_TRUE(WriteShmFile(other2 + "-meta", &wrong_pid, sizeof(wrong_pid)));
  const std::string other3 = absl::StrCat(job_, "-", dead, "-0badf010");
  const ShardHeader not_meta = FakeHeader(other3, dead);
  ASSERT_TRUE(WriteShmFile(other3 + "-meta", &not_meta, sizeof(not_meta)));
  const std::string other4 = absl::StrCat(job_, "-", dead, "-0badf011");
  ASSERT_TRUE(WriteShmFile(other4 + "-metadata", &good, sizeof(good)));  // not the suffix

  absl::StatusOr<std::vector<StaleSegment>> stale = FindStaleSegments(job_);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ(Names(*stale), (std::vector<std::string>{store + "-meta", store + "-s0"}));
  ASSERT_TRUE(RemoveStaleSegments(*stale).ok());
  EXPECT_FALSE(ShmSegment::Exists(store + "-meta"));
  EXPECT_FALSE(ShmSegment::Exists(store + "-s0"));
  for (const std::string& kept : {other + "-meta", other2 + "-meta", other3 + "-meta", other4 + "-metadata"}) {
    EXPECT_TRUE(ShmSegment::Exists(kept)) << kept;
  }
}

// A live store's metadata is not stale, and a crashed run's is removed by
// the next Create of the job with the shards.
TEST_F(StaleSegmentsTest, CreateRemovesACrashedRunsMetadata) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[0]);
    absl::StatusOr<std::unique_ptr<ShmParamStore>> store =
        ShmParamStore::Create(Options(job_, StaleSegmentPolicy::kReport, 2), Variables());
    if (!store.ok()) _exit(2);
    absl::StatusOr<std::unique_ptr<ShmSegment>> meta = WriteStoreMetadata((*store)->name(), "{\"a\": 1}");
    if (!meta.ok()) _exit(3);
    const std::string name = (*store)->name();
    const char len = static_cast<char>(name.size());
    if (write(pipe_fds[1], &len, 1) != 1 || write(pipe_fds[1], name.data(), name.size()) != static_cast<ssize_t>(name.size())) {
      _exit(4);
    }
    _exit(0);  // no destructors: everything stays
  }
  close(pipe_fds[1]);
  char len = 0;
  std::string crashed;
  if (read(pipe_fds[0], &len, 1) == 1) {
    crashed.resize(static_cast<unsigned char>(len));
    if (read(pipe_fds[0], crashed.data(), crashed.size()) != static_cast<ssize_t>(crashed.size())) crashed.clear();
  }
  close(pipe_fds[0]);
  EXPECT_EQ(WaitFor(pid), 0);
  ASSERT_FALSE(crashed.empty());

  absl::StatusOr<std::unique_ptr<ShmParamStore>> live =
      ShmParamStore::Create(Options(job_, StaleSegmentPolicy::kRemove), Variables());
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(Names((*live)->removed_stale_segments()),
            (std::vector<std::string>{crashed + "-meta", crashed + "-s0", crashed + "-s1"}));
  EXPECT_EQ(ShmEntries(crashed), std::vector<std::string>{});
  absl::StatusOr<std::unique_ptr<ShmSegment>> meta = WriteStoreMetadata((*live)->name(), "{}");
  ASSERT_TRUE(meta.ok()) << meta.status();
  absl::StatusOr<std::vector<StaleSegment>> stale = FindStaleSegments(job_);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_TRUE(stale->empty()) << stale->front().name;
}

TEST_F(StaleSegmentsTest, BadJobName) {
  EXPECT_EQ(FindStaleSegments("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FindStaleSegments("a/b").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DescribeStaleSegmentsTest, ListsAFewAndCountsTheRest) {
  const std::vector<StaleSegment> s = {{"a-1-0badf00d-s0", 1, 4096}, {"a-1-0badf00d-s1", 1, 8192},
                                       {"a-1-0badf00d-s2", 1, 4096}};
  EXPECT_EQ(DescribeStaleSegments(s, 2),
            "/dev/shm/a-1-0badf00d-s0 (pid 1, 4096 bytes), /dev/shm/a-1-0badf00d-s1 (pid 1, 8192 bytes), and 1 more");
  EXPECT_EQ(DescribeStaleSegments({}), "");
}

}  // namespace
}  // namespace shardwild
