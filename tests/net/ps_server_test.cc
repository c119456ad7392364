// Real PsServers on loopback (port 0: the kernel picks a free port, read
// back with port()), started and stopped by each test, called by PsClient
// and by the raw generated stub (to send what PsClient never would).
#include "net/ps_server.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "net/health.grpc.pb.h"
#include "net/ps.grpc.pb.h"
#include "net/half.h"
#include "net/ps_client.h"
#include "net/ps_service.h"

namespace shardwild {
namespace {

namespace fs = std::filesystem;

constexpr char kToken[] = "test-token-0123456789abcdef";
constexpr int kStatic = 0, kDynamic = 1;  // table indices
constexpr int64_t kStaticDim = 4, kDynamicDim = 3;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack) << "\nlacks: " << (needle)

OpenStoreOptions StoreOptions() {
  OpenStoreOptions o;
  o.store.job_name = "swtest-net";
  o.store.huge_pages = HugePagePolicy::kOff;
  o.optimizer.type = OptimizerType::kAdagrad;
  o.optimizer.lr = 0.1f;
  o.seed = 7;
  o.num_shards = 2;
  TableSpec s;
  s.name = "emb";
  s.kind = EmbeddingKind::kStatic;
  s.dim = kStaticDim;
  s.capacity = 100;
  TableSpec d;
  d.name = "dyn";
  d.kind = EmbeddingKind::kDynamic;
  d.dim = kDynamicDim;
  d.capacity = 1000;
  o.tables = {s, d};
  return o;
}

std::vector<VariableSpec> Variables(int64_t big_rows = 37) {
  return {VariableSpec{"w", big_rows, 5, InitKind::kGlorotUniform, 5, 5}, VariableSpec{"b", 1, 5, InitKind::kZeros}};
}

std::unique_ptr<ShmParamStore> MakeStore(int64_t big_rows = 37) {
  absl::StatusOr<std::unique_ptr<ShmParamStore>> s = ShmParamStore::Create(StoreOptions(), Variables(big_rows));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// Everything a client could observe: every variable, rows 0..99 of the
// static table, and the version. (Read-only pulls: they insert nothing.)
struct Snapshot {
  std::vector<std::vector<float>> vars;
  std::vector<float> rows;
  std::vector<float> dyn_rows;
  uint64_t version = 0;
  bool operator==(const Snapshot& o) const {
    return vars == o.vars && rows == o.rows && dyn_rows == o.dyn_rows && version == o.version;
  }
};

std::vector<uint64_t> StaticIds() {
  std::vector<uint64_t> ids(100);
  for (int i = 0; i < 100; ++i) ids[i] = i;
  return ids;
}
const std::vector<uint64_t> kDynIds = {5, 1u << 31, 77777777777ull, 9};

Snapshot Take(ShmParamStore& store) {
  Snapshot s;
  for (size_t v = 0; v < store.layout().variables.size(); ++v) {
    s.vars.emplace_back(store.layout().variables[v].size());
    EXPECT_TRUE(store.PullVariable(static_cast<int>(v), s.vars.back().data()).ok());
  }
  RowScratch scratch;
  const std::vector<uint64_t> ids = StaticIds();
  s.rows.resize(ids.size() * kStaticDim);
  EXPECT_TRUE(store.PullRows(kStatic, ids, s.rows.data(), PullMode::kReadOnly, &scratch).ok());
  s.dyn_rows.resize(kDynIds.size() * kDynamicDim);
  EXPECT_TRUE(store.PullRows(kDynamic, kDynIds, s.dyn_rows.data(), PullMode::kReadOnly, &scratch).ok());
  s.version = store.version();
  return s;
}

std::unique_ptr<PsServer> Serve(ShmParamStore* store, const std::string& token = kToken,
                                int64_t max_message_bytes = 4 << 20, const std::string& checkpoint_dir = "",
                                bool start_closed = false) {
  PsServerOptions o;
  o.start_closed = start_closed;
  o.token = token;
  o.task_name = "ps:0";
  o.max_message_bytes = max_message_bytes;
  o.checkpoint_dir = checkpoint_dir;
  absl::StatusOr<std::unique_ptr<PsServer>> s = PsServer::Start(o, store);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  EXPECT_GT((*s)->port(), 0);
  return std::move(*s);
}

PsClientOptions ClientOptions(const PsServer& server, const std::string& token = kToken,
                              int64_t max_message_bytes = 4 << 20) {
  PsClientOptions o;
  o.address = server.address();
  o.task_name = "ps:0";
  o.token = token;
  o.deadline_s = 5;
  o.max_message_bytes = max_message_bytes;
  return o;
}

std::unique_ptr<PsClient> Connect(const PsClientOptions& o) {
  absl::StatusOr<std::unique_ptr<PsClient>> c = PsClient::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = scale * std::sin(0.37f * static_cast<float>(i) + scale);
  return g;
}

// The same pulls and pushes on a served store (through the client) and on a
// local twin give the same bits.
TEST(PsServerTest, RoundTripEqualsLocalStore) {
  std::unique_ptr<ShmParamStore> served = MakeStore(), local = MakeStore();
  ASSERT_TRUE(served && local);
  std::unique_ptr<PsServer> server = Serve(served.get());
  ASSERT_TRUE(server);
  std::unique_ptr<PsClient> client = Connect(ClientOptions(*server));
  ASSERT_TRUE(client);

  absl::StatusOr<RemoteLayout> layout = client->GetLayout();
  ASSERT_TRUE(layout.ok()) << layout.status();
  const StoreLayout& want_layout = served->layout();
  ASSERT_EQ(layout->layout.variables.size(), 2u);
  EXPECT_EQ(layout->layout.variables[0].name, "w");
  EXPECT_EQ(layout->layout.variables[0].rows, 37);
  EXPECT_EQ(layout->layout.variables[0].cols, 5);
  ASSERT_EQ(layout->layout.parts.size(), 2u);
  for (int v = 0; v < 2; ++v) {
    ASSERT_EQ(layout->layout.parts[v].size(), want_layout.parts[v].size());
    for (size_t p = 0; p < want_layout.parts[v].size(); ++p) {
      EXPECT_EQ(layout->layout.parts[v][p].begin, want_layout.parts[v][p].begin);
      EXPECT_EQ(layout->layout.parts[v][p].end, want_layout.parts[v][p].end);
    }
  }
  EXPECT_EQ(layout->layout.shard_nodes, want_layout.shard_nodes);
  ASSERT_EQ(layout->layout.tables.size(), 2u);
  EXPECT_EQ(layout->layout.tables[1].name, "dyn");
  EXPECT_EQ(layout->layout.tables[1].kind, EmbeddingKind::kDynamic);
  EXPECT_EQ(layout->layout.tables[1].dim, kDynamicDim);
  EXPECT_EQ(layout->optimizer, "adagrad");
  EXPECT_EQ(layout->update_mode, "hogwild");
  EXPECT_EQ(layout->store_name, served->name());
  EXPECT_EQ(layout->layout.num_shards, 2);

  for (int step = 0; step < 3; ++step) {
    // Dense: pull a slice and whole variables, then push.
    std::vector<float> remote(10 * 5), want(10 * 5);
    uint64_t version = 99;
    ASSERT_TRUE(client->PullDense(0, 12, 22, absl::MakeSpan(remote), &version).ok());
    const PullSlice slice{0, 12, 22, want.data()};
    ASSERT_TRUE(local->Pull({&slice, 1}).ok());
    EXPECT_EQ(remote, want);
    EXPECT_EQ(version, local->version());
    const std::vector<float> gw = Ramp(37 * 5, 1.0f + step), gb = Ramp(5, 0.5f);
    const RemoteDenseGrad rg[] = {{0, gw}, {1, gb}};
    absl::StatusOr<uint64_t> v = client->PushDense(rg, 0.05f);
    ASSERT_TRUE(v.ok()) << v.status();
    const DenseGrad lg[] = {{0, gw.data()}, {1, gb.data()}};
    ASSERT_TRUE(local->Push(lg, 0.05f).ok());
    EXPECT_EQ(*v, local->version());

    // Rows, with repeats: the client sums them before sending, the local
    // store sums them itself; both in batch order.
    const std::vector<uint64_t> ids = {3, 99, 3, 0, 42, 3};
    const std::vector<float> g = Ramp(ids.size() * kStaticDim, 2.0f + step);
    ASSERT_TRUE(client->PushRows(kStatic, ids, g, 0.1f).ok());
    RowScratch scratch;
    ASSERT_TRUE(local->PushRows(kStatic, ids, g.data(), 0.1f, &scratch).ok());
    const std::vector<uint64_t> dyn = {kDynIds[0], kDynIds[1], kDynIds[0]};
    const std::vector<float> gd = Ramp(dyn.size() * kDynamicDim, 3.0f);
    ASSERT_TRUE(client->PushRows(kDynamic, dyn, gd, 0.1f).ok());
    ASSERT_TRUE(local->PushRows(kDynamic, dyn, gd.data(), 0.1f, &scratch).ok());

    std::vector<float> rows(ids.size() * kStaticDim), want_rows(rows.size());
    ASSERT_TRUE(client->PullRows(kStatic, ids, absl::MakeSpan(rows)).ok());
    ASSERT_TRUE(local->PullRows(kStatic, ids, want_rows.data(), PullMode::kInsert, &scratch).ok());
    EXPECT_EQ(rows, want_rows);
  }
  EXPECT_EQ(Take(*served), Take(*local));
  absl::StatusOr<uint64_t> version = client->Version();
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, 3u);
  // A read-only pull of a missing dynamic id inserts nothing; an insert does.
  std::vector<float> row(kDynamicDim), want(kDynamicDim);
  const uint64_t fresh_id = 123456789;
  ASSERT_TRUE(client->PullRows(kDynamic, {&fresh_id, 1}, absl::MakeSpan(row), PullMode::kReadOnly).ok());
  RowScratch scratch;
  ASSERT_TRUE(local->PullRows(kDynamic, {&fresh_id, 1}, want.data(), PullMode::kReadOnly, &scratch).ok());
  EXPECT_EQ(row, want);
  std::vector<float> params(kDynamicDim), slot(kDynamicDim);
  float* slots[] = {slot.data()};
  EXPECT_EQ(served->ReadTableRow(kDynamic, fresh_id, params.data(), slots).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(client->PullRows(kDynamic, {&fresh_id, 1}, absl::MakeSpan(row), PullMode::kInsert).ok());
  EXPECT_TRUE(served->ReadTableRow(kDynamic, fresh_id, params.data(), slots).ok());
  EXPECT_EQ(server->stats().pushes_applied, 9u);
}

// A stub that adds `token` (if any) to each call it is given a context for.
struct RawStub {
  explicit RawStub(const PsServer& server, int64_t max_message_bytes = 64 << 20) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
    args.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
    channel = grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args);
    stub = net::ParameterServer::NewStub(channel);
    health = grpc::health::v1::Health::NewStub(channel);
  }
  void Prepare(grpc::ClientContext* c, const std::string& token) {
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
  }
  grpc::Status PullDense(const net::PullDenseRequest& r, const std::string& token = kToken,
                         std::vector<net::DenseChunk>* chunks = nullptr) {
    grpc::ClientContext c;
    Prepare(&c, token);
    return Drain(stub->PullDense(&c, r), chunks);
  }
  grpc::Status PullDenseBatch(const net::PullDenseBatchRequest& r, const std::string& token = kToken,
                              std::vector<net::DenseChunk>* chunks = nullptr) {
    grpc::ClientContext c;
    Prepare(&c, token);
    return Drain(stub->PullDenseBatch(&c, r), chunks);
  }
  grpc::Status PushDense(const std::vector<net::PushDenseRequest>& msgs, const std::string& token = kToken) {
    grpc::ClientContext c;
    Prepare(&c, token);
    net::PushResponse resp;
    return Stream(stub->PushDense(&c, &resp), msgs);
  }
  grpc::Status PullRowsBatch(const net::PullRowsBatchRequest& r, const std::string& token = kToken,
                             std::vector<net::RowsChunk>* chunks = nullptr) {
    grpc::ClientContext c;
    Prepare(&c, token);
    return Drain(stub->PullRowsBatch(&c, r), chunks);
  }
  // A row pull of the one part `r`.
  grpc::Status PullRows(const net::PullRowsRequest& r, const std::string& token = kToken) {
    net::PullRowsBatchRequest batch;
    *batch.add_parts() = r;
    return PullRowsBatch(batch, token);
  }
  grpc::Status PushRowsBatch(const std::vector<net::PushRowsRequest>& msgs, const std::string& token = kToken) {
    grpc::ClientContext c;
    Prepare(&c, token);
    net::PushResponse resp;
    return Stream(stub->PushRowsBatch(&c, &resp), msgs);
  }
  // Reads a server stream to its end (keeping the chunks when asked).
  template <typename Reader, typename Chunk>
  static grpc::Status Drain(Reader reader, std::vector<Chunk>* chunks) {
    Chunk chunk;
    while (reader->Read(&chunk)) {
      if (chunks) chunks->push_back(chunk);
    }
    return reader->Finish();
  }
  // Writes a client stream (until the server stops reading) and finishes it.
  template <typename Writer, typename Msg>
  static grpc::Status Stream(Writer writer, const std::vector<Msg>& msgs) {
    for (const Msg& m : msgs) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<net::ParameterServer::Stub> stub;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
};

net::PushDenseRequest DenseMsg(int var, int64_t offset, std::vector<float> values, float lr = 0.1f) {
  net::PushDenseRequest m;
  m.set_lr(lr);
  m.mutable_grad()->set_variable(var);
  m.mutable_grad()->set_offset(offset);
  m.mutable_grad()->mutable_values()->Assign(values.begin(), values.end());
  return m;
}

net::PushRowsRequest RowsMsg(int table, std::vector<uint64_t> ids, std::vector<float> grads, float lr = 0.1f) {
  net::PushRowsRequest m;
  m.set_lr(lr);
  m.set_table(table);
  m.mutable_ids()->Assign(ids.begin(), ids.end());
  m.mutable_grads()->Assign(grads.begin(), grads.end());
  return m;
}

TEST(PsServerTest, MissingOrWrongTokenIsRejectedAndTheShardIsUnchanged) {
  std::unique_ptr<ShmParamStore> store = MakeStore();
  ASSERT_TRUE(store);
  std::unique_ptr<PsServer> server = Serve(store.get());
  ASSERT_TRUE(server);
  const Snapshot before = Take(*store);
  RawStub raw(*server);
  for (const std::string& token : {std::string(), std::string("wrong-token-0123456789abcdef"),
                                  std::string(kToken) + "x", std::string(kToken).substr(1)}) {
    SCOPED_TRACE("token '" + token + "'");
    grpc::Status s = raw.PushDense({DenseMsg(0, 0, Ramp(37 * 5, 1)), DenseMsg(1, 0, Ramp(5, 1))}, token);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_HAS(s.error_message(), token.empty() ? "carries no token" : "token is wrong");
    s = raw.PushRowsBatch({RowsMsg(kStatic, {1, 2}, Ramp(2 * kStaticDim, 1))}, token);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    net::PullRowsRequest pr;
    pr.set_table(kDynamic);
    pr.add_ids(424242);  // would insert a row
    EXPECT_EQ(raw.PullRows(pr, token).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    net::PullDenseRequest pd;
    pd.set_row_end(1);
    EXPECT_EQ(raw.PullDense(pd, token).error_code(), grpc::StatusCode::PERMISSION_DENIED);

    // Through the client too, on every kind of call (health included).
    PsClientOptions o = ClientOptions(*server, token);
    std::unique_ptr<PsClient> client = Connect(o);
    ASSERT_TRUE(client);
    EXPECT_EQ(client->Version().status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(client->Healthy().status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_EQ(client->GetLayout().status().code(), absl::StatusCode::kPermissionDenied);
    const std::vector<float> gb = Ramp(5, 1);
    const RemoteDenseGrad g[] = {{1, gb}};
    absl::StatusOr<uint64_t> v = client->PushDense(g, 0.1f);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_HAS(v.status().message(), "ps:0: the request");
    EXPECT_EQ(client->SaveShard(1).status().code(), absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(Take(*store), before);
  EXPECT_EQ(server->stats().pushes_applied, 0u);
  EXPECT_EQ(server->stats().permission_denied, 4u * 9u);
  // The right token works.
  std::unique_ptr<PsClient> good = Connect(ClientOptions(*server));
  ASSERT_TRUE(good);
  EXPECT_TRUE(good->Version().ok());
}

TEST(PsServerTest, MalformedRequestsAreInvalidArgumentAndTheServerStaysUp) {
  std::unique_ptr<ShmParamStore> store = MakeStore();
  ASSERT_TRUE(store);
  std::unique_ptr<PsServer> server = Serve(store.get());
  ASSERT_TRUE(server);
  const Snapshot before = Take(*store);
  RawStub raw(*server);
  struct Case {
    std::string name;
    std::function<grpc::Status()> call;
    std::string message;
  };
  auto pull = [&](int var, int64_t b, int64_t e) {
    net::PullDenseRequest r;
    r.set_variable(var);
    r.set_row_begin(b);
    r.set_row_end(e);
    return raw.PullDense(r);
  };
  auto pull_rows = [&](int table, std::vector<uint64_t> ids, int mode = 0) {
    net::PullRowsRequest r;
    r.set_table(table);
    r.mutable_ids()->Assign(ids.begin(), ids.end());
    r.set_mode(static_cast<net::PullMode>(mode));
    return raw.PullRows(r);
  };
  const std::vector<float> w = Ramp(37 * 5, 1);
  const std::vector<float> w_head(w.begin(), w.begin() + 100), w_tail(w.begin() + 100, w.end());
  std::vector<Case> cases = {
      {"pull: unknown variable", [&] { return pull(2, 0, 1); }, "unknown variable 2 (the store has 2)"},
      {"pull: negative variable", [&] { return pull(-1, 0, 1); }, "unknown variable -1"},
      {"pull: rows past the end", [&] { return pull(0, 30, 38); }, "rows [30, 38) of w are not within [0, 37)"},
      {"pull: negative rows", [&] { return pull(0, -1, 3); }, "are not within"},
      {"pull: reversed rows", [&] { return pull(0, 5, 4); }, "are not within"},
      {"push: unknown variable", [&] { return raw.PushDense({DenseMsg(9, 0, {1})}); }, "unknown variable 9"},
      {"push: gradient too long", [&] { return raw.PushDense({DenseMsg(1, 0, Ramp(6, 1))}); },
       "has more than its 5 floats"},
      {"push: gradient too short", [&] { return raw.PushDense({DenseMsg(1, 0, Ramp(4, 1))}); },
       "the gradient of b has 4 floats, expected 5"},
      {"push: chunk out of order",
       [&] { return raw.PushDense({DenseMsg(0, 100, w_tail), DenseMsg(0, 0, w_head)}); },
       "continues at float 100, expected 0"},
      {"push: one good variable, one short",
       [&] { return raw.PushDense({DenseMsg(0, 0, w), DenseMsg(1, 0, {1, 2})}); }, "the gradient of b has 2"},
      {"push: NaN learning rate", [&] { return raw.PushDense({DenseMsg(1, 0, Ramp(5, 1), NAN)}); },
       "the learning rate is nan"},
      {"push: empty stream", [&] { return raw.PushDense({}); }, "carries no gradient"},
      {"push: 16-bit values with encoding float32",
       [&] {
         net::PushDenseRequest m = DenseMsg(1, 0, {});
         m.mutable_grad()->set_half_values(std::string(10, '\1'));
         return raw.PushDense({m});
       },
       "16-bit values with encoding float32"},
      {"push: odd 16-bit bytes",
       [&] {
         net::PushDenseRequest m = DenseMsg(1, 0, {});
         m.mutable_grad()->set_encoding(net::ENCODING_BF16);
         m.mutable_grad()->set_half_values(std::string(9, '\1'));
         return raw.PushDense({m});
       },
       "9 bytes of 16-bit values (odd)"},
      {"push: both encodings",
       [&] {
         net::PushDenseRequest m = DenseMsg(1, 0, {1, 2});
         m.mutable_grad()->set_encoding(net::ENCODING_FP16);
         m.mutable_grad()->set_half_values(std::string(6, '\1'));
         return raw.PushDense({m});
       },
       "float32 values with a 16-bit encoding"},
      {"push: unknown encoding",
       [&] {
         net::PushDenseRequest m = DenseMsg(1, 0, {});
         m.mutable_grad()->set_encoding(static_cast<net::Encoding>(9));
         m.mutable_grad()->set_half_values(std::string(10, '\1'));
         return raw.PushDense({m});
       },
       "unknown encoding 9"},
      {"pull rows: unknown table", [&] { return pull_rows(2, {1}); }, "unknown table 2 (the store has 2)"},
      {"pull rows: static id out of range", [&] { return pull_rows(kStatic, {1, 100}); },
       "id 100 (item 1) is not a row of table emb (ids are in [0, 100))"},
      {"pull rows: reserved dynamic id", [&] { return pull_rows(kDynamic, {~uint64_t{0}}); }, "2^64-1 is reserved"},
      {"pull rows: unknown mode", [&] { return pull_rows(kStatic, {1}, 7); }, "unknown mode 7"},
      {"push rows: unknown table", [&] { return raw.PushRowsBatch({RowsMsg(-3, {1}, Ramp(4, 1))}); }, "unknown table -3"},
      {"push rows: gradient length", [&] { return raw.PushRowsBatch({RowsMsg(kStatic, {1, 2}, Ramp(7, 1))}); },
       "2 ids of table emb need 2 x 4 = 8 gradient floats, got 7"},
      {"push rows: bad id in the second message",
       [&] {
         return raw.PushRowsBatch({RowsMsg(kStatic, {1, 2}, Ramp(8, 1)), RowsMsg(kStatic, {3, 500}, Ramp(8, 1))});
       },
       "id 500 (message 1, item 1) is not a row of table emb"},
      {"push rows: reserved dynamic id", [&] { return raw.PushRowsBatch({RowsMsg(kDynamic, {~uint64_t{0}}, Ramp(3, 1))}); },
       "2^64-1 is reserved"},
      {"push rows: infinite learning rate",
       [&] { return raw.PushRowsBatch({RowsMsg(kStatic, {1}, Ramp(4, 1), INFINITY)}); }, "the learning rate is inf"},
      {"push rows: empty stream", [&] { return raw.PushRowsBatch({}); }, "carries no message"},
      {"push rows: 16-bit gradient length",
       [&] {
         net::PushRowsRequest m = RowsMsg(kStatic, {1, 2}, {});
         m.set_encoding(net::ENCODING_FP16);
         m.set_half_grads(std::string(2 * 7, '\0'));
         return raw.PushRowsBatch({m});
       },
       "2 ids of table emb need 2 x 4 = 8 gradient floats, got 7"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const grpc::Status s = c.call();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_HAS(s.error_message(), "ps:0: ");
    EXPECT_HAS(s.error_message(), c.message);
    // Still serving, and nothing was written.
    grpc::ClientContext ctx;
    raw.Prepare(&ctx, kToken);
    grpc::health::v1::HealthCheckResponse health;
    ASSERT_TRUE(raw.health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &health).ok());
    EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  EXPECT_EQ(Take(*store), before);
  EXPECT_EQ(server->stats().invalid_argument, cases.size());
  EXPECT_EQ(server->stats().pushes_applied, 0u);
  // A garbled message (not a valid protobuf) does not bring it down either.
  {
    grpc::GenericStub generic(raw.channel);
    grpc::ClientContext ctx;
    raw.Prepare(&ctx, kToken);
    const char junk[] = "\xff\xff\xff\xff\x0f not a protobuf";
    grpc::Slice slice(junk, sizeof(junk) - 1);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::Status status;
    // A completion queue polled here (not the callback API): the answer is
    // finished on this thread.
    grpc::CompletionQueue cq;
    auto call = generic.PrepareUnaryCall(&ctx, "/shardwild.net.ParameterServer/Version", request, &cq);
    call->StartCall();
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, reinterpret_cast<void*>(1));
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    EXPECT_FALSE(status.ok());
  }
  std::unique_ptr<PsClient> client = Connect(ClientOptions(*server));
  ASSERT_TRUE(client);
  std::vector<float> out(5);
  EXPECT_TRUE(client->PullDense(1, 0, 1, absl::MakeSpan(out)).ok());
  EXPECT_EQ(Take(*store), before);
}

// With a 4 KiB message limit on both sides, a 200 KB variable is pulled and
// pushed in chunks that each fit.
TEST(PsServerTest, OversizePullIsChunked) {
  constexpr int64_t kRows = 10000;  // x 5 floats = 200 000 bytes
  constexpr int64_t kLimit = 4096;
  std::unique_ptr<ShmParamStore> served = MakeStore(kRows), local = MakeStore(kRows);
  ASSERT_TRUE(served && local);
  std::unique_ptr<PsServer> server = Serve(served.get(), kToken, kLimit);
  ASSERT_TRUE(server);
  RawStub raw(*server, kLimit);
  net::PullDenseRequest r;
  r.set_variable(0);
  r.set_row_end(kRows);
  std::vector<net::DenseChunk> chunks;
  grpc::Status s = raw.PullDense(r, kToken, &chunks);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_GT(chunks.size(), 40u);
  std::vector<float> whole(kRows * 5), want(kRows * 5);
  int64_t offset = 0;
  for (const net::DenseChunk& c : chunks) {
    EXPECT_LE(static_cast<int64_t>(c.ByteSizeLong()), kLimit);
    EXPECT_EQ(c.offset(), offset);
    std::copy(c.values().begin(), c.values().end(), whole.begin() + offset);
    offset += c.values_size();
  }
  ASSERT_TRUE(local->PullVariable(0, want.data()).ok());
  EXPECT_EQ(whole, want);

  // Without chunking the same answer could not pass: one message of it is over the limit.
  net::DenseChunk all;
  all.mutable_values()->Assign(want.begin(), want.end());
  EXPECT_GT(static_cast<int64_t>(all.ByteSizeLong()), kLimit);

  // The client: a chunked push and a chunked pull of many rows.
  std::unique_ptr<PsClient> client = Connect(ClientOptions(*server, kToken, kLimit));
  ASSERT_TRUE(client);
  const std::vector<float> g = Ramp(kRows * 5, 1.5f), gb = Ramp(5, 1);
  const RemoteDenseGrad rg[] = {{0, g}, {1, gb}};
  ASSERT_TRUE(client->PushDense(rg, 0.01f).ok());
  const DenseGrad lg[] = {{0, g.data()}, {1, gb.data()}};
  ASSERT_TRUE(local->Push(lg, 0.01f).ok());
  ASSERT_TRUE(client->PullDense(0, 0, kRows, absl::MakeSpan(whole)).ok());
  ASSERT_TRUE(local->PullVariable(0, want.data()).ok());
  EXPECT_EQ(whole, want);
  // A request over the server's limit is refused by gRPC itself, and the server stays up.
  {
    RawStub big(*server);  // this channel would send up to 64 MiB
    net::PullRowsRequest huge;
    huge.set_table(kStatic);
    for (int i = 0; i < 5000; ++i) huge.add_ids(i % 100);
    ASSERT_GT(static_cast<int64_t>(huge.ByteSizeLong()), kLimit);
    EXPECT_EQ(big.PullRows(huge).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    std::vector<float> one(5);
    EXPECT_TRUE(client->PullDense(1, 0, 1, absl::MakeSpan(one)).ok());
  }
  std::vector<uint64_t> ids(3000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (i * 7919) % 100;
  std::vector<float> rows(ids.size() * kStaticDim), want_rows(rows.size());
  ASSERT_TRUE(client->PullRows(kStatic, ids, absl::MakeSpan(rows)).ok());
  RowScratch scratch;
  ASSERT_TRUE(local->PullRows(kStatic, ids, want_rows.data(), PullMode::kInsert, &scratch).ok());
  EXPECT_EQ(rows, want_rows);
}

// Several slices in one call: each equals its own PullDense (chunked when
// large, an empty slice answered empty), and one bad slice refuses the
// whole call before anything is sent.
TEST(PsServerTest, BatchPullEqualsSlicePullsAndChecksEverySliceFirst) {
  constexpr int64_t kRows = 10000;
  constexpr int64_t kLimit = 4096;
  std::unique_ptr<ShmParamStore> served = MakeStore(kRows);
  ASSERT_TRUE(served);
  std::unique_ptr<PsServer> server = Serve(served.get(), kToken, kLimit);
  ASSERT_TRUE(server);
  std::unique_ptr<PsClient> client = Connect(ClientOptions(*server, kToken, kLimit));
  ASSERT_TRUE(client);
  const std::vector<float> g = Ramp(kRows * 5, 0.5f), gb = Ramp(5, 1);
  const RemoteDenseGrad rg[] = {{0, g}, {1, gb}};
  ASSERT_TRUE(client->PushDense(rg, 0.01f).ok());

  std::vector<float> big(kRows * 5), bias(5), none, mid(3 * 5);
  const RemotePullSlice slices[] = {{0, 0, kRows, absl::MakeSpan(big)},
                                    {1, 0, 1, absl::MakeSpan(bias)},
                                    {0, 7, 7, absl::MakeSpan(none)},
                                    {0, 100, 103, absl::MakeSpan(mid)}};
  uint64_t version = 0;
  ASSERT_TRUE(client->PullDenseBatch(slices, &version).ok());
  EXPECT_EQ(version, 1u);
  std::vector<float> want(kRows * 5), want_bias(5);
  ASSERT_TRUE(served->PullVariable(0, want.data()).ok());
  ASSERT_TRUE(served->PullVariable(1, want_bias.data()).ok());
  EXPECT_EQ(big, want);
  EXPECT_EQ(bias, want_bias);
  EXPECT_EQ(mid, std::vector<float>(want.begin() + 100 * 5, want.begin() + 103 * 5));

  // The raw answer: every chunk within the limit, slices in order.
  RawStub raw(*server, kLimit);
  net::PullDenseBatchRequest r;
  for (const RemotePullSlice& sl : slices) {
    net::PullDenseRequest* x = r.add_slices();
    x->set_variable(sl.var);
    x->set_row_begin(sl.row_begin);
    x->set_row_end(sl.row_end);
  }
  std::vector<net::DenseChunk> chunks;
  grpc::Status st = raw.PullDenseBatch(r, kToken, &chunks);
  ASSERT_TRUE(st.ok()) << st.error_message();
  int last = 0;
  for (const net::DenseChunk& c : chunks) {
    EXPECT_LE(static_cast<int64_t>(c.ByteSizeLong()), kLimit);
    EXPECT_GE(c.slice(), last);
    last = c.slice();
  }
  EXPECT_EQ(last, 3);

  // One slice out of range: INVALID_ARGUMENT, no chunk at all.
  r.mutable_slices(3)->set_row_end(kRows + 1);
  chunks.clear();
  st = raw.PullDenseBatch(r, kToken, &chunks);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_HAS(st.error_message(), "are not within");
  EXPECT_TRUE(chunks.empty());
  // An `out` of the wrong size is the client's error, named.
  std::vector<float> short_out(4);
  const RemotePullSlice wrong[] = {{1, 0, 1, absl::MakeSpan(short_out)}};
  const absl::Status ws = client->PullDenseBatch(wrong);
  EXPECT_FALSE(ws.ok());
  EXPECT_HAS(ws.message(), "batch pull");
}

// With compression the server applies exactly the rounded gradients, and the
// pushes take about half the bytes.
// A step's row pulls and pushes in one call each: every part equals its own
// PullRows / PushRows on a local store (two parts of one table are two
// updates; parts larger than a 4 KiB message are split and chunked), and a
// bad part anywhere refuses the whole call before anything is sent or
// applied.
TEST(PsServerTest, BatchRowCallsEqualOneCallPerPartAndCheckEveryPartFirst) {
  constexpr int64_t kLimit = 4096;
  std::unique_ptr<ShmParamStore> served = MakeStore(), local = MakeStore();
  ASSERT_TRUE(served && local);
  std::unique_ptr<PsServer> server = Serve(served.get(), kToken, kLimit);
  ASSERT_TRUE(server);
  std::unique_ptr<PsClient> client = Connect(ClientOptions(*server, kToken, kLimit));
  ASSERT_TRUE(client);
  RowScratch scratch;
  std::vector<uint64_t> many(1500), dyn = {5, 1u << 31, 77777777777ull, 5}, few = {3, 99, 3};
  for (size_t i = 0; i < many.size(); ++i) many[i] = (i * 7919) % 100;
  const std::vector<uint64_t> none;
  const std::vector<float> g_many = Ramp(many.size() * kStaticDim, 0.3f), g_dyn = Ramp(dyn.size() * kDynamicDim, 0.7f),
                           g_few = Ramp(few.size() * kStaticDim, 1.1f);
  for (int round = 0; round < 2; ++round) {
    const RemoteRowPush pushes[] = {
        {kStatic, many, g_many}, {kDynamic, none, {}}, {kDynamic, dyn, g_dyn}, {kStatic, few, g_few}};
    absl::StatusOr<uint64_t> v = client->PushRowsBatch(pushes, 0.05f);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_TRUE(local->PushRows(kStatic, many, g_many.data(), 0.05f, &scratch).ok());
    ASSERT_TRUE(local->PushRows(kDynamic, dyn, g_dyn.data(), 0.05f, &scratch).ok());
    ASSERT_TRUE(local->PushRows(kStatic, few, g_few.data(), 0.05f, &scratch).ok());
  }
  EXPECT_EQ(Take(*served), Take(*local));
  std::vector<float> a(many.size() * kStaticDim), b(dyn.size() * kDynamicDim), c(few.size() * kStaticDim);
  const RemoteRowPull pulls[] = {{kStatic, many, absl::MakeSpan(a)},
                                 {kDynamic, none, {}},
                                 {kDynamic, dyn, absl::MakeSpan(b)},
                                 {kStatic, few, absl::MakeSpan(c)}};
  ASSERT_TRUE(client->PullRowsBatch(pulls, PullMode::kReadOnly).ok());
  std::vector<float> want_a(a.size()), want_b(b.size()), want_c(c.size());
  ASSERT_TRUE(local->PullRows(kStatic, many, want_a.data(), PullMode::kReadOnly, &scratch).ok());
  ASSERT_TRUE(local->PullRows(kDynamic, dyn, want_b.data(), PullMode::kReadOnly, &scratch).ok());
  ASSERT_TRUE(local->PullRows(kStatic, few, want_c.data(), PullMode::kReadOnly, &scratch).ok());
  EXPECT_EQ(a, want_a);
  EXPECT_EQ(b, want_b);
  EXPECT_EQ(c, want_c);
  // An `out` that does not fit its part is the client's error, named.
  std::vector<float> short_out(5);
  const RemoteRowPull wrong[] = {{kStatic, few, absl::MakeSpan(c)}, {kStatic, few, absl::MakeSpan(short_out)}};
  EXPECT_EQ(client->PullRowsBatch(wrong).code(), absl::StatusCode::kInvalidArgument);

  // The raw answer: every chunk within the limit, parts in order.
  RawStub raw(*server, kLimit);
  net::PullRowsBatchRequest r;
  for (const auto& [table, ids] : {std::pair{kStatic, few}, std::pair{kDynamic, dyn}, std::pair{kStatic, few}}) {
    net::PullRowsRequest* x = r.add_parts();
    x->set_table(table);
    x->set_mode(net::PULL_MODE_READ_ONLY);
    x->mutable_ids()->Assign(ids.begin(), ids.end());
  }
  std::vector<net::RowsChunk> chunks;
  grpc::Status st = raw.PullRowsBatch(r, kToken, &chunks);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(chunks.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(chunks[i].part(), i);
  EXPECT_EQ(std::vector<float>(chunks[1].values().begin(), chunks[1].values().end()), want_b);
  // One part with an id out of range: INVALID_ARGUMENT naming the part, no chunk at all.
  r.mutable_parts(2)->add_ids(100);
  chunks.clear();
  st = raw.PullRowsBatch(r, kToken, &chunks);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_HAS(st.error_message(), "pull rows: part 2: id 100 (item 3)");
  EXPECT_TRUE(chunks.empty());

  // Malformed batch pushes: nothing applied, the server stays up.
  const Snapshot before = Take(*served);
  auto msg = [](int part, int table, std::vector<uint64_t> ids, int64_t dim) {
    net::PushRowsRequest m = RowsMsg(table, ids, Ramp(ids.size() * dim, 1));
    m.set_part(part);
    return m;
  };
  struct Case {
    const char* name;
    std::vector<net::PushRowsRequest> msgs;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"a bad id in the last part",
       {msg(0, kStatic, {1, 2}, kStaticDim), msg(1, kDynamic, {5}, kDynamicDim), msg(2, kStatic, {3, 100}, kStaticDim)},
       "id 100 (message 2, item 1) is not a row of table emb"},
      {"parts out of order",
       {msg(1, kStatic, {1}, kStaticDim), msg(0, kStatic, {2}, kStaticDim)},
       "message 1 is of part 0 after part 1"},
      {"another table within a part",
       {msg(0, kStatic, {1}, kStaticDim), msg(0, kDynamic, {2}, kDynamicDim)},
       "message 1 of part 0 names table 1, the part's first message names 0"},
      {"an unknown table", {msg(0, kStatic, {1}, kStaticDim), msg(3, 5, {2}, 1)}, "unknown table 5"},
      {"an empty stream", {}, "carries no message"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    st = raw.PushRowsBatch(k.msgs);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_HAS(st.error_message(), k.message);
  }
  EXPECT_EQ(Take(*served), before);
  // A well-formed one still applies, every part.
  ASSERT_TRUE(raw.PushRowsBatch({msg(0, kStatic, {1, 2}, kStaticDim), msg(0, kStatic, {1}, kStaticDim),
                                 msg(4, kDynamic, {4}, kDynamicDim)})
                  .ok());
  EXPECT_FALSE(Take(*served) == before);
}

TEST(PsServerTest, CompressedPushesApplyTheRoundedGradients) {
  for (GradientCompression c : {GradientCompression::kBf16, GradientCompression::kFp16}) {
    SCOPED_TRACE(GradientCompressionName(c));
    auto round = [c](std::vector<float> v) {
      for (float& x : v) x = c == GradientCompression::kBf16 ? Bf16ToFloat(FloatToBf16(x)) : Fp16ToFloat(FloatToFp16(x));
      return v;
    };
    std::unique_ptr<ShmParamStore> served = MakeStore(), local = MakeStore();
    ASSERT_TRUE(served && local);
    std::unique_ptr<PsServer> server = Serve(served.get());
    ASSERT_TRUE(server);
    PsClientOptions o = ClientOptions(*server);
    std::unique_ptr<PsClient> plain = Connect(o);
    o.compression = c;
    std::unique_ptr<PsClient> compressed = Connect(o);
    ASSERT_TRUE(plain && compressed);
    const std::vector<float> gw = Ramp(37 * 5, 1.3f), gb = Ramp(5, 0.7f);
    const RemoteDenseGrad rg[] = {{0, gw}, {1, gb}};
    ASSERT_TRUE(compressed->PushDense(rg, 0.05f).ok());
    const std::vector<float> rw = round(gw), rb = round(gb);
    const DenseGrad lg[] = {{0, rw.data()}, {1, rb.data()}};
    ASSERT_TRUE(local->Push(lg, 0.05f).ok());
    // Rows: repeated ids are summed in float32 first, then rounded.
    const std::vector<uint64_t> ids = {4, 9, 4};
    const std::vector<float> g = Ramp(3 * kStaticDim, 2.1f);
    ASSERT_TRUE(compressed->PushRows(kStatic, ids, g, 0.1f).ok());
    std::vector<float> summed(g.begin(), g.begin() + 2 * kStaticDim);
    for (int k = 0; k < kStaticDim; ++k) summed[k] += g[2 * kStaticDim + k];
    const std::vector<float> rs = round(summed);
    const std::vector<uint64_t> unique = {4, 9};
    RowScratch scratch;
    ASSERT_TRUE(local->PushRows(kStatic, unique, rs.data(), 0.1f, &scratch).ok());
    EXPECT_EQ(Take(*served), Take(*local));
    // The same push uncompressed, for the byte count.
    ASSERT_TRUE(plain->PushDense(rg, 0.05f).ok());
    const double ratio = static_cast<double>(compressed->stats().bytes_sent) /
                         static_cast<double>(plain->stats().bytes_sent);
    EXPECT_GT(plain->stats().bytes_sent, 0u);
    // Dense: 190 values at 2 instead of 4 bytes; the row push adds a little.
    EXPECT_LT(ratio, 0.65) << compressed->stats().bytes_sent << " vs " << plain->stats().bytes_sent;
  }
}

TEST(PsServerTest, DeadServerIsUnavailableNamingTheTask) {
  std::unique_ptr<ShmParamStore> store = MakeStore();
  ASSERT_TRUE(store);
  std::unique_ptr<PsServer> server = Serve(store.get());
  ASSERT_TRUE(server);
  PsClientOptions o = ClientOptions(*server);
  o.task_name = "ps:3";
  o.deadline_s = 0.5;
  o.max_attempts = 3;
  o.initial_backoff_s = 0.05;
  o.max_backoff_s = 0.1;
  std::unique_ptr<PsClient> client = Connect(o);
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->Version().ok());
  server->Shutdown();
  server.reset();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<uint64_t> v = client->Version();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_HAS(v.status().message(), "ps:3 (" + o.address + ") is unavailable: 3 attempts in");
  // 3 deadlines and 2 backoffs at most, with slack for a loaded machine.
  EXPECT_LT(took, 3 * 0.5 + 0.15 + 2.0);
  const std::vector<float> gb = Ramp(5, 1);
  const RemoteDenseGrad g[] = {{1, gb}};
  EXPECT_EQ(client->PushDense(g, 0.1f).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store->version(), 0u);
}

TEST(PsServerTest, RetriedPushIsAppliedOnce) {
  std::unique_ptr<ShmParamStore> store = MakeStore();
  ASSERT_TRUE(store);
  PsService service(store.get(), PsService::Options{});
  auto push = [&](uint64_t client, uint64_t seq) {
    std::vector<net::PushDenseRequest> msgs = {DenseMsg(1, 0, Ramp(5, 1))};
    msgs[0].set_client_id(client);
    msgs[0].set_sequence(seq);
    size_t next = 0;
    net::PushResponse out;
    absl::Status s = service.PushDense(
        [&](net::PushDenseRequest* m) {
          if (next == msgs.size()) return false;
          *m = msgs[next++];
          return true;
        },
        &out);
    EXPECT_TRUE(s.ok()) << s;
    return out;
  };
  EXPECT_FALSE(push(42, 1).duplicate());
  EXPECT_EQ(store->version(), 1u);
  EXPECT_TRUE(push(42, 1).duplicate());  // a retry
  EXPECT_EQ(store->version(), 1u);
  EXPECT_FALSE(push(43, 1).duplicate());  // another client, same sequence
  EXPECT_FALSE(push(42, 2).duplicate());
  EXPECT_TRUE(push(42, 1).duplicate());   // out of order, still remembered
  EXPECT_EQ(store->version(), 3u);
  EXPECT_FALSE(push(0, 1).duplicate());  // client 0: never de-duplicated
  EXPECT_FALSE(push(0, 1).duplicate());
  EXPECT_EQ(store->version(), 5u);
  EXPECT_EQ(service.pushes_applied(), 5u);
  EXPECT_EQ(service.pushes_deduplicated(), 2u);
}

TEST(PsServerTest, HealthFollowsServing) {
  std::unique_ptr<ShmParamStore> store = MakeStore();
  ASSERT_TRUE(store);
  std::unique_ptr<PsServer> server = Serve(store.get());
  ASSERT_TRUE(server);
  std::unique_ptr<PsClient> client = Connect(ClientOptions(*server));
  ASSERT_TRUE(client);
  absl::StatusOr<bool> h = client->Healthy();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(*h);
  h = client->Healthy("shardwild.net.ParameterServer");
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(*h);
  server->SetServing(false);
  h = client->Healthy();
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(*h);
  EXPECT_EQ(client->Healthy("no.such.Service").status().code(), absl::StatusCode::kNotFound);

  // Watch: the current status, then each change, then NOT_SERVING at shutdown.
  RawStub raw(*server);
  grpc::ClientContext ctx;
  raw.Prepare(&ctx, kToken);
  auto reader = raw.health->Watch(&ctx, grpc::health::v1::HealthCheckRequest());
  grpc::health::v1::HealthCheckResponse r;
  ASSERT_TRUE(reader->Read(&r));
  EXPECT_EQ(r.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  server->SetServing(true);
  ASSERT_TRUE(reader->Read(&r));
  EXPECT_EQ(r.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  std::thread stop([&] { server->Shutdown(); });
  ASSERT_TRUE(reader->Read(&r));
  EXPECT_EQ(r.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(reader->Read(&r));
  reader->Finish();
  stop.join();
}

TEST(PsServerTest, SaveAndRestoreShard) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("ps_server_test_ckpt_" + std::to_string(getpid()));
  fs::remove_all(dir);
  std::unique_ptr<ShmParamStore> store = MakeStore();
  ASSERT_TRUE(store);
  std::unique_ptr<PsServer> server = Serve(store.get(), kToken, 4 << 20, dir.string());
  ASSERT_TRUE(server);
  std::unique_ptr<PsClient> client = Connect(ClientOptions(*server));
  ASSERT_TRUE(client);
  const std::vector<float> gb = Ramp(5, 1);
  const RemoteDenseGrad g[] = {{1, gb}};
  ASSERT_TRUE(client->PushDense(g, 0.1f).ok());
  const Snapshot saved = Take(*store);
  absl::StatusOr<std::string> path = client->SaveShard(5);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(fs::path(*path).filename(), "ckpt-5");
  ASSERT_TRUE(client->PushDense(g, 0.1f).ok());
  ASSERT_TRUE(client->PushRows(kStatic, std::vector<uint64_t>{1}, Ramp(4, 1), 0.1f).ok());
  EXPECT_FALSE(Take(*store) == saved);
  absl::StatusOr<int64_t> step = client->RestoreShard(std::nullopt);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 5);
  EXPECT_EQ(Take(*store), saved);
  EXPECT_EQ(client->RestoreShard(6).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->SaveShard(-1).status().code(), absl::StatusCode::kInvalidArgument);
  fs::remove_all(dir);
  // A server without a checkpoint directory refuses.
  std::unique_ptr<PsServer> bare = Serve(store.get());
  ASSERT_TRUE(bare);
  std::unique_ptr<PsClient> bare_client = Connect(ClientOptions(*bare));
  ASSERT_TRUE(bare_client);
  EXPECT_EQ(bare_client->SaveShard(1).status().code(), absl::StatusCode::kFailedPrecondition);
}

// SaveShard keeps PsServerOptions::checkpoint_keep checkpoints, the newest.
TEST(PsServerTest, SaveShardKeepsItsCheckpointKeep) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("ps_server_test_keep_" + std::to_string(getpid()));
  fs::remove_all(dir);
  std::unique_ptr<ShmParamStore> store = MakeStore();
  ASSERT_TRUE(store);
  PsServerOptions o;
  o.token = kToken;
  o.task_name = "ps:0";
  o.checkpoint_dir = dir.string();
  o.checkpoint_keep = 2;
  absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(o, store.get());
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<PsClient> client = Connect(ClientOptions(**server));
  ASSERT_TRUE(client);
  for (int64_t step : {1, 2, 3, 4}) ASSERT_TRUE(client->SaveShard(step).ok()) << step;
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0) kept.push_back(name);
  }
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"ckpt-3", "ckpt-4"}));
  fs::remove_all(dir);
  o.checkpoint_keep = 0;
  const absl::Status bad = PsServer::Start(o, store.get()).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.message()).find("checkpoint_keep: must be >= 1, got 0"), std::string::npos) << bad;
}

// A server started closed (a ps task, until its chief opens it) serves no
// pull, push or save: clients see UNAVAILABLE and retry; a RestoreShard, of a
// checkpoint or as_is, opens it and the waiting calls go through.
TEST(PsServerTest, ClosedServerRefusesParameterTrafficUntilOpened) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("ps_server_test_closed_" + std::to_string(getpid()));
  fs::remove_all(dir);
  std::unique_ptr<ShmParamStore> store = MakeStore();
  ASSERT_TRUE(store);
  const Snapshot initial = Take(*store);
  std::unique_ptr<PsServer> server = Serve(store.get(), kToken, 4 << 20, dir.string(), /*start_closed=*/true);
  ASSERT_TRUE(server);
  PsClientOptions quick = ClientOptions(*server);
  quick.max_attempts = 2;
  quick.initial_backoff_s = 0.01;
  std::unique_ptr<PsClient> client = Connect(quick);
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->GetLayout().ok());  // the layout and version are always served
  ASSERT_TRUE(client->Version().ok());
  std::vector<float> out(5);
  const absl::Status pull = client->PullDense(1, 0, 1, absl::MakeSpan(out));
  EXPECT_EQ(pull.code(), absl::StatusCode::kUnavailable) << pull;
  EXPECT_HAS(pull.message(), "ps:0: pull: this ps task (re)started and waits for the chief to reload its shards");
  const std::vector<float> gb = Ramp(5, 1);
  const RemoteDenseGrad g[] = {{1, gb}};
  EXPECT_EQ(client->PushDense(g, 0.1f).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client->PushRows(kStatic, std::vector<uint64_t>{1}, Ramp(4, 1), 0.1f).status().code(),
            absl::StatusCode::kUnavailable);
  std::vector<float> rows(kStaticDim);
  EXPECT_EQ(client->PullRows(kStatic, std::vector<uint64_t>{1}, absl::MakeSpan(rows)).code(),
            absl::StatusCode::kUnavailable);
  const absl::StatusOr<std::string> save = client->SaveShard(1);
  EXPECT_EQ(save.status().code(), absl::StatusCode::kFailedPrecondition) << save.status();
  EXPECT_HAS(save.status().message(), "its shards were not reloaded yet");
  EXPECT_EQ(Take(*store), initial);  // nothing was applied

  // A patient client waits through the closed spell; as_is opens the store
  // with what it holds.
  PsClientOptions patient = ClientOptions(*server);
  patient.max_attempts = 100;
  patient.initial_backoff_s = 0.01;
  patient.max_backoff_s = 0.05;
  std::unique_ptr<PsClient> waiter = Connect(patient);
  ASSERT_TRUE(waiter);
  absl::Status waited;
  std::thread t([&] { waited = waiter->PushDense(g, 0.1f).status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(store->version(), 0u);
  net::RestoreShardRequest bad;
  bad.set_as_is(true);
  bad.set_step(3);
  PsService::Options closed;
  closed.start_closed = true;
  PsService direct(store.get(), closed);
  net::RestoreShardResponse ignored;
  EXPECT_EQ(direct.RestoreShard(bad, &ignored).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(direct.open());
  ASSERT_TRUE(client->Open().ok());
  t.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_EQ(store->version(), 1u);
  ASSERT_TRUE(client->PullDense(1, 0, 1, absl::MakeSpan(out)).ok());
  ASSERT_TRUE(client->Open().ok());  // a no-op once open

  // A restarted server opens with a checkpoint's shards.
  ASSERT_TRUE(client->SaveShard(7).ok());
  const Snapshot saved = Take(*store);
  ASSERT_TRUE(client->PushDense(g, 0.1f).ok());
  server->Shutdown();
  server = Serve(store.get(), kToken, 4 << 20, dir.string(), /*start_closed=*/true);
  ASSERT_TRUE(server);
  std::unique_ptr<PsClient> again = Connect(ClientOptions(*server));
  ASSERT_TRUE(again);
  quick.address = server->address();
  std::unique_ptr<PsClient> quick_again = Connect(quick);
  ASSERT_TRUE(quick_again);
  EXPECT_EQ(quick_again->PushDense(g, 0.1f).status().code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<int64_t> step = again->RestoreShard(7);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(Take(*store), saved);
  EXPECT_TRUE(again->PushDense(g, 0.1f).ok());
  fs::remove_all(dir);
}

TEST(PsServerTest, RefusesNonLoopbackWithoutTokenAndPortsInUse) {
  std::unique_ptr<ShmParamStore> store = MakeStore();
  ASSERT_TRUE(store);
  PsServerOptions o;
  o.bind_address = "0.0.0.0:0";
  absl::StatusOr<std::unique_ptr<PsServer>> s = PsServer::Start(o, store.get());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(s.status().message(), "cluster.token_file");
  // A port already taken (by another server) is an error, not a shared port.
  std::unique_ptr<PsServer> first = Serve(store.get());
  ASSERT_TRUE(first);
  o.bind_address = first->address();
  o.task_name = "ps:1";
  s = PsServer::Start(o, store.get());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_HAS(s.status().message(), "ps:1: cannot listen on " + first->address());
}

// TLS with a self-signed certificate made by openssl for this test; skipped
// where openssl is missing.
TEST(PsServerTest, Tls) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("ps_server_test_tls_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string cert = (dir / "cert.pem").string(), key = (dir / "key.pem").string();
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                          "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
                          key + " -out " + cert + " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    fs::remove_all(dir);
    GTEST_SKIP() << "openssl could not make a test certificate";
  }
  auto read = [](const std::string& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  std::unique_ptr<ShmParamStore> store = MakeStore();
  ASSERT_TRUE(store);
  PsServerOptions so;
  so.token = kToken;
  so.tls_cert_pem = read(cert);
  so.tls_key_pem = read(key);
  absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(so, store.get());
  ASSERT_TRUE(server.ok()) << server.status();
  PsClientOptions co = ClientOptions(**server);
  co.tls = true;
  co.tls_root_pem = so.tls_cert_pem;
  co.tls_server_name = "localhost";
  std::unique_ptr<PsClient> client = Connect(co);
  ASSERT_TRUE(client);
  absl::StatusOr<uint64_t> v = client->Version();
  EXPECT_TRUE(v.ok()) << v.status();
  // A plaintext client cannot talk to it.
  PsClientOptions plain = ClientOptions(**server);
  plain.max_attempts = 1;
  plain.deadline_s = 2;
  std::unique_ptr<PsClient> plain_client = Connect(plain);
  ASSERT_TRUE(plain_client);
  EXPECT_EQ(plain_client->Version().status().code(), absl::StatusCode::kUnavailable);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardwild
