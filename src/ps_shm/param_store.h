// ParamStore: where a job's parameters live, as seen by a worker.
//
// A worker pulls parameters and pushes gradients through this interface and
// never learns whether a shard is in local shared memory, on another socket,
// or (later) on another machine. The optimizer runs inside the store, fused
// into the push: the gradient is applied straight to the shard's memory.
//
// Thread safety: every method may be called concurrently from any number of
// threads (Hogwild). Concurrent pushes to the same parameters interleave
// element by element; a pull that races a push may see a mix of old and new
// values. Neither is an error: that is the Hogwild contract.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/config/options.h"
#include "core/model/partitioner.h"
#include "core/base/random.h"
#include "core/model/variable.h"
#include "ps_shm/embedding_table.h"

namespace shardwild {

class MemoryPlacer;

// An embedding table of the store (sparse rows, pulled and pushed by id).
//
// Sharding: a table's rows are spread over all shards, and each shard hosts
// one EmbeddingTable (embedding_table.h) per store table in its segment.
//   * kStatic (ids in [0, capacity)): modulo striping. Row id lives on shard
//     id % S at local row id / S, so each shard's row array stays dense and
//     every id in [0, capacity) has exactly one row. Shard s holds
//     ceil((capacity - s) / S) rows (at least 1). No hash here: a hash into
//     dense local arrays is not a bijection.
//   * kDynamic (any 64-bit id but 2^64-1): by a mixing hash, shard =
//     (hi32(SplitMix64(id ^ salt)) * S) >> 32 (ShardOfDynamicId below; the
//     salt differs from the one the table's own index probes with).
//     Each shard's table keeps the global id and holds up to
//     ceil(capacity / S) * 9 / 8 + 16 rows (S > 1; exactly capacity for one
//     shard): the headroom absorbs the hash's imbalance, so a kError table may
//     hold a little more than `capacity` rows over all shards before a shard
//     reports it is full.
// Initial values are deterministic given the store's seed: dynamic rows are
// drawn from (seed, table index, id), whatever the shard count; static rows
// from (seed, table index, shard, local row), so they change with the shard
// count (a checkpoint restores values, not draws).
struct TableSpec {
  std::string name;                // 1..47 bytes
  EmbeddingKind kind = EmbeddingKind::kStatic;
  int64_t dim = 0;                 // floats per row, >= 1
  int64_t capacity = 0;            // rows over all shards (static: the vocabulary), >= 1
  CapacityPolicy on_full = CapacityPolicy::kError;  // dynamic tables only
  RowInitializer init;
  // Parameters stored as bf16 (EmbeddingTableOptions::bf16; config
  // model.tables[i].dtype). Every ParamStore call still takes and gives f32.
  bool bf16 = false;
};

// The shard of a dynamic table's id among `shards` (TableSpec): the high 32
// bits of a salted SplitMix64 mix, scaled onto [0, shards) (Lemire's
// multiply-shift, no division). A client spreading ids over ps tasks
// (net/cluster_store.h) routes with this, so it must never change.
inline int ShardOfDynamicId(uint64_t id, uint32_t shards) {
  return static_cast<int>(((SplitMix64Mix(id ^ 0x5348415244ULL) >> 32) * shards) >> 32);
}

// The shard of row `id` of a table of `kind` among `shards`: static id % S,
// dynamic ShardOfDynamicId. `id` must be valid for the table.
inline int ShardOfRowId(EmbeddingKind kind, uint64_t id, uint32_t shards) {
  return kind == EmbeddingKind::kStatic ? static_cast<int>(id % shards) : ShardOfDynamicId(id, shards);
}

// Where each variable's rows live: variable v's rows parts[v][s] are on shard s.
// Each shard holds one contiguous (possibly empty) range of each variable; the
// non-empty ranges of a variable, sorted by row, tile [0, rows).
struct StoreLayout {
  std::vector<VariableSpec> variables;
  int num_shards = 0;
  std::vector<std::vector<RowRange>> parts;  // [variable][shard]
  std::vector<int> shard_nodes;              // NUMA node of each shard's memory
  std::vector<TableSpec> tables;             // embedding tables, on every shard (TableSpec)

