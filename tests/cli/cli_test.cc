// End-to-end tests of the `shardwild` command line: they run the built binary
// (SHARDWILD_BINARY) as a child process, with stdout and stderr captured in
// separate files, and check its output and exit status.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_child.h"
#include "gtest/gtest.h"
#include "ps_shm/shm_store.h"

extern char** environ;

namespace shardwild {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using namespace clitest;

TEST(CliTest, Version) {
  const Result r = RunCli({"--version"});
  EXPECT_EQ(r.code(), 0) << r.err;
  EXPECT_EQ(r.out.rfind("shardwild ", 0), 0u) << r.out;
  EXPECT_EQ(Lines(r.out).size(), 1u) << r.out;
}

TEST(CliTest, HelpForEverySubcommand) {
  for (const std::string sub : {"train", "bench", "topology"}) {
    SCOPED_TRACE(sub);
    const Result r = RunCli({sub, "--help"});
    EXPECT_EQ(r.code(), 0) << r.err;
    EXPECT_NE(r.out.find("--json"), std::string::npos) << r.out;
    if (sub == "topology") {
      EXPECT_NE(r.out.find("--synthetic"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("--workers"), std::string::npos) << r.out;
    } else {
      EXPECT_NE(r.out.find("--set"), std::string::npos) << r.out;
    }
  }
  const Result top = RunCli({"--help"});
  EXPECT_EQ(top.code(), 0) << top.err;
  for (const char* sub : {"train", "bench", "topology"}) EXPECT_NE(top.out.find(sub), std::string::npos) << top.out;
}

// Usage errors keep the error contract too.
TEST(CliTest, UsageErrorsAreOneLine) {
  ExpectOneErrorLine(RunCli({}), {"subcommand"});
  ExpectOneErrorLine(RunCli({"frobnicate"}), {"subcommand"});
  ExpectOneErrorLine(RunCli({"train"}), {"config"});
  ExpectOneErrorLine(RunCli({"train", kConfig, "extra_argument"}), {"extra_argument"});
  ExpectOneErrorLine(RunCli({"topology", "--workers", "-1"}), {"--workers"});
}

TEST(CliTest, MissingConfigFile) {
  const std::string path = "/nonexistent/shardwild/no_such_config.yaml";
  const Result r = RunCli({"train", path});
  ExpectOneErrorLine(r, {path});
}

TEST(CliTest, UnknownConfigKeyNamesFileLineAndKey) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = (dir.path() / "typo.yaml").string();
  std::ofstream(path) << "model:\n"
                         "  layers:\n"
                         "    - {type: dense, units: 10}\n"
                         "data:\n"
                         "  train: /usr/share/datasets/fashion-mnist/train\n"
                         "train:\n"
                         "  epochs: 1\n"
                         "  wrokers: 2\n";
  const Result r = RunCli({"train", path});
  ExpectOneErrorLine(r, {path + ":8:", "train.wrokers"});
}

TEST(CliTest, BadSetValueNamesTheOverride) {
  const Result r = RunCli({"train", kConfig, "--set", "train.epochs=abc"});
  ExpectOneErrorLine(r, {"--set train.epochs=abc", "train.epochs"});
}

TEST(CliTest, SetWithoutEqualsSign) {
  const Result r = RunCli({"train", kConfig, "--set", "train.epochs"});
  ExpectOneErrorLine(r, {"--set train.epochs", "key=value"});
}

TEST(CliTest, TopologySyntheticJson) {
  const Result r = RunCli({"topology", "--synthetic", "pack:2 numa:1 core:4 pu:1", "--workers", "4", "--json"});
  ASSERT_EQ(r.code(), 0) << r.err;
  EXPECT_EQ(r.err, "");
  const json j = LastLineJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["numa_nodes"], 2);
  EXPECT_EQ(j["packages"], 2);
  EXPECT_EQ(j["cores"], 8);
  ASSERT_TRUE(j["nodes"].is_array());
  ASSERT_EQ(j["nodes"].size(), 2u);
  EXPECT_EQ(j["nodes"][0]["cores"], json({0, 1, 2, 3}));
  EXPECT_EQ(j["nodes"][1]["cores"], json({4, 5, 6, 7}));
  const json& p = j["placement"];
  ASSERT_TRUE(p.is_object()) << r.out;
  ASSERT_EQ(p["workers"].size(), 4u);
  const int expected_nodes[] = {0, 0, 1, 1};
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(p["workers"][w]["node"], expected_nodes[w]) << "worker " << w;
    EXPECT_EQ(p["workers"][w]["cores"].size(), 2u) << "8 cores / 4 workers";
  }
  EXPECT_EQ(p["threads_per_worker"], 2);
  EXPECT_EQ(p["shard_nodes"], json({0, 1}));
  EXPECT_EQ(p["oversubscribed"], false);
}

