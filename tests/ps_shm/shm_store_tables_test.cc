// Embedding tables inside ShmParamStore: PullRows / PushRows across shards
// against a straightforward reference, attach from another process, the
// separate sparse optimizer and the memory summary.
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <numeric>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/base/sanitizers.h"
#include "core/model/optimizer.h"
#include "core/config/options.h"
#include "gtest/gtest.h"
#include "ps_shm/embedding_table.h"
#include "ps_shm/param_store.h"
#include "ps_shm/shard_format.h"
#include "ps_shm/shm_segment.h"
#include "ps_shm/shm_store.h"

// Allocation counting for the steady-state test: operator new is replaced
// (malloc-backed) and counts while the calling thread asks it to. Sanitizers
// interpose the allocator themselves, so that test is skipped under them.

#ifndef SHARDWILD_SANITIZED
namespace {
thread_local bool t_count_allocations = false;
thread_local int64_t t_allocations = 0;
}  // namespace

[[gnu::noinline]] void* operator new(std::size_t n) {
  if (t_count_allocations) ++t_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// Not inlined, so the compiler does not pair malloc with operator delete.
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace shardwild {
namespace {

constexpr int64_t kDim = 8;
constexpr int kShards = 3;

OptimizerOptions Optimizer(OptimizerType type, float lr) {
  OptimizerOptions o;
  o.type = type;
  o.lr = lr;
  return o;
}

TableSpec Table(EmbeddingKind kind, int64_t capacity) {
  TableSpec t;
  t.name = "emb";
  t.kind = kind;
  t.dim = kDim;
  t.capacity = capacity;
  return t;
}

OpenStoreOptions Options(const OptimizerOptions& opt, std::vector<TableSpec> tables, int shards = kShards) {
  OpenStoreOptions o;
  o.store.job_name = "sw-tables-test";
  o.store.huge_pages = HugePagePolicy::kOff;
  o.optimizer = opt;
  o.num_shards = shards;
  o.seed = 99;
  o.tables = std::move(tables);
  return o;
}

std::unique_ptr<ShmParamStore> MakeStore(const OpenStoreOptions& o, std::vector<VariableSpec> vars = {}) {
  absl::StatusOr<std::unique_ptr<ShmParamStore>> st = ShmParamStore::Create(o, std::move(vars));
  EXPECT_TRUE(st.ok()) << st.status();
  return st.ok() ? std::move(*st) : nullptr;
}

// The reference: every row's params and slots in a plain map, updated by
// summing a batch's repeated ids in batch order and applying core's kernel
// once per unique id.
struct Reference {
  OptimizerOptions opt;
  std::map<uint64_t, std::vector<float>> params;
  std::map<uint64_t, std::vector<std::vector<float>>> slots;

  void AddRow(uint64_t id, const float* initial) {
    params[id].assign(initial, initial + kDim);
    std::vector<std::vector<float>>& s = slots[id];
    s.assign(NumSlots(opt.type), std::vector<float>(kDim));
    for (int k = 0; k < NumSlots(opt.type); ++k) s[k].assign(kDim, SlotInitialValue(opt, k));
  }

  void Push(const std::vector<uint64_t>& ids, const std::vector<float>& grads, float lr) {
    std::vector<uint64_t> order;
    std::map<uint64_t, std::vector<float>> sums;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto [it, fresh] = sums.try_emplace(ids[i], std::vector<float>(kDim, 0.0f));
      if (fresh) {
        order.push_back(ids[i]);
        std::copy(grads.begin() + i * kDim, grads.begin() + (i + 1) * kDim, it->second.begin());
      } else {
        for (int64_t j = 0; j < kDim; ++j) it->second[j] += grads[i * kDim + j];
      }
    }
    for (uint64_t id : order) {
      float* s[4] = {};
      for (int k = 0; k < NumSlots(opt.type); ++k) s[k] = slots[id][k].data();
      ApplyUpdate(opt, UpdateParams{lr, 1}, params[id].data(), s, sums[id].data(), kDim);
    }
  }
};

std::vector<uint64_t> Keys(const Reference& ref) {
  std::vector<uint64_t> ids;
  for (const auto& [id, row] : ref.params) ids.push_back(id);
  return ids;
}

using Case = std::tuple<EmbeddingKind, OptimizerType>;

class TablesMatchReference : public ::testing::TestWithParam<Case> {};

TEST_P(TablesMatchReference, PullAndPushAcrossShards) {
  const auto [kind, type] = GetParam();
  const OptimizerOptions opt = Optimizer(type, 0.05f);
  const int64_t capacity = 500;
  std::unique_ptr<ShmParamStore> store = MakeStore(Options(opt, {Table(kind, capacity)}));
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->layout().tables.size(), 1u);

  // The ids the test uses: every static id; 300 random 64-bit dynamic ids.
  std::mt19937_64 rng(5);
  std::vector<uint64_t> universe;
  if (kind == EmbeddingKind::kStatic) {
    for (int64_t i = 0; i < capacity; ++i) universe.push_back(static_cast<uint64_t>(i));
  } else {
    for (int i = 0; i < 300; ++i) universe.push_back(rng() >> 1);
  }
  // Every shard gets some rows.
  std::vector<int> per_shard(kShards, 0);
  for (int s = 0; s < kShards; ++s) per_shard[s] = static_cast<int>(store->table_shard(0, s).size());

  RowScratch scratch;
  std::vector<float> initial(universe.size() * kDim);
  ASSERT_TRUE(store->PullRows(0, universe, initial.data(), PullMode::kInsert, &scratch).ok());
  // Pulling without scratch reads the same rows.
  std::vector<float> again(universe.size() * kDim);
  ASSERT_TRUE(store->PullRows(0, universe, again.data(), PullMode::kReadOnly, nullptr).ok());
  EXPECT_EQ(initial, again);
  if (kind == EmbeddingKind::kDynamic) {
    // Dynamic rows start as a single table with the store's seed draws them.
    EmbeddingTableOptions single;
    single.kind = kind;
    single.dim = kDim;
    single.capacity = 1000;
    single.seed = 99;
    single.table_id = 0;
    std::vector<float> row(kDim);
    for (size_t i = 0; i < universe.size(); ++i) {
      InitialRowValue(single, universe[i], row.data());
      ASSERT_EQ(0, std::memcmp(row.data(), &initial[i * kDim], kDim * sizeof(float))) << "id " << universe[i];
    }
    int64_t held = 0;
    for (int s = 0; s < kShards; ++s) {
      EXPECT_GT(store->table_shard(0, s).size(), 0) << "shard " << s;
      held += store->table_shard(0, s).size();
    }
    EXPECT_EQ(held, static_cast<int64_t>(universe.size()));
  } else {
    for (int s = 0; s < kShards; ++s) EXPECT_GT(per_shard[s], 0);
  }

  Reference ref{opt, {}, {}};
  for (size_t i = 0; i < universe.size(); ++i) ref.AddRow(universe[i], &initial[i * kDim]);

  std::uniform_int_distribution<size_t> pick(0, universe.size() - 1);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (int step = 0; step < 6; ++step) {
    std::vector<uint64_t> batch;
    for (int i = 0; i < 64; ++i) batch.push_back(universe[pick(rng)]);
    for (int i = 0; i < 8; ++i) batch.push_back(batch[i]);  // repeats for sure
    std::vector<float> grads(batch.size() * kDim);
    for (float& g : grads) g = normal(rng);
    const float lr = 0.05f;
    ASSERT_TRUE(store->PushRows(0, batch, grads.data(), lr, &scratch).ok());
    ref.Push(batch, grads, lr);
  }
  const std::vector<uint64_t> ids = Keys(ref);
  std::vector<float> got(ids.size() * kDim);
  ASSERT_TRUE(store->PullRows(0, ids, got.data(), PullMode::kReadOnly, &scratch).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int64_t j = 0; j < kDim; ++j) {
      EXPECT_NEAR(got[i * kDim + j], ref.params[ids[i]][j], 1e-6f) << "id " << ids[i] << " element " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KindsAndOptimizers, TablesMatchReference,
                         ::testing::Combine(::testing::Values(EmbeddingKind::kStatic, EmbeddingKind::kDynamic),
                                            ::testing::Values(OptimizerType::kSgd, OptimizerType::kAdagrad)));

TEST(ShmStoreTables, RepeatedIdsAreSummed) {
  const OptimizerOptions sgd = Optimizer(OptimizerType::kSgd, 1.0f);
  for (EmbeddingKind kind : {EmbeddingKind::kStatic, EmbeddingKind::kDynamic}) {
    std::unique_ptr<ShmParamStore> store = MakeStore(Options(sgd, {Table(kind, 100)}));
    ASSERT_NE(store, nullptr);
    RowScratch scratch;
    const std::vector<uint64_t> ids = {7, 8, 7, 7};
    std::vector<float> before(ids.size() * kDim);
    ASSERT_TRUE(store->PullRows(0, ids, before.data(), PullMode::kInsert, &scratch).ok());
    std::vector<float> grads(ids.size() * kDim);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int64_t j = 0; j < kDim; ++j) grads[i * kDim + j] = 0.25f * static_cast<float>(i + 1);
    }
    ASSERT_TRUE(store->PushRows(0, ids, grads.data(), 1.0f, &scratch).ok());
    std::vector<float> after(ids.size() * kDim);
    ASSERT_TRUE(store->PullRows(0, ids, after.data(), PullMode::kReadOnly, &scratch).ok());
    for (int64_t j = 0; j < kDim; ++j) {
      EXPECT_FLOAT_EQ(after[j], before[j] - (0.25f + 0.75f + 1.0f)) << EmbeddingKindName(kind);  // id 7: rows 0, 2, 3
      EXPECT_FLOAT_EQ(after[kDim + j], before[kDim + j] - 0.5f) << EmbeddingKindName(kind);       // id 8
    }
  }
}

