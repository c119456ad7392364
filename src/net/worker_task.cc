#include "net/worker_task.h"

#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"
#include "net/chief.grpc.pb.h"
#include "net/cluster_functions.h"
#include "net/grpc_util.h"
#include "workers/job.h"
#include "workers/live_metrics.h"
#include "workers/task_workers.h"

namespace shardwild {
namespace {

using Clock = std::chrono::steady_clock;

// One worker thread's part: sessions with the chief until `exit`.
absl::Status ServeSlot(const Config& config, const PsClientOptions& chief, grpc::Channel& channel,
                       net::Chief::Stub& stub, Job& job, ClusterParamStore& store, int task, int thread,
                       const TaskLog& log) {
  const Dataset* test = InlineEvaluation(config) ? job.test() : nullptr;
  TaskRunner runner(config, job.worker(thread), job.train(), test, [&store] { return store.Flush(); });
  if (job.stream() != nullptr) {
    SW_ASSIGN_OR_RETURN(const StreamFeedOptions feed,
                        StreamFeedOptionsFor(config, job.stream()->bytes_per_record(), job.num_workers()));
    runner.set_stream(job.stream(), feed);
  }
  const std::string hello = absl::StrCat("hello ", task, " ", thread, " ", job.num_workers());
  const std::string ready = absl::StrCat("ready ", getpid(), " ", job.train_records(), " ", test ? test->count : 0);
  const double patience = config.train.task_timeout_s;
  Clock::time_point contact = Clock::now();
  double backoff = chief.initial_backoff_s;
  std::string last;
  bool joined_before = false;
  while (true) {
    // No deadline: the session lasts as long as the job.
    grpc::ClientContext context;
    AddToken(chief, &context);
    std::unique_ptr<grpc::ClientReaderWriter<net::SessionLine, net::SessionLine>> stream = stub.Session(&context);
    auto write = [&stream](const std::string& line) {
      net::SessionLine m;
      m.set_line(line);
      return stream->Write(m);
    };
    bool joined = false;
    if (write(hello) && write(ready)) {
      net::SessionLine msg;
      while (stream->Read(&msg)) {
        if (!joined) {
          joined = true;
          backoff = chief.initial_backoff_s;
          if (thread == 0) {
            log(absl::StrCat("worker:", task, ": ", joined_before ? "joined the chief again" : "joined the chief",
                             " at ", chief.address));
          }
          joined_before = true;
        }
        contact = Clock::now();
        if (msg.line() == "exit") {
          stream->WritesDone();
          (void)stream->Finish();
          return absl::OkStatus();
        }
        const std::optional<std::string> reply = runner.Run(msg.line(), [&write] { return write("hb"); });
        if (reply && !write(*reply)) break;
        contact = Clock::now();
      }
    }
    const grpc::Status s = stream->Finish();
    if (RefusedForGood(s.error_code())) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      // The slot was given up on (train.restart_workers false) or the job is over.
      log(absl::StrCat("worker:", task, " thread ", thread, ": ", s.error_message()));
      return absl::OkStatus();
    }
    last = s.ok() ? std::string("the session ended") : s.error_message();
    if (SecondsSince(contact) > patience) {
      return absl::UnavailableError(absl::StrFormat(
          "chief:0 (%s) is unavailable: no session for %.1f s (train.task_timeout_s %g), last: %s", chief.address,
          SecondsSince(contact), patience, last));
    }
    BackOff(channel, backoff);
    backoff = NextBackoff(s.error_code(), backoff, chief);
  }
}

}  // namespace

absl::Status RunWorkerTask(const Config& config, const ClusterSpec& spec, int index, const TaskLog& log,
                           const FunctionRegistry* functions) {
  SW_RETURN_IF_ERROR(config.Validate());
  const TaskId task{Role::kWorker, index};
  // Live metrics (metrics.port + 1 + ps tasks + index): the worker threads' counters.
  LiveMetrics live(MetricsRole::kWorker);
  SW_ASSIGN_OR_RETURN(
      const std::unique_ptr<MetricsServer> metrics_server,
      ServeLiveMetrics(config.metrics, MetricsProcess::WorkerTask(index, spec.num_tasks(Role::kPs)), live));
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ClusterStoreConnection> connection,
                      ConnectClusterStore(config, spec, task, log));
  ClusterParamStore* const store = connection->store.get();
  JobOptions jo;
  jo.store = store;
  SW_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Job::Create(config, jo));
  const std::vector<LiveMetrics::Attachment> live_sources = AttachJob(&live, *job);
  SW_ASSIGN_OR_RETURN(PsClientOptions chief, MakePsClientOptions(config.cluster, spec, TaskId{Role::kChief, 0}));
  std::shared_ptr<grpc::Channel> channel = MakeChannel(chief);
  std::unique_ptr<net::Chief::Stub> stub = net::Chief::NewStub(channel);
  int local = 0;
  for (int p = 0; p < store->num_ps(); ++p) local += store->is_local(p) ? 1 : 0;
  log(absl::StrCat(task.ToString(), ": ", job->num_workers(), " worker threads, ", job->train_records(),
                   " training records; ", local, " of ", store->num_ps(), " ps tasks through shared memory"));
  if (metrics_server) log(absl::StrCat(task.ToString(), ": metrics at http://", metrics_server->address(), "/metrics"));
  FunctionRegistry builtins;
  if (functions == nullptr) {
    SW_RETURN_IF_ERROR(AddBuiltinFunctions(&builtins));
    functions = &builtins;
  }
  FunctionContext fc;
  fc.task = index;
  fc.config = &config;
  fc.store = store;
  fc.train = &job->train();
  fc.test = job->test();
  FunctionServer function_server(chief, *functions, fc, log);
  // A refusal by the chief ends Run early, logged there; training goes on.
  std::thread function_thread([&function_server] { (void)function_server.Run(); });
  const absl::Status served = job->pool().RunAll(
      [&](int thread) { return ServeSlot(config, chief, *channel, *stub, *job, *store, index, thread, log); });
  function_server.Stop();
  function_thread.join();
  return served;
}

}  // namespace shardwild
