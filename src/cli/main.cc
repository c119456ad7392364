// The `shardwild` command line.
//
//   shardwild train CONFIG [--set key=value]... [--fresh] [--json]
//   shardwild eval CONFIG (--checkpoint PATH | --watch DIR [--idle-timeout S]) [--set key=value]... [--json]
//   shardwild predict CONFIG --checkpoint PATH --input IMAGES --out FILE [--set key=value]...
//   shardwild bench CONFIG [--set key=value]... [--json]
//   shardwild bench store [--dim N] [--rows N] [--ids uniform|zipf] [--optimizer O] [--update U]
//                         [--threads N] [--kind static|dynamic] [--dtype f32|bf16] [--shards N] [--batch N] [--seconds S] [--json]
//   shardwild bench sweep CONFIG --grid KEY=V1,V2,... [--grid ...] [--repeats N] [--set key=value]... --out DIR
//   shardwild bench compare A_DIR B_DIR [--out DIR] [--json] [--fail-on-slower]
//   shardwild bench report DIR
//   shardwild topology [--synthetic DESC | --xml FILE] [--workers N] [--shards N] [--threads N] [--json]
//   shardwild data gen --kind criteo|libsvm|text --rows N --out FILE [--seed S] [--classes K] [--json]
//   shardwild cluster-info CONFIG [--cluster FILE] [--task-type T] [--task-index N] [--set key=value]... [--json]
//   shardwild serve CONFIG [--cluster FILE] [--task-type T] [--task-index N] [--set key=value]...
//
// `train` with a cluster spec (TF_CONFIG, --cluster FILE, the task flags,
// or the variables of srun and mpirun: net/launch_env.h) runs the chief of
// a cluster, or with train.strategy allreduce a rank (net/allreduce_task.h);
// started by srun or mpirun it runs whichever role the rank is. `serve`
// runs a ps, worker or evaluator task (README, "Clusters").
//   shardwild --version
//
// Every error is one line on stderr ("shardwild: error: ...") and a non-zero
// exit status.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/base/cpu_features.h"
#include "core/model/hogwild_kernels.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"
#include "core/config/config.h"
#include "core/data/column_cache.h"
#include "core/data/data_gen.h"
#include "core/io/atomic_file.h"
#include "core/base/mutex.h"
#include "core/base/sanitizers.h"
#include "net/chief_task.h"
#include "net/allreduce_task.h"
#include "net/cluster_setup.h"
#include "net/cluster_spec.h"
#include "net/grpc_util.h"
#include "net/ps_task.h"
#include "net/worker_task.h"
#include "ps_shm/shm_segment.h"
#include "workers/bench.h"
#include "workers/bench_sweep.h"
#include "workers/evaluator.h"
#include "workers/store_bench.h"
#include "workers/summary_json.h"
#include "workers/job.h"
#include "workers/live_metrics.h"
#include "workers/task_trainer.h"
#include "workers/trainer.h"

#include "shardwild_commit.h"  // generated: SHARDWILD_COMMIT

#ifndef SHARDWILD_VERSION
#define SHARDWILD_VERSION "unknown"
#endif

namespace shardwild {
namespace {

using nlohmann::json;

// Removes this process's shared memory on the way out of a fatal signal, then
// dies of that signal as usual.
void OnFatalSignal(int sig) {
  ShmSegment::UnlinkAllOwnedSegmentsFromSignal();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void InstallSignalHandlers() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) std::signal(sig, OnFatalSignal);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "shardwild: error: %s\n", std::string(s.message()).c_str());
  return 1;
}

absl::StatusOr<Config> LoadWithOverrides(const std::string& path, const std::vector<std::string>& sets) {
  std::vector<ConfigOverride> overrides;
  for (const std::string& s : sets) {
    absl::StatusOr<ConfigOverride> o = ParseOverride(s);
    if (!o.ok()) return o.status();
    overrides.push_back(*o);
  }
  return LoadConfig(path, overrides);
}

// The end of `train`: the result line and, with --json, the summary.
void PrintTrainSummary(const TrainSummary& s, Job& job, bool as_json, const json* extra_json = nullptr) {
  std::string extra;  // ", auc 0.7712, ..." for the metrics the head adds
  for (const auto& [name, value] : s.test_metrics) absl::StrAppendFormat(&extra, ", %s %.4f", name.substr(5), value);
  if (s.already_complete && s.test_accuracy) {
    std::printf("already complete: the final model (step %ld) has test accuracy %.4f (test loss %.4f%s); "
                "nothing was trained\n",
                static_cast<long>(s.steps), *s.test_accuracy, *s.test_loss, extra.c_str());
  } else if (s.already_complete) {
    std::printf("already complete: the final checkpoint (step %ld) is the newest; nothing was trained "
                "(--fresh starts over)\n", static_cast<long>(s.steps));
  } else if (s.test_accuracy) {
    std::printf("test accuracy: %.4f (test loss %.4f%s) after %d epochs, %.0f samples/s, %.1f s\n", *s.test_accuracy,
                *s.test_loss, extra.c_str(), s.epochs, s.samples_per_s, s.wall_s);
  } else {
    std::printf("done: %d epochs, train loss %.4f, %.0f samples/s, %.1f s\n", s.epochs, s.train_loss,
                s.samples_per_s, s.wall_s);
  }
  if (as_json) {
    json j = TrainSummaryJson(s, job);
    if (extra_json != nullptr) j.update(*extra_json);
    std::printf("%s\n", j.dump().c_str());
  }
}

// The cluster sources of a command, completed with what the config says
// about launchers (train.strategy, cluster.launcher and the keys it uses).
ClusterSpecSources WithConfig(ClusterSpecSources sources, const Config& config) {
  sources.strategy = config.train.strategy;
  sources.options = config.cluster;
  return sources;
}

// The live metrics of `train` (metrics.port; workers/live_metrics.h), the
// chief's: listening before the data loads, so that a port in use is an
// error before any training. Prints where; nullptr when metrics are off.
absl::StatusOr<std::unique_ptr<MetricsServer>> ServeChiefMetrics(const Config& config, const LiveMetrics& live) {
  SW_ASSIGN_OR_RETURN(std::unique_ptr<MetricsServer> server,
                      ServeLiveMetrics(config.metrics, MetricsProcess::Chief(), live));
  if (server) std::printf("live metrics: http://%s/metrics\n", server->address().c_str());
  return server;
}

// `train` on a cluster: this process is its chief (net/chief_task.h).
int TrainChief(const Config& config, const ClusterSpec& spec_in, bool as_json, bool fresh) {
  const ClusterSpec* const spec = &spec_in;
  if (!spec->task) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(spec->source, ": task: no task given; `shardwild train` on a cluster runs task chief:0")));
  }
  std::printf("shardwild %s: chief of a cluster of %d ps and %d worker task(s) (%s), training %s\n",
              SHARDWILD_VERSION, spec->num_tasks(Role::kPs), spec->num_tasks(Role::kWorker), spec->source.c_str(),
              config.source.c_str());
  std::fflush(stdout);
  LiveMetrics live(MetricsRole::kChief);
  absl::StatusOr<std::unique_ptr<MetricsServer>> metrics_server = ServeChiefMetrics(config, live);
  if (!metrics_server.ok()) return Fail(metrics_server.status());
  ProgressReporter progress = ProgressReporter::ForStream(stdout);
  TrainRunOptions run;
  run.fresh = fresh;
  run.live_metrics = &live;
  JobOptions jo;
  jo.workers = false;  // the chief holds the data; its workers are the worker tasks
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(config, jo);
  if (!job.ok()) return Fail(job.status());
  absl::StatusOr<TrainSummary> s = RunChief(**job, *spec, progress, run);
  if (!s.ok()) return Fail(s.status());
  PrintTrainSummary(*s, **job, as_json);
  return 0;
}

int ServeTask(const std::string& path, const std::vector<std::string>& sets, const Config& config,
              const ClusterSpec& spec);

