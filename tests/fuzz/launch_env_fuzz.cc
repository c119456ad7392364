// libFuzzer target for the launchers' variables (net/launch_env.h): the
// input's lines are SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_NODELIST,
// SLURM_TASKS_PER_NODE, OMPI_COMM_WORLD_RANK, _SIZE and _LOCAL_SIZE (a
// missing line = unset). Any bytes give a Status, never an exception, a
// crash, undefined behaviour or a runaway expansion; and a world that
// parses is consistent (its rank inside it, one host per rank or none) and
// maps to a cluster spec whose task is that rank.
// Build with -DSHARDWILD_FUZZ=ON (clang), then e.g.
//   build-asan/tests/fuzz/launch_env_fuzz CORPUS_COPY -max_total_time=60
// from a copy of tests/fuzz/corpus/launch_env.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "net/cluster_spec.h"
#include "net/launch_env.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckWorld(const std::optional<shardwild::LaunchWorld>& w) {
  if (!w) return;
  Check(w->size > 1 && w->rank >= 0 && w->rank < w->size);
  Check(w->hosts.empty() || static_cast<int>(w->hosts.size()) == w->size);
  for (shardwild::TrainStrategy s : {shardwild::TrainStrategy::kPs, shardwild::TrainStrategy::kAllreduce}) {
    shardwild::ClusterOptions o;
    absl::StatusOr<shardwild::ClusterSpec> spec = shardwild::ClusterSpecOfWorld(*w, s, o);
    if (!spec.ok()) {
      Check(!spec.status().message().empty());
      continue;
    }
    Check(spec->task.has_value());
    int tasks = 0;
    for (const auto& list : spec->tasks) tasks += static_cast<int>(list.size());
    Check(tasks == w->size);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::optional<std::string>> f(7);
  size_t start = 0;
  for (size_t i = 0; i < f.size() && start <= text.size(); ++i) {
    const size_t end = text.find('\n', start);
    f[i] = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  shardwild::LaunchEnv env;
  env.slurm_procid = f[0];
  env.slurm_ntasks = f[1];
  env.slurm_nodelist = f[2];
  env.slurm_tasks_per_node = f[3];
  env.ompi_rank = f[4];
  env.ompi_size = f[5];
  env.ompi_local_size = f[6];
  for (auto* world : {&shardwild::SlurmWorld, &shardwild::MpiWorld}) {
    absl::StatusOr<std::optional<shardwild::LaunchWorld>> w = world(env);
    if (!w.ok()) {
      Check(!w.status().message().empty());
      continue;
    }
    CheckWorld(*w);
  }
  if (f[2]) {
    absl::StatusOr<std::vector<std::string>> hosts = shardwild::ExpandSlurmHostlist(*f[2], "K");
    if (hosts.ok()) {
      Check(!hosts->empty() && hosts->size() <= (size_t{1} << 20));
      for (const std::string& h : *hosts) Check(!h.empty());
    }
  }
  return 0;
}
