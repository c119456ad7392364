#include "ps_shm/embedding_table.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <thread>
#include <type_traits>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/model/hogwild_kernels.h"
#include "core/model/optimizer.h"
#include "core/base/prefetch.h"
#include "core/base/random.h"
#include "core/base/status.h"
#include "ps_shm/init_kernels.h"
#include "ps_shm/row_seqlock.h"

namespace shardwild {

// ---- The on-memory format ---------------------------------------------------
//
// Constant fields are written by Create before the region is shared (the
// caller shares it only after Create returns); `magic` is stored last with
// memory_order_release and Attach loads it with acquire, so even an attacher
// racing Create either sees a wrong magic or a complete header. Every other
// header word is a counter or lock, accessed only through std::atomic_ref
// with the ordering its comment gives.

inline constexpr uint64_t kEmbeddingMagic = 0x314445424D455753ULL;  // "SWEMBED1" little-endian
// 2: row_lock; 3: lean rows (static rows carry no metadata; 16-byte RowMeta;
// side words; strides below 64 bytes); 4: bf16 parameters; 5: update counts
// only where asked for (count_updates), not for every table of two slots.
inline constexpr uint32_t kEmbeddingFormatVersion = 5;
inline constexpr size_t kHeaderBytes = 4096;
inline constexpr int kMaxNameBytes = 48;

struct EmbeddingTableHeader {
  // Constant after Create (see above). Covered by `checksum`, except magic.
  uint64_t magic;
  uint32_t format_version;
  uint32_t header_bytes;
  uint64_t total_bytes;  // BytesFor(options)
  uint32_t kind;         // EmbeddingKind
  uint32_t on_full;      // CapacityPolicy
  int64_t dim;
  int64_t capacity;
  uint32_t num_slots;
  uint32_t table_id;
  uint64_t seed;
  uint32_t init_kind;    // RowInitializer::Kind
  float init_a;
  float init_b;
  float init_stddev;
  float slot_init[kMaxEmbeddingSlots];
  uint32_t row_lock;     // 0 or 1: rows are updated under their seqlock word
  uint32_t count_updates;  // 0 or 1: rows count their updates (Adam's per-row step)
  uint32_t tick_shift;   // LRU: a row's 16-bit tick is clock >> tick_shift (TickShift); else 0
  uint32_t bf16;         // 0 or 1: parameters are bf16 (2 bytes each), slots f32 after them
  uint32_t params_bytes; // bytes of a row's parameters (ParamsBytes): where its slots start
  uint64_t row_stride;   // bytes between row blocks (RowStride)
  uint64_t meta_offset;  // dynamic: RowMeta within a row block; static: 0 (no RowMeta)
  uint64_t side_offset;  // static: byte offset of the side words from the region start; else 0
  uint64_t side_stride;  // static: bytes of side words per row (0, 4 or 8); dynamic: 0
  uint64_t index_slots;  // dynamic: a power of two; static: 0
  uint64_t index_offset; // byte offset of the index from the region start
  uint64_t rows_offset;  // byte offset of row 0, a multiple of 4096
  char name[kMaxNameBytes];
  uint64_t checksum;     // Checksum() of the bytes from format_version up to here

