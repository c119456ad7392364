// Launchers (net/launch_env.h): Slurm's and Open MPI's variables turned into
// cluster specs, and ResolveClusterSpec's choice among the sources. No
// network, no environment: every variable is given in a LaunchEnv.
#include "net/launch_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "net/cluster_spec.h"

namespace shardwild {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SlurmHostlist, ExpandsRangesListsAndPadding) {
  auto h = ExpandSlurmHostlist("node[01-03,07],gpu5", "K");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(*h, ElementsAre("node01", "node02", "node03", "node07", "gpu5"));
  h = ExpandSlurmHostlist("rack[1-2]-n[8-9]", "K");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(*h, ElementsAre("rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"));
  h = ExpandSlurmHostlist("a[098-101]", "K");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(*h, ElementsAre("a098", "a099", "a100", "a101"));
  h = ExpandSlurmHostlist("solo", "K");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(*h, ElementsAre("solo"));
}

TEST(SlurmHostlist, RejectsMalformedLists) {
  for (const char* bad : {"node[1-3", "node1-3]", "node[3-1]", "node[a-b]", "a,,b", "", "n[[1]]", "n[1-]"}) {
    auto h = ExpandSlurmHostlist(bad, "SLURM_JOB_NODELIST");
    ASSERT_FALSE(h.ok()) << bad;
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(h.status().message(), HasSubstr("SLURM_JOB_NODELIST: ")) << bad;
  }
}

TEST(SlurmHostlist, ARunawayExpansionIsAnError) {
  // Ten billion names: an error, not the machine's memory.
  auto h = ExpandSlurmHostlist("a[0-99999]b[0-99999]", "SLURM_JOB_NODELIST");
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(h.status().message(), HasSubstr("expands to more than 1048576 hosts"));
  std::string many;
  for (int i = 0; i < 11; ++i) absl::StrAppend(&many, i ? "," : "", "n", i, "[0-99999]");
  h = ExpandSlurmHostlist(many, "SLURM_JOB_NODELIST");
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(h.status().message(), HasSubstr("expands to more than 1048576 hosts"));
  std::string counts;
  for (int i = 0; i < 11; ++i) absl::StrAppend(&counts, i ? "," : "", "1(x100000)");
  auto t = ParseSlurmTasksPerNode(counts, "SLURM_TASKS_PER_NODE");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("gives more than 1048576 nodes"));
}

TEST(SlurmTasksPerNode, ExpandsRepeats) {
  auto t = ParseSlurmTasksPerNode("2(x3),1", "K");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(*t, ElementsAre(2, 2, 2, 1));
  t = ParseSlurmTasksPerNode("4", "K");
  ASSERT_TRUE(t.ok());
  EXPECT_THAT(*t, ElementsAre(4));
  for (const char* bad : {"", "0", "2(x0)", "2(3)", "x", "2(x3", "-1"}) {
    EXPECT_FALSE(ParseSlurmTasksPerNode(bad, "K").ok()) << bad;
  }
}

LaunchEnv Slurm(const char* rank, const char* ntasks, const char* nodes, const char* per_node) {
  LaunchEnv e;
  e.slurm_procid = rank;
  e.slurm_ntasks = ntasks;
  if (nodes) e.slurm_nodelist = nodes;
  if (per_node) e.slurm_tasks_per_node = per_node;
  return e;
}

LaunchEnv Mpi(const char* rank, const char* size, const char* local_size) {
  LaunchEnv e;
  e.ompi_rank = rank;
  e.ompi_size = size;
  if (local_size) e.ompi_local_size = local_size;
  return e;
}

TEST(SlurmWorld, PlacesRanksBlockByBlock) {
  auto w = SlurmWorld(Slurm("3", "5", "n[1-3]", "2(x2),1"));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->has_value());
  EXPECT_EQ((*w)->rank, 3);
  EXPECT_EQ((*w)->size, 5);
  EXPECT_EQ((*w)->source, "Slurm");
  EXPECT_THAT((*w)->hosts, ElementsAre("n1", "n1", "n2", "n2", "n3"));
}

