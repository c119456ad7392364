// EmbeddingTable: the rows of one embedding table, laid out inside a
// caller-provided memory region so that a shard can host it in its shared
// memory segment and another process can attach to it.
//
// The region holds only offsets, never pointers:
//
//   [EmbeddingTableHeader, 4096 bytes]
//   [index: index_slots x IndexEntry]          (dynamic tables only)
//   [side words: capacity x side_stride bytes] (static tables that need them; 64-byte aligned)
//   [rows: capacity x row_stride bytes]        (4096-byte aligned)
//
// Row layout (format 3, "lean rows"). A static row block is only its floats:
//
//   [params: dim floats][slot 0: dim floats]...[slot num_slots-1][pad]
//
// and a dynamic one ends with a 16-byte RowMeta:
//
//   [params][slots][pad to 8][RowMeta: key (8) | word0 (4) | word1 (4)][pad]
//
// so one update touches one contiguous block. row_stride is the block's
// bytes rounded up to a power of two (16, 32 or 64) when they are at most
// 64, so such a block never straddles a cache line, and to a multiple of 16
// above 64. Static SGD of dim 16 takes exactly 64 bytes a row.
//
// Per-row metadata, only where the table's mode needs it:
//   * Static tables: none in the row. A row_lock table keeps a 4-byte
//     seqlock word per row, and a table with two or more slots (Adam's
//     count; FTRL also has two slots and keeps an unused count) a 4-byte
//     update count, in a side array indexed by row: [seq][count], 0, 4 or 8
//     bytes a row. An update of such a row touches one more cache line.
//   * Dynamic tables: the 16-byte RowMeta. key = id + 1 (0: a kError row
//     handed out but not yet initialised). kError: word0 is the seqlock
//     word (row_lock), word1 the update count. LRU: word0 is the state word
//     [state: 2 bits][tick: 16 bits][pins: 14 bits] and word1 the update
//     count or the seqlock word; a row_lock LRU table that counts updates
//     packs both into word1 as [count: 24 bits][seq: 8 bits] (below).
//   * Update counts are 32 bits and saturate at 2^32 - 1 (24 bits and
//     2^24 - 1 when packed): Adam's bias correction 1 - beta^t is then 1 in
//     float for any beta2 <= 1 - 1e-6, so a saturated t changes nothing a
//     float can show. A table with fewer than two slots keeps no count:
//     ReadRowState reports 0 and WriteRowState ignores the count it is
//     given (no optimizer that needs one fits such a table).
//
// Two kinds of table:
//   * kStatic: a bounded vocabulary. Row id in [0, capacity) indexes the row
//     array directly. Every row is initialised by Create().
//   * kDynamic: unbounded 64-bit ids (the one value 2^64-1 is reserved). A
//     linear-probing open-addressing index maps an id to a row; a row is
//     created and initialised on the first Pull or Push that names its id.
//     The index has a power-of-two number of slots >= capacity / 0.7, so its
//     load never exceeds 0.7 and every probe ends at an empty slot.
//
// Initial values depend only on (seed, table_id, id, element): they are drawn
// from a counter-based hash RNG (SplitMix64), so a row's values never depend on
// which thread or process touches it first, nor on insertion order.
//
// Optimizer state is row-wise and lazy: Push updates only the rows named in
// the batch. Each row counts its own Adam updates and uses that count as its
// step t for bias correction (TensorFlow's LazyAdam / sparse Adam semantics);
// concurrent pushes to one row each take their own t (atomic fetch_add).
// Rows not in a batch keep their moments unchanged (no decay).
//
// Hot path: Pull and Push never allocate (Push's deduplication uses the
// caller's Scratch) and never lock, except for the first touch of a new id
// in an LRU table (below) and, in a row_lock table, the row being updated.
//
// Update mode row_lock (EmbeddingTableOptions::row_lock): each row has a
// seqlock word (ps_shm/row_seqlock.h; where it lives: "Per-row metadata"). Push holds it, row by row,
// while it updates the row's parameters, slots and update count; Pull copies
// a row's parameters inside a seqlock read and retries if a push overlapped.
// So a row is never seen, nor updated, half-way through another update.
// Packed count-and-seq word (LRU, row_lock, two or more slots): LockRow's
// CAS sets the low bit as usual (an even low byte + 1 never carries), and
// the unlock is a release store of [count after this update][seq + 1 mod
// 2^8]. A reader's copy is accepted only if the whole 32-bit word is equal
// before and after; a push always changes it (the count grows, or the seq
// byte moves on), so a torn read passes unnoticed only if 128 k writes
// overlap one copy while the count stands still (saturated, or set back by
// WriteRowState).
//
// Thread safety: Pull and Push may be called concurrently from any number of
// threads in any number of processes attached to the same region (Hogwild).
// Parameters and slots are read and written by the Hogwild kernels
// (core/model/hogwild_kernels.h: SIMD loads and stores, the optimizer updates,
// row copies and fills) or, in cold paths (checkpoint reads and writes),
// through std::atomic_ref<float> with memory_order_relaxed: concurrent
// pushes to one row interleave lane by lane, and a pull racing a push may
// see a mix of old and new values. Everything else (index, row metadata, counters) is
// race-free; see "Concurrency" below.
//
// Concurrency
// -----------
// Static tables and dynamic tables with CapacityPolicy::kError never move or
// reuse a row: once an id has a row, (id -> row) is fixed for the life of the
// region.
//   * Insert (kError): the inserter first reserves room (a CAS loop on the
//     header's `reserved` counter, bounded by capacity), then claims an empty
//     index slot by CAS on its key word (relaxed: the single modification
//     order of that word decides the winner, and nothing is published
//     through it). The winner takes a row
//     index (fetch_add on `next_row`), initialises the row, then publishes it
//     by storing row+1 into the slot's `row` word with memory_order_release.
//     A loser of the CAS for the same id gives its reservation back and uses
//     the winner's row. So every id gets exactly one row and no row is
//     initialised twice. Rival inserters of one id may both hold a
//     reservation for a moment, so `reserved` at capacity is not yet "full":
//     an inserter that finds no room waits (pause, then yield) until a
//     reservation comes back, its id appears, or `next_row` reaches the
//     capacity; a reservation held past 1 s (a stopped thread, a dead
//     process) counts as taken.
//   * Lookup: loads the key (relaxed); on a match loads `row` with acquire.
//     Zero means "being initialised": it spins (pause) until it is non-zero.
//     The acquire load that reads the published row+1 synchronises with the
//     inserter's release store, so the reader sees the initialised row.
//
// Dynamic tables with CapacityPolicy::kEvictLru reuse rows, so a reader must
// never update a row after it has been given to another id. Rows are pinned:
//   * A row's state word packs a state (ready / evicting), its 16-bit LRU
//     tick and a pin count (14 bits: at most 2^14 - 1 threads may hold one
//     row at once; each Pull, Push or checkpoint read holds one row at a
//     time).
//     A reader that found row r for id K pins it (fetch_add, acquire), then
//     checks that the state is ready and RowMeta::key == K + 1; otherwise it
//     unpins and looks the id up again. While pinned, r keeps id K: the
//     evictor takes a row only by a CAS from (ready, any tick, 0 pins) to
//     (evicting, tick 0), and gives it back with a release RMW (an add)
//     that keeps concurrent pin counts. A pinned reader moves the tick
//     forward with a relaxed CAS on the whole word that keeps the state and
//     pins it saw (and fails if they changed); an RMW, so it continues the
//     release sequence of the unpins before it, and the evictor's acquire
//     CAS still synchronises with every unpin.
//     So an update can never land on another id's row, and an eviction
//     never races an update of its victim. (A worker whose id was evicted
//     between its Pull and its Push gets a fresh row at the initial value,
//     and its gradient applies there: that loss is what eviction means.)
//   * All index writes (inserts and evictions) happen under the table's
//     eviction lock, a spin lock word in the header (acquire/release). So
//     the first touch of a new id is serialised in an LRU table; lookups of
//     existing rows stay lock-free.
//   * Eviction deletes the victim's index entry by backward-shift deletion
//     (no tombstones, so probe lengths do not grow over time). Moving entries
//     can make a concurrent lock-free probe miss an id that is present. A
//     hit is always validated through the pinned row (above). A miss is
//     trusted only if the header's index epoch, a seqlock bumped to odd
//     before and even after every entry move, was even and unchanged across
//     the probe; otherwise the probe is retried. Moved entries are written
//     with release stores and probed with acquire loads, so a probe that
//     read any moved entry also sees the odd epoch (no fences, which
//     ThreadSanitizer does not model). An inserting miss re-probes under
//     the lock anyway, where no index writer runs concurrently.
//   * Victims are chosen by approximate LRU, as Redis does: 8 occupied rows
//     are sampled and the unpinned one with the oldest tick is evicted. The
//     header clock advances once per Pull/Push call; a row's 16-bit tick is
//     clock >> tick_shift, where tick_shift = max(0, bit_width(capacity) -
//     12), so ticks are exact for tables of up to 4095 rows and coarser
//     above. Ages are (now - tick) mod 2^16 read as signed: a row untouched
//     for 2^15 coarse ticks (at least 8 x capacity calls) or more may look
//     young, which only makes the LRU rougher, never a row evicted while
//     pinned.
//   If a process dies while holding a pin, that row is never evicted again;
//   if it dies holding the eviction lock, inserts into that table hang. The
//   owner of the segment restarts the job from a checkpoint in either case.
//
// Non-goals of this unit: sharding ids across shards (the caller hashes ids
// to shards), NUMA placement (the caller maps and binds the region; dynamic
// rows are first touched by the thread that inserts them, static rows by the
// threads that call InitRows, or Create's), and checkpointing. The region's
// row memory must read as zeros before Create or Format (fresh shared or
// anonymous memory does): a dynamic row's RowMeta is only written when the
// row is first handed out.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/config/options.h"