  // Row allocation (uniqueness comes from the atomicity of the RMW; nothing
  // is published through them, except that a kError insert's fetch_add on
  // next_row is a release, for Reserve's "full" check). next_row: rows handed
  // out, i.e. size() of a dynamic table. reserved (kError): rows promised to inserters
  // that have not yet claimed their index slot; never exceeds capacity.
  alignas(64) uint64_t next_row;
  uint64_t reserved;
  // LRU clock, advanced once per Pull/Push (relaxed: a tick is a hint).
  alignas(64) uint64_t clock;
  // bf16 tables: pushes so far, one draw per Push call; salts the
  // stochastic rounding of its updates (relaxed: only a count).
  uint64_t rounding_draws;
  // Eviction lock: 0 free, 1 held. exchange(acquire) / store(release), so
  // everything a holder wrote is visible to the next holder.
  alignas(64) uint32_t evict_lock;
  uint32_t reserved0;
  uint64_t evict_draws;  // sample counter for victim choice; only under the lock (relaxed)
  // Index seqlock (LRU): odd while the lock holder moves index entries. See
  // RemoveFromIndexLocked and AcquireLru for the orderings.
  alignas(64) uint64_t index_epoch;
  // Statistics (relaxed).
  alignas(64) uint64_t evictions;
  uint64_t initializations;
};
static_assert(sizeof(EmbeddingTableHeader) <= kHeaderBytes);

// One index slot (dynamic tables). key = id + 1 (0: empty); row = row + 1
// (0: being initialised, or in flux while the LRU lock holder moves it).
struct EmbeddingIndexEntry {
  uint64_t key;
  uint64_t row;
};
static_assert(sizeof(EmbeddingIndexEntry) == 16);

// After the floats of a dynamic table's row block (static rows have none).
// What word0 and word1 hold depends on the table; see "Per-row metadata" in
// the header comment.
struct EmbeddingRowMeta {
  uint64_t key;    // id + 1 of the row's id; 0 until a kError row is initialised
  uint32_t word0;  // LRU: the state word; kError: the seqlock word (row_lock)
  uint32_t word1;  // the update count and/or (LRU) the seqlock word
};
static_assert(sizeof(EmbeddingRowMeta) == 16);

namespace {

using RowMeta = EmbeddingRowMeta;

// The LRU state word: [state: 2 bits][tick: 16 bits][pins: 14 bits].
constexpr uint32_t kPinBits = 14;
constexpr uint32_t kPinMask = (1u << kPinBits) - 1;
constexpr uint32_t kTickMask = 0xffffu << kPinBits;
constexpr uint32_t kStateMask = 3u << 30;
constexpr uint32_t kRowReady = 1u << 30;
constexpr uint32_t kRowEvicting = 2u << 30;
static_assert((kPinMask & kTickMask) == 0 && (kTickMask & kStateMask) == 0);

inline uint32_t TickBits(uint16_t tick) { return static_cast<uint32_t>(tick) << kPinBits; }
inline uint16_t TickOf(uint32_t state) { return static_cast<uint16_t>((state & kTickMask) >> kPinBits); }

// A packed count-and-seqlock word (LRU row_lock tables that count updates):
// [count: 24 bits][seq: 8 bits]. The count saturates.
constexpr uint32_t kPackedSeqMask = 0xffu;
constexpr uint32_t kMaxPackedCount = (1u << 24) - 1;

constexpr int kEvictSamples = 8;   // as Redis' maxmemory-samples (5 by default)
constexpr int kEvictRounds = 64;   // sampling rounds before a full scan
// How long an inserter waits for a rival's reservation before the table
// counts as full (see "Concurrency" in the header).
constexpr std::chrono::seconds kReserveWait{1};
constexpr int kPrefetchDistance = 8;

// An atomic view of a word in the region (const words are only loaded).
template <typename T>
std::atomic_ref<std::remove_const_t<T>> Atomic(T& x) {
  return std::atomic_ref<std::remove_const_t<T>>(const_cast<std::remove_const_t<T>&>(x));
}

static_assert(std::atomic_ref<uint64_t>::is_always_lock_free && std::atomic_ref<uint32_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free to work across processes");

// Spins politely: pause first, then yield (an oversubscribed machine may have
// descheduled the thread we wait for).
void SpinWait(int* spins) {
  if (++*spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  } else {
    std::this_thread::yield();
  }
}

// SplitMix64's finaliser; fixed so initial values never change with a library.
inline uint64_t Mix(uint64_t x) { return SplitMix64Mix(x); }
// Push's two deduplications give the same sums bit for bit; which is
// faster depends on the row length and on how many ids repeat. Where rows
// are at most kSumEveryDim floats and at least kSumEveryRepeats of the
// last push's ids (through the same scratch) repeated, every unique id's
// sum is kept, without a branch on whether the id is new; otherwise only
// the repeats' are, the others read in place. (BM_PushRows, static, dim
// 16, 2^20 rows, SGD, one thread: Zipf ids, 39% of them repeated, 57-59 M
// rows/s the second way against 80-83 M the first; uniform ids, none
// repeated, 61 M the second way against 53 M the first.)
constexpr size_t kSumEveryDim = 16;
constexpr double kSumEveryRepeats = 0.125;

// Makes x opaque to the optimiser, which then cannot turn the selects
// computed from it back into branches on it.
inline void Opaque(uint32_t& x) { asm("" : "+r"(x)); }

// Push's map (open addressing over mask + 1 entries, a power of two of at
// least 16, valid iff their stamp is `stamp`): the entry of `id`, or the
// empty one where it goes. Linear probing past other ids' entries, one
// branch a probe, rarely taken: not a first one on whether the entry is
// empty, which a batch of half new ids and half repeats mispredicts on
// every other id.
//   The first entry is the top bits of id times 2^64 / phi (Fibonacci
// hashing: one multiply, and consecutive or strided ids land far apart).
// The map lives for one push and only places ids, so its hash changes no
// result. It was Mix (SplitMix64's finaliser: two multiplies, three
// shifts), a third of the loop's instructions: BM_PushRows dim:1 opt:5
// (sparse_logreg's FTRL push, Zipf ids), one thread, 3 alternating rounds
// of 5 on the 2-core Zen 5 VM, 13.3-14.3 -> 11.3-12.1 us a push of 1,024
// ids. Ids that are multiples of 2^64 / phi's inverse all start at entry 0
// and probe on: slower, never wrong (EmbeddingTableTest's
// PushSumsRepeatedIdsWhateverTheirBits).
inline EmbeddingTable::Scratch::MapEntry& FindEntry(EmbeddingTable::Scratch::MapEntry* map, uint64_t mask,
                                                    uint32_t stamp, uint64_t id) {
  constexpr uint64_t kTwoTo64OverPhi = 0x9E3779B97F4A7C15ULL;
  const int shift = 64 - std::popcount(mask);
  for (uint64_t h = (id * kTwoTo64OverPhi) >> shift;; h = (h + 1) & mask) {
    uint32_t other = static_cast<uint32_t>(map[h].stamp == stamp) & static_cast<uint32_t>(map[h].key != id);
    Opaque(other);
    if (other == 0) return map[h];
  }
}

// Push's deduplication where every unique id's gradient sum is kept (rows
// of at most kSumEveryDim floats): ids[0, n) into unique_ids (first
// occurrences, in order) and summed[u * d, +d) (unique id u's gradients,
// from its first occurrence on, in batch order); returns how many are
// unique. The gradient of ids[i] is grads' row grad_rows[i] (i where
// grad_rows is null). map, mask, stamp: as FindEntry's.
//
// One probe per id, and neither of its common outcomes (a new id in an
// empty entry, a repeat in its own) takes a branch: the entry, the next
// unique id and the sum are written either way, from selects. Half of
// sparse_logreg's ids repeat in a batch (1143 ids, 512 unique), and a
// branch on each outcome took the dedup to 12.9 of the push's 17.9 us.
// kDim: d where it is known (1), else 0.
template <size_t kDim>
size_t DedupSummingEvery(const uint64_t* ids, size_t n, const uint32_t* grad_rows, const float* grads, size_t d,
                         EmbeddingTable::Scratch::MapEntry* map, uint64_t mask, uint32_t stamp, uint64_t* unique_ids,
                         float* summed) {
  if constexpr (kDim != 0) d = kDim;
  size_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t id = ids[i];
    const size_t row = grad_rows == nullptr ? i : grad_rows[i];
    EmbeddingTable::Scratch::MapEntry& e = FindEntry(map, mask, stamp, id);
    // All ones where the id is new, else zero.
    uint32_t fresh = 0u - static_cast<uint32_t>(e.stamp != stamp);
    Opaque(fresh);
    const uint32_t u = (static_cast<uint32_t>(m) & fresh) | (e.value & ~fresh);
    e = EmbeddingTable::Scratch::MapEntry{id, u, stamp};
    unique_ids[m] = id;  // the next new id's place where this one repeats
    m += fresh & 1;
    const float* g = grads + row * d;
    float* sum = summed + static_cast<size_t>(u) * d;
    for (size_t j = 0; j < d; ++j) {
      const uint32_t added = std::bit_cast<uint32_t>(sum[j] + g[j]);
      sum[j] = std::bit_cast<float>((std::bit_cast<uint32_t>(g[j]) & fresh) | (added & ~fresh));
    }
  }
  return m;
}

inline uint64_t HomeHash(uint64_t id) { return Mix(id ^ 0x5157454d42ULL); }

constexpr size_t RoundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

// Row strides: a block of at most 64 bytes takes the next power of two
// (16, 32 or 64), so it never straddles a cache line; a larger one is
// rounded up to 16 bytes (the alignment of a SIMD load).
constexpr uint64_t RowStride(uint64_t bytes) {
  if (bytes > 64) return RoundUp(bytes, 16);
  uint64_t p = 16;
  while (p < bytes) p <<= 1;
  return p;
}

// LRU: a row's tick is the clock shifted right by this many bits, so that
// the 16-bit ticks span at least 2^16 * capacity / 4096 calls: rows older
// than that compare by a wrapped age (a coarse LRU, as documented).
uint32_t TickShift(int64_t capacity) {
  uint32_t bits = 0;
  while (bits < 63 && (uint64_t{1} << bits) <= static_cast<uint64_t>(capacity)) ++bits;
  return bits > 12 ? bits - 12 : 0;
}

uint64_t NextPow2(uint64_t x) {
  uint64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

struct Layout {
  uint64_t row_stride = 0;
  uint64_t meta_offset = 0;
  uint64_t side_offset = 0;
  uint64_t side_stride = 0;
  uint64_t index_slots = 0;
  uint64_t index_offset = 0;
  uint64_t rows_offset = 0;
  uint64_t total_bytes = 0;
  uint32_t tick_shift = 0;
};

// Bytes of a row's parameters: dim floats, or dim bf16 values rounded up to
// 4 bytes (the f32 slots that follow stay 4-byte aligned).
constexpr uint64_t ParamsBytes(const EmbeddingTableOptions& o) {
  return o.bf16 ? RoundUp(static_cast<uint64_t>(o.dim) * sizeof(uint16_t), sizeof(float))
                : static_cast<uint64_t>(o.dim) * sizeof(float);
}

// The index holds at most capacity keys in >= capacity / 0.7 slots.
Layout ComputeLayout(const EmbeddingTableOptions& o) {
  Layout l;
  const uint64_t float_bytes =
      ParamsBytes(o) + static_cast<uint64_t>(o.num_slots) * static_cast<uint64_t>(o.dim) * sizeof(float);
  if (o.kind == EmbeddingKind::kDynamic) {
    l.meta_offset = RoundUp(float_bytes, alignof(RowMeta));
    l.row_stride = RowStride(l.meta_offset + sizeof(RowMeta));
    const uint64_t min_slots = (static_cast<uint64_t>(o.capacity) * 10 + 6) / 7;
    l.index_slots = NextPow2(std::max<uint64_t>(min_slots, 8));
    if (o.on_full == CapacityPolicy::kEvictLru) l.tick_shift = TickShift(o.capacity);
  } else {
    l.row_stride = RowStride(float_bytes);
    l.side_stride = sizeof(uint32_t) * ((o.row_lock ? 1 : 0) + (o.count_updates ? 1 : 0));
  }
  l.index_offset = kHeaderBytes;
  const uint64_t after_index = l.index_offset + l.index_slots * sizeof(EmbeddingIndexEntry);
  if (l.side_stride > 0) l.side_offset = RoundUp(after_index, 64);
  l.rows_offset = RoundUp(l.side_offset + static_cast<uint64_t>(o.capacity) * l.side_stride,
                          4096);
  l.rows_offset = std::max<uint64_t>(l.rows_offset, RoundUp(after_index, 4096));
  l.total_bytes = RoundUp(l.rows_offset + static_cast<uint64_t>(o.capacity) * l.row_stride, 64);
  return l;
}

uint64_t Checksum(const EmbeddingTableHeader& h) {
  const char* begin = reinterpret_cast<const char*>(&h.format_version);
  const char* end = reinterpret_cast<const char*>(&h.checksum);
  uint64_t c = Mix(kEmbeddingMagic);
  for (const char* p = begin; p < end; p += sizeof(uint64_t)) {
    uint64_t w = 0;
    std::memcpy(&w, p, std::min<size_t>(sizeof(w), end - p));
    c = Mix(c ^ w);
  }
  return c;
}

// ---- Initial values -----------------------------------------------------------

// A standard normal by Box-Muller from draws n and n+1.
inline double StdNormal(uint64_t row_key, int64_t j, uint64_t n) {
  const double u1 = 1.0 - RowUnit(RowElementDraw(row_key, j, n));  // (0, 1]
  const double u2 = RowUnit(RowElementDraw(row_key, j, n + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// A row's key: the table's base key (seed and table) mixed with its id.
uint64_t RowKeyBase(uint64_t seed, uint32_t table_id) { return Mix(Mix(seed) ^ table_id); }
uint64_t RowKey(uint64_t seed, uint32_t table_id, uint64_t id) { return Mix(RowKeyBase(seed, table_id) ^ id); }

// The uniform initialiser's width b - a, computed in double and rounded once.
float UniformWidth(const RowInitializer& init) { return static_cast<float>(static_cast<double>(init.b) - init.a); }

// Elements [j0, j0 + n) of the row keyed `row_key`.
void FillInitial(const RowInitializer& init, uint64_t row_key, int64_t j0, int64_t n, float* out) {
  switch (init.kind) {
    case RowInitializer::Kind::kZeros:
      std::fill(out, out + n, 0.0f);
      return;
    case RowInitializer::Kind::kUniform: {
      // a + w * U(j) in floats (RowUniformValue), vectorised; w is b - a
      // computed in double and rounded once.
      UniformRowValues(row_key, j0, n, init.a, UniformWidth(init), out);
      return;
    }
    case RowInitializer::Kind::kNormal:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(init.stddev * StdNormal(row_key, j0 + i, 0));
      return;
    case RowInitializer::Kind::kTruncatedNormal:
      for (int64_t i = 0; i < n; ++i) {
        // Resample beyond two standard deviations, as TensorFlow does. The
        // chance of 32 rejections in a row is 0.0455^32 < 1e-42.
        double z = 0.0;
        for (uint64_t attempt = 0; attempt < 32; ++attempt) {
          const double c = StdNormal(row_key, j0 + i, 2 * attempt);
          if (std::fabs(c) <= 2.0) {
            z = c;
            break;
          }
        }
        out[i] = static_cast<float>(init.stddev * z);
      }
      return;
  }
}

const char* InitKindName(RowInitializer::Kind k) {
  switch (k) {
    case RowInitializer::Kind::kZeros: return "zeros";
    case RowInitializer::Kind::kUniform: return "uniform";
    case RowInitializer::Kind::kNormal: return "normal";
    case RowInitializer::Kind::kTruncatedNormal: return "truncated_normal";
  }
  return "?";
}

// Eviction lock guard (the word lives in shared memory; see the header).
class EvictionLock {
 public:
  explicit EvictionLock(uint32_t* word) : word_(word) {
    int spins = 0;
    for (;;) {
      if (Atomic(*word_).exchange(1, std::memory_order_acquire) == 0) return;
      while (Atomic(*word_).load(std::memory_order_relaxed) != 0) SpinWait(&spins);
    }
  }
  ~EvictionLock() { Atomic(*word_).store(0, std::memory_order_release); }
  EvictionLock(const EvictionLock&) = delete;
  EvictionLock& operator=(const EvictionLock&) = delete;

 private:
  uint32_t* const word_;
};

}  // namespace

const char* EmbeddingKindName(EmbeddingKind kind) {
  switch (kind) {
    case EmbeddingKind::kStatic: return "static";
    case EmbeddingKind::kDynamic: return "dynamic";
  }
  return "?";
}

const char* CapacityPolicyName(CapacityPolicy policy) {
  switch (policy) {
    case CapacityPolicy::kError: return "error";
    case CapacityPolicy::kEvictLru: return "evict_lru";
  }
  return "?";
}

// ---- Options ------------------------------------------------------------------

absl::Status EmbeddingTableOptions::Validate() const {
  auto bad = [](const char* key, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("embedding.", key, ": ", what));
  };
  if (name.size() >= kMaxNameBytes) {
    return bad("name", absl::StrCat("must be at most ", kMaxNameBytes - 1, " bytes, got ", name.size()));
  }
  if (kind != EmbeddingKind::kStatic && kind != EmbeddingKind::kDynamic) {
    return bad("kind", absl::StrCat("must be static or dynamic, got ", static_cast<uint32_t>(kind)));
  }
  if (dim < 1 || dim > (int64_t{1} << 20)) return bad("dim", absl::StrCat("must be in [1, 2^20], got ", dim));
  if (capacity < 1 || capacity > (int64_t{1} << 40)) {
    return bad("capacity", absl::StrCat("must be in [1, 2^40], got ", capacity));
  }
  if (num_slots < 0 || num_slots > EmbeddingTable::kMaxSlots) {
    return bad("num_slots", absl::StrCat("must be in [0, ", EmbeddingTable::kMaxSlots, "], got ", num_slots));
  }
  for (int k = 0; k < kMaxEmbeddingSlots; ++k) {
    if (!std::isfinite(slot_init[k])) return bad("slot_init", absl::StrCat("slot ", k, " is not finite"));
  }
  if (on_full != CapacityPolicy::kError && on_full != CapacityPolicy::kEvictLru) {
    return bad("on_full", absl::StrCat("must be error or evict_lru, got ", static_cast<uint32_t>(on_full)));
  }
  if (kind == EmbeddingKind::kStatic && on_full == CapacityPolicy::kEvictLru) {
    return bad("on_full", "evict_lru needs a dynamic table (a static table holds its whole vocabulary)");
  }
  switch (init.kind) {
    case RowInitializer::Kind::kZeros:
      break;
    case RowInitializer::Kind::kUniform:
      if (!std::isfinite(init.a) || !std::isfinite(init.b) || !(init.a < init.b)) {
        return bad("init", absl::StrFormat("uniform needs finite a < b, got a=%g b=%g", init.a, init.b));
      }
      break;
    case RowInitializer::Kind::kNormal:
    case RowInitializer::Kind::kTruncatedNormal:
      if (!std::isfinite(init.stddev) || !(init.stddev > 0)) {
        return bad("init", absl::StrFormat("%s needs a finite stddev > 0, got %g", InitKindName(init.kind),
                                           init.stddev));
      }
      break;
    default:
      return bad("init", absl::StrCat("unknown kind ", static_cast<uint32_t>(init.kind)));
  }
  // dim <= 2^20, slots <= 4, capacity <= 2^40: a row block is < 2^25 bytes;
  // keep the region below 2^56 bytes so offsets never overflow.
  const Layout l = ComputeLayout(*this);
  if (static_cast<long double>(capacity) * (l.row_stride + l.side_stride) > 0x1.0p56L) {
    return bad("capacity", absl::StrCat(capacity, " rows of ", l.row_stride, " bytes exceed 2^56 bytes"));
  }
  return absl::OkStatus();
}

void EmbeddingTableOptions::SetOptimizer(const OptimizerOptions& optimizer) {
  num_slots = NumSlots(optimizer.type);
  count_updates = UsesStepCount(optimizer.type);
  for (int k = 0; k < kMaxEmbeddingSlots; ++k) slot_init[k] = k < num_slots ? SlotInitialValue(optimizer, k) : 0.0f;
}

void InitialRowValue(const EmbeddingTableOptions& options, uint64_t id, float* out) {
  FillInitial(options.init, RowKey(options.seed, options.table_id, id), 0, options.dim, out);
}

// ---- Create / Attach ------------------------------------------------------------

size_t EmbeddingTable::BytesFor(const EmbeddingTableOptions& options) {
  if (!options.Validate().ok()) return 0;
  return ComputeLayout(options).total_bytes;
}

absl::StatusOr<EmbeddingTable> EmbeddingTable::Create(void* region, size_t bytes,
                                                      const EmbeddingTableOptions& options) {
  SW_ASSIGN_OR_RETURN(EmbeddingTable t, Format(region, bytes, options));
  if (t.kind_ == EmbeddingKind::kStatic) t.InitRows(0, t.capacity_);
  t.Publish();
  return t;
}

absl::StatusOr<EmbeddingTable> EmbeddingTable::Format(void* region, size_t bytes,
                                                      const EmbeddingTableOptions& options) {
  SW_RETURN_IF_ERROR(options.Validate());
  if (region == nullptr || reinterpret_cast<uintptr_t>(region) % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding table '", options.name, "': the region must be 64-byte aligned"));
  }
  const Layout l = ComputeLayout(options);
  if (bytes < l.total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("embedding table '", options.name, "': the region has ", bytes,
                                                   " bytes, the table needs ", l.total_bytes));
  }
  char* base = static_cast<char*>(region);
  std::memset(base, 0, kHeaderBytes);  // no concurrent access yet (see the format comment)
  auto* h = reinterpret_cast<EmbeddingTableHeader*>(base);
  h->format_version = kEmbeddingFormatVersion;
  h->header_bytes = kHeaderBytes;
  h->total_bytes = l.total_bytes;
  h->kind = static_cast<uint32_t>(options.kind);
  h->on_full = static_cast<uint32_t>(options.on_full);
  h->dim = options.dim;
  h->capacity = options.capacity;
  h->num_slots = static_cast<uint32_t>(options.num_slots);
  h->table_id = options.table_id;
  h->seed = options.seed;
  h->init_kind = static_cast<uint32_t>(options.init.kind);
  h->init_a = options.init.a;
  h->init_b = options.init.b;
  h->init_stddev = options.init.stddev;
  for (int k = 0; k < kMaxEmbeddingSlots; ++k) h->slot_init[k] = options.slot_init[k];
  h->row_lock = options.row_lock ? 1 : 0;
  h->count_updates = options.count_updates ? 1 : 0;
  h->tick_shift = l.tick_shift;
  h->bf16 = options.bf16 ? 1 : 0;
  h->params_bytes = static_cast<uint32_t>(ParamsBytes(options));
  h->row_stride = l.row_stride;
  h->meta_offset = l.meta_offset;
  h->side_offset = l.side_offset;
  h->side_stride = l.side_stride;
  h->index_slots = l.index_slots;
  h->index_offset = l.index_offset;
  h->rows_offset = l.rows_offset;
  std::memcpy(h->name, options.name.data(), options.name.size());
  h->checksum = Checksum(*h);
  // The index reads as empty (all zeros).
  std::memset(base + l.index_offset, 0, l.index_slots * sizeof(EmbeddingIndexEntry));

  EmbeddingTable t;
  t.Bind(options, base);
  if (options.kind == EmbeddingKind::kStatic) {
    // Every row is counted now; InitRows gives them their values before
    // Publish. Dynamic rows are first touched by the thread that inserts them.
    h->next_row = static_cast<uint64_t>(options.capacity);
    h->initializations = static_cast<uint64_t>(options.capacity);
  }
  return t;
}

void EmbeddingTable::InitRows(int64_t begin, int64_t end) const {
  if (kind_ != EmbeddingKind::kStatic) return;
  begin = std::clamp<int64_t>(begin, 0, capacity_);
  end = std::clamp<int64_t>(end, begin, capacity_);
  if (side_stride_ > 0) {
    // The side words start at zero: seq even (unlocked), count 0.
    char* side = side_ + static_cast<size_t>(begin) * side_stride_;
    const size_t n = static_cast<size_t>(end - begin) * side_stride_ / sizeof(uint32_t);
    auto* words = reinterpret_cast<uint32_t*>(side);
    for (size_t i = 0; i < n; ++i) Atomic(words[i]).store(0, std::memory_order_relaxed);
  }
  if (bf16_ || options_.init.kind != RowInitializer::Kind::kUniform) {
    for (int64_t r = begin; r < end; ++r) InitRowValues(r, static_cast<uint64_t>(r), /*published=*/false);
    return;
  }
  // Every row's values in one dispatched call (what InitRowValues draws a row
  // at a time; an f32 row's stride is whole floats), then its slots'.
  UniformRowsValues(RowKeyBase(options_.seed, options_.table_id), static_cast<uint64_t>(begin), end - begin, dim_,
                    static_cast<int64_t>(row_stride_ / sizeof(float)), options_.init.a, UniformWidth(options_.init),
                    reinterpret_cast<float*>(RowBlock(begin)));
  if (num_slots_ > 0) {
    for (int64_t r = begin; r < end; ++r) InitSlots(RowBlock(r));
  }
}

std::array<EmbeddingTable::ByteRange, 2> EmbeddingTable::InitRowsBytes(const EmbeddingTableOptions& options,
                                                                       int64_t begin, int64_t end) {
  std::array<ByteRange, 2> out;
  if (options.kind != EmbeddingKind::kStatic) return out;
  begin = std::clamp<int64_t>(begin, 0, options.capacity);
  end = std::clamp<int64_t>(end, begin, options.capacity);
  if (end == begin) return out;
  const Layout l = ComputeLayout(options);
  const uint64_t rows = static_cast<uint64_t>(end - begin);
  out[0] = {static_cast<size_t>(l.rows_offset + static_cast<uint64_t>(begin) * l.row_stride),
            static_cast<size_t>(rows * l.row_stride)};
  if (l.side_stride > 0) {
    out[1] = {static_cast<size_t>(l.side_offset + static_cast<uint64_t>(begin) * l.side_stride),
              static_cast<size_t>(rows * l.side_stride)};
  }
  return out;
}

void EmbeddingTable::Publish() const {
  // Release: pairs with Attach's acquire load, so an attacher that sees the
  // magic sees the header and every initialised row.
  Atomic(header_->magic).store(kEmbeddingMagic, std::memory_order_release);
}

absl::StatusOr<EmbeddingTable> EmbeddingTable::Attach(void* region, size_t bytes) {
  return FromHeader(region, bytes);
}

absl::StatusOr<EmbeddingTable> EmbeddingTable::FromHeader(void* region, size_t bytes) {
  if (region == nullptr || reinterpret_cast<uintptr_t>(region) % 64 != 0) {
    return absl::InvalidArgumentError("embedding table: the region must be 64-byte aligned");
  }
  if (bytes < kHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding table: the region has ", bytes, " bytes, less than its ", kHeaderBytes, "-byte header"));
  }
  char* base = static_cast<char*>(region);
  auto* h = reinterpret_cast<EmbeddingTableHeader*>(base);
  auto bad = [](const std::string& what) {
    return absl::FailedPreconditionError(absl::StrCat("embedding table header: ", what));
  };
  const uint64_t magic = Atomic(h->magic).load(std::memory_order_acquire);
  if (magic != kEmbeddingMagic) {
    return bad(absl::StrFormat("magic is 0x%016x, expected 0x%016x (not an embedding table, or not created yet)",
                               magic, kEmbeddingMagic));
  }
  if (h->format_version != kEmbeddingFormatVersion) {
    return bad(absl::StrCat("format_version is ", h->format_version, ", this build reads ", kEmbeddingFormatVersion));
  }
  if (h->checksum != Checksum(*h)) {
    return bad(absl::StrFormat("checksum is 0x%016x, the fields give 0x%016x (corrupted header)", h->checksum,
                               Checksum(*h)));
  }
  if (h->header_bytes != kHeaderBytes) return bad(absl::StrCat("header_bytes is ", h->header_bytes));
  if (std::memchr(h->name, 0, kMaxNameBytes) == nullptr) return bad("name is not terminated");
  EmbeddingTableOptions o;
  o.name = std::string(h->name);
  o.kind = static_cast<EmbeddingKind>(h->kind);
  o.on_full = static_cast<CapacityPolicy>(h->on_full);
  o.dim = h->dim;
  o.capacity = h->capacity;
  o.num_slots = static_cast<int>(std::min<uint32_t>(h->num_slots, 1u << 30));
  o.table_id = h->table_id;
  o.seed = h->seed;
  o.init.kind = static_cast<RowInitializer::Kind>(h->init_kind);
  o.init.a = h->init_a;
  o.init.b = h->init_b;
  o.init.stddev = h->init_stddev;
  for (int k = 0; k < kMaxEmbeddingSlots; ++k) o.slot_init[k] = h->slot_init[k];
  if (h->row_lock > 1) return bad(absl::StrCat("row_lock is ", h->row_lock, ", expected 0 or 1"));
  o.row_lock = h->row_lock == 1;
  if (h->count_updates > 1) return bad(absl::StrCat("count_updates is ", h->count_updates, ", expected 0 or 1"));
  o.count_updates = h->count_updates == 1;
  if (h->bf16 > 1) return bad(absl::StrCat("bf16 is ", h->bf16, ", expected 0 or 1"));
  o.bf16 = h->bf16 == 1;
  if (absl::Status s = o.Validate(); !s.ok()) return bad(std::string(s.message()));
  const Layout l = ComputeLayout(o);
  struct Field {
    const char* name;
    uint64_t got, want;
  };
  for (const Field& f : {Field{"params_bytes", h->params_bytes, ParamsBytes(o)},
                         Field{"row_stride", h->row_stride, l.row_stride},
                         Field{"meta_offset", h->meta_offset, l.meta_offset},
                         Field{"side_offset", h->side_offset, l.side_offset},
                         Field{"side_stride", h->side_stride, l.side_stride},
                         Field{"tick_shift", h->tick_shift, l.tick_shift},
                         Field{"index_slots", h->index_slots, l.index_slots},
                         Field{"index_offset", h->index_offset, l.index_offset},
                         Field{"rows_offset", h->rows_offset, l.rows_offset},
                         Field{"total_bytes", h->total_bytes, l.total_bytes}}) {
    if (f.got != f.want) return bad(absl::StrCat(f.name, " is ", f.got, ", the options give ", f.want));
  }
  if (bytes < l.total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("embedding table '", o.name, "': the region has ", bytes,
                                                   " bytes, the header says ", l.total_bytes));
  }
  EmbeddingTable t;
  t.Bind(o, base);
  // The index is live data written by another process: check that every
  // published entry points at a row inside the table before trusting it.
  if (t.kind_ == EmbeddingKind::kDynamic) {
    for (uint64_t s = 0; s < l.index_slots; ++s) {
      const uint64_t r = Atomic(t.index_[s].row).load(std::memory_order_relaxed);
      if (r != 0 && r - 1 >= static_cast<uint64_t>(t.capacity_)) {
        return absl::FailedPreconditionError(absl::StrCat("embedding table '", o.name, "': index entry ", s,
                                                          " points at row ", r - 1, ", outside its ", t.capacity_,
                                                          " rows"));
      }
    }
  }
  return t;
}

void EmbeddingTable::Bind(const EmbeddingTableOptions& o, char* base) {
  const Layout l = ComputeLayout(o);
  options_ = o;
  kind_ = o.kind;
  on_full_ = o.on_full;
  lru_ = o.kind == EmbeddingKind::kDynamic && o.on_full == CapacityPolicy::kEvictLru;
  row_lock_ = o.row_lock;
  dim_ = o.dim;
  capacity_ = o.capacity;
  num_slots_ = o.num_slots;
  bf16_ = o.bf16;
  slots_offset_ = ParamsBytes(o);
  row_stride_ = l.row_stride;
  meta_offset_ = l.meta_offset;
  side_stride_ = l.side_stride;
  tick_shift_ = l.tick_shift;
  counts_ = o.count_updates;
  // Where the seqlock word and the update count live, as byte offsets into
  // MetaWords(row): the side words (static) or the RowMeta (dynamic).
  seq_at_ = count_at_ = -1;
  if (o.kind == EmbeddingKind::kStatic) {
    if (row_lock_) seq_at_ = 0;
    if (counts_) count_at_ = row_lock_ ? 4 : 0;
  } else if (!lru_) {
    if (row_lock_) seq_at_ = offsetof(RowMeta, word0);
    if (counts_) count_at_ = offsetof(RowMeta, word1);
  } else {
    if (row_lock_) seq_at_ = offsetof(RowMeta, word1);
    if (counts_) count_at_ = offsetof(RowMeta, word1);
  }
  packed_ = seq_at_ >= 0 && seq_at_ == count_at_;
  index_mask_ = l.index_slots == 0 ? 0 : l.index_slots - 1;
  header_ = reinterpret_cast<EmbeddingTableHeader*>(base);
  index_ = reinterpret_cast<EmbeddingIndexEntry*>(base + l.index_offset);
  side_ = base + l.side_offset;
  rows_ = base + l.rows_offset;
}

// ---- Rows -------------------------------------------------------------------------

void EmbeddingTable::InitRowValues(int64_t row, uint64_t id, bool published) const {
  char* block = RowBlock(row);
  const uint64_t key = RowKey(options_.seed, options_.table_id, id);
  if (!bf16_ && !published) {
    // Drawn straight into the row, with no copy through a buffer: no other
    // thread reads it before Publish (DLRM's 26M rows of 16 floats on 2
    // threads, 3 alternating runs: store set-up 0.74-0.86 -> 0.68-0.80 s).
    FillInitial(options_.init, key, 0, dim_, reinterpret_cast<float*>(block));
  } else {
    alignas(64) float chunk[64];
    for (int64_t j = 0; j < dim_; j += 64) {
      const int64_t n = std::min<int64_t>(64, dim_ - j);
      FillInitial(options_.init, key, j, n, chunk);
      if (bf16_) {
        // Rounded to nearest: an initial value is a draw, not an update.
        HogwildCopyFromAsBf16(chunk, reinterpret_cast<uint16_t*>(block) + j, n);
      } else {
        HogwildCopyTo(chunk, reinterpret_cast<float*>(block) + j, n);
      }
    }
  }
  InitSlots(block);
}

void EmbeddingTable::InitSlots(char* block) const {
  for (int k = 0; k < num_slots_; ++k) HogwildFill(options_.slot_init[k], Slot(block, k), dim_);
}

void EmbeddingTable::InitRow(int64_t row, uint64_t id) {
  InitRowValues(row, id, /*published=*/true);
  RowMeta* meta = Meta(row);
  // No reader or writer can be inside the row here: a new row is not yet
  // published, and an evicted one is held in state evicting with no pins.
  // So the seqlock and count words restart at zero.
  Atomic(meta->word1).store(0, std::memory_order_relaxed);
  if (lru_) {
    // Published by the state word (InsertLruLocked).
    Atomic(meta->key).store(id + 1, std::memory_order_relaxed);
  } else {
    Atomic(meta->word0).store(0, std::memory_order_relaxed);
    // Release, last: ReadRowAt's acquire load of a non-zero key sees the
    // row's values and words. (Lookups are published through the index.)
    Atomic(meta->key).store(id + 1, std::memory_order_release);
  }
}

uint64_t EmbeddingTable::LoadCount(int64_t row) const {
  if (count_at_ < 0) return 0;
  const uint32_t w = Atomic(*CountWord(row)).load(std::memory_order_relaxed);
  return packed_ ? w >> 8 : w;
}

void EmbeddingTable::StoreCount(int64_t row, uint64_t count) {
  if (count_at_ < 0 || packed_) return;
  const uint32_t c = static_cast<uint32_t>(std::min<uint64_t>(count, std::numeric_limits<uint32_t>::max()));
  Atomic(*CountWord(row)).store(c, std::memory_order_relaxed);
}

void EmbeddingTable::Touch(RowMeta* meta, uint64_t tick) const {
  const uint16_t now = static_cast<uint16_t>(tick >> tick_shift_);
  uint32_t w = Atomic(meta->word0).load(std::memory_order_relaxed);
  // Forward only: a thread holding an older tick never moves it back. The
  // CAS keeps the state and pin bits it saw, and fails if they changed.
  while (static_cast<int16_t>(static_cast<uint16_t>(now - TickOf(w))) > 0) {
    if (Atomic(meta->word0).compare_exchange_weak(w, (w & ~kTickMask) | TickBits(now), std::memory_order_relaxed)) {
      break;
    }
  }
}

// Software pipelining of a batch: element i + kPrefetchDistance's row and
// (dynamic) element i + 2 * kPrefetchDistance's index slot are requested
// while element i is worked on. Hints only: the dynamic row is found by a
// speculative read of the home slot (relaxed; a wrong or stale guess costs a
// useless prefetch, never a wrong answer).
void EmbeddingTable::PrefetchAhead(absl::Span<const uint64_t> ids, size_t i, int lines) const {
  // `lines` lines from the one holding the block's start (LinesFor).
  auto row_lines = [&](const char* b) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(b) & ~uintptr_t{kCacheLineBytes - 1};
    PrefetchLinesForWrite(reinterpret_cast<const void*>(first), static_cast<size_t>(lines) * kCacheLineBytes);
  };
  if (kind_ == EmbeddingKind::kStatic) {
    if (i + kPrefetchDistance < ids.size()) {
      const uint64_t id = ids[i + kPrefetchDistance];
      if (id < static_cast<uint64_t>(capacity_)) {
        row_lines(RowBlock(static_cast<int64_t>(id)));
        if (side_stride_ > 0) PrefetchLineForWrite(MetaWords(static_cast<int64_t>(id)));
      }
    }
    return;
  }
  if (i + 2 * kPrefetchDistance < ids.size()) {
    PrefetchLine(&index_[HomeHash(ids[i + 2 * kPrefetchDistance]) & index_mask_]);
  }
  if (i + kPrefetchDistance < ids.size()) {
    const uint64_t id = ids[i + kPrefetchDistance];
    const EmbeddingIndexEntry& e = index_[HomeHash(id) & index_mask_];
    if (Atomic(e.key).load(std::memory_order_relaxed) == id + 1) {
      const uint64_t r = Atomic(e.row).load(std::memory_order_relaxed);
      if (r != 0 && r <= static_cast<uint64_t>(capacity_)) row_lines(RowBlock(static_cast<int64_t>(r - 1)));
    }
  }
}

absl::Status EmbeddingTable::CheckIds(absl::Span<const uint64_t> ids) const {
  // Every id is tested without a branch (a loop the compiler vectorises at
  // the baseline x86-64: subtractions, ors and shifts), and only a batch
  // that fails is searched for its first bad id. A loop that returned at
  // the first bad id ran an id at a time: sparse_logreg.yaml checks 1,150
  // ids at each pull and each push.
  uint64_t bad = 0;
  if (kind_ == EmbeddingKind::kStatic) {
    const uint64_t last = static_cast<uint64_t>(capacity_) - 1;  // capacity <= 2^40
    for (uint64_t id : ids) bad |= PastLastBits(id, last);
    if ((bad >> 63) == 0) return absl::OkStatus();
    for (uint64_t id : ids) {
      if (id >= static_cast<uint64_t>(capacity_)) {
        return absl::InvalidArgumentError(absl::StrCat("embedding table '", options_.name, "': id ", id,
                                                       " is out of range [0, ", capacity_, ")"));
      }
    }
  } else {
    // ~id is 0 for the reserved id only.
    uint64_t all_nonzero = 1;
    for (uint64_t id : ids) all_nonzero &= static_cast<uint64_t>(~id != 0);
    if (all_nonzero != 0) return absl::OkStatus();
    for (uint64_t id : ids) {
      if (id == kReservedId) {
        return absl::InvalidArgumentError(absl::StrCat("embedding table '", options_.name, "': id ", id,
                                                       " (2^64-1) is reserved in dynamic tables"));
      }
    }
  }
  return absl::InternalError("embedding table: an id failed the batch's check but none failed alone");
}

absl::Status EmbeddingTable::FullError() const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "embedding table '", options_.name, "' (id ", options_.table_id, ") is full: it holds its capacity of ",
      capacity_, " rows and on_full is error; raise embedding.capacity or set on_full: evict_lru"));
}

