#include "workers/topology.h"

#include <hwloc.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/cpu_features.h"
#include "core/base/status.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace shardwild {

std::string Placement::ToString() const {
  std::string s = absl::StrFormat("placement: %d workers x %d intra-op threads, %d shards%s\n", num_workers,
                                  threads_per_worker, num_shards, oversubscribed ? " (oversubscribed)" : "");
  for (size_t w = 0; w < workers.size(); ++w) {
    absl::StrAppendFormat(&s, "  worker %d: node %d, cores %s\n", w, workers[w].node, absl::StrJoin(workers[w].cores, ","));
  }
  for (size_t k = 0; k < shard_nodes.size(); ++k) absl::StrAppendFormat(&s, "  shard %d: node %d\n", k, shard_nodes[k]);
  return s;
}

absl::StatusOr<std::unique_ptr<Topology>> Topology::Load(hwloc_topology* topo, std::string source) {
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return absl::InvalidArgumentError(absl::StrCat("hwloc could not load the topology from ", source));
  }
  std::unique_ptr<Topology> t(new Topology());
  t->topo_ = topo;
  t->source_ = std::move(source);
  t->this_system_ = hwloc_topology_is_thissystem(topo) != 0;
  t->num_packages_ = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE));
  t->num_pus_ = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  const int nnodes = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE));
  t->nodes_.resize(nnodes);
  for (int n = 0; n < nnodes; ++n) {
    t->nodes_[n].index = n;
    if (hwloc_obj_t obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n)) {
      t->nodes_[n].memory_bytes = obj->attr ? obj->attr->numanode.local_memory : 0;
    }
  }
  int ncores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  const hwloc_obj_type_t core_type = ncores > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  ncores = hwloc_get_nbobjs_by_type(topo, core_type);
  if (ncores < 1) return absl::InvalidArgumentError(absl::StrCat(t->source_, ": the topology has no cores"));
  for (int c = 0; c < ncores; ++c) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, core_type, c);
    int node = 0;
    for (int n = 0; n < nnodes; ++n) {
      hwloc_obj_t obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n);
      if (obj && hwloc_bitmap_intersects(core->cpuset, obj->cpuset)) {
        node = n;
        break;
      }
    }
    t->core_node_.push_back(node);
    t->nodes_[node].cores.push_back(c);
  }
  return t;
}

absl::StatusOr<std::unique_ptr<Topology>> Topology::Detect() {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return absl::InternalError("hwloc_topology_init failed");
  return Load(topo, "this machine");
}

absl::StatusOr<std::unique_ptr<Topology>> Topology::FromSynthetic(const std::string& description) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return absl::InternalError("hwloc_topology_init failed");
  if (hwloc_topology_set_synthetic(topo, description.c_str()) != 0) {
    hwloc_topology_destroy(topo);
    return absl::InvalidArgumentError(absl::StrCat(
        "topology.synthetic: hwloc cannot parse '", description, "' (expected e.g. \"pack:2 numa:1 core:4 pu:1\")"));
  }
  return Load(topo, absl::StrCat("synthetic \"", description, "\""));
}

absl::StatusOr<std::unique_ptr<Topology>> Topology::FromXml(const std::string& path) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return absl::InternalError("hwloc_topology_init failed");
  if (hwloc_topology_set_xml(topo, path.c_str()) != 0) {
    hwloc_topology_destroy(topo);
    return absl::InvalidArgumentError(absl::StrCat("topology.xml: hwloc cannot read '", path, "'"));
  }
  return Load(topo, absl::StrCat("xml ", path));
}

Topology::~Topology() {
  if (topo_) hwloc_topology_destroy(topo_);
}

int Topology::ResolveThreadsPerWorker(int requested, int workers) const {
  if (requested > 0) return requested;
  return std::max(1, num_cores() / std::max(1, workers));
}