TEST(SlurmWorld, OneRankOrNoVariablesIsNoCluster) {
  auto w = SlurmWorld(Slurm("0", "1", "n1", "1"));
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE(w->has_value());
  w = SlurmWorld(LaunchEnv{});
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE(w->has_value());
}

TEST(SlurmWorld, BadVariablesAreOneClearError) {
  auto w = SlurmWorld(Slurm("4", "4", "n1", "4"));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("SLURM_PROCID: rank 4 is outside the world of 4 ranks"));
  w = SlurmWorld(Slurm("0", "4", "n[1-2]", "2(x3)"));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("SLURM_TASKS_PER_NODE: gives 3 node(s)"));
  w = SlurmWorld(Slurm("0", "5", "n[1-2]", "2,2"));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("places 4 tasks, but SLURM_NTASKS is 5"));
  w = SlurmWorld(Slurm("0", "4", "n[1-2]", nullptr));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("SLURM_TASKS_PER_NODE: missing"));
  w = SlurmWorld(Slurm("0", "4", nullptr, nullptr));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("SLURM_JOB_NODELIST: missing"));
  w = SlurmWorld(Slurm("x", "4", "n1", nullptr));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("SLURM_PROCID: expected an integer >= 0, got 'x'"));
  // One node, no tasks per node: every rank there.
  w = SlurmWorld(Slurm("1", "3", "solo", nullptr));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT((*w)->hosts, ElementsAre("solo", "solo", "solo"));
}

TEST(MpiWorld, RankSizeAndLocalHosts) {
  auto w = MpiWorld(Mpi("1", "2", "2"));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->has_value());
  EXPECT_EQ((*w)->source, "Open MPI");
  EXPECT_THAT((*w)->hosts, ElementsAre("127.0.0.1", "127.0.0.1"));
  w = MpiWorld(Mpi("1", "4", "2"));  // two hosts: which ones, Open MPI does not say
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE((*w)->hosts.empty());
  w = MpiWorld(Mpi("2", "2", "2"));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("OMPI_COMM_WORLD_RANK: rank 2 is outside the world of 2 ranks"));
  w = MpiWorld(Mpi("0", "2", "3"));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("OMPI_COMM_WORLD_LOCAL_SIZE"));
}

TEST(ClusterSpecOfWorld, PsStrategyMapsChiefPsWorkers) {
  LaunchWorld w{"Slurm", 2, 5, {"a", "a", "b", "b", "c"}};
  ClusterOptions o;
  o.base_port = 3000;
  o.ps_tasks = 2;
  auto spec = ClusterSpecOfWorld(w, TrainStrategy::kPs, o);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->address({Role::kChief, 0}).ToString(), "a:3000");
  ASSERT_EQ(spec->num_tasks(Role::kPs), 2);
  EXPECT_EQ(spec->address({Role::kPs, 1}).ToString(), "b:3002");
  ASSERT_EQ(spec->num_tasks(Role::kWorker), 2);
  EXPECT_EQ(spec->address({Role::kWorker, 1}).ToString(), "c:3004");
  ASSERT_TRUE(spec->task);
  EXPECT_EQ(spec->task->ToString(), "ps:1");
  w.rank = 4;
  spec = ClusterSpecOfWorld(w, TrainStrategy::kPs, o);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->task->ToString(), "worker:1");
}

TEST(ClusterSpecOfWorld, TooSmallUnknownHostsAndPortOverflow) {
  ClusterOptions o;
  o.ps_tasks = 1;
  auto spec = ClusterSpecOfWorld(LaunchWorld{"Slurm", 0, 2, {"a", "a"}}, TrainStrategy::kPs, o);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("cluster.ps_tasks: Slurm starts 2 ranks"));
  spec = ClusterSpecOfWorld(LaunchWorld{"Open MPI", 0, 4, {}}, TrainStrategy::kPs, o);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("does not say which host each rank runs on"));
  o.base_port = 65534;
  spec = ClusterSpecOfWorld(LaunchWorld{"Slurm", 0, 3, {"a", "a", "a"}}, TrainStrategy::kAllreduce, o);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("cluster.base_port: 65534 + 2 ranks would pass port 65535"));
}