absl::Status EmbeddingTable::Acquire(uint64_t id, bool insert, uint64_t tick, int64_t* row) {
  if (kind_ == EmbeddingKind::kStatic) {
    *row = static_cast<int64_t>(id);  // checked by CheckIds
    return absl::OkStatus();
  }
  return lru_ ? AcquireLru(id, insert, tick, row) : AcquireDynamicNoEvict(id, insert, row);
}

void EmbeddingTable::Release(int64_t row) const {
  if (!lru_) return;
  // Release: this thread's updates of the row happen before an evictor's CAS
  // (acquire) that takes the row.
  Atomic(Meta(row)->word0).fetch_sub(1, std::memory_order_release);
}

// kError (and any table that never evicts): rows never move, so a published
// (key, row) pair is final. See "Concurrency" in the header.
absl::StatusOr<bool> EmbeddingTable::Reserve(uint64_t id, int64_t* row) {
  const uint64_t capacity = static_cast<uint64_t>(capacity_);
  int spins = 0;
  std::chrono::steady_clock::time_point since;
  uint64_t n = Atomic(header_->reserved).load(std::memory_order_relaxed);
  for (;;) {
    if (n < capacity) {
      if (Atomic(header_->reserved).compare_exchange_weak(n, n + 1, std::memory_order_relaxed)) return true;
      continue;  // n is the current count
    }
    // Every row is promised. Rows taken so far, read before the probe below:
    // acquire pairs with the inserters' release fetch_add, so the probe sees
    // the index slot of every one of those rows.
    const uint64_t taken = Atomic(header_->next_row).load(std::memory_order_acquire);
    // The id may have arrived meanwhile: another thread held the last
    // promise for this very id.
    SW_RETURN_IF_ERROR(AcquireDynamicNoEvict(id, /*insert=*/false, row));
    if (*row >= 0) return false;
    // Full once every promise became a row. Until then a promise may belong
    // to a rival inserter of an id whose slot another thread is claiming; it
    // gives the promise back in a few instructions. One held past
    // kReserveWait belongs to a stopped thread or a dead process: full.
    if (taken >= capacity) return FullError();
    const auto now = std::chrono::steady_clock::now();
    if (spins == 0) {
      since = now;
    } else if (now - since > kReserveWait) {
      return FullError();
    }
    SpinWait(&spins);
    n = Atomic(header_->reserved).load(std::memory_order_relaxed);
  }
}

