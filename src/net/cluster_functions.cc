#include "net/cluster_functions.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/base/status.h"
#include "net/chief.grpc.pb.h"
#include "net/grpc_util.h"

namespace shardwild {

absl::Status FunctionRegistry::Register(const std::string& name, RemoteFunction fn) {
  if (name.empty()) return absl::InvalidArgumentError("a scheduled function needs a name");
  if (fn == nullptr) return absl::InvalidArgumentError(absl::StrCat("function '", name, "' is null"));
  if (!functions_.emplace(name, std::move(fn)).second) {
    return absl::AlreadyExistsError(absl::StrCat("a function named '", name, "' is registered already"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FunctionRegistry::Call(const FunctionContext& context, const std::string& name,
                                                   absl::string_view args) const {
  const auto it = functions_.find(name);
  if (it == functions_.end()) {
    return absl::NotFoundError(absl::StrCat("worker:", context.task, " has no function '", name, "' (it has: ",
                                            absl::StrJoin(names(), ", "), ")"));
  }
  try {
    return it->second(context, args);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("function '", name, "' threw: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat("function '", name, "' threw"));
  }
}

std::vector<std::string> FunctionRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, fn] : functions_) out.push_back(name);
  return out;
}

absl::Status AddBuiltinFunctions(FunctionRegistry* registry) {
  SW_RETURN_IF_ERROR(registry->Register("version", [](const FunctionContext& c, absl::string_view) {
    return absl::StatusOr<std::string>(absl::StrCat(c.store->version()));
  }));
  SW_RETURN_IF_ERROR(registry->Register("records", [](const FunctionContext& c, absl::string_view) {
    return absl::StatusOr<std::string>(absl::StrCat(c.train->count, " ", c.test ? c.test->count : 0));
  }));
  SW_RETURN_IF_ERROR(
      registry->Register("pull", [](const FunctionContext& c, absl::string_view args) -> absl::StatusOr<std::string> {
        const StoreLayout& l = c.store->layout();
        for (size_t v = 0; v < l.variables.size(); ++v) {
          if (l.variables[v].name != args) continue;
          std::vector<float> values(l.variables[v].size());
          SW_RETURN_IF_ERROR(c.store->PullVariable(static_cast<int>(v), values.data()));
          return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
        }
        return absl::InvalidArgumentError(absl::StrCat("pull: the model has no variable '", args, "'"));
      }));
  SW_RETURN_IF_ERROR(registry->Register(
      "pull_rows", [](const FunctionContext& c, absl::string_view args) -> absl::StatusOr<std::string> {
        const std::vector<absl::string_view> f = absl::StrSplit(args, ' ', absl::SkipEmpty());
        int table = -1;
        if (f.empty() || !absl::SimpleAtoi(f[0], &table) || table < 0 ||
            table >= static_cast<int>(c.store->layout().tables.size())) {
          return absl::InvalidArgumentError(absl::StrCat("pull_rows: expected '<table> <id>...' with a table in [0, ",
                                                         c.store->layout().tables.size(), "), got '",
                                                         args.substr(0, 100), "'"));
        }
        std::vector<uint64_t> ids(f.size() - 1);
        for (size_t i = 1; i < f.size(); ++i) {
          if (!absl::SimpleAtoi(f[i], &ids[i - 1])) {
            return absl::InvalidArgumentError(absl::StrCat("pull_rows: id ", i, " '", f[i], "' is not a number"));
          }
        }
        std::vector<float> rows(ids.size() * c.store->layout().tables[table].dim);
        RowScratch scratch;
        SW_RETURN_IF_ERROR(c.store->PullRows(table, ids, rows.data(), PullMode::kReadOnly, &scratch));
        return std::string(reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(float));
      }));
  return absl::OkStatus();
}

FunctionServer::FunctionServer(const PsClientOptions& chief, const FunctionRegistry& registry,
                               FunctionContext context, TaskLog log)
    : chief_(chief), registry_(registry), context_(context), log_(std::move(log)) {}

void FunctionServer::Stop() {
  MutexLock lock(&mu_);
  stop_ = true;
  if (call_ != nullptr) call_->TryCancel();
}

absl::Status FunctionServer::Run() {
  std::shared_ptr<grpc::Channel> channel = MakeChannel(chief_);
  std::unique_ptr<net::Chief::Stub> stub = net::Chief::NewStub(channel);
  double backoff = chief_.initial_backoff_s;
  bool joined_before = false;
  while (true) {
    // No deadline: the stream lasts as long as the job.
    grpc::ClientContext context;
    AddToken(chief_, &context);
    {
      MutexLock lock(&mu_);
      if (stop_) return absl::OkStatus();
      call_ = &context;
    }
    std::unique_ptr<grpc::ClientReaderWriter<net::FunctionMessage, net::FunctionMessage>> stream =
        stub->Functions(&context);
    net::FunctionMessage hello;
    hello.set_task(context_.task);
    if (stream->Write(hello)) {
      net::FunctionMessage call;
      while (stream->Read(&call)) {
        if (!joined_before) {
          joined_before = true;
          log_(absl::StrCat("worker:", context_.task, ": serving scheduled functions (",
                            absl::StrJoin(registry_.names(), ", "), ")"));
        }
        backoff = chief_.initial_backoff_s;
        absl::StatusOr<std::string> value = registry_.Call(context_, call.name(), call.payload());
        net::FunctionMessage result;
        result.set_id(call.id());
        if (value.ok()) {
          result.set_payload(*std::move(value));
        } else {
          result.set_code(static_cast<int>(value.status().code()));
          result.set_error(std::string(value.status().message()));
        }
        if (!stream->Write(result)) break;
      }
    }
    const grpc::Status s = stream->Finish();
    {
      MutexLock lock(&mu_);
      call_ = nullptr;
      if (stop_) return absl::OkStatus();
    }
    if (RefusedForGood(s.error_code())) {
      log_(absl::StrCat("worker:", context_.task, ": the chief refuses scheduled functions: ", s.error_message()));
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    BackOff(*channel, backoff, [this] {
      MutexLock lock(&mu_);
      return stop_;
    });
    backoff = NextBackoff(s.error_code(), backoff, chief_);
  }
}

namespace {

// Worker task `task` of a ClusterCoordinator: a function runs on the
// dispatch thread, as a call to the worker task; a lost one is back once
// its stream is open again.
class TaskExecutor final : public WorkerExecutor {
 public:
  TaskExecutor(RemoteWorkers* workers, int task) : workers_(workers), task_(task) {}
  absl::Status Run(absl::FunctionRef<absl::Status()> fn) override { return fn(); }
  absl::Status Restart() override {
    if (workers_->FunctionsConnected(task_)) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("worker:", task_, " has not reconnected"));
  }

 private:
  RemoteWorkers* const workers_;
  const int task_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterCoordinator>> ClusterCoordinator::Create(RemoteWorkers* workers) {
  if (workers == nullptr) return absl::InvalidArgumentError("ClusterCoordinator: no RemoteWorkers");
  std::unique_ptr<ClusterCoordinator> c(new ClusterCoordinator(workers));
  std::vector<std::unique_ptr<WorkerExecutor>> executors;
  for (int t = 0; t < workers->worker_tasks(); ++t) executors.push_back(std::make_unique<TaskExecutor>(workers, t));
  SW_ASSIGN_OR_RETURN(c->coordinator_, Coordinator::Create(std::move(executors)));
  return c;
}

absl::Status ClusterCoordinator::WaitForWorkers(double timeout_s) {
  const std::chrono::steady_clock::time_point deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
  std::vector<std::string> missing;
  for (int t = 0; t < workers_->worker_tasks(); ++t) {
    if (!workers_->WaitForFunctions(t, deadline)) missing.push_back(absl::StrCat("worker:", t));
  }
  if (!missing.empty()) {
    return absl::UnavailableError(absl::StrCat(absl::StrJoin(missing, ", "), " did not connect for scheduled "
                                               "functions within ", timeout_s, " s"));
  }
  BringBack();
  return absl::OkStatus();
}

void ClusterCoordinator::BringBack() {
  for (int t = 0; t < workers_->worker_tasks(); ++t) {
    if (workers_->FunctionsConnected(t)) (void)coordinator_->RestartWorker(t);
  }
}

RemoteValue<std::string> ClusterCoordinator::Schedule(const std::string& name, std::string args) {
  BringBack();
  return coordinator_->Schedule(
      [workers = workers_, name](const WorkerContext& ctx, const std::string& a) -> absl::StatusOr<std::string> {
        return workers->CallFunction(ctx.worker_index(), name, a);
      },
      std::move(args));
}

std::vector<absl::StatusOr<std::string>> ClusterCoordinator::CallOnEach(const std::string& name,
                                                                         const std::string& args) {
  std::vector<absl::StatusOr<std::string>> out;
  for (int t = 0; t < workers_->worker_tasks(); ++t) out.push_back(workers_->CallFunction(t, name, args));
  return out;
}

absl::Status ClusterCoordinator::Join() {
  BringBack();
  return coordinator_->Join();
}

bool ClusterCoordinator::Done() { return coordinator_->Done(); }

}  // namespace shardwild
