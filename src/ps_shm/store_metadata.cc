#include "ps_shm/store_metadata.h"

#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ps_shm/shard_format.h"

namespace shardwild {

std::string StoreMetadataSegmentName(const std::string& store_name) { return absl::StrCat(store_name, "-meta"); }

absl::StatusOr<std::unique_ptr<ShmSegment>> WriteStoreMetadata(const std::string& store_name, std::string_view text) {
  if (store_name.empty() || store_name.size() >= static_cast<size_t>(kMaxNameBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store metadata: the store name '", store_name, "' must be 1..", kMaxNameBytes - 1, " bytes"));
  }
  if (text.size() > kMaxStoreMetadataBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store metadata of ", text.size(), " bytes is more than the ",
                                                   kMaxStoreMetadataBytes, " a store may carry"));
  }
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg =
      ShmSegment::Create(StoreMetadataSegmentName(store_name), sizeof(StoreMetaHeader) + text.size());
  if (!seg.ok()) return seg.status();
  char* base = static_cast<char*>((*seg)->data());
  StoreMetaHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kStoreMetaMagic;
  h.format_version = kStoreMetaFormatVersion;
  h.owner_pid = getpid();
  h.text_bytes = text.size();
  std::memcpy(h.store_name, store_name.data(), store_name.size());
  if (!text.empty()) std::memcpy(base + sizeof(StoreMetaHeader), text.data(), text.size());
  std::memcpy(base, &h, sizeof(h));
  return seg;
}

absl::StatusOr<std::string> ReadStoreMetadata(const std::string& store_name) {
  const std::string name = StoreMetadataSegmentName(store_name);
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Attach(name);
  if (!seg.ok()) return seg.status();
  auto bad = [&](const std::string& what) {
    return absl::FailedPreconditionError(absl::StrCat("shared memory /", name, ": ", what));
  };
  if ((*seg)->size() < sizeof(StoreMetaHeader)) return bad("too small to hold a store metadata header");
  StoreMetaHeader h;
  std::memcpy(&h, (*seg)->data(), sizeof(h));
  if (h.magic != kStoreMetaMagic) return bad(absl::StrFormat("bad magic 0x%016x (not Shardwild store metadata)", h.magic));
  if (h.format_version != kStoreMetaFormatVersion) {
    return bad(absl::StrCat("format version ", h.format_version, ", this build reads version ", kStoreMetaFormatVersion));
  }
  if (std::memchr(h.store_name, 0, sizeof(h.store_name)) == nullptr || store_name != h.store_name) {
    return bad("names another store");
  }
  if (h.text_bytes > kMaxStoreMetadataBytes || sizeof(StoreMetaHeader) + h.text_bytes > (*seg)->size()) {
    return bad(absl::StrCat("says it holds ", h.text_bytes, " bytes of text, the segment has ", (*seg)->size()));
  }
  return std::string(static_cast<const char*>((*seg)->data()) + sizeof(StoreMetaHeader), h.text_bytes);
}

}  // namespace shardwild
