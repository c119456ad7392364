// Writes the seed corpus of embedding_table_fuzz with EmbeddingTable::Create:
//   embedding_table_corpus_gen tests/fuzz/corpus/embedding_table
// Valid regions of this build's format (a static f32 table, a static bf16
// table with a slot and row locks, a dynamic table holding a few rows), each
// a few KB, so the fuzzer starts from headers Attach accepts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ps_shm/embedding_table.h"

namespace {

bool Write(const std::string& path, const void* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

bool Seed(const std::string& dir, const std::string& name, const shardwild::EmbeddingTableOptions& o,
          const std::vector<uint64_t>& insert) {
  const size_t bytes = shardwild::EmbeddingTable::BytesFor(o);
  void* region = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (region == nullptr) return false;
  std::memset(region, 0, bytes);
  auto table = shardwild::EmbeddingTable::Create(region, bytes, o);
  bool ok = table.ok();
  if (ok && !insert.empty()) {
    std::vector<float> out(insert.size() * o.dim);
    ok = table->Pull(insert, out.data(), shardwild::PullMode::kInsert).ok();
  }
  ok = ok && Write(dir + "/" + name, region, bytes);
  std::free(region);
  if (!ok) std::fprintf(stderr, "embedding_table_corpus_gen: could not write %s\n", name.c_str());
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  shardwild::EmbeddingTableOptions f32;
  f32.name = "seed_f32";
  f32.dim = 4;
  f32.capacity = 8;
  shardwild::EmbeddingTableOptions bf16 = f32;
  bf16.name = "seed_bf16";
  bf16.dim = 5;
  bf16.bf16 = true;
  bf16.num_slots = 1;
  bf16.row_lock = true;
  shardwild::EmbeddingTableOptions dynamic = f32;
  dynamic.name = "seed_dynamic";
  dynamic.kind = shardwild::EmbeddingKind::kDynamic;
  dynamic.num_slots = 2;
  dynamic.count_updates = true;
  shardwild::EmbeddingTableOptions adam = f32;  // Adam's layout: two slots, update counts in side words
  adam.name = "seed_adam";
  adam.num_slots = 2;
  adam.count_updates = true;
  bool ok = Seed(dir, "static-f32", f32, {});
  ok = Seed(dir, "static-bf16", bf16, {}) && ok;
  ok = Seed(dir, "static-adam", adam, {}) && ok;
  ok = Seed(dir, "dynamic", dynamic, {3, 1ull << 40, 77}) && ok;
  return ok ? 0 : 1;
}
