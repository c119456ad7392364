#include "net/chief_task.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/mutex.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"
#include "net/chief.h"
#include "net/cluster_functions.h"
#include "net/cluster_setup.h"
#include "net/cluster_store.h"
#include "net/ps_client.h"
#include "workers/checkpoint.h"
#include "workers/job.h"
#include "workers/task_trainer.h"

namespace shardwild {
namespace {

using Clock = std::chrono::steady_clock;

// Watches the ps tasks from its own thread: which one has been unreachable
// for how long, and which one came back as a new process (another store
// name).
class PsMonitor {
 public:
  // `names`: each ps task's store name now (GetLayout).
  static absl::StatusOr<std::unique_ptr<PsMonitor>> Start(const std::vector<PsClientOptions>& ps,
                                                          std::vector<std::string> names) {
    std::unique_ptr<PsMonitor> m(new PsMonitor());
    for (PsClientOptions o : ps) {
      o.max_attempts = 1;
      o.deadline_s = std::min(1.0, o.deadline_s);
      SW_ASSIGN_OR_RETURN(std::unique_ptr<PsClient> c, PsClient::Create(o));
      m->clients_.push_back(std::move(c));
    }
    {
      MutexLock lock(&m->mu_);
      m->names_ = std::move(names);
      m->last_ok_.assign(ps.size(), Clock::now());
      m->restarted_.assign(ps.size(), false);
    }
    m->thread_ = std::thread([p = m.get()] { p->Loop(); });
    return m;
  }
  ~PsMonitor() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    thread_.join();
  }

  // Seconds since ps task i last answered.
  double Silent(int i) {
    MutexLock lock(&mu_);
    return SecondsSince(last_ok_[i]);
  }
  // Records that ps task i now serves the store `name` (a GetLayout made
  // by the caller); another name than before marks it restarted.
  void Observe(size_t i, const std::string& name) {
    MutexLock lock(&mu_);
    last_ok_[i] = Clock::now();
    if (name != names_[i]) {
      names_[i] = name;
      restarted_[i] = true;
    }
  }
  // The ps tasks restarted since the last call.
  std::vector<int> TakeRestarted() {
    MutexLock lock(&mu_);
    std::vector<int> out;
    for (size_t i = 0; i < restarted_.size(); ++i) {
      if (restarted_[i]) out.push_back(static_cast<int>(i));
      restarted_[i] = false;
    }
    return out;
  }

 private:
  PsMonitor() = default;

  void Loop() {
    while (true) {
      {
        MutexLock lock(&mu_);
        if (cv_.WaitFor(&mu_, std::chrono::milliseconds(250), [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
              return stop_;
            })) {
          return;
        }
      }
      for (size_t i = 0; i < clients_.size(); ++i) {
        absl::StatusOr<RemoteLayout> l = clients_[i]->GetLayout();
        if (l.ok()) Observe(i, l->store_name);
      }
    }
  }

  std::vector<std::unique_ptr<PsClient>> clients_;  // used by the thread only
  Mutex mu_;
  CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);
  std::vector<Clock::time_point> last_ok_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> restarted_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// FailedPrecondition unless `c` is a checkpoint of a cluster of `num_ps` ps
// tasks and `shards` shards (the chief's, WriteStateCheckpoint).
absl::Status CheckClusterCheckpoint(const CheckpointInfo& c, int num_ps, int shards) {
  const nlohmann::json& p = c.params_info;
  if (c.kind != CheckpointKind::kState || !p.is_object() || p.value("kind", "") != "cluster") {
    return absl::FailedPreconditionError(absl::StrCat(
        c.path, ": not a cluster checkpoint (one machine's training wrote it); a cluster resumes only from its "
                "chief's checkpoints: use another checkpoint.dir, or --fresh"));
  }
  const int64_t ps = p.contains("ps") && p["ps"].is_array() ? static_cast<int64_t>(p["ps"].size()) : -1;
  if (ps != num_ps || p.value("shards", int64_t{-1}) != shards) {
    return absl::FailedPreconditionError(absl::StrCat(c.path, ": written by a cluster of ", ps, " ps tasks and ",
                                                      p.value("shards", int64_t{-1}), " shards, this one has ", num_ps,
                                                      " and ", shards));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainSummary> RunChief(Job& job, const ClusterSpec& spec, ProgressReporter& progress,
                                      TrainRunOptions options,
                                      const std::function<absl::Status(ClusterCoordinator&)>& before_training) {
  const Config& config = job.config();
  if (job.has_local_store() || job.num_workers() > 0) {
    return absl::InvalidArgumentError("the chief's job holds the data only (JobOptions workers false)");
  }
  if (!spec.task || spec.task->type != Role::kChief) {
    return absl::InvalidArgumentError(absl::StrCat(spec.source, ": task.type: `shardwild train` on a cluster runs "
                                                   "the chief (use `shardwild serve` for ps, worker and evaluator "
                                                   "tasks)"));
  }
  if (config.ps.update == UpdateMode::kSync) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source, ": ps.update: sync steps every worker of one store together; a cluster trains hogwild or "
                       "row_lock"));
  }
  const int workers_tasks = spec.num_tasks(Role::kWorker);
  if (workers_tasks == 0) {
    return absl::InvalidArgumentError(absl::StrCat(spec.source, ": cluster.worker: the cluster has no worker task"));
  }
  SW_ASSIGN_OR_RETURN(const int shards, ClusterShards(config, spec));
  const int num_ps = spec.num_tasks(Role::kPs);