TEST(CliTest, TopologyText) {
  const Result r = RunCli({"topology", "--synthetic", "pack:2 numa:1 core:4 pu:1", "--workers", "4", "--threads", "4"});
  ASSERT_EQ(r.code(), 0) << r.err;
  EXPECT_NE(r.out.find("2 NUMA nodes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("oversubscribed"), std::string::npos) << r.out;
}

TEST(CliTest, TopologyOfThisMachine) {
  const Result r = RunCli({"topology", "--json"});
  ASSERT_EQ(r.code(), 0) << r.err;
  const json j = LastLineJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_GE(j["cores"].get<int>(), 1);
  EXPECT_EQ(j["placement"]["oversubscribed"], false);
  // The instruction sets found, in JSON and on the text report's cpu line.
  ASSERT_TRUE(j["cpu"]["instruction_sets"].is_array()) << r.out;
  const std::string isa = j["cpu"]["onednn_isa"].get<std::string>();
  EXPECT_FALSE(isa.empty());
  const Result text = RunCli({"topology"});
  ASSERT_EQ(text.code(), 0) << text.err;
  const size_t at = text.out.find("cpu (this machine): ");
  ASSERT_NE(at, std::string::npos) << text.out;
  const std::string line = text.out.substr(at, text.out.find('\n', at) - at);
  for (const json& name : j["cpu"]["instruction_sets"]) {
    EXPECT_NE(line.find(name.get<std::string>()), std::string::npos) << line;
  }
  EXPECT_NE(line.find("oneDNN uses " + isa), std::string::npos) << line;
}

// `bench store`: a sub-subcommand of `bench`, which still takes a CONFIG.
TEST(CliTest, BenchStoreJson) {
  const Result r = RunCli({"bench", "store", "--rows", "10000", "--dim", "16", "--seconds", "0.05", "--threads", "1",
                           "--json"});
  ASSERT_EQ(r.code(), 0) << r.err;
  const json j = LastLineJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  for (const char* key : {"rows_per_s", "bytes_per_s", "bound_rows_per_s", "ratio"}) {
    ASSERT_TRUE(j.contains(key)) << key << "\n" << r.out;
    EXPECT_GT(j[key].get<double>(), 0) << key;
  }
  EXPECT_EQ(j["dim"], 16);
  EXPECT_EQ(j["rows"], 10000);
  EXPECT_EQ(j["ids"], "uniform");
  EXPECT_EQ(j["optimizer"], "adagrad");
  EXPECT_EQ(j["update"], "hogwild");
  EXPECT_EQ(j["threads"], 1);
  EXPECT_EQ(j["kind"], "static");
  EXPECT_EQ(j["dtype"], "f32");
  EXPECT_EQ(j["shards"], 1);
  EXPECT_EQ(j["row_bytes"], 2 * 16 * 4);  // params + Adagrad's slot
  // bf16 rows: 2-byte parameters, the f32 slot after them.
  const Result b = RunCli({"bench", "store", "--rows", "10000", "--dim", "16", "--seconds", "0.05", "--threads", "1",
                           "--dtype", "bf16", "--json"});
  ASSERT_EQ(b.code(), 0) << b.err;
  const json bj = LastLineJson(b.out);
  EXPECT_EQ(bj["dtype"], "bf16");
  EXPECT_EQ(bj["row_bytes"], 16 * 2 + 16 * 4);
  EXPECT_GT(bj["rows_per_s"].get<double>(), 0);
  ExpectOneErrorLine(RunCli({"bench", "store", "--dtype", "fp16"}), {"--dtype"});
  const Result help = RunCli({"bench", "store", "--help"});
  EXPECT_EQ(help.code(), 0) << help.err;
  EXPECT_NE(help.out.find("--rows"), std::string::npos) << help.out;
  ExpectOneErrorLine(RunCli({"bench", "store", "--ids", "gaussian"}), {"--ids"});
  ExpectOneErrorLine(RunCli({"bench"}), {"CONFIG"});
}

TEST(CliTest, BadSyntheticTopology) {
  const Result r = RunCli({"topology", "--synthetic", "pack:two banana"});
  ExpectOneErrorLine(r, {"pack:two banana"});
}

// One short training run, shared by the tests that look at its output.
class CliTrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!HaveFashionMnist()) return;
    job_name_ = "clitest" + std::to_string(getpid());
    result_ = new Result(RunCli({"train", kConfig, "--set", "data.max_train_records=3000", "--set",
                              "data.max_test_records=1000", "--set", "train.epochs=1", "--set",
                              "train.log_every_s=0.001", "--set", "ps.job_name=" + job_name_, "--json"}));
  }
  static void TearDownTestSuite() {
    delete result_;
    result_ = nullptr;
  }
  void SetUp() override {
    if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
    ASSERT_NE(result_, nullptr);
    ASSERT_EQ(result_->code(), 0) << "stdout:\n" << result_->out << "\nstderr:\n" << result_->err;
  }

  static Result* result_;
  static std::string job_name_;
};
Result* CliTrainTest::result_ = nullptr;
std::string CliTrainTest::job_name_;

