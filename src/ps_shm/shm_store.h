// ShmParamStore: a ParamStore whose shards are POSIX shared-memory segments
// on this machine (shm_segment.h, shard_format.h).
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/base/fixed_divisor.h"
#include "ps_shm/huge_pages.h"
#include "ps_shm/param_store.h"
#include "ps_shm/shm_segment.h"
#include "ps_shm/stale_segments.h"

namespace shardwild {

class PushChunks;  // push_chunks.h

// Partial stores (OpenStoreOptions::first_hosted_shard / num_hosted_shards):
// a store may host only a contiguous block of the global shards, as one ps
// task of a cluster does. layout() is still the global layout (num_shards =
// all shards, parts = every shard's rows), so every process computes the
// same partitioning, initial values and row routing. The hosted shards hold
// one contiguous row range of each variable (hosted_rows(); possibly empty):
// partitions sit on shards 0..k-1 in row order and an unpartitioned variable
// sits whole on one shard, so a block of shards holds a block of rows (Create
// checks this). Hosted rows start at the values the full store's have.
// On rows or ids the store does not host:
//   * Pull, ReadRows, WriteRows of a row range not within hosted_rows(var)
//     (an empty range is fine anywhere): InvalidArgument naming the rows;
//   * Push: gradients are still whole-variable pointers; only the hosted
//     rows are read and updated (a variable with no hosted rows is skipped);
//   * PullRows, PushRows, ReadTableRow, WriteTableRow of an id whose shard
//     (ShardOfRowId with the global shard count) is not hosted:
//     InvalidArgument naming the id and its shard, before anything is
//     written or copied;
//   * version() is the largest model version of the hosted shards.
// Whether a store created with `options` lives in private memory
// (ShmSegment::CreatePrivate) rather than in /dev/shm segments:
// store.memory_kind private; or auto, when no other process attaches
// (options.others_attach false), huge pages are asked for
// (store.huge_pages auto), and this machine's `settings` grant them to
// private memory but not to /dev/shm.
bool UsePrivateMemory(const OpenStoreOptions& options, const HugePageSettings& settings);

class ShmParamStore final : public ParamStore {
 public:
  // Creates the segments "<name>-s<k>", places them (placer), writes the
  // headers and initial values. Blocks until the memory is ready.
  // First it looks for segments of the same job left by runs that are gone
  // (stale_segments.h) and acts on options.store.stale_segments: `remove`
  // unlinks them (removed_stale_segments()), `report` leaves them
  // (reported_stale_segments()), `fail` returns FailedPrecondition naming
  // them. This layer does not log; the caller tells the user.
  // With options.store.huge_pages `auto`, each shard is marked MADV_HUGEPAGE
  // and collapsed into huge pages where the kernel allows (huge_pages.h).
  // The shards are private memory of this process instead of /dev/shm
  // segments where UsePrivateMemory says so (then no "<name>-s<k>" exists
  // and Attach fails with NotFound).
  // A partial store creates only its hosted shards' segments ("<name>-s<k>",
  // k counted from the first hosted shard; shard_format.h). InvalidArgument
  // for a hosted block outside [0, num_shards).
  static absl::StatusOr<std::unique_ptr<ShmParamStore>> Create(const OpenStoreOptions& options,
                                                               std::vector<VariableSpec> variables);

  // Attaches to a store another process created, by its name(). Checks each
  // shard's magic, format version, sizes and that every shard agrees on the
  // layout; FailedPrecondition names the shard and the field that is wrong.
  // `optimizer` must match the creator's hyper-parameters for pushes to be
  // meaningful; its type is checked against the header. So must
  // `sparse_optimizer` (unset = `optimizer`), the tables' optimizer, whose
  // type is checked against the header's sparse optimizer type. Each
  // table's region is validated by EmbeddingTable::Attach and must agree
  // with the shard's TableEntry and with shard 0. A partial store attaches
  // as one: the hosted block and the global layout come from the headers.
  static absl::StatusOr<std::unique_ptr<ShmParamStore>> Attach(
      const std::string& name, const OptimizerOptions& optimizer,
      const std::optional<OptimizerOptions>& sparse_optimizer = std::nullopt);

  ~ShmParamStore() override;

  const StoreLayout& layout() const override { return layout_; }
  const std::string& name() const override { return name_; }
  absl::Status Pull(absl::Span<const PullSlice> slices) override;
  absl::Status Push(absl::Span<const DenseGrad> grads, float lr) override;
  // Fused where it can be: a slice that covers a whole variable being
  // pushed, in a mode other than row_lock, fully hosted here, is written by
  // the optimizer kernel in the same pass as the update; other slices are
  // pulled after the push.
  absl::Status PushPull(absl::Span<const DenseGrad> grads, float lr, absl::Span<const PullSlice> pulls) override;
  uint64_t version() const override;
  absl::Status PullRows(int table, absl::Span<const uint64_t> ids, float* out, PullMode mode,
                        RowScratch* scratch) override;
  absl::Status PushRows(int table, absl::Span<const uint64_t> ids, const float* grads, float lr,
                        RowScratch* scratch) override;
  // Static tables, with every shard hosted here, in update mode hogwild
  // without row_lock: the rows' addresses, kReadAndSgd under a sparse
  // optimizer of plain SGD, else kRead; kNo otherwise.
  absl::StatusOr<RowsInPlace> RowAddresses(int table, absl::Span<const uint64_t> ids, float** out) override;

  // The hosted block of global shards: [first_hosted_shard(),
  // first_hosted_shard() + num_hosted_shards()); all of them in a full store.
  int first_hosted_shard() const { return first_hosted_; }
  int num_hosted_shards() const { return num_hosted_; }
  bool hosts(int shard) const { return shard >= first_hosted_ && shard < first_hosted_ + num_hosted_; }
  // Whether some global shard is not hosted here.
  bool partial() const { return num_hosted_ != layout_.num_shards; }
  // The rows of variable `var` the hosted shards hold (contiguous; empty,
  // begin == end, when none). var must be valid.
  RowRange hosted_rows(int var) const { return hosted_rows_[var]; }

  // As Push, but each grads[i].grad points at the first float of its
  // variable's hosted rows and holds hosted_rows(var).size() * cols floats
  // (what a ps task receives for its block; net/ps_service.cc). In a full
  // store the same as Push.
  absl::Status PushHosted(absl::Span<const DenseGrad> grads, float lr);