  SW_ASSIGN_OR_RETURN(const ModelLayout model, DescribeModel(config, job.train()));
  const int threads = job.topology().ResolveWorkers(config.train.workers);

  // The ps tasks, as one store (SaveShards, RestoreShards, version): each
  // must be up (waiting for them up to train.task_timeout_s) and serve the
  // chief's model.
  SW_ASSIGN_OR_RETURN(std::vector<PsClientOptions> ps_options, PsClientsOf(config, spec));
  SW_ASSIGN_OR_RETURN(const ShardMap map, ShardMap::Make(shards, num_ps));
  const auto waiting_since = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<ClusterParamStore>> connected = ClusterParamStore::Connect(map, ps_options);
  while (!connected.ok() && connected.status().code() == absl::StatusCode::kUnavailable &&
         SecondsSince(waiting_since) < config.train.task_timeout_s) {
    connected = ClusterParamStore::Connect(map, ps_options);
  }
  SW_RETURN_IF_ERROR(connected.status());
  ClusterParamStore& cluster = **connected;
  SW_RETURN_IF_ERROR(CheckPsLayout(cluster.layout(), model, "the chief"));
  std::vector<std::string> names;  // each ps task's store name, to tell a restart
  for (int i = 0; i < num_ps; ++i) {
    SW_ASSIGN_OR_RETURN(RemoteLayout layout, cluster.client(i).GetLayout());
    names.push_back(layout.store_name);
  }
  // A ps task starts closed (PsServerOptions::start_closed): this opens the
  // ones that just started with their initial values (a resume then
  // restores them before any worker trains), and is a no-op on the ones of
  // a chief that restarted.
  for (int i = 0; i < num_ps; ++i) SW_RETURN_IF_ERROR(cluster.client(i).Open());
  progress.Line(absl::StrCat("chief: ", num_ps, " ps task", num_ps == 1 ? "" : "s", " (", shards, " shards), ",
                             workers_tasks, " worker task", workers_tasks == 1 ? "" : "s", " x ", threads,
                             " threads"));
  SW_ASSIGN_OR_RETURN(std::unique_ptr<PsMonitor> monitor, PsMonitor::Start(ps_options, names));

  // The step of the last checkpoint every ps task has (restored or written).
  std::optional<int64_t> committed;
  const double deadline_s = config.cluster.deadline_s;

