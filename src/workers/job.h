// Job: everything one training or benchmark run is built from, created once
// from a Config: topology and placement, data, the parameter store, the
// worker threads and the workers.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/column_cache.h"
#include "core/data/dataset.h"
#include "core/model/model.h"
#include "core/config/options.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "ps_shm/shm_store.h"
#include "workers/replicated_store.h"
#include "workers/topology.h"
#include "workers/worker.h"
#include "ps_shm/sync_aggregator.h"
#include "workers/worker_pool.h"

namespace shardwild {

// The labels a head needs (softmax: classes, binary: 0/1, regression: reals).
LabelKind LabelKindOf(HeadType head);

// Reads the data set at `path` as config.data says (format, bad-row policy,
// cache, ...), keeping the first `max_records` records (0 = all). `train`,
// when given, is the training set: a test set's named classes (text) map
// through its class names.
absl::StatusOr<Dataset> LoadDataset(const Config& config, const std::string& path, int64_t max_records,
                                    const Dataset* train);

// InvalidArgument (naming data.test) when a test set doesn't fit the
// training set: dense width, classes, sparse fields.
absl::Status CheckTestData(const Dataset& train, const Dataset& test);

// data.stream: the columnar cache of data.train (built where missing or
// stale, with data.reader_threads threads, in parts of data.cache_part_mb),
// its records capped at data.max_train_records.
absl::StatusOr<std::unique_ptr<ColumnCache>> OpenTrainStream(const Config& config, ColumnCacheStats* stats = nullptr);
// As OpenTrainStream, but returns before the build, which runs on its own
// thread with the layout `expected` (ColumnCache::Begin).
absl::StatusOr<std::unique_ptr<ColumnCache>> BeginTrainStream(
    const Config& config, const ColumnCacheExpectation& expected,
    std::function<void(size_t part)> before_part = nullptr);

// The store's table for one a model declares (initial rows uniform in
// +-init_scale, zeros where it is 0: the wide tables).
TableSpec TableSpecOf(const EmbeddingDecl& d);
// The store's tables for a model (ModelSpec::tables, in order).
std::vector<TableSpec> TableSpecsOf(const ModelSpec& spec);

// The most lines of the next batch a worker asks for at once:
// data.prefetch_burst_lines, or where it is auto what this machine's cores
// bring in (MachinePrefetchBurst, measured once per process, about 3 ms).
int PrefetchBurstLinesFor(const Config& config);

// Builds the topology a config asks for: topology.synthetic, topology.xml, or
// the real machine.
absl::StatusOr<std::unique_ptr<Topology>> MakeTopology(const TopologyOptions& options);

// How a Job gets its parameters and workers (Job::Create).
struct JobOptions {
  // The parameters the workers pull and push: nullptr = a store created by
  // the Job in this machine's shared memory (ps.replication as planned);
  // otherwise this one (not owned; it must outlive the Job), e.g. a gRPC
  // bridge's ClusterParamStore on a cluster's worker task.
  ParamStore* store = nullptr;
  // train.strategy allreduce with ps tasks: called once, when the model has
  // embedding tables, for the store that holds them (a ClusterParamStore of
  // the ps tasks, not owned; it must outlive the Job). The Job's own store
  // then holds the dense variables only (one copy), and the workers and the
  // sync barrier see both through one view (param_store()). Not with
  // `store`.
  std::function<absl::StatusOr<ParamStore*>()> tables;
  // Start the worker threads and build the workers; false = data only (a
  // cluster's chief, whose workers are remote: it needs the record counts).
  bool workers = true;
  // Streamed data whose cache is built while training runs: called on the
  // builder thread before each part (ColumnCacheOptions::before_part), so
  // that tests can hold the build at a part.
  std::function<void(size_t part)> stream_before_part;
};

class Job {
 public:
  // Loads the data, creates the store (ps.replication resolved for this
  // topology and placement: one copy with one shard per ps.shards placed by
  // the topology, or one replica per node or per worker, each with ps.shards
  // shards ('auto' = 1) on its node), starts the worker threads (each pinned, with its OpenMP thread
  // count set) and builds each worker on its own thread.
  static absl::StatusOr<std::unique_ptr<Job>> Create(const Config& config, const JobOptions& options = {});
  ~Job();

