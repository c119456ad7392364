#include "net/allreduce_task.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"
#include "net/allreduce.h"
#include "net/cluster_setup.h"
#include "net/cluster_store.h"
#include "net/net_options.h"
#include "core/model/optimizer.h"
#include "ps_shm/shm_store.h"

namespace shardwild {
namespace {

// The variables' names and shapes, and the tables' shapes, hashed.
uint64_t LayoutFingerprint(const StoreLayout& layout) {
  std::string text;
  for (const VariableSpec& v : layout.variables) absl::StrAppend(&text, v.name, ":", v.rows, "x", v.cols, ";");
  for (const TableSpec& t : layout.tables) absl::StrAppend(&text, "table:", t.dim, ";");
  return Fnv1a(text.data(), text.size());
}

// Every variable's parameters, hashed in variable order.
absl::StatusOr<uint64_t> ParamsFingerprint(ParamStore& store) {
  uint64_t h = Fnv1a(nullptr, 0);
  std::vector<float> buf;
  for (size_t v = 0; v < store.layout().variables.size(); ++v) {
    buf.resize(store.layout().variables[v].size());
    SW_RETURN_IF_ERROR(store.PullVariable(static_cast<int>(v), buf.data()));
    h = Fingerprint(buf.data(), buf.size(), h);
  }
  return h;
}

bool IsWildcard(const std::string& host) { return host == "0.0.0.0" || host == "::" || host == "[::]"; }

// The address Gloo's sockets bind and publish to the peers: on loopback the
// rank's own loopback address; otherwise the host its launcher gives it
// (a node or service name the peers resolve to this machine), else
// cluster.bind_host. A wildcard cannot be published, and a loopback bind
// cannot be reached by ranks on other hosts: both are errors.
absl::StatusOr<std::string> GlooHost(const ClusterOptions& cluster, const ClusterSpec& spec, const TaskId& task) {
  const HostPort& mine = spec.address(task);
  if (IsLoopbackHost(cluster.bind_host)) {
    for (int r = 0; r < AllreduceWorldSize(spec); ++r) {
      const HostPort& other = spec.address(AllreduceTaskOfRank(spec, r));
      if (!other.host.empty() && !other.IsLoopback()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cluster.bind_host: ", cluster.bind_host, " is loopback, and rank ", r, " runs on ", other.host,
            ", which could not reach it: set cluster.bind_host (and cluster.token_file) for ranks on several hosts"));
      }
    }
    return mine.IsLoopback() ? mine.host : std::string("127.0.0.1");
  }
  if (!mine.host.empty()) return mine.host;
  if (IsWildcard(cluster.bind_host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster.bind_host: ", cluster.bind_host, " is no address the other ranks can reach, and ", spec.source,
        " does not say this rank's host: set cluster.bind_host to this machine's address"));
  }
  return cluster.bind_host;
}

// Connects this task's rank of `spec`: rank 0 serves the rendezvous on
// its bind rule and the rendezvous port; every rank binds Gloo on GlooHost.
absl::StatusOr<std::unique_ptr<Collective>> ConnectRank(const Config& config, const ClusterSpec& spec,
                                                        ProgressReporter& progress) {
  if (!spec.task) {
    return absl::InvalidArgumentError(absl::StrCat(spec.source, ": task: no task given; each rank needs its own"));
  }
  const std::optional<int> rank = AllreduceRankOf(spec, *spec.task);
  if (!rank) {
    return absl::InvalidArgumentError(absl::StrCat(spec.source, ": task.type: ", spec.task->ToString(),
                                                   " is not a rank of train.strategy allreduce (the chief and the "
                                                   "worker tasks are)"));
  }
  if (!spec.rendezvous) return absl::InvalidArgumentError("cluster.rendezvous: missing");
  const int world = AllreduceWorldSize(spec);
  const TaskId first = AllreduceTaskOfRank(spec, 0);

  CollectiveOptions co;
  co.rank = *rank;
  co.size = world;
  co.timeout_s = config.cluster.collective_timeout_s;
  co.algorithm = config.cluster.allreduce_algorithm;
  SW_ASSIGN_OR_RETURN(co.rendezvous, MakePsClientOptions(config.cluster, spec, first));
  co.rendezvous.address = spec.rendezvous->ToString();
  co.rendezvous.task_name = "rendezvous";
  co.rendezvous.deadline_s = config.cluster.collective_timeout_s;
  if (*rank == 0) {
    // Rank 0's bind rule (cluster.bind_host, or its own loopback address),
    // on the rendezvous port.
    ClusterSpec at = spec;
    at.tasks[static_cast<int>(first.type)][first.index].port = spec.rendezvous->port;
    SW_ASSIGN_OR_RETURN(co.server, MakePsServerOptions(config.cluster, at, first));
    co.server.task_name = "rendezvous";
  }
  SW_ASSIGN_OR_RETURN(co.gloo_host, GlooHost(config.cluster, spec, *spec.task));
  progress.Line(absl::StrCat("allreduce: rank ", *rank, " of ", world, " (", spec.task->ToString(), ", from ",
                             spec.source, "), meeting at ", spec.rendezvous->ToString()));
  return Collective::Connect(co);
}

