// train.worker_processes end to end: the built `shardwild` binary
// (SHARDWILD_BINARY) trains with one process per worker, and the tests kill
// those processes (and the main one) with SIGKILL. They skip when
// Fashion-MNIST is absent.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "cli_child.h"

extern char** environ;

namespace shardwild {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

using namespace clitest;

// The parent pid of `pid` from /proc, or -1 if it is gone.
pid_t ParentOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return -1;
  // "pid (comm) state ppid ...": comm may hold spaces, so parse after ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 1));
  std::string state;
  pid_t ppid = -1;
  rest >> state >> ppid;
  return ppid;
}

// Whether `pid` has ended: no such process, or a zombie nobody reaped yet.
bool Ended(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return true;
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && (stat[close + 2] == 'Z' || stat[close + 2] == 'X');
}

bool WaitUntilEnded(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = SteadyClock::now() + limit;
  while (SteadyClock::now() < deadline) {
    if (Ended(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Ended(pid);
}

// Worker index -> pid, from the "worker I: pid P" lines (the latest per index).
std::map<int, pid_t> WorkerPids(const std::string& out) {
  static const std::regex re(R"(^worker (\d+): pid (\d+))");
  std::map<int, pid_t> pids;
  for (const std::string& line : Lines(out)) {
    std::smatch m;
    if (std::regex_search(line, m, re)) pids[std::stoi(m[1])] = static_cast<pid_t>(std::stol(m[2]));
  }
  return pids;
}

// Waits until each of `workers` workers has said "ready" (it gets a task at
// once) and a progress line of epoch 1 is out, then a little longer, so each
// is in the middle of a task. False if the run ended or took too long.
bool WaitForTraining(Child& child, int workers, std::chrono::seconds limit) {
  static const std::regex ready(R"(\nworker \d+: pid \d+ ready)");
  const auto deadline = SteadyClock::now() + limit;
  while (SteadyClock::now() < deadline && !child.Poll()) {
    const std::string out = child.out();
    const auto n = std::distance(std::sregex_iterator(out.begin(), out.end(), ready), std::sregex_iterator());
    if (n >= workers && out.find("\nepoch 1/") != std::string::npos) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return !child.Poll();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

std::vector<std::string> TrainArgs(const std::string& job_name, std::vector<std::string> extra) {
  std::vector<std::string> args = {"train", kConfig,
                                   "--set", "train.worker_processes=true",
                                   "--set", "train.workers=2",
                                   "--set", "train.intra_op_threads=1",
                                   "--set", "data.max_train_records=12000",
                                   "--set", "data.max_test_records=2000",
                                   "--set", "data.records_per_task=500",
                                   "--set", "train.batch_size=32",
                                   "--set", "train.epochs=2",
                                   "--set", "train.log_every_s=0.01",
                                   "--set", "ps.job_name=" + job_name,
                                   "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// SIGKILLs worker `pid` while it holds a task: it is stopped first, so if it
// had just reported one, the main process hands it the next (into its
// socket) before it dies; it dies holding a lease either way.
void KillInTheMiddleOfATask(pid_t pid) {
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(kill(pid, SIGKILL), 0);
}

#define SKIP_WITHOUT_DATA()                                                                   \
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist"

// Workers are real processes, children of the main one; one is SIGKILLed in
// the middle of epoch 1: its task is re-queued, a replacement starts, every
// record is counted exactly once and the model trains as usual.
TEST(WorkerProcessTest, SigkilledWorkerIsReplacedAndRecordsAreExact) {
  SKIP_WITHOUT_DATA();
  const std::string job_name = "wptest" + std::to_string(getpid()) + "a";
  Child child(TrainArgs(job_name, {}));
  ASSERT_TRUE(child.started());
  ASSERT_TRUE(WaitForTraining(child, 2, std::chrono::seconds(60))) << "stdout:\n" << child.out() << "\nstderr:\n"
                                                                   << child.err();
  const std::map<int, pid_t> pids = WorkerPids(child.out());
  ASSERT_EQ(pids.size(), 2u);
  for (const auto& [index, pid] : pids) EXPECT_EQ(ParentOf(pid), child.pid()) << "worker " << index;
  EXPECT_NE(pids.at(0), pids.at(1));
  const pid_t victim = pids.at(1);
  KillInTheMiddleOfATask(victim);

  const int status = child.Wait();
  const std::string out = child.out();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\nstdout:\n" << out
                                                             << "\nstderr:\n" << child.err();
  const json j = LastLineJson(out);
  ASSERT_TRUE(j.is_object()) << out;
  ASSERT_EQ(j["history"].size(), 2u) << "the run ended before the kill? " << j.dump();
  EXPECT_EQ(j["records_seen"], 2 * 12000) << j.dump();
  EXPECT_EQ(j["history"][0]["records"], 12000) << j.dump();
  EXPECT_EQ(j["history"][1]["records"], 12000) << j.dump();
  EXPECT_GE(j["worker_failures"].get<int64_t>(), 1) << j.dump();
  EXPECT_GE(j["tasks_requeued"].get<int64_t>(), 1) << j.dump();
  EXPECT_EQ(j["workers"], 2);
  // Every done task's steps, no more: ceil(500 / 32) = 16 per task, 24 tasks per epoch.
  EXPECT_EQ(j["steps"], 2 * 24 * 16) << j.dump();
  // A killed task's pushes may have reached the store before it died.
  EXPECT_GE(j["model_version"].get<int64_t>(), j["steps"].get<int64_t>()) << j.dump();
  ASSERT_TRUE(j["test_accuracy"].is_number()) << j.dump();
  EXPECT_GT(j["test_accuracy"].get<double>(), 0.75) << j.dump();
  EXPECT_EQ(j["eval_records_seen"], 2 * 2000);
  // The death is reported and a replacement started in the same slot.
  EXPECT_NE(out.find("worker 1 (pid " + std::to_string(victim) + ") died: killed by signal 9"), std::string::npos)
      << out;
  const std::map<int, pid_t> after = WorkerPids(out);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_NE(after.at(1), victim);
  EXPECT_NE(out.find("worker 1: pid " + std::to_string(after.at(1)) + " (replacement)"), std::string::npos) << out;
  EXPECT_EQ(child.err(), "");
  // Every worker process is gone, and so is the store.
  for (const auto& [index, pid] : after) EXPECT_TRUE(WaitUntilEnded(pid, std::chrono::seconds(5))) << pid;
  EXPECT_EQ(ShmEntriesContaining(job_name + "-"), std::vector<std::string>{});
}

// train.restart_workers false: the job goes on with the worker left; with
// none left it stops with one clear error line.
TEST(WorkerProcessTest, WithoutRestartsTheJobGoesOnWithFewerWorkers) {
  SKIP_WITHOUT_DATA();
  const std::string job_name = "wptest" + std::to_string(getpid()) + "b";
  {
    Child child(TrainArgs(job_name, {"--set", "train.restart_workers=false"}));
    ASSERT_TRUE(child.started());
    ASSERT_TRUE(WaitForTraining(child, 2, std::chrono::seconds(60))) << child.out() << child.err();
    const pid_t victim = WorkerPids(child.out()).at(0);
    KillInTheMiddleOfATask(victim);
    const int status = child.Wait();
    const std::string out = child.out();
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out << child.err();
    const json j = LastLineJson(out);
    ASSERT_TRUE(j.is_object()) << out;
    EXPECT_EQ(j["records_seen"], 2 * 12000) << j.dump();
    EXPECT_EQ(j["worker_failures"], 1) << j.dump();
    EXPECT_GE(j["tasks_requeued"].get<int64_t>(), 1) << j.dump();
    EXPECT_GT(j["test_accuracy"].get<double>(), 0.75) << j.dump();
    EXPECT_EQ(out.find("(replacement)"), std::string::npos) << out;
    EXPECT_EQ(WorkerPids(out).at(0), victim) << "no new process for worker 0";
  }
  {
    Child child(TrainArgs(job_name, {"--set", "train.restart_workers=false", "--set", "train.epochs=20"}));
    ASSERT_TRUE(child.started());
    const auto deadline = SteadyClock::now() + std::chrono::seconds(60);
    while (WorkerPids(child.out()).size() < 2 && SteadyClock::now() < deadline && !child.Poll()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const std::map<int, pid_t> pids = WorkerPids(child.out());
    ASSERT_EQ(pids.size(), 2u) << child.out() << child.err();
    for (const auto& [index, pid] : pids) ASSERT_EQ(kill(pid, SIGKILL), 0);
    const int status = child.Wait();
    ASSERT_TRUE(WIFEXITED(status)) << status;
    EXPECT_NE(WEXITSTATUS(status), 0);
    const std::vector<std::string> err = Lines(child.err());
    ASSERT_EQ(err.size(), 1u) << child.err();
    EXPECT_EQ(err[0].rfind("shardwild: error: no worker process is left (train.restart_workers is false)", 0), 0u)
        << err[0];
    EXPECT_NE(err[0].find("killed by signal 9"), std::string::npos) << err[0];
  }
  EXPECT_EQ(ShmEntriesContaining(job_name + "-"), std::vector<std::string>{});
}

// SIGKILL of the main process: its workers die with it (PR_SET_PDEATHSIG),
// its segments stay (nothing can run on SIGKILL), and the next run of the job
// removes them and trains normally.
TEST(WorkerProcessTest, SigkilledMainProcessLeavesNothingThatBlocksTheNextRun) {
  SKIP_WITHOUT_DATA();
  const std::string job_name = "wptest" + std::to_string(getpid()) + "c";
  std::map<int, pid_t> pids;
  std::string prefix;
  {
    Child child(TrainArgs(job_name, {"--set", "train.epochs=50"}));
    ASSERT_TRUE(child.started());
    prefix = job_name + "-" + std::to_string(child.pid()) + "-";
    ASSERT_TRUE(WaitForTraining(child, 2, std::chrono::seconds(60))) << child.out() << child.err();
    pids = WorkerPids(child.out());
    EXPECT_FALSE(ShmEntriesContaining(prefix).empty());
    ASSERT_EQ(kill(child.pid(), SIGKILL), 0);
    const int status = child.Wait();
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  }
  for (const auto& [index, pid] : pids) {
    EXPECT_TRUE(WaitUntilEnded(pid, std::chrono::seconds(5))) << "worker " << index << " (pid " << pid
                                                              << ") outlived the main process";
  }
  EXPECT_FALSE(ShmEntriesContaining(prefix).empty()) << "SIGKILL cannot clean up; the next run must";

  Child next(TrainArgs(job_name, {"--set", "train.epochs=1", "--set", "data.max_train_records=3000"}));
  ASSERT_TRUE(next.started());
  const int status = next.Wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << next.out() << next.err();
  const json j = LastLineJson(next.out());
  ASSERT_TRUE(j.is_object()) << next.out();
  EXPECT_EQ(j["records_seen"], 3000);
  EXPECT_EQ(j["worker_failures"], 0);
  EXPECT_EQ(j["tasks_requeued"], 0);
  EXPECT_NE(next.err().find("removed"), std::string::npos) << next.err();
  EXPECT_NE(next.err().find(prefix), std::string::npos) << next.err();
  EXPECT_EQ(ShmEntriesContaining(prefix), std::vector<std::string>{});
  EXPECT_EQ(ShmEntriesContaining(job_name + "-"), std::vector<std::string>{});
}

// Worker processes need a lock-free update mode and one copy; the errors
// name the keys.
TEST(WorkerProcessTest, ConfigErrorsNameTheKeys) {
  auto one_error_line = [](const std::vector<std::string>& args, const std::vector<std::string>& parts) {
    Child child(args);
    ASSERT_TRUE(child.started());
    const int status = child.Wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
    const std::vector<std::string> err = Lines(child.err());
    ASSERT_EQ(err.size(), 1u) << child.err();
    for (const std::string& p : parts) EXPECT_NE(err[0].find(p), std::string::npos) << err[0] << "\nlacks: " << p;
  };
  one_error_line({"train", kConfig, "--set", "train.worker_processes=true", "--set", "ps.update=sync"},
                 {"train.worker_processes", "ps.update"});
  one_error_line({"train", kConfig, "--set", "train.worker_processes=true", "--set", "ps.replication=per_node"},
                 {"ps.replication", "train.worker_processes"});
  one_error_line({"train", kConfig, "--set", "train.task_timeout_s=0"}, {"train.task_timeout_s"});
  one_error_line({"train", kConfig, "--set", "train.max_task_retries=-1"}, {"train.max_task_retries"});
  one_error_line({"train", kConfig, "--set", "data.records_per_task=0"}, {"data.records_per_task"});
}

}  // namespace
}  // namespace shardwild
