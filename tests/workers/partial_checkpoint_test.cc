// Checkpoints of partial stores (one ps task's block of the global shards)
// and the chief's state-only checkpoints (workers/checkpoint.h).
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ps_shm/shm_store.h"
#include "test_config.h"
#include "workers/checkpoint.h"

namespace shardwild {
namespace {

using testdata::TempDir;

constexpr int kShards = 5;
constexpr int64_t kDim = 4;

std::vector<VariableSpec> Variables() {
  return {VariableSpec{"w", 13, 3, InitKind::kGlorotUniform, 13, 3}, VariableSpec{"b", 1, 3, InitKind::kZeros},
          VariableSpec{"c", 2, 2, InitKind::kGlorotUniform, 2, 2}};
}

std::unique_ptr<ShmParamStore> Make(int first, int num, uint64_t seed = 5) {
  OpenStoreOptions o;
  o.store.job_name = "swtest-pckpt";
  o.store.huge_pages = HugePagePolicy::kOff;
  o.optimizer.type = OptimizerType::kAdam;
  o.optimizer.lr = 0.01f;
  o.num_shards = kShards;
  o.first_hosted_shard = first;
  o.num_hosted_shards = num;
  o.seed = seed;
  TableSpec st;
  st.name = "static";
  st.kind = EmbeddingKind::kStatic;
  st.dim = kDim;
  st.capacity = 30;
  TableSpec dy;
  dy.name = "dynamic";
  dy.kind = EmbeddingKind::kDynamic;
  dy.dim = kDim;
  dy.capacity = 100;
  o.tables = {st, dy};
  absl::StatusOr<std::unique_ptr<ShmParamStore>> s = ShmParamStore::Create(o, Variables());
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// Ids of table t whose shard the store hosts.
std::vector<uint64_t> HostedIds(const ShmParamStore& s, int t) {
  std::vector<uint64_t> ids;
  const TableSpec& spec = s.layout().tables[t];
  for (uint64_t i = 0; i < 30; ++i) {
    const uint64_t id = spec.kind == EmbeddingKind::kStatic ? i : i * 7919 + 3;
    if (s.hosts(ShardOfRowId(spec.kind, id, kShards))) ids.push_back(id);
  }
  return ids;
}

// A few pushes, so parameters, slots and counts are not the initial ones.
void Train(ShmParamStore& s) {
  RowScratch scratch;
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> g;
    std::vector<DenseGrad> grads;
    for (size_t v = 0; v < s.layout().variables.size(); ++v) {
      g.emplace_back(s.layout().variables[v].size());
      for (size_t i = 0; i < g.back().size(); ++i) g.back()[i] = std::sin(0.2f * i + step + v);
    }
    for (size_t v = 0; v < g.size(); ++v) grads.push_back({static_cast<int>(v), g[v].data()});
    ASSERT_TRUE(s.Push(grads, 0.1f).ok());
    for (int t = 0; t < 2; ++t) {
      const std::vector<uint64_t> ids = HostedIds(s, t);
      std::vector<float> rg(ids.size() * kDim);
      for (size_t i = 0; i < rg.size(); ++i) rg[i] = std::cos(0.3f * i + step);
      ASSERT_TRUE(s.PushRows(t, ids, rg.data(), 0.1f, &scratch).ok());
    }
  }
}

// Everything the store hosts: rows with their slots, table rows with slots and counts.
std::vector<float> Snapshot(ShmParamStore& s) {
  std::vector<float> out;
  for (size_t v = 0; v < s.layout().variables.size(); ++v) {
    const RowRange h = s.hosted_rows(static_cast<int>(v));
    const size_t n = h.size() * s.layout().variables[v].cols;
    std::vector<float> p(n), m(n), u(n);
    float* slots[] = {m.data(), u.data()};
    EXPECT_TRUE(s.ReadRows(static_cast<int>(v), h.begin, h.end, p.data(), slots).ok());
    out.insert(out.end(), p.begin(), p.end());
    out.insert(out.end(), m.begin(), m.end());
    out.insert(out.end(), u.begin(), u.end());
    out.push_back(static_cast<float>(s.update_count(static_cast<int>(v))));
  }
  for (int t = 0; t < 2; ++t) {
    EXPECT_TRUE(s.VisitTableRows(t, [&](uint64_t id, const float* params, absl::Span<const float* const> slots,
                                        uint64_t count) {
                  out.push_back(static_cast<float>(id));
                  out.insert(out.end(), params, params + kDim);
                  for (const float* sl : slots) out.insert(out.end(), sl, sl + kDim);
                  out.push_back(static_cast<float>(count));
                  return absl::OkStatus();
                }).ok());
  }
  out.push_back(static_cast<float>(s.version()));
  return out;
}

TEST(PartialCheckpointTest, RoundTripIntoTheSameBlock) {
  TempDir dir;
  std::unique_ptr<ShmParamStore> src = Make(2, 3);
  ASSERT_TRUE(src);
  Train(*src);
  CheckpointState state;
  state.step = 9;
  CheckpointWriteOptions wo;
  wo.fsync = false;
  absl::StatusOr<std::string> path = WriteCheckpoint(dir.path(), *src, state, wo);
  ASSERT_TRUE(path.ok()) << path.status();
  absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(dir.path());
  ASSERT_TRUE(found.ok() && found->has_value());
  const CheckpointInfo& info = **found;
  EXPECT_EQ(info.kind, CheckpointKind::kStore);
  ASSERT_TRUE(info.manifest.contains("hosted"));
  EXPECT_EQ(info.manifest["hosted"]["first_shard"], 2);
  EXPECT_EQ(info.manifest["hosted"]["num_shards"], 3);
  EXPECT_EQ(info.manifest["hosted"]["total_shards"], kShards);
  // A fresh store of the same block (another seed: restore must overwrite).
  std::unique_ptr<ShmParamStore> dst = Make(2, 3, /*seed=*/99);
  ASSERT_TRUE(dst);
  EXPECT_NE(Snapshot(*dst), Snapshot(*src));
  ASSERT_TRUE(RestoreCheckpoint(info, *dst).ok());
  EXPECT_EQ(Snapshot(*dst), Snapshot(*src));
}

TEST(PartialCheckpointTest, FullStoreManifestHasNoBlock) {
  TempDir dir;
  std::unique_ptr<ShmParamStore> full = Make(0, -1);
  ASSERT_TRUE(full);
  CheckpointWriteOptions wo;
  wo.fsync = false;
  ASSERT_TRUE(WriteCheckpoint(dir.path(), *full, CheckpointState{}, wo).ok());
  absl::StatusOr<CheckpointInfo> info = VerifyCheckpoint(dir.path() + "/ckpt-0");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->manifest.contains("hosted"));
  EXPECT_FALSE(info->manifest.contains("kind"));
}

TEST(PartialCheckpointTest, AnotherBlockIsRefusedNamingBoth) {
  TempDir dir;
  std::unique_ptr<ShmParamStore> src = Make(0, 2);
  ASSERT_TRUE(src);
  CheckpointWriteOptions wo;
  wo.fsync = false;
  ASSERT_TRUE(WriteCheckpoint(dir.path(), *src, CheckpointState{}, wo).ok());
  absl::StatusOr<CheckpointInfo> info = VerifyCheckpoint(dir.path() + "/ckpt-0");
  ASSERT_TRUE(info.ok()) << info.status();
  for (auto [first, num] : {std::pair{2, 3}, std::pair{0, 3}}) {
    std::unique_ptr<ShmParamStore> dst = Make(first, num);
    ASSERT_TRUE(dst);
    const absl::Status s = RestoreCheckpoint(*info, *dst);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find(dir.path() + "/ckpt-0"), std::string::npos) << s;
    EXPECT_NE(s.message().find("shards 0..1 of 5"), std::string::npos) << s;
  }
  // Into a full store it restores exactly its block's rows (one part of a
  // cluster's checkpoint); the other rows keep their values.
  {
    Train(*src);
    TempDir trained;
    ASSERT_TRUE(WriteCheckpoint(trained.path(), *src, CheckpointState{}, wo).ok());
    absl::StatusOr<CheckpointInfo> part = VerifyCheckpoint(trained.path() + "/ckpt-0");
    ASSERT_TRUE(part.ok()) << part.status();
    std::unique_ptr<ShmParamStore> whole = Make(0, -1), fresh = Make(0, -1);
    ASSERT_TRUE(whole && fresh);
    ASSERT_TRUE(RestoreCheckpoint(*part, *whole).ok());
    for (int v = 0; v < 3; ++v) {
      const int64_t rows = whole->layout().variables[v].rows, cols = whole->layout().variables[v].cols;
      const RowRange block = src->hosted_rows(v);
      std::vector<float> got(rows * cols), init(rows * cols), want(block.size() * cols);
      ASSERT_TRUE(whole->PullVariable(v, got.data()).ok());
      ASSERT_TRUE(fresh->PullVariable(v, init.data()).ok());
      if (block.size() > 0) {
        ASSERT_TRUE(src->ReadRows(v, block.begin, block.end, want.data(), {}).ok());
      }
      for (int64_t r = 0; r < rows; ++r) {
        const bool in = r >= block.begin && r < block.end;
        for (int64_t c = 0; c < cols; ++c) {
          EXPECT_EQ(got[r * cols + c], in ? want[(r - block.begin) * cols + c] : init[r * cols + c])
              << "variable " << v << " row " << r;
        }
      }
    }
    EXPECT_EQ(whole->version(), src->version());
  }
  // And a full checkpoint does not go into a partial store.
  TempDir dir2;
  std::unique_ptr<ShmParamStore> full = Make(0, -1);
  ASSERT_TRUE(WriteCheckpoint(dir2.path(), *full, CheckpointState{}, wo).ok());
  absl::StatusOr<CheckpointInfo> finfo = VerifyCheckpoint(dir2.path() + "/ckpt-0");
  ASSERT_TRUE(finfo.ok());
  const absl::Status s = RestoreCheckpoint(*finfo, *src);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("whole store"), std::string::npos) << s;
}