  ExternalTraining ext;
  ext.workers = workers_tasks * threads;
  ext.shards = shards;
  ext.store_name = cluster.name();
  ext.make_workers = [&]() -> absl::StatusOr<std::unique_ptr<TaskWorkers>> {
    ChiefServerOptions co;
    SW_ASSIGN_OR_RETURN(co.server, MakePsServerOptions(config.cluster, spec, TaskId{Role::kChief, 0}));
    co.worker_tasks = workers_tasks;
    co.threads_per_task = threads;
    co.late_join_wait_s = config.train.task_timeout_s;
    co.late_join_wait_setting = "train.task_timeout_s";
    co.log = [&progress](const std::string& line) { progress.Line(line); };
    SW_ASSIGN_OR_RETURN(std::unique_ptr<RemoteWorkers> w, RemoteWorkers::Start(co));
    progress.Line(absl::StrCat("chief: waiting for ", workers_tasks * threads, " worker threads on ",
                               co.server.bind_address));
    if (before_training) {
      SW_ASSIGN_OR_RETURN(std::unique_ptr<ClusterCoordinator> coordinator, ClusterCoordinator::Create(w.get()));
      SW_RETURN_IF_ERROR(coordinator->WaitForWorkers(config.train.task_timeout_s));
      SW_RETURN_IF_ERROR(before_training(*coordinator));
      SW_RETURN_IF_ERROR(coordinator->Join());
    }
    return std::unique_ptr<TaskWorkers>(std::move(w));
  };
  // A restarted ps task serves nothing until it is reopened here: with the
  // last committed checkpoint's shards, or before the first one with its
  // initial values. `probe`: ask every ps task now rather than rely on the
  // monitor's last round.
  auto reopen_restarted = [&](bool probe) -> absl::Status {
    if (probe) {
      for (int i = 0; i < num_ps; ++i) {
        SW_ASSIGN_OR_RETURN(const RemoteLayout layout, cluster.client(i).GetLayout());
        monitor->Observe(static_cast<size_t>(i), layout.store_name);
      }
    }
    for (int i : monitor->TakeRestarted()) {
      if (committed) {
        SW_ASSIGN_OR_RETURN(const int64_t step, cluster.client(i).RestoreShard(*committed));
        progress.Line(absl::StrCat(ps_options[i].task_name, " was restarted: it reloaded its shards from the "
                                   "checkpoint of step ", step, "; training goes on"));
      } else {
        SW_RETURN_IF_ERROR(cluster.client(i).Open());
        progress.Line(absl::StrCat(ps_options[i].task_name, " was restarted before the first checkpoint: its "
                                   "shards start again from their initial values; training goes on"));
      }
    }
    return absl::OkStatus();
  };
  ext.write_checkpoint = [&](const CheckpointState& state,
                             const CheckpointWriteOptions& wo) -> absl::StatusOr<std::string> {
    // A ps task restarted since the monitor's last round saves nothing.
    SW_RETURN_IF_ERROR(reopen_restarted(/*probe=*/true));
    SW_ASSIGN_OR_RETURN(const std::vector<std::string> paths, cluster.SaveShards(state.step));
    nlohmann::json params = nlohmann::json::object();
    params["kind"] = "cluster";
    params["shards"] = shards;
    nlohmann::json list = nlohmann::json::array();
    for (int i = 0; i < num_ps; ++i) list.push_back({{"task", ps_options[i].task_name}, {"path", paths[i]}});
    params["ps"] = list;
    params["model_version"] = ext.version();
    SW_ASSIGN_OR_RETURN(std::string path, WriteStateCheckpoint(config.checkpoint.dir, state, params, wo));
    committed = state.step;
    return path;
  };
  ext.restore_params = [&](const CheckpointInfo& checkpoint) -> absl::Status {
    SW_RETURN_IF_ERROR(CheckClusterCheckpoint(checkpoint, num_ps, shards));
    SW_RETURN_IF_ERROR(cluster.RestoreShards(checkpoint.step).status());
    committed = checkpoint.step;
    return absl::OkStatus();
  };
  ext.version = [&]() -> uint64_t { return cluster.version(); };
  ext.check = [&]() -> absl::Status {
    for (int i = 0; i < num_ps; ++i) {
      if (const double silent = monitor->Silent(i); silent > deadline_s) {
        return absl::UnavailableError(absl::StrFormat(
            "%s (%s) is unavailable: no answer for %.1f s (cluster.deadline_s %g); the job stops here. Restart %s "
            "and run `shardwild train` again to resume from %s",
            ps_options[i].task_name, ps_options[i].address, silent, deadline_s, ps_options[i].task_name,
            committed ? absl::StrCat("the checkpoint of step ", *committed) : std::string("the start")));
      }
    }
    return reopen_restarted(/*probe=*/false);
  };
  options.external = &ext;
  SW_ASSIGN_OR_RETURN(TrainSummary summary, RunTraining(job, progress, options));
  TellPsTasksJobDone(cluster, "chief:0", [&progress](const std::string& line) { progress.Line(line); });
  return summary;
}

}  // namespace shardwild
