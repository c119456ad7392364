// train.strategy allreduce through the CLI: ranks as processes of the built
// binary on loopback (placed by Open MPI's variables, or by mpirun itself
// when Debian's openmpi-bin is installed). Skips without Fashion-MNIST.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>
#include <tuple>

#include "allreduce_ranks.h"
#include "cli_child.h"

namespace shardwild::clitest {
namespace {

using Clock = std::chrono::steady_clock;

// Waits for a child up to `limit`; whether it ended.
bool WaitFor(Child& c, std::chrono::seconds limit) {
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    if (c.Poll()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(AllreduceCli, ThreeRanksTrainOneModelOnEveryRecordOnce) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  // A fifth of the training set: enough to learn (chance is 0.1), and the
  // test runs under both sanitizers, where a full epoch of 3 ranks takes minutes.
  AllreduceRanks job(3, kConfig,
                     {"--set", "train.epochs=1", "--set", "train.workers=1", "--set", "data.max_train_records=12000"});
  std::string fingerprint;
  int64_t local_sum = 0;
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(WaitFor(job.rank(r), std::chrono::seconds(240))) << "rank " << r << " did not end";
    ASSERT_EQ(job.rank(r).Wait(), 0) << "rank " << r << ":\n" << job.rank(r).err() << job.rank(r).out();
    const json j = LastLineJson(job.rank(r).out());
    ASSERT_TRUE(j.is_object()) << job.rank(r).out();
    EXPECT_EQ(j["records_seen"], 12000) << "rank " << r;
    EXPECT_GT(j["test_accuracy"].get<double>(), 0.70) << "rank " << r;
    const json& a = j["allreduce"];
    EXPECT_EQ(a["rank"], r);
    EXPECT_EQ(a["world"], 3);
    EXPECT_EQ(a["source"], "Open MPI");
    EXPECT_EQ(a["rendezvous"], "127.0.0.1:" + std::to_string(job.base_port()));
    EXPECT_GT(a["payload_bytes"].get<double>(), 0);
    local_sum += a["local_records"].get<int64_t>();
    // Every rank ends with the same parameters, bit for bit.
    if (r == 0) fingerprint = a["params_fingerprint"];
    EXPECT_EQ(a["params_fingerprint"], fingerprint) << "rank " << r;
    EXPECT_NE(job.rank(r).out().find("parameters identical on every rank"), std::string::npos);
  }
  EXPECT_EQ(local_sum, 12000);
}

// cluster.allreduce_overlap: a collective per layer, each started while the
// layers below are differentiated, trains the same bits as one collective
// after the backward (two ranks: Gloo adds each element's two contributions
// alike either way), with two workers per rank handing layers over.
TEST(AllreduceCli, OverlappedLayersTrainTheSameBitsAsOneCollective) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  std::string fingerprint[2];
  for (int overlap = 0; overlap < 2; ++overlap) {
    AllreduceRanks job(2, kConfig,
                       {"--set", "train.epochs=1", "--set", "train.workers=2", "--set", "data.max_train_records=12000",
                        "--set", std::string("cluster.allreduce_overlap=") + (overlap ? "true" : "false")});
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(WaitFor(job.rank(r), std::chrono::seconds(240))) << "rank " << r << " did not end";
      ASSERT_EQ(job.rank(r).Wait(), 0) << "rank " << r << ":\n" << job.rank(r).err() << job.rank(r).out();
      const json j = LastLineJson(job.rank(r).out());
      ASSERT_TRUE(j.is_object()) << job.rank(r).out();
      EXPECT_EQ(j["records_seen"], 12000);
      // The default MLP's three layers, or the whole gradient at once.
      EXPECT_EQ(j["allreduce"]["buckets_per_round"], overlap ? 3 : 1);
      // Every layer of every worker's step went during its backward: 3 per
      // step of each worker's ~24 (12,000 records over 4 workers, batch 128).
      if (overlap) {
        EXPECT_GE(j["allreduce"]["buckets_during_backward"].get<int64_t>(), 3 * 2 * 23);
      } else {
        EXPECT_EQ(j["allreduce"]["buckets_during_backward"], 0);
      }
      if (r == 0) fingerprint[overlap] = j["allreduce"]["params_fingerprint"];
      EXPECT_EQ(j["allreduce"]["params_fingerprint"], fingerprint[overlap]) << "rank " << r;
    }
  }
  EXPECT_EQ(fingerprint[0], fingerprint[1]);
}

// The parameter fingerprints the ranks printed in `out` (mpirun's merged
// output), one per training rank.
std::vector<std::string> Fingerprints(const std::string& out) {
  std::vector<std::string> prints;
  for (const std::string& line : Lines(out)) {
    const size_t at = line.find("(fingerprint ");
    if (at != std::string::npos) prints.push_back(line.substr(at));
  }
  return prints;
}

// Debian's mpirun starting `np` ranks on this host (as root, Open MPI wants
// to be told that is meant).
std::vector<std::string> MpirunPrefix(int np) {
  return {"/usr/bin/env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_plm=isolated",
          "OMPI_MCA_btl_vader_single_copy_mechanism=none", "OMPI_MCA_rmaps_base_oversubscribe=1",
          "/usr/bin/mpirun", "-np", std::to_string(np), "--oversubscribe", "--bind-to", "none"};
}

