// Scheduled functions over the network (net/cluster_functions.h): the
// chief's RemoteWorkers on loopback, two in-process FunctionServers standing
// in for two worker tasks, and a ClusterCoordinator scheduling on them.
#include "net/cluster_functions.h"


#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "free_ports.h"
#include "../workers/test_config.h"
#include "core/base/status.h"
#include "net/chief.h"
#include "net/chief_task.h"
#include "net/cluster_spec.h"
#include "net/ps_task.h"
#include "net/worker_task.h"
#include "ps_shm/shm_store.h"

namespace shardwild {
namespace {

using testing_ports::FreePorts;

constexpr char kToken[] = "0123456789abcdef-functions-token";

OpenStoreOptions StoreOptions() {
  OpenStoreOptions o;
  o.store.job_name = "swtest-functions";
  o.store.huge_pages = HugePagePolicy::kOff;
  o.optimizer.type = OptimizerType::kSgd;
  o.optimizer.lr = 0.1f;
  o.seed = 5;
  o.num_shards = 2;
  TableSpec t;
  t.name = "emb";
  t.kind = EmbeddingKind::kStatic;
  t.dim = 3;
  t.capacity = 10;
  o.tables = {t};
  return o;
}

// One stand-in worker task: a FunctionServer on its own thread.
class Task {
 public:
  Task(int port, const FunctionRegistry& registry, FunctionContext context, const std::string& token = kToken) {
    PsClientOptions chief;
    chief.address = absl::StrCat("127.0.0.1:", port);
    chief.task_name = "chief:0";
    chief.token = token;
    chief.initial_backoff_s = 0.02;
    chief.max_backoff_s = 0.1;
    server_ = std::make_unique<FunctionServer>(chief, registry, context, [](const std::string&) {});
    thread_ = std::thread([this] { status_ = server_->Run(); });
  }
  ~Task() { (void)Stop(); }
  absl::Status Stop() {
    if (thread_.joinable()) {
      server_->Stop();
      thread_.join();
    }
    return status_;
  }
  // Run's result once it has ended by itself (waits up to 10 s).
  absl::Status Ended() {
    thread_.join();
    return status_;
  }

 private:
  std::unique_ptr<FunctionServer> server_;
  absl::Status status_;
  std::thread thread_;
};

class ClusterFunctionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<ShmParamStore>> store =
        ShmParamStore::Create(StoreOptions(), {VariableSpec{"w", 4, 2, InitKind::kGlorotUniform, 4, 2}});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    train_.count = 120;
    test_.count = 30;
    ChiefServerOptions o;
    o.server.bind_address = "127.0.0.1:0";
    o.server.task_name = "chief:0";
    o.server.token = kToken;
    o.server.keepalive_s = 1;
    o.worker_tasks = 2;
    o.threads_per_task = 1;
    absl::StatusOr<std::unique_ptr<RemoteWorkers>> w = RemoteWorkers::Start(o);
    ASSERT_TRUE(w.ok()) << w.status();
    workers_ = *std::move(w);
    ASSERT_TRUE(AddBuiltinFunctions(&registry_).ok());
    ASSERT_TRUE(registry_
                    .Register("whoami", [](const FunctionContext& c, absl::string_view) {
                      return absl::StatusOr<std::string>(absl::StrCat(c.task));
                    })
                    .ok());
    ASSERT_TRUE(registry_
                    .Register("square",
                              [this](const FunctionContext& c, absl::string_view args) -> absl::StatusOr<std::string> {
                                int64_t x = 0;
                                if (!absl::SimpleAtoi(args, &x)) return absl::InvalidArgumentError("not a number");
                                runs_.fetch_add(1);
                                // Slow enough that both tasks take work.
                                std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_.load()));
                                return absl::StrCat(x * x, " ", c.task);
                              })
                    .ok());
    ASSERT_TRUE(registry_
                    .Register("throws", [](const FunctionContext&, absl::string_view) -> absl::StatusOr<std::string> {
                      throw std::runtime_error("boom");
                    })
                    .ok());
  }

  FunctionContext Context(int task) {
    FunctionContext c;
    c.task = task;
    c.store = store_.get();
    c.train = &train_;
    c.test = &test_;
    return c;
  }
  std::unique_ptr<Task> StartTask(int task, const std::string& token = kToken) {
    return std::make_unique<Task>(workers_->port(), registry_, Context(task), token);
  }

  std::unique_ptr<ShmParamStore> store_;
  Dataset train_, test_;
  std::unique_ptr<RemoteWorkers> workers_;
  FunctionRegistry registry_;
  std::atomic<int> runs_{0};
  std::atomic<int> sleep_ms_{20};
};