  const Config& config() const { return config_; }
  const Topology& topology() const { return *topology_; }
  const Placement& placement() const { return placement_; }
  // Whether the Job created the store (JobOptions::store was nullptr).
  // store() and replicas() exist only then.
  bool has_local_store() const { return store_ != nullptr; }
  // The first replica: with ps.replication per_machine the one store.
  ShmParamStore& store() { return store_->replica(0); }
  // The store the workers use: the first replica, or JobOptions::store.
  // With JobOptions::tables, the view of the dense store and the tables.
  ParamStore& param_store() {
    if (tables_view_) return *tables_view_;
    return store_ ? static_cast<ParamStore&>(store_->replica(0)) : *external_store_;
  }
  // The store JobOptions::tables gave (null without, or without tables).
  ParamStore* tables_store() { return external_tables_; }
  // Every replica, what ps.replication chose and why, and the averaging.
  ReplicatedStore& replicas() { return *store_; }
  WorkerPool& pool() { return *pool_; }
  Worker& worker(int i) { return *workers_[i]; }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  // The training data; with data.stream only its shape (no records: they
  // are read from stream()).
  const Dataset& train() const { return train_; }
  // Training records, streamed or not (streamed and growing: those
  // readable so far).
  int64_t train_records() const { return stream_ ? stream_->records() : train_.count; }
  // data.stream: the columnar cache the workers read; null otherwise.
  const ColumnCache* stream() const { return stream_.get(); }
  // The training records as the workers load them (Model::PackRecords);
  // null when streamed or when nothing packs.
  const PackedRecords* packed_train() const { return packed_train_ ? &*packed_train_ : nullptr; }
  // The cache's build stats (final once the stream no longer grows).
  const ColumnCacheStats& stream_stats() const { return stream_stats_; }
  // Streamed, with in-process workers, when the first lines gave the data's
  // shape (all but multiclass labels): Create returns while the cache is
  // being built, and records become readable a part at a time
  // (ColumnCache::Begin); the trainer grows epoch 1's tasks with them.
  bool stream_growing() const { return stream_growing_; }
  // Waits for a growing stream's build to end: its error (bad rows, I/O)
  // or OK, after which train().skipped and stream_stats() are final.
  absl::Status FinishStream();
  // When Create returned: the store set up and the workers built.
  std::chrono::steady_clock::time_point ready_at() const { return ready_at_; }
  const Dataset* test() const { return test_ ? &*test_ : nullptr; }
  // Seconds spent reading and parsing the data sets in Create.
  double data_load_seconds() const { return data_load_seconds_; }
  // Seconds spent creating and initialising the local store in Create (0
  // with JobOptions::store).
  double store_setup_seconds() const { return store_setup_seconds_; }
  // Seconds spent packing the training set for the workers' loads
  // (Model::PackRecords) in Create; 0 where it is not packed.
  double pack_seconds() const { return pack_seconds_; }
  // The step barrier of ps.update sync; nullptr in the other modes.
  SyncAggregator* sync() { return sync_.get(); }

 private:
  Job() = default;

  Config config_;
  std::unique_ptr<Topology> topology_;
  Placement placement_;
  Dataset train_;
  std::unique_ptr<ColumnCache> stream_;
  ColumnCacheStats stream_stats_;
  bool stream_growing_ = false;
  std::chrono::steady_clock::time_point ready_at_;
  std::optional<PackedRecords> packed_train_;  // train_'s ids for the workers' model (Model::PackRecords)
  std::optional<Dataset> test_;
  double data_load_seconds_ = 0;
  double store_setup_seconds_ = 0;
  double pack_seconds_ = 0;
  dnnl::engine engine_;
  std::unique_ptr<ReplicatedStore> store_;  // null with JobOptions::store
  ParamStore* external_store_ = nullptr;    // JobOptions::store (not owned)
  ParamStore* external_tables_ = nullptr;   // JobOptions::tables (not owned)
  std::unique_ptr<ReplicaView> tables_view_;  // store() and external_tables_
  std::unique_ptr<SyncAggregator> sync_;          // ps.update sync only
  std::vector<std::unique_ptr<Worker>> workers_;  // slot i written only by thread i during Create
  std::unique_ptr<WorkerPool> pool_;              // declared last: its threads stop before the rest goes
};

}  // namespace shardwild