// A --cluster spec of two allreduce ranks and one ps task on 127.0.0.1 at
// `ports`, written to dir/cluster.json; its path.
std::string WriteHybridSpec(const TempDir& dir, const std::vector<int>& ports) {
  const std::string spec = (dir.path() / "cluster.json").string();
  std::ofstream(spec) << "{\"cluster\": {\"worker\": [\"127.0.0.1:" << ports[0] << "\", \"127.0.0.1:" << ports[1]
                      << "\"], \"ps\": [\"127.0.0.1:" << ports[2] << "\"]}}";
  return spec;
}

// Generated Criteo-format data for the DLRM config (train.tsv, test.tsv).
void MakeCriteo(const TempDir& data, const std::string& rows) {
  for (const auto& [name, n, seed] : {std::tuple{"train.tsv", rows, "1"}, std::tuple{"test.tsv", std::string("2000"), "2"}}) {
    const Result r = RunCli({"data", "gen", "--kind", "criteo", "--rows", n, "--out", (data.path() / name).string(),
                             "--seed", seed});
    ASSERT_EQ(r.code(), 0) << r.err;
  }
}

std::vector<std::string> SmallDlrm(const TempDir& data, const std::string& job_name) {
  return {"--set", "data.train=" + (data.path() / "train.tsv").string(), "--set",
          "data.test=" + (data.path() / "test.tsv").string(), "--set", "model.sparse.0.rows=1000", "--set",
          "model.bottom.0.units=32", "--set", "model.layers.0.units=32", "--set", "train.workers=1", "--set",
          "train.intra_op_threads=1", "--set", "train.pin_threads=false", "--set", "train.epochs=2", "--set",
          "ps.job_name=" + job_name, "--set", "train.strategy=allreduce"};
}

// The hybrid: a DLRM's dense towers allreduced between two ranks, its
// embedding tables on a ps task both ranks push their rows to. Both ranks
// end with the same dense bits and evaluate the same tables: the same AUC,
// to the last digit (tables of their own would differ).
TEST(AllreduceCli, EmbeddingTablesLiveOnPsTasks) {
  TempDir data;
  MakeCriteo(data, "20000");
  const std::vector<int> ports = testing_ports::FreePorts(3);
  ASSERT_EQ(ports.size(), 3u);
  const std::string spec = WriteHybridSpec(data, ports);
  const std::string config = SHARDWILD_SOURCE_DIR "/configs/ctr_dlrm.yaml";
  const std::vector<std::string> sets = SmallDlrm(data, "ar-hybrid");
  auto args = [&](const std::string& command, const std::string& type, int index) {
    std::vector<std::string> a = {command, config, "--cluster", spec, "--task-type", type, "--task-index",
                                  std::to_string(index)};
    a.insert(a.end(), sets.begin(), sets.end());
    if (command == "train") a.push_back("--json");
    return a;
  };
  Child ps(args("serve", "ps", 0));
  Child rank0(args("train", "worker", 0)), rank1(args("train", "worker", 1));
  Child* ranks[2] = {&rank0, &rank1};
  json j[2];
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitFor(*ranks[r], std::chrono::seconds(300))) << "rank " << r << " did not end";
    ASSERT_EQ(ranks[r]->Wait(), 0) << "rank " << r << ":\n" << ranks[r]->err() << ranks[r]->out() << "\nps:\n"
                                   << ps.err() << ps.out();
    j[r] = LastLineJson(ranks[r]->out());
    ASSERT_TRUE(j[r].is_object()) << ranks[r]->out();
    EXPECT_EQ(j[r]["records_seen"], 2 * 20000);
    EXPECT_EQ(j[r]["allreduce"]["ps_tasks"], 1);
    EXPECT_GT(j[r]["test_auc"].get<double>(), 0.6) << j[r].dump();
  }
  EXPECT_NE(rank0.out().find("embedding tables on 1 ps task"), std::string::npos) << rank0.out();
  EXPECT_EQ(j[0]["allreduce"]["params_fingerprint"], j[1]["allreduce"]["params_fingerprint"]);
  EXPECT_EQ(j[0]["test_auc"].get<double>(), j[1]["test_auc"].get<double>());
  EXPECT_EQ(j[0]["test_loss"].get<double>(), j[1]["test_loss"].get<double>());
  kill(ps.pid(), SIGTERM);
  ps.Wait();
}

