// libFuzzer target: the requests of ps.proto as a ps task receives them.
// Each input is decoded into request messages and applied to a small real
// store (two variables, a static and a dynamic embedding table, two shards)
// through PsService, the server's logic without the transport (what gRPC
// hands PsServer after its token check).
//
// Input: byte 0 picks the call (PullDense, PushDense, PullRowsBatch,
// PushRowsBatch, GetLayout + Version, PullDenseBatch); the rest is a list of records, each a 2-byte
// little-endian length and that many bytes, each parsed as one message of
// the call's request type (a stream for the pushes; the pulls use the first
// record). Records that do not parse are skipped.
//
// Checked on every input, besides ASan/UBSan:
//   * a request answered InvalidArgument changed nothing: every parameter,
//     optimizer-visible row and the model version are bit-identical;
//   * a pull that succeeds answered exactly the floats asked for, in
//     contiguous chunks no larger than the chunk limit.
// Build with -DSHARDWILD_FUZZ=ON (clang), then run e.g.
//   build-asan/tests/fuzz/ps_request_fuzz tests/fuzz/corpus/ps_request -max_total_time=60
// Seeds: tests/fuzz/corpus/ps_request (one valid request of each call, and
// the pushes with bf16 / fp16 gradients;
// write them again with SHARDWILD_FUZZ_WRITE_SEEDS=<dir>).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "net/ps.pb.h"
#include "net/ps_service.h"
#include "ps_shm/shm_store.h"

namespace shardwild {
namespace {

constexpr int64_t kChunkFloats = 64;  // small, so chunking is exercised
constexpr int kStaticTable = 0, kDynamicTable = 1;
constexpr int64_t kDim = 4, kStaticRows = 32;

struct Fixture {
  std::unique_ptr<ShmParamStore> store;
  std::unique_ptr<PsService> service;
};

Fixture* MakeFixture() {
  auto* f = new Fixture;
  OpenStoreOptions o;
  o.store.job_name = "swfuzz-psreq";
  o.store.huge_pages = HugePagePolicy::kOff;
  o.optimizer.type = OptimizerType::kAdagrad;
  o.num_shards = 2;
  TableSpec fixed;
  fixed.name = "fixed";
  fixed.kind = EmbeddingKind::kStatic;
  fixed.dim = kDim;
  fixed.capacity = kStaticRows;
  TableSpec grown = fixed;
  grown.name = "grown";
  grown.kind = EmbeddingKind::kDynamic;
  grown.capacity = 256;
  grown.on_full = CapacityPolicy::kEvictLru;
  o.tables = {fixed, grown};
  auto st = ShmParamStore::Create(o, {{"w", 40, 3}, {"b", 3, 1}});
  if (!st.ok()) {
    std::fprintf(stderr, "ps_request_fuzz: Create: %s\n", st.status().ToString().c_str());
    std::abort();
  }
  f->store = std::move(*st);
  PsService::Options so;
  so.max_chunk_floats = kChunkFloats;
  so.max_push_bytes = 1 << 20;
  so.task_name = "ps:0";
  f->service = std::make_unique<PsService>(f->store.get(), so);
  return f;
}

// The bytes of everything a request could change that can be read without
// changing it: all parameters, the static table's rows, the version.
std::string Snapshot(ShmParamStore& store) {
  std::string bytes;
  for (size_t v = 0; v < store.layout().variables.size(); ++v) {
    std::vector<float> values(store.layout().variables[v].size());
    if (!store.PullVariable(static_cast<int>(v), values.data()).ok()) std::abort();
    bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  std::vector<uint64_t> ids(kStaticRows);
  for (int64_t i = 0; i < kStaticRows; ++i) ids[i] = i;
  std::vector<float> rows(kStaticRows * kDim);
  RowScratch scratch;
  if (!store.PullRows(kStaticTable, ids, rows.data(), PullMode::kReadOnly, &scratch).ok()) std::abort();
  bytes.append(reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(float));
  const uint64_t version = store.version();
  bytes.append(reinterpret_cast<const char*>(&version), sizeof(version));
  return bytes;
}

std::vector<std::string> Records(const uint8_t* data, size_t size) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i + 2 <= size && out.size() < 64) {
    const size_t n = data[i] | (static_cast<size_t>(data[i + 1]) << 8);
    i += 2;
    const size_t take = std::min(n, size - i);
    out.emplace_back(reinterpret_cast<const char*>(data + i), take);
    i += take;
  }
  return out;
}

// A reader over the records that parse as T.
template <typename T>
PsService::Reader<T> StreamOf(const std::vector<std::string>& records, size_t* next) {
  return [&records, next](T* msg) {
    while (*next < records.size()) {
      const std::string& r = records[(*next)++];
      if (msg->ParseFromString(r)) return true;
    }
    return false;
  };
}

// Checks a streamed answer: contiguous chunks of at most kChunkFloats.
struct ChunkCheck {
  int64_t received = 0;
  template <typename Chunk>
  bool operator()(const Chunk& c) {
    if (c.offset() != received || c.values_size() > kChunkFloats) {
      std::fprintf(stderr, "ps_request_fuzz: chunk at %lld of %d floats after %lld\n",
                   static_cast<long long>(c.offset()), c.values_size(), static_cast<long long>(received));
      std::abort();
    }
    received += c.values_size();
    return true;
  }
};

void Expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "ps_request_fuzz: %s\n", what);
    std::abort();
  }
}

