// Checkpoints: round trip into the same and other shard counts, keep,
// fallback from damaged checkpoints, and a crash injected at every phase of
// writing.
#include "workers/checkpoint.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/io/safetensors.h"
#include "core/model/optimizer.h"
#include "gtest/gtest.h"
#include "test_config.h"
#include "ps_shm/shm_store.h"

namespace shardwild {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kDim = 5;

using testdata::TempDir;

std::vector<VariableSpec> Variables() {
  return {VariableSpec{"w", 7, 3, InitKind::kGlorotUniform, 7, 3}, VariableSpec{"b", 3, 1, InitKind::kZeros}};
}

TableSpec Table(const char* name, EmbeddingKind kind, int64_t dim, int64_t capacity) {
  TableSpec t;
  t.name = name;
  t.kind = kind;
  t.dim = dim;
  t.capacity = capacity;
  return t;
}

std::unique_ptr<ShmParamStore> MakeStore(int shards, UpdateMode mode = UpdateMode::kHogwild, uint64_t seed = 5) {
  OpenStoreOptions o;
  o.store.job_name = "swtest-ckpt";
  o.store.update = mode;
  o.store.huge_pages = HugePagePolicy::kOff;
  o.optimizer.type = OptimizerType::kAdam;
  o.optimizer.lr = 0.01f;
  OptimizerOptions sparse;
  sparse.type = OptimizerType::kAdagrad;
  sparse.lr = 0.1f;
  o.sparse_optimizer = sparse;
  o.num_shards = shards;
  o.seed = seed;
  o.tables = {Table("static", EmbeddingKind::kStatic, kDim, 20), Table("dynamic", EmbeddingKind::kDynamic, kDim, 100)};
  absl::StatusOr<std::unique_ptr<ShmParamStore>> s = ShmParamStore::Create(o, Variables());
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// Step `k` of some training: dense and row pushes.
void Train(ShmParamStore& store, int from, int to) {
  RowScratch scratch;
  for (int k = from; k < to; ++k) {
    std::vector<float> gw(21), gb(3);
    for (size_t i = 0; i < gw.size(); ++i) gw[i] = std::sin(0.3f * i + k);
    for (size_t i = 0; i < gb.size(); ++i) gb[i] = std::cos(0.7f * i + k);
    const DenseGrad g[2] = {{0, gw.data()}, {1, gb.data()}};
    ASSERT_TRUE(store.Push(g, 0.01f).ok());
    const std::vector<uint64_t> sids = {static_cast<uint64_t>(k % 20), 3, static_cast<uint64_t>((k * 7) % 20)};
    const std::vector<uint64_t> dids = {static_cast<uint64_t>(k) * 1000003ULL, 77, 0xFFFF0000ULL + k % 3};
    std::vector<float> rg(3 * kDim);
    for (size_t i = 0; i < rg.size(); ++i) rg[i] = 0.1f * std::sin(1.3f * i + k);
    ASSERT_TRUE(store.PushRows(0, sids, rg.data(), 0.1f, &scratch).ok());
    ASSERT_TRUE(store.PushRows(1, dids, rg.data(), 0.1f, &scratch).ok());
  }
}

// Everything a store holds, in a canonical order: dense params, slots and
// update counts; every table row by id (params, slots, count); the version.
std::vector<double> Snapshot(ShmParamStore& store) {
  std::vector<double> out;
  for (int v = 0; v < 2; ++v) {
    const VariableSpec& spec = store.layout().variables[v];
    std::vector<float> p(spec.size()), m(spec.size()), s(spec.size());
    float* slots[2] = {m.data(), s.data()};
    EXPECT_TRUE(store.ReadRows(v, 0, spec.rows, p.data(), slots).ok());
    out.insert(out.end(), p.begin(), p.end());
    out.insert(out.end(), m.begin(), m.end());
    out.insert(out.end(), s.begin(), s.end());
    out.push_back(static_cast<double>(store.update_count(v)));
  }
  for (int t = 0; t < 2; ++t) {
    std::map<uint64_t, std::vector<double>> rows;
    EXPECT_TRUE(store
                    .VisitTableRows(t,
                                    [&](uint64_t id, const float* params, absl::Span<const float* const> slots,
                                        uint64_t count) {
                                      std::vector<double>& r = rows[id];
                                      r.assign(params, params + kDim);
                                      r.insert(r.end(), slots[0], slots[0] + kDim);
                                      r.push_back(static_cast<double>(count));
                                      return absl::OkStatus();
                                    })
                    .ok());
    out.push_back(static_cast<double>(rows.size()));
    for (const auto& [id, r] : rows) {
      out.push_back(static_cast<double>(id));
      out.insert(out.end(), r.begin(), r.end());
    }
  }
  out.push_back(static_cast<double>(store.version()));
  return out;
}

CheckpointState State(int64_t step) {
  CheckpointState s;
  s.step = step;
  s.epoch = step / 10;
  s.config_hash = "abc123";
  s.data_cursor = {{"epoch", s.epoch}, {"done", {1, 4, 5}}};
  s.rng = {{"shuffle", 12345678901ULL}};
  return s;
}

CheckpointWriteOptions Fast(int keep = 5) {
  CheckpointWriteOptions o;
  o.keep = keep;
  o.fsync = false;
  return o;
}

TEST(CheckpointTest, RoundTripIntoAnyShardCount) {
  TempDir dir;
  std::unique_ptr<ShmParamStore> store = MakeStore(2);
  ASSERT_NE(store, nullptr);
  Train(*store, 0, 12);
  const std::vector<double> expected = Snapshot(*store);
  absl::StatusOr<std::string> path = WriteCheckpoint(dir.path(), *store, State(12), Fast());
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, dir.path() + "/ckpt-12");

  absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(dir.path());
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  const CheckpointInfo& info = **found;
  EXPECT_EQ(info.step, 12);
  EXPECT_EQ(info.model_version, 12u);
  EXPECT_EQ(info.state.epoch, 1);
  EXPECT_EQ(info.state.config_hash, "abc123");
  EXPECT_EQ(info.state.data_cursor, State(12).data_cursor);
  EXPECT_EQ(info.state.rng["shuffle"].get<uint64_t>(), 12345678901ULL);

  // The uninterrupted run to step 15 (filled in at 2 shards, the original's).
  std::vector<double> continued;
  for (int shards : {2, 1, 3, 5}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    // Another seed: nothing may come from the fresh store's initial values.
    std::unique_ptr<ShmParamStore> restored = MakeStore(shards, UpdateMode::kHogwild, /*seed=*/99);
    ASSERT_NE(restored, nullptr);
    ASSERT_TRUE(RestoreCheckpoint(info, *restored).ok());
    EXPECT_EQ(Snapshot(*restored), expected);
    // Training goes on identically from the restored state (with the job's
    // seed: ids first seen later draw their initial values from it).
    std::unique_ptr<ShmParamStore> resumed = MakeStore(shards);
    ASSERT_NE(resumed, nullptr);
    ASSERT_TRUE(RestoreCheckpoint(info, *resumed).ok());
    Train(*resumed, 12, 15);
    if (shards == 2) {
      Train(*store, 12, 15);
      continued = Snapshot(*store);
    }
    EXPECT_EQ(Snapshot(*resumed), continued);
  }
}

TEST(CheckpointTest, TablesOfManyBlocksRoundTripAndKeepTheirRowOrder) {
  // Tables are written a block of rows at a time (VisitTableRowBlocks): a
  // shard of more rows than a block, a last block cut short, a dynamic
  // table's rows, and a wide table's shorter blocks (256 KiB of 100 floats a
  // row: 655 rows), restored into another shard count.
  constexpr int64_t kStaticRows = 2 * ShmParamStore::kTableRowBlockRows + 3;
  ASSERT_EQ(ShmParamStore::TableRowBlockRows(3), ShmParamStore::kTableRowBlockRows);
  ASSERT_EQ(ShmParamStore::TableRowBlockRows(100), 655);
  ASSERT_EQ(ShmParamStore::TableRowBlockRows(1 << 20), 16);
  auto make = [](int shards, uint64_t seed) {
    OpenStoreOptions o;
    o.store.job_name = "swtest-ckpt-blocks";
    o.store.huge_pages = HugePagePolicy::kOff;
    o.optimizer.type = OptimizerType::kSgd;
    OptimizerOptions sparse;
    sparse.type = OptimizerType::kAdagrad;
    sparse.lr = 0.1f;
    o.sparse_optimizer = sparse;
    o.num_shards = shards;
    o.seed = seed;
    o.tables = {Table("static", EmbeddingKind::kStatic, 3, kStaticRows),
                Table("dynamic", EmbeddingKind::kDynamic, 2, 3 * kStaticRows),
                Table("wide", EmbeddingKind::kStatic, 100, 2000)};
    absl::StatusOr<std::unique_ptr<ShmParamStore>> s = ShmParamStore::Create(o, Variables());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  };
  // Every row's params and slot, by table and id.
  auto rows_of = [](ShmParamStore& store) {
    std::map<std::pair<int, uint64_t>, std::vector<float>> rows;
    for (int t = 0; t < 3; ++t) {
      const int64_t dim = store.layout().tables[t].dim;
      EXPECT_TRUE(store
                      .VisitTableRows(t,
                                      [&](uint64_t id, const float* p, absl::Span<const float* const> slots,
                                          uint64_t) {
                                        std::vector<float>& r = rows[{t, id}];
                                        EXPECT_TRUE(r.empty()) << "id " << id << " visited twice";
                                        r.assign(p, p + dim);
                                        r.insert(r.end(), slots[0], slots[0] + dim);
                                        return absl::OkStatus();
                                      })
                      .ok());
    }
    return rows;
  };
  TempDir dir;
  std::unique_ptr<ShmParamStore> store = make(2, 3);
  ASSERT_NE(store, nullptr);
  RowScratch scratch;
  std::vector<uint64_t> sids, dids;
  for (int64_t i = 0; i < kStaticRows; i += 3) sids.push_back(static_cast<uint64_t>(i));
  for (int64_t i = 0; i < 2 * kStaticRows; ++i) dids.push_back(static_cast<uint64_t>(i) * 2654435761ULL + 17);
  std::vector<float> g(dids.size() * 3);
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.11f * static_cast<float>(i));
  ASSERT_TRUE(store->PushRows(0, sids, g.data(), 0.1f, &scratch).ok());
  ASSERT_TRUE(store->PushRows(1, dids, g.data(), 0.1f, &scratch).ok());
  std::vector<uint64_t> wids;
  for (uint64_t i = 0; i < 2000; i += 7) wids.push_back(i);
  std::vector<float> wg(wids.size() * 100);
  for (size_t i = 0; i < wg.size(); ++i) wg[i] = std::cos(0.07f * static_cast<float>(i));
  ASSERT_TRUE(store->PushRows(2, wids, wg.data(), 0.1f, &scratch).ok());
  const auto expected = rows_of(*store);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kStaticRows) + dids.size() + 2000);
  ASSERT_TRUE(WriteCheckpoint(dir.path(), *store, State(1), Fast()).ok());
  absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(dir.path());
  ASSERT_TRUE(found.ok() && found->has_value()) << found.status();
  EXPECT_EQ((**found).manifest.at("table_rows"), (nlohmann::json{kStaticRows, 2 * kStaticRows, 2000}));
  // The static table's file lists its rows shard by shard, each shard's in
  // order: local row r of shard s is id r * 2 + s.
  {
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> r =
        SafetensorsReader::Open((**found).path + "/table-0.safetensors");
    ASSERT_TRUE(r.ok()) << r.status();
    absl::StatusOr<absl::Span<const uint64_t>> ids = (*r)->GetAs<uint64_t>("ids");
    absl::StatusOr<absl::Span<const float>> params = (*r)->GetAs<float>("params");
    ASSERT_TRUE(ids.ok() && params.ok());
    ASSERT_EQ(ids->size(), static_cast<size_t>(kStaticRows));
    size_t i = 0;
    for (uint64_t s = 0; s < 2; ++s) {
      for (uint64_t id = s; id < static_cast<uint64_t>(kStaticRows); id += 2, ++i) {
        ASSERT_EQ((*ids)[i], id) << i;
        const std::vector<float>& want = expected.at({0, id});
        ASSERT_TRUE(std::equal(want.begin(), want.begin() + 3, params->begin() + 3 * i)) << "id " << id;
      }
    }
  }
  for (int shards : {1, 3}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    std::unique_ptr<ShmParamStore> restored = make(shards, 99);
    ASSERT_NE(restored, nullptr);
    ASSERT_TRUE(RestoreCheckpoint(**found, *restored).ok());
    EXPECT_EQ(rows_of(*restored), expected);
  }
}