  // Splits every variable as `partitioner` says (partitioner.h; a row is
  // cols floats). A variable with k > 1 partitions puts them on shards
  // 0..k-1; variables that don't partition (k = 1) go round-robin, the n-th
  // such variable whole onto shard n % num_shards. num_shards >= 1.
  static StoreLayout Make(std::vector<VariableSpec> variables, int num_shards,
                          const PartitionerOptions& partitioner);
};

// Rows [row_begin, row_end) of variable `var`, copied into `out`
// ((row_end - row_begin) * cols floats), or, where `out_bf16` is set
// instead, into out_bf16 as bf16 (as many uint16 values; rounded to nearest
// even by HogwildCopyFromAsBf16): the pull of a model.precision bf16 model,
// which converts as it copies. Exactly one of the two is set. The store
// keeps f32 either way.
struct PullSlice {
  int var = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  float* out = nullptr;
  uint16_t* out_bf16 = nullptr;
};

// For a store whose pull has no bf16 path of its own (over the network):
// pulls the slices that have `out_bf16` into f32 buffers through `pull_f32`
// and rounds them into out_bf16; the f32 slices go through pull_f32 as they
// are. `layout` gives the widths. Allocates the f32 buffers per call.
absl::Status PullConvertingToBf16(absl::Span<const PullSlice> slices, const StoreLayout& layout,
                                  const std::function<absl::Status(absl::Span<const PullSlice>)>& pull_f32);

// One lookup of a step's row pulls (ParamStore::PullRowsBatch): the rows of
// `ids` of embedding table `table` into out[ids.size() x dim].
struct RowPull {
  int table = 0;
  absl::Span<const uint64_t> ids;
  float* out = nullptr;
};

// One table's row gradients of a worker's step (ParamStore::PushRows'
// arguments; a part of PushRowsBatch, SyncAggregator::Contribute):
// grads[ids.size() x dim] for the rows of `ids` of table `table`.
struct RowGrad {
  int table = 0;
  absl::Span<const uint64_t> ids;
  const float* grads = nullptr;
};

// A gradient for the whole of variable `var` (size() floats).
struct DenseGrad {
  int var = 0;
  const float* grad = nullptr;
};

struct OpenStoreOptions {
  StoreOptions store;
  OptimizerOptions optimizer;
  // The optimizer of the embedding tables (config optimizer.sparse); unset =
  // `optimizer` for tables too. Table rows get the slots this one needs.
  std::optional<OptimizerOptions> sparse_optimizer;
  // Embedding tables (TableSpec). Every update mode applies to them:
  // hogwild and sync push rows lock-free (in sync mode one SyncAggregator
  // round pushes the averaged rows once per step), row_lock pushes each row
  // under its seqlock (EmbeddingTableOptions::row_lock).
  std::vector<TableSpec> tables;
  uint64_t seed = 1;              // initial values (variable.h)
  int num_shards = 1;             // resolved shard count (StoreOptions::shards may say auto)
  // The block of the num_shards global shards this store hosts (one ps task's
  // share of the global shard map, net/cluster_spec.h ShardMap): shards
  // [first_hosted_shard, first_hosted_shard + num_hosted_shards). -1 = all
  // (first_hosted_shard is then ignored).
  // Only the hosted shards get memory; the layout, partitioning, initial
  // values and row routing stay those of the whole num_shards-shard store,
  // so every ps task computes the same. ShmParamStore says what a partial
  // store does with the rows it does not host.
  int first_hosted_shard = 0;
  int num_hosted_shards = -1;
  MemoryPlacer* placer = nullptr; // not owned; nullptr = first touch by the calling thread
  // Threads that first-touch each shard's memory and initialise its static
  // embedding rows: the placer's thread for the shard's node and helpers it
  // starts (which inherit its binding). Shards are set up one after
  // another. 0 = one per hardware thread.
  int init_threads = 0;
  // Whether other processes may attach to the store by name (worker
  // processes, Python, a cluster's worker on the same host). Only a store
  // no one else attaches to may be put in private memory by
  // store.memory_kind auto (ShmParamStore::Create).
  bool others_attach = true;
};

// Per-thread scratch of PullRows/PushRows: ids grouped by shard and the
// deduplication buffers of EmbeddingTable::Push. Reuse one per thread: once
// it has seen the largest batch, pulls and pushes allocate nothing. Not
// thread-safe; may be used with any store and table.
class RowScratch {
 public:
  RowScratch() = default;