// `train` as a rank of a train.strategy allreduce job (net/allreduce_task.h).
int TrainAllreduce(const Config& config, const ClusterSpec& spec, bool as_json, bool fresh) {
  LiveMetrics live(MetricsRole::kChief);
  std::unique_ptr<MetricsServer> metrics_server;
  std::optional<int> rank;
  if (spec.task) rank = AllreduceRankOf(spec, *spec.task);
  if (rank == 0) {  // one rank serves the live metrics (the others would want the same port)
    absl::StatusOr<std::unique_ptr<MetricsServer>> m = ServeChiefMetrics(config, live);
    if (!m.ok()) return Fail(m.status());
    metrics_server = *std::move(m);
  }
  // Embedding tables live on the ps tasks, if the cluster has some: every
  // push waits for them (a round's rows must land before the next round).
  std::unique_ptr<ClusterStoreConnection> tables;
  JobOptions jo;
  if (spec.num_tasks(Role::kPs) > 0 && spec.task) {
    jo.tables = [&]() -> absl::StatusOr<ParamStore*> {
      const TaskLog log = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
      const auto since = std::chrono::steady_clock::now();
      absl::StatusOr<std::unique_ptr<ClusterStoreConnection>> c =
          ConnectClusterStore(config, spec, *spec.task, log, /*async_pushes=*/0);
      // The ps tasks may still be starting.
      while (!c.ok() && c.status().code() == absl::StatusCode::kUnavailable &&
             SecondsSince(since) < config.train.task_timeout_s) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        c = ConnectClusterStore(config, spec, *spec.task, log, 0);
      }
      if (!c.ok()) return c.status();
      tables = *std::move(c);
      return tables->store.get();
    };
  }
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(config, jo);
  if (!job.ok()) return Fail(job.status());
  const Placement& p = (*job)->placement();
  std::printf("shardwild %s: training %s with train.strategy allreduce, %d workers x %d threads on this rank\n",
              SHARDWILD_VERSION, config.source.c_str(), p.num_workers, p.threads_per_worker);
  std::fflush(stdout);
  ProgressReporter progress = ProgressReporter::ForStream(stdout);
  TrainRunOptions run;
  run.fresh = fresh;
  if (rank == 0) run.live_metrics = &live;
  AllreduceStats stats;
  absl::StatusOr<TrainSummary> s =
      RunAllreduceRank(**job, spec, progress, run, &stats, tables ? tables->store.get() : nullptr);
  if (!s.ok()) return Fail(s.status());
  const double bytes_per_s = stats.collective_s > 0 ? stats.payload_bytes / stats.collective_s : 0;
  std::printf("allreduce: rank %d of %d trained %ld of the job's %ld records; %lu collectives summed %.1f MiB in "
              "%.2f s (%.1f MB/s); parameters identical on every rank (fingerprint %016lx)\n",
              stats.rank, stats.world, static_cast<long>(stats.local_records), static_cast<long>(s->records_seen),
              static_cast<unsigned long>(stats.collectives), stats.payload_bytes / 1048576.0, stats.collective_s,
              bytes_per_s / 1e6, static_cast<unsigned long>(stats.params_fingerprint));
  const json extra = {{"membership_changes", stats.membership_changes},
                      {"allreduce",
                       {{"rank", stats.rank},
                        {"generation", stats.generation},
                        {"world", stats.world},
                        {"source", spec.source},
                        {"rendezvous", spec.rendezvous ? spec.rendezvous->ToString() : std::string()},
                        {"local_records", stats.local_records},
                        {"collectives", stats.collectives},
                        {"buckets_per_round", stats.buckets},
                        {"buckets_during_backward", stats.buckets_during_backward},
                        {"ps_tasks", stats.ps_tasks},
                        {"payload_bytes", stats.payload_bytes},
                        {"collective_s", stats.collective_s},
                        {"payload_bytes_per_s", bytes_per_s},
                        {"params_fingerprint", absl::StrFormat("%016x", stats.params_fingerprint)}}}};
  PrintTrainSummary(*s, **job, as_json, &extra);
  return 0;
}

// `train` as a task of a cluster. With train.strategy allreduce every rank
// trains (net/allreduce_task.h), and a ps task, which hosts the embedding
// tables, serves. Started by srun or mpirun, every rank runs the same
// command: the ranks that train train and the other roles serve (as `serve`
// would). With a spec that names the task (--cluster, TF_CONFIG, the task
// flags) `train` runs the training roles only (the chief under ps, the
// ranks under allreduce), and a ps task is an error before any data loads.
int TrainInCluster(const std::string& path, const std::vector<std::string>& sets, const Config& config,
                   const ClusterSpecSources& sources, bool as_json, bool fresh) {
  absl::StatusOr<ClusterSpec> spec = ResolveClusterSpec(sources);
  if (!spec.ok()) return Fail(spec.status());
  const bool launched = spec->source == "Slurm" || spec->source == "Open MPI";
  if (config.train.strategy == TrainStrategy::kAllreduce) {
    if (spec->task && spec->task->type == Role::kPs) {
      if (launched) return ServeTask(path, sets, config, *spec);
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          spec->source, ": task.type: ", spec->task->ToString(), " hosts embedding tables under train.strategy "
          "allreduce and does not train: run `shardwild serve` for ps tasks")));
    }
    return TrainAllreduce(config, *spec, as_json, fresh);
  }
  if (launched && spec->task && spec->task->type != Role::kChief) return ServeTask(path, sets, config, *spec);
  return TrainChief(config, *spec, as_json, fresh);
}

int Train(const std::string& path, const std::vector<std::string>& sets, bool as_json, bool fresh,
          const std::vector<std::string>& worker_args, const ClusterSpecSources& cluster) {
  absl::StatusOr<Config> config = LoadWithOverrides(path, sets);
  if (!config.ok()) return Fail(config.status());
  const ClusterSpecSources sources = WithConfig(cluster, *config);
  absl::StatusOr<bool> in_cluster = HasClusterSource(sources);
  if (!in_cluster.ok()) return Fail(in_cluster.status());
  if (*in_cluster) return TrainInCluster(path, sets, *config, sources, as_json, fresh);
  LiveMetrics live(MetricsRole::kChief);
  absl::StatusOr<std::unique_ptr<MetricsServer>> metrics_server = ServeChiefMetrics(*config, live);
  if (!metrics_server.ok()) return Fail(metrics_server.status());
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(*config);
  if (!job.ok()) return Fail(job.status());
  const Placement& p = (*job)->placement();
  std::printf("shardwild %s: training %s on %d workers x %d threads, %d shards (store %s, %.1f MiB%s)\n",
              SHARDWILD_VERSION, path.c_str(), p.num_workers, p.threads_per_worker, p.num_shards,
              (*job)->store().name().c_str(), (*job)->replicas().total_bytes() / 1048576.0,
              (*job)->store().private_memory() ? " of private memory" : "");
  const ReplicationPlan& rp = (*job)->replicas().plan();
  std::printf("replication: %s (%s)", ReplicationPolicyName(rp.policy), rp.reason.c_str());
  if ((*job)->replicas().num_replicas() > 1) {
    std::printf(", %d replicas averaged every %ld steps", (*job)->replicas().num_replicas(),
                static_cast<long>(rp.sync_every));
  }
  std::printf("\n");
  std::fflush(stdout);
  ProgressReporter progress = ProgressReporter::ForStream(stdout);
  TrainRunOptions run;
  run.fresh = fresh;
  run.live_metrics = &live;
  run.worker_command = {"/proc/self/exe", "worker", path};  // train.worker_processes
  for (const std::string& set : sets) run.worker_command.insert(run.worker_command.end(), {"--set", set});
  run.worker_command.insert(run.worker_command.end(), worker_args.begin(), worker_args.end());
  absl::StatusOr<TrainSummary> s = RunTraining(**job, progress, run);
  if (!s.ok()) return Fail(s.status());
  PrintTrainSummary(*s, **job, as_json);
  return 0;
}

// Builds the job of `path` for evaluation or prediction (no training).
absl::StatusOr<std::unique_ptr<Job>> EvalJob(const std::string& path, const std::vector<std::string>& sets) {
  SW_ASSIGN_OR_RETURN(Config config, LoadWithOverrides(path, sets));
  return Job::Create(config);
}

int Eval(const std::string& path, const std::vector<std::string>& sets, const std::string& checkpoint,
         const std::string& watch, double idle_timeout, bool as_json) {
  if (checkpoint.empty() == watch.empty()) {
    return Fail(absl::InvalidArgumentError("eval: give exactly one of --checkpoint PATH and --watch DIR"));
  }
  absl::StatusOr<std::unique_ptr<Job>> job = EvalJob(path, sets);
  if (!job.ok()) return Fail(job.status());
  const Dataset* data = (*job)->test();
  if (data == nullptr) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(path, ": data.test is empty: nothing to evaluate")));
  }
  auto print = [&](const CheckpointEvaluation& e) {
    std::string extra;
    for (const auto& [name, value] : ExtraTestMetrics(e.result)) absl::StrAppendFormat(&extra, " %s %.4f", name.substr(5), value);
    std::printf("%s (step %ld%s): test loss %.4f acc %.4f%s over %ld records\n", e.path.c_str(),
                static_cast<long>(e.step), e.final ? ", final" : "", e.loss(), e.accuracy(), extra.c_str(),
                static_cast<long>(e.result.count));
    if (as_json) std::printf("%s\n", EvaluationJson(e, *data).dump().c_str());
    std::fflush(stdout);
  };
  if (!checkpoint.empty()) {
    std::vector<std::string> skipped;
    absl::StatusOr<CheckpointInfo> info = ResolveCheckpoint(checkpoint, &skipped);
    for (const std::string& s : skipped) spdlog::warn("skipped checkpoint {}", s);
    if (!info.ok()) return Fail(info.status());
    absl::StatusOr<CheckpointEvaluation> e = EvaluateCheckpoint(**job, *info, *data);
    if (!e.ok()) return Fail(e.status());
    print(*e);
    return 0;
  }
  WatchOptions wo;
  wo.dir = watch;
  wo.idle_timeout_s = idle_timeout;
  std::printf("shardwild %s: watching %s for checkpoints\n", SHARDWILD_VERSION, watch.c_str());
  std::fflush(stdout);
  absl::StatusOr<WatchSummary> w = WatchCheckpoints(
      **job, *data, wo, print, [](const std::string& name, const std::string& why) {
        std::printf("skipped %s: %s\n", name.c_str(), why.c_str());
        std::fflush(stdout);
      });
  if (!w.ok()) return Fail(w.status());
  std::printf("evaluated %zu checkpoint(s), skipped %zu; %s\n", w->evaluated.size(), w->skipped.size(),
              w->saw_final ? "the final one is done" : "no new checkpoint within the idle timeout");
  if (as_json) {
    json evaluated = json::array(), skipped = json::array();
    for (const CheckpointEvaluation& e : w->evaluated) evaluated.push_back(EvaluationJson(e, *data));
    for (const auto& [name, why] : w->skipped) skipped.push_back({{"checkpoint", name}, {"reason", why}});
    std::printf("%s\n", json{{"evaluated", evaluated},
                             {"skipped", skipped},
                             {"saw_final", w->saw_final},
                             {"idle_timed_out", w->idle_timed_out}}
                             .dump()
                             .c_str());
  }
  return 0;
}