TEST(CheckpointTest, RowLockStoreRoundTrips) {
  TempDir dir;
  std::unique_ptr<ShmParamStore> store = MakeStore(3, UpdateMode::kRowLock);
  ASSERT_NE(store, nullptr);
  Train(*store, 0, 5);
  ASSERT_TRUE(WriteCheckpoint(dir.path(), *store, State(5), Fast()).ok());
  absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(dir.path());
  ASSERT_TRUE(found.ok() && found->has_value());
  std::unique_ptr<ShmParamStore> restored = MakeStore(2, UpdateMode::kRowLock, 7);
  ASSERT_TRUE(RestoreCheckpoint(**found, *restored).ok());
  EXPECT_EQ(Snapshot(*restored), Snapshot(*store));
}

TEST(CheckpointTest, KeepsTheNewestAndThePointerNamesTheLatest) {
  TempDir dir;
  std::unique_ptr<ShmParamStore> store = MakeStore(2);
  ASSERT_NE(store, nullptr);
  for (int step = 1; step <= 4; ++step) {
    Train(*store, step - 1, step);
    ASSERT_TRUE(WriteCheckpoint(dir.path(), *store, State(step), Fast(/*keep=*/2)).ok());
  }
  const std::vector<std::string> left = ListCheckpoints(dir.path());
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(fs::path(left[0]).filename(), "ckpt-3");
  EXPECT_EQ(fs::path(left[1]).filename(), "ckpt-4");
  std::ifstream in(dir.path() + "/checkpoint");
  nlohmann::json pointer = nlohmann::json::parse(in);
  EXPECT_EQ(pointer["latest"], "ckpt-4");
  // Rewriting a step replaces it.
  ASSERT_TRUE(WriteCheckpoint(dir.path(), *store, State(4), Fast(2)).ok());
  EXPECT_EQ(ListCheckpoints(dir.path()).size(), 2u);
  // Bad options.
  CheckpointWriteOptions bad = Fast(0);
  EXPECT_EQ(WriteCheckpoint(dir.path(), *store, State(5), bad).status().code(), absl::StatusCode::kInvalidArgument);
}

