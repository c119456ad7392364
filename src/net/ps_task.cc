#include "net/ps_task.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/base/status.h"
#include "net/ps_server.h"
#include "ps_shm/shm_store.h"
#include "workers/job.h"
#include "workers/live_metrics.h"

namespace shardwild {

absl::Status RunPsTask(const Config& config, const ClusterSpec& spec, int index, const std::atomic<bool>& stop,
                       const TaskLog& log) {
  SW_RETURN_IF_ERROR(config.Validate());
  const TaskId task{Role::kPs, index};
  // Live metrics (metrics.port + 1 + index): the store's version and bytes.
  LiveMetrics live(MetricsRole::kPs);
  SW_ASSIGN_OR_RETURN(const std::unique_ptr<MetricsServer> metrics_server,
                      ServeLiveMetrics(config.metrics, MetricsProcess::PsTask(index), live));
  SW_ASSIGN_OR_RETURN(const int shards, ClusterShards(config, spec));
  SW_ASSIGN_OR_RETURN(const ShardMap map, ShardMap::Make(shards, spec.num_tasks(Role::kPs)));
  // Only the data's shape is needed: streamed data gives it from its
  // columnar cache, without holding the records.
  Dataset train;
  if (config.data.stream) {
    SW_ASSIGN_OR_RETURN(std::unique_ptr<ColumnCache> stream, OpenTrainStream(config));
    train = stream->shape();
  } else {
    SW_ASSIGN_OR_RETURN(train, LoadDataset(config, config.data.train, config.data.max_train_records, nullptr));
  }
  SW_ASSIGN_OR_RETURN(ModelLayout model, DescribeModel(config, train));
  train = Dataset();  // only its shape was needed
  // Under allreduce every rank keeps the dense variables and allreduces
  // their gradients; only the embedding tables, too large to copy to every
  // rank, live on the ps tasks.
  const bool tables_only = config.train.strategy == TrainStrategy::kAllreduce;
  if (tables_only && model.tables.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source, ": train.strategy allreduce: ps tasks host embedding tables; this model has none (start the "
                       "job without ps tasks)"));
  }
  if (tables_only) model.variables.clear();

  SW_ASSIGN_OR_RETURN(std::unique_ptr<Topology> topo, MakeTopology(config.topology));
  OpenStoreOptions so;
  so.store = config.ps;
  // Each ps task's segments carry its own job name, so two ps tasks of one
  // machine never take each other's segments for stale ones.
  so.store.job_name = absl::StrCat(config.ps.job_name, "-ps", index);
  so.optimizer = config.optimizer;
  so.sparse_optimizer = config.sparse_optimizer;
  so.seed = config.train.seed;
  so.num_shards = shards;
  so.first_hosted_shard = map.first_shard(index);
  so.num_hosted_shards = map.num_shards_of(index);
  so.placer = topo.get();
  so.tables = std::move(model.tables);
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ShmParamStore> store, ShmParamStore::Create(so, std::move(model.variables)));
  const LiveMetrics::Attachment live_store =
      live.AttachStore([s = store.get()] { return s->version(); }, StoreBytesOf(*store));

  SW_ASSIGN_OR_RETURN(PsServerOptions server_options, MakePsServerOptions(config.cluster, spec, task));
  // Closed until the chief opens it (as it is, or with a checkpoint's shards).
  server_options.start_closed = true;
  // Started by srun or mpirun: the step ends when every rank has exited, so
  // this ps task exits once the job is done (JobDone from the chief or rank 0).
  const bool launched = spec.source == "Slurm" || spec.source == "Open MPI";
  server_options.exit_when_done = launched;
  if (!config.checkpoint.dir.empty()) {
    server_options.checkpoint_dir = absl::StrCat(config.checkpoint.dir, "/ps-", index);
    // One more than the chief keeps: a ps task saves before the chief commits
    // the checkpoint that names its step, so when that commit never comes the
    // chief's oldest kept checkpoint still finds its shards here.
    server_options.checkpoint_keep = config.checkpoint.keep + 1;
  }
  SW_ASSIGN_OR_RETURN(std::unique_ptr<PsServer> server, PsServer::Start(server_options, store.get()));
  log(absl::StrCat(task.ToString(), ": serving shards [", map.first_shard(index), ", ",
                   map.first_shard(index) + map.num_shards_of(index), ") of ", shards,
                   tables_only ? " (embedding tables only)" : "", " on ", server->address(), " (store ",
                   store->name(), ", ", store->total_bytes() >> 20, " MiB)"));
  if (metrics_server) log(absl::StrCat(task.ToString(), ": metrics at http://", metrics_server->address(), "/metrics"));
  while (!stop.load(std::memory_order_relaxed) && !server->job_done()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  log(absl::StrCat(task.ToString(), server->job_done() ? ": the job is done; stopping" : ": stopping"));
  server->Shutdown(/*grace_s=*/2.0);
  return absl::OkStatus();
}

}  // namespace shardwild
