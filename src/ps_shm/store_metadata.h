// Store metadata: a short text a store's creator leaves beside its shards for
// the processes that attach to it later, in one more segment,
// "<store>-meta" (shard_format.h, StoreMetaHeader).
//
// The shard headers say what the store holds (variables, tables, optimizer
// types) but not everything an attaching process needs, e.g. the
// optimizers' hyper-parameters (ShmParamStore::Attach takes them from its
// caller). A creator that wants attaching to need only the name writes them
// here (the Python API's Store.create writes its whole layout as JSON).
//
// Lifetime: the segment returned by WriteStoreMetadata owns it and unlinks it
// when destroyed; keep it as long as the store. Like a shard, it is removed
// by a signal the CLI handles (ShmSegment::UnlinkAllOwnedSegmentsFromSignal),
// and, once its creator is gone, by the stale-segment cleanup of the next
// store of the same job (stale_segments.h): it starts with the creator's pid
// and the store's name as a shard does.
//
// Thread safety: the text is written whole before the function returns and
// never changed, and the store's name is shared only after that, so readers
// need no synchronisation. The functions themselves are thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "ps_shm/shm_segment.h"

namespace shardwild {

// The largest metadata text: 1 MiB.
inline constexpr size_t kMaxStoreMetadataBytes = size_t{1} << 20;

// "<store_name>-meta".
std::string StoreMetadataSegmentName(const std::string& store_name);

// Creates "<store_name>-meta" (mode 0600) holding `text`. The returned
// segment owns it. InvalidArgument for a store name of more than 63 bytes
// or a text over kMaxStoreMetadataBytes; AlreadyExists if the store has
// metadata already; ResourceExhausted when /dev/shm is full.
absl::StatusOr<std::unique_ptr<ShmSegment>> WriteStoreMetadata(const std::string& store_name, std::string_view text);

// The text in `store_name`'s metadata segment. NotFound when the store has
// none (it was created without, or is gone); FailedPrecondition, naming the
// segment, for a segment that is not store metadata of that store (magic,
// format version, name, size).
absl::StatusOr<std::string> ReadStoreMetadata(const std::string& store_name);

}  // namespace shardwild