  // The optimizer of the dense variables (OpenStoreOptions::optimizer).
  const OptimizerOptions& optimizer() const { return optimizer_; }
  // The optimizer of the embedding tables (OpenStoreOptions::sparse_optimizer,
  // or the dense one when that is unset).
  const OptimizerOptions& sparse_optimizer() const { return sparse_optimizer_; }
  // Snapshot of row `id` of embedding table `table` (EmbeddingTable::
  // ReadRowState on the shard holding it): params[dim], slots[k][dim], and
  // its update count. In row_lock mode all from one moment. NotFound for a
  // dynamic id without a row. For tests and checkpoints; thread-safe.
  absl::Status ReadTableRow(int table, uint64_t id, float* params, absl::Span<float* const> slots,
                            uint64_t* update_count = nullptr);
  // ---- Checkpoints ----------------------------------------------------
  // Exact only while no worker pulls or pushes (take checkpoints between
  // steps); with concurrent pushes a snapshot mixes them as Pull does.
  //
  // Sets rows [row_begin, row_end) of variable `var` from `params` and, for
  // k < slots.size(), slot k from slots[k] (each (row_end - row_begin) *
  // cols floats; nullptr skips a slot). Row by row under the seqlock in
  // row_lock mode. Errors as ReadRows.
  absl::Status WriteRows(int var, int64_t row_begin, int64_t row_end, const float* params,
                         absl::Span<const float* const> slots);
  // Variable `var`'s update count (Adam's t; the largest over its parts),
  // and setting it on every part. var must be valid.
  uint64_t update_count(int var) const;
  void SetUpdateCount(int var, uint64_t count);
  // Sets every shard's model version.
  void SetVersion(uint64_t version);
  // Calls visit(id, params, slots, update_count) for every row embedding
  // table `table` holds, shard by shard (EmbeddingTable::ReadRowAt), with
  // the global id, dim params and NumSlots(sparse optimizer) slot arrays
  // (valid during the call). Stops at visit's first error and returns it.
  using TableRowVisitor = std::function<absl::Status(uint64_t id, const float* params,
                                                     absl::Span<const float* const> slots, uint64_t update_count)>;
  absl::Status VisitTableRows(int table, const TableRowVisitor& visit);
  // The same rows in blocks of TableRowBlockRows(dim), each part in an
  // array of its own: what `parts` asks for (global ids, update counts, the
  // params, slot k where bit k of `slots` is set), valid during the call;
  // the rest nullptr. A checkpoint writes each part of a table as one
  // tensor, so it reads the rows once per part, as blocks
  // (EmbeddingTable::ReadRowsAt) rather than a call per row. InvalidArgument
  // for a bad table or a slot the sparse optimizer does not have; stops at
  // visit's first error and returns it.
  // A block holds 256 KiB of a part (an L2's share, whatever the table's
  // width: a buffer per part and thread), from 16 to 4,096 rows: 4,096 of
  // DLRM's 16 floats, 64 of 1,024.
  static constexpr int64_t kTableRowBlockRows = 4096;
  static constexpr int64_t kTableRowBlockBytes = int64_t{256} << 10;
  static int64_t TableRowBlockRows(int64_t dim) {
    return std::clamp<int64_t>(kTableRowBlockBytes / (std::max<int64_t>(dim, 1) * 4), 16, kTableRowBlockRows);
  }
  struct TableRowParts {
    bool ids = false;
    bool update_counts = false;
    bool params = false;
    uint32_t slots = 0;  // bit k: slot k
  };
  struct TableRowBlock {
    int64_t rows = 0;
    const uint64_t* ids = nullptr;            // [rows]
    const uint64_t* update_counts = nullptr;  // [rows]
    const float* params = nullptr;            // [rows * dim]
    std::array<const float*, kMaxEmbeddingSlots> slots{};  // [rows * dim] each
  };
  using TableRowBlockVisitor = std::function<absl::Status(const TableRowBlock& block)>;
  absl::Status VisitTableRowBlocks(int table, const TableRowParts& parts, const TableRowBlockVisitor& visit);
  // Sets row `id` of table `table` (EmbeddingTable::WriteRowState on the
  // shard that holds it under this store's shard count).
  absl::Status WriteTableRow(int table, uint64_t id, const float* params, absl::Span<const float* const> slots,
                             uint64_t update_count);
  // WriteTableRow for each of `ids` in turn: id ids[i] from params[i * dim,
  // + dim), slots[k][i * dim, + dim) and update_counts[i] (nullptr: 0
  // each). The ids of a static table whose rows follow one another in one
  // shard (ids s, s + S, s + 2S, ... of S shards, as a checkpoint lists
  // them) are written as one block (EmbeddingTable::WriteRowStates).
  // Errors as WriteTableRow, naming the first id that fails; the ids before
  // it are written.
  absl::Status WriteTableRows(int table, absl::Span<const uint64_t> ids, const float* params,
                              absl::Span<const float* const> slots, const uint64_t* update_counts);

  // Shard `shard`'s part of embedding table `table` (tests, statistics);
  // `shard` is a global index and must be hosted.
  const EmbeddingTable& table_shard(int table, int shard) const { return tables_[table][shard - first_hosted_]; }