void FlipByte(const std::string& file, int64_t offset_from_end) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-offset_from_end, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-offset_from_end, std::ios::end);
  f.put(static_cast<char>(c ^ 0x20));
}

// A damaged latest checkpoint is reported and the previous good one used.
TEST(CheckpointTest, DamagedLatestFallsBackToThePreviousOne) {
  struct Damage {
    const char* what;
    void (*apply)(const std::string& ckpt);
    const char* reason;
  };
  const Damage damages[] = {
      {"flipped byte in dense", [](const std::string& c) { FlipByte(c + "/dense.safetensors", 3); }, "CRC32C"},
      {"flipped byte in a table", [](const std::string& c) { FlipByte(c + "/table-1.safetensors", 9); }, "CRC32C"},
      {"truncated table file", [](const std::string& c) { fs::resize_file(c + "/table-0.safetensors", 100); }, "bytes"},
      {"missing manifest", [](const std::string& c) { fs::remove(c + "/manifest.json"); }, "manifest.json"},
      {"edited manifest", [](const std::string& c) { FlipByte(c + "/manifest.json", 40); }, "manifest"},
      {"missing file", [](const std::string& c) { fs::remove(c + "/dense.safetensors"); }, "missing"},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    TempDir dir;
    std::unique_ptr<ShmParamStore> store = MakeStore(2);
    ASSERT_NE(store, nullptr);
    Train(*store, 0, 3);
    const std::vector<double> at3 = Snapshot(*store);
    ASSERT_TRUE(WriteCheckpoint(dir.path(), *store, State(3), Fast()).ok());
    Train(*store, 3, 6);
    ASSERT_TRUE(WriteCheckpoint(dir.path(), *store, State(6), Fast()).ok());
    d.apply(dir.path() + "/ckpt-6");
    std::vector<std::string> skipped;
    absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(dir.path(), &skipped);
    ASSERT_TRUE(found.ok()) << found.status();
    ASSERT_TRUE(found->has_value());
    EXPECT_EQ((*found)->step, 3);
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_NE(skipped[0].find("ckpt-6"), std::string::npos) << skipped[0];
    EXPECT_NE(skipped[0].find(d.reason), std::string::npos) << skipped[0];
    std::unique_ptr<ShmParamStore> restored = MakeStore(1);
    ASSERT_TRUE(RestoreCheckpoint(**found, *restored).ok());
    EXPECT_EQ(Snapshot(*restored), at3);
  }
}