int Predict(const std::string& path, const std::vector<std::string>& sets, const std::string& checkpoint,
            const std::string& input, const std::string& out) {
  absl::StatusOr<std::unique_ptr<Job>> job = EvalJob(path, sets);
  if (!job.ok()) return Fail(job.status());
  std::vector<std::string> skipped;
  absl::StatusOr<CheckpointInfo> info = ResolveCheckpoint(checkpoint, &skipped);
  for (const std::string& s : skipped) spdlog::warn("skipped checkpoint {}", s);
  if (!info.ok()) return Fail(info.status());
  if (absl::Status s = RestoreJob(**job, *info); !s.ok()) return Fail(s);
  // IDX images, or a file in the config's data format (its labels, if any, are not used).
  const Config& config = (*job)->config();
  absl::StatusOr<Dataset> data = config.data.format == DataFormat::kIdx
                                     ? LoadImagesForPrediction(input, (*job)->train().dense_dim)
                                     : LoadDataset(config, input, 0, &(*job)->train());
  if (!data.ok()) return Fail(data.status());
  absl::StatusOr<std::vector<float>> probs = PredictAll(**job, *data);
  if (!probs.ok()) return Fail(probs.status());
  // Written under a temporary name and renamed, so `out` is never half written.
  absl::StatusOr<std::unique_ptr<AtomicFile>> file = AtomicFile::Open(out);
  if (!file.ok()) return Fail(file.status());
  const HeadType head = config.model.head;
  const int64_t k = (*job)->worker(0).model().outputs();
  const std::vector<std::string>& names = (*job)->train().class_names;
  std::string line;
  switch (head) {
    case HeadType::kSoftmax:
      line = "index,prediction";
      for (int64_t c = 0; c < k; ++c) absl::StrAppend(&line, ",p", c);
      break;
    case HeadType::kBinary: line = "index,prediction,p1"; break;
    case HeadType::kRegression: line = "index,prediction"; break;
  }
  line += "\n";
  absl::Status written = (*file)->Append(line);
  for (int64_t i = 0; i < data->count && written.ok(); ++i) {
    const float* p = probs->data() + i * k;
    line.clear();
    switch (head) {
      case HeadType::kSoftmax: {
        const int64_t best = std::max_element(p, p + k) - p;
        if (static_cast<size_t>(best) < names.size()) {
          absl::StrAppend(&line, i, ",", names[best]);
        } else {
          absl::StrAppend(&line, i, ",", best);
        }
        for (int64_t c = 0; c < k; ++c) absl::StrAppendFormat(&line, ",%.6g", p[c]);
        break;
      }
      case HeadType::kBinary: absl::StrAppendFormat(&line, "%d,%d,%.6g", i, p[0] > 0.5f ? 1 : 0, p[0]); break;
      case HeadType::kRegression: absl::StrAppendFormat(&line, "%d,%.6g", i, p[0]); break;
    }
    line += "\n";
    written = (*file)->Append(line);
  }
  if (written.ok()) written = (*file)->Commit();
  if (!written.ok()) return Fail(written);
  std::printf("%s: %ld predictions from %s (step %ld) written to %s\n", input.c_str(), static_cast<long>(data->count),
              info->path.c_str(), static_cast<long>(info->step), out.c_str());
  return 0;
}

// The CPU's marketing name from /proc/cpuinfo ("model name"); empty if unknown.
std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string() : line.substr(start);
  }
  return "";
}

// The machine a bench ran on, for comparing figures across runs and hosts:
// `bench --json`'s "machine" (and each row of a sweep's results).
json MachineJson(const Topology& t) {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return {{"cpu_model", CpuModelName()},
          {"cores", t.num_cores()},
          {"pus", t.num_pus()},
          {"numa_nodes", t.num_nodes()},
          {"packages", t.num_packages()},
          {"isa", DetectCpuFeatures().Names()},
          {"kernel_target", ActiveHogwildKernelTarget()},
          {"onednn_isa", OneDnnCpuIsaName()},
          {"commit", SHARDWILD_COMMIT},
          {"version", SHARDWILD_VERSION},
          {"hostname", host}};
}

// `bench` as a rank of a train.strategy allreduce job: the collective of
// the model's dense gradient against the same run's loopback TCP bandwidth.
int BenchAllreduce(const Config& config, const ClusterSpec& spec, bool as_json) {
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(config);
  if (!job.ok()) return Fail(job.status());
  int64_t floats = 0;
  for (const VariableSpec& v : (*job)->param_store().layout().variables) floats += v.size();
  floats += 2;  // a round also sums the contribution count and learning rates
  const int64_t iterations = std::max<int64_t>(config.bench.steps, 1);
  ProgressReporter progress = ProgressReporter::ForStream(stdout);
  absl::StatusOr<AllreduceBench> b = RunAllreduceBench(config, spec, floats, iterations, progress);
  if (!b.ok()) return Fail(b.status());
  const double ratio = b->tcp_loopback_bytes_per_s > 0 ? b->bus_bytes_per_s / b->tcp_loopback_bytes_per_s : 0;
  std::printf("allreduce bench: rank %d of %d, %ld floats (%.2f MiB) x %ld calls in %.3f s: %.3f ms per call, "
              "algorithm %.1f MB/s, bus %.1f MB/s = %.3f of the same-run loopback TCP %.1f MB/s\n",
              b->rank, b->world, static_cast<long>(b->floats), b->floats * 4.0 / 1048576.0,
              static_cast<long>(b->iterations), b->seconds, 1e3 * b->seconds / b->iterations,
              b->algorithm_bytes_per_s / 1e6, b->bus_bytes_per_s / 1e6, ratio, b->tcp_loopback_bytes_per_s / 1e6);
  if (as_json) {
    const json j = {{"strategy", "allreduce"},
                    {"rank", b->rank},
                    {"world", b->world},
                    {"source", spec.source},
                    {"floats", b->floats},
                    {"payload_bytes", b->floats * 4},
                    {"iterations", b->iterations},
                    {"seconds", b->seconds},
                    {"ms_per_call", 1e3 * b->seconds / b->iterations},
                    {"algorithm_bytes_per_s", b->algorithm_bytes_per_s},
                    {"bus_bytes_per_s", b->bus_bytes_per_s},
                    {"tcp_loopback_bytes_per_s", b->tcp_loopback_bytes_per_s},
                    {"bus_fraction_of_tcp", ratio}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

int Bench(const std::string& path, const std::vector<std::string>& sets, bool as_json,
          const ClusterSpecSources& cluster) {
  absl::StatusOr<Config> config = LoadWithOverrides(path, sets);
  if (!config.ok()) return Fail(config.status());
  // On a cluster, a worker task's machine times its steps against the
  // cluster's store (the ps tasks of its host through shared memory, the
  // others through gRPC), with the bytes on the wire.
  std::unique_ptr<ClusterStoreConnection> connection;
  std::string where;
  if (absl::Status s = CheckBenchConfig(*config); !s.ok()) return Fail(s);
  JobOptions jo;
  const ClusterSpecSources sources = WithConfig(cluster, *config);
  absl::StatusOr<bool> in_cluster = HasClusterSource(sources);
  if (!in_cluster.ok()) return Fail(in_cluster.status());
  if (*in_cluster) {
    absl::StatusOr<ClusterSpec> spec = ResolveClusterSpec(sources);
    if (!spec.ok()) return Fail(spec.status());
    if (config->train.strategy == TrainStrategy::kAllreduce) return BenchAllreduce(*config, *spec, as_json);
    if (!spec->task || spec->task->type != Role::kWorker) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          spec->source, ": task.type: `shardwild bench` on a cluster runs as a worker task (its machine's steps "
                        "against the cluster's ps tasks)")));
    }
    absl::StatusOr<std::unique_ptr<ClusterStoreConnection>> c = ConnectClusterStore(
        *config, *spec, *spec->task, [](const std::string& line) { std::printf("%s\n", line.c_str()); });
    if (!c.ok()) return Fail(c.status());
    connection = *std::move(c);
    jo.store = connection->store.get();
    int local = 0;
    for (int p = 0; p < connection->store->num_ps(); ++p) local += connection->store->is_local(p) ? 1 : 0;
    where = absl::StrFormat(" as %s of a cluster (%d of %d ps tasks through shared memory, %s, compression %s)",
                            spec->task->ToString(), local, connection->store->num_ps(), spec->source,
                            GradientCompressionName(config->cluster.compression));
  }
  absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(*config, jo);
  if (!job.ok()) return Fail(job.status());
  std::function<uint64_t()> wire;
  if (connection) {
    wire = [store = connection->store.get()] {
      const PsClient::Stats st = store->stats();
      return st.bytes_sent + st.bytes_received;
    };
  }
  absl::StatusOr<BenchReport> r = RunBench(**job, wire);
  if (!r.ok()) return Fail(r.status());
  if (connection) {  // the last pushes (a worker thread may leave one in flight)
    if (absl::Status s = connection->store->Flush(); !s.ok()) return Fail(s);
  }
  std::printf("shardwild bench %s%s\n%s", path.c_str(), where.c_str(), FormatBenchReport(*r).c_str());
  if (as_json) {
    const double total = r->phases.total();
    auto frac = [&](double x) { return total > 0 ? x / total : 0.0; };
    json j = {{"workers", r->workers},
              {"intra_op_threads", r->intra_op_threads},
              {"batch", r->batch},
              {"warmup_steps", r->warmup_steps},
              {"steps", r->steps},
              {"steps_done", r->steps_done},
              {"wall_s", r->wall_s},
              {"samples_per_s", r->samples_per_s},
              {"step_ms", r->step_ms},
              {"phases", {{"data", frac(r->phases.data)},
                          {"read_params", frac(r->phases.read_params)},
                          {"pull_rows", frac(r->phases.pull_rows)},
                          {"forward", frac(r->phases.forward)},
                          {"backward", frac(r->phases.backward)},
                          {"push", frac(r->phases.push)},
                          {"push_rows", frac(r->phases.push_rows)}}},
              {"in_place_pooling", frac(r->phases.rows_in_forward)},
              {"data_load_s", r->data_load_s},
              {"embedding_rows_per_s", r->rows_per_s},
              {"embedding_bytes_per_s", r->embedding_bytes_per_s},
              {"embedding_bound_rows_per_s", r->bound_rows_per_s},
              {"embedding_rows_ratio", r->rows_ratio},
              {"embedding_phase_rows_per_s", r->phase_rows_per_s},
              {"embedding_phase_rows_ratio", r->phase_rows_ratio},
              {"embedding_phase_rows_ratio_range", {r->phase_rows_ratio_min, r->phase_rows_ratio_max}},
              {"embedding_bound_rows_per_s_range", {r->bound_rows_per_s_min, r->bound_rows_per_s_max}},
              {"embedding_bound_slices", r->bound_slices},
              {"embedding_bound_memory", r->bound_memory},
              {"tokens_per_s_per_worker", r->tokens_per_s_per_worker},
              {"update", r->update_mode},
              {"pulls", r->pulls},
              {"flops_per_step", r->flops_per_step},
              {"model_gflops", r->model_gflops},
              {"peak_gflops", r->peak.gflops},
              {"peak_shape", {r->peak.m, r->peak.n, r->peak.k}},
              {"peak_fraction", r->peak_fraction},
              {"precision", r->precision},
              {"layer_impls", r->layer_impls},
              {"bf16_peak_gflops", r->bf16_peak.gflops > 0 ? json(r->bf16_peak.gflops) : json(nullptr)},
              {"bf16_peak_shape", r->bf16_peak.gflops > 0 ? json({r->bf16_peak.m, r->bf16_peak.n, r->bf16_peak.k})
                                                          : json(nullptr)},
              {"kernel_target", r->kernel_target},
              {"kernel_targets", r->kernel_targets}};
    if (r->push_bound_us > 0) {
      j["dense_push"] = {{"params", r->dense_params},
                         {"us_per_step", r->push_us},
                         {"bound_us", r->push_bound_us},
                         {"ratio", r->push_ratio}};
    }
    j["line_handoff_ns"] = r->line_handoff_ns > 0 ? json(r->line_handoff_ns) : json(nullptr);
    {
      json sizes = json::array();
      for (const BurstTiming& t : r->prefetch_burst.sizes) {
        sizes.push_back({{"lines", t.lines},
                         {"cold_ns", t.cold_ns},
                         {"asked_ns", t.asked_ns},
                         {"cached_ns", t.cached_ns},
                         {"lost", t.LostShare()}});
      }
      j["prefetch_burst"] = {{"lines", r->prefetch_burst_lines},
                             {"source", r->prefetch_burst_configured ? "data.prefetch_burst_lines"
                                        : r->prefetch_burst.measured ? "measured"
                                                                     : "default"},
                             {"sizes", sizes},
                             {"probe_s", r->prefetch_burst.seconds}};
    }
    if (r->wire_bytes_per_step >= 0) {
      j["wire_bytes_per_step"] = r->wire_bytes_per_step;
      j["compression"] = GradientCompressionName(config->cluster.compression);
      j["store_fraction"] =
          frac(r->phases.read_params + r->phases.pull_rows + r->phases.push + r->phases.push_rows);
    }
    if ((*job)->has_local_store()) {
      j["store"] = {{"memory", StoreMemoryJson((*job)->replicas())},
                    {"setup_s", (*job)->store_setup_seconds()},
                    {"memory_kind", StoreMemoryKindName((*job)->store().memory_kind())}};
    }
    j["data"] = {{"packed", PackedDataJson(**job)}};
    j["machine"] = MachineJson((*job)->topology());
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

// tools/bench_report.py: beside an installed binary (bin/../share/shardwild/),
// else in the source tree the binary was built from.
std::string ReportScript() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path installed = exe.parent_path().parent_path() / "share" / "shardwild" / "bench_report.py";
    if (std::filesystem::exists(installed, ec)) return installed.string();
  }
  return SHARDWILD_REPORT_SCRIPT;
}

