// ClusterParamStore: one ParamStore spread over the ps tasks of a cluster.
//
// The store's S global shards are split over the P ps tasks by the global
// shard map (net/cluster_spec.h ShardMap: contiguous blocks, TF's div rule).
// Each ps task serves a partial ShmParamStore hosting its block (ps_shm/
// shm_store.h, OpenStoreOptions::first_hosted_shard) behind a PsServer. All
// of them share the global layout, so this store exposes that layout and
// routes each row and id to its owner:
//   * Pull: each slice is split at the ps tasks' hosted rows of its variable;
//     each piece goes to its owner.
//   * Push: each ps task gets, of each gradient, the rows it hosts (ps tasks
//     hosting no row of any gradient are not called, as a ShmParamStore
//     leaves shards no gradient touches alone).
//   * PullRows / PushRows, and their batches over a step's lookups
//     (PullRowsBatch / PushRowsBatch): each part's ids are grouped by owner
//     (static: shard id % S; dynamic: ShardOfDynamicId with S; then
//     ShardMap::OwnerOf), each group keeping batch order, and results
//     scattered back into batch order. One call per ps task carries every
//     part it owns ids of. Ids are validated here first, so a bad id
//     anywhere means no ps task is called.
// For the same single-threaded sequence of calls the parameters are
// bit-identical to one full ShmParamStore's (without gradient compression).
//
// Parallelism: the calls of one Pull / Push / PullRows / PushRows (and
// SaveShards, RestoreShards, version) to the different ps tasks are all in
// flight at once: each remote ps task has `threads_per_ps` threads owned by
// the store that run its calls (PsClient blocks), local ones run on the
// calling thread meanwhile; the call returns when all are done. No thread is
// created per call.
//
// Local ps tasks: a ps task on this machine may be reached through shared
// memory instead of gRPC, with an already-open ParamStore (typically the
// partial ShmParamStore the server serves, attached by the store name its
// GetLayout reports; AttachLocalPsStores does this). SaveShards and
// RestoreShards always go through gRPC (the server owns the checkpoints).
//
// Errors name the ps task: PsClient's ("ps:1 (127.0.0.1:4040) is
// unavailable: ..."), and "ps:1 (local): ..." for a local store. When several
// ps tasks fail, the error of the lowest-numbered one is returned. A failed
// Push or PushRows may have been applied on the other ps tasks (each ps task
// applies its part atomically; the parts are not one transaction).
//
// Allocation: each call allocates (grouping buffers, the gRPC messages);
// this is the network path.
//
// Thread safety: every method may be called concurrently (Hogwild); the
// per-ps queues are under their own mutexes, PsClient is thread-safe, the
// cached version is an atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/base/mutex.h"
#include "net/cluster_spec.h"
#include "net/ps_client.h"
#include "ps_shm/param_store.h"
#include "ps_shm/shm_store.h"

namespace shardwild {

struct ClusterStoreOptions {
  // Threads per remote ps task running its calls: how many calls to one ps
  // task (from concurrent callers of this store) can be in flight at once.
  // 1..64.
  int threads_per_ps = 2;
  // Pushes (Push and PushRows) whose remote parts may still be in flight
  // when they return (0..64; 0 = a push waits for every ps task). With
  // N > 0, a push applies the local parts, copies the remote rows and
  // returns; the (N+1)-th push waits for the oldest. The caller's next pull may then
  // miss its own last push on the remote rows (Hogwild staleness of at most
  // N pushes). An asynchronous push that fails is reported once, by the
  // next Push or Flush. Flush waits for all of them.
  int async_pushes = 0;
};

class ClusterParamStore final : public ParamStore {
 public:
  // Connects to every ps task (ps[i]: ps task i's client options,
  // MakePsClientOptions; one per map.num_ps()) and checks, with one
  // GetLayout call each (in parallel), that all serve the same global layout
  // (variables, rows per shard, tables, optimizers and update mode as ps:0's)
  // of map.num_shards() shards and that ps task i hosts exactly the shards
  // the map gives it. local[i], if given and not null, is an open store of
  // ps task i on this machine (not owned; must outlive this store), used
  // instead of gRPC for pulls and pushes; it must have the same layout and,
  // if it is a ShmParamStore, the same name and hosted block as the server's
  // store. Errors: InvalidArgument for bad arguments; FailedPrecondition
  // naming the ps task that disagrees and how; the errors of GetLayout
  // (Unavailable naming the task).
  static absl::StatusOr<std::unique_ptr<ClusterParamStore>> Connect(const ShardMap& map,
                                                                    std::vector<PsClientOptions> ps,
                                                                    std::vector<ParamStore*> local = {},
                                                                    const ClusterStoreOptions& options = {});
  ~ClusterParamStore() override;
  ClusterParamStore(const ClusterParamStore&) = delete;
  ClusterParamStore& operator=(const ClusterParamStore&) = delete;

