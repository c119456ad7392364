#include "ps_shm/embedding_table.h"

#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/model/hogwild_kernels.h"
#include "core/model/optimizer.h"
#include "core/config/options.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

// Succeeds if the message of `status` contains every one of `parts`.
::testing::AssertionResult MessageContains(const absl::Status& status, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts) {
    if (status.message().find(part) == absl::string_view::npos) {
      return ::testing::AssertionFailure() << "message \"" << status.message() << "\" lacks \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

// Anonymous memory for a table: page-aligned, zero-filled, shared with
// forked children (MAP_SHARED), unmapped at scope exit.
class Region {
 public:
  explicit Region(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : p;
  }
  ~Region() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  size_t bytes_;
  void* data_;
};

EmbeddingTableOptions StaticOptions(int64_t dim, int64_t capacity, int num_slots) {
  EmbeddingTableOptions o;
  o.name = "static_emb";
  o.kind = EmbeddingKind::kStatic;
  o.dim = dim;
  o.capacity = capacity;
  o.num_slots = num_slots;
  // Two slots are Adam's here, which counts each row's updates.
  o.count_updates = num_slots >= 2;
  o.seed = 11;
  o.table_id = 3;
  return o;
}

EmbeddingTableOptions DynamicOptions(int64_t dim, int64_t capacity, CapacityPolicy on_full = CapacityPolicy::kError) {
  EmbeddingTableOptions o;
  o.name = "dynamic_emb";
  o.kind = EmbeddingKind::kDynamic;
  o.dim = dim;
  o.capacity = capacity;
  o.num_slots = 2;
  o.count_updates = true;  // Adam's
  o.on_full = on_full;
  o.seed = 5;
  o.table_id = 9;
  return o;
}

std::vector<float> Initial(const EmbeddingTableOptions& o, uint64_t id) {
  std::vector<float> v(o.dim);
  InitialRowValue(o, id, v.data());
  return v;
}

std::vector<float> PullOne(EmbeddingTable& t, uint64_t id, PullMode mode = PullMode::kReadOnly) {
  std::vector<float> v(t.dim());
  const absl::Status s = t.Pull({&id, 1}, v.data(), mode);
  if (!s.ok()) ADD_FAILURE() << s;
  return v;
}

OptimizerOptions Optimizer(OptimizerType type) {
  OptimizerOptions o;
  o.type = type;
  return o;
}

// ---- Options and layout ---------------------------------------------------------

TEST(EmbeddingTableTest, ValidateNamesTheKey) {
  EmbeddingTableOptions o = StaticOptions(8, 10, 0);
  EXPECT_TRUE(o.Validate().ok());
  o.dim = 0;
  EXPECT_TRUE(MessageContains(o.Validate(), {"embedding.dim", "got 0"}));
  o = StaticOptions(8, 0, 0);
  EXPECT_TRUE(MessageContains(o.Validate(), {"embedding.capacity"}));
  o = StaticOptions(8, 10, 5);
  EXPECT_TRUE(MessageContains(o.Validate(), {"embedding.num_slots", "got 5"}));
  o = StaticOptions(8, 10, 0);
  o.on_full = CapacityPolicy::kEvictLru;
  EXPECT_TRUE(MessageContains(o.Validate(), {"embedding.on_full", "dynamic"}));
  o = StaticOptions(8, 10, 0);
  o.init = {RowInitializer::Kind::kUniform, 1.0f, 1.0f, 0.0f};
  EXPECT_TRUE(MessageContains(o.Validate(), {"embedding.init", "a < b"}));
  o.init = {RowInitializer::Kind::kTruncatedNormal, 0, 0, -1.0f};
  EXPECT_TRUE(MessageContains(o.Validate(), {"embedding.init", "stddev"}));
  EXPECT_EQ(EmbeddingTable::BytesFor(o), 0u);
}

// The stride rule (embedding_table.h, "Row layout"): a power of two 16..64
// for blocks of at most 64 bytes, else a multiple of 16.
size_t ExpectedStride(size_t bytes) {
  if (bytes > 64) return (bytes + 15) / 16 * 16;
  size_t p = 16;
  while (p < bytes) p *= 2;
  return p;
}

TEST(EmbeddingTableTest, StaticRowsCarryNoMetadata) {
  for (int slots : {0, 1, 2, 4}) {
    for (int64_t dim : {1, 7, 16, 64, 100}) {
      for (bool row_lock : {false, true}) {
        for (bool counts : {false, true}) {
          EmbeddingTableOptions o = StaticOptions(dim, 3, slots);
          o.row_lock = row_lock;
          o.count_updates = counts;
          Region region(EmbeddingTable::BytesFor(o));
          auto t = EmbeddingTable::Create(region.data(), region.size(), o);
          ASSERT_TRUE(t.ok()) << t.status();
          const size_t floats = (1 + slots) * dim * sizeof(float);
          EXPECT_EQ(t->row_stride(), ExpectedStride(floats)) << "slots " << slots << " dim " << dim;
          // Side words: the seqlock word (row_lock) and the update count
          // (count_updates, for Adam); nothing else.
          const size_t side = 4 * ((row_lock ? 1 : 0) + (counts ? 1 : 0));
          EXPECT_EQ(t->meta_bytes_per_row(), side);
          EXPECT_EQ(t->bytes_per_row(), t->row_stride() + side);
          // A block of at most 64 bytes never straddles a cache line.
          if (t->row_stride() <= 64) {
            EXPECT_EQ(64 % t->row_stride(), 0u);
          }
        }
      }
    }
  }
}

// Only Adam reads a row's update count, so only its tables keep one: FTRL's
// two slots (z and n) come with no side word, which sparse_logreg's table
// of 2^20 rows spent 4 MiB on. Adam refuses a table without counts; the
// flag survives an attach.
TEST(EmbeddingTableTest, OnlyAdamsTablesCountUpdates) {
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kMomentum, OptimizerType::kAdagrad,
                             OptimizerType::kRmsprop, OptimizerType::kFtrl, OptimizerType::kAdam}) {
    const bool adam = type == OptimizerType::kAdam;
    EmbeddingTableOptions o = StaticOptions(1, 64, 0);
    o.SetOptimizer(Optimizer(type));
    EXPECT_EQ(o.count_updates, adam) << OptimizerTypeName(type);
    Region region(EmbeddingTable::BytesFor(o));
    auto t = EmbeddingTable::Create(region.data(), region.size(), o);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->meta_bytes_per_row(), adam ? 4u : 0u) << OptimizerTypeName(type);
    const uint64_t id = 5;
    const float g = 0.25f;
    EmbeddingTable::Scratch scratch;
    EXPECT_TRUE(t->Push({&id, 1}, &g, Optimizer(type), 0.1f, &scratch).ok()) << OptimizerTypeName(type);
    auto attached = EmbeddingTable::Attach(region.data(), region.size());
    ASSERT_TRUE(attached.ok()) << attached.status();
    EXPECT_EQ(attached->meta_bytes_per_row(), adam ? 4u : 0u) << OptimizerTypeName(type);
  }
  // A table with Adam's two slots and no counts: Adam is refused, nothing
  // changes.
  EmbeddingTableOptions o = StaticOptions(1, 64, 2);
  o.count_updates = false;
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok());
  const uint64_t id = 5;
  const float g = 0.25f;
  EmbeddingTable::Scratch scratch;
  const absl::Status s = t->Push({&id, 1}, &g, Optimizer(OptimizerType::kAdam), 0.1f, &scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(MessageContains(s, {"static_emb", "adam", "update count", "count_updates"}));
  EXPECT_EQ(PullOne(*t, id), Initial(o, id));
}

TEST(EmbeddingTableTest, StaticSgdDim16RowIs64Bytes) {
  const EmbeddingTableOptions o = StaticOptions(16, 1000, 0);
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->row_stride(), 64u);
  EXPECT_EQ(t->bytes_per_row(), 64u);
  EXPECT_EQ(t->meta_bytes_per_row(), 0u);
  // The region: one page of header, then the rows.
  EXPECT_EQ(EmbeddingTable::BytesFor(o), 4096u + 1000u * 64);
}

TEST(EmbeddingTableTest, DynamicRowMetadataIsAtMost16Bytes) {
  for (CapacityPolicy on_full : {CapacityPolicy::kError, CapacityPolicy::kEvictLru}) {
    for (int slots : {0, 1, 2, 4}) {
      for (bool row_lock : {false, true}) {
        EmbeddingTableOptions o = DynamicOptions(16, 10, on_full);
        o.num_slots = slots;
        o.row_lock = row_lock;
        Region region(EmbeddingTable::BytesFor(o));
        auto t = EmbeddingTable::Create(region.data(), region.size(), o);
        ASSERT_TRUE(t.ok()) << t.status();
        EXPECT_LE(t->meta_bytes_per_row(), 16u);
        EXPECT_EQ(t->bytes_per_row(), t->row_stride());
        EXPECT_EQ(t->row_stride(), ExpectedStride((1 + slots) * 16 * sizeof(float) + 16));
      }
    }
  }
}

TEST(EmbeddingTableTest, DlrmTablesOverheadIsAtMost5PercentOfParams) {
  // configs/ctr_dlrm.yaml: 26 static tables of 1,000,000 rows, dim 16, SGD.
  uint64_t params = 0, bytes = 0;
  for (uint32_t t = 0; t < 26; ++t) {
    EmbeddingTableOptions o = StaticOptions(16, 1'000'000, 0);
    o.table_id = t;
    bytes += EmbeddingTable::BytesFor(o);
    params += uint64_t{1'000'000} * 16 * sizeof(float);
  }
  EXPECT_LE(bytes - params, params / 20) << bytes << " bytes for " << params << " bytes of params";
}

TEST(EmbeddingTableTest, InitRowsInParallelPiecesGivesCreatesBytes) {
  for (int slots : {0, 2}) {
    for (bool row_lock : {false, true}) {
      EmbeddingTableOptions o = StaticOptions(12, 5000, slots);
      o.row_lock = row_lock;
      o.slot_init[0] = 0.25f;
      o.init.kind = RowInitializer::Kind::kTruncatedNormal;
      const size_t bytes = EmbeddingTable::BytesFor(o);
      Region sequential(bytes), parallel(bytes);
      ASSERT_TRUE(EmbeddingTable::Create(sequential.data(), bytes, o).ok());
      auto t = EmbeddingTable::Format(parallel.data(), bytes, o);
      ASSERT_TRUE(t.ok()) << t.status();
      // Before Publish the table cannot be attached.
      EXPECT_TRUE(MessageContains(EmbeddingTable::Attach(parallel.data(), bytes).status(), {"not created"}));
      // Uneven pieces, handed to 4 threads in reverse order.
      std::vector<std::pair<int64_t, int64_t>> pieces;
      for (int64_t b = 0; b < o.capacity; b += 333) pieces.push_back({b, std::min<int64_t>(b + 333, o.capacity)});
      std::reverse(pieces.begin(), pieces.end());
      std::atomic<size_t> next{0};
      std::vector<std::thread> threads;
      for (int k = 0; k < 4; ++k) {
        threads.emplace_back([&] {
          for (size_t i; (i = next.fetch_add(1)) < pieces.size();) t->InitRows(pieces[i].first, pieces[i].second);
        });
      }
      for (std::thread& th : threads) th.join();
      t->Publish();
      EXPECT_EQ(std::memcmp(sequential.data(), parallel.data(), bytes), 0)
          << "slots " << slots << " row_lock " << row_lock;
      auto attached = EmbeddingTable::Attach(parallel.data(), bytes);
      ASSERT_TRUE(attached.ok()) << attached.status();
      EXPECT_EQ(PullOne(*attached, 4999), Initial(o, 4999));
    }
  }
}

