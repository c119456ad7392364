// RemoteParamStore over a real loopback PsServer behaves as the local store
// it serves: the same calls through the ParamStore interface give the same
// bits as on a local twin.
#include "net/remote_store.h"

#include <bit>
#include <cmath>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "core/base/status.h"
#include "core/model/hogwild_kernels.h"
#include "net/half.h"
#include "net/ps_server.h"
#include "ps_shm/shm_store.h"

namespace shardwild {
namespace {

constexpr char kToken[] = "remote-store-test-token-0123";

OpenStoreOptions Options(UpdateMode mode, bool bf16_table = false) {
  OpenStoreOptions o;
  o.store.job_name = "swtest-remote";
  o.store.huge_pages = HugePagePolicy::kOff;
  o.store.update = mode;
  o.optimizer.type = OptimizerType::kAdam;
  o.optimizer.lr = 0.01f;
  o.seed = 11;
  o.num_shards = 3;
  TableSpec t;
  t.name = "emb";
  t.kind = EmbeddingKind::kDynamic;
  t.dim = 6;
  t.capacity = 500;
  t.bf16 = bf16_table;
  o.tables = {t};
  return o;
}

std::vector<VariableSpec> Variables() {
  return {VariableSpec{"k", 50, 7, InitKind::kGlorotUniform, 7, 50}, VariableSpec{"bias", 1, 7, InitKind::kZeros}};
}

std::unique_ptr<ShmParamStore> Make(UpdateMode mode, bool bf16_table = false) {
  auto s = ShmParamStore::Create(Options(mode, bf16_table), Variables());
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// `store` served by a loopback PsServer with the test token, and a
// RemoteParamStore on it as task ps:0, pushing with `compression`.
struct Bridge {
  std::unique_ptr<PsServer> server;
  std::unique_ptr<RemoteParamStore> remote;
};
absl::StatusOr<Bridge> Serve(ShmParamStore* store, GradientCompression compression = GradientCompression::kNone) {
  PsServerOptions so;
  so.token = kToken;
  Bridge b;
  SW_ASSIGN_OR_RETURN(b.server, PsServer::Start(so, store));
  PsClientOptions co;
  co.address = b.server->address();
  co.task_name = "ps:0";
  co.token = kToken;
  co.compression = compression;
  SW_ASSIGN_OR_RETURN(b.remote, RemoteParamStore::Connect(co));
  return b;
}

// A few steps of a worker's traffic through the ParamStore interface; returns
// everything it pulled.
std::vector<float> Exercise(ParamStore& store) {
  std::vector<float> seen;
  RowScratch scratch;
  const StoreLayout& l = store.layout();
  for (int step = 0; step < 4; ++step) {
    std::vector<float> k(l.variables[0].size()), bias(l.variables[1].size());
    const PullSlice slices[] = {{0, 0, 50, k.data()}, {1, 0, 1, bias.data()}};
    EXPECT_TRUE(store.Pull(slices).ok());
    seen.insert(seen.end(), k.begin(), k.end());
    seen.insert(seen.end(), bias.begin(), bias.end());
    for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.1f * i + step) - 0.5f * k[i];
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.01f * (i + step);
    const DenseGrad grads[] = {{0, k.data()}, {1, bias.data()}};
    EXPECT_TRUE(store.Push(grads, 0.01f).ok());
    const std::vector<uint64_t> ids = {uint64_t{7} + step, 1ull << 40, 7, 99999};
    std::vector<float> rows(ids.size() * 6);
    EXPECT_TRUE(store.PullRows(0, ids, rows.data(), PullMode::kInsert, &scratch).ok());
    seen.insert(seen.end(), rows.begin(), rows.end());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.3f * std::sin(1.0f * i + step);
    EXPECT_TRUE(store.PushRows(0, ids, rows.data(), 0.05f, &scratch).ok());
    seen.push_back(static_cast<float>(store.version()));
  }
  return seen;
}

TEST(RemoteParamStoreTest, SameBitsAsTheLocalStore) {
  for (UpdateMode mode : {UpdateMode::kHogwild, UpdateMode::kRowLock}) {
    SCOPED_TRACE(UpdateModeName(mode));
    std::unique_ptr<ShmParamStore> served = Make(mode), local = Make(mode);
    ASSERT_TRUE(served && local);
    absl::StatusOr<Bridge> bridge = Serve(served.get());
    ASSERT_TRUE(bridge.ok()) << bridge.status();
    RemoteParamStore& remote = *bridge->remote;
    EXPECT_EQ(remote.name(), "ps:0/" + served->name());
    EXPECT_EQ(remote.layout().num_shards, 3);
    EXPECT_EQ(remote.layout().variables[0].name, "k");
    EXPECT_EQ(remote.layout().tables[0].dim, 6);
    const std::vector<float> via_remote = Exercise(remote);
    const std::vector<float> via_local = Exercise(*local);
    ASSERT_EQ(via_remote.size(), via_local.size());
    EXPECT_EQ(via_remote, via_local);
    // And the served store itself ends where the local one does.
    std::vector<float> a(350), b(350);
    ASSERT_TRUE(served->PullVariable(0, a.data()).ok());
    ASSERT_TRUE(local->PullVariable(0, b.data()).ok());
    EXPECT_EQ(a, b);
    // Errors come back as Status.
    std::vector<float> out(7);
    const PullSlice bad{0, 49, 51, out.data()};
    EXPECT_EQ(remote.Pull({&bad, 1}).code(), absl::StatusCode::kInvalidArgument);
    const uint64_t id = 5;
    EXPECT_EQ(remote.PullRows(3, {&id, 1}, out.data(), PullMode::kInsert, nullptr).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Hogwild workers on threads, all through one RemoteParamStore.
TEST(RemoteParamStoreTest, ConcurrentWorkers) {
  std::unique_ptr<ShmParamStore> served = Make(UpdateMode::kHogwild);
  ASSERT_TRUE(served);
  PsServerOptions so;
  absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(so, served.get());
  ASSERT_TRUE(server.ok()) << server.status();
  PsClientOptions co;
  co.address = (*server)->address();
  absl::StatusOr<std::unique_ptr<RemoteParamStore>> remote = RemoteParamStore::Connect(co);
  ASSERT_TRUE(remote.ok()) << remote.status();
  constexpr int kThreads = 4, kSteps = 10;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      RowScratch scratch;
      std::vector<float> k(350, 0.01f * (t + 1)), bias(7, 0.1f);
      for (int s = 0; s < kSteps; ++s) {
        const PullSlice slices[] = {{0, 0, 50, k.data()}, {1, 0, 1, bias.data()}};
        if (!(*remote)->Pull(slices).ok()) ++failures[t];
        std::fill(k.begin(), k.end(), 0.01f);
        const DenseGrad grads[] = {{0, k.data()}, {1, bias.data()}};
        if (!(*remote)->Push(grads, 0.01f).ok()) ++failures[t];
        const uint64_t ids[] = {static_cast<uint64_t>(t * 100 + s), 3};
        std::vector<float> g(12, 0.5f);
        if (!(*remote)->PushRows(0, ids, g.data(), 0.1f, &scratch).ok()) ++failures[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_EQ((*remote)->version(), static_cast<uint64_t>(kThreads * kSteps));
  EXPECT_EQ(served->version(), static_cast<uint64_t>(kThreads * kSteps));
}

// A bf16 model's pull over the bridge (model.precision bf16 with each
// cluster.compression): the wire carries f32 parameters, the client rounds
// them to bf16 (PullConvertingToBf16), and pushes compress as they always
// do, so a worker sees bf16(the parameters a local twin reaches with the
// compressed gradients).
TEST(RemoteParamStoreTest, Bf16PullsComposeWithCompression) {
  for (GradientCompression c : {GradientCompression::kNone, GradientCompression::kBf16, GradientCompression::kFp16}) {
    SCOPED_TRACE(GradientCompressionName(c));
    std::unique_ptr<ShmParamStore> served = Make(UpdateMode::kHogwild), local = Make(UpdateMode::kHogwild);
    ASSERT_TRUE(served && local);
    absl::StatusOr<Bridge> bridge = Serve(served.get(), c);
    ASSERT_TRUE(bridge.ok()) << bridge.status();
    RemoteParamStore& remote = *bridge->remote;
    auto on_wire = [c](float x) {
      switch (c) {
        case GradientCompression::kNone: return x;
        case GradientCompression::kBf16: return Bf16ToFloat(FloatToBf16(x));
        case GradientCompression::kFp16: return Fp16ToFloat(FloatToFp16(x));
      }
      return x;
    };
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g(350), rounded(350);
      for (size_t i = 0; i < g.size(); ++i) {
        g[i] = std::cos(0.37f * i + step) * 0.3f;
        rounded[i] = on_wire(g[i]);
      }
      std::vector<uint16_t> k16(350, 0xABCD);
      std::vector<float> bias(7, -9.0f);
      const PullSlice slices[] = {{0, 0, 50, nullptr, k16.data()}, {1, 0, 1, bias.data(), nullptr}};
      const DenseGrad grads[] = {{0, g.data()}};
      ASSERT_TRUE(remote.PushPull(grads, 0.01f, slices).ok());
      const DenseGrad local_grads[] = {{0, rounded.data()}};
      ASSERT_TRUE(local->Push(local_grads, 0.01f).ok());
      std::vector<float> want(350), want_bias(7);
      ASSERT_TRUE(local->PullVariable(0, want.data()).ok());
      ASSERT_TRUE(local->PullVariable(1, want_bias.data()).ok());
      std::vector<uint16_t> want16(350);
      HogwildCopyFromAsBf16(want.data(), want16.data(), 350);
      EXPECT_EQ(k16, want16) << "step " << step;
      EXPECT_EQ(bias, want_bias) << "step " << step;
    }
  }
}

// A bf16 table served over the bridge, its row pushes compressed: the
// client pulls the f32 (widened) rows the served table holds, and the
// served rows are bf16 values that moved the way the gradients say.
TEST(RemoteParamStoreTest, Bf16TableBehindTheBridgeWithCompressedPushes) {
  for (GradientCompression c : {GradientCompression::kNone, GradientCompression::kBf16}) {
    SCOPED_TRACE(GradientCompressionName(c));
    std::unique_ptr<ShmParamStore> served = Make(UpdateMode::kHogwild, /*bf16_table=*/true);
    ASSERT_TRUE(served);
    ASSERT_TRUE(served->layout().tables[0].bf16);
    absl::StatusOr<Bridge> bridge = Serve(served.get(), c);
    ASSERT_TRUE(bridge.ok()) << bridge.status();
    RemoteParamStore& remote = *bridge->remote;
    RowScratch scratch;
    const std::vector<uint64_t> ids = {5, 1ull << 40, 77};
    std::vector<float> before(ids.size() * 6), after(before.size()), local(before.size());
    ASSERT_TRUE(remote.PullRows(0, ids, before.data(), PullMode::kInsert, &scratch).ok());
    const std::vector<float> grads(ids.size() * 6, 0.25f);
    ASSERT_TRUE(remote.PushRows(0, ids, grads.data(), 1.0f, &scratch).ok());
    ASSERT_TRUE(remote.PullRows(0, ids, after.data(), PullMode::kReadOnly, &scratch).ok());
    ASSERT_TRUE(served->PullRows(0, ids, local.data(), PullMode::kReadOnly, &scratch).ok());
    EXPECT_EQ(after, local);
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(after[i]) & 0xFFFFu, 0u) << i;  // a bf16 value
      EXPECT_LT(after[i], before[i]) << i;  // Adam's first step moves against the gradient
    }
  }
}

}  // namespace
}  // namespace shardwild