// Checkpoints of the hybrid: rank 0 writes the dense part, the ps task its
// tables (checkpoint.dir/ps-0). The job is killed (every process) after its
// first checkpoint, mid-epoch; a new ps task (fresh tables) and new ranks
// resume: rank 0 restores the tables to the dense part's step before any
// rank trains, and the job ends with every record of both epochs counted
// exactly once.
TEST(AllreduceCli, HybridCheckpointsResumeWithTheirTables) {
  TempDir data;
  MakeCriteo(data, "20000");
  const std::vector<int> ports = testing_ports::FreePorts(3);
  ASSERT_EQ(ports.size(), 3u);
  const std::string spec = WriteHybridSpec(data, ports);
  const std::string config = SHARDWILD_SOURCE_DIR "/configs/ctr_dlrm.yaml";
  const std::string ckpt = (data.path() / "ckpt").string();
  auto args = [&](const std::string& command, const std::string& type, int index) {
    std::vector<std::string> a = {command, config, "--cluster", spec, "--task-type", type, "--task-index",
                                  std::to_string(index)};
    const std::vector<std::string> sets = SmallDlrm(data, "ar-hybrid-ckpt");
    a.insert(a.end(), sets.begin(), sets.end());
    // 78 rounds an epoch (20,000 records over 2 ranks, batch 128).
    a.insert(a.end(), {"--set", "checkpoint.dir=" + ckpt, "--set", "checkpoint.every_steps=25", "--set",
                       "checkpoint.keep=2"});
    if (command == "train") a.push_back("--json");
    return a;
  };
  auto has_checkpoint = [&] {
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(ckpt, ec)) {
      if (e.path().filename().string().rfind("ckpt-", 0) == 0) return true;
    }
    return false;
  };
  bool killed = false;
  for (int run = 0; run < 2; ++run) {
    Child ps(args("serve", "ps", 0));
    Child rank0(args("train", "worker", 0)), rank1(args("train", "worker", 1));
    Child* ranks[2] = {&rank0, &rank1};
    if (run == 0) {
      const auto until = Clock::now() + std::chrono::seconds(300);
      while (Clock::now() < until && !has_checkpoint() && !rank0.Poll()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      ASSERT_TRUE(has_checkpoint()) << rank0.err() << rank0.out();
      killed = !rank0.Poll();
      for (Child* c : ranks) {
        if (c->running()) kill(c->pid(), SIGKILL);
        c->Wait();
      }
    } else {
      for (int r = 0; r < 2; ++r) {
        ASSERT_TRUE(WaitFor(*ranks[r], std::chrono::seconds(300))) << "rank " << r << " did not end";
        ASSERT_EQ(ranks[r]->Wait(), 0) << "rank " << r << ":\n" << ranks[r]->err() << ranks[r]->out() << "\nps:\n"
                                       << ps.err() << ps.out();
        const json j = LastLineJson(ranks[r]->out());
        ASSERT_TRUE(j.is_object()) << ranks[r]->out();
        EXPECT_EQ(j["records_seen"], 2 * 20000) << ranks[r]->out();
        EXPECT_GT(j["test_auc"].get<double>(), 0.6) << j.dump();
        EXPECT_NE(ranks[r]->out().find("resumed from"), std::string::npos) << ranks[r]->out();
      }
      EXPECT_NE(rank0.out().find("embedding tables on 1 ps task restored to step"), std::string::npos)
          << rank0.out();
    }
    kill(ps.pid(), SIGTERM);
    ps.Wait();
  }
  EXPECT_TRUE(killed) << "the first run ended before it could be killed after its first checkpoint";
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "ps-0"));
  // checkpoint.keep=2 reaches the ps task, which keeps one more (it saves
  // before rank 0 commits): the run saved more than that.
  int ps_checkpoints = 0;
  for (const auto& e : fs::directory_iterator(fs::path(ckpt) / "ps-0")) {
    if (e.path().filename().string().rfind("ckpt-", 0) == 0) ++ps_checkpoints;
  }
  EXPECT_EQ(ps_checkpoints, 3);
}

// Tables without ps tasks, and ps tasks without tables: one clear error on
// every rank.
TEST(AllreduceCli, TablesNeedPsTasksAndPsTasksNeedTables) {
  TempDir data;
  MakeCriteo(data, "1000");
  {
    AllreduceRanks job(2, SHARDWILD_SOURCE_DIR "/configs/ctr_dlrm.yaml", SmallDlrm(data, "ar-nops"));
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(WaitFor(job.rank(r), std::chrono::seconds(120))) << "rank " << r << " did not end";
      EXPECT_NE(job.rank(r).Wait(), 0);
      EXPECT_NE(job.rank(r).err().find("has no ps task for them"), std::string::npos) << job.rank(r).err();
    }
  }
  {
    // A ps task serving other tables (another table size) than the ranks'
    // model: the rank says which, before meeting the others.
    const std::vector<int> ports = testing_ports::FreePorts(3);
    ASSERT_EQ(ports.size(), 3u);
    const std::string spec = WriteHybridSpec(data, ports);
    const std::string config = SHARDWILD_SOURCE_DIR "/configs/ctr_dlrm.yaml";
    std::vector<std::string> ps_args = {"serve", config, "--cluster", spec, "--task-type", "ps", "--task-index", "0"};
    std::vector<std::string> rank_args = {"train", config, "--cluster", spec, "--task-type", "worker", "--task-index",
                                          "0"};
    const std::vector<std::string> sets = SmallDlrm(data, "ar-other-tables");
    ps_args.insert(ps_args.end(), sets.begin(), sets.end());
    ps_args.insert(ps_args.end(), {"--set", "model.sparse.0.rows=500"});
    rank_args.insert(rank_args.end(), sets.begin(), sets.end());
    Child ps(ps_args);
    const Result r = RunCli(rank_args);
    EXPECT_NE(r.code(), 0);
    EXPECT_NE(r.err.find("the ps tasks serve another model than this rank's config describes: table 0"),
              std::string::npos)
        << r.err;
    kill(ps.pid(), SIGTERM);
    ps.Wait();
  }
  if (!HaveFashionMnist()) return;
  const std::vector<int> ports = testing_ports::FreePorts(3);
  ASSERT_EQ(ports.size(), 3u);
  const std::string spec = WriteHybridSpec(data, ports);
  for (int r = 0; r < 2; ++r) {
    const Result res = RunCli({"train", kConfig, "--cluster", spec, "--task-type", "worker", "--task-index",
                               std::to_string(r), "--set", "train.strategy=allreduce", "--set", "train.epochs=1"});
    EXPECT_NE(res.code(), 0);
    EXPECT_NE(res.err.find("needs ps tasks only for embedding tables, and this model has none"), std::string::npos)
        << res.err;
  }
}