// Row r as ReadRowAt gives it: whether it is in use, and then its id,
// parameters, slots and update count.
struct RowAt {
  bool used = false;
  uint64_t id = 0, count = 0;
  std::vector<float> params;
  std::vector<std::vector<float>> slots;
};
absl::StatusOr<RowAt> ReadRow(EmbeddingTable& t, int64_t r) {
  RowAt row;
  row.params.resize(static_cast<size_t>(t.dim()));
  row.slots.assign(static_cast<size_t>(t.num_slots()), std::vector<float>(static_cast<size_t>(t.dim())));
  std::vector<float*> slots;
  for (auto& v : row.slots) slots.push_back(v.data());
  absl::StatusOr<bool> used = t.ReadRowAt(r, &row.id, row.params.data(), slots, &row.count);
  if (!used.ok()) return used.status();
  row.used = *used;
  return row;
}

TEST(EmbeddingTableTest, StaticRowsDrawnInBlocksAreEachRowsInitialValue) {
  // A static f32 table's uniform rows are drawn a block at a time
  // (UniformRowsValues): every row holds InitialRowValue's draw of its id
  // (the definition, a row at a time) and its slots their initial values,
  // whatever the row's stride, slots and side words; other initialisers
  // and bf16 rows are drawn a row at a time, as before.
  struct Case {
    const char* name;
    EmbeddingTableOptions options;
  };
  std::vector<Case> cases;
  for (int64_t dim : {1, 5, 16, 17, 64}) {
    cases.push_back({"sgd", StaticOptions(dim, 1000, 0)});
    cases.push_back({"adam", StaticOptions(dim, 1000, 2)});
  }
  EmbeddingTableOptions locked = StaticOptions(16, 1000, 1);
  locked.row_lock = true;
  cases.push_back({"row_lock adagrad", locked});
  EmbeddingTableOptions wide = StaticOptions(7, 1000, 1);
  wide.init.a = -2.5f;
  wide.init.b = 0.75f;
  cases.push_back({"U(-2.5, 0.75)", wide});
  EmbeddingTableOptions normal = StaticOptions(9, 1000, 0);
  normal.init.kind = RowInitializer::Kind::kNormal;
  cases.push_back({"normal", normal});
  for (Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.name, ", dim ", c.options.dim));
    EmbeddingTableOptions& o = c.options;
    for (int k = 0; k < o.num_slots; ++k) o.slot_init[k] = 0.5f + static_cast<float>(k);
    Region region(EmbeddingTable::BytesFor(o));
    auto t = EmbeddingTable::Create(region.data(), region.size(), o);
    ASSERT_TRUE(t.ok()) << t.status();
    const size_t dim = static_cast<size_t>(o.dim);
    for (int64_t r = 0; r < o.capacity; ++r) {
      absl::StatusOr<RowAt> row = ReadRow(*t, r);
      ASSERT_TRUE(row.ok() && row->used) << r;
      ASSERT_EQ(row->id, static_cast<uint64_t>(r));
      ASSERT_EQ(row->params, Initial(o, row->id)) << "row " << r;
      for (int k = 0; k < o.num_slots; ++k) ASSERT_EQ(row->slots[k], std::vector<float>(dim, o.slot_init[k])) << "row " << r;
      ASSERT_EQ(row->count, 0u);
    }
  }
}

TEST(EmbeddingTableTest, InitRowsBytesAreWhereInitRowsWrites) {
  // Every byte InitRows(b, e) changes lies in InitRowsBytes(b, e), and those
  // ranges hold rows b..e-1 exactly: the store reserves them just before the
  // rows are drawn, and a byte outside would land on a page not reserved.
  for (int slots : {0, 2}) {
    for (bool row_lock : {false, true}) {
      EmbeddingTableOptions o = StaticOptions(12, 1000, slots);
      o.row_lock = row_lock;
      o.slot_init[0] = 0.25f;
      const size_t bytes = EmbeddingTable::BytesFor(o);
      Region region(bytes);
      // Not zero, so that side words set to zero show as changed.
      std::memset(region.data(), 0x5a, bytes);
      auto t = EmbeddingTable::Format(region.data(), bytes, o);
      ASSERT_TRUE(t.ok()) << t.status();
      const char* base = static_cast<const char*>(region.data());
      for (const auto& [b, e] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {333, 700}, {999, 1000}, {900, 2000}}) {
        const std::array<EmbeddingTable::ByteRange, 2> r = EmbeddingTable::InitRowsBytes(o, b, e);
        const int64_t rows = std::min<int64_t>(e, o.capacity) - b;
        EXPECT_EQ(base + r[0].offset, reinterpret_cast<const char*>(t->StaticRowParams(static_cast<uint64_t>(b))));
        EXPECT_EQ(r[0].bytes, static_cast<size_t>(rows) * t->row_stride());
        EXPECT_EQ(r[1].bytes, static_cast<size_t>(rows) * (t->bytes_per_row() - t->row_stride()));
        std::vector<char> before(base, base + bytes);
        t->InitRows(b, e);
        auto inside = [&](size_t i) {
          for (const EmbeddingTable::ByteRange& x : r) {
            if (i >= x.offset && i < x.offset + x.bytes) return true;
          }
          return false;
        };
        size_t changed = 0, outside = 0;
        for (size_t i = 0; i < bytes; ++i) {
          if (base[i] == before[i]) continue;
          ++changed;
          outside += !inside(i);
        }
        EXPECT_GT(changed, 0u) << "rows " << b << ".." << e;
        EXPECT_EQ(outside, 0u) << "rows " << b << ".." << e << ", slots " << slots << ", row_lock " << row_lock;
      }
    }
  }
  // A dynamic table's rows are written as they are inserted: nothing.
  const std::array<EmbeddingTable::ByteRange, 2> d = EmbeddingTable::InitRowsBytes(DynamicOptions(16, 10), 0, 10);
  EXPECT_EQ(d[0].bytes + d[1].bytes, 0u);
}

TEST(EmbeddingTableTest, AttachRefusesAnotherFormatVersion) {
  const EmbeddingTableOptions o = StaticOptions(16, 10, 0);
  const size_t bytes = EmbeddingTable::BytesFor(o);
  Region region(bytes);
  ASSERT_TRUE(EmbeddingTable::Create(region.data(), bytes, o).ok());
  // format_version follows the 8-byte magic. Version 4 gave every table of
  // two or more slots update counts and had no count_updates field; this
  // build must not read its header.
  uint32_t version = 0;
  std::memcpy(&version, static_cast<char*>(region.data()) + 8, sizeof(version));
  EXPECT_EQ(version, 5u);
  const uint32_t old = 4;
  std::memcpy(static_cast<char*>(region.data()) + 8, &old, sizeof(old));
  const auto s = EmbeddingTable::Attach(region.data(), bytes);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(MessageContains(s.status(), {"format_version is 4", "reads 5"}));
}

TEST(EmbeddingTableTest, UpdateCountsSurviveEveryMetadataLayout) {
  // Adam's per-row step t lives in a side word (static), in RowMeta (kError),
  // or packed with the seqlock word (LRU row_lock): each counts every push.
  struct Case {
    EmbeddingKind kind;
    CapacityPolicy on_full;
    bool row_lock;
  };
  for (const Case& c : {Case{EmbeddingKind::kStatic, CapacityPolicy::kError, false},
                        Case{EmbeddingKind::kStatic, CapacityPolicy::kError, true},
                        Case{EmbeddingKind::kDynamic, CapacityPolicy::kError, false},
                        Case{EmbeddingKind::kDynamic, CapacityPolicy::kError, true},
                        Case{EmbeddingKind::kDynamic, CapacityPolicy::kEvictLru, false},
                        Case{EmbeddingKind::kDynamic, CapacityPolicy::kEvictLru, true}}) {
    EmbeddingTableOptions o = c.kind == EmbeddingKind::kStatic ? StaticOptions(4, 16, 2) : DynamicOptions(4, 16, c.on_full);
    o.row_lock = c.row_lock;
    Region region(EmbeddingTable::BytesFor(o));
    auto t = EmbeddingTable::Create(region.data(), region.size(), o);
    ASSERT_TRUE(t.ok()) << t.status();
    EmbeddingTable::Scratch scratch;
    const uint64_t id = 7;
    std::vector<float> grad(4, 0.5f);
    for (int i = 0; i < 300; ++i) {
      ASSERT_TRUE(t->Push({&id, 1}, grad.data(), Optimizer(OptimizerType::kAdam), 0.01f, &scratch).ok());
    }
    std::vector<float> params(4), m(4), v(4);
    float* slots[] = {m.data(), v.data()};
    uint64_t count = 0;
    ASSERT_TRUE(t->ReadRowState(id, params.data(), slots, &count).ok());
    EXPECT_EQ(count, 300u) << "kind " << static_cast<int>(c.kind) << " lru " << (c.on_full == CapacityPolicy::kEvictLru)
                           << " row_lock " << c.row_lock;
    // A checkpoint import sets it; the next push continues from there.
    ASSERT_TRUE(t->WriteRowState(id, params.data(), {m.data(), v.data()}, 1000).ok());
    ASSERT_TRUE(t->Push({&id, 1}, grad.data(), Optimizer(OptimizerType::kAdam), 0.01f, &scratch).ok());
    ASSERT_TRUE(t->ReadRowState(id, params.data(), slots, &count).ok());
    EXPECT_EQ(count, 1001u);
    // SGD does not count.
    ASSERT_TRUE(t->Push({&id, 1}, grad.data(), Optimizer(OptimizerType::kSgd), 0.01f, &scratch).ok());
    ASSERT_TRUE(t->ReadRowState(id, params.data(), slots, &count).ok());
    EXPECT_EQ(count, 1001u);
  }
}