// The ports the cluster tests listen on: distinct, free, never given twice,
// and below the range the kernel draws connections' local ports from, so
// that no client's connect can take one before its server binds it.
TEST(FreePortsTest, DistinctFreeAndBelowTheRangeOfOutgoingConnections) {
  const std::vector<int> a = testing_ports::FreePorts(5), b = testing_ports::FreePorts(5);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  std::set<int> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), 10u) << "a port given twice";
  const auto [lo, hi] = testing_ports::EphemeralRange();
  for (int port : all) {
    if (lo - std::max(1024, lo - 12000) >= 1000) {
      EXPECT_LT(port, lo) << "in [" << lo << ", " << hi << "]";
    }
    int got = 0;
    const int fd = testing_ports::BindLoopback(port, &got);
    EXPECT_GE(fd, 0) << "port " << port << " is not free";
    if (fd >= 0) close(fd);
    EXPECT_EQ(got, port);
  }
}

TEST_F(ClusterFunctionsTest, ScheduledFunctionsRunOnEveryWorkerTask) {
  std::unique_ptr<Task> a = StartTask(0), b = StartTask(1);
  absl::StatusOr<std::unique_ptr<ClusterCoordinator>> c = ClusterCoordinator::Create(workers_.get());
  ASSERT_TRUE(c.ok()) << c.status();
  ClusterCoordinator& coordinator = **c;
  ASSERT_TRUE(coordinator.WaitForWorkers(10).ok());
  std::vector<RemoteValue<std::string>> values;
  for (int i = 0; i < 16; ++i) values.push_back(coordinator.Schedule("square", absl::StrCat(i)));
  EXPECT_TRUE(coordinator.Join().ok());
  std::set<std::string> tasks;
  for (int i = 0; i < 16; ++i) {
    absl::StatusOr<std::string> v = values[i].Fetch();
    ASSERT_TRUE(v.ok()) << v.status();
    const size_t space = v->find(' ');
    EXPECT_EQ(v->substr(0, space), absl::StrCat(i * i));
    tasks.insert(v->substr(space + 1));
  }
  EXPECT_EQ(tasks, (std::set<std::string>{"0", "1"}));  // both worker tasks took work
  EXPECT_EQ(runs_.load(), 16);

  // Per-worker calls, in task order; the built-ins see the task's store and data.
  const std::vector<absl::StatusOr<std::string>> who = coordinator.CallOnEach("whoami");
  ASSERT_EQ(who.size(), 2u);
  EXPECT_EQ(*who[0], "0");
  EXPECT_EQ(*who[1], "1");
  EXPECT_EQ(*coordinator.Schedule("records").Fetch(), "120 30");
  const float grad[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const DenseGrad g{0, grad};
  ASSERT_TRUE(store_->Push({&g, 1}, 0.1f).ok());
  EXPECT_EQ(*coordinator.Schedule("version").Fetch(), "1");
  std::vector<float> w(8);
  ASSERT_TRUE(store_->PullVariable(0, w.data()).ok());
  absl::StatusOr<std::string> pulled = coordinator.Schedule("pull", "w").Fetch();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  ASSERT_EQ(pulled->size(), 8 * sizeof(float));
  EXPECT_EQ(std::memcmp(pulled->data(), w.data(), pulled->size()), 0);
  std::vector<float> rows(2 * 3);
  RowScratch scratch;
  const uint64_t ids[] = {7, 2};
  ASSERT_TRUE(store_->PullRows(0, ids, rows.data(), PullMode::kReadOnly, &scratch).ok());
  absl::StatusOr<std::string> pulled_rows = coordinator.Schedule("pull_rows", "0 7 2").Fetch();
  ASSERT_TRUE(pulled_rows.ok()) << pulled_rows.status();
  ASSERT_EQ(pulled_rows->size(), rows.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(pulled_rows->data(), rows.data(), pulled_rows->size()), 0);
  EXPECT_TRUE(coordinator.Join().ok());
}

TEST_F(ClusterFunctionsTest, ApplicationErrorsComeBackWithTheirCodeAndJoinReportsThemOnce) {
  std::unique_ptr<Task> a = StartTask(0), b = StartTask(1);
  absl::StatusOr<std::unique_ptr<ClusterCoordinator>> c = ClusterCoordinator::Create(workers_.get());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->WaitForWorkers(10).ok());
  const absl::Status missing = (*c)->Schedule("no_such_function").Fetch().status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find("has no function 'no_such_function' (it has: pull, pull_rows, records, square"),
            std::string::npos)
      << missing;
  const absl::Status joined = (*c)->Join();
  EXPECT_EQ(joined.code(), absl::StatusCode::kNotFound) << joined;
  EXPECT_TRUE((*c)->Join().ok());  // reported once
  EXPECT_EQ((*c)->Schedule("square", "x").Fetch().status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status thrown = (*c)->Schedule("throws").Fetch().status();
  EXPECT_EQ(thrown.code(), absl::StatusCode::kInternal);
  EXPECT_NE(thrown.message().find("function 'throws' threw: boom"), std::string::npos) << thrown;
  EXPECT_EQ((*c)->live_workers(), 2);  // application errors lose no worker
  (void)(*c)->Join();
}

