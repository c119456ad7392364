// MemoryPlacer: the seam between the store and the machine's NUMA layout.
//
// The store decides what memory a shard needs; a placer decides where it
// goes. src/workers implements it over hwloc (Topology); tests pass fakes.
#pragma once

#include <cstddef>
#include <functional>

#include "absl/status/status.h"

namespace shardwild {

class MemoryPlacer {
 public:
  virtual ~MemoryPlacer() = default;
  // The NUMA node (logical index) that shard `shard` of `num_shards` lives on.
  virtual int NodeForShard(int shard, int num_shards) const = 0;
  // Runs `fn` on a thread whose CPUs and memory policy are bound to `node`,
  // so memory it allocates, reserves (tmpfs pages: ShmSegment) or first
  // touches lands on that node. Blocks until `fn` returns and
  // returns its status.
  virtual absl::Status RunOnNode(int node, const std::function<absl::Status()>& fn) = 0;
  // Sets the policy of [addr, addr + bytes) to `node`, for pages allocated
  // later. A no-op on a machine with one node.
  virtual absl::Status BindArea(void* addr, size_t bytes, int node) = 0;
};

}  // namespace shardwild