// cluster.allreduce_overlap auto: a collective per layer only where each
// rank of the host has a core its workers leave free (2 ranks of 1 worker:
// on 8 cores, not on 2).
TEST(AllreduceCli, OverlapAutoNeedsASpareCorePerRank) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  for (const int cores : {2, 8}) {
    AllreduceRanks job(2, kConfig,
                       {"--set", "train.epochs=1", "--set", "train.workers=1", "--set", "train.intra_op_threads=1",
                        "--set", "data.max_train_records=3000", "--set",
                        "topology.synthetic=pack:1 numa:1 core:" + std::to_string(cores) + " pu:1"});
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(WaitFor(job.rank(r), std::chrono::seconds(240))) << "rank " << r << " did not end";
      ASSERT_EQ(job.rank(r).Wait(), 0) << "rank " << r << ":\n" << job.rank(r).err() << job.rank(r).out();
      const json j = LastLineJson(job.rank(r).out());
      ASSERT_TRUE(j.is_object()) << job.rank(r).out();
      EXPECT_EQ(j["allreduce"]["buckets_per_round"], cores == 8 ? 3 : 1) << job.rank(r).out();
      const std::string why = std::to_string(cores) + " cores for 2 ranks on this host, 1 busy per rank: " +
                              (cores == 8 ? "a spare core" : "no spare core");
      EXPECT_NE(job.rank(r).out().find(why), std::string::npos) << job.rank(r).out();
    }
  }
}

TEST(AllreduceCli, ALayoutMismatchIsOneErrorOnEveryRank) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  TempDir dir;
  const std::string other = (dir.path() / "other.yaml").string();
  {
    std::ifstream in(kConfig);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    const size_t at = text.find("units: 128");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 10, "units: 100");
    std::ofstream(other) << text;
  }
  // Rank 1 trains another model: every rank stops before training.
  const auto start = Clock::now();
  std::vector<std::unique_ptr<Child>> ranks;
  const int port = testing_ports::FreePorts(1).at(0);
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::make_unique<Child>(
        std::vector<std::string>{"train", r == 1 ? other : std::string(kConfig), "--set", "train.strategy=allreduce",
                                 "--set", "cluster.base_port=" + std::to_string(port), "--set", "train.epochs=1"},
        std::vector<std::string>{"/usr/bin/env", "OMPI_COMM_WORLD_RANK=" + std::to_string(r),
                                 "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_SIZE=3"}));
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(WaitFor(*ranks[r], std::chrono::seconds(120))) << "rank " << r << " hangs";
    Result res;
    res.status = ranks[r]->Wait();
    res.err = ranks[r]->err();
    ExpectOneErrorLine(res, {"allreduce: the model layout (variables and their shapes) of rank 1 differs from rank 0's"});
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 120);
}

TEST(AllreduceCli, BadPlacementsAreOneClearError) {
  // A rank outside the world.
  Child outside({"train", kConfig, "--set", "train.strategy=allreduce"},
                {"/usr/bin/env", "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_SIZE=3"});
  Result r;
  r.status = outside.Wait();
  r.err = outside.err();
  ExpectOneErrorLine(r, {"OMPI_COMM_WORLD_RANK: rank 3 is outside the world of 3 ranks"});
  // Ranks on several hosts and no rendezvous.
  Child no_rendezvous({"train", kConfig, "--set", "train.strategy=allreduce"},
                      {"/usr/bin/env", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4",
                       "OMPI_COMM_WORLD_LOCAL_SIZE=2"});
  r.status = no_rendezvous.Wait();
  r.err = no_rendezvous.err();
  ExpectOneErrorLine(r, {"cluster.rendezvous: missing: Open MPI does not say which host rank 0 is on"});
  // A rendezvous nobody serves: rank 1 gives up after the deadline.
  const int port = testing_ports::FreePorts(1).at(0);
  Child alone({"train", kConfig, "--set", "train.strategy=allreduce", "--set", "cluster.collective_timeout_s=2",
               "--set", "cluster.base_port=" + std::to_string(port)},
              {"/usr/bin/env", "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2"});
  ASSERT_TRUE(WaitFor(alone, std::chrono::seconds(60))) << "a rank without peers hangs";
  r.status = alone.Wait();
  r.err = alone.err();
  ExpectOneErrorLine(r, {"allreduce: connecting over 2 ranks failed on rank 1", "rendezvous at 127.0.0.1:"});
  // Slurm's variables, malformed.
  Child slurm({"cluster-info", kConfig}, {"/usr/bin/env", "SLURM_PROCID=0", "SLURM_NTASKS=4",
                                          "SLURM_JOB_NODELIST=node[1-2", "SLURM_TASKS_PER_NODE=2(x2)"});
  r.status = slurm.Wait();
  r.err = slurm.err();
  ExpectOneErrorLine(r, {"SLURM_JOB_NODELIST: '[' without ']' in 'node[1-2'"});
}