// A worker task that goes away while it runs a function: the function runs
// again on the other one, and the lost task takes work again once back.
TEST_F(ClusterFunctionsTest, LostWorkerTaskIsRerunElsewhereAndComesBack) {
  std::unique_ptr<Task> a = StartTask(0), b = StartTask(1);
  absl::StatusOr<std::unique_ptr<ClusterCoordinator>> c = ClusterCoordinator::Create(workers_.get());
  ASSERT_TRUE(c.ok()) << c.status();
  ClusterCoordinator& coordinator = **c;
  ASSERT_TRUE(coordinator.WaitForWorkers(10).ok());
  sleep_ms_ = 150;
  std::vector<RemoteValue<std::string>> values;
  for (int i = 0; i < 6; ++i) values.push_back(coordinator.Schedule("square", absl::StrCat(i)));
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // both tasks are running one
  EXPECT_TRUE(b->Stop().ok());
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<std::string> v = values[i].Fetch();
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->substr(0, v->find(' ')), absl::StrCat(i * i));
  }
  EXPECT_TRUE(coordinator.Join().ok());
  EXPECT_EQ(coordinator.live_workers(), 1);
  EXPECT_GE(runs_.load(), 7);  // at least once: task 1's function ran again on task 0
  EXPECT_EQ(coordinator.CallOnEach("whoami")[1].status().code(), absl::StatusCode::kUnavailable);

  sleep_ms_ = 20;
  b = StartTask(1);
  ASSERT_TRUE(workers_->WaitForFunctions(1, std::chrono::steady_clock::now() + std::chrono::seconds(10)));
  std::set<std::string> tasks;
  for (int i = 0; i < 8; ++i) values.push_back(coordinator.Schedule("square", "3"));
  EXPECT_EQ(coordinator.live_workers(), 2);
  EXPECT_TRUE(coordinator.Join().ok());
  for (size_t i = 6; i < values.size(); ++i) {
    absl::StatusOr<std::string> v = values[i].Fetch();
    ASSERT_TRUE(v.ok()) << v.status();
    tasks.insert(v->substr(v->find(' ') + 1));
  }
  EXPECT_EQ(tasks, (std::set<std::string>{"0", "1"}));

  // Every worker task gone: what is scheduled fails with Unavailable.
  EXPECT_TRUE(a->Stop().ok());
  EXPECT_TRUE(b->Stop().ok());
  const absl::Status none = coordinator.Schedule("square", "2").Fetch().status();
  EXPECT_EQ(none.code(), absl::StatusCode::kUnavailable) << none;
  (void)coordinator.Join();
}

TEST_F(ClusterFunctionsTest, RefusedStreamsEndTheServerWithTheChiefsError) {
  std::unique_ptr<Task> wrong = StartTask(0, "a-wrong-token-of-some-length");
  const absl::Status denied = wrong->Ended();
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied) << denied;
  std::unique_ptr<Task> out_of_range = StartTask(2);
  const absl::Status invalid = out_of_range->Ended();
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument) << invalid;
  EXPECT_NE(invalid.message().find("worker:2 is not a worker task"), std::string::npos) << invalid;
  EXPECT_FALSE(workers_->FunctionsConnected(0));
  absl::StatusOr<std::unique_ptr<ClusterCoordinator>> c = ClusterCoordinator::Create(workers_.get());
  ASSERT_TRUE(c.ok());
  const absl::Status waited = (*c)->WaitForWorkers(0.2);
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(waited.message().find("worker:0, worker:1 did not connect"), std::string::npos) << waited;
}