absl::Status EmbeddingTable::AcquireDynamicNoEvict(uint64_t id, bool insert, int64_t* row) {
  const uint64_t key = id + 1;
  bool have_reservation = false;
  auto give_back = [&] {
    if (have_reservation) Atomic(header_->reserved).fetch_sub(1, std::memory_order_relaxed);
    have_reservation = false;
  };
  auto wait_ready = [&](uint64_t slot) {
    int spins = 0;
    uint64_t r;
    // Acquire: pairs with the inserter's release store of `row`, so the
    // initialised parameters are visible.
    while ((r = Atomic(index_[slot].row).load(std::memory_order_acquire)) == 0) SpinWait(&spins);
    *row = static_cast<int64_t>(r - 1);
  };
  uint64_t s = HomeHash(id) & index_mask_;
  for (;;) {
    // Relaxed: the key word only claims the slot; the row is published
    // through `row` (release/acquire).
    uint64_t k = Atomic(index_[s].key).load(std::memory_order_relaxed);
    if (k == key) {
      give_back();
      wait_ready(s);
      return absl::OkStatus();
    }
    if (k == 0) {
      if (!insert) {
        *row = -1;
        return absl::OkStatus();
      }
      if (!have_reservation) {
        SW_ASSIGN_OR_RETURN(have_reservation, Reserve(id, row));
        if (!have_reservation) return absl::OkStatus();  // the id arrived meanwhile: *row is its row
      }
      uint64_t expected = 0;
      // Relaxed: the single modification order of the key word alone makes
      // exactly one claimer win.
      if (Atomic(index_[s].key).compare_exchange_strong(expected, key, std::memory_order_relaxed)) {
        // Release: a Reserve that reads the count after this add also sees
        // the key stored above (see Reserve).
        const uint64_t r = Atomic(header_->next_row).fetch_add(1, std::memory_order_release);
        InitRow(static_cast<int64_t>(r), id);
        Atomic(header_->initializations).fetch_add(1, std::memory_order_relaxed);
        // Release: publishes the initialised row to readers of `row`.
        Atomic(index_[s].row).store(r + 1, std::memory_order_release);
        *row = static_cast<int64_t>(r);
        return absl::OkStatus();
      }
      if (expected == key) {
        give_back();
        wait_ready(s);
        return absl::OkStatus();
      }
      // Another id took this slot: keep probing.
    }
    s = (s + 1) & index_mask_;
  }
}