  // Bytes of shared memory in all shards.
  uint64_t total_bytes() const;
  // Where those bytes go: parameter values, optimizer slots, and the rest
  // (headers, layout tables, alignment padding, per-row lock words, table
  // indexes and row metadata). Embedding tables count with the rows they
  // can hold (every hosted shard's capacity), dense variables with their
  // size (a partial store: their hosted rows).
  // Per embedding table (layout().tables order), summed over the hosted
  // shards: rows is their capacity, bytes_per_row the region bytes a row
  // takes (row block plus side words, EmbeddingTable::bytes_per_row), of
  // which meta_bytes_per_row are per-row metadata; overhead is everything
  // of the tables' regions that is neither params nor slots (headers,
  // indexes, metadata, padding).
  struct TableMemory {
    std::string name;
    uint64_t rows = 0, bytes_per_row = 0, meta_bytes_per_row = 0;
    uint64_t params = 0, slots = 0, overhead = 0;
    bool bf16 = false;  // parameters stored as bf16 (params counts 2 bytes each)
  };
  struct Memory {
    uint64_t params = 0, slots = 0, overhead = 0;
    std::vector<TableMemory> tables;
  };
  Memory memory() const;
  // Model version of one shard (a global index; must be hosted).
  uint64_t shard_version(int shard) const;

  // The update mode the store was created with (ps.update; an attached store
  // reads it from the header). In row_lock mode Push updates each row under
  // that row's seqlock, and Pull and ReadRows return whole rows (never a row
  // half from one push and half from another); hogwild and sync push and
  // pull lock-free.
  UpdateMode update_mode() const { return update_mode_; }

  // Snapshot of rows [row_begin, row_end) of variable `var`: their parameters
  // into `params` and, for each k < slots.size(), optimizer slot k into
  // slots[k] (each (row_end - row_begin) * cols floats; a nullptr slots[k] is
  // skipped). slots.size() must be at most the optimizer's NumSlots. In
  // row_lock mode each row's params and slots come from the same moment (a
  // seqlock read); otherwise they may mix concurrent pushes, as in Pull.
  // For tests and checkpoints. Thread-safe; in row_lock mode it waits
  // (spinning) while a writer holds a row. Errors: InvalidArgument for a bad
  // variable, row range or slot count.
  absl::Status ReadRows(int var, int64_t row_begin, int64_t row_end, float* params,
                        absl::Span<float* const> slots) const;

  // Stale segments Create removed (policy `remove`) or found and left
  // (policy `report`); empty for an attached store.
  const std::vector<StaleSegment>& removed_stale_segments() const { return removed_stale_segments_; }
  const std::vector<StaleSegment>& reported_stale_segments() const { return reported_stale_segments_; }

  // Huge pages asked for and granted; granted_bytes is measured now, reading
  // /proc/self/smaps (milliseconds): not for a hot path. For an attached
  // store, `requested` is false (the creator decided).
  HugePageStatus huge_pages() const;
  // Whether the shards are private memory of this process (UsePrivateMemory).
  bool private_memory() const { return private_memory_; }
  // The same as kPrivate or kShared, for reports (StoreMemoryKindName).
  StoreMemoryKind memory_kind() const { return private_memory_ ? StoreMemoryKind::kPrivate : StoreMemoryKind::kShared; }

  // Replica averaging (ps.replication per_node / per_core): sets every
  // parameter of every store in `replicas` to the element-wise mean of that
  // parameter over the stores (summed in the order given, then divided by
  // their number). Optimizer slots, update counts and model versions are not
  // touched: each replica keeps its own. The stores must have identical
  // layouts (variables and row ranges per shard; InvalidArgument otherwise)
  // and at least one, each at most once, must be given.
  // Thread safety: may run while other threads push to and pull from the
  // stores, and concurrently with itself. Parameters are read and written
  // with relaxed std::atomic_ref, so a racing push may be lost or land half
  // before and half after the averaging (the Hogwild contract). In row_lock
  // mode each row is locked in every store (in the order given, so two
  // averagings never deadlock) while it is averaged, so readers still see
  // whole rows. Allocates nothing.
  static absl::Status AverageParams(absl::Span<ShmParamStore* const> replicas);

