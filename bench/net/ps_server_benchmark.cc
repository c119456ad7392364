// The gRPC bridge on loopback against the same calls on the local store, in
// the same run: each BM_Remote* has a BM_Local* twin doing the same pull or
// push on the ShmParamStore the server serves, so the ratio of their rates
// is the cost of the bridge (protobuf, HTTP/2 over loopback, chunking, the
// server's validation and copies). Both use one thread.
//   build/bench/net/ps_server_benchmark --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "net/ps_client.h"
#include "net/ps_server.h"
#include "ps_shm/shm_store.h"

namespace shardwild {
namespace {

constexpr int64_t kCols = 256;
constexpr int64_t kRows = 4096;  // 4 MiB of parameters
constexpr int64_t kDim = 64;

struct Bridge {
  std::unique_ptr<ShmParamStore> store;
  std::unique_ptr<PsServer> server;
  std::unique_ptr<PsClient> client;
};

Bridge& TheBridge() {
  static Bridge* b = [] {
    auto* b = new Bridge;
    OpenStoreOptions o;
    o.store.job_name = "swbench-net";
    o.optimizer.type = OptimizerType::kAdagrad;
    o.num_shards = 2;
    TableSpec t;
    t.name = "emb";
    t.dim = kDim;
    t.capacity = 1 << 20;
    o.tables = {t};
    auto s = ShmParamStore::Create(o, {VariableSpec{"w", kRows, kCols, InitKind::kGlorotUniform, kCols, kCols}});
    if (!s.ok()) {
      std::fprintf(stderr, "ps_server_benchmark: %s\n", s.status().ToString().c_str());
      std::abort();
    }
    b->store = std::move(*s);
    auto server = PsServer::Start(PsServerOptions{}, b->store.get());
    if (!server.ok()) std::abort();
    b->server = std::move(*server);
    PsClientOptions co;
    co.address = b->server->address();
    auto client = PsClient::Create(co);
    if (!client.ok()) std::abort();
    b->client = std::move(*client);
    return b;
  }();
  return *b;
}

void SetRates(benchmark::State& state, int64_t bytes) {
  state.counters["bytes/s"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1024);
}

// Pull rows [0, rows) of the variable.
void BM_LocalPull(benchmark::State& state) {
  Bridge& b = TheBridge();
  const int64_t rows = state.range(0);
  std::vector<float> out(rows * kCols);
  const PullSlice slice{0, 0, rows, out.data()};
  for (auto _ : state) {
    if (!b.store->Pull({&slice, 1}).ok()) state.SkipWithError("pull failed");
    benchmark::DoNotOptimize(out.data());
  }
  SetRates(state, rows * kCols * 4);
}

void BM_RemotePull(benchmark::State& state) {
  Bridge& b = TheBridge();
  const int64_t rows = state.range(0);
  std::vector<float> out(rows * kCols);
  for (auto _ : state) {
    if (!b.client->PullDense(0, 0, rows, absl::MakeSpan(out)).ok()) state.SkipWithError("pull failed");
    benchmark::DoNotOptimize(out.data());
  }
  SetRates(state, rows * kCols * 4);
}

std::vector<uint64_t> Ids(int64_t n) {
  std::mt19937_64 rng(1);
  std::vector<uint64_t> ids(n);
  for (uint64_t& id : ids) id = rng() % (1 << 20);
  return ids;
}

// Push the gradients of `batch` random rows.
void BM_LocalPushRows(benchmark::State& state) {
  Bridge& b = TheBridge();
  const std::vector<uint64_t> ids = Ids(state.range(0));
  std::vector<float> grads(ids.size() * kDim, 0.01f);
  RowScratch scratch;
  for (auto _ : state) {
    if (!b.store->PushRows(0, ids, grads.data(), 0.01f, &scratch).ok()) state.SkipWithError("push failed");
  }
  SetRates(state, static_cast<int64_t>(ids.size()) * (kDim * 4 + 8));
}

void BM_RemotePushRows(benchmark::State& state) {
  Bridge& b = TheBridge();
  const std::vector<uint64_t> ids = Ids(state.range(0));
  std::vector<float> grads(ids.size() * kDim, 0.01f);
  for (auto _ : state) {
    if (!b.client->PushRows(0, ids, grads, 0.01f).ok()) state.SkipWithError("push failed");
  }
  SetRates(state, static_cast<int64_t>(ids.size()) * (kDim * 4 + 8));
}

BENCHMARK(BM_LocalPull)->ArgName("rows")->Arg(16)->Arg(kRows)->UseRealTime();
BENCHMARK(BM_RemotePull)->ArgName("rows")->Arg(16)->Arg(kRows)->UseRealTime();
BENCHMARK(BM_LocalPushRows)->ArgName("batch")->Arg(512)->UseRealTime();
BENCHMARK(BM_RemotePushRows)->ArgName("batch")->Arg(512)->UseRealTime();

}  // namespace
}  // namespace shardwild