// Every row layout the checkpoint's block export and import handle: static
// rows that hold only their parameters (one copy for a block), with slots
// and counts, bf16, under row_lock, and dynamic tables (kError, LRU), each
// with the optimizer its slots are for (none: SGD, 1: Adagrad, 2: Adam).
OptimizerType TypeOf(const EmbeddingTableOptions& o) {
  return o.num_slots == 0 ? OptimizerType::kSgd : o.num_slots == 1 ? OptimizerType::kAdagrad : OptimizerType::kAdam;
}
struct RowLayoutCase {
  const char* name;
  EmbeddingTableOptions options;
};
std::vector<RowLayoutCase> RowLayoutCases() {
  std::vector<RowLayoutCase> cases;
  cases.push_back({"static f32, params only", StaticOptions(4, 300, 0)});
  cases.push_back({"static adam", StaticOptions(3, 300, 2)});
  EmbeddingTableOptions bf16 = StaticOptions(6, 300, 1);
  bf16.bf16 = true;
  cases.push_back({"static bf16 adagrad", bf16});
  EmbeddingTableOptions locked = StaticOptions(4, 300, 2);
  locked.row_lock = true;
  cases.push_back({"static row_lock adam", locked});
  cases.push_back({"dynamic kError", DynamicOptions(4, 300)});
  cases.push_back({"dynamic lru", DynamicOptions(4, 64, CapacityPolicy::kEvictLru)});
  for (RowLayoutCase& c : cases) c.options.SetOptimizer(Optimizer(TypeOf(c.options)));
  return cases;
}