namespace shardwild {

// The on-memory format (embedding_table.cc); only EmbeddingTable reads it.
struct EmbeddingTableHeader;
struct EmbeddingIndexEntry;
struct EmbeddingRowMeta;

inline constexpr int kMaxEmbeddingSlots = 4;

enum class EmbeddingKind : uint32_t { kStatic = 0, kDynamic = 1 };
enum class CapacityPolicy : uint32_t { kError = 0, kEvictLru = 1 };

const char* EmbeddingKindName(EmbeddingKind kind);
const char* CapacityPolicyName(CapacityPolicy policy);

// How a new row's parameters are drawn. Slots start at
// EmbeddingTableOptions::slot_init.
struct RowInitializer {
  enum class Kind : uint32_t {
    kZeros = 0,
    kUniform = 1,          // U(a, b)
    kNormal = 2,           // N(0, stddev^2)
    kTruncatedNormal = 3,  // N(0, stddev^2), resampled beyond 2 stddev (as TensorFlow)
  };
  // Keras' Embedding default: uniform(-0.05, 0.05).
  Kind kind = Kind::kUniform;
  float a = -0.05f;
  float b = 0.05f;
  float stddev = 0.05f;
};

struct EmbeddingTableOptions {
  // Used in messages only; at most 47 bytes.
  std::string name = "embedding";
  EmbeddingKind kind = EmbeddingKind::kStatic;
  int64_t dim = 0;       // floats per row; required, >= 1
  int64_t capacity = 0;  // rows: the vocabulary (static) or the most rows held (dynamic); >= 1
  int num_slots = 0;     // optimizer slot arrays per row, 0..kMaxEmbeddingSlots; >= NumSlots(optimizer)
  // The value every element of slot k (< num_slots) starts at: core's
  // SlotInitialValue (e.g. adagrad's initial_accumulator_value). Push refuses
  // an optimizer whose slot initial values differ. SetOptimizer sets both.
  std::array<float, kMaxEmbeddingSlots> slot_init = {};
  CapacityPolicy on_full = CapacityPolicy::kError;  // dynamic only
  RowInitializer init;
  uint64_t seed = 1;
  uint32_t table_id = 0;  // mixed into the initial values, so two tables differ
  // Parameters stored as bf16 (model.tables[i].dtype bf16): half the bytes
  // of f32 parameters; slots stay f32, after them. Pull, ReadRowState and
  // ReadRowAt widen them to f32 (exactly); Push computes the update in f32
  // and stores it back by stochastic rounding (HogwildUpdateRowsBf16), so
  // E[stored] is the f32 result; initial values and WriteRowState round to
  // nearest. Static rows in place (StaticRowParams) are bf16 values.
  bool bf16 = false;
  // Update mode row_lock (ps.update): each row's parameters, slots and update
  // count change together under the row's seqlock, and Pull copies whole
  // rows (never half from one push and half from another). Off: hogwild.
  bool row_lock = false;
  // Each row counts its updates, the step t of Adam's bias correction (per
  // row: lazy Adam). A static row's count is a 4-byte side word, a dynamic
  // row's a word of its RowMeta. Push with Adam needs it; no other
  // optimizer reads it, so SetOptimizer sets it for Adam only.
  bool count_updates = false;

