#include "net/cluster_setup.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/model/model.h"
#include "core/base/status.h"
#include "workers/job.h"

namespace shardwild {

absl::StatusOr<int> ClusterShards(const Config& config, const ClusterSpec& spec) {
  const int ps = spec.num_tasks(Role::kPs);
  const int shards = config.ps.shards > 0 ? config.ps.shards : ps;
  if (absl::StatusOr<ShardMap> map = ShardMap::Make(shards, ps); !map.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(config.source, ": ", map.status().message()));
  }
  return shards;
}

absl::StatusOr<ModelLayout> DescribeModel(const Config& config, const Dataset& train) {
  SW_ASSIGN_OR_RETURN(ModelSpec spec, Model::Describe(config.model, DataShape::Of(train)));
  ModelLayout l;
  l.variables = spec.variables;
  l.tables = TableSpecsOf(spec);
  return l;
}

absl::StatusOr<std::unique_ptr<ClusterStoreConnection>> ConnectClusterStore(const Config& config,
                                                                            const ClusterSpec& spec,
                                                                            const TaskId& task, const TaskLog& log,
                                                                            int async_pushes) {
  SW_ASSIGN_OR_RETURN(const int shards, ClusterShards(config, spec));
  SW_ASSIGN_OR_RETURN(const ShardMap map, ShardMap::Make(shards, spec.num_tasks(Role::kPs)));
  SW_ASSIGN_OR_RETURN(std::vector<PsClientOptions> ps, PsClientsOf(config, spec));
  auto c = std::make_unique<ClusterStoreConnection>();
  c->local = AttachLocalPsStores(ps, spec.address(task).host, config.optimizer, config.sparse_optimizer);
  for (size_t p = 0; p < ps.size(); ++p) {
    if (!c->local.fallbacks[p].empty()) {
      log(absl::StrCat(task.ToString(), ": ", ps[p].task_name, " is on this host but reached through gRPC: ",
                       c->local.fallbacks[p]));
    }
  }
  // Each worker thread may leave a step's pushes in flight while it computes
  // the next step: the dense one and the batch of all its row pushes.
  ClusterStoreOptions so;
  so.async_pushes = async_pushes >= 0 ? async_pushes : std::clamp(2 * std::max(config.train.workers, 1), 1, 64);
  so.threads_per_ps = std::clamp(config.train.workers + 1, 2, 64);
  SW_ASSIGN_OR_RETURN(c->store, ClusterParamStore::Connect(map, ps, c->local.pointers(), so));
  return c;
}

absl::Status CheckPsLayout(const StoreLayout& got, const ModelLayout& want, const std::string& who) {
  auto bad = [&](const std::string& what) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ps tasks serve another model than ", who, "'s config describes: ", what,
        " (every task must run the same config)"));
  };
  if (got.variables.size() != want.variables.size()) {
    return bad(absl::StrCat(got.variables.size(), " variables, ", who, " expects ", want.variables.size()));
  }
  for (size_t v = 0; v < want.variables.size(); ++v) {
    const VariableSpec& a = got.variables[v];
    const VariableSpec& b = want.variables[v];
    if (a.name != b.name || a.rows != b.rows || a.cols != b.cols) {
      return bad(absl::StrCat("variable ", v, " is ", a.name, " [", a.rows, ", ", a.cols, "], ", who, "'s ", b.name,
                              " [", b.rows, ", ", b.cols, "]"));
    }
  }
  if (got.tables.size() != want.tables.size()) {
    return bad(absl::StrCat(got.tables.size(), " tables, ", who, " expects ", want.tables.size()));
  }
  for (size_t t = 0; t < want.tables.size(); ++t) {
    const TableSpec& a = got.tables[t];
    const TableSpec& b = want.tables[t];
    if (a.name != b.name || a.dim != b.dim || a.capacity != b.capacity || a.kind != b.kind) {
      return bad(absl::StrCat("table ", t, " is ", a.name, " (dim ", a.dim, ", capacity ", a.capacity,
                              "), ", who, "'s ", b.name, " (dim ", b.dim, ", capacity ", b.capacity, ")"));
    }
  }
  return absl::OkStatus();
}

void TellPsTasksJobDone(ClusterParamStore& store, const std::string& from, const TaskLog& log) {
  for (int i = 0; i < store.num_ps(); ++i) {
    absl::StatusOr<bool> exiting = store.client(i).JobDone(from);
    if (!exiting.ok()) {
      log(absl::StrCat("warning: ps:", i, " was not told that the job is done: ", exiting.status().message()));
    } else if (*exiting) {
      log(absl::StrCat("ps:", i, " is told the job is done and exits"));
    }
  }
}

int AttemptsCovering(const PsClientOptions& options, double seconds) {
  int attempts = 1;
  double waited = 0, backoff = options.initial_backoff_s;
  while (waited < seconds && attempts < 10000) {
    waited += backoff;
    backoff = std::min(2 * backoff, options.max_backoff_s);
    ++attempts;
  }
  return std::max(attempts, options.max_attempts);
}

absl::StatusOr<std::vector<PsClientOptions>> PsClientsOf(const Config& config, const ClusterSpec& spec) {
  std::vector<PsClientOptions> out;
  for (int i = 0; i < spec.num_tasks(Role::kPs); ++i) {
    SW_ASSIGN_OR_RETURN(PsClientOptions o, MakePsClientOptions(config.cluster, spec, TaskId{Role::kPs, i}));
    o.max_attempts = AttemptsCovering(o, config.cluster.deadline_s);
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace shardwild