// The Python that runs it: the system's (/usr/bin/python3, where Debian's
// python3-matplotlib is), else the first python3 on PATH.
std::string ReportPython() {
  std::error_code ec;
  return std::filesystem::exists("/usr/bin/python3", ec) ? "/usr/bin/python3" : "python3";
}

// `bench sweep`: every point of the grid, --repeats times interleaved, each
// a `shardwild bench --json` child; then the report.
int BenchSweep(SweepOptions options) {
  for (const std::string& set : options.sets) {
    if (absl::StatusOr<ConfigOverride> o = ParseOverride(set); !o.ok()) return Fail(o.status());
  }
  absl::Status checked = CheckSweep(options, [&](const std::vector<std::string>& point_sets) {
    return LoadWithOverrides(options.config_path, point_sets).status();
  });
  if (!checked.ok()) return Fail(checked);
  const int points = static_cast<int>(ExpandGrid(options.grid).size());
  std::printf("shardwild bench sweep %s: %d points x %d repeats = %d runs (interleaved), into %s\n",
              options.config_path.c_str(), points, options.repeats, points * options.repeats,
              options.out_dir.c_str());
  std::fflush(stdout);
  absl::StatusOr<json> results =
      RunSweep(options, ChildProcessBenchRunner("/proc/self/exe"), [](const SweepProgress& p) {
        std::printf("sweep: %d/%d runs done (point %d: %s, repeat %d): %.0f samples/s; ETA %s\n", p.done, p.total,
                    p.point, p.label.c_str(), p.repeat, p.samples_per_s,
                    ProgressReporter::FormatDuration(p.eta_s).c_str());
        std::fflush(stdout);
      });
  if (!results.ok()) return Fail(results.status());
  const std::filesystem::path dir(options.out_dir);
  std::printf("sweep: wrote %s and %s\n", (dir / "results.csv").c_str(), (dir / "results.json").c_str());
  std::fflush(stdout);
  if (absl::Status s = RunReportScript(ReportPython(), ReportScript(), "sweep", options.out_dir); !s.ok()) return Fail(s);
  std::printf("sweep: wrote %s\n", (dir / "report.html").c_str());
  return 0;
}

// `bench report DIR`: draws DIR's report again from its results.json.
int RedrawReport(const std::string& dir) {
  if (absl::StatusOr<json> sweep = LoadSweep(dir); !sweep.ok()) return Fail(sweep.status());
  if (absl::Status s = RunReportScript(ReportPython(), ReportScript(), "sweep", dir); !s.ok()) return Fail(s);
  std::printf("wrote %s\n", (std::filesystem::path(dir) / "report.html").c_str());
  return 0;
}

// `bench compare A B [--out DIR]`: B's medians over A's per common point.
int BenchCompare(const std::string& a_dir, const std::string& b_dir, const std::string& out_dir, bool as_json,
                 bool fail_on_slower) {
  absl::StatusOr<json> a = LoadSweep(a_dir);
  if (!a.ok()) return Fail(a.status());
  absl::StatusOr<json> b = LoadSweep(b_dir);
  if (!b.ok()) return Fail(b.status());
  const json c = CompareSweeps(*a, *b, a_dir, b_dir);
  std::printf("shardwild bench compare\n%s", FormatComparison(c).c_str());
  if (c.at("rows").empty()) {
    return Fail(absl::FailedPreconditionError(
        absl::StrCat("bench compare: ", a_dir, " and ", b_dir, " have no point in common (no grid values agree)")));
  }
  if (!out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    if (ec) return Fail(absl::InternalError(absl::StrCat(out_dir, ": cannot create the directory: ", ec.message())));
    const std::string path = (std::filesystem::path(out_dir) / "compare.json").string();
    if (absl::Status s = WriteFileAtomically(path, c.dump(1) + "\n"); !s.ok()) return Fail(s);
    if (absl::Status s = RunReportScript(ReportPython(), ReportScript(), "compare", out_dir); !s.ok()) return Fail(s);
    std::printf("wrote %s and %s\n", path.c_str(), (std::filesystem::path(out_dir) / "compare.html").c_str());
  }
  if (as_json) std::printf("%s\n", c.dump().c_str());
  if (fail_on_slower) {
    // A gate for CI: B slower than A beyond the noise at any common point.
    std::vector<std::string> slower;
    for (const json& row : c.at("rows")) {
      if (row.at("verdict") != "slower") continue;
      std::vector<std::string> values;
      for (const auto& [k, v] : row.at("grid").items()) values.push_back(absl::StrCat(k, "=", v.get<std::string>()));
      slower.push_back(absl::StrFormat("%s (%.3f)", absl::StrJoin(values, " "), row.at("ratio").get<double>()));
    }
    if (!slower.empty()) {
      std::fprintf(stderr, "shardwild: error: bench compare: %s is slower than %s beyond the min-max ranges at %zu "
                           "point(s): %s\n",
                   b_dir.c_str(), a_dir.c_str(), slower.size(), absl::StrJoin(slower, ", ").c_str());
      return 3;
    }
  }
  return 0;
}