  // Sizes and fills the slots for `optimizer` (NumSlots, SlotInitialValue)
  // and keeps update counts if it reads them (count_updates).
  void SetOptimizer(const OptimizerOptions& optimizer);

  // Checks the values together; errors name the field ("embedding.dim: must
  // be >= 1, got 0").
  absl::Status Validate() const;
};

// The initial parameters of row `id` of a table with these options (dim
// floats into `out`). Create() and inserts use exactly this, so a test or a
// read-only lookup can reproduce a row without touching the table.
void InitialRowValue(const EmbeddingTableOptions& options, uint64_t id, float* out);

// Whether reads of missing ids insert them (dynamic tables only).
enum class PullMode {
  kInsert,    // training: a missing id gets a row with its initial value
  kReadOnly,  // evaluation: a missing id reads as its initial value; nothing is inserted,
              // no LRU tick is advanced
};

// A handle on a table in a region: constants and pointers into the region,
// cheap to copy; copies (and handles in other processes) share the table.
// Every method may be called from any thread; see "Concurrency" above.
class EmbeddingTable {
 public:
  static constexpr int kMaxSlots = kMaxEmbeddingSlots;
  // The reserved id of dynamic tables (the index's empty marker).
  static constexpr uint64_t kReservedId = ~uint64_t{0};

