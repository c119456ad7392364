#include "workers/replicated_store.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "core/base/status.h"
#include "ps_shm/memory_placer.h"

namespace shardwild {
namespace {

// Puts every shard of one replica on `node`; placing and binding go to the
// machine's placer (nullptr: the calling thread, unbound).
class SingleNodePlacer final : public MemoryPlacer {
 public:
  SingleNodePlacer(MemoryPlacer* machine, int node) : machine_(machine), node_(node) {}
  int NodeForShard(int, int) const override { return node_; }
  absl::Status RunOnNode(int node, const std::function<absl::Status()>& fn) override {
    return machine_ ? machine_->RunOnNode(node, fn) : fn();
  }
  absl::Status BindArea(void* addr, size_t bytes, int node) override {
    return machine_ ? machine_->BindArea(addr, bytes, node) : absl::OkStatus();
  }

 private:
  MemoryPlacer* const machine_;
  const int node_;
};

}  // namespace

ReplicationPlan PlanReplication(const StoreOptions& ps, const Topology& topology, const Placement& placement) {
  ReplicationPlan plan;
  plan.sync_every = ps.sync_every;
  const int workers = static_cast<int>(placement.workers.size());
  std::set<int> worker_nodes;
  for (const WorkerPlacement& w : placement.workers) worker_nodes.insert(w.node);
  const int nodes = topology.num_nodes();

  plan.policy = ps.replication;
  if (ps.replication == ReplicationPolicy::kAuto) {
    if (ps.update == UpdateMode::kSync) {
      plan.policy = ReplicationPolicy::kPerMachine;
      plan.reason = "ps.update is sync: it averages every step over a single copy";
    } else if (nodes <= 1) {
      plan.policy = ReplicationPolicy::kPerMachine;
      plan.reason = "one NUMA node: a single copy is local to every worker";
    } else if (worker_nodes.size() <= 1) {
      plan.policy = ReplicationPolicy::kPerNode;
      plan.reason = absl::StrCat("the workers all run on NUMA node ", worker_nodes.empty() ? 0 : *worker_nodes.begin(),
                                 " of ", nodes, ": one copy there is local to all of them");
    } else {
      plan.policy = ReplicationPolicy::kPerNode;
      plan.reason = absl::StrCat(nodes, " NUMA nodes: one replica per node keeps reads local");
      if (static_cast<int>(worker_nodes.size()) < nodes) {
        absl::StrAppend(&plan.reason, " (workers on ", worker_nodes.size(), " of them)");
      }
    }
  } else {
    switch (ps.replication) {
      case ReplicationPolicy::kPerMachine:
        plan.reason = "set by ps.replication: one copy, shards spread over the NUMA nodes";
        break;
      case ReplicationPolicy::kPerNode:
        plan.reason = absl::StrCat("set by ps.replication: one replica on each of the ", worker_nodes.size(),
                                   " NUMA node(s) the workers run on");
        break;
      case ReplicationPolicy::kPerCore:
        plan.reason = absl::StrCat("set by ps.replication: one replica per worker (", workers, ")");
        break;
      case ReplicationPolicy::kAuto:
        break;
    }
  }

  switch (plan.policy) {
    case ReplicationPolicy::kPerMachine:
    case ReplicationPolicy::kAuto:
      plan.worker_replica.assign(workers, 0);
      break;
    case ReplicationPolicy::kPerNode: {
      plan.replica_nodes.assign(worker_nodes.begin(), worker_nodes.end());
      if (plan.replica_nodes.empty()) plan.replica_nodes.push_back(0);
      for (const WorkerPlacement& w : placement.workers) {
        int r = 0;
        while (plan.replica_nodes[r] != w.node) ++r;
        plan.worker_replica.push_back(r);
      }
      break;
    }
    case ReplicationPolicy::kPerCore:
      for (int w = 0; w < workers; ++w) {
        plan.replica_nodes.push_back(placement.workers[w].node);
        plan.worker_replica.push_back(w);
      }
      if (plan.replica_nodes.empty()) plan.replica_nodes.push_back(0);
      break;
  }
  return plan;
}

ReplicaView::ReplicaView(ShmParamStore* dense, ParamStore* tables, std::vector<TableSpec> table_specs)
    : dense_(dense), tables_(tables) {
  layout_ = dense->layout();
  layout_.tables = std::move(table_specs);
}

absl::StatusOr<std::unique_ptr<ReplicatedStore>> ReplicatedStore::Create(const OpenStoreOptions& options,
                                                                         std::vector<VariableSpec> variables,
                                                                         ReplicationPlan plan) {
  std::unique_ptr<ReplicatedStore> rs(new ReplicatedStore());
  const int n = plan.num_replicas();
  for (int r : plan.worker_replica) {
    if (r < 0 || r >= n) {
      return absl::InvalidArgumentError(absl::StrCat("replication plan: a worker uses replica ", r, " of ", n));
    }
  }
  if (plan.replica_nodes.empty()) {
    SW_ASSIGN_OR_RETURN(std::unique_ptr<ShmParamStore> store, ShmParamStore::Create(options, std::move(variables)));
    rs->replicas_.push_back(std::move(store));
  } else {
    // With several replicas the tables go to a store of their own, never
    // into a replica (they stay sharded, one copy).
    const bool separate_tables = n > 1 && !options.tables.empty();
    for (int r = 0; r < n; ++r) {
      SingleNodePlacer placer(options.placer, plan.replica_nodes[r]);
      OpenStoreOptions o = options;
      o.placer = &placer;
      if (separate_tables) o.tables.clear();
      SW_ASSIGN_OR_RETURN(std::unique_ptr<ShmParamStore> store, ShmParamStore::Create(o, variables));
      rs->replicas_.push_back(std::move(store));
    }
    if (separate_tables) {
      SW_ASSIGN_OR_RETURN(rs->table_store_, ShmParamStore::Create(options, {}));
      for (const auto& replica : rs->replicas_) {
        rs->views_.push_back(
            std::make_unique<ReplicaView>(replica.get(), rs->table_store_.get(), rs->table_store_->layout().tables));
      }
    }
  }
  for (const auto& s : rs->replicas_) rs->replica_ptrs_.push_back(s.get());
  if (!options.tables.empty()) rs->tables_ = rs->table_store_ ? rs->table_store_.get() : rs->replicas_[0].get();
  rs->plan_ = std::move(plan);
  return rs;
}

uint64_t ReplicatedStore::version() const {
  uint64_t v = 0;
  for (const auto& s : replicas_) v += s->version();
  return v;
}

uint64_t ReplicatedStore::total_bytes() const {
  uint64_t n = 0;
  for (const auto& s : replicas_) n += s->total_bytes();
  if (table_store_) n += table_store_->total_bytes();
  return n;
}

absl::Status ReplicatedStore::StepDone() {
  if (replicas_.size() < 2) return absl::OkStatus();
  return MaybeAverage(steps_.fetch_add(1, std::memory_order_relaxed) + 1);
}

absl::Status ReplicatedStore::MaybeAverage(int64_t global_step) {
  if (replicas_.size() < 2 || global_step <= 0 || global_step % plan_.sync_every != 0) return absl::OkStatus();
  return Average();
}

absl::Status ReplicatedStore::Average() {
  if (replicas_.size() < 2) return absl::OkStatus();
  averagings_.fetch_add(1, std::memory_order_relaxed);
  return ShmParamStore::AverageParams(replica_ptrs_);
}

}  // namespace shardwild