TEST_F(CliTrainTest, LastLineIsJsonSummary) {
  const json j = LastLineJson(result_->out);
  ASSERT_TRUE(j.is_object()) << result_->out;
  for (const char* key : {"samples_per_s", "epochs", "workers", "steps", "records_seen", "train_loss",
                          "test_accuracy", "wall_s", "model_version", "store", "history"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["records_seen"], 3000);
  EXPECT_EQ(j["epochs"], 1);
  EXPECT_EQ(j["workers"], 2);
  EXPECT_GT(j["steps"].get<int64_t>(), 0);
  EXPECT_EQ(j["model_version"].get<int64_t>(), j["steps"].get<int64_t>());
  EXPECT_GT(j["samples_per_s"].get<double>(), 0);
  EXPECT_GT(j["wall_s"].get<double>(), 0);
  ASSERT_TRUE(j["test_accuracy"].is_number()) << j.dump();
  EXPECT_GT(j["test_accuracy"].get<double>(), 0.3);
  ASSERT_EQ(j["history"].size(), 1u);
  EXPECT_EQ(j["history"][0]["records"], 3000);
  // A 10-class single-label head: accuracy, no P@5.
  EXPECT_FALSE(j.contains("test_precision_at_5")) << j.dump();
  EXPECT_EQ(j["already_complete"], false);
  EXPECT_EQ(j["store"]["name"].get<std::string>().rfind(job_name_ + "-", 0), 0u) << j.dump();
  // Memory: the MLP 784-256-128-10 has 235146 parameters; Adam keeps 2 slots each.
  const json& mem = j["store"]["memory"];
  EXPECT_EQ(mem["params_bytes"].get<uint64_t>(), 235146u * 4) << j.dump();
  EXPECT_EQ(mem["slot_bytes"].get<uint64_t>(), 2u * 235146u * 4) << j.dump();
  EXPECT_EQ(mem["params_bytes"].get<uint64_t>() + mem["slot_bytes"].get<uint64_t>() +
                mem["overhead_bytes"].get<uint64_t>(),
            j["store"]["bytes"].get<uint64_t>());
  ASSERT_TRUE(j["store"]["shards"].is_array()) << j.dump();
  ASSERT_FALSE(j["store"]["shards"].empty());
  EXPECT_EQ(j["store"]["shards"][0]["node"], 0);
  const json& hp = j["store"]["huge_pages"];
  ASSERT_TRUE(hp.is_object()) << j.dump();
  EXPECT_TRUE(hp["requested"].is_boolean()) << j.dump();
  EXPECT_TRUE(hp["shmem_enabled"].is_string() || hp["shmem_enabled"].is_null()) << j.dump();
  ASSERT_TRUE(hp.contains("granted_bytes")) << j.dump();
  if (hp["granted_bytes"].is_number()) {
    EXPECT_LE(hp["granted_bytes"].get<uint64_t>(), j["store"]["bytes"].get<uint64_t>()) << j.dump();
  } else {
    EXPECT_TRUE(hp["granted_bytes"].is_null()) << j.dump();
  }
  // ps.memory_kind auto in a one-process job: what the store decides for a
  // store no other process attaches to, on the settings the run reports
  // (the rules themselves are huge_pages_test's and shm_store_test's), and
  // the first line says so.
  auto text = [&](const char* key) { return hp[key].is_string() ? hp[key].get<std::string>() : std::string(); };
  HugePageSettings settings;
  settings.shmem_enabled = text("shmem_enabled");
  settings.tmpfs_huge = text("tmpfs_huge");
  settings.thp_enabled = text("thp_enabled");
  OpenStoreOptions one_process;
  one_process.others_attach = false;
  const bool expect_private = UsePrivateMemory(one_process, settings);
  EXPECT_EQ(j["store"]["memory_kind"], expect_private ? "private" : "shared") << j.dump();
  EXPECT_EQ(result_->out.find(" of private memory)") != std::string::npos, expect_private) << result_->out;
  if (expect_private) {
    EXPECT_EQ(hp["requested"], true) << j.dump();
  }
}

// store.replication says what ps.replication chose and why (default: one copy).
TEST_F(CliTrainTest, ReportsReplication) {
  const json j = LastLineJson(result_->out);
  ASSERT_TRUE(j.is_object()) << result_->out;
  const json& rep = j["store"]["replication"];
  EXPECT_EQ(rep["policy"], "per_machine") << j.dump();
  EXPECT_TRUE(rep["reason"].is_string()) << j.dump();
  EXPECT_EQ(rep["replicas"], 1) << j.dump();
  EXPECT_EQ(rep["sync_every"], 16) << j.dump();
  EXPECT_NE(result_->out.find("replication: per_machine ("), std::string::npos) << result_->out;
}

// auto on a synthetic two-node machine: a replica per node, and why.
TEST(CliTest, AutoReplicationOnTwoNodes) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  const Result r = RunCli({"train", kConfig, "--set", "data.max_train_records=1000", "--set",
                           "data.max_test_records=500", "--set", "train.epochs=1", "--set", "train.intra_op_threads=1",
                           "--set", "topology.synthetic=pack:2 numa:1 core:1 pu:1", "--set", "ps.replication=auto",
                           "--set", "ps.sync_every=4", "--json"});
  ASSERT_EQ(r.code(), 0) << r.err;
  const json j = LastLineJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  const json& rep = j["store"]["replication"];
  EXPECT_EQ(rep["policy"], "per_node") << j.dump();
  EXPECT_EQ(rep["reason"], "2 NUMA nodes: one replica per node keeps reads local") << j.dump();
  EXPECT_EQ(rep["replicas"], 2) << j.dump();
  EXPECT_EQ(rep["sync_every"], 4) << j.dump();
  EXPECT_EQ(j["records_seen"], 1000);
  EXPECT_EQ(j["model_version"].get<int64_t>(), j["steps"].get<int64_t>());
  EXPECT_NE(r.out.find("replication: per_node (2 NUMA nodes"), std::string::npos) << r.out;
  ExpectOneErrorLine(RunCli({"train", kConfig, "--set", "ps.update=sync", "--set", "ps.replication=per_core"}),
                     {"ps.replication", "ps.update sync"});
}