void WriteSeeds(const std::string& dir) {
  auto record = [](const google::protobuf::Message& m) {
    const std::string bytes = m.SerializeAsString();
    std::string r;
    r.push_back(static_cast<char>(bytes.size() & 0xff));
    r.push_back(static_cast<char>(bytes.size() >> 8));
    return r + bytes;
  };
  auto write = [&](const std::string& name, char kind, const std::string& body) {
    const std::string path = dir + "/" + name;
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) std::abort();
    std::fputc(kind, f);
    std::fwrite(body.data(), 1, body.size(), f);
    std::fclose(f);
  };
  net::PullDenseRequest pd;
  pd.set_variable(0);
  pd.set_row_begin(3);
  pd.set_row_end(30);
  write("pull_dense", 0, record(pd));
  std::string push;
  for (int var = 0; var < 2; ++var) {
    const int64_t size = var == 0 ? 120 : 3;
    for (int64_t off = 0; off < size; off += 50) {
      net::PushDenseRequest m;
      if (var == 0 && off == 0) {
        m.set_client_id(1);
        m.set_sequence(1);
        m.set_lr(0.1f);
      }
      m.mutable_grad()->set_variable(var);
      m.mutable_grad()->set_offset(off);
      for (int64_t i = off; i < std::min<int64_t>(size, off + 50); ++i) m.mutable_grad()->add_values(0.01f * i);
      push += record(m);
    }
  }
  write("push_dense", 1, push);
  net::PullRowsRequest pr;
  pr.set_table(kDynamicTable);
  for (uint64_t id : {5ull, 77ull, 5ull, 1234567890123ull}) pr.add_ids(id);
  net::PullRowsBatchRequest one;
  *one.add_parts() = pr;
  write("pull_rows", 2, record(one));
  net::PushRowsRequest r1, r2;
  r1.set_lr(0.05f);
  r1.set_table(kStaticTable);
  for (uint64_t id : {1ull, 2ull}) r1.add_ids(id);
  for (int i = 0; i < 2 * kDim; ++i) r1.add_grads(0.1f * i);
  r2.set_table(kStaticTable);
  r2.add_ids(1);
  for (int i = 0; i < kDim; ++i) r2.add_grads(-0.2f);
  write("push_rows", 3, record(r1) + record(r2));
  // The same pushes with 16-bit gradients (net/half.h): bf16 dense, fp16 rows.
  net::PushDenseRequest hb;
  hb.set_lr(0.1f);
  hb.mutable_grad()->set_variable(1);
  hb.mutable_grad()->set_encoding(net::ENCODING_BF16);
  hb.mutable_grad()->set_half_values(std::string("\x80\x3f\x00\x40\x80\xbf", 6));  // 1, 2, -1
  write("push_dense_bf16", 1, record(hb));
  net::PushRowsRequest hr;
  hr.set_lr(0.05f);
  hr.set_table(kStaticTable);
  hr.add_ids(3);
  hr.set_encoding(net::ENCODING_FP16);
  hr.set_half_grads(std::string("\x00\x3c\x00\x40\x00\xbc\x00\x00", 8));  // 1, 2, -1, 0
  write("push_rows_fp16", 3, record(hr));
  write("layout", 4, "");
  // A batch: the slice above, a whole small variable, an empty slice.
  net::PullDenseBatchRequest pb;
  *pb.add_slices() = pd;
  net::PullDenseRequest* whole = pb.add_slices();
  whole->set_variable(1);
  whole->set_row_end(1);
  net::PullDenseRequest* empty = pb.add_slices();
  empty->set_row_begin(5);
  empty->set_row_end(5);
  write("pull_dense_batch", 5, record(pb));
  // A step's rows: the pull above, a static part, an empty part; and a push
  // of two parts of the static table and one of the dynamic one.
  net::PullRowsBatchRequest rb;
  *rb.add_parts() = pr;
  net::PullRowsRequest* fixed = rb.add_parts();
  fixed->set_table(kStaticTable);
  for (uint64_t id : {4ull, 31ull, 4ull}) fixed->add_ids(id);
  rb.add_parts()->set_table(kDynamicTable);
  write("pull_rows_batch", 2, record(rb));
  std::string push_batch;
  for (int part = 0; part < 3; ++part) {
    net::PushRowsRequest m;
    if (part == 0) {
      m.set_client_id(2);
      m.set_sequence(1);
      m.set_lr(0.05f);
    }
    m.set_part(part);
    m.set_table(part == 1 ? kDynamicTable : kStaticTable);
    for (uint64_t id : {uint64_t(part + 1), uint64_t(7)}) m.add_ids(id);
    for (int i = 0; i < 2 * kDim; ++i) m.add_grads(0.05f * (i - part));
    push_batch += record(m);
  }
  write("push_rows_batch", 3, push_batch);
}

}  // namespace
}  // namespace shardwild

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardwild;
  static Fixture* f = [] {
    if (const char* dir = std::getenv("SHARDWILD_FUZZ_WRITE_SEEDS")) WriteSeeds(dir);
    return MakeFixture();
  }();
  if (size == 0) return 0;
  const int kind = data[0] % 6;
  const std::vector<std::string> records = Records(data + 1, size - 1);
  const std::string before = Snapshot(*f->store);
  absl::Status status;
  size_t next = 0;
  switch (kind) {
    case 0: {
      net::PullDenseRequest r;
      if (records.empty() || !r.ParseFromString(records[0])) return 0;
      ChunkCheck check;
      status = f->service->PullDense(r, [&check](const net::DenseChunk& c) { return check(c); });
      if (status.ok()) {
        const int64_t cols = f->store->layout().variables[r.variable()].cols;
        Expect(check.received == (r.row_end() - r.row_begin()) * cols, "pull answered the wrong number of floats");
      }
      Expect(Snapshot(*f->store) == before, "a pull changed the store");
      break;
    }
    case 5: {
      net::PullDenseBatchRequest r;
      if (records.empty() || !r.ParseFromString(records[0])) return 0;
      // Each slice's chunks contiguous from 0, slices in request order.
      std::vector<ChunkCheck> checks(static_cast<size_t>(r.slices_size()));
      int last = 0;
      status = f->service->PullDenseBatch(r, [&](const net::DenseChunk& c) {
        Expect(c.slice() >= last && c.slice() < r.slices_size(), "batch pull: a chunk of no slice, or out of order");
        last = c.slice();
        return checks[static_cast<size_t>(c.slice())](c);
      });
      if (status.ok()) {
        for (int i = 0; i < r.slices_size(); ++i) {
          const net::PullDenseRequest& sl = r.slices(i);
          const int64_t cols = f->store->layout().variables[sl.variable()].cols;
          Expect(checks[i].received == (sl.row_end() - sl.row_begin()) * cols,
                 "batch pull answered the wrong number of floats");
        }
      }
      Expect(Snapshot(*f->store) == before, "a pull changed the store");
      break;
    }
    case 1: {
      net::PushResponse out;
      status = f->service->PushDense(StreamOf<net::PushDenseRequest>(records, &next), &out);
      break;
    }
    case 2: {
      net::PullRowsBatchRequest r;
      if (records.empty() || !r.ParseFromString(records[0])) return 0;
      // Each part's chunks contiguous from 0, parts in request order.
      std::vector<ChunkCheck> checks(static_cast<size_t>(r.parts_size()));
      int last = 0;
      status = f->service->PullRowsBatch(r, [&](const net::RowsChunk& c) {
        Expect(c.part() >= last && c.part() < r.parts_size(), "batch pull rows: a chunk of no part, or out of order");
        last = c.part();
        return checks[static_cast<size_t>(c.part())](c);
      });
      if (status.ok()) {
        for (int i = 0; i < r.parts_size(); ++i) {
          Expect(checks[i].received == r.parts(i).ids_size() * kDim, "batch pull rows answered the wrong number of floats");
        }
      }
      break;
    }
    case 3: {
      net::PushResponse out;
      status = f->service->PushRowsBatch(StreamOf<net::PushRowsRequest>(records, &next), &out);
      break;
    }
    default: {
      net::LayoutResponse layout;
      f->service->GetLayout(&layout);
      Expect(layout.variables_size() == 2 && layout.tables_size() == 2, "layout");
      Expect(f->service->Version() == f->store->version(), "version");
      break;
    }
  }
  if (status.code() == absl::StatusCode::kInvalidArgument) {
    Expect(Snapshot(*f->store) == before, "a request rejected as invalid changed the store");
  }
  return 0;
}