// Waits until `child`'s stdout holds `text` (or it ends, or `limit`).
bool WaitForOutput(Child& child, const std::string& text, std::chrono::seconds limit) {
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    if (child.out().find(text) != std::string::npos) return true;
    if (child.Poll()) return child.out().find(text) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// cluster.ps_tasks under allreduce: the last ranks are ps tasks hosting the
// embedding tables. A rank that mpirun placed as a ps task serves on
// `train`; with TF_CONFIG naming a ps task, `train` is one error line before
// any data loads (the data here does not exist) and `serve` serves;
// cluster-info lists the ps tasks; a model without tables is an error on
// its ps task.
TEST(AllreduceCli, PsTasksHostTheEmbeddingTables) {
  TempDir dir;
  const std::string data = (dir.path() / "train.tsv").string();
  const Result gen = RunCli({"data", "gen", "--kind", "criteo", "--rows", "500", "--out", data, "--seed", "1"});
  ASSERT_EQ(gen.code(), 0) << gen.err;
  // Only the ps rank listens: rank 2 at base_port + 2.
  const int ps_port = testing_ports::FreePorts(1).at(0);
  const std::vector<std::string> dlrm = {
      SHARDWILD_SOURCE_DIR "/configs/ctr_dlrm.yaml", "--set", "train.strategy=allreduce",
      "--set", "cluster.ps_tasks=1", "--set", "model.sparse.0.rows=1000", "--set", "data.cache=false",
      "--set", "cluster.base_port=" + std::to_string(ps_port - 2), "--set", "ps.job_name=swtest-arps"};
  auto with = [](std::vector<std::string> head, const std::vector<std::string>& tail) {
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };
  const std::vector<std::string> mpi_ps = {"/usr/bin/env", "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=3",
                                           "OMPI_COMM_WORLD_LOCAL_SIZE=3"};
  const std::string tf_config = "TF_CONFIG={\"cluster\": {\"worker\": [\"127.0.0.1:" + std::to_string(ps_port - 2) +
                                "\", \"127.0.0.1:" + std::to_string(ps_port - 1) + "\"], \"ps\": [\"127.0.0.1:" +
                                std::to_string(ps_port) + "\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}";
  const std::string serving = "ps:0: serving shards [0, 1) of 1 (embedding tables only) on 127.0.0.1:" +
                              std::to_string(ps_port);
  {
    SCOPED_TRACE("train on a rank mpirun placed as ps:0");
    Child ps(with({"train"}, with(dlrm, {"--set", "data.train=" + data})), mpi_ps);
    ASSERT_TRUE(WaitForOutput(ps, serving, std::chrono::seconds(60))) << ps.out() << ps.err();
    kill(ps.pid(), SIGTERM);
    const int status = ps.Wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << ps.err();
  }
  {
    SCOPED_TRACE("serve with TF_CONFIG naming ps:0");
    Child ps(with({"serve"}, with(dlrm, {"--set", "data.train=" + data})), {"/usr/bin/env", tf_config});
    ASSERT_TRUE(WaitForOutput(ps, serving, std::chrono::seconds(60))) << ps.out() << ps.err();
    kill(ps.pid(), SIGTERM);
    const int status = ps.Wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << ps.err();
  }
  Result r;
  Child train_ps(with({"train"}, with(dlrm, {"--set", "data.train=/nonexistent/train.tsv"})),
                 {"/usr/bin/env", tf_config});
  r.status = train_ps.Wait();
  r.err = train_ps.err();
  ExpectOneErrorLine(r, {"TF_CONFIG: task.type: ps:0", "run `shardwild serve` for ps tasks"});
  // Too few ranks for the ps tasks.
  Child small(with({"train"}, with(dlrm, {"--set", "cluster.ps_tasks=2", "--set", "data.train=" + data})),
              {"/usr/bin/env", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2"});
  r.status = small.Wait();
  r.err = small.err();
  ExpectOneErrorLine(r, {"cluster.ps_tasks: Open MPI starts 2 ranks"});
  // cluster-info: two ranks and the ps task, with its shards.
  Child info(with({"cluster-info"}, dlrm), mpi_ps);
  ASSERT_EQ(info.Wait(), 0) << info.err();
  EXPECT_NE(info.out().find("2 ranks meeting at 127.0.0.1:" + std::to_string(ps_port - 2)), std::string::npos)
      << info.out();
  EXPECT_NE(info.out().find("ps tasks: 1, hosting the embedding tables over 1 shard"), std::string::npos)
      << info.out();
  EXPECT_NE(info.out().find("ps:0       127.0.0.1:" + std::to_string(ps_port) + "  shard 0"), std::string::npos)
      << info.out();
  EXPECT_NE(info.out().find("this task: ps:0, not a rank: hosts the embedding tables"), std::string::npos)
      << info.out();
  Child info_json(with({"cluster-info", "--json"}, dlrm), mpi_ps);
  ASSERT_EQ(info_json.Wait(), 0) << info_json.err();
  const json j = LastLineJson(info_json.out());
  ASSERT_TRUE(j.is_object()) << info_json.out();
  EXPECT_EQ(j["world"], 2);
  ASSERT_EQ(j["ps_tasks"].size(), 1u) << j.dump();
  EXPECT_EQ(j["ps_tasks"][0]["task"], "ps:0");
  EXPECT_EQ(j["ps_tasks"][0]["hosts"], "embedding tables");
  EXPECT_EQ(j["ps_tasks"][0]["shards"], json::array({0}));
  // A dense model has no tables for its ps task to host.
  if (HaveFashionMnist()) {
    Child dense({"train", kConfig, "--set", "train.strategy=allreduce", "--set", "cluster.ps_tasks=1", "--set",
                 "cluster.base_port=" + std::to_string(ps_port - 2), "--set", "ps.job_name=swtest-arps-dense"},
                mpi_ps);
    r.status = dense.Wait();
    r.err = dense.err();
    ExpectOneErrorLine(r, {"train.strategy allreduce: ps tasks host embedding tables; this model has none"});
  }
}

// Elastic membership: rank 2 of 3 is killed mid-epoch; ranks 0 and 1
// re-form, take what is left of the epoch, and finish with every record of
// every epoch trained once. A process started later joins the running job,
// takes its state and trains to the end with them.
TEST(AllreduceCli, AKilledRankIsLeftBehindAndANewcomerJoins) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  const std::vector<std::string> extra = {"--set", "train.epochs=3", "--set", "train.workers=1", "--set",
                                          "cluster.collective_timeout_s=30", "--set", "cluster.min_workers=2"};
  AllreduceRanks job(3, kConfig, extra);
  ASSERT_TRUE(WaitForOutput(job.rank(2), "epoch 1/3  step", std::chrono::seconds(120))) << job.rank(2).err();
  kill(job.rank(2).pid(), SIGKILL);
  job.rank(2).Wait();
  RemoveSegmentsOf("shardwild", job.rank(2).pid());  // the default ps.job_name
  // The survivors re-form as generation 1 (2 ranks); then a newcomer comes.
  ASSERT_TRUE(WaitForOutput(job.rank(0), "group generation 1: rank 0 of 2, 1 member(s) lost", std::chrono::seconds(60)))
      << "rank 0 " << job.rank(0).state() << ":\n"
      << job.rank(0).out() << job.rank(0).err();
  std::vector<std::string> args = {"train", kConfig, "--json", "--set", "train.strategy=allreduce", "--set",
                                   "cluster.base_port=" + std::to_string(job.base_port())};
  args.insert(args.end(), extra.begin(), extra.end());
  Child newcomer(args, {"/usr/bin/env", "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=3",
                        "OMPI_COMM_WORLD_LOCAL_SIZE=3"});
  std::string fingerprint;
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitFor(job.rank(r), std::chrono::seconds(300))) << "rank " << r << " hangs";
    ASSERT_EQ(job.rank(r).Wait(), 0) << "rank " << r << ":\n" << job.rank(r).err() << job.rank(r).out();
    const json j = LastLineJson(job.rank(r).out());
    ASSERT_TRUE(j.is_object()) << job.rank(r).out();
    // Every record of every epoch, once, over whichever members trained it.
    EXPECT_EQ(j["records_seen"], 3 * 60000) << "rank " << r;
    EXPECT_EQ(j["worker_failures"], 1) << "rank " << r;
    EXPECT_GE(j["membership_changes"].get<int>(), 2) << "rank " << r;  // the loss, then the newcomer
    EXPECT_GT(j["test_accuracy"].get<double>(), 0.83) << "rank " << r;
    if (r == 0) fingerprint = j["allreduce"]["params_fingerprint"];
    EXPECT_EQ(j["allreduce"]["params_fingerprint"], fingerprint) << "rank " << r;
    EXPECT_NE(job.rank(r).out().find("re-forming the group"), std::string::npos);
  }
  ASSERT_TRUE(WaitFor(newcomer, std::chrono::seconds(60)));
  ASSERT_EQ(newcomer.Wait(), 0) << newcomer.err() << newcomer.out();
  EXPECT_NE(newcomer.out().find("joined the running job at epoch"), std::string::npos) << newcomer.out();
  const json j = LastLineJson(newcomer.out());
  ASSERT_TRUE(j.is_object()) << newcomer.out();
  EXPECT_EQ(j["records_seen"], 3 * 60000);
  EXPECT_GT(j["allreduce"]["local_records"].get<int64_t>(), 0);  // it trained
  EXPECT_EQ(j["allreduce"]["world"], 3);
  EXPECT_EQ(j["allreduce"]["params_fingerprint"], fingerprint);
}