// A crash at each phase of writing ckpt-6 (in a forked child) leaves either
// ckpt-3 or a complete ckpt-6 as the latest good checkpoint, never one that
// loads wrongly; the next write succeeds and cleans up.
TEST(CheckpointTest, CrashAtEveryPhaseNeverLeavesABadCheckpoint) {
  const CheckpointCrashPoint points[] = {CheckpointCrashPoint::kAfterTensorFiles, CheckpointCrashPoint::kAfterManifest,
                                         CheckpointCrashPoint::kAfterRename, CheckpointCrashPoint::kAfterPointerTemp,
                                         CheckpointCrashPoint::kAfterPointer};
  for (CheckpointCrashPoint point : points) {
    SCOPED_TRACE(static_cast<int>(point));
    TempDir dir;
    std::unique_ptr<ShmParamStore> store = MakeStore(2);
    ASSERT_NE(store, nullptr);
    Train(*store, 0, 3);
    const std::vector<double> at3 = Snapshot(*store);
    ASSERT_TRUE(WriteCheckpoint(dir.path(), *store, State(3), Fast(/*keep=*/1)).ok());
    Train(*store, 3, 6);
    const std::vector<double> at6 = Snapshot(*store);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      CheckpointWriteOptions o;
      o.keep = 1;
      o.crash_at = point;
      (void)WriteCheckpoint(dir.path(), *store, State(6), o);
      ::_exit(0);  // not reached when the crash point is hit
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), kCheckpointCrashExitCode);

    absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(dir.path());
    ASSERT_TRUE(found.ok() && found->has_value());
    const bool renamed = point != CheckpointCrashPoint::kAfterTensorFiles && point != CheckpointCrashPoint::kAfterManifest;
    EXPECT_EQ((*found)->step, renamed ? 6 : 3);
    std::unique_ptr<ShmParamStore> restored = MakeStore(3);
    ASSERT_TRUE(RestoreCheckpoint(**found, *restored).ok());
    EXPECT_EQ(Snapshot(*restored), renamed ? at6 : at3);

    // The next checkpoint is written, and the dead writer's leftovers go.
    Train(*store, 6, 7);
    ASSERT_TRUE(WriteCheckpoint(dir.path(), *store, State(7), Fast(/*keep=*/1)).ok());
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"checkpoint", "ckpt-7", "history.jsonl"}));
    // The history lists every completed checkpoint once, pruned ones too.
    std::vector<std::pair<std::string, int64_t>> expected = {{"ckpt-3", 3}};
    if (renamed) expected.push_back({"ckpt-6", 6});
    expected.push_back({"ckpt-7", 7});
    EXPECT_EQ(CheckpointHistory(dir.path()), expected);
  }
}

