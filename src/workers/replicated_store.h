// ReplicatedStore: the copies of a job's dense variables (ps.replication),
// after DimmWitted and HogWild++.
//
//   per_machine  one ShmParamStore, its shards spread over the NUMA nodes
//                (the topology's plan). Every worker uses it.
//   per_node     one ShmParamStore per NUMA node that runs workers, every
//                shard of it on that node; a worker uses its node's replica.
//   per_core     one ShmParamStore per worker (a local model), on the
//                worker's node.
//
// Each replica is a complete store with its own shards: a worker still sees
// only a ParamStore* (ForWorker) and never learns where it lives. With more
// than one replica, the workers report each step (StepDone); each time the
// steps of all workers together reach a multiple of ps.sync_every, the worker
// whose step it was sets every replica's parameters to their element-wise
// mean (ShmParamStore::AverageParams), on its own thread, while the others go
// on training (a push racing the averaging may be lost, as in Hogwild).
//
// What is not averaged:
//  - Optimizer slots (Adam moments, Adagrad accumulators, ...) and update
//    counts stay per replica: each replica's optimizer keeps the statistics
//    of the gradients its own workers pushed, as in HogWild++'s local models.
//  - Model versions: each replica counts the pushes applied to it, and an
//    averaging advances none of them. version() is their sum, so it counts
//    every push applied in the job whatever the policy.
//  - Embedding tables: they always stay sharded, never replicated. With
//    more than one replica, the tables live in one more ShmParamStore that
//    holds only them (tables()), its shards placed by options.placer as
//    per_machine places shards; every worker's view (ForWorker) pulls and
//    pushes rows there, and dense variables in its own replica.
//
// Thread safety: ForWorker, version, StepDone, MaybeAverage and Average may
// be called from any thread at any time; the set of replicas is constant
// after Create.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config/options.h"
#include "ps_shm/shm_store.h"
#include "workers/topology.h"

namespace shardwild {

// What ps.replication resolved to on this machine, and why.
struct ReplicationPlan {
  ReplicationPolicy policy = ReplicationPolicy::kPerMachine;  // never kAuto
  std::string reason;               // one line, for the CLI and the JSON summary
  int64_t sync_every = 16;          // ps.sync_every
  // per_node and per_core: the NUMA node of each replica's memory. Empty for
  // per_machine (its one copy follows the topology's shard plan).
  std::vector<int> replica_nodes;
  std::vector<int> worker_replica;  // the replica each worker uses
  int num_replicas() const { return replica_nodes.empty() ? 1 : static_cast<int>(replica_nodes.size()); }
};

// What a worker sees when the dense variables and the embedding tables live
// in different stores, behind one ParamStore: a replicated job's replica and
// its one copy of the tables, or (train.strategy allreduce) a rank's own
// dense store and the cluster's ps tasks that host the tables. layout() is
// the dense store's (variables, parts, shard_nodes of the dense shards) with
// `tables` appended (the ps tasks' GetLayout does not say bf16); version()
// is the dense store's. Both stores are not owned and must outlive the view.
// Thread-safe as they are.
class ReplicaView final : public ParamStore {
 public:
  ReplicaView(ShmParamStore* dense, ParamStore* tables, std::vector<TableSpec> table_specs);

  const StoreLayout& layout() const override { return layout_; }
  const std::string& name() const override { return dense_->name(); }
  absl::Status Pull(absl::Span<const PullSlice> slices) override { return dense_->Pull(slices); }
  absl::Status Push(absl::Span<const DenseGrad> grads, float lr) override { return dense_->Push(grads, lr); }
  absl::Status PullRows(int table, absl::Span<const uint64_t> ids, float* out, PullMode mode,
                        RowScratch* scratch) override {
    return tables_->PullRows(table, ids, out, mode, scratch);
  }
  absl::Status PushRows(int table, absl::Span<const uint64_t> ids, const float* grads, float lr,
                        RowScratch* scratch) override {
    return tables_->PushRows(table, ids, grads, lr, scratch);
  }
  // A step's lookups as one batch (one call per ps task of a cluster's store).
  absl::Status PullRowsBatch(absl::Span<const RowPull> parts, PullMode mode, RowScratch* scratch) override {
    return tables_->PullRowsBatch(parts, mode, scratch);
  }
  absl::Status PushRowsBatch(absl::Span<const RowGrad> parts, float lr, RowScratch* scratch) override {
    return tables_->PushRowsBatch(parts, lr, scratch);
  }
  uint64_t version() const override { return dense_->version(); }