TEST(EmbeddingTableTest, ReadRowsAtGivesWhatReadRowAtGivesRowByRow) {
  // The checkpoint's block export against the row-by-row one, for every row
  // layout (the LRU table read after evictions).
  for (const RowLayoutCase& c : RowLayoutCases()) {
    SCOPED_TRACE(c.name);
    const EmbeddingTableOptions& o = c.options;
    const OptimizerType type = TypeOf(o);
    // Ids pushed before reading (a dynamic table: inserted).
    const int push_ids = o.kind == EmbeddingKind::kStatic ? 150 : 120;
    Region region(EmbeddingTable::BytesFor(o));
    auto t = EmbeddingTable::Create(region.data(), region.size(), o);
    ASSERT_TRUE(t.ok()) << t.status();
    EmbeddingTable::Scratch scratch;
    std::vector<uint64_t> ids;
    for (int i = 0; i < push_ids; ++i) ids.push_back(static_cast<uint64_t>(i) * 37 % 300);
    std::vector<float> grad(ids.size() * o.dim);
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = std::sin(0.37f * static_cast<float>(i));
    const absl::Status pushed = t->Push(ids, grad.data(), Optimizer(type), 0.05f, &scratch);
    ASSERT_TRUE(pushed.ok()) << pushed;
    const int64_t size = t->size();
    const size_t dim = static_cast<size_t>(o.dim);
    // The reference: ReadRowAt row by row, the rows in use packed.
    std::vector<uint64_t> want_ids, want_counts;
    std::vector<float> want_params;
    std::vector<std::vector<float>> want_slots(o.num_slots);
    std::vector<int64_t> in_use_before(size + 1, 0);  // rows in use before row r
    for (int64_t r = 0; r < size; ++r) {
      absl::StatusOr<RowAt> row = ReadRow(*t, r);
      ASSERT_TRUE(row.ok()) << row.status();
      in_use_before[r + 1] = in_use_before[r] + (row->used ? 1 : 0);
      if (!row->used) continue;
      want_ids.push_back(row->id);
      want_counts.push_back(row->count);
      want_params.insert(want_params.end(), row->params.begin(), row->params.end());
      for (int k = 0; k < o.num_slots; ++k) {
        want_slots[k].insert(want_slots[k].end(), row->slots[k].begin(), row->slots[k].end());
      }
    }
    if (o.kind == EmbeddingKind::kStatic) {
      ASSERT_EQ(static_cast<int64_t>(want_ids.size()), size);
    } else {
      ASSERT_GT(want_ids.size(), 0u);
    }
    // Every range of a few shapes: empty, one row, a row short of the end, all.
    for (const auto& [b, e] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 0}, {5, 5}, {0, 1}, {7, 8}, {1, size - 1}, {size / 3, size}, {0, size}}) {
      SCOPED_TRACE(absl::StrCat("rows [", b, ", ", e, ")"));
      const size_t n = static_cast<size_t>(e - b);
      std::vector<uint64_t> got_ids(n, ~uint64_t{0}), got_counts(n, ~uint64_t{0});
      std::vector<float> got_params(n * dim, -1.0f);
      std::vector<std::vector<float>> got_slots(o.num_slots, std::vector<float>(n * dim, -1.0f));
      std::vector<float*> gsl;
      for (auto& v : got_slots) gsl.push_back(v.data());
      absl::StatusOr<int64_t> got = t->ReadRowsAt(b, e, got_ids.data(), got_params.data(), gsl, got_counts.data());
      ASSERT_TRUE(got.ok()) << got.status();
      const int64_t first = in_use_before[b], count = in_use_before[e] - first;
      ASSERT_EQ(*got, count);
      for (int64_t i = 0; i < count; ++i) {
        EXPECT_EQ(got_ids[i], want_ids[first + i]) << i;
        EXPECT_EQ(got_counts[i], want_counts[first + i]) << i;
        for (size_t j = 0; j < dim; ++j) {
          EXPECT_EQ(got_params[i * dim + j], want_params[(first + i) * dim + j]) << i << "," << j;
          for (int k = 0; k < o.num_slots; ++k) {
            EXPECT_EQ(got_slots[k][i * dim + j], want_slots[k][(first + i) * dim + j]) << "slot " << k;
          }
        }
      }
      // Past the rows in use nothing is written.
      for (size_t i = static_cast<size_t>(count); i < n; ++i) EXPECT_EQ(got_ids[i], ~uint64_t{0});
      // Each part on its own (the others nullptr) gives the same values.
      std::vector<float> only_params(n * dim, -1.0f);
      absl::StatusOr<int64_t> again = t->ReadRowsAt(b, e, nullptr, only_params.data(), {}, nullptr);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(*again, count);
      EXPECT_TRUE(std::equal(only_params.begin(), only_params.begin() + count * dim, got_params.begin()));
    }
    // A range outside the rows, backwards, or too many slots: InvalidArgument.
    EXPECT_EQ(t->ReadRowsAt(0, size + 1, nullptr, nullptr, {}, nullptr).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(t->ReadRowsAt(-1, 2, nullptr, nullptr, {}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(t->ReadRowsAt(3, 2, nullptr, nullptr, {}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
    std::vector<float*> too_many(o.num_slots + 1, nullptr);
    EXPECT_TRUE(MessageContains(t->ReadRowsAt(0, 1, nullptr, nullptr, too_many, nullptr).status(), {"slots"}));
  }
}

TEST(EmbeddingTableTest, WriteRowStatesGivesWhatWriteRowStateGivesRowByRow) {
  // The restore's block import against the row-by-row one, for every row
  // layout: two tables alike, one written a range at once, the other id by
  // id, then every row of both read back.
  for (const RowLayoutCase& c : RowLayoutCases()) {
    SCOPED_TRACE(c.name);
    const EmbeddingTableOptions& o = c.options;
    const bool is_static = o.kind == EmbeddingKind::kStatic;
    const size_t dim = static_cast<size_t>(o.dim);
    // Ranges: empty, one row, the last row, most of the table, all of it (a
    // dynamic table: ids [10, 60), within an LRU table's 64 rows).
    const int64_t cap = o.capacity;
    const std::vector<std::pair<uint64_t, int64_t>> ranges =
        is_static ? std::vector<std::pair<uint64_t, int64_t>>{{5, 0}, {7, 1}, {static_cast<uint64_t>(cap - 1), 1},
                                                               {3, cap - 4}, {0, cap}}
                  : std::vector<std::pair<uint64_t, int64_t>>{{5, 0}, {7, 1}, {10, 50}};
    for (const auto& [first, n] : ranges) {
      SCOPED_TRACE(absl::StrCat("ids [", first, ", ", first + static_cast<uint64_t>(n), ")"));
      Region ra(EmbeddingTable::BytesFor(o)), rb(EmbeddingTable::BytesFor(o));
      auto a = EmbeddingTable::Create(ra.data(), ra.size(), o);
      auto b = EmbeddingTable::Create(rb.data(), rb.size(), o);
      ASSERT_TRUE(a.ok() && b.ok());
      const size_t count = static_cast<size_t>(n);
      std::vector<float> params(count * dim);
      for (size_t i = 0; i < params.size(); ++i) params[i] = std::sin(0.731f * static_cast<float>(i) + 0.1f);
      std::vector<std::vector<float>> slot_data(o.num_slots, std::vector<float>(count * dim));
      for (int k = 0; k < o.num_slots; ++k) {
        for (size_t i = 0; i < count * dim; ++i) slot_data[k][i] = 0.5f + std::cos(0.3f * static_cast<float>(i + k));
      }
      std::vector<uint64_t> counts(count);
      for (size_t i = 0; i < count; ++i) counts[i] = 3 + i * 7;
      std::vector<const float*> slots;
      for (auto& v : slot_data) slots.push_back(v.data());
      const absl::Status wrote = a->WriteRowStates(first, n, params.data(), slots, counts.data());
      ASSERT_TRUE(wrote.ok()) << wrote;
      for (size_t i = 0; i < count; ++i) {
        std::vector<const float*> row_slots;
        for (auto& v : slot_data) row_slots.push_back(v.data() + i * dim);
        const absl::Status one = b->WriteRowState(first + i, params.data() + i * dim, row_slots, counts[i]);
        ASSERT_TRUE(one.ok()) << one;
      }
      ASSERT_EQ(a->size(), b->size());
      // Every row of both tables, the written ones and the rest.
      std::vector<uint64_t> read_ids;
      if (is_static) {
        for (int64_t id = 0; id < cap; ++id) read_ids.push_back(static_cast<uint64_t>(id));
      } else {
        for (size_t i = 0; i < count; ++i) read_ids.push_back(first + i);
      }
      for (uint64_t id : read_ids) {
        std::vector<float> pa(dim), pb(dim);
        std::vector<std::vector<float>> sa(o.num_slots, std::vector<float>(dim)), sb = sa;
        std::vector<float*> spa, spb;
        for (int k = 0; k < o.num_slots; ++k) {
          spa.push_back(sa[k].data());
          spb.push_back(sb[k].data());
        }
        uint64_t ca = 0, cb = 0;
        ASSERT_TRUE(a->ReadRowState(id, pa.data(), spa, &ca).ok()) << id;
        ASSERT_TRUE(b->ReadRowState(id, pb.data(), spb, &cb).ok()) << id;
        EXPECT_EQ(ca, cb) << "id " << id;
        for (size_t j = 0; j < dim; ++j) {
          EXPECT_EQ(std::bit_cast<uint32_t>(pa[j]), std::bit_cast<uint32_t>(pb[j])) << "id " << id << ", " << j;
          for (int k = 0; k < o.num_slots; ++k) EXPECT_EQ(sa[k][j], sb[k][j]) << "id " << id << ", slot " << k;
        }
      }
    }
    // Errors: too many slots, no params, and (static) a range past the
    // capacity, which writes nothing.
    Region r(EmbeddingTable::BytesFor(o));
    auto t = EmbeddingTable::Create(r.data(), r.size(), o);
    ASSERT_TRUE(t.ok());
    std::vector<float> three(3 * dim, 1.25f);
    std::vector<const float*> too_many(o.num_slots + 1, three.data());
    EXPECT_EQ(t->WriteRowStates(0, 3, three.data(), too_many, nullptr).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(t->WriteRowStates(0, 3, nullptr, {}, nullptr).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(t->WriteRowStates(0, 0, nullptr, {}, nullptr).ok());
    if (is_static) {
      std::vector<float> before(dim), after(dim);
      ASSERT_TRUE(t->ReadRowState(static_cast<uint64_t>(cap - 2), before.data(), {}, nullptr).ok());
      const absl::Status past = t->WriteRowStates(static_cast<uint64_t>(cap - 2), 3, three.data(), {}, nullptr);
      EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument) << past;
      EXPECT_NE(past.message().find(absl::StrCat(cap)), std::string_view::npos) << past;
      ASSERT_TRUE(t->ReadRowState(static_cast<uint64_t>(cap - 2), after.data(), {}, nullptr).ok());
      EXPECT_EQ(before, after);
    }
  }
}

TEST(EmbeddingTableTest, CreateRejectsShortOrMisalignedRegions) {
  const EmbeddingTableOptions o = StaticOptions(8, 10, 0);
  Region region(EmbeddingTable::BytesFor(o) + 4096);
  auto short_region = EmbeddingTable::Create(region.data(), EmbeddingTable::BytesFor(o) - 1, o);
  EXPECT_EQ(short_region.status().code(), absl::StatusCode::kInvalidArgument);
  auto misaligned = EmbeddingTable::Create(static_cast<char*>(region.data()) + 8, region.size() - 8, o);
  EXPECT_EQ(misaligned.status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- Static tables ---------------------------------------------------------------

TEST(EmbeddingTableTest, StaticRowsStartAtTheirInitialValue) {
  EmbeddingTableOptions o = StaticOptions(5, 100, 0);
  o.init = {RowInitializer::Kind::kNormal, 0, 0, 0.1f};
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 100);
  EXPECT_EQ(t->initializations(), 100);
  const std::vector<uint64_t> ids = {0, 99, 42, 42};
  std::vector<float> out(ids.size() * 5);
  ASSERT_TRUE(t->Pull(ids, out.data()).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(std::vector<float>(out.begin() + 5 * i, out.begin() + 5 * (i + 1)), Initial(o, ids[i])) << ids[i];
  }
}

TEST(EmbeddingTableTest, StaticOutOfRangeIdIsInvalidArgument) {
  const EmbeddingTableOptions o = StaticOptions(4, 10, 0);
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok());
  const std::vector<uint64_t> ids = {1, 10};
  std::vector<float> buf(8, 1.0f);
  const absl::Status pull = t->Pull(ids, buf.data());
  EXPECT_EQ(pull.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(pull, {"static_emb", "id 10", "[0, 10)"}));
  EmbeddingTable::Scratch scratch;
  const absl::Status push = t->Push(ids, buf.data(), Optimizer(OptimizerType::kSgd), 1.0f, &scratch);
  EXPECT_TRUE(MessageContains(push, {"id 10", "[0, 10)"}));
  // Validation comes before any update: row 1 is unchanged.
  EXPECT_EQ(PullOne(*t, 1), Initial(o, 1));
}

// The whole batch is checked at once (CheckIds), and a batch that fails
// names its first bad id: every kind of id out of range, alone and among
// hundreds of good ones (the vectorised test, then the search), and ids
// just inside the range pass.
TEST(EmbeddingTableTest, StaticIdCheckFindsEveryOutOfRangeIdInALongBatch) {
  const EmbeddingTableOptions o = StaticOptions(1, 1000, 0);
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok());
  std::vector<uint64_t> ids(700);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (i * 37) % 1000;
  ids.back() = 999;
  std::vector<float> out(1001);
  ASSERT_TRUE(t->Pull(ids, out.data()).ok());
  constexpr uint64_t kTop = uint64_t{1} << 63;
  for (uint64_t bad : {uint64_t{1000}, uint64_t{1001}, uint64_t{1} << 40, kTop - 1, kTop, kTop + 999, kTop + 1000,
                       ~uint64_t{0}}) {
    for (size_t at : {size_t{0}, size_t{333}, ids.size() - 1}) {
      SCOPED_TRACE(testing::Message() << "id " << bad << " at " << at);
      std::vector<uint64_t> with = ids;
      with[at] = bad;
      for (bool second : {false, true}) {
        if (second) with.push_back(5000);  // a second bad id after it: the first is named
        const absl::Status pull = t->Pull(with, out.data());
        EXPECT_EQ(pull.code(), absl::StatusCode::kInvalidArgument) << second;
        EXPECT_TRUE(MessageContains(pull, {absl::StrCat("id ", bad, " "), "[0, 1000)"})) << second;
      }
    }
  }
}

TEST(EmbeddingTableTest, PushNeedsEnoughSlots) {
  const EmbeddingTableOptions o = StaticOptions(4, 10, 0);
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok());
  const uint64_t id = 1;
  std::vector<float> g(4, 1.0f);
  EmbeddingTable::Scratch scratch;
  const absl::Status s = t->Push({&id, 1}, g.data(), Optimizer(OptimizerType::kAdam), 0.1f, &scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(MessageContains(s, {"adam", "2 slots", "has 0"}));
}

// A reference of row-wise (lazy) SGD and Adam: repeated ids summed in batch
// order, every unique row updated once, Adam's t counted per row.
struct ReferenceTable {
  int64_t dim = 0;
  std::map<uint64_t, std::vector<float>> p, m, v;
  std::map<uint64_t, int64_t> t;

  void Push(const OptimizerOptions& o, float lr, const std::vector<uint64_t>& ids, const std::vector<float>& g) {
    std::vector<uint64_t> order;
    std::map<uint64_t, std::vector<float>> sum;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto [it, fresh] = sum.try_emplace(ids[i], dim, 0.0f);
      if (fresh) order.push_back(ids[i]);
      for (int64_t j = 0; j < dim; ++j) it->second[j] += g[i * dim + j];
    }
    for (uint64_t id : order) {
      std::vector<float>& pp = p.at(id);
      const std::vector<float>& gg = sum[id];
      if (o.type == OptimizerType::kSgd) {
        for (int64_t j = 0; j < dim; ++j) pp[j] -= lr * gg[j];
        continue;
      }
      auto& mm = m.try_emplace(id, dim, 0.0f).first->second;
      auto& vv = v.try_emplace(id, dim, 0.0f).first->second;
      const double step = static_cast<double>(++t[id]);
      const double c2 = std::sqrt(1.0 - std::pow(static_cast<double>(o.beta2), step));
      const double c1 = 1.0 - std::pow(static_cast<double>(o.beta1), step);
      for (int64_t j = 0; j < dim; ++j) {
        mm[j] = o.beta1 * mm[j] + (1 - o.beta1) * gg[j];
        vv[j] = o.beta2 * vv[j] + (1 - o.beta2) * gg[j] * gg[j];
        pp[j] -= static_cast<float>(lr * c2 / c1 * mm[j] / (std::sqrt(vv[j]) + o.epsilon * c2));
      }
    }
  }
};

void CheckPushAgainstReference(OptimizerType type) {
  const int64_t dim = 6, rows = 20;
  const EmbeddingTableOptions o = StaticOptions(dim, rows, 2);
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok());
  ReferenceTable ref;
  ref.dim = dim;
  for (uint64_t id = 0; id < rows; ++id) ref.p[id] = Initial(o, id);
  const OptimizerOptions opt = Optimizer(type);
  std::mt19937_64 rng(1);
  EmbeddingTable::Scratch scratch;
  for (int step = 0; step < 8; ++step) {
    // Ids repeat within a batch, and only some rows are in each batch.
    std::vector<uint64_t> ids;
    for (int i = 0; i < 12; ++i) ids.push_back(rng() % 8 + (step % 2) * 6);
    std::vector<float> g(ids.size() * dim);
    for (float& x : g) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    ASSERT_TRUE(t->Push(ids, g.data(), opt, 0.05f, &scratch).ok());
    ref.Push(opt, 0.05f, ids, g);
  }
  for (uint64_t id = 0; id < rows; ++id) {
    const std::vector<float> got = PullOne(*t, id);
    for (int64_t j = 0; j < dim; ++j) EXPECT_NEAR(got[j], ref.p[id][j], 2e-5) << "id " << id << " elem " << j;
  }
}

TEST(EmbeddingTableTest, StaticPushSgdSumsRepeatedIdsLikeTheReference) {
  CheckPushAgainstReference(OptimizerType::kSgd);
}

TEST(EmbeddingTableTest, StaticPushAdamIsRowWiseLazyLikeTheReference) {
  CheckPushAgainstReference(OptimizerType::kAdam);
}

TEST(EmbeddingTableTest, RepeatedIdIsOneUpdateWithTheSummedGradient) {
  // Adam's first step moves each parameter by about lr * sign(g) whatever |g|
  // is, so one update with 1+2 differs from two updates with 1 and 2.
  const EmbeddingTableOptions o = StaticOptions(1, 2, 2);
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok());
  const std::vector<uint64_t> ids = {1, 1};
  const std::vector<float> g = {1.0f, 2.0f};
  EmbeddingTable::Scratch scratch;
  ASSERT_TRUE(t->Push(ids, g.data(), Optimizer(OptimizerType::kAdam), 0.1f, &scratch).ok());
  EXPECT_NEAR(PullOne(*t, 1)[0], Initial(o, 1)[0] - 0.1f, 1e-6);
  EXPECT_EQ(PullOne(*t, 0), Initial(o, 0));
}

