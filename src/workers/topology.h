// Topology: the machine's packages, NUMA nodes and cores (hwloc), and where
// workers and shards go on it.
//
// The hardware sits behind this class. Detect() reads the real machine;
// FromSynthetic() and FromXml() build a machine you do not have ("pack:2
// numa:1 core:4 pu:1") so placement can be planned, shown and tested for it.
// A synthetic or XML topology never pins or binds anything.
//
// Thread safety: const methods may be called from any thread; hwloc
// topologies are safe for concurrent reads and binding calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ps_shm/memory_placer.h"

struct hwloc_topology;

namespace shardwild {

struct NumaNodeInfo {
  int index = 0;                // logical index
  uint64_t memory_bytes = 0;    // local memory (0 if unknown)
  std::vector<int> cores;       // logical core indices on this node
};

struct WorkerPlacement {
  int node = 0;                 // NUMA node the worker runs on
  std::vector<int> cores;       // logical core indices it may use (one per intra-op thread)
};

struct Placement {
  int num_workers = 0;
  int threads_per_worker = 1;
  int num_shards = 0;
  std::vector<WorkerPlacement> workers;
  std::vector<int> shard_nodes;
  bool oversubscribed = false;  // more threads than cores
  std::string ToString() const; // human-readable, multi-line
};

class Topology final : public MemoryPlacer {
 public:
  static absl::StatusOr<std::unique_ptr<Topology>> Detect();
  static absl::StatusOr<std::unique_ptr<Topology>> FromSynthetic(const std::string& description);
  static absl::StatusOr<std::unique_ptr<Topology>> FromXml(const std::string& path);
  ~Topology() override;

  // True when this describes the machine we run on (binding is real).
  bool is_this_system() const { return this_system_; }
  const std::string& source() const { return source_; }
  int num_packages() const { return num_packages_; }
  int num_cores() const { return static_cast<int>(core_node_.size()); }
  int num_pus() const { return num_pus_; }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  const std::vector<NumaNodeInfo>& nodes() const { return nodes_; }

  // Resolves 'auto' (0): workers = physical cores, shards = NUMA nodes,
  // threads per worker = max(1, cores / workers).
  int ResolveWorkers(int requested) const { return requested > 0 ? requested : num_cores(); }
  int ResolveShards(int requested) const { return requested > 0 ? requested : num_nodes(); }
  int ResolveThreadsPerWorker(int requested, int workers) const;

  // Workers are spread over nodes in contiguous blocks (worker i on node
  // i * nodes / workers), each given `threads_per_worker` cores of its node
  // not yet taken, wrapping round when the node runs out. Shard s lives on
  // node s % nodes.
  Placement Plan(int workers, int shards, int threads_per_worker) const;

  // Binds the calling thread to the given cores. A no-op (OK) for a topology
  // that is not this system.
  absl::Status PinCurrentThread(const std::vector<int>& cores) const;

  // One-paragraph description of the machine.
  std::string Describe() const;

  // MemoryPlacer.
  int NodeForShard(int shard, int num_shards) const override;
  absl::Status RunOnNode(int node, const std::function<absl::Status()>& fn) override;
  absl::Status BindArea(void* addr, size_t bytes, int node) override;

 private:
  Topology() = default;
  static absl::StatusOr<std::unique_ptr<Topology>> Load(hwloc_topology* topo, std::string source);

  hwloc_topology* topo_ = nullptr;
  bool this_system_ = false;
  std::string source_;
  int num_packages_ = 0;
  int num_pus_ = 0;
  std::vector<NumaNodeInfo> nodes_;
  std::vector<int> core_node_;  // logical core index -> node
};

// This machine's CPU, whatever topology is being shown: the instruction
// sets found (core/base/cpu_features.h) and the one oneDNN runs its kernels
// with (dnnl::get_effective_cpu_isa, e.g. "avx512_core_bf16"), as
// `shardwild topology` prints them:
//   cpu (this machine): AVX2 AVX-512 AVX512_BF16, no AMX; oneDNN uses avx512_core_bf16
std::string OneDnnCpuIsaName();
std::string DescribeCpu();

}  // namespace shardwild
