// libFuzzer target: an embedding-table region read from untrusted bytes (as
// Attach does for a segment another process wrote). Attach must reject every
// malformed header and index with a Status; a static table it accepts must be
// safe to read and to insert into. Lookups in a dynamic table are not run: an
// index slot claimed but never published (a writer that died mid-insert) makes
// a reader of that slot wait for it by design, which a fuzzer sees as a hang. Build with -DSHARDWILD_FUZZ=ON (clang), then run e.g.
//   build-asan/tests/fuzz/embedding_table_fuzz -max_total_time=60
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ps_shm/embedding_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Attach wants a page-aligned region, as a mapping is; copy the input into one.
  const size_t bytes = (size + 4095) / 4096 * 4096 + 4096;
  void* region = std::aligned_alloc(4096, bytes);
  std::memset(region, 0, bytes);
  std::memcpy(region, data, size);
  struct Free {
    void* p;
    ~Free() { std::free(p); }
  } free_region{region};
  auto table = shardwild::EmbeddingTable::Attach(region, size);
  if (!table.ok()) return 0;
  if (table->options().kind != shardwild::EmbeddingKind::kStatic) return 0;
  const int64_t dim = table->options().dim;
  if (dim <= 0 || dim > 4096) return 0;
  std::vector<float> out(4 * dim);
  const uint64_t ids[4] = {0, 1, 12345, 0x7fffffffffffULL};
  (void)table->Pull(absl::MakeConstSpan(ids, 4), out.data(), shardwild::PullMode::kReadOnly);
  (void)table->Pull(absl::MakeConstSpan(ids, 4), out.data(), shardwild::PullMode::kInsert);
  return 0;
}