// Push's deduplication at row lengths on both sides of the one where every
// unique id's sum may be kept (16 floats), with gradient rows given and
// not, in batches that grow and shrink through one scratch, mostly of
// repeated ids, one of distinct ids (after which a short row's push keeps
// only the repeats' sums): every row moves by lr times its ids' gradients
// summed in batch order (SGD), and rows not in the batch not at all.
// Enough ids that map entries collide.
TEST(EmbeddingTableTest, PushSumsEveryRepeatedIdsGradientsAtEveryRowLength) {
  for (int64_t dim : {1, 3, 16, 17, 40}) {
    for (bool with_grad_rows : {false, true}) {
      const int64_t rows = 400;
      const EmbeddingTableOptions o = StaticOptions(dim, rows, 0);
      Region region(EmbeddingTable::BytesFor(o));
      auto t = EmbeddingTable::Create(region.data(), region.size(), o);
      ASSERT_TRUE(t.ok());
      std::vector<std::vector<float>> expect(rows);
      for (int64_t id = 0; id < rows; ++id) expect[id] = Initial(o, static_cast<uint64_t>(id));
      const OptimizerOptions opt = Optimizer(OptimizerType::kSgd);
      const float lr = 0.5f;
      std::mt19937_64 rng(static_cast<uint64_t>(dim) * 2 + (with_grad_rows ? 1 : 0));
      EmbeddingTable::Scratch scratch;
      for (int64_t n : {7, 600, 3, -300, 250, 1}) {
        // Ids from a range a bit larger than half the batch (most repeat),
        // or -n distinct ids.
        const bool distinct = n < 0;
        n = std::abs(n);
        std::vector<uint64_t> ids(n);
        for (uint64_t& id : ids) id = rng() % static_cast<uint64_t>(std::min<int64_t>(rows, n / 2 + 2));
        if (distinct) {
          std::iota(ids.begin(), ids.end(), uint64_t{50});
          std::shuffle(ids.begin(), ids.end(), rng);
        }
        std::vector<float> g(n * dim);
        for (float& x : g) x = std::uniform_real_distribution<float>(-1, 1)(rng);
        // With gradient rows, id i's gradient is row perm[i] of a shuffled copy.
        std::vector<uint32_t> perm(n);
        std::iota(perm.begin(), perm.end(), 0u);
        std::shuffle(perm.begin(), perm.end(), rng);
        std::vector<float> shuffled(n * dim);
        for (int64_t i = 0; i < n; ++i) {
          std::copy(g.begin() + i * dim, g.begin() + (i + 1) * dim, shuffled.begin() + perm[i] * dim);
        }
        const absl::Status s = with_grad_rows ? t->Push(ids, shuffled.data(), perm, opt, lr, &scratch)
                                              : t->Push(ids, g.data(), opt, lr, &scratch);
        ASSERT_TRUE(s.ok()) << s;
        std::map<uint64_t, std::vector<float>> sums;
        for (int64_t i = 0; i < n; ++i) {
          auto [it, fresh] = sums.try_emplace(ids[i], g.begin() + i * dim, g.begin() + (i + 1) * dim);
          if (!fresh) {
            for (int64_t j = 0; j < dim; ++j) it->second[j] += g[i * dim + j];
          }
        }
        for (const auto& [id, sum] : sums) {
          for (int64_t j = 0; j < dim; ++j) expect[id][j] -= lr * sum[j];
        }
        for (int64_t id = 0; id < rows; ++id) {
          const std::vector<float> got = PullOne(*t, static_cast<uint64_t>(id));
          for (int64_t j = 0; j < dim; ++j) {
            ASSERT_NEAR(got[j], expect[id][j], 1e-5) << "dim " << dim << " grad rows " << with_grad_rows
                                                     << " batch " << n << " id " << id << " elem " << j;
          }
        }
      }
    }
  }
}

// The push's map places ids by the top bits of a multiply: ids with no low
// bits, ids a power of two apart, and ids that all start at one entry (the
// first or the last, so that the probes wrap) are still summed id by id, in a
// dynamic table (any 64-bit id), at a short row (every sum kept) and a long
// one (only the repeats').
TEST(EmbeddingTableTest, PushSumsRepeatedIdsWhateverTheirBits) {
  // 2^64 / phi, FindEntry's multiplier, and its inverse mod 2^64 (Newton).
  const uint64_t g = 0x9E3779B97F4A7C15ULL;
  uint64_t inverse = g;
  for (int i = 0; i < 6; ++i) inverse *= 2 - g * inverse;
  ASSERT_EQ(g * inverse, 1u);
  const std::vector<std::pair<const char*, std::function<uint64_t(uint64_t)>>> patterns = {
      {"k << 40", [](uint64_t k) { return k << 40; }},
      {"k << 58 | 5", [](uint64_t k) { return k << 58 | 5; }},
      {"k * 4096", [](uint64_t k) { return k * 4096; }},
      {"k * inverse", [inverse](uint64_t k) { return k * inverse; }},
      // id * multiplier = 2^64 - k: all start at the map's last entry and
      // probe on past its end, from entry 0.
      {"-k * inverse", [inverse](uint64_t k) { return (0 - k) * inverse; }},
  };
  for (int64_t dim : {1, 40}) {
    for (const auto& [name, id_of] : patterns) {
      const int64_t distinct = 60;
      const EmbeddingTableOptions o = DynamicOptions(dim, 2 * distinct);
      Region region(EmbeddingTable::BytesFor(o));
      auto t = EmbeddingTable::Create(region.data(), region.size(), o);
      ASSERT_TRUE(t.ok());
      const OptimizerOptions opt = Optimizer(OptimizerType::kSgd);
      std::mt19937_64 rng(static_cast<uint64_t>(dim));
      EmbeddingTable::Scratch scratch;
      std::map<uint64_t, std::vector<float>> expect;
      for (int step = 0; step < 3; ++step) {
        std::vector<uint64_t> ids(500);
        for (uint64_t& id : ids) id = id_of(1 + rng() % distinct);
        std::vector<float> grads(ids.size() * dim);
        for (float& x : grads) x = std::uniform_real_distribution<float>(-1, 1)(rng);
        for (size_t i = 0; i < ids.size(); ++i) {
          // A dynamic row starts at its initial value on its first push.
          auto [it, fresh] = expect.try_emplace(ids[i]);
          if (fresh) it->second = Initial(o, ids[i]);
        }
        std::map<uint64_t, std::vector<float>> sums;
        for (size_t i = 0; i < ids.size(); ++i) {
          std::vector<float>& sum = sums[ids[i]];
          sum.resize(dim, 0.0f);
          for (int64_t j = 0; j < dim; ++j) sum[j] += grads[i * dim + j];
        }
        ASSERT_TRUE(t->Push(ids, grads.data(), opt, 0.5f, &scratch).ok()) << name;
        for (const auto& [id, sum] : sums) {
          for (int64_t j = 0; j < dim; ++j) expect[id][j] -= 0.5f * sum[j];
        }
      }
      ASSERT_EQ(static_cast<int64_t>(expect.size()), distinct) << name;
      for (const auto& [id, want] : expect) {
        const std::vector<float> got = PullOne(*t, id);
        for (int64_t j = 0; j < dim; ++j) {
          ASSERT_NEAR(got[j], want[j], 1e-4) << name << " dim " << dim << " id " << id << " elem " << j;
        }
      }
    }
  }
}

// Which of its two ways a push deduplicates in (a short row's every sum
// kept after a push with repeats, else only the repeats') changes no float:
// two tables pushed the same batches, one through a scratch whose last push
// had repeats and one through a scratch whose last push had none, hold the
// same bits (Adagrad, whose square of the summed gradient shows any other
// sum).
TEST(EmbeddingTableTest, BothDeduplicationsGiveTheSameBits) {
  for (int64_t dim : {1, 4, 16}) {
    const int64_t rows = 64;
    OptimizerOptions opt = Optimizer(OptimizerType::kAdagrad);
    opt.initial_accumulator_value = 0.1f;
    EmbeddingTableOptions o = StaticOptions(dim, rows, 0);
    o.SetOptimizer(opt);
    Region a_region(EmbeddingTable::BytesFor(o)), b_region(EmbeddingTable::BytesFor(o));
    Region primer_region(EmbeddingTable::BytesFor(o));
    auto a = EmbeddingTable::Create(a_region.data(), a_region.size(), o);
    auto b = EmbeddingTable::Create(b_region.data(), b_region.size(), o);
    auto primer = EmbeddingTable::Create(primer_region.data(), primer_region.size(), o);
    ASSERT_TRUE(a.ok() && b.ok() && primer.ok());
    std::mt19937_64 rng(static_cast<uint64_t>(dim));
    EmbeddingTable::Scratch with_repeats, without;
    std::vector<uint64_t> repeated(40, 3), distinct(40);
    std::iota(distinct.begin(), distinct.end(), uint64_t{0});
    const std::vector<float> primer_g(40 * dim, 0.0f);
    for (int step = 0; step < 6; ++step) {
      ASSERT_TRUE(primer->Push(repeated, primer_g.data(), opt, 0.0f, &with_repeats).ok());
      ASSERT_TRUE(primer->Push(distinct, primer_g.data(), opt, 0.0f, &without).ok());
      std::vector<uint64_t> ids(100);
      for (uint64_t& id : ids) id = rng() % 30;
      std::vector<float> g(ids.size() * dim);
      for (float& x : g) x = std::uniform_real_distribution<float>(-1, 1)(rng);
      ASSERT_TRUE(a->Push(ids, g.data(), opt, 0.05f, &with_repeats).ok());
      ASSERT_TRUE(b->Push(ids, g.data(), opt, 0.05f, &without).ok());
    }
    for (uint64_t id = 0; id < static_cast<uint64_t>(rows); ++id) {
      std::vector<float> pa(dim), pb(dim), sa(dim), sb(dim);
      float* slots_a[] = {sa.data()};
      float* slots_b[] = {sb.data()};
      uint64_t count = 0;
      ASSERT_TRUE(a->ReadRowState(id, pa.data(), slots_a, &count).ok());
      ASSERT_TRUE(b->ReadRowState(id, pb.data(), slots_b, &count).ok());
      ASSERT_EQ(std::memcmp(pa.data(), pb.data(), dim * sizeof(float)), 0) << "dim " << dim << " id " << id;
      ASSERT_EQ(std::memcmp(sa.data(), sb.data(), dim * sizeof(float)), 0) << "dim " << dim << " id " << id;
    }
  }
}

TEST(EmbeddingTableTest, SlotsStartAtTheOptimizersInitialValue) {
  OptimizerOptions adagrad = Optimizer(OptimizerType::kAdagrad);
  adagrad.initial_accumulator_value = 0.1f;
  adagrad.epsilon = 1e-7f;
  EmbeddingTableOptions o = DynamicOptions(4, 10);
  o.SetOptimizer(adagrad);
  EXPECT_EQ(o.num_slots, 1);
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok());
  const uint64_t id = 3;
  std::vector<float> g(4, 0.5f);
  EmbeddingTable::Scratch scratch;
  ASSERT_TRUE(t->Push({&id, 1}, g.data(), adagrad, 0.1f, &scratch).ok());
  // a = 0.1 + 0.25;  p -= 0.1 * 0.5 / (sqrt(a) + eps)
  const std::vector<float> got = PullOne(*t, id), init = Initial(o, id);
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(got[j], init[j] - 0.05f / (std::sqrt(0.35f) + 1e-7f), 1e-6);

  // A table sized for adam starts its slots at 0: adagrad would divide by a
  // fresh accumulator of 0, so Push refuses it.
  EmbeddingTableOptions a = DynamicOptions(4, 10);
  a.SetOptimizer(Optimizer(OptimizerType::kAdam));
  Region region2(EmbeddingTable::BytesFor(a));
  auto t2 = EmbeddingTable::Create(region2.data(), region2.size(), a);
  ASSERT_TRUE(t2.ok());
  const absl::Status s = t2->Push({&id, 1}, g.data(), adagrad, 0.1f, &scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(MessageContains(s, {"adagrad", "slot 0", "SetOptimizer"}));
  EXPECT_EQ(t2->size(), 0);
}