  // The global layout (ps:0's; shard_nodes: each shard's NUMA node on its
  // owner).
  const StoreLayout& layout() const override { return layout_; }
  // "ps:0/<store name>,ps:1/<store name>,...".
  const std::string& name() const override { return name_; }
  absl::Status Pull(absl::Span<const PullSlice> slices) override;
  absl::Status Push(absl::Span<const DenseGrad> grads, float lr) override;
  // `scratch` is not used (ids are grouped per ps task here, then per shard
  // by each ps task).
  absl::Status PullRows(int table, absl::Span<const uint64_t> ids, float* out, PullMode mode,
                        RowScratch* scratch) override;
  absl::Status PushRows(int table, absl::Span<const uint64_t> ids, const float* grads, float lr,
                        RowScratch* scratch) override;
  // Every part's ids grouped by owner; one PullRowsBatch / PushRowsBatch
  // call per remote ps task for the whole step (local ps tasks: their
  // store's batch call). Every part is checked before any ps task is called.
  // PullRows / PushRows are a batch of one part.
  absl::Status PullRowsBatch(absl::Span<const RowPull> parts, PullMode mode, RowScratch* scratch) override;
  absl::Status PushRowsBatch(absl::Span<const RowGrad> parts, float lr, RowScratch* scratch) override;
  // The largest model version over the ps tasks (as ShmParamStore::version
  // is the largest over its shards): the number of dense pushes when every
  // push touched every ps task. One Version call per remote ps task, in
  // parallel. If a ps task cannot be reached, the last version this store
  // saw (the next pull or push reports the error).
  uint64_t version() const override;

  // Each ps task writes checkpoint ckpt-<step> of its block into its
  // checkpoint directory (PsClient::SaveShard, all in parallel). Returns
  // each task's checkpoint path, by ps index; the first error (lowest ps
  // index) names its task.
  absl::StatusOr<std::vector<std::string>> SaveShards(int64_t step);
  // Each ps task loads ckpt-<step> (nullopt: its newest good checkpoint)
  // into its store (all in parallel). Returns the step loaded;
  // FailedPrecondition naming the tasks when they loaded different steps
  // (with nullopt: their newest checkpoints differ).
  absl::StatusOr<int64_t> RestoreShards(std::optional<int64_t> step);

  // Waits until no push is in flight (ClusterStoreOptions::
  // async_pushes) and returns the first error of those since the last
  // report, naming its ps task; OK at once without asynchronous pushes.
  // Call it before a task reports done, so a checkpoint taken then holds
  // every push.
  absl::Status Flush();

  // Bytes of pull and push messages over all ps clients (PsClient::stats;
  // local ps tasks send none). Thread-safe.
  PsClient::Stats stats() const;

  const ShardMap& shard_map() const { return map_; }
  int num_ps() const { return map_.num_ps(); }
  // Whether ps task `ps` is reached through shared memory.
  bool is_local(int ps) const { return local_[ps] != nullptr; }
  PsClient& client(int ps) { return *clients_[ps]; }

 private:
  ClusterParamStore(const ShardMap& map, const ClusterStoreOptions& options);
  // Runs fn(p) for every p in `targets` (ps indices, each at most once):
  // remote ones (all of them with grpc_only) on their ps's threads, local
  // ones on this thread meanwhile, and waits for all. statuses[p] gets each
  // result (a local one prefixed by Local).
  void RunOnAll(absl::Span<const int> targets, const std::function<absl::Status(int)>& fn,
                std::vector<absl::Status>* statuses, bool grpc_only = false) const;
  // The first (lowest ps) error in `statuses`, or OK.
  static absl::Status FirstError(const std::vector<absl::Status>& statuses);
  // Prefixes a local store's error with "ps:<p> (local): ".
  absl::Status Local(int p, absl::Status s) const;
  absl::Status CheckIds(int table, absl::Span<const uint64_t> ids, const char* what) const;
  // Part k of a row batch: CheckIds, and a non-null `rows` when it has ids.
  absl::Status CheckRowPart(size_t k, int table, absl::Span<const uint64_t> ids, const void* rows,
                            const char* what) const;
  void SeeVersion(uint64_t v) const;