  // Per-thread scratch for Push's deduplication. Reuse one per thread: once
  // it has seen the largest batch, Push allocates nothing. Not thread-safe.
  class Scratch {
   public:
    Scratch() = default;

    // Open addressing, id -> unique index: one line holds 4 whole entries.
    struct MapEntry {
      uint64_t key = 0;
      uint32_t value = 0;
      uint32_t stamp = 0;  // valid iff == stamp_
    };

   private:
    friend class EmbeddingTable;
    std::vector<uint64_t> unique_ids_;   // first-occurrence order (the push's first ones)
    std::vector<uint32_t> first_row_;    // per unique id: the gradient row of its first occurrence
    std::vector<int32_t> sum_of_;        // per unique id: its row in summed_, or -1 (a long row's, once)
    std::vector<float> summed_;          // gradient sums: every unique id's (short rows), or the repeats'
    std::vector<MapEntry> map_;
    uint32_t stamp_ = 0;
    double repeated_ = 1.0;  // the share of the last push's ids that repeated
  };

  // Bytes of region a table with `options` needs (a multiple of 64), or 0 if
  // the options do not pass Validate().
  static size_t BytesFor(const EmbeddingTableOptions& options);

  // Formats `region` ([region, region + bytes), 64-byte aligned, at least
  // BytesFor(options)) as a new table: writes the header and the empty index
  // and, for a static table, initialises every row (this is the first touch
  // of the row memory: call it on a thread bound to the region's NUMA node).
  // The region must not be shared with another thread or process until
  // Create returns. The region is not owned and must outlive the table and
  // every copy of it.
  // Errors: InvalidArgument for bad options, a misaligned or short region.
  static absl::StatusOr<EmbeddingTable> Create(void* region, size_t bytes, const EmbeddingTableOptions& options);