// The trainer's group (workers/trainer.h ElasticGroup) over a Collective.
class GlooGroup final : public ElasticGroup {
 public:
  // Counts the formings Connect went through (a member that died while the
  // first generation connected), unless this rank joined late.
  GlooGroup(Collective& collective, Job& job, ProgressReporter& progress)
      : c_(collective), job_(job), progress_(progress),
        changes_(collective.joined_late() ? 0 : collective.generation()),
        failures_(collective.joined_late() ? 0 : collective.lost_at_last_forming()) {}

  // The group as Connect formed it: said when a member was lost on the way,
  // and FailedPrecondition below cluster.min_workers.
  absl::Status CheckFirstForming() {
    if (changes_ > 0) SayGeneration();
    return CheckMinWorkers();
  }

  int rank() const override { return c_.rank(); }
  int world() const override { return c_.size(); }
  bool joined_late() const override { return c_.joined_late(); }
  int64_t membership_changes() const { return changes_; }
  int64_t failures() const { return failures_; }

  absl::StatusOr<bool> Recover(const absl::Status& failure) override {
    if (!c_.failed()) return false;  // not the group's: the trainer returns it
    progress_.Line(absl::StrCat(failure.message(), "; re-forming the group"));
    SW_RETURN_IF_ERROR(Reform());
    return true;
  }

  absl::StatusOr<bool> AdmitJoiners() override {
    int64_t waiting = c_.joiners_waiting() ? 1 : 0;
    if (absl::Status s = c_.AllreduceSum(&waiting, 1); !s.ok()) {
      if (!c_.failed()) return s;
      progress_.Line(absl::StrCat(s.message(), "; re-forming the group"));
      SW_RETURN_IF_ERROR(Reform());
      return true;
    }
    if (waiting == 0) return false;
    SW_RETURN_IF_ERROR(Reform());
    return true;
  }

