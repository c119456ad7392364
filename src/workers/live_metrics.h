// LiveMetrics: what this process's training has done so far, served to
// Prometheus while it runs (metrics.port; README "Live metrics
// (Prometheus)"). The families, each with HELP and TYPE:
//
//   shardwild_samples_total             counter  training records this process's workers stepped through
//   shardwild_steps_total               counter  training steps of this process's workers
//   shardwild_step_phase_seconds_total  counter  {phase="data|read_params|pull_rows|forward|backward|push|push_rows"},
//                                                summed over this process's worker threads
//   shardwild_train_loss                gauge    the latest progress interval's train loss (NaN before the first)
//   shardwild_store_version             gauge    the model version (pushes applied) of this process's store
//   shardwild_store_bytes               gauge    {kind="params|slots|overhead"}: shared memory of that store
//                                                (both 0 on a cluster's chief, which has none: its ps tasks
//                                                serve theirs)
//   shardwild_tasks_requeued_total      counter  the dispatcher's re-queued tasks
//   shardwild_worker_failures_total     counter  the dispatcher's dead or given-up workers
//   shardwild_checkpoints_written_total counter  checkpoints this run wrote
//   shardwild_info                      gauge    {version="<shardwild's>",role="chief|worker|ps"} 1
//
// Each process serves what it knows (MetricsRole): the chief every family,
// a worker (a worker process of train.worker_processes, a cluster's worker
// task) samples, steps and phases, a ps task its store's version and bytes;
// every one serves shardwild_info. Samples, steps and phases count where
// the steps run, once each: a chief whose workers are other processes
// counts none of them, so a job's throughput is the sum over its
// processes (sum(rate(shardwild_samples_total[1m]))).
//
// Where the values come from: sources attached for as long as they live
// (AttachWorkers: the workers' own relaxed counters, WorkerCounters;
// AttachStore: the store's version), read at scrape time; and values the
// training loop publishes as it goes (SetTrainLoss, SetTaskCounters,
// AddCheckpoint: relaxed atomics). Nothing is added to the step beyond the
// worker's per-step counter adds.
//
// Thread safety: thread-safe. The training loop, the attach handles and the
// server's threads may use one LiveMetrics at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "core/base/mutex.h"
#include "core/config/options.h"
#include "core/metrics/prometheus.h"
#include "workers/metrics_server.h"
#include "workers/worker.h"

namespace shardwild {

class Job;
class ReplicatedStore;
class ShmParamStore;

// What a process is to the metrics: the role decides the families it
// serves (see above) and shardwild_info's role label.
enum class MetricsRole { kChief, kWorker, kPs };
const char* MetricsRoleName(MetricsRole role);  // "chief", "worker", "ps"

// A process of a job that serves metrics, and on which port: metrics.port +
// port_offset. The offsets keep the processes of one machine apart:
//   chief (`shardwild train`, local or a cluster's)      + 0
//   worker process k (train.worker_processes)           + 1 + k
//   cluster ps task i (`shardwild serve`)               + 1 + i
//   cluster worker task j (`shardwild serve`)           + 1 + (ps tasks) + j
// (a local job has no ps tasks and a cluster no worker processes, so the
// two never meet).
struct MetricsProcess {
  MetricsRole role = MetricsRole::kChief;
  int port_offset = 0;
  std::string name = "chief";  // for messages

  static MetricsProcess Chief();
  static MetricsProcess WorkerProcess(int index);
  static MetricsProcess PsTask(int index);
  static MetricsProcess WorkerTask(int index, int num_ps);
};

// Shared-memory bytes of a store, split as ShmParamStore::memory() splits
// them.
struct StoreBytes {
  uint64_t params = 0, slots = 0, overhead = 0;
};
StoreBytes StoreBytesOf(const ShmParamStore& store);
// Over the replicas and, with several, the separate table store.
StoreBytes StoreBytesOf(ReplicatedStore& store);

class LiveMetrics {
 public:
  explicit LiveMetrics(MetricsRole role) : role_(role) {}
  LiveMetrics(const LiveMetrics&) = delete;
  LiveMetrics& operator=(const LiveMetrics&) = delete;

  MetricsRole role() const { return role_; }

  // Adds the families of this role to `registry`; their callbacks read
  // this object, which must outlive the registry's use.
  absl::Status Register(MetricRegistry* registry) const;