// Allreduce with cluster.ps_tasks P > 0: the first size - P ranks train
// (rank 0 still first, so the rendezvous does not move), the last P are the
// ps tasks, each at its host and base_port + rank.
TEST(ClusterSpecOfWorld, AllreducePutsThePsTasksLast) {
  LaunchWorld w{"Slurm", 0, 5, {"a", "a", "b", "b", "c"}};
  ClusterOptions o;
  o.base_port = 3000;
  o.ps_tasks = 2;
  const std::pair<int, const char*> expected[] = {{0, "worker:0"}, {2, "worker:2"}, {3, "ps:0"}, {4, "ps:1"}};
  for (const auto& [rank, task] : expected) {
    w.rank = rank;
    auto spec = ClusterSpecOfWorld(w, TrainStrategy::kAllreduce, o);
    ASSERT_TRUE(spec.ok()) << spec.status();
    ASSERT_TRUE(spec->task);
    EXPECT_EQ(spec->task->ToString(), task);
    EXPECT_EQ(spec->num_tasks(Role::kChief), 0);
    ASSERT_EQ(spec->num_tasks(Role::kWorker), 3);
    ASSERT_EQ(spec->num_tasks(Role::kPs), 2);
    EXPECT_EQ(spec->address({Role::kWorker, 0}).ToString(), "a:3000");
    EXPECT_EQ(spec->address({Role::kWorker, 2}).ToString(), "b:3002");
    EXPECT_EQ(spec->address({Role::kPs, 0}).ToString(), "b:3003");
    EXPECT_EQ(spec->address({Role::kPs, 1}).ToString(), "c:3004");
    EXPECT_EQ(AllreduceWorldSize(*spec), 3);
    EXPECT_EQ(AllreduceTaskOfRank(*spec, 0).ToString(), "worker:0");
  }
  // Open MPI on one host: loopback addresses, the same placement.
  auto mpi = MpiWorld(Mpi("3", "4", "4"));
  ASSERT_TRUE(mpi.ok() && mpi->has_value()) << mpi.status();
  o.ps_tasks = 1;
  auto spec = ClusterSpecOfWorld(**mpi, TrainStrategy::kAllreduce, o);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->task->ToString(), "ps:0");
  EXPECT_EQ(spec->address({Role::kPs, 0}).ToString(), "127.0.0.1:3003");
  EXPECT_EQ(AllreduceWorldSize(*spec), 3);
}

TEST(ClusterSpecOfWorld, AllreduceWithoutPsTasksIsEveryRankAWorker) {
  LaunchWorld w{"Slurm", 2, 3, {"a", "a", "b"}};
  for (int ps_tasks : {-1, 0}) {  // auto is 0 under allreduce
    SCOPED_TRACE(ps_tasks);
    ClusterOptions o;
    o.ps_tasks = ps_tasks;
    auto spec = ClusterSpecOfWorld(w, TrainStrategy::kAllreduce, o);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->task->ToString(), "worker:2");
    EXPECT_EQ(spec->num_tasks(Role::kPs), 0);
    EXPECT_EQ(spec->num_tasks(Role::kWorker), 3);
    EXPECT_EQ(spec->address({Role::kWorker, 2}).ToString(), "b:2224");
  }
  // Hosts unknown (Open MPI across hosts) are fine without ps tasks.
  auto spec = ClusterSpecOfWorld(LaunchWorld{"Open MPI", 1, 4, {}}, TrainStrategy::kAllreduce, ClusterOptions());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->task->ToString(), "worker:1");
}