// The hybrid is elastic too: of 3 training ranks (and a 4th serving the
// tables, cluster.ps_tasks 1) one is killed mid-epoch; the others re-form,
// finish with every record counted once and the same dense bits, and the
// ps task exits when rank 0 is done.
TEST(AllreduceCli, AKilledRankOfTheHybridIsLeftBehind) {
  TempDir data;
  MakeCriteo(data, "60000");
  std::vector<std::string> extra = SmallDlrm(data, "ar-hybrid-kill");
  extra.insert(extra.end(), {"--set", "cluster.ps_tasks=1", "--set", "cluster.collective_timeout_s=30", "--set",
                             "train.log_every_s=0.05"});
  AllreduceRanks job(4, SHARDWILD_SOURCE_DIR "/configs/ctr_dlrm.yaml", extra);
  ASSERT_TRUE(WaitForOutput(job.rank(2), "epoch 1/2  step", std::chrono::seconds(120))) << job.rank(2).err();
  kill(job.rank(2).pid(), SIGKILL);
  job.rank(2).Wait();
  RemoveSegmentsOf("ar-hybrid-kill", job.rank(2).pid());
  std::string fingerprint;
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitFor(job.rank(r), std::chrono::seconds(300))) << "rank " << r << " hangs";
    ASSERT_EQ(job.rank(r).Wait(), 0) << "rank " << r << ":\n" << job.rank(r).err() << job.rank(r).out();
    const json j = LastLineJson(job.rank(r).out());
    ASSERT_TRUE(j.is_object()) << job.rank(r).out();
    EXPECT_EQ(j["records_seen"], 2 * 60000) << "rank " << r;
    EXPECT_EQ(j["worker_failures"], 1) << "rank " << r;
    EXPECT_GE(j["membership_changes"].get<int>(), 1) << "rank " << r;
    EXPECT_GT(j["test_auc"].get<double>(), 0.6) << "rank " << r;
    if (r == 0) fingerprint = j["allreduce"]["params_fingerprint"];
    EXPECT_EQ(j["allreduce"]["params_fingerprint"], fingerprint) << "rank " << r;
  }
  ASSERT_TRUE(WaitFor(job.rank(3), std::chrono::seconds(60))) << "the ps task did not exit:\n" << job.rank(3).out();
  EXPECT_EQ(job.rank(3).Wait(), 0) << job.rank(3).err();
}

