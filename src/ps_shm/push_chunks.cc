#include "ps_shm/push_chunks.h"

#include <algorithm>

namespace shardwild {

int64_t PushChunks::ChunkElements(int64_t n) {
  const int64_t spread = (n + kMaxChunks - 1) / kMaxChunks;
  return std::max(kMinChunkElements, (spread + 15) / 16 * 16);
}

PushChunks::PushChunks(int64_t n)
    : n_(std::max<int64_t>(0, n)),
      chunk_(ChunkElements(n_)),
      num_chunks_(static_cast<int>((n_ + chunk_ - 1) / chunk_)),
      flags_(std::make_unique<Flag[]>(static_cast<size_t>(std::max(1, num_chunks_)))) {}

}  // namespace shardwild