// Pins `row` if it is ready and holds `id`. See "Concurrency" in the header.
static inline bool TryPin(RowMeta* meta, uint64_t id) {
  // Acquire: pairs with the release RMW that made the row ready, so its id
  // and initial values are visible; and keeps the evictor's CAS from seeing
  // zero pins until we unpin.
  const uint32_t w = Atomic(meta->word0).fetch_add(1, std::memory_order_acquire);
  if ((w & kStateMask) == kRowReady && Atomic(meta->key).load(std::memory_order_relaxed) == id + 1) return true;
  Atomic(meta->word0).fetch_sub(1, std::memory_order_release);
  return false;
}

absl::Status EmbeddingTable::AcquireLru(uint64_t id, bool insert, uint64_t tick, int64_t* row) {
  const uint64_t key = id + 1;
  int spins = 0;
  for (;;) {
    const uint64_t e1 = Atomic(header_->index_epoch).load(std::memory_order_acquire);
    bool retry = false;
    uint64_t s = HomeHash(id) & index_mask_;
    for (;;) {
      // Acquire (seqlock read side): if this load reads a store of an index
      // change, the change's odd epoch happens before our second epoch load.
      // A hit is validated by TryPin, not by the epoch.
      const uint64_t k = Atomic(index_[s].key).load(std::memory_order_acquire);
      if (k == key) {
        const uint64_t r = Atomic(index_[s].row).load(std::memory_order_relaxed);
        if (r != 0 && r <= static_cast<uint64_t>(capacity_)) {
          RowMeta* meta = Meta(static_cast<int64_t>(r - 1));
          if (TryPin(meta, id)) {
            if (insert) Touch(meta, tick);
            *row = static_cast<int64_t>(r - 1);
            return absl::OkStatus();
          }
        }
        retry = true;  // the entry is moving or its row is being evicted
        break;
      }
      if (k == 0) break;
      s = (s + 1) & index_mask_;
    }
    if (!retry) {
      if (insert) {
        // The locked insert probes again with no concurrent index writer.
        EvictionLock lock(&header_->evict_lock);
        return InsertLruLocked(id, tick, row);
      }
      // A read-only miss is trusted only if no index entry moved during the
      // probe. The acquire loads of the probe keep this load after them.
      const uint64_t e2 = Atomic(header_->index_epoch).load(std::memory_order_relaxed);
      if (e1 == e2 && (e1 & 1) == 0) {
        *row = -1;
        return absl::OkStatus();
      }
    }
    SpinWait(&spins);
  }
}

int64_t EmbeddingTable::ProbeLocked(uint64_t id) const {
  const uint64_t key = id + 1;
  for (uint64_t s = HomeHash(id) & index_mask_;; s = (s + 1) & index_mask_) {
    const uint64_t k = Atomic(index_[s].key).load(std::memory_order_relaxed);
    if (k == key) return static_cast<int64_t>(s);
    if (k == 0) return -1;
  }
}

absl::Status EmbeddingTable::InsertLruLocked(uint64_t id, uint64_t tick, int64_t* row) {
  if (const int64_t s = ProbeLocked(id); s >= 0) {
    // Inserted by another thread since our probe; under the lock it cannot be
    // evicted, and its row is ready.
    const uint64_t r = Atomic(index_[s].row).load(std::memory_order_relaxed) - 1;
    RowMeta* meta = Meta(static_cast<int64_t>(r));
    if (!TryPin(meta, id)) return absl::InternalError("embedding table: index and row disagree");
    Touch(meta, tick);
    *row = static_cast<int64_t>(r);
    return absl::OkStatus();
  }
  int64_t r;
  bool fresh = false;
  const uint64_t used = Atomic(header_->next_row).load(std::memory_order_relaxed);
  if (used < static_cast<uint64_t>(capacity_)) {
    r = static_cast<int64_t>(used);
    fresh = true;
  } else {
    SW_RETURN_IF_ERROR(EvictOneLocked(&r));
  }
  InitRow(r, id);
  RowMeta* meta = Meta(r);
  const uint32_t now = TickBits(static_cast<uint16_t>(tick >> tick_shift_));
  // Release: readers that pin the row (acquire) see its id and values. The
  // row comes back pinned once, for the caller, with the tick of this call.
  if (fresh) {
    // No other thread can know a row that was never in the index.
    Atomic(meta->word0).store(kRowReady | now | 1, std::memory_order_release);
    Atomic(header_->next_row).store(used + 1, std::memory_order_relaxed);
  } else {
    // evicting (tick 0) -> ready with this tick, plus our pin; an add keeps
    // the pins of readers that touched the row meanwhile (they back off and
    // unpin). Unsigned arithmetic wraps, so the sum is exact.
    Atomic(meta->word0).fetch_add(kRowReady + now + 1 - kRowEvicting, std::memory_order_release);
  }
  Atomic(header_->initializations).fetch_add(1, std::memory_order_relaxed);
  // Add the index entry at the first empty slot. Filling an empty slot needs
  // no epoch bump: a probe that misses it simply ran before the insert.
  uint64_t s = HomeHash(id) & index_mask_;
  while (Atomic(index_[s].key).load(std::memory_order_relaxed) != 0) s = (s + 1) & index_mask_;
  Atomic(index_[s].row).store(static_cast<uint64_t>(r) + 1, std::memory_order_relaxed);
  Atomic(index_[s].key).store(id + 1, std::memory_order_release);
  *row = r;
  return absl::OkStatus();
}

