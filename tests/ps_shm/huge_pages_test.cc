#include "ps_shm/huge_pages.h"

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/config/options.h"
#include "core/model/variable.h"
#include "gtest/gtest.h"
#include "ps_shm/shm_store.h"

namespace shardwild {
namespace {

constexpr char kShmemEnabled[] = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

std::optional<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// ---- Parsing (fake files) ---------------------------------------------------

TEST(HugePagesTest, SelectedThpSetting) {
  EXPECT_EQ(SelectedThpSetting("always within_size advise [never] deny force\n"), "never");
  EXPECT_EQ(SelectedThpSetting("[always] within_size advise never deny force\n"), "always");
  EXPECT_EQ(SelectedThpSetting("always within_size [advise] never\n"), "advise");
  EXPECT_EQ(SelectedThpSetting("always never\n"), "");
  EXPECT_EQ(SelectedThpSetting(""), "");
}

TEST(HugePagesTest, TmpfsHugeOption) {
  const std::string mounts =
      "proc /proc proc rw,nosuid 0 0\n"
      "tmpfs /dev/shm tmpfs rw,nosuid,nodev,size=1024k 0 0\n"
      "tmpfs /run tmpfs rw,huge=always 0 0\n";
  EXPECT_EQ(TmpfsHugeOption(mounts, "/dev/shm"), "never");
  EXPECT_EQ(TmpfsHugeOption(mounts, "/run"), "always");
  EXPECT_EQ(TmpfsHugeOption(mounts, "/tmp"), "");
  // A later mount of the same point hides the earlier one.
  EXPECT_EQ(TmpfsHugeOption(mounts + "tmpfs /dev/shm tmpfs rw,relatime,size=65536k,huge=advise 0 0\n", "/dev/shm"),
            "advise");
}

TEST(HugePagesTest, AllowedFollowsTheKernelRules) {
  // shmem_enabled deny and force override every mount.
  EXPECT_FALSE(ShmHugePagesAllowed("deny", "always"));
  EXPECT_TRUE(ShmHugePagesAllowed("force", "never"));
  // Otherwise the mount's huge= option decides; shmem_enabled's own value
  // governs only the internal shm mount.
  for (const char* shmem : {"always", "within_size", "advise", "never"}) {
    SCOPED_TRACE(shmem);
    EXPECT_TRUE(ShmHugePagesAllowed(shmem, "always"));
    EXPECT_TRUE(ShmHugePagesAllowed(shmem, "within_size"));
    EXPECT_TRUE(ShmHugePagesAllowed(shmem, "advise"));
    EXPECT_FALSE(ShmHugePagesAllowed(shmem, "never"));
    EXPECT_FALSE(ShmHugePagesAllowed(shmem, ""));
  }
  // No THP in the kernel.
  EXPECT_FALSE(ShmHugePagesAllowed("", "advise"));
}

TEST(HugePagesTest, ShmemPmdMappedBytes) {
  const std::string smaps =
      "00400000-00600000 r-xp 00000000 08:01 1 /bin/x\n"
      "Size:               2048 kB\n"
      "ShmemPmdMapped:        0 kB\n"
      "VmFlags: rd ex\n"
      "7f0000000000-7f0000400000 rw-s 00000000 00:1a 2 /dev/shm/a-1-0badf00d-s0\n"
      "Size:               4096 kB\n"
      "AnonHugePages:         0 kB\n"
      "ShmemPmdMapped:     2048 kB\n"
      "FilePmdMapped:         0 kB\n"
      "VmFlags: rd wr sh hg\n"
      "7f0000400000-7f0000401000 rw-s 00000000 00:1a 3 /dev/shm/a-1-0badf00d-s1\n"
      "Size:                  4 kB\n"
      "ShmemPmdMapped:        0 kB\n"
      "VmFlags: rd wr sh\n";
  const MappedRange s0{0x7f0000000000, 0x7f0000400000}, s1{0x7f0000400000, 0x7f0000401000};
  EXPECT_EQ(ShmemPmdMappedBytes(smaps, {s0, s1}), std::optional<uint64_t>(2048 * 1024));
  EXPECT_EQ(ShmemPmdMappedBytes(smaps, {s1}), std::optional<uint64_t>(0));
  EXPECT_EQ(ShmemPmdMappedBytes(smaps, {}), std::optional<uint64_t>(0));
  // An area that straddles a range, or a range that is not mapped: unknown.
  EXPECT_EQ(ShmemPmdMappedBytes(smaps, {MappedRange{0x7f0000000000, 0x7f0000200000}}), std::nullopt);
  EXPECT_EQ(ShmemPmdMappedBytes(smaps, {MappedRange{0x7f1000000000, 0x7f1000001000}}), std::nullopt);
  // A kernel without the field: unknown.
  const std::string old_kernel =
      "7f0000000000-7f0000400000 rw-s 00000000 00:1a 2 /dev/shm/a-1-0badf00d-s0\n"
      "Size:               4096 kB\n"
      "VmFlags: rd wr sh\n";
  EXPECT_EQ(ShmemPmdMappedBytes(old_kernel, {s0}), std::nullopt);
}

TEST(HugePagesTest, PrivateMemoryFollowsThpEnabled) {
  EXPECT_TRUE(PrivateHugePagesAllowed("always"));
  EXPECT_TRUE(PrivateHugePagesAllowed("madvise"));
  EXPECT_FALSE(PrivateHugePagesAllowed("never"));
  EXPECT_FALSE(PrivateHugePagesAllowed(""));  // no THP in the kernel
  HugePageSettings s;
  s.thp_enabled = "madvise";
  s.shmem_enabled = "never";
  s.tmpfs_huge = "never";
  EXPECT_TRUE(s.private_allowed());
  EXPECT_FALSE(s.allowed());
}

// Private memory's huge pages are its AnonHugePages lines.
TEST(HugePagesTest, AnonHugePagesOfAPrivateMapping) {
  const std::string smaps =
      "7effffffe000-7efffffff000 ---p 00000000 00:00 0\n"
      "Size:                  4 kB\n"
      "AnonHugePages:         0 kB\n"
      "ShmemPmdMapped:        0 kB\n"
      "7f0000000000-7f0000600000 rw-p 00000000 00:00 0\n"
      "Size:               6144 kB\n"
      "AnonHugePages:      4096 kB\n"
      "ShmemPmdMapped:        0 kB\n"
      "VmFlags: rd wr mr mw me ac hg\n";
  const MappedRange r{0x7f0000000000, 0x7f0000600000};
  EXPECT_EQ(PmdMappedBytes(smaps, {r}, "AnonHugePages:"), std::optional<uint64_t>(4096 * 1024));
  EXPECT_EQ(PmdMappedBytes(smaps, {r}, "ShmemPmdMapped:"), std::optional<uint64_t>(0));
  // A range inside a larger area (a mapping merged with a neighbour): unknown.
  EXPECT_EQ(PmdMappedBytes(smaps, {MappedRange{0x7f0000000000, 0x7f0000400000}}, "AnonHugePages:"), std::nullopt);
}

// ---- A real store on this machine -------------------------------------------

OpenStoreOptions Options(HugePagePolicy policy) {
  OpenStoreOptions o;
  o.store.job_name = absl::StrCat("swhuge", getpid());
  o.store.huge_pages = policy;
  o.optimizer.type = OptimizerType::kSgd;
  o.num_shards = 2;
  return o;
}

// 2 x 1024 x 1024 floats: 4 MiB per shard, room for two 2 MiB pages each.
std::vector<VariableSpec> Variables() { return {VariableSpec{"w", 2048, 1024, InitKind::kZeros}}; }

TEST(HugePagesTest, StatusMatchesThisMachine) {
  const std::optional<std::string> shmem_file = ReadFile(kShmemEnabled);
  if (!shmem_file) GTEST_SKIP() << kShmemEnabled << " is absent: no transparent huge pages";
  const std::optional<std::string> mounts = ReadFile("/proc/self/mounts");
  ASSERT_TRUE(mounts.has_value());
  const std::string shmem_enabled = SelectedThpSetting(*shmem_file);
  const std::string tmpfs_huge = TmpfsHugeOption(*mounts, "/dev/shm");

  absl::StatusOr<std::unique_ptr<ShmParamStore>> store = ShmParamStore::Create(Options(HugePagePolicy::kAuto), Variables());
  ASSERT_TRUE(store.ok()) << store.status();
  const HugePageStatus st = (*store)->huge_pages();
  EXPECT_EQ(st.shmem_enabled, shmem_enabled);
  EXPECT_FALSE(st.shmem_enabled.empty()) << *shmem_file;
  EXPECT_EQ(st.tmpfs_huge, tmpfs_huge);
  EXPECT_EQ(st.requested, ShmHugePagesAllowed(shmem_enabled, tmpfs_huge));
  ASSERT_TRUE(st.granted_bytes.has_value()) << "smaps should tell on a kernel with THP";
  EXPECT_LE(*st.granted_bytes, (*store)->total_bytes());
  if (!ShmHugePagesAllowed(shmem_enabled, tmpfs_huge)) {
    EXPECT_EQ(*st.granted_bytes, 0u);
  }
  RecordProperty("shmem_enabled", shmem_enabled);
  RecordProperty("tmpfs_huge", tmpfs_huge);
  RecordProperty("granted_bytes", std::to_string(*st.granted_bytes));
  std::printf("shmem_enabled=%s tmpfs_huge=%s requested=%d granted=%llu of %llu bytes\n", shmem_enabled.c_str(),
              tmpfs_huge.c_str(), st.requested, static_cast<unsigned long long>(*st.granted_bytes),
              static_cast<unsigned long long>((*store)->total_bytes()));

  // An attached store reports the same settings; it asked for nothing.
  absl::StatusOr<std::unique_ptr<ShmParamStore>> attached = ShmParamStore::Attach((*store)->name(), Options(HugePagePolicy::kAuto).optimizer);
  ASSERT_TRUE(attached.ok()) << attached.status();
  const HugePageStatus at = (*attached)->huge_pages();
  EXPECT_FALSE(at.requested);
  EXPECT_EQ(at.shmem_enabled, shmem_enabled);
  ASSERT_TRUE(at.granted_bytes.has_value());
  EXPECT_LE(*at.granted_bytes, (*store)->total_bytes());
}

// A store in private memory: huge pages asked for where THP's `enabled`
// allows them, and what was granted measured from AnonHugePages, never more
// than the store's bytes (its mapping ends on a whole huge page).
TEST(HugePagesTest, PrivateStoreStatusMatchesThisMachine) {
  OpenStoreOptions o = Options(HugePagePolicy::kAuto);
  o.store.memory_kind = StoreMemoryKind::kPrivate;
  // 3 MiB and a bit per shard: its mapping is 4 MiB.
  absl::StatusOr<std::unique_ptr<ShmParamStore>> store =
      ShmParamStore::Create(o, {VariableSpec{"w", 2048, 800, InitKind::kZeros}});
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->private_memory());
  const HugePageStatus st = (*store)->huge_pages();
  const std::optional<std::string> enabled = ReadFile("/sys/kernel/mm/transparent_hugepage/enabled");
  EXPECT_EQ(st.thp_enabled, enabled ? SelectedThpSetting(*enabled) : "");
  EXPECT_EQ(st.requested, PrivateHugePagesAllowed(st.thp_enabled));
  if (!enabled) GTEST_SKIP() << "no transparent huge pages";
  ASSERT_TRUE(st.granted_bytes.has_value()) << "smaps should tell on a kernel with THP";
  EXPECT_LE(*st.granted_bytes, (*store)->total_bytes());
  if (!st.requested) {
    EXPECT_EQ(*st.granted_bytes, 0u);
  }
  std::printf("thp_enabled=%s requested=%d granted=%llu of %llu bytes\n", st.thp_enabled.c_str(), st.requested,
              static_cast<unsigned long long>(*st.granted_bytes),
              static_cast<unsigned long long>((*store)->total_bytes()));
  o.store.huge_pages = HugePagePolicy::kOff;
  absl::StatusOr<std::unique_ptr<ShmParamStore>> off = ShmParamStore::Create(o, Variables());
  ASSERT_TRUE(off.ok()) << off.status();
  const HugePageStatus off_status = (*off)->huge_pages();
  EXPECT_FALSE(off_status.requested);
  // Its two shards' mappings, made one after the other, lie side by side;
  // their guard pages keep the kernel from merging them into one area, so
  // smaps still accounts for each.
  ASSERT_TRUE(off_status.granted_bytes.has_value());
  EXPECT_EQ(*off_status.granted_bytes, 0u);
}

TEST(HugePagesTest, OffRequestsNothing) {
  absl::StatusOr<std::unique_ptr<ShmParamStore>> store = ShmParamStore::Create(Options(HugePagePolicy::kOff), Variables());
  ASSERT_TRUE(store.ok()) << store.status();
  const HugePageStatus st = (*store)->huge_pages();
  EXPECT_FALSE(st.requested);
  const std::optional<std::string> shmem_file = ReadFile(kShmemEnabled);
  EXPECT_EQ(st.shmem_enabled, shmem_file ? SelectedThpSetting(*shmem_file) : "");
  if (st.granted_bytes) {
    EXPECT_LE(*st.granted_bytes, (*store)->total_bytes());
  }
}

}  // namespace
}  // namespace shardwild