TEST(ClusterSpecOfWorld, AllreducePsTasksNeedARankToTrainAndTheirHosts) {
  ClusterOptions o;
  o.ps_tasks = 2;
  auto spec = ClusterSpecOfWorld(LaunchWorld{"Slurm", 0, 2, {"a", "b"}}, TrainStrategy::kAllreduce, o);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(),
              HasSubstr("cluster.ps_tasks: Slurm starts 2 ranks; train.strategy allreduce with 2 ps task(s) needs at "
                        "least one more rank to train (3 ranks)"));
  spec = ClusterSpecOfWorld(LaunchWorld{"Open MPI", 0, 2, {"127.0.0.1", "127.0.0.1"}}, TrainStrategy::kAllreduce, o);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("cluster.ps_tasks: Open MPI starts 2 ranks"));
  spec = ClusterSpecOfWorld(LaunchWorld{"Open MPI", 0, 4, {}}, TrainStrategy::kAllreduce, o);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(),
              HasSubstr("cluster.ps_tasks: Open MPI does not say which host each rank runs on"));
  // Under ps, auto is one ps task, and 0 is refused.
  o.ps_tasks = -1;
  spec = ClusterSpecOfWorld(LaunchWorld{"Slurm", 1, 3, {"a", "a", "a"}}, TrainStrategy::kPs, o);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->task->ToString(), "ps:0");
  o.ps_tasks = 0;
  spec = ClusterSpecOfWorld(LaunchWorld{"Slurm", 1, 3, {"a", "a", "a"}}, TrainStrategy::kPs, o);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("cluster.ps_tasks: train.strategy ps needs at least one ps task"));
}

ClusterSpecSources Sources(TrainStrategy strategy, LaunchEnv env) {
  ClusterSpecSources s;
  s.strategy = strategy;
  s.env = std::move(env);
  return s;
}

TEST(ResolveClusterSpec, AllreduceOverSlurmMeetsAtRankZero) {
  ClusterSpecSources s = Sources(TrainStrategy::kAllreduce, Slurm("1", "3", "n[1-2]", "2,1"));
  s.options.base_port = 4000;
  auto spec = ResolveClusterSpec(s);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->source, "Slurm");
  EXPECT_EQ(AllreduceWorldSize(*spec), 3);
  EXPECT_EQ(AllreduceRankOf(*spec, *spec->task), 1);
  ASSERT_TRUE(spec->rendezvous);
  EXPECT_EQ(spec->rendezvous->ToString(), "n1:4000");
  s.options.rendezvous = "head:7000";
  spec = ResolveClusterSpec(s);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->rendezvous->ToString(), "head:7000");
  s.options.rendezvous = "head";
  spec = ResolveClusterSpec(s);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("cluster.rendezvous: "));
}

// Resolved through the sources: the ps tasks do not move the rendezvous
// (rank 0's address), and a ps rank's own task is its ps task.
TEST(ResolveClusterSpec, AllreducePsTasksOverSlurmAndOpenMpi) {
  ClusterSpecSources s = Sources(TrainStrategy::kAllreduce, Slurm("3", "4", "n[1-2]", "2,2"));
  s.options.base_port = 4000;
  s.options.ps_tasks = 1;
  auto spec = ResolveClusterSpec(s);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->task->ToString(), "ps:0");
  EXPECT_EQ(spec->address(*spec->task).ToString(), "n2:4003");
  EXPECT_FALSE(AllreduceRankOf(*spec, *spec->task));
  EXPECT_EQ(AllreduceWorldSize(*spec), 3);
  ASSERT_TRUE(spec->rendezvous);
  EXPECT_EQ(spec->rendezvous->ToString(), "n1:4000");
  s = Sources(TrainStrategy::kAllreduce, Mpi("1", "3", "3"));
  s.options.ps_tasks = 1;
  spec = ResolveClusterSpec(s);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->task->ToString(), "worker:1");
  EXPECT_EQ(spec->rendezvous->ToString(), "127.0.0.1:2222");
  EXPECT_EQ(spec->address({Role::kPs, 0}).ToString(), "127.0.0.1:2224");
}