absl::Status EmbeddingTable::EvictOneLocked(int64_t* row) {
  // Ages are counted in coarse ticks back from now; a tick ahead of now (a
  // row touched after this load of the clock) is age 0, and rows untouched
  // for 2^15 coarse ticks or more alias to younger ages (a coarse LRU).
  const uint16_t now = static_cast<uint16_t>(Atomic(header_->clock).load(std::memory_order_relaxed) >> tick_shift_);
  auto age_of = [&](uint32_t w) {
    return std::max<int32_t>(0, static_cast<int16_t>(static_cast<uint16_t>(now - TickOf(w))));
  };
  // Takes row r if its state word still is `seen` (ready, unpinned). Acquire:
  // pairs with the last unpin (release), so every update made under a pin
  // happens before the row is reinitialised.
  auto take = [&](int64_t r, uint32_t seen) {
    return Atomic(Meta(r)->word0)
        .compare_exchange_strong(seen, kRowEvicting, std::memory_order_acquire, std::memory_order_relaxed);
  };
  auto evictable = [](uint32_t w) { return (w & (kStateMask | kPinMask)) == kRowReady; };
  int64_t victim = -1;
  for (int round = 0; round < kEvictRounds && victim < 0; ++round) {
    int64_t best = -1;
    int32_t best_age = -1;
    uint32_t best_word = 0;
    for (int i = 0; i < kEvictSamples; ++i) {
      const uint64_t draw = Atomic(header_->evict_draws).fetch_add(1, std::memory_order_relaxed);
      const int64_t r = static_cast<int64_t>(Mix(draw ^ options_.seed) % static_cast<uint64_t>(capacity_));
      const uint32_t w = Atomic(Meta(r)->word0).load(std::memory_order_relaxed);
      if (!evictable(w)) continue;  // pinned
      if (age_of(w) > best_age) {
        best_age = age_of(w);
        best = r;
        best_word = w;
      }
    }
    if (best >= 0 && take(best, best_word)) victim = best;
  }
  // Every sample was pinned (or changed under us): scan the whole table for
  // the oldest free row, a few times before giving up.
  for (int scan = 0; scan < 4 && victim < 0; ++scan) {
    int64_t best = -1;
    int32_t best_age = -1;
    uint32_t best_word = 0;
    for (int64_t r = 0; r < capacity_; ++r) {
      const uint32_t w = Atomic(Meta(r)->word0).load(std::memory_order_relaxed);
      if (!evictable(w)) continue;
      if (age_of(w) > best_age) {
        best_age = age_of(w);
        best = r;
        best_word = w;
      }
    }
    if (best < 0) break;
    if (take(best, best_word)) victim = best;
  }
  if (victim < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("embedding table '", options_.name, "' (id ", options_.table_id,
                                                     ") is full (", capacity_,
                                                     " rows) and every row is in use by a concurrent pull or push"));
  }
  RemoveFromIndexLocked(Atomic(Meta(victim)->key).load(std::memory_order_relaxed) - 1);
  Atomic(header_->evictions).fetch_add(1, std::memory_order_relaxed);
  *row = victim;
  return absl::OkStatus();
}

// Backward-shift deletion (Knuth 6.4, algorithm R): entries after the hole
// move back unless their home lies in (hole, entry]. Concurrent lock-free
// probes may miss a moving entry or see one twice; the epoch tells a
// read-only miss to retry, and a hit is validated through the row.
void EmbeddingTable::RemoveFromIndexLocked(uint64_t id) {
  int64_t found = ProbeLocked(id);
  if (found < 0) return;
  uint64_t hole = static_cast<uint64_t>(found);
  const uint64_t e = Atomic(header_->index_epoch).load(std::memory_order_relaxed);
  Atomic(header_->index_epoch).store(e + 1, std::memory_order_relaxed);
  // Seqlock write side: every entry write is a release store, so a reader
  // whose acquire load reads it also sees the odd epoch stored before it.
  // (Release stores instead of a fence: ThreadSanitizer does not model
  // fences, and on x86 both are plain moves.)
  for (uint64_t j = (hole + 1) & index_mask_;; j = (j + 1) & index_mask_) {
    const uint64_t k = Atomic(index_[j].key).load(std::memory_order_relaxed);
    if (k == 0) break;
    const uint64_t home = HomeHash(k - 1) & index_mask_;
    if (((j - home) & index_mask_) >= ((j - hole) & index_mask_)) {
      Atomic(index_[hole].key).store(k, std::memory_order_release);
      Atomic(index_[hole].row).store(Atomic(index_[j].row).load(std::memory_order_relaxed), std::memory_order_release);
      hole = j;
    }
  }
  Atomic(index_[hole].key).store(0, std::memory_order_release);
  Atomic(index_[hole].row).store(0, std::memory_order_release);
  // Release: a reader that sees e + 2 after its probe also saw these writes.
  Atomic(header_->index_epoch).store(e + 2, std::memory_order_release);
}

// ---- Pull / Push -------------------------------------------------------------------