// WriteTableRows (the restore's) against WriteTableRow id by id, for ids in
// a checkpoint's order (shard by shard, each in row order: runs of ids S
// apart), shuffled, and with gaps; static and dynamic tables; then an id
// out of range, named, with the ids before it written.
TEST(ShmStoreTables, WriteTableRowsGivesWhatWriteTableRowGivesIdById) {
  const OptimizerOptions adam = Optimizer(OptimizerType::kAdam, 0.01f);
  // SGD's static rows hold only their parameters: a run is one copy.
  for (const auto& [kind, opt] : {std::pair{EmbeddingKind::kStatic, Optimizer(OptimizerType::kSgd, 0.1f)},
                                  std::pair{EmbeddingKind::kStatic, adam}, std::pair{EmbeddingKind::kDynamic, adam}}) {
    const int slots = NumSlots(opt.type);
    const int64_t capacity = 200;
    std::vector<std::pair<std::string, std::vector<uint64_t>>> orders;
    std::vector<uint64_t> by_shard;
    for (int s = 0; s < kShards; ++s) {
      for (uint64_t id = static_cast<uint64_t>(s); id < static_cast<uint64_t>(capacity); id += kShards) {
        by_shard.push_back(id);
      }
    }
    orders.push_back({"shard by shard", by_shard});
    std::vector<uint64_t> shuffled = by_shard;
    std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
    orders.push_back({"shuffled", shuffled});
    std::vector<uint64_t> gaps;
    for (uint64_t id : by_shard) {
      if (id % 7 != 3) gaps.push_back(id);
    }
    orders.push_back({"with gaps", gaps});
    std::vector<uint64_t> ascending(static_cast<size_t>(capacity));  // consecutive ids: each in another shard
    std::iota(ascending.begin(), ascending.end(), uint64_t{0});
    orders.push_back({"ascending", ascending});
    for (const auto& [name, ids] : orders) {
      SCOPED_TRACE(absl::StrCat(kind == EmbeddingKind::kStatic ? "static, " : "dynamic, ", slots, " slots, ", name));
      std::unique_ptr<ShmParamStore> a = MakeStore(Options(opt, {Table(kind, capacity)}));
      std::unique_ptr<ShmParamStore> b = MakeStore(Options(opt, {Table(kind, capacity)}));
      ASSERT_TRUE(a && b);
      const size_t n = ids.size();
      std::vector<float> params(n * kDim);
      for (size_t i = 0; i < params.size(); ++i) params[i] = std::sin(0.17f * static_cast<float>(i));
      std::vector<std::vector<float>> slot_data(slots, std::vector<float>(n * kDim));
      for (int k = 0; k < slots; ++k) {
        for (size_t i = 0; i < n * kDim; ++i) slot_data[k][i] = 1.0f + std::cos(0.29f * static_cast<float>(i) + k);
      }
      std::vector<uint64_t> counts(n);
      for (size_t i = 0; i < n; ++i) counts[i] = 1 + ids[i] * 3;
      std::vector<const float*> sp;
      for (auto& v : slot_data) sp.push_back(v.data());
      const absl::Status wrote = a->WriteTableRows(0, ids, params.data(), sp, counts.data());
      ASSERT_TRUE(wrote.ok()) << wrote;
      for (size_t i = 0; i < n; ++i) {
        std::vector<const float*> row;
        for (auto& v : slot_data) row.push_back(v.data() + i * kDim);
        ASSERT_TRUE(b->WriteTableRow(0, ids[i], params.data() + i * kDim, row, counts[i]).ok());
      }
      for (uint64_t id = 0; id < static_cast<uint64_t>(capacity); ++id) {
        std::vector<float> pa(kDim), pb(kDim);
        std::vector<std::vector<float>> sa(slots, std::vector<float>(kDim)), sb = sa;
        std::vector<float*> spa, spb;
        for (int k = 0; k < slots; ++k) {
          spa.push_back(sa[k].data());
          spb.push_back(sb[k].data());
        }
        uint64_t ca = 0, cb = 0;
        const absl::Status ra = a->ReadTableRow(0, id, pa.data(), spa, &ca);
        const absl::Status rb = b->ReadTableRow(0, id, pb.data(), spb, &cb);
        ASSERT_EQ(ra.code(), rb.code()) << "id " << id << ": " << ra << " / " << rb;
        if (!ra.ok()) continue;  // a dynamic table's id never written
        EXPECT_EQ(ca, cb) << "id " << id;
        EXPECT_EQ(pa, pb) << "id " << id;
        EXPECT_EQ(sa, sb) << "id " << id;
      }
    }
  }
  // A static id out of range in the middle of a run: named; the ids before
  // it are written, the ones after it are not.
  const int slots = NumSlots(adam.type);
  std::unique_ptr<ShmParamStore> store = MakeStore(Options(adam, {Table(EmbeddingKind::kStatic, 30)}));
  ASSERT_TRUE(store);
  const std::vector<uint64_t> ids = {0, 3, 6, 33, 9};
  std::vector<float> params(ids.size() * kDim, 2.5f);
  std::vector<std::vector<float>> slot_data(slots, std::vector<float>(ids.size() * kDim, 0.75f));
  std::vector<const float*> sp;
  for (auto& v : slot_data) sp.push_back(v.data());
  const absl::Status bad = store->WriteTableRows(0, ids, params.data(), sp, nullptr);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_NE(bad.message().find("id 33"), std::string_view::npos) << bad;
  for (uint64_t id : {uint64_t{0}, uint64_t{3}, uint64_t{6}, uint64_t{9}}) {
    std::vector<float> p(kDim);
    ASSERT_TRUE(store->ReadTableRow(0, id, p.data(), {}, nullptr).ok());
    EXPECT_EQ(p[0] == 2.5f, id != 9) << "id " << id;
  }
  EXPECT_EQ(store->WriteTableRows(1, ids, params.data(), sp, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShmStoreTables, OutOfRangeStaticIdIsInvalidArgument) {
  std::unique_ptr<ShmParamStore> store = MakeStore(Options(Optimizer(OptimizerType::kSgd, 0.1f), {Table(EmbeddingKind::kStatic, 10)}));
  ASSERT_NE(store, nullptr);
  RowScratch scratch;
  const std::vector<uint64_t> ids = {1, 10};
  std::vector<float> out(ids.size() * kDim, -7.0f);
  std::vector<float> grads(ids.size() * kDim, 1.0f);
  EXPECT_EQ(store->PullRows(0, ids, out.data(), PullMode::kInsert, &scratch).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->PullRows(0, ids, out.data(), PullMode::kInsert, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out[0], -7.0f) << "nothing is copied on error";
  std::vector<float> before(kDim);
  ASSERT_TRUE(store->PullRows(0, {ids.data(), 1}, before.data(), PullMode::kInsert, &scratch).ok());
  const absl::Status push = store->PushRows(0, ids, grads.data(), 0.1f, &scratch);
  EXPECT_EQ(push.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(push.message()).find("out of range"), std::string::npos) << push;
  std::vector<float> after(kDim);
  ASSERT_TRUE(store->PullRows(0, {ids.data(), 1}, after.data(), PullMode::kInsert, &scratch).ok());
  EXPECT_EQ(before, after) << "no row changes when an id is invalid";
  EXPECT_EQ(store->PullRows(1, ids, out.data(), PullMode::kInsert, &scratch).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShmStoreTables, EveryUpdateModeAcceptsTables) {
  for (UpdateMode mode : {UpdateMode::kHogwild, UpdateMode::kRowLock, UpdateMode::kSync}) {
    OpenStoreOptions o = Options(Optimizer(OptimizerType::kSgd, 0.1f), {Table(EmbeddingKind::kStatic, 10)});
    o.store.update = mode;
    std::unique_ptr<ShmParamStore> store = MakeStore(o);
    ASSERT_NE(store, nullptr) << UpdateModeName(mode);
    EXPECT_EQ(store->table_shard(0, 0).options().row_lock, mode == UpdateMode::kRowLock);
    RowScratch scratch;
    const std::vector<uint64_t> ids = {4};
    std::vector<float> before(kDim), after(kDim), g(kDim, 2.0f);
    ASSERT_TRUE(store->PullRows(0, ids, before.data(), PullMode::kInsert, &scratch).ok());
    ASSERT_TRUE(store->PushRows(0, ids, g.data(), 0.25f, &scratch).ok());
    ASSERT_TRUE(store->PullRows(0, ids, after.data(), PullMode::kInsert, &scratch).ok());
    for (int64_t j = 0; j < kDim; ++j) EXPECT_FLOAT_EQ(after[j], before[j] - 0.5f) << UpdateModeName(mode);
  }
}

// The fused embedding path: static tables under Hogwild SGD hand out the
// rows' addresses across every shard; a write through an address is what
// PullRows reads; an SGD step in place is PushRows' step.
TEST(ShmStoreTables, RowAddressesAreTheStaticRowsUnderHogwildSgd) {
  for (int shards : {1, 2, kShards}) {
    std::unique_ptr<ShmParamStore> store =
        MakeStore(Options(Optimizer(OptimizerType::kSgd, 0.1f), {Table(EmbeddingKind::kStatic, 50)}, shards));
    ASSERT_NE(store, nullptr);
    RowScratch scratch;
    const std::vector<uint64_t> ids = {0, 1, 2, 49, 17, 1};
    std::vector<float*> addresses(ids.size(), nullptr);
    absl::StatusOr<RowsInPlace> in_place = store->RowAddresses(0, ids, addresses.data());
    ASSERT_TRUE(in_place.ok()) << in_place.status();
    ASSERT_EQ(*in_place, RowsInPlace::kReadAndSgd) << shards << " shards";
    EXPECT_EQ(addresses[1], addresses[5]) << "one id, one row";
    std::vector<float> pulled(ids.size() * kDim);
    ASSERT_TRUE(store->PullRows(0, ids, pulled.data(), PullMode::kInsert, &scratch).ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(std::memcmp(addresses[i], pulled.data() + i * kDim, kDim * sizeof(float)), 0) << "id " << ids[i];
    }
    // Each distinct row is distinct memory.
    for (size_t i = 0; i + 1 < 5; ++i) EXPECT_NE(addresses[i], addresses[i + 1]);
    // The same SGD step through the address and through PushRows.
    std::vector<float> g(kDim, 2.0f);
    const std::vector<uint64_t> one = {17};
    ASSERT_TRUE(store->PushRows(0, one, g.data(), 0.25f, &scratch).ok());
    std::vector<float> pushed(kDim);
    ASSERT_TRUE(store->PullRows(0, one, pushed.data(), PullMode::kReadOnly, &scratch).ok());
    for (int64_t j = 0; j < kDim; ++j) EXPECT_EQ(pushed[j], pulled[4 * kDim + j] - 0.25f * 2.0f);
    addresses[3][0] = 123.0f;
    std::vector<float> row49(kDim);
    ASSERT_TRUE(store->PullRows(0, {ids.data() + 3, 1}, row49.data(), PullMode::kReadOnly, &scratch).ok());
    EXPECT_EQ(row49[0], 123.0f);
    // An out-of-range id is an error, as for PullRows, naming the first
    // (past the capacity by one, by 2^63, with the top bit alone, all ones).
    const uint64_t top = uint64_t{1} << 63;
    for (const auto& [bad, first] : std::vector<std::pair<std::vector<uint64_t>, uint64_t>>{
             {{3, 50}, 50}, {{3, 49 + top, 60}, 49 + top}, {{top}, top}, {{7, ~uint64_t{0}, 50}, ~uint64_t{0}}}) {
      const absl::StatusOr<RowsInPlace> r = store->RowAddresses(0, bad, addresses.data());
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << shards << " shards, first bad " << first;
      EXPECT_NE(std::string(r.status().message()).find(absl::StrCat("id ", first, " is out of range")), std::string::npos)
          << r.status();
    }
    EXPECT_EQ(store->RowAddresses(1, ids, addresses.data()).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// Rows under an optimizer with slots are read in place (the parameters a
// pull copies, across every shard) but updated by PushRows; where rows move,
// are locked or wait for a sync round, nothing is handed out.
TEST(ShmStoreTables, RowAddressesAreReadOnlyUnderSlotsAndDeclinedWhereRowsAreNotFree) {
  struct Case {
    const char* what;
    EmbeddingKind kind;
    OptimizerType sparse;
    UpdateMode mode;
    RowsInPlace expected;
  };
  std::vector<Case> cases = {
      {"dynamic table", EmbeddingKind::kDynamic, OptimizerType::kSgd, UpdateMode::kHogwild, RowsInPlace::kNo},
      {"row_lock", EmbeddingKind::kStatic, OptimizerType::kSgd, UpdateMode::kRowLock, RowsInPlace::kNo},
      {"sync", EmbeddingKind::kStatic, OptimizerType::kSgd, UpdateMode::kSync, RowsInPlace::kNo}};
  for (OptimizerType slots : {OptimizerType::kAdagrad, OptimizerType::kMomentum, OptimizerType::kFtrl,
                              OptimizerType::kAdam, OptimizerType::kRmsprop}) {
    cases.push_back({OptimizerTypeName(slots), EmbeddingKind::kStatic, slots, UpdateMode::kHogwild, RowsInPlace::kRead});
  }
  for (const Case& c : cases) {
    for (int shards : {1, kShards}) {
      OpenStoreOptions o = Options(Optimizer(OptimizerType::kSgd, 0.1f), {Table(c.kind, 50)}, shards);
      o.sparse_optimizer = Optimizer(c.sparse, 0.1f);
      o.store.update = c.mode;
      std::unique_ptr<ShmParamStore> store = MakeStore(o);
      ASSERT_NE(store, nullptr) << c.what;
      RowScratch scratch;
      const std::vector<uint64_t> ids = {1, 2, 49, 1};
      std::vector<float*> addresses(ids.size(), nullptr);
      absl::StatusOr<RowsInPlace> in_place = store->RowAddresses(0, ids, addresses.data());
      ASSERT_TRUE(in_place.ok()) << c.what << ": " << in_place.status();
      ASSERT_EQ(*in_place, c.expected) << c.what << ", " << shards << " shards";
      if (c.expected == RowsInPlace::kNo) {
        EXPECT_EQ(addresses[0], nullptr) << c.what << ": nothing written";
        continue;
      }
      // What a pull copies, and after a push (the optimizer's own step, slots
      // and all) what a pull copies then.
      std::vector<float> pulled(ids.size() * kDim);
      ASSERT_TRUE(store->PullRows(0, ids, pulled.data(), PullMode::kInsert, &scratch).ok()) << c.what;
      for (size_t i = 0; i < ids.size(); ++i) {
        ASSERT_EQ(std::memcmp(addresses[i], pulled.data() + i * kDim, kDim * sizeof(float)), 0)
            << c.what << ", id " << ids[i];
      }
      std::vector<float> g(ids.size() * kDim);
      for (size_t i = 0; i < g.size(); ++i) g[i] = 0.5f - 0.125f * static_cast<float>(i % 7);
      ASSERT_TRUE(store->PushRows(0, ids, g.data(), 0.25f, &scratch).ok()) << c.what;
      ASSERT_TRUE(store->PullRows(0, ids, pulled.data(), PullMode::kReadOnly, &scratch).ok()) << c.what;
      for (size_t i = 0; i < ids.size(); ++i) {
        ASSERT_EQ(std::memcmp(addresses[i], pulled.data() + i * kDim, kDim * sizeof(float)), 0)
            << c.what << " after a push, id " << ids[i];
      }
    }
  }
}

// In a forked child: attach, pull the rows the parent pulled, push one gradient.
int AttachingChild(const std::string& name, const OptimizerOptions& dense, const OptimizerOptions& sparse,
                   const std::vector<uint64_t>& ids, const std::vector<float>& expected) {
  absl::StatusOr<std::unique_ptr<ShmParamStore>> st = ShmParamStore::Attach(name, dense, sparse);
  if (!st.ok()) return 10;
  ShmParamStore& store = **st;
  if (store.layout().tables.size() != 2 || store.layout().tables[1].name != "dyn" ||
      store.layout().tables[1].kind != EmbeddingKind::kDynamic) {
    return 11;
  }
  RowScratch scratch;
  for (int t = 0; t < 2; ++t) {
    std::vector<float> got(ids.size() * kDim);
    if (!store.PullRows(t, ids, got.data(), PullMode::kReadOnly, &scratch).ok()) return 12;
    if (std::memcmp(got.data(), expected.data() + t * ids.size() * kDim, got.size() * sizeof(float)) != 0) return 13;
  }
  std::vector<float> grads(kDim, 1.0f);
  for (int t = 0; t < 2; ++t) {
    if (!store.PushRows(t, {ids.data(), 1}, grads.data(), 0.5f, &scratch).ok()) return 14;
  }
  // A wrong sparse optimizer type is refused.
  if (ShmParamStore::Attach(name, dense, Optimizer(OptimizerType::kAdam, 0.1f)).status().code() !=
      absl::StatusCode::kFailedPrecondition) {
    return 15;
  }
  return 0;
}

TEST(ShmStoreTables, AttachFromForkedChildPullsAndPushes) {
  const OptimizerOptions dense = Optimizer(OptimizerType::kAdam, 0.01f);
  const OptimizerOptions sparse = Optimizer(OptimizerType::kSgd, 0.5f);
  OpenStoreOptions o = Options(dense, {Table(EmbeddingKind::kStatic, 50), Table(EmbeddingKind::kDynamic, 50)});
  o.tables[1].name = "dyn";
  o.sparse_optimizer = sparse;
  std::unique_ptr<ShmParamStore> store = MakeStore(o, {VariableSpec{"w", 4, 3}});
  ASSERT_NE(store, nullptr);
  const std::vector<uint64_t> ids = {4, 11, 12, 49, 0};
  std::vector<float> expected(2 * ids.size() * kDim);
  RowScratch scratch;
  for (int t = 0; t < 2; ++t) {
    ASSERT_TRUE(store->PullRows(t, ids, expected.data() + t * ids.size() * kDim, PullMode::kInsert, &scratch).ok());
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(AttachingChild(store->name(), dense, sparse, ids, expected));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "child failed at step " << WEXITSTATUS(status);
  // The child's SGD push (lr 0.5, gradient 1) is visible here.
  for (int t = 0; t < 2; ++t) {
    std::vector<float> row(kDim);
    ASSERT_TRUE(store->PullRows(t, {ids.data(), 1}, row.data(), PullMode::kReadOnly, &scratch).ok());
    for (int64_t j = 0; j < kDim; ++j) EXPECT_FLOAT_EQ(row[j], expected[t * ids.size() * kDim + j] - 0.5f);
  }
}

// Attach stays strict with tables: a table entry that disagrees with shard
// 0, one outside the segment, and a corrupted EmbeddingTable header are each
// refused with FailedPrecondition naming the table.
TEST(ShmStoreTables, AttachRejectsCorruptedTables) {
  const OptimizerOptions sgd = Optimizer(OptimizerType::kSgd, 0.1f);
  std::unique_ptr<ShmParamStore> store = MakeStore(Options(sgd, {Table(EmbeddingKind::kDynamic, 100)}));
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(ShmParamStore::Attach(store->name(), sgd).ok());
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Attach(store->name() + "-s1");
  ASSERT_TRUE(seg.ok()) << seg.status();
  char* base = static_cast<char*>((*seg)->data());
  const auto* h = reinterpret_cast<const ShardHeader*>(base);
  ASSERT_EQ(h->num_tables, 1u);
  auto* te = reinterpret_cast<TableEntry*>(base + sizeof(ShardHeader) + h->num_entries * sizeof(LayoutEntry));
  auto expect_refused = [&](const std::string& what) {
    const absl::Status s = ShmParamStore::Attach(store->name(), sgd).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << what << ": " << s;
    EXPECT_NE(std::string(s.message()).find("emb"), std::string::npos) << what << ": " << s;
  };
  te->dim += 1;
  expect_refused("dim");
  te->dim -= 1;
  te->offset += 4096 * 1000000ULL;
  expect_refused("offset");
  te->offset -= 4096 * 1000000ULL;
  base[te->offset + 40] ^= 1;  // inside the table's own header (its capacity field)
  expect_refused("table header");
  base[te->offset + 40] ^= 1;
  EXPECT_TRUE(ShmParamStore::Attach(store->name(), sgd).ok());
}

TEST(ShmStoreTables, SparseOptimizerIsUsedForTablesDenseForVariables) {
  const OptimizerOptions dense = Optimizer(OptimizerType::kSgd, 0.1f);
  OptimizerOptions sparse = Optimizer(OptimizerType::kAdagrad, 0.5f);
  sparse.initial_accumulator_value = 0.25f;
  OpenStoreOptions o = Options(dense, {Table(EmbeddingKind::kStatic, 30)});
  o.sparse_optimizer = sparse;
  std::unique_ptr<ShmParamStore> store = MakeStore(o, {VariableSpec{"w", 6, 2}});
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->sparse_optimizer().type, OptimizerType::kAdagrad);
  for (int s = 0; s < kShards; ++s) EXPECT_EQ(store->table_shard(0, s).num_slots(), 1);

  // Dense: plain SGD.
  std::vector<float> w0(12), w1(12), g(12, 2.0f);
  ASSERT_TRUE(store->PullVariable(0, w0.data()).ok());
  const DenseGrad dg{0, g.data()};
  ASSERT_TRUE(store->Push({&dg, 1}, 0.1f).ok());
  ASSERT_TRUE(store->PullVariable(0, w1.data()).ok());
  for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(w1[i], w0[i] - 0.1f * 2.0f);

  // Sparse: Adagrad from accumulator 0.25: a = 0.25 + 4 = 4.25, p -= lr g / (sqrt(a) + eps).
  RowScratch scratch;
  const uint64_t id = 17;
  std::vector<float> r0(kDim), r1(kDim), rg(kDim, 2.0f);
  ASSERT_TRUE(store->PullRows(0, {&id, 1}, r0.data(), PullMode::kInsert, &scratch).ok());
  ASSERT_TRUE(store->PushRows(0, {&id, 1}, rg.data(), 0.5f, &scratch).ok());
  ASSERT_TRUE(store->PullRows(0, {&id, 1}, r1.data(), PullMode::kInsert, &scratch).ok());
  for (int64_t j = 0; j < kDim; ++j) {
    EXPECT_NEAR(r1[j], r0[j] - 0.5f * 2.0f / (std::sqrt(4.25f) + sparse.epsilon), 1e-6f);
  }
  // Without a sparse optimizer the tables use the dense one (SGD: no slots).
  std::unique_ptr<ShmParamStore> plain = MakeStore(Options(dense, {Table(EmbeddingKind::kStatic, 30)}));
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->sparse_optimizer().type, OptimizerType::kSgd);
  EXPECT_EQ(plain->table_shard(0, 0).num_slots(), 0);
}

// Once a thread's RowScratch has seen the largest batch, PullRows and
// PushRows allocate nothing (DESIGN.md: the hot path allocates nothing).
TEST(ShmStoreTables, WarmPullAndPushAllocateNothing) {
#ifdef SHARDWILD_SANITIZED
  GTEST_SKIP() << "sanitizers interpose the allocator";
#else
  for (EmbeddingKind kind : {EmbeddingKind::kStatic, EmbeddingKind::kDynamic}) {
    SCOPED_TRACE(EmbeddingKindName(kind));
    std::unique_ptr<ShmParamStore> store = MakeStore(Options(Optimizer(OptimizerType::kAdam, 0.01f), {Table(kind, 5000)}));
    ASSERT_NE(store, nullptr);
    std::mt19937_64 rng(3);
    std::uniform_int_distribution<uint64_t> u(0, 3999);
    std::vector<std::vector<uint64_t>> batches(12, std::vector<uint64_t>(256));
    for (auto& b : batches) {
      for (uint64_t& id : b) id = u(rng);
    }
    std::vector<float> grads(256 * kDim, 0.01f), out(256 * kDim);
    RowScratch scratch;
    // Warm-up: the scratch grows; every dynamic id gets its row.
    for (const auto& b : batches) {
      ASSERT_TRUE(store->PullRows(0, b, out.data(), PullMode::kInsert, &scratch).ok());
      ASSERT_TRUE(store->PushRows(0, b, grads.data(), 0.01f, &scratch).ok());
    }
    // The counter counts.
    t_allocations = 0;
    t_count_allocations = true;
    int* volatile probe = new int(1);
    t_count_allocations = false;
    delete probe;
    ASSERT_EQ(t_allocations, 1);
    t_allocations = 0;
    t_count_allocations = true;
    bool ok = true;
    for (int round = 0; round < 3; ++round) {
      for (const auto& b : batches) {
        ok = ok && store->PullRows(0, b, out.data(), PullMode::kInsert, &scratch).ok();
        ok = ok && store->PushRows(0, b, grads.data(), 0.01f, &scratch).ok();
        ok = ok && store->PullRows(0, b, out.data(), PullMode::kReadOnly, nullptr).ok();
      }
    }
    t_count_allocations = false;
    EXPECT_TRUE(ok);
    EXPECT_EQ(t_allocations, 0);
  }
#endif
}

// Threads pushing and pulling the same dynamic ids across shards: every id
// gets exactly one row, in the shard its hash names.
TEST(ShmStoreTables, ConcurrentPushesAcrossShards) {
  std::unique_ptr<ShmParamStore> store =
      MakeStore(Options(Optimizer(OptimizerType::kAdagrad, 0.01f), {Table(EmbeddingKind::kDynamic, 3000)}));
  ASSERT_NE(store, nullptr);
  std::vector<uint64_t> universe(2000);
  std::mt19937_64 seed_rng(11);
  for (uint64_t& id : universe) id = seed_rng() >> 2;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::uniform_int_distribution<size_t> pick(0, universe.size() - 1);
      RowScratch scratch;
      std::vector<uint64_t> batch(128);
      std::vector<float> grads(batch.size() * kDim, 0.1f), out(batch.size() * kDim);
      for (int step = 0; step < 50; ++step) {
        for (uint64_t& id : batch) id = universe[pick(rng)];
        if (!store->PushRows(0, batch, grads.data(), 0.01f, &scratch).ok()) ++failures;
        if (!store->PullRows(0, batch, out.data(), PullMode::kInsert, &scratch).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  std::vector<uint64_t> all = universe;
  std::vector<float> out(all.size() * kDim);
  RowScratch scratch;
  ASSERT_TRUE(store->PullRows(0, all, out.data(), PullMode::kInsert, &scratch).ok());
  std::sort(all.begin(), all.end());
  const int64_t unique = std::unique(all.begin(), all.end()) - all.begin();
  int64_t held = 0;
  for (int s = 0; s < kShards; ++s) {
    EXPECT_TRUE(store->table_shard(0, s).CheckConsistencyForTest().ok());
    held += store->table_shard(0, s).size();
    EXPECT_EQ(store->table_shard(0, s).initializations(), store->table_shard(0, s).size());
  }
  EXPECT_EQ(held, unique);
}

TEST(ShmStoreTables, MemoryCountsTables) {
  const OptimizerOptions adam = Optimizer(OptimizerType::kAdam, 0.01f);
  OpenStoreOptions without = Options(adam, {});
  std::unique_ptr<ShmParamStore> dense_only = MakeStore(without, {VariableSpec{"w", 10, 4}});
  ASSERT_NE(dense_only, nullptr);
  const ShmParamStore::Memory d = dense_only->memory();
  EXPECT_EQ(d.params, 40u * 4);
  EXPECT_EQ(d.slots, 2u * 40 * 4);

  EXPECT_EQ(ShmParamStore::Create(Options(adam, {Table(EmbeddingKind::kStatic, 100), Table(EmbeddingKind::kDynamic, 90)}),
                                  {VariableSpec{"w", 10, 4}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument)
      << "two tables named alike";
  OpenStoreOptions o = Options(adam, {Table(EmbeddingKind::kStatic, 100), Table(EmbeddingKind::kDynamic, 90)});
  o.tables[1].name = "dyn";
  std::unique_ptr<ShmParamStore> store = MakeStore(o, {VariableSpec{"w", 10, 4}});
  ASSERT_NE(store, nullptr);
  uint64_t table_rows = 0;
  for (int t = 0; t < 2; ++t) {
    for (int s = 0; s < kShards; ++s) table_rows += static_cast<uint64_t>(store->table_shard(t, s).capacity());
  }
  EXPECT_GT(table_rows, 190u);  // the dynamic shards' headroom
  const ShmParamStore::Memory m = store->memory();
  EXPECT_EQ(m.params, 40u * 4 + table_rows * kDim * 4);
  EXPECT_EQ(m.slots, 2u * (40u * 4 + table_rows * kDim * 4));
  EXPECT_EQ(m.params + m.slots + m.overhead, store->total_bytes());
  ASSERT_EQ(m.tables.size(), 2u);
  EXPECT_EQ(m.tables[0].name, "emb");
  EXPECT_EQ(m.tables[1].name, "dyn");
  uint64_t table_params = 0;
  for (const ShmParamStore::TableMemory& t : m.tables) {
    EXPECT_EQ(t.slots, 2 * t.params);
    table_params += t.params;
  }
  EXPECT_EQ(table_params, table_rows * kDim * 4);
  EXPECT_EQ(m.tables[0].rows, 100u);
  // Adam dim 8: 96 bytes of floats; a static row adds its 4-byte update
  // count as a side word, a dynamic one a 16-byte RowMeta (112 bytes).
  EXPECT_EQ(m.tables[0].bytes_per_row, 96u + 4);
  EXPECT_EQ(m.tables[0].meta_bytes_per_row, 4u);
  EXPECT_EQ(m.tables[1].bytes_per_row, 112u);
  EXPECT_EQ(m.tables[1].meta_bytes_per_row, 16u);
}

// configs/ctr_dlrm.yaml in small: 26 static tables, dim 16, SGD, hogwild.
OpenStoreOptions DlrmLikeOptions(int64_t rows, int shards) {
  std::vector<TableSpec> tables;
  for (int t = 0; t < 26; ++t) {
    TableSpec spec = Table(EmbeddingKind::kStatic, rows);
    spec.name = absl::StrCat("C", t + 1);
    spec.dim = 16;
    tables.push_back(spec);
  }
  return Options(Optimizer(OptimizerType::kSgd, 0.1f), std::move(tables), shards);
}

TEST(ShmStoreTables, DlrmLikeStoreOverheadIsAtMost5PercentOfParams) {
  std::unique_ptr<ShmParamStore> store = MakeStore(DlrmLikeOptions(20000, 1));
  ASSERT_NE(store, nullptr);
  const ShmParamStore::Memory m = store->memory();
  EXPECT_EQ(m.params, 26u * 20000 * 16 * 4);
  EXPECT_EQ(m.slots, 0u);
  EXPECT_LE(m.overhead, m.params / 20) << m.overhead << " bytes of overhead";
  EXPECT_EQ(m.params + m.slots + m.overhead, store->total_bytes());
  for (const ShmParamStore::TableMemory& t : m.tables) {
    EXPECT_EQ(t.bytes_per_row, 64u) << t.name;
    EXPECT_EQ(t.meta_bytes_per_row, 0u) << t.name;
  }
}

// A store in private memory (ps.memory_kind private) holds what the same
// store in /dev/shm does, row for row and after the same pushes, and leaves
// nothing another process could find.
TEST(ShmStoreTables, PrivateMemoryStoreEqualsTheSharedOne) {
  for (int shards : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << shards << " shards");
    OpenStoreOptions shared = DlrmLikeOptions(70000, shards);  // several pieces per table
    shared.tables.resize(3);
    shared.tables[2].kind = EmbeddingKind::kDynamic;
    shared.tables[2].capacity = 500;
    shared.store.memory_kind = StoreMemoryKind::kShared;
    shared.store.huge_pages = HugePagePolicy::kAuto;
    OpenStoreOptions priv = shared;
    priv.store.memory_kind = StoreMemoryKind::kPrivate;
    const std::vector<VariableSpec> vars = {VariableSpec{"w", 300, 40, InitKind::kGlorotUniform, 300, 40}};
    std::unique_ptr<ShmParamStore> a = MakeStore(shared, vars);
    std::unique_ptr<ShmParamStore> b = MakeStore(priv, vars);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_FALSE(a->private_memory());
    EXPECT_TRUE(b->private_memory());
    EXPECT_EQ(a->total_bytes(), b->total_bytes());
    for (int s = 0; s < shards; ++s) {
      EXPECT_TRUE(ShmSegment::Exists(absl::StrCat(a->name(), "-s", s)));
      EXPECT_FALSE(ShmSegment::Exists(absl::StrCat(b->name(), "-s", s)));
    }
    EXPECT_EQ(ShmParamStore::Attach(b->name(), shared.optimizer).status().code(), absl::StatusCode::kNotFound);
    // The same pushes on both.
    RowScratch scratch;
    const std::vector<uint64_t> ids = {3, 69999, 3, 12345, 40000};
    std::vector<float> grads(ids.size() * 16);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
    std::vector<float> dense(300 * 40);
    for (size_t i = 0; i < dense.size(); ++i) dense[i] = 0.001f * static_cast<float>(i % 101);
    for (ShmParamStore* st : {a.get(), b.get()}) {
      for (int t = 0; t < 2; ++t) ASSERT_TRUE(st->PushRows(t, ids, grads.data(), 0.1f, &scratch).ok());
      const DenseGrad g{0, dense.data()};
      ASSERT_TRUE(st->Push({&g, 1}, 0.1f).ok());
    }
    for (int t = 0; t < 2; ++t) {
      for (int s = 0; s < shards; ++s) {
        EmbeddingTable ta = a->table_shard(t, s), tb = b->table_shard(t, s);
        std::vector<float> ra(16), rb(16);
        for (int64_t id = 0; id < ta.capacity(); ++id) {
          ASSERT_TRUE(ta.ReadRowState(static_cast<uint64_t>(id), ra.data(), {}).ok());
          ASSERT_TRUE(tb.ReadRowState(static_cast<uint64_t>(id), rb.data(), {}).ok());
          ASSERT_EQ(std::memcmp(ra.data(), rb.data(), 16 * sizeof(float)), 0)
              << "table " << t << " shard " << s << " row " << id;
        }
      }
    }
    std::vector<float> pa(300 * 40), pb(300 * 40);
    ASSERT_TRUE(a->PullVariable(0, pa.data()).ok());
    ASSERT_TRUE(b->PullVariable(0, pb.data()).ok());
    EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)), 0);
    // The dynamic table inserts in private memory too.
    std::vector<float> row(ids.size() * 16);
    EXPECT_TRUE(b->PullRows(2, ids, row.data(), PullMode::kInsert, &scratch).ok());
  }
}

TEST(ShmStoreTables, ParallelInitGivesTheRowsOfSequentialInit) {
  for (int shards : {1, 3}) {
    OpenStoreOptions one = DlrmLikeOptions(70000, shards);  // several pieces per table
    one.tables.resize(3);
    one.tables[2].kind = EmbeddingKind::kDynamic;  // no rows to initialise
    one.init_threads = 1;
    OpenStoreOptions many = one;
    many.init_threads = 4;
    std::unique_ptr<ShmParamStore> a = MakeStore(one);
    std::unique_ptr<ShmParamStore> b = MakeStore(many);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    for (int t = 0; t < 2; ++t) {
      for (int s = 0; s < shards; ++s) {
        const EmbeddingTable& ta = a->table_shard(t, s);
        const EmbeddingTable& tb = b->table_shard(t, s);
        ASSERT_EQ(ta.capacity(), tb.capacity());
        std::vector<float> ra(16), rb(16);
        for (int64_t id = 0; id < ta.capacity(); ++id) {
          EmbeddingTable ca = ta, cb = tb;  // handles share the table
          ASSERT_TRUE(ca.ReadRowState(static_cast<uint64_t>(id), ra.data(), {}).ok());
          ASSERT_TRUE(cb.ReadRowState(static_cast<uint64_t>(id), rb.data(), {}).ok());
          ASSERT_EQ(std::memcmp(ra.data(), rb.data(), 16 * sizeof(float)), 0) << "table " << t << " shard " << s
                                                                               << " row " << id;
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardwild

namespace shardwild {
namespace {

// A bf16 table across shards (TableSpec::bf16): its memory counts 2 bytes a
// parameter (half of the f32 twin's), its rows in place (RowAddresses) are
// the bf16 values its pulls widen, an attacher sees the flag, and pulls and
// pushes work through every shard.
TEST(ShmStoreTables, Bf16TableHalvesItsParamsAndItsRowsInPlaceAreBf16) {
  TableSpec f32 = Table(EmbeddingKind::kStatic, 300);
  TableSpec bf16 = f32;
  bf16.name = "emb16";
  bf16.bf16 = true;
  OpenStoreOptions o = Options(Optimizer(OptimizerType::kSgd, 0.1f), {f32, bf16});
  std::unique_ptr<ShmParamStore> store = MakeStore(o);
  ASSERT_NE(store, nullptr);
  const ShmParamStore::Memory m = store->memory();
  ASSERT_EQ(m.tables.size(), 2u);
  EXPECT_EQ(m.tables[0].params, 300u * kDim * 4);
  EXPECT_EQ(m.tables[1].params, m.tables[0].params / 2);
  const std::vector<uint64_t> ids = {1, 2, 299};
  std::vector<float*> addresses(ids.size(), nullptr);
  absl::StatusOr<RowsInPlace> in_place = store->RowAddresses(1, ids, addresses.data());
  ASSERT_TRUE(in_place.ok()) << in_place.status();
  EXPECT_EQ(*in_place, RowsInPlace::kReadAndSgd);

  RowScratch scratch;
  std::vector<float> before(ids.size() * kDim), after(before.size());
  ASSERT_TRUE(store->PullRows(1, ids, before.data(), PullMode::kInsert, &scratch).ok());
  for (float x : before) ASSERT_EQ(std::bit_cast<uint32_t>(x) & 0xFFFFu, 0u) << x;  // bf16 values
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint16_t* row = reinterpret_cast<const uint16_t*>(addresses[i]);
    for (int64_t j = 0; j < kDim; ++j) {
      ASSERT_EQ(static_cast<uint32_t>(row[j]) << 16, std::bit_cast<uint32_t>(before[i * kDim + j])) << i << " " << j;
    }
  }
  const std::vector<float> grads(ids.size() * kDim, 1.0f);
  ASSERT_TRUE(store->PushRows(1, ids, grads.data(), 0.5f, &scratch).ok());
  ASSERT_TRUE(store->PullRows(1, ids, after.data(), PullMode::kInsert, &scratch).ok());
  // lr 0.5 x gradient 1, within a bf16 step of the result.
  for (size_t i = 0; i < after.size(); ++i) EXPECT_NEAR(after[i], before[i] - 0.5f, 0.004f) << i;

  absl::StatusOr<std::unique_ptr<ShmParamStore>> attached =
      ShmParamStore::Attach(store->name(), o.optimizer, o.sparse_optimizer);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_FALSE((*attached)->layout().tables[0].bf16);
  EXPECT_TRUE((*attached)->layout().tables[1].bf16);
  std::vector<float> seen(after.size());
  ASSERT_TRUE((*attached)->PullRows(1, ids, seen.data(), PullMode::kReadOnly, &scratch).ok());
  EXPECT_EQ(seen, after);
}

}  // namespace
}  // namespace shardwild