TEST(ResolveClusterSpec, MpiAcrossHostsNeedsARendezvous) {
  ClusterSpecSources s = Sources(TrainStrategy::kAllreduce, Mpi("0", "4", "2"));
  auto spec = ResolveClusterSpec(s);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("cluster.rendezvous: missing: Open MPI does not say"));
  s.options.rendezvous = "10.0.0.1:29500";
  spec = ResolveClusterSpec(s);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->rendezvous->ToString(), "10.0.0.1:29500");
  // On one host: loopback, rank 0's port.
  spec = ResolveClusterSpec(Sources(TrainStrategy::kAllreduce, Mpi("1", "2", "2")));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->rendezvous->ToString(), "127.0.0.1:2222");
  EXPECT_EQ(spec->task->ToString(), "worker:1");
}

TEST(ResolveClusterSpec, SourcesInOrderAndTheLauncherKey) {
  const std::string tf = R"({"cluster": {"chief": ["h:1"], "ps": ["h:2"], "worker": ["h:3"]},
                             "task": {"type": "worker", "index": 0}})";
  ClusterSpecSources s = Sources(TrainStrategy::kPs, Slurm("1", "3", "n1", "3"));
  s.tf_config = tf;
  auto spec = ResolveClusterSpec(s);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->source, "TF_CONFIG");  // TF_CONFIG before Slurm
  s.options.launcher = ClusterLauncher::kSlurm;
  spec = ResolveClusterSpec(s);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->source, "Slurm");
  EXPECT_EQ(spec->task->ToString(), "ps:0");
  s.options.launcher = ClusterLauncher::kNone;
  auto has = HasClusterSource(s);
  ASSERT_TRUE(has.ok());
  EXPECT_FALSE(*has);
  EXPECT_EQ(ResolveClusterSpec(s).status().code(), absl::StatusCode::kNotFound);
  // Slurm before Open MPI; a world of one is no cluster.
  s = Sources(TrainStrategy::kPs, Slurm("0", "1", "n1", "1"));
  has = HasClusterSource(s);
  ASSERT_TRUE(has.ok());
  EXPECT_FALSE(*has);
  s.env.ompi_rank = "0";
  s.env.ompi_size = "3";
  s.env.ompi_local_size = "3";
  spec = ResolveClusterSpec(s);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->source, "Open MPI");
  EXPECT_EQ(spec->task->ToString(), "chief:0");
  // A malformed variable is an error even when asking whether there is a cluster.
  s = Sources(TrainStrategy::kPs, Slurm("7", "3", "n1", "3"));
  EXPECT_THAT(HasClusterSource(s).status().message(), HasSubstr("SLURM_PROCID: rank 7 is outside"));
}

TEST(ParseClusterSpec, AllreduceNeedsNoPsAndMayLackAChief) {
  auto spec = ParseClusterSpec(R"({"cluster": {"worker": ["h:1", "h:2", "h:3"]}, "task": {"type": "worker",
                                   "index": 2}})",
                               "TF_CONFIG", TrainStrategy::kAllreduce);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(AllreduceWorldSize(*spec), 3);
  EXPECT_EQ(AllreduceRankOf(*spec, *spec->task), 2);
  EXPECT_EQ(AllreduceTaskOfRank(*spec, 0).ToString(), "worker:0");
  spec = ParseClusterSpec(R"({"cluster": {"chief": ["h:1"], "worker": ["h:2"]}})", "TF_CONFIG",
                          TrainStrategy::kAllreduce);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(AllreduceRankOf(*spec, {Role::kWorker, 0}), 1);
  EXPECT_EQ(AllreduceTaskOfRank(*spec, 0).ToString(), "chief:0");
  EXPECT_FALSE(AllreduceRankOf(*spec, {Role::kPs, 0}));
  // The ps strategy still needs its ps tasks; allreduce needs a rank.
  EXPECT_FALSE(ParseClusterSpec(R"({"cluster": {"chief": ["h:1"], "worker": ["h:2"]}})", "TF_CONFIG").ok());
  auto bad = ParseClusterSpec(R"({"cluster": {"ps": ["h:1"]}})", "TF_CONFIG", TrainStrategy::kAllreduce);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("TF_CONFIG: cluster.worker: missing"));
}

}  // namespace
}  // namespace shardwild