absl::Status EmbeddingTable::Pull(absl::Span<const uint64_t> ids, float* out, PullMode mode) {
  if (ids.empty()) return absl::OkStatus();
  if (out == nullptr) return absl::InvalidArgumentError("embedding Pull: out is null");
  SW_RETURN_IF_ERROR(CheckIds(ids));
  const bool insert = mode == PullMode::kInsert;
  const uint64_t tick = (lru_ && insert) ? Atomic(header_->clock).fetch_add(1, std::memory_order_relaxed) + 1 : 0;
  const int lines = LinesFor(slots_offset_);
  const size_t n = ids.size();
  if (!row_lock_ && !lru_) {
    // Rows that never move: gathered in batches, one kernel call each. The
    // pending rows fill out[first, first + k); a missing row (kReadOnly)
    // is written at its initial value in between.
    constexpr size_t kRowBatch = 64;
    const char* src[kRowBatch];
    size_t first = 0, k = 0;
    auto flush = [&] {
      float* to = out + first * static_cast<size_t>(dim_);
      if (bf16_) {
        HogwildGatherRowsBf16(reinterpret_cast<const uint16_t* const*>(src), static_cast<int64_t>(k), dim_, to);
      } else {
        HogwildGatherRows(reinterpret_cast<const float* const*>(src), static_cast<int64_t>(k), dim_, to);
      }
      first += k;
      k = 0;
    };
    for (size_t i = 0; i < n; ++i) {
      PrefetchAhead(ids, i, lines);
      int64_t row;
      if (absl::Status st = Acquire(ids[i], insert, tick, &row); !st.ok()) {
        flush();
        return st;
      }
      if (row < 0) {
        flush();
        InitialRowValue(options_, ids[i], out + i * static_cast<size_t>(dim_));
        first = i + 1;
        continue;
      }
      src[k++] = RowBlock(row);
      if (k == kRowBatch) flush();
    }
    flush();
    return absl::OkStatus();
  }
  for (size_t i = 0; i < n; ++i) {
    PrefetchAhead(ids, i, lines);
    int64_t row;
    SW_RETURN_IF_ERROR(Acquire(ids[i], insert, tick, &row));
    float* dst = out + i * static_cast<size_t>(dim_);
    if (row < 0) {
      InitialRowValue(options_, ids[i], dst);
      continue;
    }
    const char* block = RowBlock(row);
    auto copy = [&] { CopyParams(block, dst); };
    if (row_lock_) {
      ReadRowConsistent(SeqWord(row), copy);
    } else {
      copy();
    }
    Release(row);
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::Push(absl::Span<const uint64_t> ids, const float* grads,
                                  absl::Span<const uint32_t> grad_rows, const OptimizerOptions& optimizer, float lr,
                                  Scratch* scratch) {
  if (ids.empty()) return absl::OkStatus();
  if (grads == nullptr || scratch == nullptr) {
    return absl::InvalidArgumentError("embedding Push: grads and scratch must not be null");
  }
  if (NumSlots(optimizer.type) > num_slots_) {
    return absl::FailedPreconditionError(absl::StrCat("embedding table '", options_.name, "': optimizer ",
                                                      OptimizerTypeName(optimizer.type), " needs ",
                                                      NumSlots(optimizer.type), " slots per row, the table has ",
                                                      num_slots_, " (embedding.num_slots)"));
  }
  for (int k = 0; k < NumSlots(optimizer.type); ++k) {
    if (SlotInitialValue(optimizer, k) != options_.slot_init[k]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "embedding table '", options_.name, "': optimizer ", OptimizerTypeName(optimizer.type), " starts slot ", k,
          " at ", SlotInitialValue(optimizer, k), ", the table's rows start it at ", options_.slot_init[k],
          " (create the table with EmbeddingTableOptions::SetOptimizer)"));
    }
  }
  const bool counts_steps = UsesStepCount(optimizer.type);
  if (counts_steps && !counts_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "embedding table '", options_.name, "': optimizer ", OptimizerTypeName(optimizer.type),
        " needs each row's update count (its bias correction is per row), the table keeps none (create it with ",
        "EmbeddingTableOptions::SetOptimizer, or count_updates)"));
  }
  SW_RETURN_IF_ERROR(CheckIds(ids));

  if (!grad_rows.empty() && grad_rows.size() != ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat("embedding Push: ", grad_rows.size(), " gradient rows for ",
                                                   ids.size(), " ids"));
  }

  // Deduplicate: the unique ids in first-occurrence order, each with the
  // gradient of all its occurrences, summed from the first in batch order.
  Scratch& sc = *scratch;
  const size_t n = ids.size();
  const size_t d = static_cast<size_t>(dim_);
  const size_t cap = NextPow2(std::max<size_t>(16, 2 * n));
  if (sc.map_.size() < cap) {
    sc.map_.assign(cap, Scratch::MapEntry{});
    sc.stamp_ = 0;
  }
  if (++sc.stamp_ == 0) {  // wrapped: forget every old entry
    for (Scratch::MapEntry& e : sc.map_) e.stamp = 0;
    sc.stamp_ = 1;
  }
  if (sc.unique_ids_.size() < n) {
    sc.unique_ids_.resize(n);
    sc.first_row_.resize(n);
    sc.sum_of_.resize(n);
  }
  const bool sum_every = d <= kSumEveryDim && sc.repeated_ >= kSumEveryRepeats;
  size_t m = 0;
  if (sum_every) {
    if (sc.summed_.size() < n * d) sc.summed_.resize(n * d);
    const uint32_t* rows = grad_rows.empty() ? nullptr : grad_rows.data();
    m = d == 1 ? DedupSummingEvery<1>(ids.data(), n, rows, grads, 1, sc.map_.data(), cap - 1, sc.stamp_,
                                      sc.unique_ids_.data(), sc.summed_.data())
               : DedupSummingEvery<0>(ids.data(), n, rows, grads, d, sc.map_.data(), cap - 1, sc.stamp_,
                                      sc.unique_ids_.data(), sc.summed_.data());
  } else {
    // Longer rows: only an id that repeats gets a sum in summed_ (its first
    // gradient plus the later ones); the others are read in place.
    size_t sums = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t id = ids[i];
      const uint32_t row = grad_rows.empty() ? static_cast<uint32_t>(i) : grad_rows[i];
      Scratch::MapEntry& e = FindEntry(sc.map_.data(), cap - 1, sc.stamp_, id);
      if (e.stamp != sc.stamp_) {
        const uint32_t u = static_cast<uint32_t>(m++);
        e = Scratch::MapEntry{id, u, sc.stamp_};
        sc.unique_ids_[u] = id;
        sc.first_row_[u] = row;
        sc.sum_of_[u] = -1;
        continue;
      }
      const uint32_t u = e.value;
      if (sc.sum_of_[u] < 0) {
        // Second occurrence: start the sum from the first one.
        if (sc.summed_.size() < (sums + 1) * d) sc.summed_.resize(std::max((sums + 1) * d, sc.summed_.size() * 2));
        sc.sum_of_[u] = static_cast<int32_t>(sums++);
        const float* first = grads + static_cast<size_t>(sc.first_row_[u]) * d;
        std::copy(first, first + d, sc.summed_.data() + static_cast<size_t>(sc.sum_of_[u]) * d);
      }
      const float* g = grads + static_cast<size_t>(row) * d;
      float* sum = sc.summed_.data() + static_cast<size_t>(sc.sum_of_[u]) * d;
      for (size_t j = 0; j < d; ++j) sum[j] += g[j];
    }
  }

  sc.repeated_ = static_cast<double>(n - m) / static_cast<double>(n);
  const uint64_t tick = lru_ ? Atomic(header_->clock).fetch_add(1, std::memory_order_relaxed) + 1 : 0;
  // The hardware streams the rest of a long row once its first lines are requested.
  const int lines = LinesFor(row_stride_);
  const absl::Span<const uint64_t> unique(sc.unique_ids_.data(), m);
  auto grad_of = [&](size_t i) -> const float* {
    if (sum_every) return sc.summed_.data() + i * d;
    return sc.sum_of_[i] >= 0 ? sc.summed_.data() + static_cast<size_t>(sc.sum_of_[i]) * d
                              : grads + static_cast<size_t>(sc.first_row_[i]) * d;
  };
  // bf16 rows: the stochastic rounding's bits hash (this call's draw, id),
  // so a run that pushes the same ids in the same order rounds the same way.
  const uint64_t draw = bf16_ ? Mix(Atomic(header_->rounding_draws).fetch_add(1, std::memory_order_relaxed)) : 0;
  auto salt_of = [&](uint64_t id) { return static_cast<uint32_t>(Mix(draw ^ id)); };
  // One row's update, params and slots in its block.
  auto apply = [&](char* block, const float* g, const UpdateParams& up, uint64_t id) {
    if (bf16_) {
      uint16_t* p = reinterpret_cast<uint16_t*>(block);
      const uint32_t salt = salt_of(id);
      ApplyUpdateRowsBf16(optimizer, up, &p, &g, &salt, 1, dim_, static_cast<int64_t>(slots_offset_));
      return;
    }
    float* slots[kMaxSlots] = {};
    for (int k = 0; k < num_slots_; ++k) slots[k] = Slot(block, k);
    ApplyUpdate(optimizer, up, reinterpret_cast<float*>(block), slots, g, dim_);
  };
  if (!row_lock_ && !counts_steps && !lru_) {
    // Rows that never move (static, kError) under an optimizer with no
    // per-row step: one kernel call per batch of rows. (An LRU table pins
    // each row while it is updated, and a batch of pins could starve its own
    // evictions; Adam's t and row_lock's seqlock are per row.)
    constexpr size_t kRowBatch = 64;
    char* rows[kRowBatch];
    const float* row_grads[kRowBatch];
    uint32_t salts[kRowBatch];
    size_t k = 0;
    UpdateParams up;
    up.lr = lr;
    auto flush = [&] {
      if (bf16_) {
        ApplyUpdateRowsBf16(optimizer, up, reinterpret_cast<uint16_t* const*>(rows), row_grads, salts,
                            static_cast<int64_t>(k), dim_, static_cast<int64_t>(slots_offset_));
      } else {
        ApplyUpdateRows(optimizer, up, reinterpret_cast<float* const*>(rows), row_grads, static_cast<int64_t>(k), dim_);
      }
      k = 0;
    };
    for (size_t i = 0; i < m; ++i) {
      PrefetchAhead(unique, i, lines);
      int64_t row;
      if (absl::Status st = Acquire(unique[i], /*insert=*/true, tick, &row); !st.ok()) {
        flush();  // as row by row would have
        return st;
      }
      rows[k] = RowBlock(row);
      row_grads[k] = grad_of(i);
      if (bf16_) salts[k] = salt_of(unique[i]);
      if (++k == kRowBatch) flush();
    }
    flush();
    return absl::OkStatus();
  }
  for (size_t i = 0; i < m; ++i) {
    PrefetchAhead(unique, i, lines);
    int64_t row;
    SW_RETURN_IF_ERROR(Acquire(unique[i], /*insert=*/true, tick, &row));
    char* block = RowBlock(row);
    UpdateParams up;
    up.lr = lr;
    const float* g = grad_of(i);
    if (row_lock_) {
      uint32_t* seq = SeqWord(row);
      const uint32_t odd = LockRow(seq);
      // Under the lock the count has no other writer: a plain increment.
      uint32_t count_bits = odd & ~kPackedSeqMask;  // packed: the count, kept unless counted
      if (counts_steps) {
        if (packed_) {
          const uint32_t c = std::min((odd >> 8) + 1, kMaxPackedCount);
          count_bits = c << 8;
          up.step = c;
        } else {
          uint32_t* cw = CountWord(row);
          const uint32_t c = Atomic(*cw).load(std::memory_order_relaxed);
          const uint32_t next = c == std::numeric_limits<uint32_t>::max() ? c : c + 1;
          Atomic(*cw).store(next, std::memory_order_relaxed);
          up.step = next;
        }
      }
      apply(block, g, up, unique[i]);
      if (packed_) {
        // As UnlockRow (release), with the count in the upper bits.
        Atomic(*seq).store(count_bits | ((odd + 1) & kPackedSeqMask), std::memory_order_release);
      } else {
        UnlockRow(seq, odd);
      }
    } else {
      if (counts_steps) {
        // Each concurrent update takes its own t (the CAS orders them);
        // t saturates instead of wrapping to 0.
        uint32_t* cw = CountWord(row);
        uint32_t c = Atomic(*cw).load(std::memory_order_relaxed);
        while (c != std::numeric_limits<uint32_t>::max() &&
               !Atomic(*cw).compare_exchange_weak(c, c + 1, std::memory_order_relaxed)) {
        }
        up.step = c == std::numeric_limits<uint32_t>::max() ? c : c + 1;
      }
      apply(block, g, up, unique[i]);
    }
    Release(row);
  }
  return absl::OkStatus();
}

void EmbeddingTable::CopyParams(const char* block, float* dst) const {
  if (bf16_) {
    HogwildWidenBf16(reinterpret_cast<const uint16_t*>(block), dst, dim_);
  } else {
    HogwildCopyFrom(reinterpret_cast<const float*>(block), dst, dim_);
  }
}

void EmbeddingTable::CopyRowState(int64_t row, float* params, absl::Span<float* const> slots,
                                  uint64_t* update_count) const {
  const char* block = RowBlock(row);
  auto copy = [&] {
    // Hogwild copies (a bf16 table's parameters widened: its checkpoint
    // holds f32 like any other).
    if (params != nullptr) CopyParams(block, params);
    for (size_t k = 0; k < slots.size(); ++k) {
      if (slots[k] != nullptr) HogwildCopyFrom(Slot(block, static_cast<int>(k)), slots[k], dim_);
    }
    if (update_count != nullptr) *update_count = LoadCount(row);
  };
  if (row_lock_) {
    ReadRowConsistent(SeqWord(row), copy);
  } else {
    copy();
  }
}

absl::Status EmbeddingTable::ReadRowState(uint64_t id, float* params, absl::Span<float* const> slots,
                                          uint64_t* update_count) {
  if (static_cast<int>(slots.size()) > num_slots_) {
    return absl::InvalidArgumentError(absl::StrCat("embedding table '", options_.name, "': asked for ", slots.size(),
                                                   " slots, rows have ", num_slots_));
  }
  SW_RETURN_IF_ERROR(CheckIds({&id, 1}));
  int64_t row;
  SW_RETURN_IF_ERROR(Acquire(id, /*insert=*/false, /*tick=*/0, &row));
  if (row < 0) {
    return absl::NotFoundError(absl::StrCat("embedding table '", options_.name, "': no row for id ", id));
  }
  CopyRowState(row, params, slots, update_count);
  Release(row);
  return absl::OkStatus();
}

absl::StatusOr<bool> EmbeddingTable::ReadRowAt(int64_t row, uint64_t* id, float* params,
                                               absl::Span<float* const> slots, uint64_t* update_count) {
  if (static_cast<int>(slots.size()) > num_slots_) {
    return absl::InvalidArgumentError(absl::StrCat("embedding table '", options_.name, "': asked for ", slots.size(),
                                                   " slots, rows have ", num_slots_));
  }
  if (row < 0 || row >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("embedding table '", options_.name, "': row ", row,
                                                   " is not in [0, ", size(), ")"));
  }
  if (kind_ == EmbeddingKind::kStatic) {
    *id = static_cast<uint64_t>(row);
    CopyRowState(row, params, slots, update_count);
    return true;
  }
  RowMeta* meta = Meta(row);
  if (lru_) {
    // Pin it under the id it holds now, as a lookup would.
    const uint64_t held = Atomic(meta->key).load(std::memory_order_relaxed) - 1;
    if (!TryPin(meta, held)) return false;
    *id = held;
    CopyRowState(row, params, slots, update_count);
    Release(row);
    return true;
  }
  // kError: a row below size() is handed out; it is in use once initialised
  // (InitRow stores its key last, with release).
  const uint64_t key = Atomic(meta->key).load(std::memory_order_acquire);
  if (key == 0) return false;
  *id = key - 1;
  CopyRowState(row, params, slots, update_count);
  return true;
}

