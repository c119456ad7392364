#include "ps_shm/store_metadata.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ps_shm/shard_format.h"
#include "ps_shm/shm_segment.h"

namespace shardwild {
namespace {

// A store name of this process that no other test uses.
std::string UniqueStore() {
  static std::atomic<int> counter{0};
  return absl::StrCat("swmeta-", getpid(), "-", counter.fetch_add(1));
}

TEST(StoreMetadataTest, WriteThenReadGivesTheText) {
  const std::string store = UniqueStore();
  const std::string text = "{\"optimizer\": {\"type\": \"adagrad\", \"lr\": 0.05}}";
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = WriteStoreMetadata(store, text);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ((*seg)->name(), store + "-meta");
  EXPECT_EQ(StoreMetadataSegmentName(store), store + "-meta");
  absl::StatusOr<std::string> read = ReadStoreMetadata(store);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, text);
  // The header names the creator and the store (stale_segments.h reads them).
  StoreMetaHeader h;
  std::memcpy(&h, (*seg)->data(), sizeof(h));
  EXPECT_EQ(h.magic, kStoreMetaMagic);
  EXPECT_EQ(h.owner_pid, getpid());
  EXPECT_EQ(std::string(h.store_name), store);
}

TEST(StoreMetadataTest, EmptyTextAndTheLargestText) {
  const std::string store = UniqueStore();
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = WriteStoreMetadata(store, "");
  ASSERT_TRUE(seg.ok()) << seg.status();
  absl::StatusOr<std::string> read = ReadStoreMetadata(store);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "");

  const std::string big_store = UniqueStore();
  const std::string big(kMaxStoreMetadataBytes, 'x');
  seg = WriteStoreMetadata(big_store, big);
  ASSERT_TRUE(seg.ok()) << seg.status();
  read = ReadStoreMetadata(big_store);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->size(), big.size());

  absl::StatusOr<std::unique_ptr<ShmSegment>> too_big = WriteStoreMetadata(UniqueStore(), big + "x");
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument) << too_big.status();
}

TEST(StoreMetadataTest, UnlinkedWhenTheSegmentGoes) {
  const std::string store = UniqueStore();
  {
    absl::StatusOr<std::unique_ptr<ShmSegment>> seg = WriteStoreMetadata(store, "x");
    ASSERT_TRUE(seg.ok()) << seg.status();
    EXPECT_TRUE(ShmSegment::Exists(store + "-meta"));
  }
  EXPECT_FALSE(ShmSegment::Exists(store + "-meta"));
  absl::StatusOr<std::string> read = ReadStoreMetadata(store);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound) << read.status();
}

TEST(StoreMetadataTest, SecondWriteAndBadNamesAreErrors) {
  const std::string store = UniqueStore();
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = WriteStoreMetadata(store, "x");
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ(WriteStoreMetadata(store, "y").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(WriteStoreMetadata("", "y").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteStoreMetadata(std::string(64, 'a'), "y").status().code(), absl::StatusCode::kInvalidArgument);
}

// Writes /dev/shm/<name> with `size` bytes of `bytes`.
bool WriteShmFile(const std::string& name, const void* bytes, size_t size) {
  const int fd = open(("/dev/shm/" + name).c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const bool ok = write(fd, bytes, size) == static_cast<ssize_t>(size);
  close(fd);
  return ok;
}

TEST(StoreMetadataTest, ReadRejectsWhatIsNotThisStoresMetadata) {
  auto expect_bad = [](const std::string& store, const StoreMetaHeader& h, size_t size, const std::string& what) {
    std::string bytes(size, '\0');
    std::memcpy(bytes.data(), &h, std::min(size, sizeof(h)));
    ASSERT_TRUE(WriteShmFile(store + "-meta", bytes.data(), bytes.size()));
    absl::StatusOr<std::string> read = ReadStoreMetadata(store);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition) << read.status();
    EXPECT_NE(read.status().message().find(store + "-meta"), absl::string_view::npos) << read.status();
    EXPECT_NE(read.status().message().find(what), absl::string_view::npos) << read.status();
    unlink(("/dev/shm/" + store + "-meta").c_str());
  };
  StoreMetaHeader good;
  std::memset(&good, 0, sizeof(good));
  good.magic = kStoreMetaMagic;
  good.format_version = kStoreMetaFormatVersion;
  good.owner_pid = getpid();
  good.text_bytes = 4;

  std::string store = UniqueStore();
  std::snprintf(good.store_name, sizeof(good.store_name), "%s", store.c_str());
  expect_bad(store, good, sizeof(good) - 8, "too small");
  StoreMetaHeader h = good;
  h.magic = kShardMagic;
  expect_bad(store, h, sizeof(h) + 4, "bad magic");
  h = good;
  h.format_version = 99;
  expect_bad(store, h, sizeof(h) + 4, "format version 99");
  h = good;
  std::snprintf(h.store_name, sizeof(h.store_name), "%s", "another");
  expect_bad(store, h, sizeof(h) + 4, "names another store");
  h = good;
  h.text_bytes = 100;
  expect_bad(store, h, sizeof(h) + 4, "100 bytes of text");
}

}  // namespace
}  // namespace shardwild
