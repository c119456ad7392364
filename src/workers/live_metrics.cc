#include "workers/live_metrics.h"

#include "absl/strings/str_cat.h"
#include "core/base/status.h"
#include "ps_shm/shm_store.h"
#include "workers/job.h"
#include "workers/replicated_store.h"

#ifndef SHARDWILD_VERSION
#define SHARDWILD_VERSION "unknown"
#endif

namespace shardwild {

const char* MetricsRoleName(MetricsRole role) {
  switch (role) {
    case MetricsRole::kChief: return "chief";
    case MetricsRole::kWorker: return "worker";
    case MetricsRole::kPs: return "ps";
  }
  return "?";
}

MetricsProcess MetricsProcess::Chief() { return MetricsProcess{MetricsRole::kChief, 0, "chief"}; }

MetricsProcess MetricsProcess::WorkerProcess(int index) {
  return MetricsProcess{MetricsRole::kWorker, 1 + index, absl::StrCat("worker process ", index)};
}

MetricsProcess MetricsProcess::PsTask(int index) {
  return MetricsProcess{MetricsRole::kPs, 1 + index, absl::StrCat("ps:", index)};
}

MetricsProcess MetricsProcess::WorkerTask(int index, int num_ps) {
  return MetricsProcess{MetricsRole::kWorker, 1 + num_ps + index, absl::StrCat("worker:", index)};
}

StoreBytes StoreBytesOf(const ShmParamStore& store) {
  const ShmParamStore::Memory m = store.memory();
  return StoreBytes{m.params, m.slots, m.overhead};
}

StoreBytes StoreBytesOf(ReplicatedStore& store) {
  StoreBytes b;
  auto add = [&b](const ShmParamStore& s) {
    const StoreBytes sb = StoreBytesOf(s);
    b.params += sb.params;
    b.slots += sb.slots;
    b.overhead += sb.overhead;
  };
  for (int r = 0; r < store.num_replicas(); ++r) add(store.replica(r));
  // With one replica the tables live in it; with several, in a store of their own.
  if (store.num_replicas() > 1 && store.tables() != nullptr) add(*store.tables());
  return b;
}

// ---- LiveMetrics::Attachment ----------------------------------------------

LiveMetrics::Attachment& LiveMetrics::Attachment::operator=(Attachment&& other) noexcept {
  if (this != &other) {
    if (metrics_ != nullptr) metrics_->Detach(id_);
    metrics_ = std::exchange(other.metrics_, nullptr);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

LiveMetrics::Attachment::~Attachment() {
  if (metrics_ != nullptr) metrics_->Detach(id_);
}

// ---- LiveMetrics ----------------------------------------------------------

void LiveMetrics::WorkTotals::Add(const WorkerCounters& c) {
  samples += c.samples.load(std::memory_order_relaxed);
  steps += c.steps.load(std::memory_order_relaxed);
  for (int p = 0; p < kNumStepPhases; ++p) phase_ns[p] += c.phase_ns[p].load(std::memory_order_relaxed);
}

LiveMetrics::Attachment LiveMetrics::AttachWorkers(std::vector<const WorkerCounters*> counters) {
  MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  workers_.emplace_back(id, std::move(counters));
  return Attachment(this, id);
}

LiveMetrics::Attachment LiveMetrics::AttachStore(std::function<uint64_t()> version, StoreBytes bytes) {
  MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  store_id_ = id;
  store_version_ = std::move(version);
  store_bytes_ = bytes;
  return Attachment(this, id);
}

void LiveMetrics::Detach(int64_t id) {
  MutexLock lock(&mu_);
  if (id == store_id_) {
    last_store_version_ = store_version_();
    store_version_ = nullptr;
    store_id_ = 0;
    return;
  }
  for (auto it = workers_.begin(); it != workers_.end(); ++it) {
    if (it->first != id) continue;
    for (const WorkerCounters* c : it->second) detached_.Add(*c);
    workers_.erase(it);
    return;
  }
}

LiveMetrics::Values LiveMetrics::Read() const {
  Values v;
  {
    MutexLock lock(&mu_);
    WorkTotals t = detached_;
    for (const auto& [id, counters] : workers_) {
      for (const WorkerCounters* c : counters) t.Add(*c);
    }
    v.samples = t.samples;
    v.steps = t.steps;
    for (int p = 0; p < kNumStepPhases; ++p) v.phase_seconds[p] = static_cast<double>(t.phase_ns[p]) / 1e9;
    v.store_version = store_version_ ? store_version_() : last_store_version_;
    v.store_bytes = store_bytes_;
  }
  v.train_loss = train_loss_.load(std::memory_order_relaxed);
  v.tasks_requeued = tasks_requeued_.load(std::memory_order_relaxed);
  v.worker_failures = worker_failures_.load(std::memory_order_relaxed);
  v.checkpoints_written = checkpoints_written_.load(std::memory_order_relaxed);
  v.job_records = job_records_.load(std::memory_order_relaxed);
  return v;
}

absl::Status LiveMetrics::Register(MetricRegistry* registry) const {
  // One value of Read() as a series' callback.
  auto value = [this](auto field) -> std::function<double()> {
    return [this, field] { return static_cast<double>(field(Read())); };
  };
  auto family = [](std::string name, MetricType type, std::string help, std::function<double()> v) {
    return MetricFamily{std::move(name), type, std::move(help), {MetricSeries{{}, std::move(v)}}};
  };
  const bool chief = role_ == MetricsRole::kChief;
  const bool steps = role_ != MetricsRole::kPs;
  const bool store = role_ != MetricsRole::kWorker;
  if (steps) {
    SW_RETURN_IF_ERROR(registry->Add(family(
        "shardwild_samples_total", MetricType::kCounter,
        "Training records the worker threads of this process have stepped through (padding excluded).",
        value([](const Values& v) { return v.samples; }))));
    SW_RETURN_IF_ERROR(registry->Add(family("shardwild_steps_total", MetricType::kCounter,
                                            "Training steps the worker threads of this process have taken.",
                                            value([](const Values& v) { return v.steps; }))));
    MetricFamily phases{"shardwild_step_phase_seconds_total", MetricType::kCounter,
                        "Seconds of training steps spent in each phase, summed over the worker threads of this "
                        "process.",
                        {}};
    for (int p = 0; p < kNumStepPhases; ++p) {
      phases.series.push_back(
          MetricSeries{{{"phase", kStepPhaseNames[p]}}, [this, p] { return Read().phase_seconds[p]; }});
    }
    SW_RETURN_IF_ERROR(registry->Add(std::move(phases)));
  }
  if (chief) {
    SW_RETURN_IF_ERROR(registry->Add(family(
        "shardwild_train_loss", MetricType::kGauge,
        "Mean training loss of the current epoch so far, as of the latest progress interval (NaN before the first).",
        value([](const Values& v) { return v.train_loss; }))));
  }
  if (store) {
    SW_RETURN_IF_ERROR(registry->Add(family("shardwild_store_version", MetricType::kGauge,
                                            "Model version (pushes applied) of the parameter store this process "
                                            "holds.",
                                            value([](const Values& v) { return v.store_version; }))));
    MetricFamily bytes{"shardwild_store_bytes", MetricType::kGauge,
                       "Shared memory of the parameter store this process holds: parameters, optimizer slots, and "
                       "the rest.",
                       {}};
    bytes.series.push_back(
        MetricSeries{{{"kind", "params"}}, value([](const Values& v) { return v.store_bytes.params; })});
    bytes.series.push_back(
        MetricSeries{{{"kind", "slots"}}, value([](const Values& v) { return v.store_bytes.slots; })});
    bytes.series.push_back(
        MetricSeries{{{"kind", "overhead"}}, value([](const Values& v) { return v.store_bytes.overhead; })});
    SW_RETURN_IF_ERROR(registry->Add(std::move(bytes)));
  }
  if (chief) {
    SW_RETURN_IF_ERROR(registry->Add(family("shardwild_tasks_requeued_total", MetricType::kCounter,
                                            "Tasks the dispatcher re-queued after a failure, timeout or death.",
                                            value([](const Values& v) { return v.tasks_requeued; }))));
    SW_RETURN_IF_ERROR(registry->Add(family("shardwild_worker_failures_total", MetricType::kCounter,
                                            "Workers the dispatcher saw die or gave up on.",
                                            value([](const Values& v) { return v.worker_failures; }))));
    SW_RETURN_IF_ERROR(registry->Add(family("shardwild_checkpoints_written_total", MetricType::kCounter,
                                            "Checkpoints this run has written.",
                                            value([](const Values& v) { return v.checkpoints_written; }))));
    SW_RETURN_IF_ERROR(registry->Add(family(
        "shardwild_job_records_total", MetricType::kCounter,
        "Training records of the whole job done so far (resumed runs included), each counted once whichever "
        "process stepped through it; advances a task at a time when the steps run in other processes.",
        value([](const Values& v) { return v.job_records; }))));
  }
  return registry->Add(MetricFamily{"shardwild_info",
                                    MetricType::kGauge,
                                    "Always 1; the labels say which Shardwild this is and the process's role.",
                                    {MetricSeries{{{"version", SHARDWILD_VERSION}, {"role", MetricsRoleName(role_)}},
                                                  [] { return 1.0; }}}});
}

std::vector<LiveMetrics::Attachment> AttachJob(LiveMetrics* live, Job& job) {
  std::vector<LiveMetrics::Attachment> handles;
  if (live == nullptr) return handles;
  std::vector<const WorkerCounters*> counters;
  for (int i = 0; i < job.num_workers(); ++i) counters.push_back(&job.worker(i).counters());
  if (!counters.empty()) handles.push_back(live->AttachWorkers(std::move(counters)));
  if (job.has_local_store()) {
    ReplicatedStore* const store = &job.replicas();
    handles.push_back(live->AttachStore([store] { return store->version(); }, StoreBytesOf(*store)));
  }
  return handles;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> ServeLiveMetrics(const MetricsOptions& options,
                                                                const MetricsProcess& process,
                                                                const LiveMetrics& live) {
  if (options.port == 0) return std::unique_ptr<MetricsServer>();
  MetricsServerOptions so;
  so.bind = options.bind;
  so.port = options.port + process.port_offset;
  if (process.port_offset > 0) {
    so.who = absl::StrCat(process.name, " (metrics.port + ", process.port_offset, ")");
  }
  if (so.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics.port: ", options.port, " + ", process.port_offset, " for ",
                                                   process.name, " is beyond 65535; choose a lower metrics.port"));
  }
  auto registry = std::make_unique<MetricRegistry>();
  SW_RETURN_IF_ERROR(live.Register(registry.get()));
  return MetricsServer::Start(so, std::move(registry));
}

}  // namespace shardwild