  absl::Status SyncState(std::vector<int64_t>* cursor, std::vector<int32_t>* order) override {
    ShmParamStore& store = job_.store();
    const StoreLayout& layout = store.layout();
    SW_RETURN_IF_ERROR(c_.CheckSame(LayoutFingerprint(layout), "the model layout (variables and their shapes)"));
    const bool root = c_.rank() == 0;
    int64_t sizes[2] = {static_cast<int64_t>(cursor->size()), static_cast<int64_t>(order->size())};
    SW_RETURN_IF_ERROR(c_.BroadcastBytes(sizes, sizeof sizes, 0));
    if (sizes[0] < 0 || sizes[0] > 64 || sizes[1] < 0 || sizes[1] > job_.train().count) {
      return absl::InternalError("allreduce: rank 0 sent a malformed cursor");
    }
    cursor->resize(sizes[0]);
    order->resize(sizes[1]);
    SW_RETURN_IF_ERROR(c_.BroadcastBytes(cursor->data(), cursor->size() * sizeof(int64_t), 0));
    SW_RETURN_IF_ERROR(c_.BroadcastBytes(order->data(), order->size() * sizeof(int32_t), 0));
    // Every variable's parameters, optimizer slots and update count (Adam's t).
    const int slots = NumSlots(job_.config().optimizer.type);
    std::vector<float> buf;
    for (size_t v = 0; v < layout.variables.size(); ++v) {
      const VariableSpec& spec = layout.variables[v];
      const int64_t size = spec.size();
      buf.assign(size * (1 + slots) + 2, 0.0f);
      std::vector<float*> slot_ptrs(slots);
      for (int k = 0; k < slots; ++k) slot_ptrs[k] = buf.data() + size * (1 + k);
      if (root) {
        SW_RETURN_IF_ERROR(store.ReadRows(static_cast<int>(v), 0, spec.rows, buf.data(), slot_ptrs));
        const uint64_t count = store.update_count(static_cast<int>(v));
        std::memcpy(buf.data() + size * (1 + slots), &count, sizeof count);
      }
      SW_RETURN_IF_ERROR(c_.BroadcastBytes(buf.data(), buf.size() * sizeof(float), 0));
      if (!root) {
        std::vector<const float*> in(slot_ptrs.begin(), slot_ptrs.end());
        SW_RETURN_IF_ERROR(store.WriteRows(static_cast<int>(v), 0, spec.rows, buf.data(), in));
        uint64_t count = 0;
        std::memcpy(&count, buf.data() + size * (1 + slots), sizeof count);
        store.SetUpdateCount(static_cast<int>(v), count);
      }
    }
    SW_ASSIGN_OR_RETURN(const uint64_t now, ParamsFingerprint(store));
    return c_.CheckSame(now, "the parameters taken from rank 0");
  }

  absl::Status Barrier() override {
    int64_t nothing = 0;
    return c_.AllreduceSum(&nothing, 1);
  }

 private:
  absl::Status Reform() {
    SW_RETURN_IF_ERROR(c_.Reform());
    ++changes_;
    failures_ += c_.lost_at_last_forming();
    SayGeneration();
    return CheckMinWorkers();
  }

  void SayGeneration() {
    progress_.Line(absl::StrCat("allreduce: group generation ", c_.generation(), ": rank ", c_.rank(), " of ",
                                c_.size(), c_.lost_at_last_forming() > 0
                                               ? absl::StrCat(", ", c_.lost_at_last_forming(), " member(s) lost")
                                               : std::string()));
  }

  absl::Status CheckMinWorkers() const {
    const int min = job_.config().cluster.min_workers;
    if (c_.size() < min) {
      return absl::FailedPreconditionError(absl::StrCat("cluster.min_workers: ", c_.size(),
                                                        " rank(s) left, fewer than the ", min, " the job needs"));
    }
    return absl::OkStatus();
  }

  Collective& c_;
  Job& job_;
  ProgressReporter& progress_;
  int64_t changes_;
  int64_t failures_;
};

// cluster.allreduce_overlap auto: the layers' collectives run on the sync
// barrier's own thread while the workers differentiate the layers below, so
// they only overlap where that thread has a core of its own: each rank of
// this host (the ranks whose address names its host) gets num_cores / ranks
// cores, of which its workers use workers x intra-op threads. Without a
// spare core the collectives take turns with the backward, and a step costs
// more than with one collective after it (on a 2-core machine with two
// ranks of one worker: 34k samples/s against 61k).
struct OverlapChoice {
  bool on = false;
  std::string why;  // for auto
};
OverlapChoice ChooseOverlap(const Config& config, const ClusterSpec& spec, const Job& job) {
  const AllreduceOverlap mode = config.cluster.allreduce_overlap;
  if (mode != AllreduceOverlap::kAuto) return {mode == AllreduceOverlap::kOn, ""};
  const std::string host = spec.task ? spec.address(*spec.task).host : std::string();
  int here = 0;
  for (int r = 0; r < AllreduceWorldSize(spec); ++r) {
    if (!host.empty() && spec.address(AllreduceTaskOfRank(spec, r)).host == host) ++here;
  }
  here = std::max(here, 1);
  const int cores = job.topology().num_cores();
  const int busy = job.placement().num_workers * job.placement().threads_per_worker;
  const int per_rank = cores / here;
  return {per_rank > busy, absl::StrCat(cores, " cores for ", here, " rank", here == 1 ? "" : "s", " on this host, ",
                                        busy, " busy per rank: ", per_rank > busy ? "a spare core" : "no spare core")};
}

}  // namespace