  // Create in three steps, so that several threads can initialise a static
  // table's rows: Format writes the header and the empty index (and takes
  // the same arguments and gives the same errors as Create), InitRows
  // initialises static rows [begin, end) (clamped to [0, capacity); a no-op
  // for a dynamic table), and Publish makes the table attachable. Rows hold
  // exactly what Create gives them whatever the split and order, since a
  // row's values depend only on (seed, table_id, id). InitRows is the first
  // touch of its rows and their side words: call it on threads bound to
  // the region's NUMA node. Calls on disjoint ranges may run concurrently;
  // every range must be initialised, and every InitRows call must happen
  // before Publish (e.g. by joining the threads). Until Publish, nothing but
  // InitRows may be called on the table, and Attach fails ("not created yet").
  static absl::StatusOr<EmbeddingTable> Format(void* region, size_t bytes, const EmbeddingTableOptions& options);
  void InitRows(int64_t begin, int64_t end) const;
  // Where in its region a table with `options` keeps what InitRows(begin,
  // end) writes (same clamping; known before Format): the rows' blocks and
  // their side words, in that order, as offsets from the region's start; a
  // range is empty where there is nothing to write (a dynamic table, a
  // table without side words). A creator that reserves these pages just
  // before InitRows writes them finds them still in the caches
  // (ShmParamStore's set-up), and the rest of the region can be reserved
  // before Format.
  struct ByteRange {
    size_t offset = 0;
    size_t bytes = 0;
  };
  static std::array<ByteRange, 2> InitRowsBytes(const EmbeddingTableOptions& options, int64_t begin, int64_t end);
  void Publish() const;

  // Attaches to a table that Create formatted, possibly in another process
  // and at another address. Validates the header: magic, format version,
  // checksum, every field's range and that the layout it describes fits in
  // `bytes`. FailedPrecondition names the field that is wrong;
  // InvalidArgument for a misaligned or short region.
  static absl::StatusOr<EmbeddingTable> Attach(void* region, size_t bytes);

  // Copies the rows of `ids` into out[ids.size() x dim] (row-major). Ids may
  // repeat. InvalidArgument naming the first bad id (static: >= capacity;
  // dynamic: kReservedId) before anything is copied. Dynamic, kInsert: missing ids get rows; ResourceExhausted
  // naming the table and its capacity if a kError table is full (rows before
  // that id have been copied and inserted). Thread-safe; never allocates; in
  // an LRU table an insert takes the eviction lock.
  absl::Status Pull(absl::Span<const uint64_t> ids, float* out, PullMode mode = PullMode::kInsert);

  // Applies one optimizer step to the rows of `ids` with gradients
  // grads[ids.size() x dim]. Repeated ids are summed first (in batch order),
  // then each unique row is updated once by core's ApplyUpdate on its
  // params+slots block, with its own update count as Adam's step. Missing ids
  // of a dynamic table are inserted first (initial value, slots at slot_init).
  // `optimizer` must have passed Validate(), need at most num_slots() slots,
  // start its slots at the table's slot_init and, if it is Adam, have a
  // table that counts updates (FailedPrecondition otherwise); its hyper-parameters should be the same for every push.
  // `scratch` is the calling thread's (not shared). Errors as for Pull;
  // validation errors are found before any row is changed. Thread-safe
  // (Hogwild); allocates only while `scratch` grows.
  absl::Status Push(absl::Span<const uint64_t> ids, const float* grads, const OptimizerOptions& optimizer, float lr,
                    Scratch* scratch) {
    return Push(ids, grads, {}, optimizer, lr, scratch);
  }
  // As above, but the gradient of ids[i] is row grad_rows[i] of `grads`
  // (grads + grad_rows[i] * dim), so a caller that grouped ids (by shard)
  // needs no copy of the gradients; empty grad_rows means row i. The
  // repeated ids' gradients are summed into scratch; where rows are short
  // (up to 16 floats) and the last push through `scratch` had many repeats,
  // every unique id's is (a short copy that lets the deduplication run
  // without branching on repeats). The sums are the same either way.
  absl::Status Push(absl::Span<const uint64_t> ids, const float* grads, absl::Span<const uint32_t> grad_rows,
                    const OptimizerOptions& optimizer, float lr, Scratch* scratch);