// A whole cluster in this process (one ps task, two worker tasks of the
// built-in functions, the chief): RunChief's before_training hook schedules
// functions on the real worker tasks before the first task goes out; a hook
// that fails stops the job with its error.
TEST(ChiefBeforeTrainingTest, SchedulesOnTheWorkerTasksThenTrains) {
  if (!testdata::HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
  for (const bool fail : {false, true}) {
    SCOPED_TRACE(fail ? "a failing hook" : "a hook that succeeds");
    const std::vector<int> ports = FreePorts(5);
    ASSERT_EQ(ports.size(), 5u);
    absl::StatusOr<Config> config = testdata::LoadDefaultConfig(
        {"train.workers=1", "train.intra_op_threads=1", "data.max_train_records=2000", "data.max_test_records=500",
         "data.records_per_task=500", "train.epochs=3", "train.batch_size=32", "ps.shards=2",
         // Worker tasks started before the chief retry often, so both join
         // this short job.
         "cluster.max_backoff_s=0.2", "train.task_timeout_s=5", absl::StrCat("ps.job_name=swtest-hook-", fail)});
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
        absl::StrCat(R"({"cluster": {"chief": ["127.0.0.1:)", ports[0], R"("], "ps": ["127.0.0.1:)", ports[1],
                     R"("], "worker": ["127.0.0.1:)", ports[2], R"(", "127.0.0.1:)", ports[3],
                     R"("], "evaluator": ["127.0.0.1:)", ports[4], R"("]}, "task": {"type": "chief", "index": 0}})"),
        "test");
    ASSERT_TRUE(spec.ok()) << spec.status();
    const TaskLog quiet = [](const std::string&) {};
    std::atomic<bool> stop{false};
    absl::Status ps_status, worker_status[2];
    std::thread ps([&] { ps_status = RunPsTask(*config, *spec, 0, stop, quiet); });
    std::vector<std::thread> workers;
    for (int w = 0; w < 2; ++w) {
      workers.emplace_back([&, w] { worker_status[w] = RunWorkerTask(*config, *spec, w, quiet); });
    }
    JobOptions jo;
    jo.workers = false;
    absl::StatusOr<std::unique_ptr<Job>> job = Job::Create(*config, jo);
    ASSERT_TRUE(job.ok()) << job.status();
    std::vector<std::string> seen;
    const auto hook = [&](ClusterCoordinator& c) -> absl::Status {
      for (const absl::StatusOr<std::string>& r : c.CallOnEach("records")) {
        SW_RETURN_IF_ERROR(r.status());
        seen.push_back(*r);
      }
      SW_ASSIGN_OR_RETURN(const std::string version, c.Schedule("version").Fetch());
      seen.push_back(version);
      if (fail) return absl::FailedPreconditionError("the hook says no");
      return absl::OkStatus();
    };
    ProgressReporter silent = ProgressReporter::Silent();
    absl::StatusOr<TrainSummary> summary = RunChief(**job, *spec, silent, TrainRunOptions{}, hook);
    EXPECT_EQ(seen, (std::vector<std::string>{"2000 500", "2000 500", "0"}));
    if (fail) {
      EXPECT_EQ(summary.status().code(), absl::StatusCode::kFailedPrecondition) << summary.status();
      EXPECT_NE(summary.status().message().find("the hook says no"), std::string::npos) << summary.status();
    } else {
      ASSERT_TRUE(summary.ok()) << summary.status();
      EXPECT_EQ(summary->records_seen, 3 * 2000);
      EXPECT_GT(summary->model_version, 0u);
    }
    // The worker tasks end when told to exit, or (the job stopped) once the
    // chief has been gone for train.task_timeout_s.
    for (std::thread& t : workers) t.join();
    if (!fail) {
      EXPECT_TRUE(worker_status[0].ok()) << worker_status[0];
      EXPECT_TRUE(worker_status[1].ok()) << worker_status[1];
    }
    stop = true;
    ps.join();
    EXPECT_TRUE(ps_status.ok()) << ps_status;
  }
}

TEST(FunctionRegistryTest, NamesAreUnique) {
  FunctionRegistry r;
  auto fn = [](const FunctionContext&, absl::string_view) { return absl::StatusOr<std::string>("x"); };
  EXPECT_TRUE(r.Register("f", fn).ok());
  EXPECT_EQ(r.Register("f", fn).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.Register("", fn).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Register("g", nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(AddBuiltinFunctions(&r).ok());
  EXPECT_EQ(AddBuiltinFunctions(&r).code(), absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace shardwild
