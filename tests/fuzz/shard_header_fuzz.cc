// libFuzzer target: the header of a shard segment (ShardHeader, LayoutEntry
// and TableEntry records, shard_format.h) as ShmParamStore::Attach reads it
// from a segment another process wrote. A real one-shard store (two
// variables, one static and one dynamic embedding table) is created once;
// every input overwrites the start of its segment (up to header_bytes; the
// rest of the header is restored from the original first), then Attach must
// either reject the header with a Status or give a store whose Pull and
// PullRows stay inside the segment and return. The table regions themselves
// are not overwritten (embedding_table_fuzz covers them), so lookups in the
// dynamic table cannot wait on a half-inserted slot. Build with
// -DSHARDWILD_FUZZ=ON (clang), then run e.g.
//   build-asan/tests/fuzz/shard_header_fuzz tests/fuzz/corpus/shard_header -max_total_time=60
// Seeds: tests/fuzz/corpus/shard_header (the valid header of this very
// store; write it again with SHARDWILD_FUZZ_WRITE_SEED=<file>).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/model/optimizer.h"
#include "ps_shm/shard_format.h"
#include "ps_shm/shm_segment.h"
#include "ps_shm/shm_store.h"

namespace shardwild {
namespace {

OptimizerOptions Sgd() {
  OptimizerOptions o;
  o.type = OptimizerType::kSgd;
  return o;
}

struct Fixture {
  std::unique_ptr<ShmParamStore> store;     // the creator (unlinks at exit)
  std::unique_ptr<ShmSegment> segment;      // its shard 0, attached
  std::vector<char> header;                 // the valid header bytes
};

Fixture* MakeFixture() {
  auto* f = new Fixture;
  OpenStoreOptions o;
  o.store.job_name = "swfuzz-header";
  o.optimizer = Sgd();
  o.num_shards = 1;
  TableSpec fixed;
  fixed.name = "fixed";
  fixed.kind = EmbeddingKind::kStatic;
  fixed.dim = 4;
  fixed.capacity = 16;
  TableSpec grown = fixed;
  grown.name = "grown";
  grown.kind = EmbeddingKind::kDynamic;
  o.tables = {fixed, grown};
  auto st = ShmParamStore::Create(o, {{"w", 8, 4}, {"b", 4, 1}});
  if (!st.ok()) {
    std::fprintf(stderr, "shard_header_fuzz: Create: %s\n", st.status().ToString().c_str());
    std::abort();
  }
  f->store = std::move(*st);
  // A few rows in the dynamic table, so attached lookups find some.
  std::vector<float> out(3 * 4);
  const uint64_t ids[3] = {7, 1234567, 0xdeadbeefULL};
  RowScratch scratch;
  if (!f->store->PullRows(1, absl::MakeConstSpan(ids, 3), out.data(), PullMode::kInsert, &scratch).ok()) std::abort();
  auto seg = ShmSegment::Attach(f->store->name() + "-s0");
  if (!seg.ok()) std::abort();
  f->segment = std::move(*seg);
  const auto* h = static_cast<const ShardHeader*>(f->segment->data());
  const char* base = static_cast<const char*>(f->segment->data());
  f->header.assign(base, base + h->header_bytes);
  if (const char* path = std::getenv("SHARDWILD_FUZZ_WRITE_SEED")) {
    // The used part of the header (the rest is zero padding).
    const size_t used = sizeof(ShardHeader) + h->num_entries * sizeof(LayoutEntry) + h->num_tables * sizeof(TableEntry);
    if (FILE* file = std::fopen(path, "wb")) {
      std::fwrite(base, 1, used, file);
      std::fclose(file);
    }
  }
  return f;
}

Fixture& GetFixture() {
  static std::unique_ptr<Fixture> f(MakeFixture());
  return *f;
}

}  // namespace
}  // namespace shardwild

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardwild;
  Fixture& f = GetFixture();
  char* base = static_cast<char*>(f.segment->data());
  std::memcpy(base, f.header.data(), f.header.size());
  std::memcpy(base, data, std::min(size, f.header.size()));
  auto attached = ShmParamStore::Attach(f.store->name(), Sgd());
  if (attached.ok()) {
    ShmParamStore& st = **attached;
    const StoreLayout& layout = st.layout();
    std::vector<std::vector<float>> outs;
    std::vector<PullSlice> slices;
    for (int v = 0; v < static_cast<int>(layout.variables.size()); ++v) {
      outs.emplace_back(layout.variables[v].size());
      slices.push_back({v, 0, layout.variables[v].rows, outs.back().data()});
    }
    (void)st.Pull(slices);
    RowScratch scratch;
    const uint64_t ids[4] = {0, 7, 15, 1234567};
    for (int t = 0; t < static_cast<int>(layout.tables.size()); ++t) {
      const int64_t dim = layout.tables[t].dim;
      if (dim > 4096) continue;
      std::vector<float> rows(4 * dim);
      const PullMode mode = layout.tables[t].kind == EmbeddingKind::kStatic ? PullMode::kInsert : PullMode::kReadOnly;
      (void)st.PullRows(t, absl::MakeConstSpan(ids, 4), rows.data(), mode, &scratch);
    }
  }
  std::memcpy(base, f.header.data(), f.header.size());
  return 0;
}