  // Snapshot of the row of `id`: its parameters into params[dim] and, for
  // each k < slots.size(), slot k into slots[k][dim] (nullptr skips it), and
  // its update count (Adam's t) into *update_count when not null. In a
  // row_lock table all of it comes from one moment (a seqlock read);
  // otherwise it may mix concurrent pushes, as Pull does. Inserts nothing.
  // Errors: InvalidArgument for a bad id or more slots than num_slots();
  // NotFound if a dynamic table holds no row for `id`. For tests and
  // checkpoints; thread-safe.
  absl::Status ReadRowState(uint64_t id, float* params, absl::Span<float* const> slots,
                            uint64_t* update_count = nullptr);

  // Checkpoint export: the row at index `row` (0 <= row < size()): its id
  // into *id and its state as ReadRowState gives it. Returns false (copying
  // nothing) if the row is not in use right now: handed out but not yet
  // initialised, or (LRU) being evicted. Rows 0..size()-1 visited in order
  // name every id the table holds once, provided no insert or eviction runs
  // meanwhile (take checkpoints while no worker pulls or pushes).
  // InvalidArgument for a row outside [0, size()) or too many slots.
  absl::StatusOr<bool> ReadRowAt(int64_t row, uint64_t* id, float* params, absl::Span<float* const> slots,
                                 uint64_t* update_count);
  // Checkpoint export of rows [begin, end) (0 <= begin <= end <= size()) at
  // once: the i-th of them in use (as ReadRowAt) goes to ids[i], params[i *
  // dim, + dim), slots[k][i * dim, + dim) and update_counts[i]. Any of them
  // may be nullptr (not copied), as may slots[k]; slots.size() <=
  // num_slots(). Returns how many rows were in use: end - begin for a static
  // table. A static table's rows are copied block by block, its parameters in
  // one Hogwild copy where the rows hold nothing else (a DLRM table: one call
  // for 4,096 rows instead of 4,096 calls through ReadRowAt).
  // InvalidArgument for a range outside [0, size()) or too many slots.
  absl::StatusOr<int64_t> ReadRowsAt(int64_t begin, int64_t end, uint64_t* ids, float* params,
                                     absl::Span<float* const> slots, uint64_t* update_counts);
  // Checkpoint import: sets the row of `id` (inserted first in a dynamic
  // table) to `params` (dim floats), slot k to slots[k] (k < slots.size();
  // a nullptr or missing slot keeps its value) and its update count. In a
  // row_lock table under the row's seqlock. Errors as Push (a bad id, a full
  // kError table).
  absl::Status WriteRowState(uint64_t id, const float* params, absl::Span<const float* const> slots,
                             uint64_t update_count);
  // Checkpoint import of ids [first_id, first_id + n) at once: as
  // WriteRowState for each, id first_id + i from params[i * dim, + dim),
  // slots[k][i * dim, + dim) and update_counts[i] (update_counts may be
  // nullptr: 0 each). A static table's rows (id = row) are written as a
  // block, its parameters in one Hogwild copy where the rows hold nothing
  // else (the mirror of ReadRowsAt); a dynamic or row_lock table's one by
  // one. Errors as WriteRowState: a static table's range past its capacity
  // writes nothing; a dynamic table's first id that fails is reported, the
  // rows before it written.
  absl::Status WriteRowStates(uint64_t first_id, int64_t n, const float* params,
                              absl::Span<const float* const> slots, const uint64_t* update_counts);

  // Rows that hold an id (static: capacity). In a kError table it counts rows
  // being initialised too.
  int64_t size() const;
  // Rows evicted so far (LRU tables).
  int64_t evictions() const;
  // Rows initialised so far, at Create and on insert (eviction reinitialises).
  // For a table without evictions, initializations() == size() says that no
  // row was initialised twice.
  int64_t initializations() const;