absl::StatusOr<int64_t> EmbeddingTable::ReadRowsAt(int64_t begin, int64_t end, uint64_t* ids, float* params,
                                                   absl::Span<float* const> slots, uint64_t* update_counts) {
  if (static_cast<int>(slots.size()) > num_slots_) {
    return absl::InvalidArgumentError(absl::StrCat("embedding table '", options_.name, "': asked for ", slots.size(),
                                                   " slots, rows have ", num_slots_));
  }
  if (begin < 0 || begin > end || end > size()) {
    return absl::InvalidArgumentError(absl::StrCat("embedding table '", options_.name, "': rows [", begin, ", ", end,
                                                   ") are not in [0, ", size(), ")"));
  }
  const size_t dim = static_cast<size_t>(dim_);
  if (kind_ == EmbeddingKind::kStatic && !row_lock_) {
    // Every row is in use, under its own index.
    const int64_t n = end - begin;
    if (ids != nullptr) {
      for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<uint64_t>(begin + i);
    }
    if (params != nullptr) {
      if (!bf16_ && row_stride_ == dim * sizeof(float)) {
        HogwildCopyFrom(reinterpret_cast<const float*>(RowBlock(begin)), params, n * dim_);
      } else {
        for (int64_t i = 0; i < n; ++i) CopyParams(RowBlock(begin + i), params + static_cast<size_t>(i) * dim);
      }
    }
    for (size_t k = 0; k < slots.size(); ++k) {
      if (slots[k] == nullptr) continue;
      for (int64_t i = 0; i < n; ++i) {
        HogwildCopyFrom(Slot(RowBlock(begin + i), static_cast<int>(k)), slots[k] + static_cast<size_t>(i) * dim, dim_);
      }
    }
    if (update_counts != nullptr) {
      for (int64_t i = 0; i < n; ++i) update_counts[i] = LoadCount(begin + i);
    }
    return n;
  }
  // Row by row: a dynamic table's rows may be free or being evicted, and a
  // row_lock table's are read under their seqlocks.
  int64_t in_use = 0;
  std::array<float*, kMaxSlots> row_slots{};
  for (int64_t row = begin; row < end; ++row) {
    const size_t at = static_cast<size_t>(in_use) * dim;
    for (size_t k = 0; k < slots.size(); ++k) row_slots[k] = slots[k] != nullptr ? slots[k] + at : nullptr;
    uint64_t id = 0, count = 0;
    SW_ASSIGN_OR_RETURN(const bool used, ReadRowAt(row, &id, params != nullptr ? params + at : nullptr,
                                                   absl::MakeSpan(row_slots.data(), slots.size()),
                                                   update_counts != nullptr ? &count : nullptr));
    if (!used) continue;
    if (ids != nullptr) ids[in_use] = id;
    if (update_counts != nullptr) update_counts[in_use] = count;
    ++in_use;
  }
  return in_use;
}

absl::Status EmbeddingTable::WriteRowState(uint64_t id, const float* params, absl::Span<const float* const> slots,
                                           uint64_t update_count) {
  if (static_cast<int>(slots.size()) > num_slots_) {
    return absl::InvalidArgumentError(absl::StrCat("embedding table '", options_.name, "': given ", slots.size(),
                                                   " slots, rows have ", num_slots_));
  }
  if (params == nullptr) return absl::InvalidArgumentError("embedding WriteRowState: params is null");
  SW_RETURN_IF_ERROR(CheckIds({&id, 1}));
  const uint64_t tick = lru_ ? Atomic(header_->clock).fetch_add(1, std::memory_order_relaxed) + 1 : 0;
  int64_t row;
  SW_RETURN_IF_ERROR(Acquire(id, /*insert=*/true, tick, &row));
  char* block = RowBlock(row);
  uint32_t* seq = row_lock_ ? SeqWord(row) : nullptr;
  const uint32_t odd = row_lock_ ? LockRow(seq) : 0;
  StoreParams(params, block);
  for (size_t k = 0; k < slots.size(); ++k) {
    if (slots[k] != nullptr) HogwildCopyTo(slots[k], Slot(block, static_cast<int>(k)), dim_);
  }
  if (packed_) {
    const uint32_t c = static_cast<uint32_t>(std::min<uint64_t>(update_count, kMaxPackedCount));
    Atomic(*seq).store((c << 8) | ((odd + 1) & kPackedSeqMask), std::memory_order_release);
  } else {
    StoreCount(row, update_count);
    if (row_lock_) UnlockRow(seq, odd);
  }
  Release(row);
  return absl::OkStatus();
}

void EmbeddingTable::StoreParams(const float* src, char* block) {
  if (bf16_) {
    // Rounded to nearest (a checkpoint's f32 values into a bf16 table).
    uint16_t* p = reinterpret_cast<uint16_t*>(block);
    uint16_t chunk[64];
    for (int64_t j = 0; j < dim_; j += 64) {
      const int64_t n = std::min<int64_t>(64, dim_ - j);
      HogwildCopyFromAsBf16(src + j, chunk, n);
      for (int64_t i = 0; i < n; ++i) Atomic(p[j + i]).store(chunk[i], std::memory_order_relaxed);
    }
  } else {
    HogwildCopyTo(src, reinterpret_cast<float*>(block), dim_);
  }
}

absl::Status EmbeddingTable::WriteRowStates(uint64_t first_id, int64_t n, const float* params,
                                            absl::Span<const float* const> slots, const uint64_t* update_counts) {
  if (static_cast<int>(slots.size()) > num_slots_) {
    return absl::InvalidArgumentError(absl::StrCat("embedding table '", options_.name, "': given ", slots.size(),
                                                   " slots, rows have ", num_slots_));
  }
  if (n < 0) return absl::InvalidArgumentError("embedding WriteRowStates: negative row count");
  if (n == 0) return absl::OkStatus();
  if (params == nullptr) return absl::InvalidArgumentError("embedding WriteRowStates: params is null");
  const size_t dim = static_cast<size_t>(dim_);
  if (kind_ == EmbeddingKind::kStatic) {
    // Rows first_id .. first_id + n - 1: the ids checked once, up front.
    const auto capacity = static_cast<uint64_t>(capacity_);
    if (first_id >= capacity || static_cast<uint64_t>(n) > capacity - first_id) {
      const uint64_t bad = first_id >= capacity ? first_id : capacity;  // the first id out of range
      return CheckIds({&bad, 1});
    }
  }
  if (kind_ == EmbeddingKind::kStatic && !row_lock_) {
    const auto begin = static_cast<int64_t>(first_id);
    if (!bf16_ && row_stride_ == dim * sizeof(float)) {
      HogwildCopyTo(params, reinterpret_cast<float*>(RowBlock(begin)), n * dim_);
    } else {
      for (int64_t i = 0; i < n; ++i) StoreParams(params + static_cast<size_t>(i) * dim, RowBlock(begin + i));
    }
    for (size_t k = 0; k < slots.size(); ++k) {
      if (slots[k] == nullptr) continue;
      for (int64_t i = 0; i < n; ++i) {
        HogwildCopyTo(slots[k] + static_cast<size_t>(i) * dim, Slot(RowBlock(begin + i), static_cast<int>(k)), dim_);
      }
    }
    if (count_at_ >= 0) {
      for (int64_t i = 0; i < n; ++i) StoreCount(begin + i, update_counts != nullptr ? update_counts[i] : 0);
    }
    return absl::OkStatus();
  }
  std::array<const float*, kMaxSlots> row_slots{};
  for (int64_t i = 0; i < n; ++i) {
    const size_t at = static_cast<size_t>(i) * dim;
    for (size_t k = 0; k < slots.size(); ++k) row_slots[k] = slots[k] != nullptr ? slots[k] + at : nullptr;
    SW_RETURN_IF_ERROR(WriteRowState(first_id + static_cast<uint64_t>(i), params + at,
                                     absl::MakeConstSpan(row_slots.data(), slots.size()),
                                     update_counts != nullptr ? update_counts[i] : 0));
  }
  return absl::OkStatus();
}

// ---- Counters and test hooks -----------------------------------------------------------

size_t EmbeddingTable::meta_bytes_per_row() const {
  return kind_ == EmbeddingKind::kStatic ? side_stride_ : sizeof(RowMeta);
}

int64_t EmbeddingTable::size() const {
  return static_cast<int64_t>(Atomic(header_->next_row).load(std::memory_order_relaxed));
}

int64_t EmbeddingTable::evictions() const {
  return static_cast<int64_t>(Atomic(header_->evictions).load(std::memory_order_relaxed));
}

int64_t EmbeddingTable::initializations() const {
  return static_cast<int64_t>(Atomic(header_->initializations).load(std::memory_order_relaxed));
}

int64_t EmbeddingTable::RowOfForTest(uint64_t id) const {
  if (kind_ == EmbeddingKind::kStatic) return id < static_cast<uint64_t>(capacity_) ? static_cast<int64_t>(id) : -1;
  if (id == kReservedId) return -1;
  const int64_t s = ProbeLocked(id);
  if (s < 0) return -1;
  return static_cast<int64_t>(Atomic(index_[s].row).load(std::memory_order_acquire)) - 1;
}

absl::Status EmbeddingTable::CheckConsistencyForTest() const {
  if (kind_ == EmbeddingKind::kStatic) return absl::OkStatus();
  const int64_t used = size();
  std::vector<bool> row_seen(static_cast<size_t>(used), false);
  std::unordered_set<uint64_t> ids;
  int64_t entries = 0;
  for (uint64_t s = 0; s <= index_mask_; ++s) {
    const uint64_t k = Atomic(index_[s].key).load(std::memory_order_relaxed);
    if (k == 0) continue;
    ++entries;
    const uint64_t id = k - 1;
    const uint64_t r1 = Atomic(index_[s].row).load(std::memory_order_acquire);
    if (r1 == 0 || r1 > static_cast<uint64_t>(used)) {
      return absl::InternalError(absl::StrCat("slot ", s, " (id ", id, ") has row ", r1, " - 1, size is ", used));
    }
    const int64_t r = static_cast<int64_t>(r1 - 1);
    if (row_seen[r]) return absl::InternalError(absl::StrCat("row ", r, " is named by two index entries"));
    row_seen[r] = true;
    if (!ids.insert(id).second) return absl::InternalError(absl::StrCat("id ", id, " has two index entries"));
    const RowMeta* meta = Meta(r);
    const uint64_t key = Atomic(meta->key).load(std::memory_order_relaxed);
    if (key != id + 1) {
      return absl::InternalError(absl::StrCat("row ", r, " holds key ", key, " (id + 1), index says id ", id));
    }
    if (lru_ && (Atomic(meta->word0).load(std::memory_order_relaxed) & kStateMask) != kRowReady) {
      return absl::InternalError(absl::StrCat("row ", r, " of id ", id, " is not ready"));
    }
    if (ProbeLocked(id) != static_cast<int64_t>(s)) {
      return absl::InternalError(absl::StrCat("id ", id, " in slot ", s, " is not reachable from its home slot"));
    }
  }
  if (entries != used) return absl::InternalError(absl::StrCat(entries, " index entries, size() is ", used));
  return absl::OkStatus();
}

}  // namespace shardwild
