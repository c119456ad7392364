// Partial stores: a ShmParamStore hosting a block of the global shards (one
// ps task's share of the global shard map) against the full store of the
// same options: same layout, same initial values and updates on the hosted
// rows, everything else refused.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "ps_shm/param_store.h"
#include "ps_shm/shard_format.h"
#include "ps_shm/shm_segment.h"
#include "ps_shm/shm_store.h"

namespace shardwild {
namespace {

constexpr int kShards = 5;
constexpr int64_t kDim = 3;

OpenStoreOptions Options(UpdateMode mode = UpdateMode::kHogwild) {
  OpenStoreOptions o;
  o.store.job_name = "swtest-partial";
  o.store.huge_pages = HugePagePolicy::kOff;
  o.store.update = mode;
  o.optimizer.type = OptimizerType::kAdam;
  o.optimizer.lr = 0.01f;
  o.seed = 17;
  o.num_shards = kShards;
  TableSpec st;
  st.name = "static";
  st.kind = EmbeddingKind::kStatic;
  st.dim = kDim;
  st.capacity = 37;
  
  TableSpec dy;
  dy.name = "dynamic";
  dy.kind = EmbeddingKind::kDynamic;
  dy.dim = kDim;
  dy.capacity = 200;
  
  o.tables = {st, dy};
  return o;
}

// Under the default fixed_shards partitioner: w on all 5 shards, b whole on
// shard 0, c on shards 0..2, d whole on shard 1.
std::vector<VariableSpec> Variables() {
  return {VariableSpec{"w", 23, 4, InitKind::kGlorotUniform, 23, 4}, VariableSpec{"b", 1, 4, InitKind::kZeros},
          VariableSpec{"c", 3, 2, InitKind::kGlorotUniform, 3, 2}, VariableSpec{"d", 1, 3, InitKind::kGlorotUniform, 1, 3}};
}

std::unique_ptr<ShmParamStore> Make(int first, int num, UpdateMode mode = UpdateMode::kHogwild) {
  OpenStoreOptions o = Options(mode);
  o.first_hosted_shard = first;
  o.num_hosted_shards = num;
  absl::StatusOr<std::unique_ptr<ShmParamStore>> s = ShmParamStore::Create(o, Variables());
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::vector<float> Rows(ShmParamStore& s, int var, RowRange r) {
  std::vector<float> out(r.size() * s.layout().variables[var].cols);
  const PullSlice sl{var, r.begin, r.end, out.data()};
  EXPECT_TRUE(s.Pull({&sl, 1}).ok());
  return out;
}

// Ids of `table` whose shard lies in [first, first + num).
std::vector<uint64_t> HostedIds(const TableSpec& t, int first, int num) {
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < 37; ++id) {
    const uint64_t key = t.kind == EmbeddingKind::kStatic ? id : id * 1000003 + 11;
    const int s = ShardOfRowId(t.kind, key, kShards);
    if (s >= first && s < first + num) ids.push_back(key);
  }
  return ids;
}

struct Block {
  int first, num;
};
const Block kBlocks[] = {{0, 3}, {3, 2}, {1, 2}, {4, 1}, {0, 5}};

TEST(PartialStoreTest, HostsItsBlockWithTheFullStoresLayoutAndValues) {
  std::unique_ptr<ShmParamStore> full = Make(0, -1);
  ASSERT_TRUE(full);
  EXPECT_FALSE(full->partial());
  for (const Block& b : kBlocks) {
    SCOPED_TRACE(testing::Message() << "block " << b.first << "+" << b.num);
    std::unique_ptr<ShmParamStore> part = Make(b.first, b.num);
    ASSERT_TRUE(part);
    EXPECT_EQ(part->partial(), b.num != kShards);
    EXPECT_EQ(part->first_hosted_shard(), b.first);
    EXPECT_EQ(part->num_hosted_shards(), b.num);
    // Memory only for the hosted shards' rows.
    const ShmParamStore::Memory m = part->memory();
    EXPECT_LE(m.params + m.slots, part->total_bytes());
    if (b.num < kShards) {
      EXPECT_LT(part->total_bytes(), full->total_bytes());
      EXPECT_LT(m.params, full->memory().params);
    }
    for (int s = 0; s < kShards; ++s) EXPECT_EQ(part->hosts(s), s >= b.first && s < b.first + b.num) << s;
    // The global layout.
    const StoreLayout& pl = part->layout();
    ASSERT_EQ(pl.num_shards, kShards);
    ASSERT_EQ(pl.parts.size(), full->layout().parts.size());
    for (size_t v = 0; v < pl.parts.size(); ++v) {
      // The hosted rows: the union of the block's parts, contiguous.
      int64_t lo = -1, hi = -1;
      for (int s = 0; s < kShards; ++s) {
        EXPECT_EQ(pl.parts[v][s].begin, full->layout().parts[v][s].begin);
        EXPECT_EQ(pl.parts[v][s].end, full->layout().parts[v][s].end);
        if (!part->hosts(s) || pl.parts[v][s].size() == 0) continue;
        if (lo < 0) lo = pl.parts[v][s].begin;
        EXPECT_TRUE(hi < 0 || hi == pl.parts[v][s].begin) << "not contiguous";
        hi = pl.parts[v][s].end;
      }
      const RowRange h = part->hosted_rows(static_cast<int>(v));
      EXPECT_EQ(h.size() == 0 ? -1 : h.begin, lo) << pl.variables[v].name;
      EXPECT_EQ(h.size() == 0 ? -1 : h.end, hi) << pl.variables[v].name;
      // Initial values equal the full store's rows.
      EXPECT_EQ(Rows(*part, static_cast<int>(v), h), Rows(*full, static_cast<int>(v), h)) << pl.variables[v].name;
    }
    // Table rows of the hosted shards start as the full store's (static rows
    // are drawn with the global shard index).
    for (int t = 0; t < 2; ++t) {
      const std::vector<uint64_t> ids = HostedIds(pl.tables[t], b.first, b.num);
      ASSERT_FALSE(ids.empty());
      std::vector<float> a(ids.size() * kDim), c(ids.size() * kDim);
      RowScratch scratch;
      ASSERT_TRUE(part->PullRows(t, ids, a.data(), PullMode::kReadOnly, &scratch).ok());
      ASSERT_TRUE(full->PullRows(t, ids, c.data(), PullMode::kReadOnly, &scratch).ok());
      EXPECT_EQ(a, c) << "table " << t;
    }
  }
}

TEST(PartialStoreTest, UpdatesHostedRowsAsTheFullStore) {
  for (UpdateMode mode : {UpdateMode::kHogwild, UpdateMode::kRowLock}) {
    SCOPED_TRACE(UpdateModeName(mode));
    std::unique_ptr<ShmParamStore> full = Make(0, -1, mode), part = Make(3, 2, mode), hosted = Make(3, 2, mode);
    ASSERT_TRUE(full && part && hosted);
    RowScratch scratch;
    const std::vector<VariableSpec> vars = Variables();
    for (int step = 0; step < 3; ++step) {
      std::vector<std::vector<float>> g(vars.size());
      std::vector<DenseGrad> grads;
      for (size_t v = 0; v < vars.size(); ++v) {
        g[v].resize(vars[v].size());
        for (size_t i = 0; i < g[v].size(); ++i) g[v][i] = std::sin(0.3f * i + step + v);
        grads.push_back({static_cast<int>(v), g[v].data()});
      }
      ASSERT_TRUE(full->Push(grads, 0.05f).ok());
      ASSERT_TRUE(part->Push(grads, 0.05f).ok());
      // The same gradients as runs of the hosted rows only.
      std::vector<std::vector<float>> runs(vars.size());
      std::vector<DenseGrad> hosted_grads;
      for (size_t v = 0; v < vars.size(); ++v) {
        const RowRange h = hosted->hosted_rows(static_cast<int>(v));
        runs[v].assign(g[v].begin() + h.begin * vars[v].cols, g[v].begin() + h.end * vars[v].cols);
        hosted_grads.push_back({static_cast<int>(v), runs[v].data()});
      }
      ASSERT_TRUE(hosted->PushHosted(hosted_grads, 0.05f).ok());
      const std::vector<uint64_t> ids = HostedIds(full->layout().tables[0], 3, 2);
      std::vector<uint64_t> batch = ids;
      batch.push_back(ids[0]);  // a repeated id
      std::vector<float> rg(batch.size() * kDim);
      for (size_t i = 0; i < rg.size(); ++i) rg[i] = std::cos(0.7f * i + step);
      ASSERT_TRUE(full->PushRows(0, batch, rg.data(), 0.1f, &scratch).ok());
      ASSERT_TRUE(part->PushRows(0, batch, rg.data(), 0.1f, &scratch).ok());
    }
    for (size_t v = 0; v < vars.size(); ++v) {
      const RowRange h = part->hosted_rows(static_cast<int>(v));
      EXPECT_EQ(Rows(*part, static_cast<int>(v), h), Rows(*full, static_cast<int>(v), h)) << vars[v].name;
      EXPECT_EQ(Rows(*hosted, static_cast<int>(v), h), Rows(*full, static_cast<int>(v), h)) << vars[v].name;
    }
    EXPECT_EQ(hosted->version(), 3u);
    // w has rows on shards 3 and 4: both were pushed three times.
    EXPECT_EQ(part->version(), 3u);
    const std::vector<uint64_t> ids = HostedIds(full->layout().tables[0], 3, 2);
    std::vector<float> a(ids.size() * kDim), c(ids.size() * kDim);
    ASSERT_TRUE(part->PullRows(0, ids, a.data(), PullMode::kReadOnly, &scratch).ok());
    ASSERT_TRUE(full->PullRows(0, ids, c.data(), PullMode::kReadOnly, &scratch).ok());
    EXPECT_EQ(a, c);
  }
}

TEST(PartialStoreTest, RowsAndIdsNotHostedAreRefused) {
  std::unique_ptr<ShmParamStore> part = Make(3, 2);
  ASSERT_TRUE(part);
  // w: 23 rows over 5 shards = 5,5,5,4,4: shards 3..4 hold rows 15..23.
  const RowRange h = part->hosted_rows(0);
  EXPECT_EQ(h.begin, 15);
  EXPECT_EQ(h.end, 23);
  // b and c and d have no rows on shards 3..4.
  EXPECT_EQ(part->hosted_rows(1).size(), 0);
  EXPECT_EQ(part->hosted_rows(2).size(), 0);
  std::vector<float> out(23 * 4, -7.0f);
  const PullSlice bad{0, 14, 16, out.data()};
  absl::Status s = part->Pull({&bad, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not hosted"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[14, 16)"), std::string::npos) << s;
  EXPECT_EQ(out[0], -7.0f);
  EXPECT_EQ(part->ReadRows(0, 0, 1, out.data(), {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(part->WriteRows(2, 0, 1, out.data(), {}).code(), absl::StatusCode::kInvalidArgument);
  const PullSlice empty{1, 0, 0, out.data()};
  EXPECT_TRUE(part->Pull({&empty, 1}).ok());

  // An id of another shard, after hosted ones: refused before anything moves.
  RowScratch scratch;
  for (int t = 0; t < 2; ++t) {
    SCOPED_TRACE(t);
    const TableSpec& spec = part->layout().tables[t];
    std::vector<uint64_t> ids = HostedIds(spec, 3, 2);
    const std::vector<uint64_t> others = HostedIds(spec, 0, 3);
    ids.push_back(others[0]);
    std::vector<float> rows(ids.size() * kDim, -3.0f);
    for (RowScratch* sc : {&scratch, static_cast<RowScratch*>(nullptr)}) {
      s = part->PullRows(t, ids, rows.data(), PullMode::kInsert, sc);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find(absl::StrCat("id ", others[0])), std::string::npos) << s;
      EXPECT_NE(s.message().find("not hosted"), std::string::npos) << s;
      EXPECT_EQ(rows[0], -3.0f);
    }
    std::vector<float> before(kDim), after(kDim);
    ASSERT_TRUE(part->PullRows(t, {ids.data(), 1}, before.data(), PullMode::kInsert, &scratch).ok());
    std::vector<float> grads(ids.size() * kDim, 1.0f);
    EXPECT_EQ(part->PushRows(t, ids, grads.data(), 0.5f, &scratch).code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(part->PullRows(t, {ids.data(), 1}, after.data(), PullMode::kInsert, &scratch).ok());
    EXPECT_EQ(before, after);
    std::vector<float> p(kDim);
    EXPECT_EQ(part->ReadTableRow(t, others[0], p.data(), {}).code(), absl::StatusCode::kInvalidArgument);
  }
  // A block outside the shards.
  OpenStoreOptions o = Options();
  o.first_hosted_shard = 4;
  o.num_hosted_shards = 2;
  EXPECT_EQ(ShmParamStore::Create(o, Variables()).status().code(), absl::StatusCode::kInvalidArgument);
  o.first_hosted_shard = 0;
  o.num_hosted_shards = 0;
  EXPECT_EQ(ShmParamStore::Create(o, Variables()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PartialStoreTest, AttachByNameFindsTheBlock) {
  std::unique_ptr<ShmParamStore> part = Make(1, 2);
  ASSERT_TRUE(part);
  std::vector<float> g(23 * 4, 0.25f), gc(6, 0.5f), gd(3, -1.0f), gb(4, 1.0f);
  const DenseGrad grads[] = {{0, g.data()}, {1, gb.data()}, {2, gc.data()}, {3, gd.data()}};
  ASSERT_TRUE(part->Push(grads, 0.1f).ok());
  absl::StatusOr<std::unique_ptr<ShmParamStore>> att = ShmParamStore::Attach(part->name(), Options().optimizer);
  ASSERT_TRUE(att.ok()) << att.status();
  ShmParamStore& a = **att;
  EXPECT_EQ(a.first_hosted_shard(), 1);
  EXPECT_EQ(a.num_hosted_shards(), 2);
  EXPECT_TRUE(a.partial());
  ASSERT_EQ(a.layout().num_shards, kShards);
  for (size_t v = 0; v < Variables().size(); ++v) {
    for (int s = 0; s < kShards; ++s) {
      EXPECT_EQ(a.layout().parts[v][s].begin, part->layout().parts[v][s].begin);
      EXPECT_EQ(a.layout().parts[v][s].end, part->layout().parts[v][s].end);
    }
    const RowRange h = part->hosted_rows(static_cast<int>(v));
    EXPECT_EQ(a.hosted_rows(static_cast<int>(v)).begin, h.begin);
    EXPECT_EQ(a.hosted_rows(static_cast<int>(v)).end, h.end);
    EXPECT_EQ(Rows(a, static_cast<int>(v), h), Rows(*part, static_cast<int>(v), h));
  }
  EXPECT_EQ(a.version(), part->version());
  ASSERT_EQ(a.layout().tables.size(), 2u);
  // A push through the attached store is seen by the creator.
  ASSERT_TRUE(a.Push(grads, 0.1f).ok());
  EXPECT_EQ(part->version(), 2u);
  const RowRange h = part->hosted_rows(0);
  EXPECT_EQ(Rows(a, 0, h), Rows(*part, 0, h));
  RowScratch scratch;
  const std::vector<uint64_t> ids = HostedIds(part->layout().tables[1], 1, 2);
  std::vector<float> x(ids.size() * kDim), y(ids.size() * kDim);
  ASSERT_TRUE(a.PullRows(1, ids, x.data(), PullMode::kInsert, &scratch).ok());
  ASSERT_TRUE(part->PullRows(1, ids, y.data(), PullMode::kReadOnly, &scratch).ok());
  EXPECT_EQ(x, y);
}

TEST(PartialStoreTest, AttachRefusesABadBlock) {
  std::unique_ptr<ShmParamStore> part = Make(1, 2);
  ASSERT_TRUE(part);
  absl::StatusOr<std::unique_ptr<ShmSegment>> s0 = ShmSegment::Attach(part->name() + "-s0");
  absl::StatusOr<std::unique_ptr<ShmSegment>> s1 = ShmSegment::Attach(part->name() + "-s1");
  ASSERT_TRUE(s0.ok() && s1.ok());
  auto* h0 = static_cast<ShardHeader*>((*s0)->data());
  auto* h1 = static_cast<ShardHeader*>((*s1)->data());
  EXPECT_EQ(h0->shard_index, 1u);
  EXPECT_EQ(h1->shard_index, 2u);
  // Segment 1 disagrees with segment 0 about the block.
  h1->first_hosted_shard = 2;
  absl::StatusOr<std::unique_ptr<ShmParamStore>> att = ShmParamStore::Attach(part->name(), Options().optimizer);
  EXPECT_EQ(att.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(att.status().message().find(part->name() + "-s1"), std::string::npos) << att.status();
  h1->first_hosted_shard = 1;
  // A block past the last shard.
  h0->num_hosted_shards = 5;
  att = ShmParamStore::Attach(part->name(), Options().optimizer);
  EXPECT_EQ(att.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(att.status().message().find("not a block"), std::string::npos) << att.status();
  h0->num_hosted_shards = 2;
  // A global parts table that disagrees with a hosted shard's own entry.
  auto* global = reinterpret_cast<GlobalPart*>(static_cast<char*>((*s0)->data()) + sizeof(ShardHeader) +
                                               h0->num_entries * sizeof(LayoutEntry) + h0->num_tables * sizeof(TableEntry));
  global[0 * kShards + 2].row_end -= 1;  // w on shard 2
  att = ShmParamStore::Attach(part->name(), Options().optimizer);
  EXPECT_EQ(att.status().code(), absl::StatusCode::kFailedPrecondition);
  global[0 * kShards + 2].row_end += 1;
  att = ShmParamStore::Attach(part->name(), Options().optimizer);
  EXPECT_TRUE(att.ok()) << att.status();
}

}  // namespace
}  // namespace shardwild