// stdout is a file: progress comes as plain lines (log_every_s is tiny so
// that some are printed), never a line refreshed with '\r'.
TEST_F(CliTrainTest, PlainProgressWhenNotATerminal) {
  EXPECT_EQ(result_->out.find('\r'), std::string::npos);
  int progress_lines = 0;
  for (const std::string& line : Lines(result_->out)) {
    if (line.rfind("epoch 1/1  step ", 0) == 0) ++progress_lines;
  }
  EXPECT_GE(progress_lines, 1) << result_->out;
  EXPECT_EQ(result_->out.find('\033'), std::string::npos);
  EXPECT_EQ(result_->out.rfind("shardwild ", 0), 0u) << result_->out;
  EXPECT_NE(result_->out.find("epoch 1/1"), std::string::npos) << result_->out;
  EXPECT_NE(result_->out.find("test accuracy"), std::string::npos) << result_->out;
  EXPECT_EQ(result_->err, "");
}

TEST_F(CliTrainTest, NoSharedMemoryLeftBehind) {
  const json j = LastLineJson(result_->out);
  ASSERT_TRUE(j.is_object()) << result_->out;
  const std::string store = j["store"]["name"];
  ASSERT_FALSE(store.empty());
  EXPECT_EQ(ShmEntriesContaining(store), std::vector<std::string>{});
  EXPECT_EQ(ShmEntriesContaining(job_name_ + "-"), std::vector<std::string>{});
}