absl::StatusOr<TrainSummary> RunAllreduceRank(Job& job, const ClusterSpec& spec, ProgressReporter& progress,
                                              TrainRunOptions options, AllreduceStats* stats,
                                              ClusterParamStore* tables) {
  const Config& config = job.config();
  const StoreLayout& layout = job.param_store().layout();
  const int num_ps = spec.num_tasks(Role::kPs);
  if (!layout.tables.empty() && (tables == nullptr || job.tables_store() != tables)) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source, ": train.strategy: allreduce keeps embedding tables on ps tasks; this model has ",
        layout.tables.size(), " table(s) and the cluster (from ", spec.source,
        ") has no ps task for them: add ps tasks running `shardwild serve` (TF_CONFIG's or --cluster's \"ps\" job, "
        "or cluster.ps_tasks under srun or mpirun)"));
  }
  if (layout.tables.empty() && num_ps > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.source, ": train.strategy: allreduce needs ps tasks only for embedding tables, and this model has "
                       "none; the cluster (from ",
        spec.source, ") has ", num_ps, " ps task(s): drop them (cluster.ps_tasks: 0 under srun or mpirun)"));
  }
  if (job.sync() == nullptr || !job.has_local_store()) {
    return absl::InternalError("allreduce: the job has no sync barrier or store of its own");
  }
  // Under allreduce the ps tasks host the model's tables only.
  if (tables != nullptr) SW_RETURN_IF_ERROR(CheckPsLayout(tables->layout(), ModelLayout{{}, layout.tables}, "this rank"));
  SW_ASSIGN_OR_RETURN(std::unique_ptr<Collective> collective, ConnectRank(config, spec, progress));
  if (tables != nullptr && collective->rank() == 0 && !collective->joined_late()) {
    // A ps task starts closed: rank 0 opens them before the ranks first meet
    // (below), so no rank trains on them sooner. A no-op on open ones.
    for (int i = 0; i < tables->num_ps(); ++i) SW_RETURN_IF_ERROR(tables->client(i).Open());
    progress.Line(absl::StrCat("allreduce: embedding tables on ", tables->num_ps(), " ps task",
                               tables->num_ps() == 1 ? "" : "s"));
  }
  GlooGroup group(*collective, job, progress);
  SW_RETURN_IF_ERROR(group.CheckFirstForming());
  if (!collective->joined_late()) {
    // The first generation: the same model, and the same initial values
    // (train.seed, model and data). A checkpoint is restored inside
    // RunTraining, from checkpoint.dir, which every rank must read alike (a
    // shared directory); the comparison after training catches ranks that
    // did not. A joiner takes rank 0's state instead (SyncState). A member
    // lost meanwhile fails these collectives: the others re-form and
    // compare again, from the first.
    SW_ASSIGN_OR_RETURN(const uint64_t before, ParamsFingerprint(job.param_store()));
    while (true) {
      absl::Status same = collective->CheckSame(LayoutFingerprint(job.param_store().layout()),
                                                "the model layout (variables and their shapes)");
      if (same.ok()) same = collective->CheckSame(before, "the initial parameters (train.seed, model or data)");
      if (same.ok()) break;
      SW_ASSIGN_OR_RETURN(const bool reformed, group.Recover(same));
      if (!reformed) return same;
    }
  }

  // cluster.allreduce_overlap: a bucket per layer, in the order the
  // backward pass finishes them (the same on every rank: the layouts agree).
  std::vector<std::vector<int>> buckets;
  const OverlapChoice overlap = ChooseOverlap(config, spec, job);
  progress.Line(absl::StrCat("allreduce: ", overlap.on ? "a collective per layer during the backward"
                                                       : "one collective a step after the backward",
                             " (cluster.allreduce_overlap ", AllreduceOverlapName(config.cluster.allreduce_overlap),
                             overlap.why.empty() ? "" : ": ", overlap.why, ")"));
  if (overlap.on && job.num_workers() > 0) buckets = job.worker(0).model().BackwardGroups();
  SW_RETURN_IF_ERROR(job.sync()->set_reducer(collective.get(), std::move(buckets)));
  struct ReducerGuard {
    Job& job;
    ~ReducerGuard() { (void)job.sync()->set_reducer(nullptr); }
  } guard{job};
  options.elastic = &group;
  // Checkpoints: the ps tasks save their tables (in checkpoint.dir/ps-<i>,
  // as under the ps strategy) when rank 0 writes one, and rank 0 restores
  // them with the dense part's step.
  TableCheckpoints table_checkpoints;
  if (tables != nullptr) {
    table_checkpoints.save = [tables](int64_t step) -> absl::StatusOr<nlohmann::json> {
      SW_ASSIGN_OR_RETURN(const std::vector<std::string> paths, tables->SaveShards(step));
      nlohmann::json ps = nlohmann::json::array();
      for (int i = 0; i < tables->num_ps(); ++i) {
        ps.push_back({{"task", TaskId{Role::kPs, i}.ToString()}, {"path", paths[i]}});
      }
      return nlohmann::json{{"kind", "ps"}, {"step", step}, {"ps", ps}};
    };
    table_checkpoints.restore = [tables, &collective, &progress](const CheckpointInfo& checkpoint,
                                                                 const nlohmann::json& saved) -> absl::Status {
      if (!saved.is_object() || saved.value("kind", "") != "ps" || !saved.contains("ps") || !saved["ps"].is_array() ||
          static_cast<int>(saved["ps"].size()) != tables->num_ps()) {
        return absl::FailedPreconditionError(absl::StrCat(
            checkpoint.path, ": its embedding tables were saved by ",
            saved.contains("ps") && saved["ps"].is_array() ? std::to_string(saved["ps"].size()) : std::string("no"),
            " ps task(s); this cluster has ", tables->num_ps()));
      }
      if (collective->rank() != 0) return absl::OkStatus();
      SW_ASSIGN_OR_RETURN(const int64_t step, tables->RestoreShards(checkpoint.step));
      if (step != checkpoint.step) {
        return absl::FailedPreconditionError(absl::StrCat("the ps tasks restored their tables to step ", step,
                                                          ", not to ", checkpoint.path, "'s step ", checkpoint.step));
      }
      progress.Line(absl::StrCat("allreduce: the embedding tables on ", tables->num_ps(), " ps task",
                                 tables->num_ps() == 1 ? "" : "s", " restored to step ", step));
      return absl::OkStatus();
    };
    options.tables = &table_checkpoints;
  }
  SW_ASSIGN_OR_RETURN(TrainSummary summary, RunTraining(job, progress, options));
  summary.worker_failures += group.failures();

  SW_ASSIGN_OR_RETURN(const uint64_t after, ParamsFingerprint(job.param_store()));
  SW_RETURN_IF_ERROR(collective->CheckSame(after, "the parameters after training"));
  // Every rank is past its last pull and push (CheckSame): the ps tasks
  // that srun or mpirun started may go.
  if (tables != nullptr && collective->rank() == 0) {
    TellPsTasksJobDone(*tables, "rank 0", [&progress](const std::string& line) { progress.Line(line); });
  }
  if (stats != nullptr) {
    stats->rank = collective->rank();
    stats->world = collective->size();
    stats->local_records = 0;
    for (const EpochResult& e : summary.history) stats->local_records += e.records;
    stats->payload_bytes = collective->payload_bytes();
    stats->collective_s = collective->seconds();
    stats->collectives = collective->calls();
    stats->params_fingerprint = after;
    stats->membership_changes = group.membership_changes();
    stats->generation = collective->generation();
    stats->buckets = std::max(1, job.sync()->buckets());
    stats->buckets_during_backward = job.sync()->buckets_handed_over();
    stats->ps_tasks = tables != nullptr ? tables->num_ps() : 0;
  }
  return summary;
}