Placement Topology::Plan(int workers, int shards, int threads_per_worker) const {
  Placement p;
  p.num_workers = workers;
  p.num_shards = shards;
  p.threads_per_worker = threads_per_worker;
  const int nnodes = num_nodes();
  std::vector<size_t> next(nnodes, 0);  // next free core per node
  for (int w = 0; w < workers; ++w) {
    WorkerPlacement wp;
    // Nodes without cores (memory-only) cannot run workers; skip to the next.
    wp.node = static_cast<int>(static_cast<int64_t>(w) * nnodes / workers);
    for (int k = 0; k < nnodes && nodes_[wp.node].cores.empty(); ++k) wp.node = (wp.node + 1) % nnodes;
    const std::vector<int>& cores = nodes_[wp.node].cores;
    for (int t = 0; t < threads_per_worker; ++t) {
      if (next[wp.node] >= cores.size()) p.oversubscribed = true;
      wp.cores.push_back(cores[next[wp.node]++ % cores.size()]);
    }
    p.workers.push_back(std::move(wp));
  }
  for (int s = 0; s < shards; ++s) p.shard_nodes.push_back(NodeForShard(s, shards));
  return p;
}

absl::Status Topology::PinCurrentThread(const std::vector<int>& cores) const {
  if (!this_system_ || cores.empty()) return absl::OkStatus();
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  const hwloc_obj_type_t core_type = hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  for (int c : cores) {
    if (hwloc_obj_t obj = hwloc_get_obj_by_type(topo_, core_type, c)) hwloc_bitmap_or(set, set, obj->cpuset);
  }
  const int rc = hwloc_set_cpubind(topo_, set, HWLOC_CPUBIND_THREAD);
  hwloc_bitmap_free(set);
  if (rc != 0) return absl::InternalError(absl::StrCat("could not pin a worker thread to cores ", absl::StrJoin(cores, ",")));
  return absl::OkStatus();
}

std::string Topology::Describe() const {
  std::string s = absl::StrFormat("topology (%s): %d packages, %d NUMA nodes, %d cores, %d hardware threads\n",
                                  source_, num_packages_, num_nodes(), num_cores(), num_pus_);
  for (const NumaNodeInfo& n : nodes_) {
    absl::StrAppendFormat(&s, "  node %d: %.1f GiB, cores %s\n", n.index, n.memory_bytes / 1073741824.0,
                          n.cores.empty() ? "none" : absl::StrJoin(n.cores, ","));
  }
  return s;
}

int Topology::NodeForShard(int shard, int num_shards) const { return shard % num_nodes(); }

absl::Status Topology::RunOnNode(int node, const std::function<absl::Status()>& fn) {
  if (!this_system_ || num_nodes() == 1) return fn();
  hwloc_obj_t obj = hwloc_get_obj_by_type(topo_, HWLOC_OBJ_NUMANODE, node);
  if (!obj) return absl::InvalidArgumentError(absl::StrCat("no NUMA node ", node));
  absl::Status result;
  std::thread t([&] {
    if (hwloc_set_cpubind(topo_, obj->cpuset, HWLOC_CPUBIND_THREAD) != 0 ||
        hwloc_set_membind(topo_, obj->nodeset, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) != 0) {
      result = absl::InternalError(absl::StrCat("could not bind a thread to NUMA node ", node));
      return;
    }
    result = fn();
  });
  t.join();
  return result;
}

absl::Status Topology::BindArea(void* addr, size_t bytes, int node) {
  if (!this_system_ || num_nodes() == 1) return absl::OkStatus();
  hwloc_obj_t obj = hwloc_get_obj_by_type(topo_, HWLOC_OBJ_NUMANODE, node);
  if (!obj) return absl::InvalidArgumentError(absl::StrCat("no NUMA node ", node));
  if (hwloc_set_area_membind(topo_, addr, bytes, obj->nodeset, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET) != 0) {
    return absl::InternalError(absl::StrCat("could not bind shard memory to NUMA node ", node));
  }
  return absl::OkStatus();
}

std::string OneDnnCpuIsaName() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "all";  // no limit (dnnl_cpu_isa_all) or one this list does not know
  }
}

std::string DescribeCpu() {
  const CpuFeatures f = DetectCpuFeatures();
  const std::vector<std::string> names = f.Names();
  return absl::StrFormat("cpu (this machine): %s%s; oneDNN uses %s\n", names.empty() ? "none of AVX2, AVX-512, AMX" : absl::StrJoin(names, " "),
                         f.amx_tile ? "" : ", no AMX", OneDnnCpuIsaName());
}

}  // namespace shardwild