// Waits (up to 30 s) until `child` has printed its "training" line; false if
// it ended or never did.
bool WaitUntilTraining(Child& child) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline && !child.Poll()) {
    if (child.out().find("training") != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(CliSignalTest, SigtermRemovesSharedMemory) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  const std::string job_name = "clitest" + std::to_string(getpid()) + "sig";
  Child child({"train", kConfig, "--set", "ps.job_name=" + job_name, "--set", "ps.memory_kind=shared"});
  ASSERT_TRUE(child.started());
  const std::string prefix = job_name + "-" + std::to_string(child.pid()) + "-";

  // Wait until training has started: the store exists and the first line is out.
  ASSERT_TRUE(WaitUntilTraining(child)) << "stdout:\n" << child.out() << "\nstderr:\n" << child.err();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // some steps in
  const std::vector<std::string> segments = ShmEntriesContaining(prefix);
  EXPECT_FALSE(segments.empty()) << "no /dev/shm/" << prefix << "* while training";

  ASSERT_EQ(kill(child.pid(), SIGTERM), 0);
  const int status = child.Wait();
  EXPECT_TRUE(WIFSIGNALED(status)) << "status " << status << ", stderr:\n" << child.err();
  if (WIFSIGNALED(status)) {
    EXPECT_EQ(WTERMSIG(status), SIGTERM);
  }
  EXPECT_EQ(ShmEntriesContaining(prefix), std::vector<std::string>{});
}

// A store in private memory never appears in /dev/shm, so even SIGKILL
// leaves nothing there.
TEST(CliSignalTest, PrivateMemoryLeavesNothingInDevShmEvenWhenKilled) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  const std::string job_name = "clitest" + std::to_string(getpid()) + "priv";
  Child child({"train", kConfig, "--set", "ps.job_name=" + job_name, "--set", "ps.memory_kind=private"});
  ASSERT_TRUE(child.started());
  const std::string prefix = job_name + "-" + std::to_string(child.pid()) + "-";
  ASSERT_TRUE(WaitUntilTraining(child)) << "stdout:\n" << child.out() << "\nstderr:\n" << child.err();
  EXPECT_NE(child.out().find(" of private memory)"), std::string::npos) << child.out();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // some steps in
  EXPECT_EQ(ShmEntriesContaining(prefix), std::vector<std::string>{});
  ASSERT_EQ(kill(child.pid(), SIGKILL), 0);
  const int status = child.Wait();
  EXPECT_TRUE(WIFSIGNALED(status)) << "status " << status;
  EXPECT_EQ(ShmEntriesContaining(prefix), std::vector<std::string>{});
  EXPECT_EQ(ShmEntriesContaining(job_name), std::vector<std::string>{});
}