absl::StatusOr<double> LoopbackTcpBytesPerS(int64_t bytes) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    return absl::InternalError(absl::StrCat("loopback listener: ", std::strerror(errno)));
  }
  const int writer = socket(AF_INET, SOCK_STREAM, 0);
  if (writer < 0 || connect(writer, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (writer >= 0) close(writer);
    close(listener);
    return absl::InternalError(absl::StrCat("loopback connect: ", std::strerror(errno)));
  }
  const int reader = accept(listener, nullptr, nullptr);
  close(listener);
  if (reader < 0) {
    close(writer);
    return absl::InternalError(absl::StrCat("loopback accept: ", std::strerror(errno)));
  }
  const int one = 1;
  setsockopt(writer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  constexpr size_t kChunk = 1 << 20;
  const auto start = std::chrono::steady_clock::now();
  std::thread send_thread([writer, bytes] {
    std::vector<char> buf(kChunk, 1);
    int64_t left = bytes;
    while (left > 0) {
      const ssize_t n = send(writer, buf.data(), std::min<int64_t>(left, kChunk), MSG_NOSIGNAL);
      if (n <= 0) break;
      left -= n;
    }
    shutdown(writer, SHUT_WR);
  });
  std::vector<char> buf(kChunk);
  int64_t got = 0;
  while (got < bytes) {
    const ssize_t n = recv(reader, buf.data(), buf.size(), 0);
    if (n <= 0) break;
    got += n;
  }
  const double seconds = SecondsSince(start);
  send_thread.join();
  close(writer);
  close(reader);
  if (got < bytes) return absl::InternalError("loopback TCP: the stream ended early");
  return seconds > 0 ? static_cast<double>(bytes) / seconds : 0.0;
}

absl::StatusOr<AllreduceBench> RunAllreduceBench(const Config& config, const ClusterSpec& spec, int64_t floats,
                                                 int64_t iterations, ProgressReporter& progress) {
  if (floats < 1 || iterations < 1) return absl::InvalidArgumentError("allreduce bench: nothing to reduce");
  SW_ASSIGN_OR_RETURN(std::unique_ptr<Collective> collective, ConnectRank(config, spec, progress));
  // Every rank must reduce the same size.
  SW_RETURN_IF_ERROR(collective->CheckSame(static_cast<uint64_t>(floats), "the dense gradient's size"));
  std::vector<float> data(floats, 1.0f);
  for (int i = 0; i < 3; ++i) SW_RETURN_IF_ERROR(collective->AllreduceSum(data.data(), data.size()));
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    // Keep the values finite and the work the same: sums of ones, rescaled.
    if (i % 16 == 0) std::fill(data.begin(), data.end(), 1.0f);
    SW_RETURN_IF_ERROR(collective->AllreduceSum(data.data(), data.size()));
  }
  const double seconds = SecondsSince(start);
  AllreduceBench b;
  b.rank = collective->rank();
  b.world = collective->size();
  b.floats = floats;
  b.iterations = iterations;
  b.seconds = seconds;
  const double per_call = seconds / static_cast<double>(iterations);
  b.algorithm_bytes_per_s = per_call > 0 ? static_cast<double>(floats) * sizeof(float) / per_call : 0;
  b.bus_bytes_per_s = b.algorithm_bytes_per_s * 2.0 * (b.world - 1) / b.world;
  // The bound, measured by rank 0 while the others wait on the broadcast of
  // its result (so nothing else runs then).
  float tcp = 0;
  if (b.rank == 0) {
    SW_ASSIGN_OR_RETURN(const double bps, LoopbackTcpBytesPerS(int64_t{256} << 20));
    tcp = static_cast<float>(bps / 1e6);  // MB/s fits a float's range and precision
  }
  SW_RETURN_IF_ERROR(collective->Broadcast(&tcp, 1, 0));
  b.tcp_loopback_bytes_per_s = static_cast<double>(tcp) * 1e6;
  return b;
}

}  // namespace shardwild
