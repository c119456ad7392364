#include "workers/job.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/model/model.h"
#include "core/data/idx_reader.h"
#include "core/data/prefetch_burst.h"
#include "core/data/readers.h"
#include "core/base/mutex.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"

namespace shardwild {

int PrefetchBurstLinesFor(const Config& config) {
  if (config.data.prefetch_burst_lines > 0) return config.data.prefetch_burst_lines;
  return MachinePrefetchBurst().lines;
}

absl::StatusOr<std::unique_ptr<Topology>> MakeTopology(const TopologyOptions& options) {
  if (!options.synthetic.empty()) return Topology::FromSynthetic(options.synthetic);
  if (!options.xml.empty()) return Topology::FromXml(options.xml);
  return Topology::Detect();
}

LabelKind LabelKindOf(HeadType head) {
  switch (head) {
    case HeadType::kSoftmax: return LabelKind::kMultiClass;
    case HeadType::kBinary: return LabelKind::kBinary;
    case HeadType::kRegression: return LabelKind::kRegression;
  }
  return LabelKind::kMultiClass;
}

absl::StatusOr<Dataset> LoadDataset(const Config& config, const std::string& path, int64_t max_records,
                                    const Dataset* train) {
  if (config.data.format == DataFormat::kIdx) {
    return WithErrorKind(LoadIdxImageDataset(path, config.model.input_dim, max_records), ErrorKind::kData);
  }
  ReadOptions ro = MakeReadOptions(config.data, LabelKindOf(config.model.head));
  ro.max_records = max_records;
  if (train != nullptr && !train->class_names.empty()) ro.class_names = &train->class_names;
  const char* key = path == config.data.train ? "data.train" : path == config.data.test ? "data.test" : "input";
  absl::StatusOr<std::vector<std::string>> files = ExpandDataFiles(path, key);
  if (!files.ok()) return WithErrorKind(files.status(), ErrorKind::kData);
  return WithErrorKind(ReadDatasetFiles(*files, ro), ErrorKind::kData);
}

namespace {
absl::StatusOr<std::vector<std::string>> TrainFilesAndOptions(const Config& config, ReadOptions* ro) {
  *ro = MakeReadOptions(config.data, LabelKindOf(config.model.head));
  ro->max_records = config.data.max_train_records;
  absl::StatusOr<std::vector<std::string>> files = ExpandDataFiles(config.data.train, "data.train");
  if (!files.ok()) return WithErrorKind(files.status(), ErrorKind::kData);
  return files;
}
}  // namespace

ColumnCacheOptions CacheOptionsOf(const Config& config) {
  ColumnCacheOptions co;
  co.part_bytes = config.data.cache_part_mb << 20;
  return co;
}

absl::StatusOr<std::unique_ptr<ColumnCache>> OpenTrainStream(const Config& config, ColumnCacheStats* stats) {
  ReadOptions ro;
  SW_ASSIGN_OR_RETURN(const std::vector<std::string> files, TrainFilesAndOptions(config, &ro));
  return WithErrorKind(ColumnCache::Open(files, ro, CacheOptionsOf(config), stats), ErrorKind::kData);
}

absl::StatusOr<std::unique_ptr<ColumnCache>> BeginTrainStream(const Config& config,
                                                              const ColumnCacheExpectation& expected,
                                                              std::function<void(size_t part)> before_part) {
  ReadOptions ro;
  SW_ASSIGN_OR_RETURN(const std::vector<std::string> files, TrainFilesAndOptions(config, &ro));
  ColumnCacheOptions co = CacheOptionsOf(config);
  co.before_part = std::move(before_part);
  return WithErrorKind(ColumnCache::Begin(files, ro, co, expected), ErrorKind::kData);
}

absl::Status Job::FinishStream() {
  if (!stream_growing_) return absl::OkStatus();
  SW_RETURN_IF_ERROR(WithErrorKind(stream_->Wait(&stream_stats_), ErrorKind::kData));
  stream_growing_ = false;
  // The whole cache's shape must be the first lines'; its skipped rows are
  // the data's.
  const Dataset& built = stream_->shape();
  bool same = built.dense_dim == train_.dense_dim && built.fields.size() == train_.fields.size() &&
              built.num_classes == train_.num_classes;
  for (size_t f = 0; same && f < built.fields.size(); ++f) same = built.fields[f].name == train_.fields[f].name;
  if (!same) {
    return absl::InternalError(
        absl::StrCat(config_.data.train, ": the data's first lines and its whole cache disagree on its shape"));
  }
  train_.skipped = built.skipped;  // the rest is the workers' (they hold train_'s shape)
  return absl::OkStatus();
}

namespace {
absl::Status CheckTestDataImpl(const Dataset& train, const Dataset& test) {
  if (test.dense_dim != train.dense_dim) {
    return absl::InvalidArgumentError(absl::StrCat("data.test: ", test.dense_dim, " dense features per record, data.train has ",
                                                   train.dense_dim));
  }
  if (test.num_classes > train.num_classes) {
    return absl::InvalidArgumentError(absl::StrCat("data.test: labels go up to ", test.num_classes - 1,
                                                   " but the training data has ", train.num_classes, " classes"));
  }
  if (test.fields.size() != train.fields.size()) {
    return absl::InvalidArgumentError(absl::StrCat("data.test: ", test.fields.size(), " sparse fields, data.train has ",
                                                   train.fields.size()));
  }
  for (size_t f = 0; f < train.fields.size(); ++f) {
    if (test.fields[f].name != train.fields[f].name) {
      return absl::InvalidArgumentError(absl::StrCat("data.test: sparse field ", f, " is '", test.fields[f].name,
                                                     "', in data.train it is '", train.fields[f].name, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTestData(const Dataset& train, const Dataset& test) {
  return WithErrorKind(CheckTestDataImpl(train, test), ErrorKind::kData);
}

TableSpec TableSpecOf(const EmbeddingDecl& d) {
  TableSpec t;
  t.name = d.name;
  t.kind = d.dynamic ? EmbeddingKind::kDynamic : EmbeddingKind::kStatic;
  t.dim = d.dim;
  t.capacity = d.rows;
  t.on_full = d.evict_lru ? CapacityPolicy::kEvictLru : CapacityPolicy::kError;
  t.bf16 = d.bf16;
  if (d.init_scale > 0) {
    t.init.kind = RowInitializer::Kind::kUniform;
    t.init.a = -d.init_scale;
    t.init.b = d.init_scale;
  } else {
    t.init.kind = RowInitializer::Kind::kZeros;
  }
  return t;
}

std::vector<TableSpec> TableSpecsOf(const ModelSpec& spec) {
  std::vector<TableSpec> tables;
  for (const EmbeddingDecl& d : spec.tables) tables.push_back(TableSpecOf(d));
  return tables;
}

Job::~Job() {
  pool_.reset();  // join the threads before the workers and the store go away
}

absl::StatusOr<std::unique_ptr<Job>> Job::Create(const Config& config, const JobOptions& options) {
  SW_RETURN_IF_ERROR(config.Validate());
  if (options.store != nullptr && config.ps.update == UpdateMode::kSync) {
    return absl::InvalidArgumentError(
        "ps.update: sync steps every worker of one store together; a cluster trains hogwild or row_lock");
  }
  if (options.tables && (options.store != nullptr || !options.workers)) {
    return absl::InternalError("Job: JobOptions::tables needs the Job's own store and workers");
  }
  std::unique_ptr<Job> job(new Job());
  job->config_ = config;
  job->external_store_ = options.store;
  SW_ASSIGN_OR_RETURN(job->topology_, MakeTopology(config.topology));
  const Topology& topo = *job->topology_;
  const int workers = topo.ResolveWorkers(config.train.workers);
  const int threads = topo.ResolveThreadsPerWorker(config.train.intra_op_threads, workers);
  // Where workers go does not depend on the shard count; the replication
  // plan depends on where they go, and the shard count on the plan (a
  // replica lives on one node, so 'auto' gives it one shard).
  job->placement_ = topo.Plan(workers, topo.ResolveShards(config.ps.shards), threads);
  ReplicationPlan replication = PlanReplication(config.ps, topo, job->placement_);
  const bool one_copy = replication.policy == ReplicationPolicy::kPerMachine;
  const int shards = one_copy ? topo.ResolveShards(config.ps.shards) : std::max(config.ps.shards, 1);
  if (!one_copy) job->placement_ = topo.Plan(workers, shards, threads);

  if (job->placement_.oversubscribed) {
    spdlog::warn("{} workers x {} threads is more than the {} cores of {}: threads will share cores", workers,
                 threads, topo.num_cores(), topo.source());
  }

  // Data: the test set is read on a second thread while this one reads the
  // training set, unless the test set's labels need the training set's
  // class names (text). (A plain thread, not a oneTBB task: the join is a
  // happens-before edge ThreadSanitizer can see, and Debian's oneTBB is not
  // instrumented.)
  const auto load_start = std::chrono::steady_clock::now();
  absl::StatusOr<Dataset> train, test;
  const bool named_classes = config.data.format == DataFormat::kText;
  std::thread test_loader;
  if (!config.data.test.empty() && !named_classes) {
    test_loader = std::thread([&] { test = LoadDataset(config, config.data.test, config.data.max_test_records, nullptr); });
  }
  // Streamed: when the first lines give the data's shape (all but
  // multiclass labels), the columnar cache is built on its own thread
  // (ColumnCache::Begin) while the store is created below: in-process
  // workers then train on its first parts while the rest is built (the
  // trainer grows epoch 1's tasks); worker processes, which open the
  // finished cache by its path, wait for it once the store is ready.
  // Otherwise (multiclass, a chief, a cluster's worker task) it is built
  // here first.
  if (config.data.stream) {
    std::optional<Dataset> shape;
    ColumnCacheExpectation expected;
    if (options.workers && options.store == nullptr) {
      ReadOptions ro = MakeReadOptions(config.data, LabelKindOf(config.model.head));
      absl::StatusOr<std::vector<std::string>> files = ExpandDataFiles(config.data.train, "data.train");
      if (files.ok()) {
        absl::StatusOr<std::optional<Dataset>> peeked = PeekShape(*files, ro, &expected.bytes_per_record);
        if (peeked.ok()) shape = *std::move(peeked);
      }
    }
    absl::StatusOr<std::unique_ptr<ColumnCache>> cache;
    if (shape) {
      expected.shape = *shape;
      cache = BeginTrainStream(config, expected, options.stream_before_part);
      job->stream_growing_ = cache.ok();
    } else {
      cache = OpenTrainStream(config, &job->stream_stats_);
      if (cache.ok()) shape = (*cache)->shape();
    }
    if (cache.ok()) {
      job->stream_ = *std::move(cache);
      train = *std::move(shape);
    } else {
      train = cache.status();
    }
  } else {
    train = LoadDataset(config, config.data.train, config.data.max_train_records, nullptr);
  }
  if (test_loader.joinable()) test_loader.join();
  if (!train.ok()) return train.status();
  job->train_ = *std::move(train);
  if (!config.data.test.empty()) {
    if (named_classes) test = LoadDataset(config, config.data.test, config.data.max_test_records, &job->train_);
    if (!test.ok()) return test.status();
    SW_RETURN_IF_ERROR(CheckTestData(job->train_, *test));
    if (config.early_stopping.monitor == "test_precision_at_5" && !test->multi_label()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config.source, ": early_stopping.monitor: test_precision_at_5 is reported for multi-label "
                                      "data (records with several __label__ tokens), and ",
                       config.data.test, " has one label per record; monitor test_accuracy"));
    }
    job->test_ = *std::move(test);
  }
  job->data_load_seconds_ = SecondsSince(load_start);

  if (!options.workers) return job;  // a chief: data only

  // Store.
  SW_ASSIGN_OR_RETURN(ModelSpec spec, Model::Describe(config.model, DataShape::Of(job->train_)));
  if (options.tables && !spec.tables.empty()) {
    SW_ASSIGN_OR_RETURN(job->external_tables_, options.tables());
  }
  ParamStore* const tables = job->external_tables_;
  if (options.store == nullptr) {
    std::vector<VariableSpec> vars = spec.variables;
    OpenStoreOptions so;
    so.store = config.ps;
    so.optimizer = config.optimizer;
    so.sparse_optimizer = config.sparse_optimizer;
    so.seed = config.train.seed;
    so.num_shards = shards;
    so.placer = job->topology_.get();
    // Worker processes attach to the store by name; otherwise only this
    // process uses it, and ps.memory_kind auto may make it private.
    so.others_attach = config.train.worker_processes;
    // Every core the workers will run on initialises the store.
    so.init_threads = 0;
    for (const WorkerPlacement& w : job->placement_.workers) so.init_threads += static_cast<int>(w.cores.size());
    // Tables elsewhere (JobOptions::tables): this store holds the dense
    // variables, in one copy.
    if (tables == nullptr) so.tables = TableSpecsOf(spec);
    if (tables != nullptr && replication.num_replicas() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(config.source, ": ps.replication: embedding tables on ps tasks need one copy of the dense "
                                      "variables per process (per_machine), got ",
                       replication.num_replicas(), " replicas"));
    }
    const auto setup_start = std::chrono::steady_clock::now();
    SW_ASSIGN_OR_RETURN(job->store_, WithErrorKind(ReplicatedStore::Create(so, std::move(vars), std::move(replication)),
                                                  ErrorKind::kStore));
    job->store_setup_seconds_ = SecondsSince(setup_start);
    if (tables != nullptr) job->tables_view_ = std::make_unique<ReplicaView>(&job->store(), tables, TableSpecsOf(spec));
    // Stale segments of the job are found (and acted on) by the first replica.
    if (const auto& removed = job->store().removed_stale_segments(); !removed.empty()) {
      spdlog::warn("removed {} stale shared-memory segment(s) of job '{}' left by processes that are gone: {}",
                   removed.size(), config.ps.job_name, DescribeStaleSegments(removed));
    }
    if (const auto& left = job->store().reported_stale_segments(); !left.empty()) {
      spdlog::warn("{} stale shared-memory segment(s) of job '{}' left by processes that are gone (kept, "
                   "ps.stale_segments is 'report'): {}",
                   left.size(), config.ps.job_name, DescribeStaleSegments(left));
    }
  }

  if (job->stream_growing_ && config.train.worker_processes) {
    SW_RETURN_IF_ERROR(job->FinishStream());
    // The data's time runs until the cache is ready.
    job->data_load_seconds_ = SecondsSince(load_start);
  }

  // Workers: each thread pins itself and fixes its OpenMP thread count (an
  // ICV of the calling thread, so oneDNN primitives it runs use exactly that
  // many threads and workers x threads never exceeds the planned cores).
  job->engine_ = dnnl::engine(dnnl::engine::kind::cpu, 0);
  const bool pin = config.train.pin_threads;
  Job* j = job.get();
  job->pool_ = std::make_unique<WorkerPool>(workers, [j, pin, threads](int i) -> absl::Status {
    omp_set_dynamic(0);
    omp_set_num_threads(threads);
    if (pin) SW_RETURN_IF_ERROR(j->topology_->PinCurrentThread(j->placement_.workers[i].cores));
    return absl::OkStatus();
  });
  // Each worker is built on its own thread, so its buffers are first-touched
  // on its node. The builds take turns: oneDNN's primitive cache is shared
  // and its locking is invisible to ThreadSanitizer (Debian's libdnnl is not
  // instrumented), and creation happens once, so nothing is lost.
  job->workers_.resize(workers);
  Mutex build_mu;
  SW_RETURN_IF_ERROR(job->pool_->RunAll([j, &build_mu, &options](int i) -> absl::Status {
    MutexLock lock(&build_mu);
    ParamStore* store = j->tables_view_ ? j->tables_view_.get() : j->store_ ? j->store_->ForWorker(i) : options.store;
    SW_ASSIGN_OR_RETURN(j->workers_[i], Worker::Create(i, j->config_.model, j->config_.train.batch_size, j->train_,
                                                       store, j->engine_, j->config_.train.seed));
    return absl::OkStatus();
  }));

  // Pull policy and, in sync mode, the step barrier (set here, before any
  // RunAll hands the workers to their threads).
  WorkerUpdateOptions update;
  update.pull_every = config.train.pull_every;
  update.max_staleness = config.ps.max_staleness;
  update.hot_rows = config.ps.hot_rows;
  update.hot_rows_merge_every = config.ps.hot_rows_merge_every;
  if (job->config_.sparse_optimizer) update.sparse_optimizer = &*job->config_.sparse_optimizer;
  if (config.ps.update == UpdateMode::kSync || config.train.strategy == TrainStrategy::kAllreduce) {
    // Config::Validate keeps sync (and allreduce) to one copy.
    job->sync_ = std::make_unique<SyncAggregator>(&job->param_store(), workers);
    update.sync = job->sync_.get();
  }
  if (job->store_ && job->store_->num_replicas() > 1) update.replicas = job->store_.get();
  for (auto& w : job->workers_) w->set_update_options(update);
  if (!job->workers_.empty()) {
    const int burst_lines = PrefetchBurstLinesFor(config);
    for (auto& w : job->workers_) w->set_prefetch_burst_lines(burst_lines);
  }
  // The training set packed once for every worker's loads (PackedRecords): a
  // record's ids in one block, not one list per field; IDX pixels as bytes.
  if (!job->workers_.empty() && !job->stream_) {
    const auto pack_start = std::chrono::steady_clock::now();
    job->packed_train_ = job->workers_[0]->model().PackRecords(job->train_);
    job->pack_seconds_ = SecondsSince(pack_start);
    if (job->packed_train_) {
      for (auto& w : job->workers_) w->set_packed_records(&*job->packed_train_);
    }
  }
  job->ready_at_ = std::chrono::steady_clock::now();
  return job;
}

}  // namespace shardwild