  // Implementation state (for ParamStore implementations only).
  std::vector<uint64_t> ids;          // ids of the batch, grouped by shard
  std::vector<uint32_t> positions;    // batch index of each grouped id
  std::vector<float> values;          // rows in grouped order (gradients or pulled rows)
  std::vector<uint32_t> offsets;      // start of shard s's group: [s], end: [s + 1]
  EmbeddingTable::Scratch table;
};

class ParamStore {
 public:
  virtual ~ParamStore() = default;

  // Creates a store in this process's shared memory holding `variables` and
  // options.tables, initialised from options.seed. The segments are unlinked when the store
  // is destroyed. Errors: InvalidArgument for bad options,
  // ResourceExhausted when shared memory is too small.
  static absl::StatusOr<std::unique_ptr<ParamStore>> Open(const OpenStoreOptions& options,
                                                          std::vector<VariableSpec> variables);

  virtual const StoreLayout& layout() const = 0;
  // The unique name of this store (its segments are "<name>-s<k>").
  virtual const std::string& name() const = 0;

  // Copies each slice's rows into its `out`. Never blocks on other threads
  // (in update mode row_lock it may spin briefly while a push holds a row).
  virtual absl::Status Pull(absl::Span<const PullSlice> slices) = 0;
  // Applies the optimizer with learning rate `lr` to each variable with its
  // gradient, then advances the model version by one.
  virtual absl::Status Push(absl::Span<const DenseGrad> grads, float lr) = 0;
  // Push, then Pull of `pulls`: each slice receives the parameters as they
  // stand once this push has been applied (ps-lite's PushPull). A store that
  // can fuses the two, writing the updated parameters to the slices in the
  // same pass as the update, so a worker that refreshes its copy every step
  // reads the parameters once instead of twice. The result is what Push
  // followed at once by Pull may return (Hogwild: other threads' pushes may
  // land before, during or after). Errors as Push and Pull; if the push
  // fails, the slices are left as they were or partly written.
  // Default: Push, then Pull.
  virtual absl::Status PushPull(absl::Span<const DenseGrad> grads, float lr, absl::Span<const PullSlice> pulls) {
    if (absl::Status s = Push(grads, lr); !s.ok()) return s;
    return Pull(pulls);
  }

  // Copies the rows of `ids` of embedding table `table` (layout().tables)
  // into out[ids.size() x dim]. Ids may repeat. mode kInsert gives a missing
  // dynamic id a row at its initial value; kReadOnly reads it as that value
  // without inserting. With `scratch` (the calling thread's) the ids are
  // grouped by shard first and each shard's rows are fetched with
  // prefetching; with nullptr they are read one by one. Allocates nothing
  // once `scratch` is warm. Errors: InvalidArgument for a bad table, a
  // static id >= capacity or the reserved dynamic id (nothing is copied);
  // ResourceExhausted when a dynamic kError table's shard is full.
  // Thread-safe (Hogwild: a pull racing a push may see a mix of both).
  // The default is for stores without tables: Unimplemented.
  virtual absl::Status PullRows(int table, absl::Span<const uint64_t> ids, float* out, PullMode mode,
                                RowScratch* scratch) {
    return absl::UnimplementedError("this parameter store holds no embedding tables");
  }
  // Applies one step of the sparse optimizer (OpenStoreOptions) with
  // learning rate `lr` to the rows of `ids`, gradients grads[ids.size() x
  // dim]. Repeated ids are summed first (in batch order), then each unique
  // row is updated once, fused into the shard's table (EmbeddingTable::Push;
  // lazy, row-wise Adam). Missing dynamic ids are inserted first. `scratch`
  // is the calling thread's, required. Does not advance version() (that
  // counts dense pushes). Errors as PullRows; an invalid id is reported
  // before any row changes. Thread-safe (Hogwild); allocates nothing once
  // `scratch` is warm.
  virtual absl::Status PushRows(int table, absl::Span<const uint64_t> ids, const float* grads, float lr,
                                RowScratch* scratch) {
    return absl::UnimplementedError("this parameter store holds no embedding tables");
  }