 private:
  ShmParamStore() = default;
  absl::Status BuildParts();
  // Push and PushHosted (from_hosted: gradients start at the hosted rows).
  // Push or PushHosted; with `pulls`, slices marked in `fused` (bit i: pulls[i])
  // receive their variable's updated parameters from the update itself.
  absl::Status PushImpl(absl::Span<const DenseGrad> grads, float lr, bool from_hosted,
                        absl::Span<const PullSlice> pulls = {}, uint64_t fused = 0);
  // hosted_rows_ from layout_ and the hosted block; FailedPrecondition when
  // a variable's hosted parts are not one contiguous row range.
  absl::Status ComputeHostedRows();
  // InvalidArgument (prefixed by `what`) unless rows [begin, end) of `var`
  // are hosted here (an empty range always is).
  absl::Status CheckHosted(int var, int64_t begin, int64_t end, const char* what) const;
  // InvalidArgument naming `id` of table `table` and its shard, which is not hosted.
  absl::Status NotHosted(int table, uint64_t id, int shard, const char* what) const;
  // The shard table holding row `id` of table `table` and the id it has
  // there (static: id / shards). InvalidArgument, prefixed by `what`, for a
  // bad table or a static id out of range.
  struct RowHome {
    EmbeddingTable* table;
    uint64_t local_id;
  };
  absl::StatusOr<RowHome> HomeOf(int table, uint64_t id, const char* what);
  // Validates the table ids and groups them by shard into scratch (ids,
  // positions, offsets).
  absl::Status GroupIds(int table, absl::Span<const uint64_t> ids, RowScratch* scratch) const;

  // Constant after construction.
  std::string name_;
  OptimizerOptions optimizer_;
  UpdateMode update_mode_ = UpdateMode::kHogwild;
  int num_slots_ = 0;
  StoreLayout layout_;
  // A static table's id / layout_.num_shards and id % num_shards, the local
  // row and the shard of each id of a batch (GroupIds, RowAddresses).
  FixedDivisor shard_divisor_;
  int first_hosted_ = 0;
  int num_hosted_ = 0;
  std::vector<RowRange> hosted_rows_;  // [variable]
  // segments_[k]: hosted shard first_hosted_ + k.
  std::vector<std::unique_ptr<ShmSegment>> segments_;
  // part_[v][s]: pointers into the segment of global shard s for variable v;
  // a shard not hosted has a part with no rows and null pointers.
  struct Part {
    float* params = nullptr;
    float* slots[4] = {};
    uint64_t* update_count = nullptr;
    uint32_t* row_seq = nullptr;  // one seqlock word per row held (shard_format.h)
    int64_t row_begin = 0, row_end = 0;
    // The flags that keep concurrent pushes of this part's elements apart
    // (push_chunks.h; owned by push_chunks_); null where it has no rows.
    PushChunks* chunks = nullptr;
  };
  std::vector<std::vector<Part>> parts_;
  std::vector<std::unique_ptr<PushChunks>> push_chunks_;
  std::vector<uint64_t*> shard_versions_;  // [hosted shard k]
  OptimizerOptions sparse_optimizer_;
  // tables_[t][k]: handle on hosted shard first_hosted_ + k's part of table t
  // (layout_.tables[t]).
  std::vector<std::vector<EmbeddingTable>> tables_;
  std::vector<StaleSegment> removed_stale_segments_;
  std::vector<StaleSegment> reported_stale_segments_;
  HugePageSettings huge_page_settings_;
  bool huge_pages_requested_ = false;
  bool private_memory_ = false;
};

}  // namespace shardwild