// SIGKILL after the first checkpoint, then the same command again: it
// resumes from that checkpoint, counts every record exactly once, and the
// killed run's shared memory is cleaned up by the next run.
TEST(CliSignalTest, SigkilledTrainingResumesFromItsCheckpoint) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  char tmpl[] = "/tmp/sw-cli-resume-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string job_name = "clitest" + std::to_string(getpid()) + "kill";
  const std::vector<std::string> args = {"train", kConfig, "--set", "ps.job_name=" + job_name, "--set",
                                         "ps.memory_kind=shared", "--set", "data.max_train_records=12000", "--set", "data.max_test_records=1000",
                                         "--set", "train.epochs=2", "--set", "checkpoint.dir=" + dir, "--set",
                                         "checkpoint.every_steps=10", "--json"};
  Child child(args);
  ASSERT_TRUE(child.started());
  const std::string prefix = job_name + "-" + std::to_string(child.pid()) + "-";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool checkpointed = false;
  while (std::chrono::steady_clock::now() < deadline && !child.Poll()) {
    if (std::filesystem::exists(dir + "/checkpoint")) {
      checkpointed = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(checkpointed) << "stdout:\n" << child.out() << "\nstderr:\n" << child.err();
  ASSERT_EQ(kill(child.pid(), SIGKILL), 0);
  const int status = child.Wait();
  ASSERT_TRUE(WIFSIGNALED(status)) << "the run finished before it could be killed; status " << status;
  EXPECT_FALSE(ShmEntriesContaining(prefix).empty()) << "SIGKILL cannot clean up; the next run must";

  const Result again = RunCli(args);
  ASSERT_EQ(again.code(), 0) << "stdout:\n" << again.out << "\nstderr:\n" << again.err;
  const json j = LastLineJson(again.out);
  ASSERT_TRUE(j.is_object()) << again.out;
  ASSERT_TRUE(j["resumed_from_step"].is_number()) << j.dump();
  EXPECT_GT(j["resumed_from_step"].get<int64_t>(), 0);
  EXPECT_EQ(j["records_seen"], 2 * 12000) << j.dump();
  EXPECT_GE(j["checkpoints_written"].get<int64_t>(), 1);
  EXPECT_EQ(j["worker_failures"], 0);
  EXPECT_EQ(j["tasks_requeued"], 0);
  EXPECT_EQ(j["eval_records_seen"].get<int64_t>(), 1000 * static_cast<int64_t>(j["history"].size()));
  EXPECT_NE(again.out.find("resumed from " + dir + "/ckpt-"), std::string::npos) << again.out;
  EXPECT_EQ(ShmEntriesContaining(prefix), std::vector<std::string>{}) << "the killed run's segments were removed";
  EXPECT_EQ(j["already_complete"], false) << j.dump();

  // Once more: the newest checkpoint is the final one. The run says the job
  // was already complete, trains nothing, and reports the final model's
  // test metrics (not null), with no throughput to speak of.
  const Result done = RunCli(args);
  ASSERT_EQ(done.code(), 0) << "stdout:\n" << done.out << "\nstderr:\n" << done.err;
  const json d = LastLineJson(done.out);
  EXPECT_EQ(d["already_complete"], true) << d.dump();
  EXPECT_TRUE(d["samples_per_s"].is_null()) << d.dump();
  EXPECT_TRUE(d["train_loss"].is_null()) << d.dump();
  EXPECT_TRUE(d["history"].empty()) << d.dump();
  EXPECT_EQ(d["records_seen"], 2 * 12000) << d.dump();
  EXPECT_EQ(d["checkpoints_written"], 0) << d.dump();
  ASSERT_TRUE(d["test_accuracy"].is_number()) << d.dump();
  EXPECT_NEAR(d["test_accuracy"].get<double>(), j["test_accuracy"].get<double>(), 1e-12) << "the same final model";
  EXPECT_EQ(d["eval_records_seen"], 1000) << d.dump();
  EXPECT_NE(done.out.find("the job was already complete"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("already complete: the final model"), std::string::npos) << done.out;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// The same for lockstep training (ps.update sync runs its own loop).
TEST(CliTest, AlreadyCompleteSyncJobEvaluatesItsFinalModel) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  char tmpl[] = "/tmp/sw-cli-done-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::vector<std::string> args = {"train", kConfig, "--set", "ps.update=sync", "--set",
                                         "data.max_train_records=2000", "--set", "data.max_test_records=500",
                                         "--set", "train.epochs=1", "--set", "checkpoint.dir=" + dir, "--json"};
  const Result first = RunCli(args);
  ASSERT_EQ(first.code(), 0) << first.err;
  const Result done = RunCli(args);
  ASSERT_EQ(done.code(), 0) << done.err;
  const json a = LastLineJson(first.out), d = LastLineJson(done.out);
  EXPECT_EQ(a["already_complete"], false);
  EXPECT_EQ(d["already_complete"], true) << d.dump();
  ASSERT_TRUE(d["test_accuracy"].is_number()) << d.dump();
  EXPECT_NEAR(d["test_accuracy"].get<double>(), a["test_accuracy"].get<double>(), 1e-12);
  EXPECT_TRUE(d["samples_per_s"].is_null()) << d.dump();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// P@5 (fastText's precision at k) is reported for multi-label data only: on
// single-label data it is top-5 accuracy over 5 and says nothing.
TEST(CliTest, PrecisionAtFiveOnlyForMultiLabelData) {
  char tmpl[] = "/tmp/sw-cli-p5-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const char* kClasses[] = {"a", "b", "c", "d", "e", "f"};
  auto write = [&](const std::string& path, bool multi) {
    std::ofstream f(path);
    for (int i = 0; i < 600; ++i) {
      const int c = i % 6;
      f << "__label__" << kClasses[c];
      if (multi) f << " __label__" << kClasses[(c + 1) % 6];
      f << " w" << c << " w" << (c + 1) % 6 << " x" << i % 7 << "\n";
    }
  };
  write(dir + "/single.txt", false);
  write(dir + "/multi.txt", true);
  for (const bool multi : {false, true}) {
    const std::string file = dir + (multi ? "/multi.txt" : "/single.txt");
    const Result r = RunCli({"train", std::string(SHARDWILD_SOURCE_DIR) + "/configs/text_bow.yaml", "--set",
                             "data.train=" + file, "--set", "data.test=" + file, "--set", "train.epochs=1", "--set",
                             "model.sparse.0.rows=1000", "--json"});
    ASSERT_EQ(r.code(), 0) << r.err;
    const json j = LastLineJson(r.out);
    EXPECT_EQ(j.contains("test_precision_at_5"), multi) << j.dump();
    EXPECT_EQ(r.out.find("precision_at_5") != std::string::npos, multi) << r.out;
  }
  // Watching it on single-label data is refused up front, saying why.
  const Result bad = RunCli({"train", std::string(SHARDWILD_SOURCE_DIR) + "/configs/text_bow.yaml", "--set",
                             "data.train=" + dir + "/single.txt", "--set", "data.test=" + dir + "/single.txt",
                             "--set", "early_stopping.monitor=test_precision_at_5", "--set",
                             "model.sparse.0.rows=1000"});
  ExpectOneErrorLine(bad, {"early_stopping.monitor", "multi-label", "test_accuracy"});
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// The sidecar evaluator started before training: it evaluates every
// checkpoint the run writes or says why it skipped it (pruned by
// checkpoint.keep), and exits after the final one, whose accuracy is the
// run's. Then `predict` writes one prediction per test image, in input order.
TEST(CliEvalTest, SidecarSeesEveryCheckpointAndPredictWritesEveryRecord) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  char tmpl[] = "/tmp/sw-cli-eval-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string job_name = "clitest" + std::to_string(getpid()) + "eval";
  Child sidecar({"eval", kConfig, "--watch", dir, "--json", "--set", "ps.job_name=" + job_name + "e", "--set",
                 "data.max_train_records=1000"});
  ASSERT_TRUE(sidecar.started());
  const Result trained = RunCli({"train", kConfig, "--set", "ps.job_name=" + job_name, "--set",
                                 "data.max_train_records=6000", "--set", "train.epochs=2", "--set",
                                 "checkpoint.dir=" + dir, "--set", "checkpoint.every_steps=4", "--set",
                                 "checkpoint.keep=1", "--json"});
  ASSERT_EQ(trained.code(), 0) << trained.err;
  const json t = LastLineJson(trained.out);
  ASSERT_TRUE(t.is_object()) << trained.out;
  const int status = sidecar.Wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "stdout:\n" << sidecar.out() << "\nstderr:\n"
                                                             << sidecar.err();
  const json w = LastLineJson(sidecar.out());
  ASSERT_TRUE(w.is_object()) << sidecar.out();
  EXPECT_EQ(w["saw_final"], true) << w.dump();
  // Every checkpoint of the history, in order: evaluated or skipped with a reason.
  std::vector<std::string> history;
  std::ifstream in(dir + "/history.jsonl");
  for (std::string line; std::getline(in, line);) history.push_back(json::parse(line)["name"].get<std::string>());
  ASSERT_EQ(static_cast<int64_t>(history.size()), t["checkpoints_written"].get<int64_t>());
  std::vector<std::string> seen;
  for (const json& e : w["evaluated"]) seen.push_back(std::filesystem::path(e["checkpoint"]).filename().string());
  for (const json& s : w["skipped"]) {
    seen.push_back(s["checkpoint"].get<std::string>());
    EXPECT_FALSE(s["reason"].get<std::string>().empty());
  }
  std::sort(seen.begin(), seen.end());
  std::vector<std::string> sorted_history = history;
  std::sort(sorted_history.begin(), sorted_history.end());
  EXPECT_EQ(seen, sorted_history) << w.dump();
  ASSERT_FALSE(w["evaluated"].empty());
  const json& last = w["evaluated"].back();
  EXPECT_EQ(last["final"], true);
  EXPECT_EQ(std::filesystem::path(last["checkpoint"]).filename().string(), history.back());
  EXPECT_DOUBLE_EQ(last["test_accuracy"].get<double>(), t["test_accuracy"].get<double>());

  // One checkpoint, evaluated on its own.
  const Result one = RunCli({"eval", kConfig, "--checkpoint", dir, "--json", "--set", "data.max_train_records=1000"});
  ASSERT_EQ(one.code(), 0) << one.err;
  EXPECT_DOUBLE_EQ(LastLineJson(one.out)["test_accuracy"].get<double>(), t["test_accuracy"].get<double>());

  // Predictions: a header, then one line per test image, indices in order;
  // their accuracy against the labels is the run's test accuracy.
  const std::string csv = dir + "/pred.csv";
  const Result pred = RunCli({"predict", kConfig, "--checkpoint", dir, "--input",
                              "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz", "--out", csv, "--set",
                              "data.max_train_records=1000"});
  ASSERT_EQ(pred.code(), 0) << pred.err;
  std::ifstream pin(csv);
  std::string line;
  ASSERT_TRUE(std::getline(pin, line));
  EXPECT_EQ(line, "index,prediction,p0,p1,p2,p3,p4,p5,p6,p7,p8,p9");
  std::vector<int> predicted;
  while (std::getline(pin, line)) {
    std::stringstream ss(line);
    std::string index, prediction;
    std::getline(ss, index, ',');
    std::getline(ss, prediction, ',');
    ASSERT_EQ(std::stoi(index), static_cast<int>(predicted.size()));
    predicted.push_back(std::stoi(prediction));
  }
  ASSERT_EQ(predicted.size(), 10000u);
  // The labels, from the IDX file (gzip): decompress with gzip -dc.
  std::FILE* labels = popen("gzip -dc /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", "r");
  ASSERT_NE(labels, nullptr);
  std::vector<unsigned char> bytes(8 + 10000);
  const size_t got = std::fread(bytes.data(), 1, bytes.size(), labels);
  pclose(labels);
  ASSERT_EQ(got, bytes.size());
  int correct = 0;
  for (int i = 0; i < 10000; ++i) correct += predicted[i] == bytes[8 + i];
  EXPECT_NEAR(correct / 10000.0, t["test_accuracy"].get<double>(), 1e-9);

  // Errors: no checkpoint; both or neither of --checkpoint and --watch.
  ExpectOneErrorLine(RunCli({"eval", kConfig, "--checkpoint", dir + "/nope"}), {"nope"});
  ExpectOneErrorLine(RunCli({"eval", kConfig}), {"--checkpoint", "--watch"});
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// `data gen`: a planted-model data set in the Criteo format, with its Bayes AUC.
TEST(CliDataGenTest, CriteoJsonAndFile) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string out = (dir.path() / "criteo.tsv").string();
  const Result r = RunCli({"data", "gen", "--kind", "criteo", "--rows", "1000", "--out", out, "--seed", "7", "--json"});
  ASSERT_EQ(r.code(), 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_EQ(lines[0].rfind("wrote 1000 rows to " + out + " (criteo); planted model: bayes_auc 0.", 0), 0u) << lines[0];
  const json j = LastLineJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["kind"], "criteo");
  EXPECT_EQ(j["rows"], 1000);
  EXPECT_EQ(j["out"], out);
  EXPECT_EQ(j["seed"], 7);
  EXPECT_EQ(j["metric"], "bayes_auc");
  EXPECT_EQ(j["num_classes"], 2);
  ASSERT_TRUE(j["bayes_auc"].is_number()) << r.out;
  EXPECT_GT(j["bayes_auc"].get<double>(), 0.65);
  EXPECT_LT(j["bayes_auc"].get<double>(), 0.9);
  EXPECT_GT(j["positive_rate"].get<double>(), 0.15);
  EXPECT_LT(j["positive_rate"].get<double>(), 0.35);
  // The file: 1000 lines of 40 tab-separated fields, j["bytes"] bytes.
  const std::string text = ReadFile(out);
  EXPECT_EQ(static_cast<int64_t>(text.size()), j["bytes"].get<int64_t>());
  const std::vector<std::string> rows = Lines(text);
  ASSERT_EQ(rows.size(), 1000u);
  for (const std::string& row : rows) {
    ASSERT_EQ(std::count(row.begin(), row.end(), '\t'), 39) << row;
    ASSERT_TRUE(row[0] == '0' || row[0] == '1') << row;
  }
  // Only the file: no temporary left next to it.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) entries += e.is_regular_file();
  EXPECT_EQ(entries, 1);
}

TEST(CliDataGenTest, BadArguments) {
  TempDir dir;
  const std::string out = (dir.path() / "x").string();
  ExpectOneErrorLine(RunCli({"data", "gen", "--kind", "parquet", "--rows", "10", "--out", out}), {"--kind", "parquet"});
  ExpectOneErrorLine(RunCli({"data", "gen", "--kind", "criteo", "--out", out}), {"--rows"});
  ExpectOneErrorLine(RunCli({"data", "gen", "--kind", "text", "--rows", "10", "--out", out, "--classes", "1"}),
                     {"text_classes"});
  // A folder that cannot be made (a file in its place); a missing one is
  // made (data_gen_test).
  const std::string file = (dir.path() / "a_file").string();
  std::ofstream(file) << "x\n";
  ExpectOneErrorLine(RunCli({"data", "gen", "--kind", "libsvm", "--rows", "10", "--out", file + "/sub/data.txt"}),
                     {file + "/sub/data.txt", "cannot be made"});
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace shardwild