// Too few left: cluster.min_workers stops the survivors with one error.
TEST(AllreduceCli, FewerThanMinWorkersStopsTheJob) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  AllreduceRanks job(2, kConfig,
                     {"--set", "train.epochs=3", "--set", "train.workers=1", "--set",
                      "cluster.collective_timeout_s=20", "--set", "cluster.min_workers=2"});
  ASSERT_TRUE(WaitForOutput(job.rank(1), "epoch 1/3  step", std::chrono::seconds(120))) << job.rank(1).err();
  kill(job.rank(1).pid(), SIGKILL);
  job.rank(1).Wait();
  RemoveSegmentsOf("shardwild", job.rank(1).pid());  // the default ps.job_name
  ASSERT_TRUE(WaitFor(job.rank(0), std::chrono::seconds(60))) << "rank 0 hangs";
  Result res;
  res.status = job.rank(0).Wait();
  res.err = job.rank(0).err();
  ExpectOneErrorLine(res, {"cluster.min_workers: 1 rank(s) left, fewer than the 2 the job needs"});
}

TEST(AllreduceCli, BenchTimesTheCollectiveAgainstLoopbackTcp) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  const int port = testing_ports::FreePorts(1).at(0);
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<Child>(
        std::vector<std::string>{"bench", kConfig, "--json", "--set", "train.strategy=allreduce", "--set",
                                 "bench.steps=50", "--set", "cluster.base_port=" + std::to_string(port)},
        std::vector<std::string>{"/usr/bin/env", "OMPI_COMM_WORLD_RANK=" + std::to_string(r), "OMPI_COMM_WORLD_SIZE=2",
                                 "OMPI_COMM_WORLD_LOCAL_SIZE=2"}));
  }
  double tcp = -1;
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitFor(*ranks[r], std::chrono::seconds(120)));
    ASSERT_EQ(ranks[r]->Wait(), 0) << ranks[r]->err();
    const json j = LastLineJson(ranks[r]->out());
    ASSERT_TRUE(j.is_object()) << ranks[r]->out();
    EXPECT_EQ(j["rank"], r);
    EXPECT_EQ(j["world"], 2);
    EXPECT_EQ(j["iterations"], 50);
    // The default MLP's dense variables (784*256+256 + 256*128+128 + 128*10+10) and the round's two extras.
    EXPECT_EQ(j["floats"], 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10 + 2);
    EXPECT_GT(j["bus_bytes_per_s"].get<double>(), 0);
    EXPECT_GT(j["tcp_loopback_bytes_per_s"].get<double>(), 0);
    // The bound is rank 0's measurement, the same figure on every rank.
    if (r == 0) tcp = j["tcp_loopback_bytes_per_s"];
    EXPECT_EQ(j["tcp_loopback_bytes_per_s"].get<double>(), tcp);
    EXPECT_NEAR(j["bus_fraction_of_tcp"].get<double>(),
                j["bus_bytes_per_s"].get<double>() / j["tcp_loopback_bytes_per_s"].get<double>(), 1e-9);
  }
}