  EmbeddingKind kind() const { return kind_; }
  // Whether rows are written under their seqlock (update mode row_lock).
  bool row_lock() const { return row_lock_; }
  // The parameters of static row `id` (< capacity(), unchecked) in place:
  // dim() floats (dim() bf16 values in a bf16() table, cast) that never
  // move (ParamStore::RowAddresses). Static tables only; read and write them
  // with the Hogwild kernels (the bf16 ones for a bf16 table).
  float* StaticRowParams(uint64_t id) const {
    return reinterpret_cast<float*>(RowBlock(static_cast<int64_t>(id)));
  }
  // A batch's range check without a branch an id: OR this over its ids,
  // and the top bit is set exactly where some id is past `last` (< 2^63):
  // last - id wraps below zero, or id has its top bit.
  static constexpr uint64_t PastLastBits(uint64_t id, uint64_t last) { return (last - id) | id; }
  CapacityPolicy on_full() const { return on_full_; }
  int64_t dim() const { return dim_; }
  int64_t capacity() const { return capacity_; }
  int num_slots() const { return num_slots_; }
  // Whether parameters are stored as bf16 (EmbeddingTableOptions::bf16).
  bool bf16() const { return bf16_; }
  // Bytes of one row's parameters in its block (dim x 4, or dim x 2 rounded
  // up to 4 for bf16).
  size_t params_bytes_per_row() const { return slots_offset_; }
  // Bytes between consecutive row blocks.
  size_t row_stride() const { return row_stride_; }
  // Bytes of the region per row: the row block plus its side words.
  size_t bytes_per_row() const { return row_stride_ + side_stride_; }
  // Bytes of per-row metadata: the RowMeta (dynamic) or the side words
  // (static); row padding is not metadata.
  size_t meta_bytes_per_row() const;
  // The options the table was created with (read back from the header).
  const EmbeddingTableOptions& options() const { return options_; }

  // Test hooks. Checks, with no concurrent writers, that every index entry
  // names a distinct row whose metadata holds the same id, and that the
  // number of entries equals size(). Static tables: always OK.
  absl::Status CheckConsistencyForTest() const;
  // The row index of `id`, or -1 if it has none. No concurrent writers.
  int64_t RowOfForTest(uint64_t id) const;

 private:
  EmbeddingTable() = default;
  static absl::StatusOr<EmbeddingTable> FromHeader(void* region, size_t bytes);
  // Points the table at a formatted region `base` laid out for `options`
  // (shared by Create and Attach).
  void Bind(const EmbeddingTableOptions& options, char* base);

  char* RowBlock(int64_t row) const { return rows_ + static_cast<size_t>(row) * row_stride_; }
  EmbeddingRowMeta* Meta(int64_t row) const {
    return reinterpret_cast<EmbeddingRowMeta*>(RowBlock(row) + meta_offset_);
  }
  // The row's metadata words: its side words (static) or its RowMeta.
  char* MetaWords(int64_t row) const {
    return kind_ == EmbeddingKind::kStatic ? side_ + static_cast<size_t>(row) * side_stride_
                                           : RowBlock(row) + meta_offset_;
  }
  // The row's seqlock word (row_lock tables) and update count word (tables
  // that count updates); the same word when packed_.
  uint32_t* SeqWord(int64_t row) const { return reinterpret_cast<uint32_t*>(MetaWords(row) + seq_at_); }
  uint32_t* CountWord(int64_t row) const { return reinterpret_cast<uint32_t*>(MetaWords(row) + count_at_); }
  // The row's update count (0 in a table that keeps none).
  uint64_t LoadCount(int64_t row) const;
  // Sets a row's update count where its own word holds it (count_at_ >= 0,
  // not packed into a row_lock seqlock word), clamped to 32 bits; else
  // nothing.
  void StoreCount(int64_t row, uint64_t count);
  // Cache lines a span of `bytes` from the start of a row block may touch.
  int LinesFor(size_t bytes) const {
    if (row_stride_ <= 64) return 1;  // a power-of-two stride: a block never straddles a line
    return static_cast<int>(std::min<size_t>((bytes + 48 + 63) / 64, 16));  // blocks start 16-byte aligned
  }