TEST(CheckpointTest, MismatchedJobIsRefusedNamingTheDifference) {
  TempDir dir;
  std::unique_ptr<ShmParamStore> store = MakeStore(2);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(WriteCheckpoint(dir.path(), *store, State(1), Fast()).ok());
  absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(dir.path());
  ASSERT_TRUE(found.ok() && found->has_value());

  OpenStoreOptions o;
  o.store.job_name = "swtest-ckpt";
  o.store.huge_pages = HugePagePolicy::kOff;
  o.optimizer.type = OptimizerType::kAdam;
  OptimizerOptions sparse;
  sparse.type = OptimizerType::kAdagrad;
  o.sparse_optimizer = sparse;
  o.tables = {Table("static", EmbeddingKind::kStatic, kDim, 20), Table("dynamic", EmbeddingKind::kDynamic, kDim, 100)};
  auto other = ShmParamStore::Create(o, {VariableSpec{"w", 7, 4}, VariableSpec{"b", 3, 1}});
  ASSERT_TRUE(other.ok());
  absl::Status s = RestoreCheckpoint(**found, **other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("'w' [7, 3]"), absl::string_view::npos) << s;

  o.optimizer.type = OptimizerType::kSgd;
  auto sgd = ShmParamStore::Create(o, Variables());
  ASSERT_TRUE(sgd.ok());
  s = RestoreCheckpoint(**found, **sgd);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("dense optimizer is adam"), absl::string_view::npos) << s;
}

TEST(CheckpointTest, NoCheckpointIsNotAnError) {
  TempDir dir;
  absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(dir.path());
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->has_value());
  found = FindLatestCheckpoint(dir.path() + "/does-not-exist");
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->has_value());
}

}  // namespace
}  // namespace shardwild
