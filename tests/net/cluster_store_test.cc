// ClusterParamStore over two in-process loopback PsServers, each serving a
// partial store hosting its block of 5 shards, against one full
// ShmParamStore: the same calls give the same bits, through gRPC and through
// an attached (shared-memory) ps task alike.
#include "net/cluster_store.h"

#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status.h"
#include "core/model/hogwild_kernels.h"
#include "gtest/gtest.h"
#include "net/ps_server.h"
#include "ps_shm/shm_store.h"
#include "workers/checkpoint.h"

namespace shardwild {
namespace {

constexpr int kShards = 5;
constexpr int kPs = 2;
constexpr int64_t kDim = 4;
constexpr char kToken[] = "cluster-store-test-token-0123";

OpenStoreOptions Options(int first, int num) {
  OpenStoreOptions o;
  o.store.job_name = "swtest-cluster";
  o.store.huge_pages = HugePagePolicy::kOff;
  o.optimizer.type = OptimizerType::kAdam;
  o.optimizer.lr = 0.01f;
  OptimizerOptions sparse;
  sparse.type = OptimizerType::kAdagrad;
  sparse.lr = 0.1f;
  o.sparse_optimizer = sparse;
  o.seed = 23;
  o.num_shards = kShards;
  o.first_hosted_shard = first;
  o.num_hosted_shards = num;
  TableSpec st;
  st.name = "static";
  st.kind = EmbeddingKind::kStatic;
  st.dim = kDim;
  st.capacity = 40;
  TableSpec dy;
  dy.name = "dynamic";
  dy.kind = EmbeddingKind::kDynamic;
  dy.dim = kDim;
  dy.capacity = 300;
  o.tables = {st, dy};
  return o;
}

// w on all 5 shards (both ps tasks), b whole on shard 0 (ps:0), c on shards
// 0..2 (ps:0), d whole on shard 1 (ps:0), e whole on shard 2, f on 3.
std::vector<VariableSpec> Variables() {
  return {VariableSpec{"w", 23, 3, InitKind::kGlorotUniform, 23, 3}, VariableSpec{"b", 1, 3, InitKind::kZeros},
          VariableSpec{"c", 3, 2, InitKind::kGlorotUniform, 3, 2}, VariableSpec{"d", 1, 5, InitKind::kGlorotUniform, 1, 5},
          VariableSpec{"e", 1, 2, InitKind::kGlorotUniform, 1, 2}, VariableSpec{"f", 1, 2, InitKind::kGlorotUniform, 1, 2}};
}

std::unique_ptr<ShmParamStore> Make(int first, int num, std::vector<VariableSpec> variables = Variables(),
                                    StoreMemoryKind memory = StoreMemoryKind::kAuto) {
  OpenStoreOptions o = Options(first, num);
  o.store.memory_kind = memory;
  absl::StatusOr<std::unique_ptr<ShmParamStore>> s = ShmParamStore::Create(o, std::move(variables));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// Two ps tasks, each a partial store behind a loopback PsServer; `variables`
// empty gives stores of the tables only (the ps tasks of train.strategy
// allreduce).
struct Cluster {
  ShardMap map;
  std::vector<std::unique_ptr<ShmParamStore>> stores;
  std::vector<std::unique_ptr<PsServer>> servers;
  std::vector<PsClientOptions> clients;

  static std::unique_ptr<Cluster> Start(const std::vector<std::string>& checkpoint_dirs = {},
                                        const std::vector<VariableSpec>& variables = Variables(),
                                        StoreMemoryKind memory = StoreMemoryKind::kAuto) {
    auto c = std::make_unique<Cluster>();
    absl::StatusOr<ShardMap> map = ShardMap::Make(kShards, kPs);
    EXPECT_TRUE(map.ok());
    if (!map.ok()) return nullptr;
    c->map = *map;
    for (int p = 0; p < kPs; ++p) {
      c->stores.push_back(Make(c->map.first_shard(p), c->map.num_shards_of(p), variables, memory));
      if (!c->stores.back()) return nullptr;
      PsServerOptions so;
      so.token = kToken;
      so.task_name = absl::StrCat("ps:", p);
      if (!checkpoint_dirs.empty()) so.checkpoint_dir = checkpoint_dirs[p];
      absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(so, c->stores.back().get());
      EXPECT_TRUE(server.ok()) << server.status();
      if (!server.ok()) return nullptr;
      PsClientOptions co;
      co.address = (*server)->address();
      co.task_name = absl::StrCat("ps:", p);
      co.token = kToken;
      co.max_attempts = 2;
      co.initial_backoff_s = 0.01;
      co.deadline_s = 5;
      co.max_message_bytes = 4096;  // several chunks per tensor
      c->clients.push_back(co);
      c->servers.push_back(*std::move(server));
    }
    return c;
  }
};

// A ClusterParamStore over `c`; with `attach`, ps:1 through shared memory
// (its attached store kept in *attached, which must outlive the result).
absl::StatusOr<std::unique_ptr<ClusterParamStore>> ConnectTo(Cluster& c, bool attach,
                                                             std::unique_ptr<ShmParamStore>* attached,
                                                             const ClusterStoreOptions& options = {}) {
  std::vector<ParamStore*> local;
  if (attach) {
    SW_ASSIGN_OR_RETURN(*attached, ShmParamStore::Attach(c.stores[1]->name(), Options(0, -1).optimizer,
                                                         Options(0, -1).sparse_optimizer));
    local = {nullptr, attached->get()};
  }
  return ClusterParamStore::Connect(c.map, c.clients, local, options);
}

// A worker's traffic: dense pulls (whole and straddling the ps boundary) and
// pushes, row pulls and pushes with repeated ids of both tables, versions.
// Returns everything it saw. A store without variables gets the row traffic
// only.
// With `flush`, its asynchronous pushes are waited for before each read, so
// the reads see every push as a synchronous store would.
std::vector<float> Exercise(ParamStore& store, ClusterParamStore* flush = nullptr) {
  std::vector<float> seen;
  RowScratch scratch;
  const StoreLayout& l = store.layout();
  const int nvars = static_cast<int>(l.variables.size());
  for (int step = 0; step < 4; ++step) {
    if (nvars > 0) {
      std::vector<std::vector<float>> vals(nvars);
      std::vector<PullSlice> slices;
      for (int v = 0; v < nvars; ++v) {
        vals[v].resize(l.variables[v].size());
        slices.push_back({v, 0, l.variables[v].rows, vals[v].data()});
      }
      std::vector<float> mid(8 * 3);
      slices.push_back({0, 10, 18, mid.data()});  // rows 10..18 of w: ps:0 and ps:1
      if (flush != nullptr) {
        EXPECT_TRUE(flush->Flush().ok());
      }
      EXPECT_TRUE(store.Pull(slices).ok());
      for (const std::vector<float>& v : vals) seen.insert(seen.end(), v.begin(), v.end());
      seen.insert(seen.end(), mid.begin(), mid.end());
      std::vector<DenseGrad> grads;
      for (int v = 0; v < nvars; ++v) {
        if (step % 2 == 1 && v == 1) continue;  // not every variable every step
        for (size_t i = 0; i < vals[v].size(); ++i) vals[v][i] = std::cos(0.1f * i + step + v) - 0.5f * vals[v][i];
        grads.push_back({v, vals[v].data()});
      }
      EXPECT_TRUE(store.Push(grads, 0.01f).ok());
    }
    for (int t = 0; t < 2; ++t) {
      std::vector<uint64_t> ids;
      for (uint64_t i = 0; i < 17; ++i) ids.push_back(t == 0 ? (i * 7 + step) % 40 : i * 1000003 + step);
      ids.push_back(ids[3]);
      ids.push_back(ids[3]);
      std::vector<float> rows(ids.size() * kDim);
      EXPECT_TRUE(store.PullRows(t, ids, rows.data(), PullMode::kInsert, &scratch).ok());
      seen.insert(seen.end(), rows.begin(), rows.end());
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.3f * std::sin(1.0f * i + step + t);
      EXPECT_TRUE(store.PushRows(t, ids, rows.data(), 0.05f, &scratch).ok());
    }
    // A step's lookups in one batch: both tables, table 0 twice (two
    // updates of its rows, as two PushRows), one part empty, and a part of
    // 400 ids, more than one 4 KiB request holds.
    if (flush != nullptr) {
      EXPECT_TRUE(flush->Flush().ok());
    }
    std::vector<std::vector<uint64_t>> ids(4);
    for (uint64_t i = 0; i < 400; ++i) ids[0].push_back((i * 13 + step) % 40);
    for (uint64_t i = 0; i < 9; ++i) ids[1].push_back(i * 999983 + 7 * step);
    for (uint64_t i = 0; i < 6; ++i) ids[3].push_back((i * 5 + step) % 40);
    const int tables[] = {0, 1, 1, 0};
    std::vector<std::vector<float>> rows(4);
    std::vector<RowPull> pulls;
    for (int k = 0; k < 4; ++k) {
      rows[k].assign(ids[k].size() * kDim, -1.0f);
      pulls.push_back({tables[k], ids[k], rows[k].data()});
    }
    EXPECT_TRUE(store.PullRowsBatch(pulls, PullMode::kInsert, &scratch).ok());
    std::vector<RowGrad> pushes;
    for (int k = 0; k < 4; ++k) {
      seen.insert(seen.end(), rows[k].begin(), rows[k].end());
      for (size_t i = 0; i < rows[k].size(); ++i) rows[k][i] = 0.2f * std::cos(0.5f * i + step + k);
      pushes.push_back({tables[k], ids[k], rows[k].data()});
    }
    EXPECT_TRUE(store.PushRowsBatch(pushes, 0.05f, &scratch).ok());
    if (flush != nullptr) {
      EXPECT_TRUE(flush->Flush().ok());
    }
    seen.push_back(static_cast<float>(store.version()));
  }
  return seen;
}

TEST(ClusterParamStoreTest, SameBitsAsOneFullStore) {
  for (bool attach : {false, true}) {
    SCOPED_TRACE(attach ? "ps:1 attached through shared memory" : "all through gRPC");
    std::unique_ptr<Cluster> c = Cluster::Start();
    ASSERT_TRUE(c);
    std::unique_ptr<ShmParamStore> full = Make(0, -1);
    ASSERT_TRUE(full);
    std::unique_ptr<ShmParamStore> attached;
    absl::StatusOr<std::unique_ptr<ClusterParamStore>> cluster = ConnectTo(*c, attach, &attached);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    ClusterParamStore& cs = **cluster;
    EXPECT_EQ(cs.is_local(1), attach);
    EXPECT_FALSE(cs.is_local(0));
    EXPECT_EQ(cs.layout().num_shards, kShards);
    EXPECT_EQ(cs.name(), absl::StrCat("ps:0/", c->stores[0]->name(), ",ps:1/", c->stores[1]->name()));
    const std::vector<float> via_cluster = Exercise(cs);
    const std::vector<float> via_full = Exercise(*full);
    ASSERT_EQ(via_cluster.size(), via_full.size());
    EXPECT_TRUE(via_cluster == via_full);
    // The ps tasks' stores hold the full store's rows.
    for (int p = 0; p < kPs; ++p) {
      for (size_t v = 0; v < Variables().size(); ++v) {
        const RowRange h = c->stores[p]->hosted_rows(static_cast<int>(v));
        std::vector<float> a(h.size() * Variables()[v].cols), b(a.size());
        const PullSlice sa{static_cast<int>(v), h.begin, h.end, a.data()};
        const PullSlice sb{static_cast<int>(v), h.begin, h.end, b.data()};
        ASSERT_TRUE(c->stores[p]->Pull({&sa, 1}).ok());
        ASSERT_TRUE(full->Pull({&sb, 1}).ok());
        EXPECT_EQ(a, b) << "ps:" << p << " " << Variables()[v].name;
      }
    }
    EXPECT_EQ(cs.version(), full->version());
    const PsClient::Stats stats = cs.stats();
    EXPECT_GT(stats.bytes_sent, 0u);
    EXPECT_GT(stats.bytes_received, 0u);
    // Errors: bad arguments are refused before any ps task is called.
    std::vector<float> out(64);
    const PullSlice bad{0, 20, 24, out.data()};
    EXPECT_EQ(cs.Pull({&bad, 1}).code(), absl::StatusCode::kInvalidArgument);
    const uint64_t ids[] = {3, 40};
    EXPECT_EQ(cs.PushRows(0, ids, out.data(), 0.1f, nullptr).code(), absl::StatusCode::kInvalidArgument);
    // A bad id in the last part of a batch: no part is pushed.
    std::vector<float> before(2 * kDim), after(2 * kDim);
    const uint64_t good[] = {3, 4};
    ASSERT_TRUE(cs.PullRows(0, good, before.data(), PullMode::kReadOnly, nullptr).ok());
    const RowGrad batch[] = {{0, good, out.data()}, {0, ids, out.data()}};
    const absl::Status bad_batch = cs.PushRowsBatch(batch, 0.1f, nullptr);
    EXPECT_EQ(bad_batch.code(), absl::StatusCode::kInvalidArgument) << bad_batch;
    ASSERT_TRUE(cs.PullRows(0, good, after.data(), PullMode::kReadOnly, nullptr).ok());
    EXPECT_EQ(before, after);
    const RowPull bad_pull[] = {{0, good, out.data()}, {2, good, out.data()}};
    EXPECT_EQ(cs.PullRowsBatch(bad_pull, PullMode::kInsert, nullptr).code(), absl::StatusCode::kInvalidArgument);
  }
}

// The ps tasks of train.strategy allreduce (net/ps_task.h) host the
// embedding tables only: stores of no variables serve, describe themselves
// (GetLayout) and are connected to like any other, and their rows take the
// same values as a one-store model's, pushes synchronous or asynchronous.
TEST(ClusterParamStoreTest, TablesOnlyPsTasks) {
  for (bool attach : {false, true}) {
    for (int async : {0, 2}) {
      SCOPED_TRACE(absl::StrCat(attach ? "ps:1 attached through shared memory" : "all through gRPC",
                                ", async_pushes ", async));
      std::unique_ptr<Cluster> c = Cluster::Start({}, {});
      ASSERT_TRUE(c);
      EXPECT_TRUE(c->stores[0]->layout().variables.empty());
      std::unique_ptr<ShmParamStore> full = Make(0, -1, {});
      ASSERT_TRUE(full);
      ClusterStoreOptions options;
      options.async_pushes = async;
      std::unique_ptr<ShmParamStore> attached;
      absl::StatusOr<std::unique_ptr<ClusterParamStore>> cluster = ConnectTo(*c, attach, &attached, options);
      ASSERT_TRUE(cluster.ok()) << cluster.status();
      ClusterParamStore& cs = **cluster;
      EXPECT_TRUE(cs.layout().variables.empty());
      ASSERT_EQ(cs.layout().tables.size(), 2u);
      EXPECT_EQ(cs.layout().tables[1].name, "dynamic");
      EXPECT_EQ(cs.layout().num_shards, kShards);
      const std::vector<float> via_cluster = Exercise(cs, async > 0 ? &cs : nullptr);
      const std::vector<float> via_full = Exercise(*full);
      ASSERT_EQ(via_cluster.size(), via_full.size());
      EXPECT_FALSE(via_cluster.empty());
      EXPECT_TRUE(via_cluster == via_full);
      // There is no dense variable to pull or push.
      std::vector<float> out(8);
      const PullSlice slice{0, 0, 1, out.data()};
      EXPECT_EQ(cs.Pull({&slice, 1}).code(), absl::StatusCode::kInvalidArgument);
      const DenseGrad grad{0, out.data()};
      EXPECT_EQ(cs.Push({&grad, 1}, 0.1f).code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

// A bf16 model's pulls through the cluster store (PullSlice::out_bf16):
// every variable whole (those split over both ps tasks too), over gRPC or with
// ps:1 attached through shared memory, comes back as the f32 parameters
// rounded to bf16.
TEST(ClusterParamStoreTest, Bf16PullsRoundWhatTheTasksHold) {
  for (bool attach : {false, true}) {
    SCOPED_TRACE(attach ? "ps:1 attached through shared memory" : "all through gRPC");
    std::unique_ptr<Cluster> c = Cluster::Start();
    ASSERT_TRUE(c);
    std::unique_ptr<ShmParamStore> attached;
    absl::StatusOr<std::unique_ptr<ClusterParamStore>> cluster = ConnectTo(*c, attach, &attached);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    ClusterParamStore& cs = **cluster;
    const std::vector<VariableSpec> vars = Variables();
    for (size_t v = 0; v < vars.size(); ++v) {
      std::vector<float> f32(vars[v].size());
      const PullSlice sf{static_cast<int>(v), 0, vars[v].rows, f32.data()};
      ASSERT_TRUE(cs.Pull({&sf, 1}).ok());
      std::vector<uint16_t> want(f32.size()), got(f32.size(), 0xABCD);
      HogwildCopyFromAsBf16(f32.data(), want.data(), static_cast<int64_t>(f32.size()));
      const PullSlice sb{static_cast<int>(v), 0, vars[v].rows, nullptr, got.data()};
      ASSERT_TRUE(cs.Pull({&sb, 1}).ok());
      EXPECT_EQ(got, want) << vars[v].name;
    }
  }
}

// Asynchronous dense pushes (ClusterStoreOptions::async_pushes): flushed
// before every read they give the same bits as one full store; a push that
// fails in flight is reported once, by the next Flush, naming its ps task.
TEST(ClusterParamStoreTest, AsyncPushesLandByFlushAndFailuresAreReportedOnce) {
  for (bool attach : {false, true}) {
    SCOPED_TRACE(attach ? "ps:1 attached through shared memory" : "all through gRPC");
    std::unique_ptr<Cluster> c = Cluster::Start();
    ASSERT_TRUE(c);
    std::unique_ptr<ShmParamStore> full = Make(0, -1);
    ASSERT_TRUE(full);
    ClusterStoreOptions options;
    options.async_pushes = 2;
    std::unique_ptr<ShmParamStore> attached;
    absl::StatusOr<std::unique_ptr<ClusterParamStore>> cluster = ConnectTo(*c, attach, &attached, options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    const std::vector<float> via_cluster = Exercise(**cluster, cluster->get());
    const std::vector<float> via_full = Exercise(*full);
    ASSERT_EQ(via_cluster.size(), via_full.size());
    EXPECT_TRUE(via_cluster == via_full);

    // ps:0 goes away: the push returns (its ps:0 part travels on), the
    // failure comes with the next Flush, once.
    c->servers[0]->Shutdown(0.1);
    std::vector<float> w(23 * 3, 0.5f);
    const DenseGrad g{0, w.data()};
    EXPECT_TRUE((*cluster)->Push({&g, 1}, 0.1f).ok());
    const absl::Status s = (*cluster)->Flush();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_NE(s.message().find("ps:0"), std::string::npos) << s;
    EXPECT_TRUE((*cluster)->Flush().ok());
  }
  // Out of range.
  std::unique_ptr<Cluster> c = Cluster::Start();
  ASSERT_TRUE(c);
  ClusterStoreOptions bad;
  bad.async_pushes = 65;
  EXPECT_EQ(ClusterParamStore::Connect(c->map, c->clients, {}, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ClusterParamStoreTest, ConcurrentCallersAreServedInParallel) {
  for (int async : {0, 4}) {
    SCOPED_TRACE(async ? "asynchronous pushes" : "synchronous pushes");
    std::unique_ptr<Cluster> c = Cluster::Start();
    ASSERT_TRUE(c);
    ClusterStoreOptions options;
    options.threads_per_ps = 2;
    options.async_pushes = async;
    absl::StatusOr<std::unique_ptr<ClusterParamStore>> cluster =
        ClusterParamStore::Connect(c->map, c->clients, {}, options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    constexpr int kThreads = 4, kSteps = 8;
    std::vector<int> failures(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        RowScratch scratch;
        std::vector<float> w(23 * 3, 0.01f * (t + 1));
        for (int s = 0; s < kSteps; ++s) {
          const PullSlice sl{0, 0, 23, w.data()};
          if (!(*cluster)->Pull({&sl, 1}).ok()) ++failures[t];
          std::fill(w.begin(), w.end(), 0.01f);
          const DenseGrad g{0, w.data()};
          if (!(*cluster)->Push({&g, 1}, 0.01f).ok()) ++failures[t];
          const uint64_t ids[] = {static_cast<uint64_t>(t * 100 + s), 3, 1ull << 50};
          std::vector<float> rg(3 * kDim, 0.5f);
          if (!(*cluster)->PushRows(1, ids, rg.data(), 0.1f, &scratch).ok()) ++failures[t];
        }
      });
    }
    for (std::thread& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
    EXPECT_TRUE((*cluster)->Flush().ok());
    EXPECT_EQ((*cluster)->version(), static_cast<uint64_t>(kThreads * kSteps));
  }
}

TEST(ClusterParamStoreTest, PushNotCoveringTheHostedRowsIsInvalid) {
  std::unique_ptr<Cluster> c = Cluster::Start();
  ASSERT_TRUE(c);
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Create(c->clients[1]);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<RemoteLayout> layout = (*client)->GetLayout();
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->first_hosted_shard, 3);
  EXPECT_EQ(layout->num_hosted_shards, 2);
  // ps:1 hosts rows 15..23 of w (5,5,5,4,4): floats 45..69.
  std::vector<float> before(8 * 3);
  ASSERT_TRUE((*client)->PullDense(0, 15, 23, absl::MakeSpan(before)).ok());
  std::vector<float> whole(23 * 3, 1.0f);
  struct Case {
    const char* what;
    RemoteDenseGrad grad;
  };
  const Case cases[] = {
      {"the whole variable", {0, absl::MakeConstSpan(whole), 0}},
      {"too few rows", {0, absl::MakeConstSpan(whole).subspan(45, 21), 45}},
      {"starting late", {0, absl::MakeConstSpan(whole).subspan(48, 21), 48}},
      {"a variable it has no rows of", {1, absl::MakeConstSpan(whole).subspan(0, 3), 0}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    absl::StatusOr<uint64_t> v = (*client)->PushDense({&k.grad, 1}, 0.1f);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << v.status();
    EXPECT_NE(v.status().message().find("ps:1"), std::string::npos) << v.status();
  }
  std::vector<float> after(before.size());
  ASSERT_TRUE((*client)->PullDense(0, 15, 23, absl::MakeSpan(after)).ok());
  EXPECT_EQ(before, after);
  // Exactly the hosted rows: applied.
  const RemoteDenseGrad good{0, absl::MakeConstSpan(whole).subspan(45, 24), 45};
  ASSERT_TRUE((*client)->PushDense({&good, 1}, 0.1f).ok());
  ASSERT_TRUE((*client)->PullDense(0, 15, 23, absl::MakeSpan(after)).ok());
  EXPECT_NE(before, after);
  // Rows and ids it does not host.
  std::vector<float> out(3 * 3, -1.0f);
  absl::Status s = (*client)->PullDense(0, 14, 17, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("not hosted"), std::string::npos) << s;
  EXPECT_EQ(out[0], -1.0f);
  const uint64_t ids[] = {3, 0};  // static: shard 3 (hosted), shard 0 (not)
  std::vector<float> rows(2 * kDim, -1.0f);
  s = (*client)->PullRows(0, ids, absl::MakeSpan(rows));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(rows[0], -1.0f);
  std::vector<float> one(kDim), one_after(kDim);
  ASSERT_TRUE((*client)->PullRows(0, {ids, 1}, absl::MakeSpan(one)).ok());
  EXPECT_EQ((*client)->PushRows(0, ids, rows, 0.5f).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*client)->PullRows(0, {ids, 1}, absl::MakeSpan(one_after)).ok());
  EXPECT_EQ(one, one_after);
}

TEST(ClusterParamStoreTest, ConnectChecksTheShardMap) {
  std::unique_ptr<Cluster> c = Cluster::Start();
  ASSERT_TRUE(c);
  // The tasks swapped: ps:0's address serves shards 3..4.
  std::vector<PsClientOptions> swapped = {c->clients[1], c->clients[0]};
  swapped[0].task_name = "ps:0";
  swapped[1].task_name = "ps:1";
  absl::StatusOr<std::unique_ptr<ClusterParamStore>> cluster = ClusterParamStore::Connect(c->map, swapped);
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cluster.status().message().find("ps:0"), std::string::npos) << cluster.status();
  EXPECT_NE(cluster.status().message().find("shards 3..4"), std::string::npos) << cluster.status();
  // Another shard count.
  absl::StatusOr<ShardMap> six = ShardMap::Make(6, 2);
  ASSERT_TRUE(six.ok());
  cluster = ClusterParamStore::Connect(*six, c->clients);
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kFailedPrecondition) << cluster.status();
  // A local store that is not the served one.
  std::unique_ptr<ShmParamStore> other = Make(3, 2);
  ASSERT_TRUE(other);
  cluster = ClusterParamStore::Connect(c->map, c->clients, {nullptr, other.get()});
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cluster.status().message().find("ps:1"), std::string::npos) << cluster.status();
}

TEST(ClusterParamStoreTest, AttachLocalPsStoresFindsLoopbackTasks) {
  std::unique_ptr<Cluster> c = Cluster::Start();
  ASSERT_TRUE(c);
  const OpenStoreOptions o = Options(0, -1);
  LocalPsStores local = AttachLocalPsStores(c->clients, "localhost", o.optimizer, o.sparse_optimizer);
  ASSERT_EQ(local.stores.size(), 2u);
  for (int p = 0; p < kPs; ++p) {
    ASSERT_NE(local.stores[p], nullptr) << local.fallbacks[p];
    EXPECT_EQ(local.stores[p]->name(), c->stores[p]->name());
  }
  absl::StatusOr<std::unique_ptr<ClusterParamStore>> cluster =
      ClusterParamStore::Connect(c->map, c->clients, local.pointers());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_TRUE((*cluster)->is_local(0) && (*cluster)->is_local(1));
  // Another host: nothing attached, nothing to report.
  LocalPsStores none = AttachLocalPsStores(c->clients, "elsewhere.example", o.optimizer, o.sparse_optimizer);
  EXPECT_EQ(none.stores[0], nullptr);
  EXPECT_TRUE(none.fallbacks[0].empty());
  // A wrong optimizer: falls back to gRPC, saying why.
  OptimizerOptions sgd;
  sgd.type = OptimizerType::kSgd;
  LocalPsStores wrong = AttachLocalPsStores(c->clients, "127.0.0.1", sgd, o.sparse_optimizer);
  EXPECT_EQ(wrong.stores[1], nullptr);
  EXPECT_NE(wrong.fallbacks[1].find("ps:1"), std::string::npos) << wrong.fallbacks[1];
}

// ps tasks whose stores are private memory (ps.memory_kind private): a
// worker on their host cannot attach, says which task and why, and reaches
// them through gRPC with the same results as one full store.
TEST(ClusterParamStoreTest, PrivateMemoryPsTasksAreReachedThroughGrpc) {
  std::unique_ptr<Cluster> c = Cluster::Start({}, Variables(), StoreMemoryKind::kPrivate);
  ASSERT_TRUE(c);
  const OpenStoreOptions o = Options(0, -1);
  LocalPsStores local = AttachLocalPsStores(c->clients, "127.0.0.1", o.optimizer, o.sparse_optimizer);
  for (int p = 0; p < kPs; ++p) {
    ASSERT_TRUE(c->stores[p]->private_memory());
    EXPECT_EQ(local.stores[p], nullptr);
    EXPECT_NE(local.fallbacks[p].find(absl::StrCat("ps:", p)), std::string::npos) << local.fallbacks[p];
    EXPECT_NE(local.fallbacks[p].find("cannot attach"), std::string::npos) << local.fallbacks[p];
  }
  absl::StatusOr<std::unique_ptr<ClusterParamStore>> cluster =
      ClusterParamStore::Connect(c->map, c->clients, local.pointers());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_FALSE((*cluster)->is_local(0) || (*cluster)->is_local(1));
  std::unique_ptr<ShmParamStore> full = Make(0, -1);
  ASSERT_TRUE(full);
  EXPECT_TRUE(Exercise(**cluster) == Exercise(*full));
}

TEST(ClusterParamStoreTest, SaveAndRestoreShards) {
  const std::string base = ::testing::TempDir() + "/cluster_store_test_" + std::to_string(::getpid());
  const std::vector<std::string> dirs = {base + "/ps0", base + "/ps1"};
  std::unique_ptr<Cluster> c = Cluster::Start(dirs);
  ASSERT_TRUE(c);
  absl::StatusOr<std::unique_ptr<ClusterParamStore>> cluster = ClusterParamStore::Connect(c->map, c->clients);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClusterParamStore& cs = **cluster;
  (void)Exercise(cs);
  std::vector<float> saved(23 * 3);
  ASSERT_TRUE(cs.PullVariable(0, saved.data()).ok());
  const uint64_t saved_version = cs.version();
  absl::StatusOr<std::vector<std::string>> paths = cs.SaveShards(7);
  ASSERT_TRUE(paths.ok()) << paths.status();
  ASSERT_EQ(paths->size(), 2u);
  EXPECT_EQ((*paths)[0], dirs[0] + "/ckpt-7");
  EXPECT_EQ((*paths)[1], dirs[1] + "/ckpt-7");
  (void)Exercise(cs);
  std::vector<float> now(saved.size());
  ASSERT_TRUE(cs.PullVariable(0, now.data()).ok());
  EXPECT_NE(now, saved);
  absl::StatusOr<int64_t> step = cs.RestoreShards(std::nullopt);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 7);
  ASSERT_TRUE(cs.PullVariable(0, now.data()).ok());
  EXPECT_EQ(now, saved);
  EXPECT_EQ(cs.version(), saved_version);
  step = cs.RestoreShards(7);
  ASSERT_TRUE(step.ok()) << step.status();
  // A step only one ps task has: the error names the other.
  CheckpointState state;
  state.step = 8;
  ASSERT_TRUE(WriteCheckpoint(dirs[0], *c->stores[0], state).ok());
  step = cs.RestoreShards(8);
  EXPECT_FALSE(step.ok());
  EXPECT_NE(step.status().message().find("ps:1"), std::string::npos) << step.status();
  step = cs.RestoreShards(std::nullopt);  // newest: 8 on ps:0, 7 on ps:1
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition) << step.status();
  std::error_code ec;
  std::filesystem::remove_all(base, ec);
}

TEST(ClusterParamStoreTest, StoppedServerIsUnavailableNamingTheTask) {
  std::unique_ptr<Cluster> c = Cluster::Start();
  ASSERT_TRUE(c);
  absl::StatusOr<std::unique_ptr<ClusterParamStore>> cluster = ClusterParamStore::Connect(c->map, c->clients);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  c->servers[1]->Shutdown(0.1);
  std::vector<float> w(23 * 3);
  const PullSlice sl{0, 0, 23, w.data()};
  absl::Status s = (*cluster)->Pull({&sl, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("ps:1"), std::string::npos) << s;
  EXPECT_NE(s.message().find(c->clients[1].address), std::string::npos) << s;
  // ps:0 alone still answers.
  const PullSlice first{0, 0, 15, w.data()};
  EXPECT_TRUE((*cluster)->Pull({&first, 1}).ok());
  const DenseGrad g{0, w.data()};
  s = (*cluster)->Push({&g, 1}, 0.1f);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("ps:1"), std::string::npos) << s;
  s = (*cluster)->SaveShards(1).status();
  EXPECT_NE(s.message().find("ps:"), std::string::npos) << s;
  // Connecting now fails the same way.
  EXPECT_EQ(ClusterParamStore::Connect(c->map, c->clients).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace shardwild
