// The on-memory format of one shard segment. Another process attaching by
// name reads this to learn what it got; every field is checked first.
//
//   [ShardHeader][LayoutEntry x num_entries][TableEntry x num_tables]
//   [GlobalPart x num_entries x num_shards, only in a partial store]
//   ... padding to header_bytes
//   then, per entry: params, slot 0, slot 1, ..., row sequence words
//   (each array 64-byte aligned; the arrays of params and slots are
//   array_bytes apart; the sequence words, one uint32 per row held, start
//   right after the last slot array, at offset + (1 + num_slots) * array_bytes)
//
// then, per table, the region of one EmbeddingTable (embedding_table.h;
// 4096-byte aligned, `bytes` long), which carries its own header, validated
// by EmbeddingTable::Attach.
//
// Partial stores (OpenStoreOptions::first_hosted_shard): a store may host
// only a contiguous block of the num_shards global shards. Its segments are
// "<store>-s<k>" for k = 0 .. num_hosted_shards - 1, segment k holding global
// shard first_hosted_shard + k (shard_index). A full store (first 0, all
// hosted) therefore names its segments as format 3 did. So that an attaching
// process learns the global layout, a partial store's headers carry every
// variable's rows on every global shard (GlobalPart, variable-major).
//
// Row sequence words: the per-row seqlock of update mode row_lock (ps.update;
// shm_store.cc says how they are used and which memory orders they need).
// Even = the row is stable, odd = a writer is inside. They exist in every
// mode (4 bytes a row) so the layout does not depend on the mode.
//
// Constant fields are written once by the creator before any other process
// or thread can know the segment's name (a name is shared only after
// Create() returns), so they need no synchronisation. The counters are
// accessed only through std::atomic_ref<uint64_t> with relaxed order: they
// are versions and statistics, and publish no other data.
#pragma once

#include <cstdint>

namespace shardwild {

inline constexpr uint64_t kShardMagic = 0x3153445241485753ULL;  // "SWHARDS1" little-endian
// 2: row sequence words, update_mode; 3: embedding tables (TableEntry);
// 4: partial stores (hosted shard block, GlobalPart); 5: lean embedding rows
// (the tables' regions use embedding table format 3, embedding_table.cc).
inline constexpr uint32_t kShardFormatVersion = 5;
inline constexpr int kMaxNameBytes = 64;

struct ShardHeader {
  uint64_t magic;
  uint32_t format_version;
  uint32_t header_bytes;     // bytes before the first array, a multiple of 4096
  uint64_t total_bytes;      // size of the segment
  int64_t owner_pid;
  uint32_t shard_index;
  uint32_t num_shards;
  uint32_t num_entries;      // one per variable (with zero rows if this shard holds none)
  uint32_t optimizer_type;   // OptimizerType
  uint32_t num_slots;        // slot arrays per variable
  uint32_t update_mode;      // UpdateMode the creator chose; attached stores follow it
  uint32_t num_tables;       // TableEntry records after the LayoutEntry records
  uint32_t sparse_optimizer_type;  // OptimizerType of the tables' rows (their slots are sized for it)
  char store_name[kMaxNameBytes];
  // Counters (std::atomic_ref, relaxed; see above).
  alignas(64) uint64_t model_version;  // pushes applied to this shard
  // Constant again (after the counter so that the fields before keep the
  // offsets stale_segments.cc reads in older segments): the hosted block.
  uint32_t first_hosted_shard;  // global index of segment 0's shard
  uint32_t num_hosted_shards;   // segments of the store, 1..num_shards
};

// Rows [row_begin, row_end) of one variable on one global shard.
struct GlobalPart {
  int64_t row_begin;
  int64_t row_end;
};

struct LayoutEntry {
  char name[kMaxNameBytes];
  int64_t rows;              // rows of the whole variable
  int64_t cols;
  int64_t row_begin;         // rows of it held here
  int64_t row_end;
  uint64_t offset;           // byte offset of the parameter array
  uint64_t array_bytes;      // stride between the parameter array and each slot array
  // Counter (std::atomic_ref, relaxed): updates applied to these rows, Adam's t.
  alignas(8) uint64_t update_count;
};

// One embedding table's part on this shard (param_store.h, TableSpec).
struct TableEntry {
  char name[kMaxNameBytes];
  uint32_t kind;             // EmbeddingKind
  uint32_t on_full;          // CapacityPolicy
  int64_t dim;
  int64_t capacity;          // rows over all shards (TableSpec::capacity)
  int64_t shard_capacity;    // rows this shard's EmbeddingTable holds at most
  uint64_t offset;           // byte offset of the EmbeddingTable region, a multiple of 4096
  uint64_t bytes;            // EmbeddingTable::BytesFor of its options
};

// A store's metadata segment "<store>-meta" (store_metadata.h): this
// header, then text_bytes bytes of text. Written whole by the creator before
// the store's name is shared, then never changed, so it needs no
// synchronisation. stale_segments.cc reads magic, owner_pid and store_name.
inline constexpr uint64_t kStoreMetaMagic = 0x31304154454d5753ULL;  // "SWMETA01" little-endian
inline constexpr uint32_t kStoreMetaFormatVersion = 1;

struct StoreMetaHeader {
  uint64_t magic;
  uint32_t format_version;
  uint32_t reserved;
  int64_t owner_pid;
  uint64_t text_bytes;
  char store_name[kMaxNameBytes];
};

static_assert(sizeof(ShardHeader) % 8 == 0 && sizeof(LayoutEntry) % 8 == 0 && sizeof(TableEntry) % 8 == 0 &&
              sizeof(GlobalPart) % 8 == 0 && sizeof(StoreMetaHeader) % 8 == 0);

}  // namespace shardwild