TEST(PartialCheckpointTest, StateCheckpointRoundTrip) {
  TempDir dir;
  CheckpointWriteOptions wo;
  wo.fsync = false;
  wo.keep = 2;
  const nlohmann::json params = {{"model_version", 42u}, {"ps", {"ps:0/ckpt-3", "ps:1/ckpt-3"}}};
  for (int64_t step : {1, 2, 3}) {
    CheckpointState state;
    state.step = step;
    state.epoch = step / 2;
    state.config_hash = "abc";
    state.data_cursor = {{"task", step}};
    state.extra = {{"loss", 0.5}};
    absl::StatusOr<std::string> path = WriteStateCheckpoint(dir.path(), state, params, wo);
    ASSERT_TRUE(path.ok()) << path.status();
  }
  EXPECT_EQ(ListCheckpoints(dir.path()).size(), 2u);  // pruned like store checkpoints
  EXPECT_EQ(CheckpointHistory(dir.path()).size(), 3u);
  absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(dir.path());
  ASSERT_TRUE(found.ok() && found->has_value());
  const CheckpointInfo& info = **found;
  EXPECT_EQ(info.kind, CheckpointKind::kState);
  EXPECT_EQ(info.step, 3);
  EXPECT_EQ(info.model_version, 42u);
  EXPECT_EQ(info.state.epoch, 1);
  EXPECT_EQ(info.state.config_hash, "abc");
  EXPECT_EQ(info.state.data_cursor["task"], 3);
  EXPECT_EQ(info.state.extra["loss"], 0.5);
  EXPECT_EQ(info.params_info, params);
  // It restores into no store.
  std::unique_ptr<ShmParamStore> store = Make(0, -1);
  ASSERT_TRUE(store);
  const absl::Status s = RestoreCheckpoint(info, *store);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("state-only"), std::string::npos) << s;
}

}  // namespace
}  // namespace shardwild