// ---- Initializers -----------------------------------------------------------------

TEST(EmbeddingTableTest, InitialValuesDependOnlyOnSeedTableAndId) {
  EmbeddingTableOptions a = DynamicOptions(16, 1000);
  a.init = {RowInitializer::Kind::kTruncatedNormal, 0, 0, 0.5f};
  EmbeddingTableOptions b = a;
  b.table_id = a.table_id + 1;
  EmbeddingTableOptions c = a;
  c.seed = a.seed + 1;
  EXPECT_EQ(Initial(a, 77), Initial(a, 77));
  EXPECT_NE(Initial(a, 77), Initial(b, 77));
  EXPECT_NE(Initial(a, 77), Initial(c, 77));
  EXPECT_NE(Initial(a, 77), Initial(a, 78));

  // Two dynamic tables filled in opposite orders, one of them by 3 threads,
  // hold the same rows; a static table with the same seed and id agrees.
  Region r1(EmbeddingTable::BytesFor(a)), r2(EmbeddingTable::BytesFor(a));
  auto t1 = EmbeddingTable::Create(r1.data(), r1.size(), a);
  auto t2 = EmbeddingTable::Create(r2.data(), r2.size(), a);
  ASSERT_TRUE(t1.ok() && t2.ok());
  std::vector<uint64_t> ids(600);
  std::iota(ids.begin(), ids.end(), uint64_t{1} << 40);
  std::vector<float> out(ids.size() * 16);
  ASSERT_TRUE(t1->Pull(ids, out.data()).ok());
  std::vector<std::thread> threads;
  for (int k = 0; k < 3; ++k) {
    threads.emplace_back([&, k] {
      std::vector<uint64_t> mine(ids.rbegin(), ids.rend());
      std::rotate(mine.begin(), mine.begin() + 200 * k, mine.end());
      std::vector<float> o2(mine.size() * 16);
      EXPECT_TRUE(t2->Pull(mine, o2.data()).ok());
    });
  }
  for (auto& th : threads) th.join();
  for (uint64_t id : ids) EXPECT_EQ(PullOne(*t1, id), PullOne(*t2, id));
  EXPECT_EQ(PullOne(*t1, ids[5]), Initial(a, ids[5]));

  EmbeddingTableOptions s = a;
  s.kind = EmbeddingKind::kStatic;
  s.capacity = 10;
  Region r3(EmbeddingTable::BytesFor(s));
  auto t3 = EmbeddingTable::Create(r3.data(), r3.size(), s);
  ASSERT_TRUE(t3.ok());
  EXPECT_EQ(PullOne(*t3, 7), Initial(a, 7));
}

struct Moments {
  double mean = 0, stddev = 0, min = 1e30, max = -1e30;
};

Moments Sample(const RowInitializer& init, int rows, int64_t dim) {
  EmbeddingTableOptions o = DynamicOptions(dim, 1);
  o.init = init;
  std::vector<float> v(dim);
  double s = 0, s2 = 0;
  Moments m;
  for (int id = 0; id < rows; ++id) {
    InitialRowValue(o, id, v.data());
    for (float x : v) {
      s += x;
      s2 += static_cast<double>(x) * x;
      m.min = std::min<double>(m.min, x);
      m.max = std::max<double>(m.max, x);
    }
  }
  const double n = static_cast<double>(rows) * dim;
  m.mean = s / n;
  m.stddev = std::sqrt(s2 / n - m.mean * m.mean);
  return m;
}

TEST(EmbeddingTableTest, InitializerDistributionsHaveTheirRangeAndMoments) {
  const Moments z = Sample({RowInitializer::Kind::kZeros, 0, 0, 0}, 100, 8);
  EXPECT_EQ(z.min, 0.0);
  EXPECT_EQ(z.max, 0.0);

  const Moments u = Sample({RowInitializer::Kind::kUniform, -0.5f, 1.5f, 0}, 2000, 50);
  EXPECT_GE(u.min, -0.5);
  EXPECT_LE(u.max, 1.5);
  EXPECT_NEAR(u.mean, 0.5, 0.01);
  EXPECT_NEAR(u.stddev, 2.0 / std::sqrt(12.0), 0.01);

  const Moments n = Sample({RowInitializer::Kind::kNormal, 0, 0, 0.2f}, 2000, 50);
  EXPECT_NEAR(n.mean, 0.0, 0.005);
  EXPECT_NEAR(n.stddev, 0.2, 0.004);
  EXPECT_GT(n.max, 0.2 * 3.0);  // tails exist

  // Truncated at 2 stddev: |x| <= 0.4 and the standard deviation shrinks to
  // 0.8796 of the untruncated one.
  const Moments t = Sample({RowInitializer::Kind::kTruncatedNormal, 0, 0, 0.2f}, 2000, 50);
  EXPECT_GE(t.min, -0.4f);
  EXPECT_LE(t.max, 0.4f);
  EXPECT_NEAR(t.mean, 0.0, 0.005);
  EXPECT_NEAR(t.stddev, 0.2 * 0.8796, 0.004);
}

// ---- Dynamic tables ----------------------------------------------------------------------

TEST(EmbeddingTableTest, DynamicPullInsertsAndReadOnlyPullDoesNot) {
  const EmbeddingTableOptions o = DynamicOptions(8, 100);
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok());
  const uint64_t big = 0xfedcba9876543210ULL;
  EXPECT_EQ(PullOne(*t, big, PullMode::kReadOnly), Initial(o, big));
  EXPECT_EQ(t->size(), 0);
  EXPECT_EQ(PullOne(*t, big, PullMode::kInsert), Initial(o, big));
  EXPECT_EQ(t->size(), 1);
  EXPECT_GE(t->RowOfForTest(big), 0);
  EXPECT_EQ(t->RowOfForTest(big + 1), -1);

  // Push inserts a missing id, then updates it.
  const uint64_t id = 0;
  std::vector<float> g(8, 1.0f);
  EmbeddingTable::Scratch scratch;
  ASSERT_TRUE(t->Push({&id, 1}, g.data(), Optimizer(OptimizerType::kSgd), 0.5f, &scratch).ok());
  EXPECT_EQ(t->size(), 2);
  std::vector<float> want = Initial(o, 0);
  for (float& x : want) x -= 0.5f;
  EXPECT_EQ(PullOne(*t, 0), want);

  const uint64_t reserved = EmbeddingTable::kReservedId;
  std::vector<float> out(8);
  EXPECT_TRUE(MessageContains(t->Pull({&reserved, 1}, out.data()), {"reserved"}));
  EXPECT_TRUE(t->CheckConsistencyForTest().ok());
}

TEST(EmbeddingTableTest, ConcurrentInsertsGiveEveryIdExactlyOneRow) {
  constexpr int kIds = 20000;
  constexpr int kThreads = 4;
  const EmbeddingTableOptions o = DynamicOptions(4, kIds);
  Region region(EmbeddingTable::BytesFor(o));
  auto created = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(created.ok());
  EmbeddingTable& t = *created;
  // Ids spread over the 64-bit space, so neighbours do not share home slots.
  std::vector<uint64_t> ids(kIds);
  for (int i = 0; i < kIds; ++i) ids[i] = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      std::vector<uint64_t> mine = ids;
      std::shuffle(mine.begin(), mine.end(), std::mt19937_64(k));
      // Half the batches pull, half push, so both insert paths race.
      EmbeddingTable::Scratch scratch;
      std::vector<float> buf(64 * 4, 0.0f);
      for (size_t b = 0; b < mine.size(); b += 64) {
        const size_t n = std::min<size_t>(64, mine.size() - b);
        const absl::Span<const uint64_t> batch(mine.data() + b, n);
        const absl::Status s = (b / 64 + k) % 2 == 0
                                   ? t.Pull(batch, buf.data())
                                   : t.Push(batch, buf.data(), Optimizer(OptimizerType::kSgd), 0.0f, &scratch);
        if (!s.ok()) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(t.size(), kIds);
  EXPECT_EQ(t.initializations(), kIds);  // no row was initialised twice
  const absl::Status consistent = t.CheckConsistencyForTest();
  EXPECT_TRUE(consistent.ok()) << consistent;
  std::vector<bool> row_used(kIds, false);
  for (int i = 0; i < kIds; i += 1) {
    const int64_t row = t.RowOfForTest(ids[i]);
    ASSERT_GE(row, 0);
    ASSERT_LT(row, kIds);
    EXPECT_FALSE(row_used[row]);
    row_used[row] = true;
    if (i % 97 == 0) {
      EXPECT_EQ(PullOne(t, ids[i]), Initial(o, ids[i]));
    }
  }
}

// Two threads insert the same id into a table with room for one row, at the
// same moment, over many fresh tables. Both may promise themselves the one
// row (`reserved` reaches the capacity) before either claims the id's index
// slot; the one that then finds no room must wait for the other's insert,
// not report the table full.
TEST(EmbeddingTableTest, RivalInsertsOfOneIdIntoTheLastRowNeverSeeAFullTable) {
  constexpr int kTables = 4000;
  const EmbeddingTableOptions o = DynamicOptions(4, 1);
  const size_t bytes = EmbeddingTable::BytesFor(o);
  std::vector<std::unique_ptr<Region>> regions;
  std::vector<EmbeddingTable> tables;
  for (int i = 0; i < kTables; ++i) {
    regions.push_back(std::make_unique<Region>(bytes));
    auto t = EmbeddingTable::Create(regions.back()->data(), bytes, o);
    ASSERT_TRUE(t.ok()) << t.status();
    tables.push_back(*t);
  }
  const uint64_t id = 0x9e3779b97f4a7c15ULL;
  std::atomic<int> arrived{0};
  std::string errors[2];
  auto insert_all = [&](int k) {
    std::vector<float> out(4);
    for (int i = 0; i < kTables; ++i) {
      // Both threads start table i together.
      arrived.fetch_add(1);
      while (arrived.load() < 2 * (i + 1)) std::this_thread::yield();
      const absl::Status st = tables[i].Pull({&id, 1}, out.data());
      if (!st.ok() && errors[k].empty()) errors[k] = absl::StrCat("table ", i, ": ", st.ToString());
    }
  };
  std::thread other(insert_all, 1);
  insert_all(0);
  other.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  for (int i = 0; i < kTables; ++i) {
    ASSERT_EQ(tables[i].size(), 1) << i;
    ASSERT_EQ(tables[i].initializations(), 1) << i;
  }
  // A second id finds the table really full.
  const uint64_t extra = 7;
  std::vector<float> out(4);
  EXPECT_EQ(tables[0].Pull({&extra, 1}, out.data()).code(), absl::StatusCode::kResourceExhausted);
}

TEST(EmbeddingTableTest, FullTableWithErrorPolicyIsResourceExhausted) {
  const EmbeddingTableOptions o = DynamicOptions(4, 10);
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok());
  std::vector<uint64_t> ids(10);
  std::iota(ids.begin(), ids.end(), 100);
  std::vector<float> out(11 * 4);
  ASSERT_TRUE(t->Pull(ids, out.data()).ok());
  ASSERT_TRUE(t->Pull(ids, out.data()).ok());  // present ids still work
  const uint64_t extra = 7;
  const absl::Status s = t->Pull({&extra, 1}, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(MessageContains(s, {"dynamic_emb", "capacity of 10"}));
  EXPECT_EQ(t->size(), 10);
  // A read-only pull of a missing id still answers.
  EXPECT_EQ(PullOne(*t, extra, PullMode::kReadOnly), Initial(o, extra));
}

TEST(EmbeddingTableTest, LruEvictsOldRowsAndKeepsRecentlyUsedOnes) {
  constexpr int64_t kCapacity = 1000;
  const EmbeddingTableOptions o = DynamicOptions(4, kCapacity, CapacityPolicy::kEvictLru);
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok());
  // 50 hot ids get a distinctive value by one SGD push of -1000.
  std::vector<uint64_t> hot(50);
  std::iota(hot.begin(), hot.end(), 1'000'000);
  std::vector<float> grads(hot.size() * 4, -1000.0f), out(hot.size() * 4);
  EmbeddingTable::Scratch scratch;
  ASSERT_TRUE(t->Push(hot, grads.data(), Optimizer(OptimizerType::kSgd), 1.0f, &scratch).ok());
  // 200 rounds: touch the hot ids, then 20 new cold ids.
  uint64_t next_cold = 0;
  std::vector<uint64_t> cold(20);
  std::vector<float> cold_out(cold.size() * 4);
  for (int round = 0; round < 200; ++round) {
    ASSERT_TRUE(t->Pull(hot, out.data()).ok());
    for (uint64_t& c : cold) c = next_cold++;
    ASSERT_TRUE(t->Pull(cold, cold_out.data()).ok());
    ASSERT_LE(t->size(), kCapacity);
  }
  EXPECT_EQ(t->size(), kCapacity);
  EXPECT_EQ(t->evictions(), 50 + 200 * 20 - kCapacity);
  EXPECT_EQ(t->initializations(), t->size() + t->evictions());
  for (uint64_t id : hot) {
    const std::vector<float> v = PullOne(*t, id);
    EXPECT_GT(v[0], 900.0f) << "hot id " << id << " was evicted";
  }
  // The oldest cold ids are gone (read as their initial value, not inserted).
  EXPECT_EQ(t->RowOfForTest(0), -1);
  EXPECT_EQ(PullOne(*t, 0), Initial(o, 0));
  const absl::Status consistent = t->CheckConsistencyForTest();
  EXPECT_TRUE(consistent.ok()) << consistent;
}