  // One remote ps task's threads and their queue.
  struct Lane {
    Mutex mu;
    CondVar cv;
    std::vector<std::function<void()>> queue ABSL_GUARDED_BY(mu);  // FIFO (front = oldest)
    bool stop ABSL_GUARDED_BY(mu) = false;
    std::vector<std::thread> threads;  // started in Connect, joined in the destructor
  };
  static void LaneLoop(Lane* lane);
  // Queues `job` on ps task p's lane.
  void Enqueue(int p, std::function<void()> job) const;
  // One push (dense or rows) to the ps tasks in `targets`: send(p) for a
  // remote one (returns the model version), local(p) for a local one.
  // Without async_pushes all run at once and are awaited; with them the
  // remote sends are queued on their lanes and not awaited (send must then
  // own what it sends), the local parts run here.
  absl::Status PushParts(absl::Span<const int> targets, const std::function<absl::StatusOr<uint64_t>(int)>& send,
                         const std::function<absl::Status(int)>& local);
  // An asynchronous push (dense or rows) starts: reports (and clears) the
  // failure of an earlier one, then waits for room (async_pushes) and
  // counts it in flight.
  absl::Status BeginAsyncPush();
  // One remote part of an asynchronous push is done with `status`; the last
  // part (parts_left reaching 0) ends the push.
  void EndAsyncPart(const absl::Status& status, std::atomic<int>& parts_left);

  // Constant after Connect.
  const ShardMap map_;
  const ClusterStoreOptions options_;
  std::vector<std::unique_ptr<PsClient>> clients_;  // [ps]
  std::vector<ParamStore*> local_;                  // [ps]; null = gRPC
  StoreLayout layout_;
  std::string name_;
  std::vector<std::string> task_names_;              // [ps] "ps:1"
  // hosted_[ps][var]: the rows ps task ps hosts of variable var (contiguous;
  // ShmParamStore checks this on every ps task).
  std::vector<std::vector<RowRange>> hosted_;
  // lanes_[ps]: every ps task's, local ones too (GetLayout, SaveShard and
  // RestoreShard go through gRPC).
  std::vector<std::unique_ptr<Lane>> lanes_;

  // The largest version seen (relaxed: a hint for when a ps is unreachable).
  mutable std::atomic<uint64_t> last_version_{0};

  // Asynchronous pushes (ClusterStoreOptions::async_pushes).
  Mutex async_mu_;
  CondVar async_cv_;
  int in_flight_ ABSL_GUARDED_BY(async_mu_) = 0;      // pushes with remote parts not done
  absl::Status async_error_ ABSL_GUARDED_BY(async_mu_);  // the first failure not reported yet
};

// Stores of the ps tasks on `host`, attached through shared memory.
struct LocalPsStores {
  // [ps]: the attached store, or null (not on `host`, or attaching failed).
  std::vector<std::unique_ptr<ShmParamStore>> stores;
  // [ps]: why a ps task on `host` is reached through gRPC after all (empty
  // when attached or not on `host`), for the caller to report.
  std::vector<std::string> fallbacks;
  // The stores as ClusterParamStore::Connect's `local` (not owning).
  std::vector<ParamStore*> pointers() const;
};

// For each ps task whose address's host is `host` (the same string;
// localhost reads as 127.0.0.1, and distinct loopback addresses count as
// distinct machines), asks its server for its store's name (GetLayout) and attaches
// to it (ShmParamStore::Attach with the job's optimizers, which must be the
// servers'). Never fails: a ps task it cannot reach or attach is left to
// gRPC, with the reason in `fallbacks`.
LocalPsStores AttachLocalPsStores(absl::Span<const PsClientOptions> ps, const std::string& host,
                                  const OptimizerOptions& optimizer,
                                  const std::optional<OptimizerOptions>& sparse_optimizer = std::nullopt);

}  // namespace shardwild