  // A step's row pulls over every lookup at once: PullRows of each part, in
  // order. Stores that pay per call (the network) fetch all parts from each
  // owner in one call; the default runs PullRows part by part. Errors as
  // PullRows; a store that batches checks every part before it fetches any.
  // Thread-safety and allocation as PullRows.
  virtual absl::Status PullRowsBatch(absl::Span<const RowPull> parts, PullMode mode, RowScratch* scratch) {
    for (const RowPull& part : parts) {
      if (part.ids.empty()) continue;
      if (absl::Status s = PullRows(part.table, part.ids, part.out, mode, scratch); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // A step's row pushes over every lookup at once: PushRows of each part, in
  // order (two parts of one table are two updates, as two PushRows calls
  // are). Stores that pay per call send all parts to each owner in one call;
  // the default runs PushRows part by part. Errors as PushRows; a store that
  // batches checks every part's ids before any row changes.
  virtual absl::Status PushRowsBatch(absl::Span<const RowGrad> parts, float lr, RowScratch* scratch) {
    for (const RowGrad& part : parts) {
      if (part.ids.empty()) continue;
      if (absl::Status s = PushRows(part.table, part.ids, part.grads, lr, scratch); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Rows in place. Where table `table`'s rows live in this process's memory
  // at fixed addresses (a static table, all of its shards hosted here) and
  // are written without locks (hogwild, no row_lock), writes the address of
  // each id's dim() parameters to out[i] and says what the caller may do
  // with them:
  //   * kRead: read them in place for its forward pass
  //     (HogwildEmbeddingBagForward) instead of PullRows into a copy, and
  //     push its gradients with PushRows as before. The rows read are those
  //     a pull would have copied: a pull of a static table copies each row's
  //     parameters and nothing else, whatever the optimizer.
  //   * kReadAndSgd: also, where this store updates them with plain SGD
  //     (so PushRows is row -= lr * gradient and nothing else), apply each
  //     gradient in place fused with the embedding-bag backward
  //     (HogwildEmbeddingBagSgd) instead of PushRows from a gradient buffer:
  //     the same update, except that a repeated id is updated once per
  //     occurrence rather than once with the sum.
  // Returns kNo, writing nothing, where neither holds (dynamic tables,
  // row_lock and sync modes, remote stores): the caller pulls and pushes.
  // Which of the three it answers depends on the table alone, never on
  // the ids: with none (out may be null) it says how a batch's rows would
  // be used.
  // Errors as PullRows for a bad table or id. A bf16 table's
  // (layout().tables[table].bf16) addresses point at dim bf16 values
  // (uint16_t, cast to float*): read and update them with the bf16 kernels
  // (HogwildEmbeddingBagForwardBf16, HogwildEmbeddingBagSgdBf16).
  // Thread-safe; allocates nothing. The default: kNo.
  virtual absl::StatusOr<RowsInPlace> RowAddresses(int table, absl::Span<const uint64_t> ids, float** out) {
    return RowsInPlace::kNo;
  }

  // Number of pushes applied so far (ElasticDL's model version).
  virtual uint64_t version() const = 0;

  // Convenience: pulls all of variable `var` into `out`.
  absl::Status PullVariable(int var, float* out) {
    const PullSlice s{var, 0, layout().variables[var].rows, out};
    return Pull({&s, 1});
  }
};

}  // namespace shardwild