TEST(EmbeddingTableTest, LruUnderConcurrentChurnStaysConsistent) {
  // 4 threads pull and push ids from a range 4x the capacity, so inserts,
  // evictions, backward shifts and lock-free lookups all race.
  constexpr int64_t kCapacity = 512;
  const EmbeddingTableOptions o = DynamicOptions(8, kCapacity, CapacityPolicy::kEvictLru);
  Region region(EmbeddingTable::BytesFor(o));
  auto created = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(created.ok());
  EmbeddingTable& t = *created;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      std::mt19937_64 rng(k);
      EmbeddingTable::Scratch scratch;
      std::vector<uint64_t> ids(32);
      std::vector<float> buf(32 * 8, 0.01f);
      const OptimizerOptions adam = Optimizer(OptimizerType::kAdam);
      for (int it = 0; it < 300; ++it) {
        for (uint64_t& id : ids) id = rng() % (4 * kCapacity);
        absl::Status s;
        switch (it % 3) {
          case 0: s = t.Pull(ids, buf.data()); break;
          case 1: s = t.Pull(ids, buf.data(), PullMode::kReadOnly); break;
          default: s = t.Push(ids, buf.data(), adam, 0.001f, &scratch); break;
        }
        if (!s.ok()) failures.fetch_add(1);
        for (float& x : buf) x = 0.01f;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(t.size(), kCapacity);
  EXPECT_GT(t.evictions(), 0);
  EXPECT_EQ(t.initializations(), t.size() + t.evictions());
  const absl::Status consistent = t.CheckConsistencyForTest();
  EXPECT_TRUE(consistent.ok()) << consistent;
}

TEST(EmbeddingTableTest, LruEvictionNeverLetsAnUpdateLandOnAnotherIdsRow) {
  // The last two elements of the row of id x start at zero and only ever get
  // gradient (-1, -x) with SGD lr 1, so they always hold (k, k * x). (They
  // are last so that a stale update reaches them as late as possible.)
  // Thread t alone pushes the ids x % 4 == t (no Hogwild overlap between
  // writers), while all threads pull every id and so evict rows under each
  // other's pushes. An update that landed on a row after it was given to
  // another id would break (k, k * x).
  constexpr int64_t kCapacity = 48;
  constexpr uint64_t kIds = 192;
  constexpr int64_t kDim = 128;
  constexpr int kBatch = 8;
  EmbeddingTableOptions o = DynamicOptions(kDim, kCapacity, CapacityPolicy::kEvictLru);
  o.init.kind = RowInitializer::Kind::kZeros;
  Region region(EmbeddingTable::BytesFor(o));
  auto created = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(created.ok());
  EmbeddingTable& t = *created;
  auto holds = [](uint64_t id, const float* row) {
    return row[kDim - 1] == row[kDim - 2] * static_cast<float>(id);
  };
  std::atomic<int> failures{0}, broken{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      std::mt19937_64 rng(100 + k);
      EmbeddingTable::Scratch scratch;
      std::vector<uint64_t> mine(kBatch), any(kBatch);
      std::vector<float> grads(kBatch * kDim, 0.0f), out(kBatch * kDim);
      for (int it = 0; it < 1200; ++it) {
        for (int i = 0; i < kBatch; ++i) {
          mine[i] = (rng() % (kIds / 4)) * 4 + k;
          grads[i * kDim + kDim - 2] = -1.0f;
          grads[i * kDim + kDim - 1] = -static_cast<float>(mine[i]);
          any[i] = rng() % kIds;
        }
        if (!t.Push(mine, grads.data(), Optimizer(OptimizerType::kSgd), 1.0f, &scratch).ok()) failures++;
        if (!t.Pull(any, out.data()).ok()) failures++;
        // Our own ids have no other writer: they must hold exactly.
        if (!t.Pull(mine, out.data()).ok()) failures++;
        for (int i = 0; i < kBatch; ++i) {
          if (!holds(mine[i], &out[i * kDim])) broken++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(broken.load(), 0);
  EXPECT_GT(t.evictions(), 1000);
  for (uint64_t id = 0; id < kIds; ++id) {
    const std::vector<float> row = PullOne(t, id);
    EXPECT_TRUE(holds(id, row.data())) << "id " << id << ": " << row[kDim - 2] << ", " << row[kDim - 1];
  }
  const absl::Status consistent = t.CheckConsistencyForTest();
  EXPECT_TRUE(consistent.ok()) << consistent;
}

// ---- Attach ----------------------------------------------------------------------------------

TEST(EmbeddingTableTest, AttachInASecondMappingSeesTheSameRows) {
  const EmbeddingTableOptions o = DynamicOptions(8, 100);
  const size_t bytes = EmbeddingTable::BytesFor(o);
  const int fd = memfd_create("embedding_table_test", 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  void* m1 = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  void* m2 = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(m1, MAP_FAILED);
  ASSERT_NE(m2, MAP_FAILED);
  ASSERT_NE(m1, m2);
  {
    auto a = EmbeddingTable::Create(m1, bytes, o);
    ASSERT_TRUE(a.ok());
    auto b = EmbeddingTable::Attach(m2, bytes);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->options().name, o.name);
    EXPECT_EQ(b->dim(), 8);
    EXPECT_EQ(b->capacity(), 100);
    EXPECT_EQ(b->kind(), EmbeddingKind::kDynamic);
    const uint64_t id = 12345;
    std::vector<float> g(8, 2.0f);
    EmbeddingTable::Scratch scratch;
    ASSERT_TRUE(a->Push({&id, 1}, g.data(), Optimizer(OptimizerType::kSgd), 1.0f, &scratch).ok());
    std::vector<float> want = Initial(o, id);
    for (float& x : want) x -= 2.0f;
    EXPECT_EQ(PullOne(*b, id), want);
    // And back: b inserts, a sees one row for the id.
    EXPECT_EQ(PullOne(*b, 99, PullMode::kInsert), Initial(o, 99));
    EXPECT_EQ(a->size(), 2);
    EXPECT_EQ(a->RowOfForTest(99), b->RowOfForTest(99));
  }
  munmap(m1, bytes);
  munmap(m2, bytes);
}

// Exit codes of the forked child (it runs no gtest assertions).
constexpr int kChildOk = 0;
constexpr int kChildAttachFailed = 10;
constexpr int kChildWrongRow = 11;
constexpr int kChildPushFailed = 12;

TEST(EmbeddingTableTest, AttachInAForkedProcessSharesRows) {
  const EmbeddingTableOptions o = StaticOptions(16, 64, 2);
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok());
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto c = EmbeddingTable::Attach(region.data(), region.size());
    if (!c.ok()) _exit(kChildAttachFailed);
    std::vector<float> row(16);
    const uint64_t id = 5;
    if (!c->Pull({&id, 1}, row.data()).ok() || row != Initial(o, 5)) _exit(kChildWrongRow);
    std::vector<float> g(16, 1.0f);
    EmbeddingTable::Scratch scratch;
    if (!c->Push({&id, 1}, g.data(), Optimizer(OptimizerType::kAdam), 0.01f, &scratch).ok()) _exit(kChildPushFailed);
    _exit(kChildOk);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), kChildOk);
  // The child's Adam step (t = 1, g = 1) moved every element by about -lr.
  const std::vector<float> got = PullOne(*t, 5), init = Initial(o, 5);
  for (int j = 0; j < 16; ++j) EXPECT_NEAR(got[j], init[j] - 0.01f, 1e-6);
}

TEST(EmbeddingTableTest, AttachRejectsACorruptedHeader) {
  const EmbeddingTableOptions o = DynamicOptions(8, 100);
  const size_t bytes = EmbeddingTable::BytesFor(o);
  Region region(bytes);
  ASSERT_TRUE(EmbeddingTable::Create(region.data(), bytes, o).ok());
  auto* base = static_cast<unsigned char*>(region.data());
  ASSERT_TRUE(EmbeddingTable::Attach(base, bytes).ok());

  // Each corruption is undone before the next.
  auto flip = [&](size_t offset) { base[offset] ^= 0x40; };
  flip(0);  // magic
  auto s = EmbeddingTable::Attach(base, bytes);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(MessageContains(s.status(), {"magic"}));
  flip(0);
  flip(8);  // format_version
  EXPECT_TRUE(MessageContains(EmbeddingTable::Attach(base, bytes).status(), {"format_version"}));
  flip(8);
  flip(32);  // dim
  s = EmbeddingTable::Attach(base, bytes);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(MessageContains(s.status(), {"checksum"}));
  flip(32);
  EXPECT_TRUE(EmbeddingTable::Attach(base, bytes).ok());
  EXPECT_EQ(EmbeddingTable::Attach(base, bytes - 64).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EmbeddingTable::Attach(base, 100).status().code(), absl::StatusCode::kInvalidArgument);

  // Zeroed memory was never formatted.
  Region blank(bytes);
  EXPECT_TRUE(MessageContains(EmbeddingTable::Attach(blank.data(), bytes).status(), {"magic", "not created"}));
}

}  // namespace
}  // namespace shardwild