  // Resolves `id` to its row; inserts it when `insert`. Sets *row = -1 for a
  // miss in read-only mode. In an LRU table a found row comes back pinned and
  // must be given back with Release.
  absl::Status Acquire(uint64_t id, bool insert, uint64_t tick, int64_t* row);
  void Release(int64_t row) const;
  absl::Status AcquireDynamicNoEvict(uint64_t id, bool insert, int64_t* row);
  // kError: promises the caller one row for inserting `id` (true), or finds
  // that `id` arrived meanwhile and sets *row (false). ResourceExhausted
  // when every row is taken, or a promise stays held past kReserveWait.
  absl::StatusOr<bool> Reserve(uint64_t id, int64_t* row);
  absl::Status AcquireLru(uint64_t id, bool insert, uint64_t tick, int64_t* row);
  // LRU: under the eviction lock.
  absl::Status InsertLruLocked(uint64_t id, uint64_t tick, int64_t* row);
  absl::Status EvictOneLocked(int64_t* row);
  void RemoveFromIndexLocked(uint64_t id);
  int64_t ProbeLocked(uint64_t id) const;  // index slot of id, or -1

  // Params and slots of `row` to their initial values for `id`. `published`:
  // other threads may have read the row's memory (a dynamic row inserted or
  // recycled), so its f32 values are written through the Hogwild kernels;
  // otherwise (InitRows, before Publish) they are drawn straight into it.
  void InitRowValues(int64_t row, uint64_t id, bool published) const;
  // The slots of the row block at `block` to their initial values.
  void InitSlots(char* block) const;
  // Dynamic: InitRowValues plus the RowMeta (key, zero count and seqlock);
  // an LRU row's state word is left to the caller.
  void InitRow(int64_t row, uint64_t id);
  // LRU: moves a pinned row's tick forward to `tick` (coarsened).
  void Touch(EmbeddingRowMeta* meta, uint64_t tick) const;
  // Slot k of the row block at `block` (f32, after the parameters).
  float* Slot(char* block, int k) const {
    return reinterpret_cast<float*>(block + slots_offset_) + static_cast<size_t>(k) * static_cast<size_t>(dim_);
  }
  const float* Slot(const char* block, int k) const {
    return reinterpret_cast<const float*>(block + slots_offset_) + static_cast<size_t>(k) * static_cast<size_t>(dim_);
  }
  // The row block's parameters as f32 into dst[dim] (a Hogwild copy; widened for bf16).
  void CopyParams(const char* block, float* dst) const;
  // A row's parameters from `src` (dim floats; a bf16 table's rounded to
  // nearest), through the Hogwild kernels.
  void StoreParams(const float* src, char* block);
  // Copies a row's params, slots and update count (seqlock read in row_lock).
  void CopyRowState(int64_t row, float* params, absl::Span<float* const> slots, uint64_t* update_count) const;
  void PrefetchAhead(absl::Span<const uint64_t> ids, size_t i, int lines) const;
  absl::Status CheckIds(absl::Span<const uint64_t> ids) const;
  absl::Status FullError() const;

  // Constant after Create/Attach (copied from the header, so the hot path
  // never reads shared constants through another process's cache lines).
  EmbeddingTableOptions options_;
  EmbeddingKind kind_ = EmbeddingKind::kStatic;
  CapacityPolicy on_full_ = CapacityPolicy::kError;
  bool lru_ = false;  // dynamic && kEvictLru: rows are pinned and may be reused
  bool row_lock_ = false;
  int64_t dim_ = 0;
  int64_t capacity_ = 0;
  int num_slots_ = 0;
  bool bf16_ = false;         // parameters stored as bf16
  size_t slots_offset_ = 0;   // bytes of a row's parameters: where its slots start
  size_t row_stride_ = 0;
  size_t meta_offset_ = 0;    // RowMeta within a row block (dynamic)
  size_t side_stride_ = 0;    // bytes of side words per row (static)
  uint32_t tick_shift_ = 0;   // LRU: coarse tick = clock >> tick_shift_
  bool counts_ = false;       // rows keep an update count
  bool packed_ = false;       // the count shares the seqlock word (LRU row_lock)
  int seq_at_ = -1;           // byte offset of the seqlock word in MetaWords(row), or -1
  int count_at_ = -1;         // byte offset of the update count in MetaWords(row), or -1
  uint64_t index_mask_ = 0;   // index_slots - 1 (dynamic)
  // Non-owning views into the region.
  EmbeddingTableHeader* header_ = nullptr;
  EmbeddingIndexEntry* index_ = nullptr;
  char* side_ = nullptr;  // static: the side words
  char* rows_ = nullptr;
};

}  // namespace shardwild