 private:
  ShmParamStore* dense_;
  ParamStore* tables_;
  StoreLayout layout_;
};

// Resolves ps.replication (auto included) for `placement` on `topology`:
//   auto with ps.update sync -> per_machine (sync averages every step over
//     one copy already);
//   auto on one NUMA node -> per_machine;
//   auto with the workers on several nodes -> per_node;
//   auto with the workers all on one node of several -> per_node with one
//     replica there (a single copy local to all of them, never averaged).
// per_node makes one replica per node that runs workers, in node order (a
// replica no worker pushes to would only drag the average back). per_core
// makes one per worker, on the worker's node. The options must be valid.
ReplicationPlan PlanReplication(const StoreOptions& ps, const Topology& topology, const Placement& placement);

class ReplicatedStore {
 public:
  // Creates the plan's replicas, each a ShmParamStore with options.num_shards
  // shards, initialised from options.seed (so all start equal). per_machine
  // places shards with options.placer as is; the other policies put every
  // shard of replica r on plan.replica_nodes[r], first-touched and bound
  // there through options.placer (nullptr: by the calling thread, unbound).
  // Embedding tables (options.tables) are created once: in the single
  // replica, or with more than one replica in a store of their own
  // (tables()). Errors: as ShmParamStore::Create; InvalidArgument for a plan
  // whose worker_replica names a replica that does not exist.
  static absl::StatusOr<std::unique_ptr<ReplicatedStore>> Create(const OpenStoreOptions& options,
                                                                 std::vector<VariableSpec> variables,
                                                                 ReplicationPlan plan);
  ReplicatedStore(const ReplicatedStore&) = delete;
  ReplicatedStore& operator=(const ReplicatedStore&) = delete;

  const ReplicationPlan& plan() const { return plan_; }
  int num_replicas() const { return static_cast<int>(replicas_.size()); }
  // Replica r (0 <= r < num_replicas()).
  ShmParamStore& replica(int r) { return *replicas_[r]; }
  const ShmParamStore& replica(int r) const { return *replicas_[r]; }
  // The store worker w pulls from and pushes to (0 <= w < the plan's
  // workers): its replica, or with a separate table store its replica's
  // ReplicaView. Not owned; lives as long as this object.
  ParamStore* ForWorker(int w) {
    const int r = plan_.worker_replica[w];
    return views_.empty() ? static_cast<ParamStore*>(replicas_[r].get()) : views_[r].get();
  }
  // The store holding the embedding tables: replica 0 when there is one
  // replica, else the separate table store; nullptr without tables.
  ShmParamStore* tables() { return tables_; }

  // Pushes applied over all replicas (the sum of their model versions).
  uint64_t version() const;
  // Bytes of shared memory over all replicas and the table store.
  uint64_t total_bytes() const;

  // A worker finished a step (its push is done). Counts it in the global
  // step count and returns MaybeAverage(that count): every count is handed
  // to exactly one caller, so exactly one thread averages at each multiple
  // of sync_every. Returns the averaging's status. Allocates nothing. With
  // one replica it does nothing at all (steps() stays 0).
  absl::Status StepDone();
  // Averages the replicas when there is more than one and global_step is a
  // positive multiple of the plan's sync_every; otherwise does nothing.
  absl::Status MaybeAverage(int64_t global_step);
  // Averages the replicas now (ShmParamStore::AverageParams); a no-op with
  // one replica. The trainer calls it after each epoch, so evaluation sees
  // one model.
  absl::Status Average();

  // Steps counted by StepDone, and averagings done, so far.
  int64_t steps() const { return steps_.load(std::memory_order_relaxed); }
  int64_t averagings() const { return averagings_.load(std::memory_order_relaxed); }

 private:
  ReplicatedStore() = default;

  // Constant after construction.
  ReplicationPlan plan_;
  std::vector<std::unique_ptr<ShmParamStore>> replicas_;
  std::vector<ShmParamStore*> replica_ptrs_;  // the same, for AverageParams
  std::unique_ptr<ShmParamStore> table_store_;  // tables, with more than one replica
  ShmParamStore* tables_ = nullptr;
  std::vector<std::unique_ptr<ReplicaView>> views_;  // per replica, with table_store_

  // Atomics. Relaxed: the step counter only hands out distinct numbers (the
  // fetch_add is what makes one thread the averager of a round) and the
  // averaging count is for reports; neither publishes other memory, and the
  // parameters themselves are read and written with std::atomic_ref.
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> averagings_{0};
};

}  // namespace shardwild