namespace shardwild {
namespace {

// ---- bf16 parameters ----------------------------------------------------------------

std::vector<float> RoundedToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  HogwildCopyFromAsBf16(v.data(), h.data(), static_cast<int64_t>(v.size()));
  std::vector<float> out(v.size());
  HogwildWidenBf16(h.data(), out.data(), static_cast<int64_t>(v.size()));
  return out;
}

// A bf16 table's rows take half the parameter bytes: static SGD of dim 16 is
// 32 bytes a row (f32: 64), Adagrad's f32 slot follows the 32 bytes of
// parameters, and an odd dim pads the parameters to 4 bytes.
TEST(EmbeddingTableBf16Test, RowsHoldHalfTheParameterBytes) {
  EmbeddingTableOptions o = StaticOptions(16, 100, 0);
  o.bf16 = true;
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->bf16());
  EXPECT_EQ(t->params_bytes_per_row(), 32u);
  EXPECT_EQ(t->row_stride(), 32u);
  o.num_slots = 1;
  EXPECT_EQ(EmbeddingTable::BytesFor(o), 4096u + 100u * 96);
  o.dim = 7;
  o.num_slots = 0;
  Region odd(EmbeddingTable::BytesFor(o));
  auto t7 = EmbeddingTable::Create(odd.data(), odd.size(), o);
  ASSERT_TRUE(t7.ok()) << t7.status();
  EXPECT_EQ(t7->params_bytes_per_row(), 16u);
}

// Pull and ReadRowState give the initial values rounded to nearest bf16, as
// f32; WriteRowState rounds to nearest and keeps the slots and count f32;
// Attach reads the flag back.
TEST(EmbeddingTableBf16Test, PullsWidenAndWritesRoundToNearest) {
  for (EmbeddingKind kind : {EmbeddingKind::kStatic, EmbeddingKind::kDynamic}) {
    for (bool row_lock : {false, true}) {
      EmbeddingTableOptions o = kind == EmbeddingKind::kStatic ? StaticOptions(37, 50, 2) : DynamicOptions(37, 50);
      o.bf16 = true;
      o.row_lock = row_lock;
      Region region(EmbeddingTable::BytesFor(o));
      auto t = EmbeddingTable::Create(region.data(), region.size(), o);
      ASSERT_TRUE(t.ok()) << t.status();
      for (uint64_t id : {0u, 7u, 49u}) {
        const std::vector<float> want = RoundedToBf16(Initial(o, id));
        EXPECT_EQ(PullOne(*t, id, PullMode::kInsert), want) << id;
        std::vector<float> p(37), s0(37), s1(37);
        float* slots[2] = {s0.data(), s1.data()};
        ASSERT_TRUE(t->ReadRowState(id, p.data(), slots).ok());
        EXPECT_EQ(p, want);
      }
      std::vector<float> params(37), slot0(37), slot1(37);
      for (int j = 0; j < 37; ++j) {
        params[j] = 0.1f * static_cast<float>(j) + 0.0123456f;
        slot0[j] = 1.0f + 1e-6f * static_cast<float>(j);  // not a bf16 value: must stay f32
        slot1[j] = -2.0f * params[j];
      }
      const float* in_slots[2] = {slot0.data(), slot1.data()};
      ASSERT_TRUE(t->WriteRowState(7, params.data(), in_slots, 5).ok());
      std::vector<float> p(37), s0(37), s1(37);
      float* out_slots[2] = {s0.data(), s1.data()};
      uint64_t count = 0;
      ASSERT_TRUE(t->ReadRowState(7, p.data(), out_slots, &count).ok());
      EXPECT_EQ(p, RoundedToBf16(params));
      EXPECT_EQ(s0, slot0);
      EXPECT_EQ(s1, slot1);
      EXPECT_EQ(count, 5u);
      auto attached = EmbeddingTable::Attach(region.data(), region.size());
      ASSERT_TRUE(attached.ok()) << attached.status();
      EXPECT_TRUE(attached->bf16());
      EXPECT_EQ(PullOne(*attached, 7), RoundedToBf16(params));
    }
  }
}

// Push on bf16 rows, every optimizer, static and dynamic, hogwild and
// row_lock: the slots are exactly the f32 update of the widened row (one
// row at a time, with the row's own Adam step), and the parameters one of
// the two bf16 neighbours of that update's f32 result.
TEST(EmbeddingTableBf16Test, PushIsTheF32UpdateStochasticallyRounded) {
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kAdagrad, OptimizerType::kAdam,
                             OptimizerType::kFtrl}) {
    for (EmbeddingKind kind : {EmbeddingKind::kStatic, EmbeddingKind::kDynamic}) {
      for (bool row_lock : {false, true}) {
        SCOPED_TRACE(absl::StrCat(OptimizerTypeName(type), " ", EmbeddingKindName(kind), row_lock ? " row_lock" : ""));
        const OptimizerOptions opt = Optimizer(type);
        EmbeddingTableOptions o = kind == EmbeddingKind::kStatic ? StaticOptions(20, 64, 0) : DynamicOptions(20, 64);
        o.SetOptimizer(opt);
        o.bf16 = true;
        o.row_lock = row_lock;
        Region region(EmbeddingTable::BytesFor(o));
        auto t = EmbeddingTable::Create(region.data(), region.size(), o);
        ASSERT_TRUE(t.ok()) << t.status();
        EmbeddingTable::Scratch scratch;
        const std::vector<uint64_t> ids = {3, 9, 3, 40};
        for (int step = 1; step <= 3; ++step) {
          // The state before, per unique id, and the summed gradients.
          const std::vector<uint64_t> unique = {3, 9, 40};
          std::vector<std::vector<float>> p(3, std::vector<float>(20)), s(6, std::vector<float>(20));
          std::vector<uint64_t> count(3);
          for (int u = 0; u < 3; ++u) {
            std::vector<float*> slots;
            for (int k = 0; k < o.num_slots; ++k) slots.push_back(s[2 * u + k].data());
            ASSERT_TRUE(t->ReadRowState(unique[u], p[u].data(), slots, &count[u]).ok() ||
                        (kind == EmbeddingKind::kDynamic && step == 1));
            if (kind == EmbeddingKind::kDynamic && step == 1) {
              p[u] = RoundedToBf16(Initial(o, unique[u]));
              for (int k = 0; k < o.num_slots; ++k) s[2 * u + k].assign(20, o.slot_init[k]);
              count[u] = 0;
            }
          }
          std::vector<float> g(4 * 20);
          for (size_t i = 0; i < g.size(); ++i) g[i] = 0.05f * std::sin(0.7f * static_cast<float>(i) + step);
          ASSERT_TRUE(t->Push(ids, g.data(), opt, 0.1f, &scratch).ok());
          for (int u = 0; u < 3; ++u) {
            std::vector<float> grad(g.begin() + (u == 0 ? 0 : u == 1 ? 20 : 60),
                                    g.begin() + (u == 0 ? 20 : u == 1 ? 40 : 80));
            if (u == 0) {
              for (int j = 0; j < 20; ++j) grad[j] += g[40 + j];  // id 3 twice: summed in batch order
            }
            float* slots[2] = {s[2 * u].data(), s[2 * u + 1].data()};
            UpdateParams up{0.1f, static_cast<int64_t>(count[u] + 1)};
            ApplyUpdate(opt, up, p[u].data(), slots, grad.data(), 20);
            std::vector<float> got(20), gs0(20), gs1(20);
            std::vector<float*> got_slots = {gs0.data(), gs1.data()};
            got_slots.resize(o.num_slots);
            ASSERT_TRUE(t->ReadRowState(unique[u], got.data(), got_slots).ok());
            for (int k = 0; k < o.num_slots; ++k) {
              EXPECT_EQ(std::vector<float>(got_slots[k], got_slots[k] + 20), s[2 * u + k]) << "id " << unique[u];
            }
            for (int j = 0; j < 20; ++j) {
              const uint32_t want = std::bit_cast<uint32_t>(p[u][j]) >> 16;
              const uint32_t bits = std::bit_cast<uint32_t>(got[j]);
              ASSERT_EQ(bits & 0xFFFFu, 0u);
              ASSERT_TRUE((bits >> 16) == want || (bits >> 16) == want + 1)
                  << "id " << unique[u] << " element " << j << ": " << got[j] << " vs f32 " << p[u][j];
            }
          }
        }
      }
    }
  }
}

// Stochastic rounding keeps updates far below a bf16 step: 200 SGD steps of
// 1e-4 each on parameters near 1 (bf16 step 2^-7 ~ 0.0078, so each step is
// 1/78 of one) move them by about 0.02, where round-to-nearest would leave
// them where they were.
TEST(EmbeddingTableBf16Test, SmallUpdatesAccumulateInExpectation) {
  EmbeddingTableOptions o = StaticOptions(64, 4, 0);
  o.init.kind = RowInitializer::Kind::kUniform;
  o.init.a = 1.0f;
  o.init.b = 1.0000001f;
  o.bf16 = true;
  Region region(EmbeddingTable::BytesFor(o));
  auto t = EmbeddingTable::Create(region.data(), region.size(), o);
  ASSERT_TRUE(t.ok()) << t.status();
  EmbeddingTable::Scratch scratch;
  const std::vector<float> g(64, 1e-3f);
  const uint64_t id = 2;
  for (int step = 0; step < 200; ++step) {
    ASSERT_TRUE(t->Push({&id, 1}, g.data(), Optimizer(OptimizerType::kSgd), 0.1f, &scratch).ok());
  }
  const std::vector<float> v = PullOne(*t, id);
  double mean = 0;
  for (float x : v) mean += x;
  mean /= 64;
  EXPECT_NEAR(mean, 1.0 - 200 * 1e-4, 0.004);
}

}  // namespace
}  // namespace shardwild