int BenchStore(const StoreBenchOptions& options, bool as_json) {
  absl::StatusOr<StoreBenchReport> r = RunStoreBench(options);
  if (!r.ok()) return Fail(r.status());
  std::printf("shardwild bench store\n%s", FormatStoreBenchReport(*r).c_str());
  if (as_json) {
    const StoreBenchOptions& o = r->options;
    json j = {{"rows_per_s", r->rows_per_s},
              {"bytes_per_s", r->bytes_per_s},
              {"bound_rows_per_s", r->bound_rows_per_s},
              {"ratio", r->ratio},
              {"dim", o.dim},
              {"rows", o.rows},
              {"ids", IdDistributionName(o.ids)},
              {"optimizer", OptimizerTypeName(o.optimizer)},
              {"update", UpdateModeName(o.update)},
              {"threads", o.threads},
              {"kind", EmbeddingKindName(o.kind)},
              {"dtype", o.bf16 ? "bf16" : "f32"},
              {"shards", o.shards},
              {"batch", o.batch},
              {"row_bytes", r->row_bytes},
              {"row_stride", r->row_stride},
              {"seconds", r->push_wall_s},
              {"bound_seconds", r->bound_wall_s},
              {"store_bytes", r->store_bytes},
              {"huge_pages", {{"requested", r->huge_pages_requested},
                              {"granted_bytes", r->huge_pages_granted_bytes ? json(*r->huge_pages_granted_bytes)
                                                                           : json(nullptr)}}}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

int ShowTopology(const std::string& synthetic, const std::string& xml, int workers, int shards, int threads,
                 bool as_json) {
  TopologyOptions opts{synthetic, xml};
  if (absl::Status s = opts.Validate(); !s.ok()) return Fail(s);
  absl::StatusOr<std::unique_ptr<Topology>> topo = MakeTopology(opts);
  if (!topo.ok()) return Fail(topo.status());
  const Topology& t = **topo;
  const int w = t.ResolveWorkers(workers);
  const int s = t.ResolveShards(shards);
  const Placement p = t.Plan(w, s, t.ResolveThreadsPerWorker(threads, w));
  if (as_json) {
    json nodes = json::array();
    for (const NumaNodeInfo& n : t.nodes()) nodes.push_back({{"index", n.index}, {"memory_bytes", n.memory_bytes}, {"cores", n.cores}});
    json pw = json::array();
    for (const WorkerPlacement& wp : p.workers) pw.push_back({{"node", wp.node}, {"cores", wp.cores}});
    json j = {{"source", t.source()},
              {"packages", t.num_packages()},
              {"numa_nodes", t.num_nodes()},
              {"cores", t.num_cores()},
              {"pus", t.num_pus()},
              {"nodes", nodes},
              {"cpu", {{"instruction_sets", DetectCpuFeatures().Names()}, {"onednn_isa", OneDnnCpuIsaName()}}},
              {"placement", {{"workers", pw}, {"threads_per_worker", p.threads_per_worker}, {"shard_nodes", p.shard_nodes},
                             {"oversubscribed", p.oversubscribed}}}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s%s%s", t.Describe().c_str(), DescribeCpu().c_str(), p.ToString().c_str());
  }
  return 0;
}

// `data cache`: builds (or checks) the columnar cache of data.train that
// data.stream trains from, then reads every record of it back once on one
// thread, and reports both rates: the build's per thread (parse,
// decompression included) and the read's.
int DataCacheCommand(const std::string& config_path, const std::vector<std::string>& sets, bool rebuild,
                     bool as_json) {
  absl::StatusOr<Config> config = LoadWithOverrides(config_path, sets);
  if (!config.ok()) return Fail(config.status());
  if (rebuild) {
    absl::StatusOr<std::vector<std::string>> files = ExpandDataFiles(config->data.train, "data.train");
    if (!files.ok()) return Fail(files.status());
    for (const std::string& f : *files) {
      const std::filesystem::path p(f);
      const std::filesystem::path dir = config->data.cache_dir.empty() ? p.parent_path()
                                                                       : std::filesystem::path(config->data.cache_dir);
      std::error_code ec;
      std::filesystem::remove_all(dir / (p.filename().string() + ".swcols"), ec);
    }
  }
  ColumnCacheStats st;
  absl::StatusOr<std::unique_ptr<ColumnCache>> cache = OpenTrainStream(*config, &st);
  if (!cache.ok()) return Fail(cache.status());
  const ColumnCache& c = **cache;
  // Every record once, in windows of 64k records, on this thread.
  const auto t0 = std::chrono::steady_clock::now();
  Dataset window;
  for (int64_t at = 0; at < c.records(); at += 65536) {
    if (absl::Status s = c.Read(at, std::min<int64_t>(65536, c.records() - at), &window); !s.ok()) return Fail(s);
  }
  const double read_s = SecondsSince(t0);
  const double mb = 1 << 20;
  const double build_thread_s = st.build_s * std::max(st.build_threads, 1);
  std::printf("%lld records in %d parts, %.1f MiB of columns; ", static_cast<long long>(c.records()), st.parts,
              st.bytes / mb);
  if (st.files_built > 0) {
    std::printf("built %d file(s) in %.2f s on %d thread(s): %.1f MiB/s of text per thread (%.1f MiB/s as stored); ",
                st.files_built, st.build_s, st.build_threads, st.text_bytes / mb / build_thread_s,
                st.source_bytes / mb / build_thread_s);
  } else {
    std::printf("the cache was valid; ");
  }
  std::printf("read back in %.2f s on one thread: %.1f MiB/s, %.0f records/s\n", read_s, st.bytes / mb / read_s,
              c.records() / read_s);
  if (as_json) {
    json j = {{"records", c.records()},
              {"parts", st.parts},
              {"cache_bytes", st.bytes},
              {"dirs", c.dirs()},
              {"files_built", st.files_built},
              {"files_cached", st.files_cached},
              {"build_s", st.build_s},
              {"build_threads", st.build_threads},
              {"text_bytes", st.text_bytes},
              {"source_bytes", st.source_bytes},
              {"build_text_mib_per_s_per_thread", st.files_built > 0 ? json(st.text_bytes / mb / build_thread_s) : json(nullptr)},
              {"read_s", read_s},
              {"read_mib_per_s", st.bytes / mb / read_s},
              {"read_records_per_s", c.records() / read_s}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

// `data gen`: writes a planted-model data set and reports its Bayes metric.
int GenerateDataCommand(const DataGenOptions& options, bool as_json) {
  absl::StatusOr<DataGenResult> r = GenerateData(options);
  if (!r.ok()) return Fail(r.status());
  std::string model = absl::StrFormat("%s %.4f", r->metric_name, r->bayes_metric);
  if (r->metric_name == "bayes_auc") {
    absl::StrAppendFormat(&model, ", positive rate %.3f", r->positive_rate);
  } else {
    absl::StrAppendFormat(&model, ", %d classes", r->num_classes);
  }
  const std::string where = r->files.size() == 1
                                ? r->files[0].path
                                : absl::StrCat(r->files.size(), " files, ", r->files.front().path, " .. ",
                                               r->files.back().path);
  std::printf("wrote %lld rows to %s (%s); planted model: %s\n", static_cast<long long>(r->rows), where.c_str(),
              options.kind.c_str(), model.c_str());
  if (as_json) {
    json files = json::array();
    for (const DataGenResult::File& f : r->files) files.push_back({{"path", f.path}, {"rows", f.rows}, {"bytes", f.bytes}});
    json j = {{"kind", options.kind},
              {"rows", r->rows},
              {"out", r->files.size() == 1 ? r->files[0].path : options.out},
              {"files", files},
              {"compress", options.compress},
              {"seed", options.seed},
              {"model_seed", options.model_seed},
              {"bytes", r->bytes},
              {"metric", r->metric_name},
              {r->metric_name, r->bayes_metric},
              {"positive_rate", r->metric_name == "bayes_auc" ? json(r->positive_rate) : json(nullptr)},
              {"num_classes", r->num_classes}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

// `cluster-info` with train.strategy allreduce: the ranks, this one, where
// they meet, and the ps tasks if any (they host the embedding tables, over
// the shard map of the ps strategy).
int AllreduceInfo(const Config& config, const ClusterSpec& spec, bool as_json) {
  const int world = AllreduceWorldSize(spec);
  std::optional<int> rank;
  if (spec.task) rank = AllreduceRankOf(spec, *spec.task);
  auto address_of = [&](int r) {
    const HostPort& hp = spec.address(AllreduceTaskOfRank(spec, r));
    return hp.host.empty() ? absl::StrCat("(host unknown):", hp.port) : hp.ToString();
  };
  const std::string rendezvous = spec.rendezvous ? spec.rendezvous->ToString() : std::string();
  const int num_ps = spec.num_tasks(Role::kPs);
  ShardMap map;
  if (num_ps > 0) {
    absl::StatusOr<int> shards = ClusterShards(config, spec);
    if (!shards.ok()) return Fail(shards.status());
    absl::StatusOr<ShardMap> m = ShardMap::Make(*shards, num_ps);
    if (!m.ok()) return Fail(m.status());
    map = *std::move(m);
  }
  auto first_last = [&](int p) { return std::pair(map.first_shard(p), map.first_shard(p) + map.num_shards_of(p) - 1); };
  if (as_json) {
    json ranks = json::array();
    for (int r = 0; r < world; ++r) {
      ranks.push_back({{"rank", r}, {"task", AllreduceTaskOfRank(spec, r).ToString()}, {"address", address_of(r)}});
    }
    json ps = json::array();
    for (int p = 0; p < num_ps; ++p) {
      std::vector<int> shard_list;
      for (int sh = first_last(p).first; sh <= first_last(p).second; ++sh) shard_list.push_back(sh);
      ps.push_back({{"task", TaskId{Role::kPs, p}.ToString()},
                    {"address", spec.address({Role::kPs, p}).ToString()},
                    {"hosts", "embedding tables"},
                    {"shards", shard_list}});
    }
    json j = {{"source", spec.source},
              {"strategy", "allreduce"},
              {"world", world},
              {"rank", rank ? json(*rank) : json(nullptr)},
              {"task", spec.task ? json(spec.task->ToString()) : json(nullptr)},
              {"rendezvous", rendezvous},
              {"ranks", ranks},
              {"ps_tasks", ps},
              {"collective_timeout_s", config.cluster.collective_timeout_s},
              {"allreduce_algorithm",
               CollectiveAlgorithmName(config.cluster.allreduce_algorithm)},
              {"allreduce_overlap", AllreduceOverlapName(config.cluster.allreduce_overlap)},
              {"security",
               {{"bind_host", config.cluster.bind_host},
                {"token", !config.cluster.token_file.empty()},
                {"tls", !config.cluster.tls_cert_file.empty()}}}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("cluster (from %s): train.strategy allreduce, %d rank%s meeting at %s\n", spec.source.c_str(), world,
              world == 1 ? "" : "s", rendezvous.c_str());
  for (int r = 0; r < world; ++r) {
    std::printf("  rank %-4d %-10s %s\n", r, AllreduceTaskOfRank(spec, r).ToString().c_str(), address_of(r).c_str());
  }
  if (num_ps > 0) {
    std::printf("ps tasks: %d, hosting the embedding tables over %d shard%s (the dense variables stay on the "
                "ranks)\n",
                num_ps, map.num_shards(), map.num_shards() == 1 ? "" : "s");
    for (int p = 0; p < num_ps; ++p) {
      const auto [first, last] = first_last(p);
      const std::string shards =
          first == last ? absl::StrCat("shard ", first) : absl::StrCat("shards ", first, "-", last);
      std::printf("  %-9s %-10s %s  %s\n", "ps task", TaskId{Role::kPs, p}.ToString().c_str(),
                  spec.address({Role::kPs, p}).ToString().c_str(), shards.c_str());
    }
  }
  if (spec.task && rank) {
    std::printf("this task: %s, rank %d of %d%s\n", spec.task->ToString().c_str(), *rank, world,
                *rank == 0 ? " (serves the rendezvous)" : "");
  } else if (spec.task && spec.task->type == Role::kPs) {
    std::printf("this task: %s, not a rank: hosts the embedding tables (`shardwild serve`, or `train` when srun or "
                "mpirun started it)\n",
                spec.task->ToString().c_str());
  } else if (spec.task) {
    std::printf("this task: %s, not a rank (the chief and the worker tasks are)\n", spec.task->ToString().c_str());
  } else {
    std::printf("this task: none given\n");
  }
  std::printf("collectives: Gloo %s allreduce over TCP (cluster.allreduce_algorithm), %s (cluster.allreduce_overlap %s), "
              "deadline %g s (cluster.collective_timeout_s)\n",
              CollectiveAlgorithmName(config.cluster.allreduce_algorithm),
              config.cluster.allreduce_overlap == AllreduceOverlap::kOn    ? "one per layer during the backward"
              : config.cluster.allreduce_overlap == AllreduceOverlap::kOff ? "one per step after the backward"
                                                                            : "one per layer during the backward where "
                                                                              "each rank has a spare core",
              AllreduceOverlapName(config.cluster.allreduce_overlap),
              config.cluster.collective_timeout_s);
  return 0;
}

// `cluster-info`: the resolved cluster spec, this task's role, the shard
// map over the ps tasks, and the security settings a ps task would serve with.
int ClusterInfo(const std::string& path, const std::vector<std::string>& sets, const ClusterSpecSources& sources,
                bool as_json) {
  absl::StatusOr<Config> config = LoadWithOverrides(path, sets);
  if (!config.ok()) return Fail(config.status());
  absl::StatusOr<ClusterSpec> spec = ResolveClusterSpec(WithConfig(sources, *config));
  if (!spec.ok()) return Fail(spec.status());
  const ClusterOptions& net = config->cluster;
  if (!IsLoopbackHost(net.bind_host) && net.token_file.empty()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        path, ": cluster.bind_host: ", net.bind_host,
        " is not a loopback address, so ps servers would be reachable from other machines: set cluster.token_file")));
  }
  if (config->train.strategy == TrainStrategy::kAllreduce) return AllreduceInfo(*config, *spec, as_json);
  const int num_ps = spec->num_tasks(Role::kPs);
  absl::StatusOr<int> shards = ClusterShards(*config, *spec);  // ps.shards auto = one shard per ps task
  if (!shards.ok()) return Fail(shards.status());
  const int num_shards = *shards;
  absl::StatusOr<ShardMap> map = ShardMap::Make(num_shards, num_ps);
  if (!map.ok()) return Fail(absl::InvalidArgumentError(absl::StrCat(path, ": ", map.status().message())));
  auto shard_list = [&](int ps) {
    std::vector<int> v;
    for (int s = map->first_shard(ps); s < map->first_shard(ps) + map->num_shards_of(ps); ++s) v.push_back(s);
    return v;
  };
  auto shard_range = [&](int ps) {
    const int first = map->first_shard(ps), n = map->num_shards_of(ps);
    return n == 1 ? absl::StrCat("shard ", first) : absl::StrCat("shards ", first, "-", first + n - 1);
  };
  bool remote_ps = false;
  for (const HostPort& hp : spec->tasks[static_cast<int>(Role::kPs)]) remote_ps |= !hp.IsLoopback();
  const bool bind_loopback = IsLoopbackHost(net.bind_host);
  if (as_json) {
    json cluster = json::object();
    for (int t = 0; t < kNumRoles; ++t) {
      json list = json::array();
      for (const HostPort& hp : spec->tasks[t]) list.push_back(hp.ToString());
      cluster[RoleName(static_cast<Role>(t))] = list;
    }
    json task = nullptr;
    if (spec->task) {
      task = {{"type", RoleName(spec->task->type)},
              {"index", spec->task->index},
              {"name", spec->task->ToString()},
              {"address", spec->address(*spec->task).ToString()}};
      if (spec->task->type == Role::kPs) {
        task["shards"] = shard_list(spec->task->index);
        task["bind_address"] = BindAddressOf(net, *spec, *spec->task);
      }
    }
    json shard_map = json::array();
    for (int p = 0; p < num_ps; ++p) {
      shard_map.push_back({{"task", TaskId{Role::kPs, p}.ToString()},
                           {"address", spec->address({Role::kPs, p}).ToString()},
                           {"shards", shard_list(p)}});
    }
    json j = {{"source", spec->source},
              {"cluster", cluster},
              {"task", task},
              {"shards", num_shards},
              {"shard_rule", "div"},
              {"shard_map", shard_map},
              {"security",
               {{"bind_host", net.bind_host},
                {"bind_loopback", bind_loopback},
                {"token", !net.token_file.empty()},
                {"tls", !net.tls_cert_file.empty()}}}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("cluster (from %s):\n", spec->source.c_str());
  for (int t = 0; t < kNumRoles; ++t) {
    std::vector<std::string> addrs;
    for (const HostPort& hp : spec->tasks[t]) addrs.push_back(hp.ToString());
    std::printf("  %-10s %s\n", absl::StrCat(RoleName(static_cast<Role>(t)), ":").c_str(),
                addrs.empty() ? "-" : absl::StrJoin(addrs, ", ").c_str());
  }
  if (spec->task) {
    std::printf("this task: %s (%s)", spec->task->ToString().c_str(), spec->address(*spec->task).ToString().c_str());
    if (spec->task->type == Role::kPs) {
      std::printf(", serves %s, listens on %s", shard_range(spec->task->index).c_str(),
                  BindAddressOf(net, *spec, *spec->task).c_str());
    }
    std::printf("\n");
  } else {
    std::printf("this task: none given (TF_CONFIG task, or --task-type and --task-index)\n");
  }
  const int base = num_shards / num_ps, extra = num_shards % num_ps;
  std::printf("shard map: %d shard%s over %d ps task%s (div rule: %s)\n", num_shards, num_shards == 1 ? "" : "s",
              num_ps, num_ps == 1 ? "" : "s",
              extra == 0 ? absl::StrCat(base, " each").c_str()
                         : absl::StrCat("the first ", extra, " get ", base + 1, ", the rest ", base).c_str());
  for (int p = 0; p < num_ps; ++p) {
    std::printf("  %-6s %-24s %s\n", TaskId{Role::kPs, p}.ToString().c_str(),
                spec->address({Role::kPs, p}).ToString().c_str(), shard_range(p).c_str());
  }
  std::printf("security: bind %s (%s), token %s, TLS %s\n", net.bind_host.c_str(),
              bind_loopback ? "loopback" : "all listed interfaces",
              net.token_file.empty() ? "none" : absl::StrCat("from ", net.token_file).c_str(),
              net.tls_cert_file.empty() ? "off" : "on");
  if (remote_ps && bind_loopback) {
    std::printf("note: ps tasks on other hosts listen on loopback (cluster.bind_host) and cannot be reached from "
                "other machines; set cluster.bind_host and cluster.token_file\n");
  }
  return 0;
}

// Set by SIGTERM / SIGINT while `serve` runs a ps task: it shuts down
// cleanly (its shared memory is unlinked on the way out).
std::atomic<bool> g_stop{false};

void OnStopSignal(int /*sig*/) { g_stop.store(true, std::memory_order_relaxed); }

// `serve`: a ps, worker or evaluator task of a cluster (net/ps_task.h,
// net/worker_task.h, and for the evaluator `eval --watch`). Its lines go to
// stdout.
int ServeTask(const std::string& path, const std::vector<std::string>& sets, const Config& config,
              const ClusterSpec& spec);

int Serve(const std::string& path, const std::vector<std::string>& sets, const ClusterSpecSources& sources) {
  absl::StatusOr<Config> config = LoadWithOverrides(path, sets);
  if (!config.ok()) return Fail(config.status());
  absl::StatusOr<ClusterSpec> spec = ResolveClusterSpec(WithConfig(sources, *config));
  if (!spec.ok()) return Fail(spec.status());
  return ServeTask(path, sets, *config, *spec);
}

int ServeTask(const std::string& path, const std::vector<std::string>& sets, const Config& cfg,
              const ClusterSpec& spec_in) {
  const Config* const config = &cfg;
  const ClusterSpec* const spec = &spec_in;
  if (!spec->task) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        spec->source, ": task: no task given; say which with task.type/task.index, or --task-type/--task-index")));
  }
  static Mutex log_mu;
  const TaskLog log = [](const std::string& line) {
    MutexLock lock(&log_mu);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  const int index = spec->task->index;
  absl::Status status;
  switch (spec->task->type) {
    case Role::kPs:
      std::signal(SIGTERM, OnStopSignal);
      std::signal(SIGINT, OnStopSignal);
      status = RunPsTask(*config, *spec, index, g_stop, log);
      break;
    case Role::kWorker:
      status = RunWorkerTask(*config, *spec, index, log);
      break;
    case Role::kEvaluator:
      // TF's sidecar evaluator: every checkpoint the chief writes, in order,
      // until the final one (`eval --watch checkpoint.dir`; the chief's and
      // the ps tasks' checkpoint directories must be readable here).
      if (config->checkpoint.dir.empty()) {
        status = absl::InvalidArgumentError(absl::StrCat(
            path, ": checkpoint.dir: the evaluator evaluates the chief's checkpoints, and there are none without it"));
        break;
      }
      return Eval(path, sets, "", config->checkpoint.dir, 0, /*as_json=*/false);
    case Role::kChief:
      status = absl::InvalidArgumentError(
          absl::StrCat(spec->source, ": task.type: chief: the chief runs `shardwild train`, not `serve`"));
      break;
  }
  if (!status.ok()) return Fail(status);
  return 0;
}

}  // namespace
}  // namespace shardwild

#ifdef SHARDWILD_ASAN
// LeakSanitizer (the ASan build): c-ares, gRPC's DNS resolver (a system
// library, not instrumented), keeps a small allocation from resolving a
// host name (a Slurm node's, "localhost") until gRPC's deferred shutdown,
// which a process that exits does not wait for. Not ours to free; every
// other leak still fails the run.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcares.so\n"; }
#endif

int main(int argc, char** argv) {
  using namespace shardwild;
  InstallSignalHandlers();
  QuietGrpcLogs();  // failures are reported as one line of ours
  // Warnings and notes go to stderr; stdout carries progress and the JSON summary.
  spdlog::set_default_logger(spdlog::stderr_color_mt("shardwild"));
  spdlog::set_pattern("shardwild: %l: %v");
  CLI::App app{"Shardwild: Hogwild training over NUMA-pinned shared-memory parameter shards"};
  app.set_version_flag("--version", std::string("shardwild ") + SHARDWILD_VERSION);
  app.require_subcommand(1);

  std::string config_path;
  std::vector<std::string> sets;
  bool as_json = false;

  // The cluster spec's sources, on every command that runs a cluster task.
  ClusterSpecSources cluster_sources;
  std::string task_type;
  int task_index = 0;
  std::vector<std::pair<CLI::Option*, CLI::Option*>> task_flags;  // (--task-type, --task-index) per command
  auto add_cluster_flags = [&](CLI::App* cmd) {
    cmd->add_option("--cluster", cluster_sources.cluster_file,
                    "TF_CONFIG-style JSON file (default: the TF_CONFIG environment variable)");
    CLI::Option* type = cmd->add_option(
        "--task-type", task_type, "This task's role: chief, ps, worker or evaluator (overrides the spec's task.type)");
    CLI::Option* index = cmd->add_option("--task-index", task_index,
                                         "This task's index (overrides the spec's task.index)")
                             ->check(CLI::NonNegativeNumber);
    task_flags.emplace_back(type, index);
  };

  CLI::App* train = app.add_subcommand("train", "Train the model a config describes");
  train->add_option("config", config_path, "YAML config file")->required();
  train->add_option("--set", sets, "Override a config key by its dotted path: --set train.workers=2");
  train->add_flag("--json", as_json, "End with one line of JSON summarising the run");
  bool fresh = false;
  train->add_flag("--fresh", fresh, "Start from the initial values even if checkpoint.dir holds checkpoints");
  // Hidden, for tests: extra arguments for each worker process's command
  // line (`shardwild worker`'s test hooks).
  std::vector<std::string> worker_extra;
  train->add_option("--worker-arg", worker_extra)->group("")->allow_extra_args(false);

  std::string checkpoint, watch, input, out;
  double idle_timeout = 0;
  CLI::App* eval = app.add_subcommand("eval", "Evaluate a checkpoint on data.test, or every checkpoint as it appears");
  eval->add_option("config", config_path, "YAML config file")->required();
  eval->add_option("--set", sets, "Override a config key by its dotted path");
  eval->add_option("--checkpoint", checkpoint, "A checkpoint (ckpt-<step>) or a checkpoint directory (its newest)");
  eval->add_option("--watch", watch, "Sidecar: evaluate each checkpoint written to this directory until the final one");
  eval->add_option("--idle-timeout", idle_timeout, "With --watch: stop after this many seconds without a new checkpoint")
      ->check(CLI::NonNegativeNumber);
  eval->add_flag("--json", as_json, "Print JSON: a line per checkpoint (and a summary with --watch)");

  CLI::App* predict = app.add_subcommand("predict", "Write one prediction per input record, in input order");
  predict->add_option("config", config_path, "YAML config file")->required();
  predict->add_option("--set", sets, "Override a config key by its dotted path");
  predict->add_option("--checkpoint", checkpoint, "A checkpoint (ckpt-<step>) or a checkpoint directory (its newest)")
      ->required();
  predict->add_option("--input", input,
                      "Records to predict: an IDX images file (...-images-idx3-ubyte[.gz]) for data.format idx, "
                      "else a file in the config's data.format")
      ->required();
  predict->add_option("--out", out, "CSV to write: index,prediction,p0..p<K-1>")->required();

  CLI::App* bench = app.add_subcommand("bench", "Time the config's training step against the same-run matmul peak");
  bench->add_option("config", config_path, "YAML config file (required unless a subcommand is given)");
  bench->add_option("--set", sets, "Override a config key by its dotted path");
  bench->add_flag("--json", as_json, "End with one line of JSON");
  bench->require_subcommand(0, 1);
  add_cluster_flags(bench);

  StoreBenchOptions store_bench;
  CLI::App* bench_store = bench->add_subcommand(
      "store", "Push embedding rows through the shared-memory store against the same-run random-row bound");
  bench_store->add_option("--dim", store_bench.dim, "Floats per row")->capture_default_str();
  bench_store->add_option("--rows", store_bench.rows, "Rows of the table")->capture_default_str();
  // Named choices, mapped onto the options after parsing.
  std::string store_ids = "uniform", store_optimizer = "adagrad", store_update = "hogwild", store_kind = "static";
  const std::map<std::string, IdDistribution> id_names = {{"uniform", IdDistribution::kUniform},
                                                          {"zipf", IdDistribution::kZipf}};
  const std::map<std::string, OptimizerType> optimizer_names = {
      {"sgd", OptimizerType::kSgd},         {"momentum", OptimizerType::kMomentum}, {"adam", OptimizerType::kAdam},
      {"adagrad", OptimizerType::kAdagrad}, {"rmsprop", OptimizerType::kRmsprop},   {"ftrl", OptimizerType::kFtrl}};
  const std::map<std::string, UpdateMode> update_names = {
      {"hogwild", UpdateMode::kHogwild}, {"row_lock", UpdateMode::kRowLock}, {"sync", UpdateMode::kSync}};
  const std::map<std::string, EmbeddingKind> kind_names = {{"static", EmbeddingKind::kStatic},
                                                           {"dynamic", EmbeddingKind::kDynamic}};
  auto names = [](const auto& m) {
    std::vector<std::string> v;
    for (const auto& kv : m) v.push_back(kv.first);
    return v;
  };
  bench_store->add_option("--ids", store_ids, "Id distribution: uniform, or zipf (Zipf 1.05)")
      ->check(CLI::IsMember(names(id_names)))
      ->capture_default_str();
  bench_store->add_option("--optimizer", store_optimizer, "Optimizer of the rows")
      ->check(CLI::IsMember(names(optimizer_names)))
      ->capture_default_str();
  bench_store->add_option("--update", store_update, "ps.update: hogwild, row_lock or sync")
      ->check(CLI::IsMember(names(update_names)))
      ->capture_default_str();
  bench_store->add_option("--kind", store_kind, "Table kind: static (ids 0..rows-1) or dynamic (64-bit ids)")
      ->check(CLI::IsMember(names(kind_names)))
      ->capture_default_str();
  std::string store_dtype = "f32";
  bench_store->add_option("--dtype", store_dtype, "Row parameters: f32, or bf16 (stochastic rounding, f32 slots)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  bench_store->add_option("--threads", store_bench.threads, "Pinned threads pushing at once")->capture_default_str();
  bench_store->add_option("--shards", store_bench.shards, "Shards the table is spread over")->capture_default_str();
  bench_store->add_option("--batch", store_bench.batch, "Ids per push")->capture_default_str();
  bench_store->add_option("--seconds", store_bench.seconds, "Timed seconds (for the push, then for the bound)")
      ->capture_default_str();
  bench_store->add_flag("--json", as_json, "End with one line of JSON");

  SweepOptions sweep;
  std::vector<std::string> grid_args;
  CLI::App* bench_sweep = bench->add_subcommand(
      "sweep", "Run the bench at every point of a grid of config values, repeated and interleaved; write results "
               "(CSV, JSON) and an HTML report");
  bench_sweep->add_option("config", sweep.config_path, "YAML config file")->required();
  bench_sweep->add_option("--grid", grid_args, "A config key and its values: --grid train.workers=1,2,4 (repeatable)")
      ->required();
  bench_sweep->add_option("--set", sweep.sets, "Override a config key at every point");
  bench_sweep->add_option("--repeats", sweep.repeats, "Runs per point (interleaved across the points)")
      ->capture_default_str();
  bench_sweep->add_option("--out", sweep.out_dir, "Directory to write (new, empty, or an earlier sweep's)")->required();

  std::string compare_a, compare_b, compare_out;
  CLI::App* bench_compare = bench->add_subcommand(
      "compare", "Compare two sweeps point by point: ratio of median samples/s and whether min-max ranges overlap");
  bench_compare->add_option("a", compare_a, "The baseline sweep's directory")->required();
  bench_compare->add_option("b", compare_b, "The sweep to compare with it")->required();
  bench_compare->add_option("--out", compare_out, "Also write DIR/compare.json and the page DIR/compare.html");
  bench_compare->add_flag("--json", as_json, "End with one line of JSON");
  bool fail_on_slower = false;
  bench_compare->add_flag("--fail-on-slower", fail_on_slower,
                          "Exit with status 3 if B is slower than A beyond the min-max ranges at any point");

  std::string report_dir;
  CLI::App* bench_report = bench->add_subcommand("report", "Draw a sweep directory's report.html again");
  bench_report->add_option("dir", report_dir, "A sweep's directory")->required();

  std::string synthetic, xml;
  int workers = 0, shards = 0, threads = 0;
  CLI::App* topo = app.add_subcommand("topology", "Show the machine and the placement of workers and shards");
  topo->add_option("--synthetic", synthetic, "hwloc synthetic description, e.g. \"pack:2 numa:1 core:8 pu:2\"");
  topo->add_option("--xml", xml, "hwloc XML topology file");
  topo->add_option("--workers", workers, "Workers to place (default: one per core)")->check(CLI::Range(0, 4096));
  topo->add_option("--shards", shards, "Shards to place (default: one per NUMA node)")->check(CLI::Range(0, 4096));
  topo->add_option("--threads", threads, "OpenMP threads per worker (default: cores / workers)")->check(CLI::Range(0, 4096));
  topo->add_flag("--json", as_json, "Print JSON");

  DataGenOptions data_gen_options;
  CLI::App* data = app.add_subcommand("data", "Data set tools");
  data->require_subcommand(1);
  CLI::App* data_gen = data->add_subcommand(
      "gen", "Write a synthetic data set from a planted model and print the planted model's Bayes metric on it");
  data_gen->add_option("--kind", data_gen_options.kind, "File format: criteo (TSV), libsvm or text (fastText)")
      ->required()
      ->check(CLI::IsMember({"criteo", "libsvm", "text"}));
  data_gen->add_option("--rows", data_gen_options.rows, "Records to write")->required()->check(CLI::PositiveNumber);
  data_gen->add_option("--out", data_gen_options.out, "File to write (replaced atomically)")->required();
  data_gen->add_option("--seed", data_gen_options.seed,
                       "Seed of the rows (a training and a test file of one model take different seeds)")
      ->capture_default_str();
  data_gen->add_option("--model-seed", data_gen_options.model_seed,
                       "Seed of the planted model (keep it the same for the files of one task)")
      ->capture_default_str();
  data_gen->add_option("--classes", data_gen_options.text_classes, "text: classes")->capture_default_str();
  data_gen->add_option("--files", data_gen_options.files,
                       "Split the rows into this many files, named --out with -00000, -00001, ... before its first '.'")
      ->capture_default_str();
  data_gen->add_option("--compress", data_gen_options.compress,
                       "Compress each file: gz or zst (independent blocks, read in parallel), or none")
      ->capture_default_str();
  data_gen->add_flag("--json", as_json, "End with one line of JSON");
  bool rebuild = false;
  CLI::App* data_cache = data->add_subcommand(
      "cache", "Build (or check) the columnar cache of data.train that data.stream reads, and time reading it back");
  data_cache->add_option("config", config_path, "YAML config file")->required();
  data_cache->add_option("--set", sets, "Override a config key by its dotted path");
  data_cache->add_flag("--rebuild", rebuild, "Remove the cache first, so that it is built from the files");
  data_cache->add_flag("--json", as_json, "End with one line of JSON");

  add_cluster_flags(train);
  CLI::App* cluster_info = app.add_subcommand(
      "cluster-info", "Show the cluster spec (TF_CONFIG, --cluster or flags), this task's role and the shard map");
  cluster_info->add_option("config", config_path, "YAML config file")->required();
  cluster_info->add_option("--set", sets, "Override a config key by its dotted path");
  add_cluster_flags(cluster_info);
  cluster_info->add_flag("--json", as_json, "Print JSON");

  CLI::App* serve = app.add_subcommand(
      "serve", "Run a ps, worker or evaluator task of a cluster (the chief runs `train`)");
  serve->add_option("config", config_path, "YAML config file")->required();
  serve->add_option("--set", sets, "Override a config key by its dotted path");
  add_cluster_flags(serve);

  // Hidden: one worker process of train.worker_processes, started by `train`
  // (workers/task_trainer.h).
  WorkerProcessArgs worker_args;
  CLI::App* worker = app.add_subcommand("worker", "")->group("");
  worker->add_option("config", config_path)->required();
  worker->add_option("--set", sets);
  worker->add_option("--store", worker_args.store)->required();
  worker->add_option("--index", worker_args.index)->required();
  worker->add_option("--fd", worker_args.fd)->required();
  worker->add_option("--parent", worker_args.parent);
  worker->add_option("--die-at-eval-task", worker_args.die_at_eval_task);  // test hooks (task_trainer.h)
  worker->add_option("--die-marker", worker_args.die_marker);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // A usage error is an error like any other: one line, same prefix.
    std::fprintf(stderr, "shardwild: error: %s (run with --help for usage)\n", e.what());
    return e.get_exit_code();
  }
  // TF_CONFIG and the launchers' variables are read here, at the edge, and
  // passed down; the task flags win over them.
  cluster_sources.env = LaunchEnv::FromEnviron();
  if (const char* tf_config = std::getenv("TF_CONFIG"); tf_config != nullptr && *tf_config != '\0') {
    cluster_sources.tf_config = tf_config;
  }
  for (const auto& [type, index] : task_flags) {
    if (type->count() > 0) cluster_sources.task_type = task_type;
    if (index->count() > 0) cluster_sources.task_index = task_index;
  }
  if (train->parsed()) return Train(config_path, sets, as_json, fresh, worker_extra, cluster_sources);
  if (serve->parsed()) return Serve(config_path, sets, cluster_sources);
  if (worker->parsed()) return RunWorkerProcess(LoadWithOverrides(config_path, sets), worker_args);
  if (eval->parsed()) return Eval(config_path, sets, checkpoint, watch, idle_timeout, as_json);
  if (predict->parsed()) return Predict(config_path, sets, checkpoint, input, out);
  if (bench_store->parsed()) {
    store_bench.ids = id_names.at(store_ids);
    store_bench.optimizer = optimizer_names.at(store_optimizer);
    store_bench.update = update_names.at(store_update);
    store_bench.kind = kind_names.at(store_kind);
    store_bench.bf16 = store_dtype == "bf16";
    return BenchStore(store_bench, as_json);
  }
  if (bench_sweep->parsed()) {
    for (const std::string& arg : grid_args) {
      absl::StatusOr<SweepAxis> axis = ParseSweepAxis(arg);
      if (!axis.ok()) return Fail(axis.status());
      sweep.grid.push_back(*std::move(axis));
    }
    return BenchSweep(sweep);
  }
  if (bench_compare->parsed()) return BenchCompare(compare_a, compare_b, compare_out, as_json, fail_on_slower);
  if (bench_report->parsed()) return RedrawReport(report_dir);
  if (bench->parsed()) {
    if (config_path.empty()) {
      std::fprintf(stderr,
                   "shardwild: error: bench: a CONFIG path or a subcommand (store, sweep, compare, report) is required "
                   "(run with --help for usage)\n");
      return 2;
    }
    return Bench(config_path, sets, as_json, cluster_sources);
  }
  if (topo->parsed()) return ShowTopology(synthetic, xml, workers, shards, threads, as_json);
  if (data_gen->parsed()) return GenerateDataCommand(data_gen_options, as_json);
  if (data_cache->parsed()) return DataCacheCommand(config_path, sets, rebuild, as_json);
  if (cluster_info->parsed()) return ClusterInfo(config_path, sets, cluster_sources, as_json);

  return 1;
}