  // A source attached to the scrapes until this handle is destroyed (or
  // assigned over). Move-only; a default-constructed one attaches nothing.
  class Attachment {
   public:
    Attachment() = default;
    Attachment(Attachment&& other) noexcept { *this = std::move(other); }
    Attachment& operator=(Attachment&& other) noexcept;
    ~Attachment();

   private:
    friend class LiveMetrics;
    Attachment(LiveMetrics* metrics, int64_t id) : metrics_(metrics), id_(id) {}
    LiveMetrics* metrics_ = nullptr;  // not owned; must outlive the handle
    int64_t id_ = 0;
  };

  // Scrapes add up `counters` (not owned; each must outlive the handle)
  // until the handle goes; what they counted stays in the totals then.
  [[nodiscard]] Attachment AttachWorkers(std::vector<const WorkerCounters*> counters);
  // Scrapes read the store's model version through `version` (called on the
  // server's threads; what it reads must outlive the handle) and report
  // `bytes`, until the handle goes; the last version read and the bytes stay
  // then. One store at a time: attaching another replaces it.
  [[nodiscard]] Attachment AttachStore(std::function<uint64_t()> version, StoreBytes bytes);

  // Published by the training loop (at most once per progress interval,
  // task or checkpoint).
  void SetTrainLoss(double loss) { train_loss_.store(loss, std::memory_order_relaxed); }
  // The dispatcher's counters (DispatcherCounters), which only grow.
  void SetTaskCounters(int64_t tasks_requeued, int64_t worker_failures) {
    tasks_requeued_.store(tasks_requeued, std::memory_order_relaxed);
    worker_failures_.store(worker_failures, std::memory_order_relaxed);
  }
  void AddCheckpoint() { checkpoints_written_.fetch_add(1, std::memory_order_relaxed); }
  // Training records of the whole job done so far, each once, whichever
  // process stepped through them (the dispatcher's records_seen, or the
  // lockstep loop's count): the chief's view of the job's progress.
  void SetJobRecords(int64_t records) { job_records_.store(records, std::memory_order_relaxed); }

  // What a scrape reads now.
  struct Values {
    int64_t samples = 0, steps = 0;
    double phase_seconds[kNumStepPhases] = {};
    uint64_t store_version = 0;
    StoreBytes store_bytes;
    double train_loss = 0;
    int64_t tasks_requeued = 0, worker_failures = 0, checkpoints_written = 0;
    int64_t job_records = 0;
  };
  Values Read() const;

 private:
  struct WorkTotals {
    int64_t samples = 0, steps = 0;
    int64_t phase_ns[kNumStepPhases] = {};
    void Add(const WorkerCounters& c);
  };
  void Detach(int64_t id);

  const MetricsRole role_;

  mutable Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<std::pair<int64_t, std::vector<const WorkerCounters*>>> workers_ ABSL_GUARDED_BY(mu_);
  WorkTotals detached_ ABSL_GUARDED_BY(mu_);  // what detached workers counted
  int64_t store_id_ ABSL_GUARDED_BY(mu_) = 0;  // 0 = none attached
  std::function<uint64_t()> store_version_ ABSL_GUARDED_BY(mu_);
  uint64_t last_store_version_ ABSL_GUARDED_BY(mu_) = 0;
  StoreBytes store_bytes_ ABSL_GUARDED_BY(mu_);

  // Published by the training loop. Relaxed: each is a statistic of its own
  // and publishes no other memory.
  std::atomic<double> train_loss_{std::numeric_limits<double>::quiet_NaN()};
  std::atomic<int64_t> tasks_requeued_{0};
  std::atomic<int64_t> worker_failures_{0};
  std::atomic<int64_t> checkpoints_written_{0};
  std::atomic<int64_t> job_records_{0};
};

// Attaches a job's workers and (when it created one) its store to `live`;
// the job must outlive the handles. Nothing when `live` is null.
std::vector<LiveMetrics::Attachment> AttachJob(LiveMetrics* live, Job& job);

// Serves `live` (which must outlive the server) at
// http://<metrics.bind>:<metrics.port + process.port_offset>/metrics.
// nullptr when metrics.port is 0 (off). Errors, each one line naming
// metrics.port: the port beyond 65535, or MetricsServer::Start's (the port
// in use, the address unusable), e.g.
//   metrics.port: cannot listen on 127.0.0.1:9102 for worker process 1 (metrics.port + 2): address in use
absl::StatusOr<std::unique_ptr<MetricsServer>> ServeLiveMetrics(const MetricsOptions& options,
                                                                const MetricsProcess& process, const LiveMetrics& live);

}  // namespace shardwild