TEST(AllreduceCli, MpirunStartsTheRanks) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  if (!fs::exists("/usr/bin/mpirun")) GTEST_SKIP() << "mpirun (Debian's openmpi-bin) is not installed";
  const int port = testing_ports::FreePorts(1).at(0);
  Child run({"train", kConfig, "--set", "train.strategy=allreduce", "--set", "train.epochs=1", "--set",
             "data.max_train_records=12000", "--set", "train.workers=1", "--set",
             "cluster.base_port=" + std::to_string(port)},
            MpirunPrefix(2));
  ASSERT_TRUE(WaitFor(run, std::chrono::seconds(240))) << "mpirun did not end";
  ASSERT_EQ(run.Wait(), 0) << run.err() << run.out();
  const std::string out = run.out();
  EXPECT_NE(out.find("allreduce: rank 0 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("allreduce: rank 1 of 2"), std::string::npos) << out;
  const std::vector<std::string> prints = Fingerprints(out);
  ASSERT_EQ(prints.size(), 2u) << out;
  EXPECT_EQ(prints[0], prints[1]);
}

// The hybrid under the real mpirun: of 3 ranks the last serves the
// embedding tables (cluster.ps_tasks 1), the other two train; when they are
// done rank 0 tells the ps task, which exits, so mpirun returns.
TEST(AllreduceCli, MpirunRunsTheHybridAndItsPsTaskExits) {
  if (!fs::exists("/usr/bin/mpirun")) GTEST_SKIP() << "mpirun (Debian's openmpi-bin) is not installed";
  TempDir data;
  MakeCriteo(data, "20000");
  const int port = testing_ports::FreePorts(1).at(0);
  std::vector<std::string> args = {"train", SHARDWILD_SOURCE_DIR "/configs/ctr_dlrm.yaml", "--set",
                                   "cluster.ps_tasks=1", "--set", "cluster.base_port=" + std::to_string(port)};
  const std::vector<std::string> sets = SmallDlrm(data, "ar-mpirun-hybrid");
  args.insert(args.end(), sets.begin(), sets.end());
  Child run(args, MpirunPrefix(3));
  ASSERT_TRUE(WaitFor(run, std::chrono::seconds(300))) << "mpirun did not end:\n" << run.out() << run.err();
  ASSERT_EQ(run.Wait(), 0) << run.err() << run.out();
  const std::string out = run.out();
  EXPECT_NE(out.find("allreduce: rank 0 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("allreduce: rank 1 of 2"), std::string::npos) << out;
  EXPECT_NE(out.find("(embedding tables only)"), std::string::npos) << out;
  EXPECT_NE(out.find("ps:0 is told the job is done and exits"), std::string::npos) << out;
  EXPECT_NE(out.find("ps:0: the job is done; stopping"), std::string::npos) << out;
  const std::vector<std::string> prints = Fingerprints(out);
  ASSERT_EQ(prints.size(), 2u) << out;
  EXPECT_EQ(prints[0], prints[1]);
}

// train.strategy ps under the real mpirun: rank 0 the chief, rank 1 the ps
// task, rank 2 a worker task; when the chief is done the worker task exits
// and the chief tells the ps task, which exits too, so mpirun returns.
TEST(AllreduceCli, MpirunRunsAPsStrategyJobToItsEnd) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  if (!fs::exists("/usr/bin/mpirun")) GTEST_SKIP() << "mpirun (Debian's openmpi-bin) is not installed";
  const int port = testing_ports::FreePorts(1).at(0);
  Child run({"train", kConfig, "--json", "--set", "train.epochs=1", "--set", "data.max_train_records=12000", "--set",
             "train.workers=1", "--set", "ps.job_name=mpirun-ps", "--set", "cluster.base_port=" + std::to_string(port)},
            MpirunPrefix(3));
  ASSERT_TRUE(WaitFor(run, std::chrono::seconds(300))) << "mpirun did not end:\n" << run.out() << run.err();
  ASSERT_EQ(run.Wait(), 0) << run.err() << run.out();
  const std::string out = run.out();
  EXPECT_NE(out.find("ps:0 is told the job is done and exits"), std::string::npos) << out;
  EXPECT_NE(out.find("ps:0: the job is done; stopping"), std::string::npos) << out;
  EXPECT_NE(out.find("\"records_seen\":12000"), std::string::npos) << out;
}

}  // namespace
}  // namespace shardwild::clitest
