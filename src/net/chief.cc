#include "net/chief.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/base/mutex.h"
#include "core/base/status.h"
#include "net/chief.grpc.pb.h"
#include "net/grpc_util.h"
#include "workers/coordinator.h"

namespace shardwild {
namespace {

using Stream = grpc::ServerReaderWriter<net::SessionLine, net::SessionLine>;

// One session's state: a worker task's thread connected to one slot. Shared by the
// gRPC handler (which reads) and the slot's channel (which writes).
struct SessionState {
  Mutex mu;
  // Null once the handler has ended (the stream is gone with it).
  grpc::ServerContext* context ABSL_GUARDED_BY(mu) = nullptr;
  Stream* stream ABSL_GUARDED_BY(mu) = nullptr;
  CondVar ended;  // signalled when the handler clears `stream`

  // Writes `line`; false when the session has ended or the write failed.
  bool Write(const std::string& line) {
    MutexLock lock(&mu);
    if (stream == nullptr) return false;
    net::SessionLine msg;
    msg.set_line(line);
    return stream->Write(msg);
  }
  // Makes the handler's Read (and any Write) fail, so the session ends.
  void Cancel() {
    MutexLock lock(&mu);
    if (context != nullptr) context->TryCancel();
  }
  bool done() {
    MutexLock lock(&mu);
    return stream == nullptr;
  }
};

using FunctionStream = grpc::ServerReaderWriter<net::FunctionMessage, net::FunctionMessage>;

// One worker task's Functions stream and the calls waiting for answers.
// Shared by its handler (which reads the answers) and the callers (which
// write calls).
struct FunctionLink {
  Mutex mu;
  // Null once the handler has ended (the stream is gone with it).
  grpc::ServerContext* context ABSL_GUARDED_BY(mu) = nullptr;
  FunctionStream* stream ABSL_GUARDED_BY(mu) = nullptr;
  CondVar changed;  // an answer arrived, or the stream ended
  // An answer as it came: plain values, turned into a Status by the caller
  // (a Status made on one thread and dropped on another shares a reference
  // count TSan cannot see in Debian's uninstrumented abseil).
  struct Answer {
    int code = 0;
    std::string payload;
    std::string error;
  };
  // Calls sent and not yet taken by their caller: the answer once it came.
  std::map<uint64_t, std::optional<Answer>> pending ABSL_GUARDED_BY(mu);
  uint64_t next_id ABSL_GUARDED_BY(mu) = 1;
};

// What the loop knows of one slot, shared with the handlers.
struct SlotEntry {
  bool open = false;                 // a session may attach (Spawn'd, not reaped)
  bool opened_before = false;        // Spawn'd at least once (else the loop has not started it yet)
  bool joined = false;               // a session attached at least once
  bool told_over = false;            // a hello was answered "the job is over"
  std::shared_ptr<Inbox> inbox;      // this opening's incoming lines
  std::shared_ptr<SessionState> session;  // attached, until reaped
};

// A slot's channel: lines out through the session's stream, lines in
// through the inbox the handler fills.
class SessionChannel final : public SlotChannel {
 public:
  SessionChannel(RemoteWorkers::Impl* impl, int slot, std::shared_ptr<Inbox> inbox)
      : impl_(impl), slot_(slot), inbox_(std::move(inbox)) {}
  bool Send(const std::string& line) override;
  bool Fill() override { return inbox_->Drain(&buf_); }
  int fd() const override { return inbox_->read_fd(); }

 private:
  RemoteWorkers::Impl* const impl_;
  const int slot_;
  const std::shared_ptr<Inbox> inbox_;
};

}  // namespace

class RemoteWorkers::Impl final : public net::Chief::Service {
 public:
  explicit Impl(const ChiefServerOptions& options)
      : options_(options),
        started_(std::chrono::steady_clock::now()),
        slots_(static_cast<size_t>(options.worker_tasks * options.threads_per_task)),
        functions_(static_cast<size_t>(options.worker_tasks)) {}

  absl::Status Start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(options_.server.bind_address, ServerCredentialsOf(options_.server), &port_);
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    SetServerKeepalive(options_.server, &builder);
    builder.SetMaxReceiveMessageSize(static_cast<int>(options_.server.max_message_bytes));
    builder.SetMaxSendMessageSize(static_cast<int>(options_.server.max_message_bytes));
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      server_.reset();
      return absl::UnavailableError(absl::StrCat(options_.server.task_name, ": cannot listen on ",
                                                 options_.server.bind_address,
                                                 " (in use, or not an address of this machine)"));
    }
    return absl::OkStatus();
  }

  void Shutdown() {
    std::vector<std::shared_ptr<SessionState>> sessions;
    {
      MutexLock lock(&mu_);
      shut_down_ = true;
      for (SlotEntry& e : slots_) {
        e.open = false;
        if (e.session) sessions.push_back(std::move(e.session));
        e.session.reset();
      }
    }
    for (auto& s : sessions) s->Cancel();
    std::vector<std::shared_ptr<FunctionLink>> links;
    {
      MutexLock lock(&mu_);
      for (std::shared_ptr<FunctionLink>& f : functions_) {
        if (f) links.push_back(f);
      }
    }
    for (auto& f : links) {
      MutexLock lock(&f->mu);
      if (f->context != nullptr) f->context->TryCancel();
    }
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      server_->Wait();
      server_.reset();
    }
  }

  grpc::Status Session(grpc::ServerContext* context, Stream* stream) override {
    if (grpc::Status s = CheckToken(*context, options_.server.token, options_.server.task_name); !s.ok()) return s;
    net::SessionLine hello;
    if (!stream->Read(&hello)) return grpc::Status(grpc::StatusCode::CANCELLED, "no hello");
    // hello <worker task index> <thread> <threads>
    const std::vector<std::string> f = absl::StrSplit(hello.line(), ' ');
    int task = -1, thread = -1, threads = -1;
    if (f.size() != 4 || f[0] != "hello" || !absl::SimpleAtoi(f[1], &task) || !absl::SimpleAtoi(f[2], &thread) ||
        !absl::SimpleAtoi(f[3], &threads)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(options_.server.task_name, ": malformed hello '", hello.line().substr(0, 100),
                                       "'"));
    }
    if (task < 0 || task >= options_.worker_tasks) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(options_.server.task_name, ": worker:", task, " is not a worker task of the "
                                       "cluster (it has ", options_.worker_tasks, ")"));
    }
    if (threads != options_.threads_per_task || thread < 0 || thread >= threads) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(options_.server.task_name, ": worker:", task, " runs ", threads,
                                       " worker threads, the chief expects ", options_.threads_per_task,
                                       " per worker task (train.workers must resolve alike on every task)"));
    }
    const int index = task * options_.threads_per_task + thread;
    auto session = std::make_shared<SessionState>();
    std::shared_ptr<Inbox> inbox;
    {
      MutexLock lock(&mu_);
      SlotEntry& e = slots_[index];
      if (!shut_down_ && !job_over_ && !e.open && !e.opened_before) {
        // The loop has not opened its slots yet (the chief is still setting
        // up, or running scheduled functions before training).
        return grpc::Status(grpc::StatusCode::ABORTED,
                            absl::StrCat(options_.server.task_name, ": worker:", task, " thread ", thread,
                                         ": the chief has not opened this slot yet; retry"));
      }
      if (shut_down_ || job_over_ || !e.open) {
        const bool over = shut_down_ || job_over_;
        if (over && !e.told_over) {
          e.told_over = true;
          slots_changed_.SignalAll();
        }
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrCat(options_.server.task_name, ": worker:", task, " thread ", thread,
                                         over ? ": the job is over" : ": the chief gave up on this slot"));
      }
      if (e.session != nullptr) {
        return grpc::Status(grpc::StatusCode::ABORTED,
                            absl::StrCat(options_.server.task_name, ": worker:", task, " thread ", thread,
                                         " has a session still open; retry"));
      }
      {
        MutexLock sl(&session->mu);
        session->context = context;
        session->stream = stream;
      }
      e.session = session;
      e.joined = true;
      inbox = e.inbox;
    }
    net::SessionLine msg;
    while (stream->Read(&msg)) inbox->Post(msg.line());
    inbox->End();
    context->TryCancel();  // a Write of the loop in flight fails now
    {
      MutexLock sl(&session->mu);
      session->context = nullptr;
      session->stream = nullptr;
    }
    session->ended.SignalAll();
    return grpc::Status::OK;
  }

  grpc::Status Functions(grpc::ServerContext* context, FunctionStream* stream) override {
    if (grpc::Status s = CheckToken(*context, options_.server.token, options_.server.task_name); !s.ok()) return s;
    net::FunctionMessage hello;
    if (!stream->Read(&hello)) return grpc::Status(grpc::StatusCode::CANCELLED, "no hello");
    const int task = hello.task();
    if (task < 0 || task >= options_.worker_tasks) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(options_.server.task_name, ": worker:", task, " is not a worker task of the "
                                       "cluster (it has ", options_.worker_tasks, ")"));
    }
    auto link = std::make_shared<FunctionLink>();
    {
      MutexLock sl(&link->mu);
      link->context = context;
      link->stream = stream;
    }
    {
      MutexLock lock(&mu_);
      if (shut_down_) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrCat(options_.server.task_name, ": the job is over"));
      }
      if (functions_[task] != nullptr) {
        return grpc::Status(grpc::StatusCode::ABORTED,
                            absl::StrCat(options_.server.task_name, ": worker:", task,
                                         " has a function stream still open; retry"));
      }
      functions_[task] = link;
    }
    functions_changed_.SignalAll();
    net::FunctionMessage answer;
    while (stream->Read(&answer)) {
      MutexLock sl(&link->mu);
      const auto it = link->pending.find(answer.id());
      if (it == link->pending.end() || it->second.has_value()) continue;  // not asked for: ignored
      it->second.emplace(FunctionLink::Answer{answer.code(), answer.payload(), answer.error()});
      link->changed.SignalAll();
    }
    context->TryCancel();  // a caller's Write in flight fails now
    {
      MutexLock sl(&link->mu);
      link->context = nullptr;
      link->stream = nullptr;
    }
    link->changed.SignalAll();
    {
      MutexLock lock(&mu_);
      if (functions_[task] == link) functions_[task].reset();
    }
    functions_changed_.SignalAll();
    return grpc::Status::OK;
  }

  bool FunctionsConnected(int task) {
    MutexLock lock(&mu_);
    return functions_[task] != nullptr;
  }

  bool WaitForFunctions(int task, std::chrono::steady_clock::time_point deadline) {
    MutexLock lock(&mu_);
    return functions_changed_.WaitFor(&mu_, deadline - std::chrono::steady_clock::now(),
                                      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return functions_[task] != nullptr; });
  }

  absl::StatusOr<std::string> CallFunction(int task, const std::string& name, const std::string& args) {
    std::shared_ptr<FunctionLink> link;
    {
      MutexLock lock(&mu_);
      link = functions_[task];
    }
    if (link == nullptr) {
      return WorkerLostError(absl::StrCat("worker:", task, " is not connected for scheduled functions"));
    }
    MutexLock sl(&link->mu);
    if (link->stream == nullptr) {
      return WorkerLostError(absl::StrCat("worker:", task, "'s function stream has ended"));
    }
    const uint64_t id = link->next_id++;
    link->pending[id];
    net::FunctionMessage call;
    call.set_id(id);
    call.set_name(name);
    call.set_payload(args);
    if (!link->stream->Write(call)) {
      link->pending.erase(id);
      return WorkerLostError(absl::StrCat("worker:", task, "'s function stream has ended"));
    }
    link->changed.Wait(&link->mu, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(link->mu) {
      return link->pending[id].has_value() || link->stream == nullptr;
    });
    std::optional<FunctionLink::Answer> answer = std::move(link->pending[id]);
    link->pending.erase(id);
    if (!answer) {
      return WorkerLostError(absl::StrCat("worker:", task, " was lost while it ran function '", name, "'"));
    }
    if (answer->code == 0) return std::move(answer->payload);
    const int code = answer->code;
    return absl::Status(code > 0 && code <= 16 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown,
                        answer->error);
  }

  // ---- The loop's side ----

  // The job is over: every hello from now on is answered so (its worker
  // thread then exits cleanly).
  void EndJob() {
    MutexLock lock(&mu_);
    job_over_ = true;
  }

  // After EndJob: waits until every slot that never had a session has been
  // told the job is over, or options.late_join_wait_s after Start; says what
  // it waits for, and who it gave up on. Without EndJob (a failed job), at
  // once.
  void WaitForLateJoiners() {
    std::vector<std::string> waiting;
    {
      MutexLock lock(&mu_);
      if (!job_over_) return;
      waiting = UntoldLocked();
    }
    if (waiting.empty()) return;
    const auto deadline = started_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                         std::chrono::duration<double>(options_.late_join_wait_s));
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left > 0) {
      Say(absl::StrFormat("%s: the job is over; waiting up to %.1f s more (%s from the chief's start) for %s, "
                          "which never joined, to hear so",
                          options_.server.task_name, left, options_.late_join_wait_setting,
                          absl::StrJoin(waiting, ", ")));
      MutexLock lock(&mu_);
      slots_changed_.WaitFor(&mu_, deadline - std::chrono::steady_clock::now(),
                             [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return UntoldLocked().empty(); });
      waiting = UntoldLocked();
    }
    if (!waiting.empty()) {
      Say(absl::StrCat("warning: ", options_.server.task_name, ": ", absl::StrJoin(waiting, ", "),
                       " never joined; such a worker task stops on its own once it has found no chief for ",
                       options_.late_join_wait_setting));
    }
  }

  absl::StatusOr<std::shared_ptr<Inbox>> Open(int index) {
    SW_ASSIGN_OR_RETURN(std::shared_ptr<Inbox> inbox, Inbox::Create());
    MutexLock lock(&mu_);
    SlotEntry& e = slots_[index];
    e.open = true;
    e.opened_before = true;
    e.inbox = inbox;
    e.session.reset();
    return inbox;
  }

  void Close(int index) {
    std::shared_ptr<SessionState> session;
    {
      MutexLock lock(&mu_);
      SlotEntry& e = slots_[index];
      e.open = false;
      if (e.inbox) e.inbox->Close();
      e.inbox.reset();
      session = std::move(e.session);
      e.session.reset();
    }
    if (session) session->Cancel();
  }

  std::shared_ptr<SessionState> SessionOf(int index) {
    MutexLock lock(&mu_);
    return slots_[index].session;
  }

  bool Awaiting(int index) {
    MutexLock lock(&mu_);
    return slots_[index].open && slots_[index].session == nullptr;
  }

  int port() const { return port_; }
  int worker_tasks() const { return options_.worker_tasks; }

 private:
  std::string SlotName(int index) const {
    return absl::StrCat("worker:", index / options_.threads_per_task, " thread ", index % options_.threads_per_task);
  }
  // The slots that never had a session and were not told the job is over.
  std::vector<std::string> UntoldLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> names;
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i].joined && !slots_[i].told_over) names.push_back(SlotName(static_cast<int>(i)));
    }
    return names;
  }
  void Say(const std::string& line) const {
    if (options_.log) options_.log(line);
  }

  const ChiefServerOptions options_;
  const std::chrono::steady_clock::time_point started_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  Mutex mu_;
  std::vector<SlotEntry> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<FunctionLink>> functions_ ABSL_GUARDED_BY(mu_);  // [worker task]: its open stream
  CondVar functions_changed_;  // a function stream opened or ended
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool job_over_ ABSL_GUARDED_BY(mu_) = false;  // ExitAll came: hellos are told so
  CondVar slots_changed_;  // a slot's told_over became true
};

namespace {

bool SessionChannel::Send(const std::string& line) {
  std::shared_ptr<SessionState> s = impl_->SessionOf(slot_);
  return s != nullptr && s->Write(line);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteWorkers>> RemoteWorkers::Start(const ChiefServerOptions& options) {
  SW_RETURN_IF_ERROR(options.server.Validate());
  if (!(options.late_join_wait_s >= 0) || !std::isfinite(options.late_join_wait_s)) {
    return absl::InvalidArgumentError(absl::StrCat("the chief's late_join_wait_s must be a finite number >= 0, got ",
                                                   options.late_join_wait_s));
  }
  if (options.worker_tasks < 1 || options.threads_per_task < 1) {
    return absl::InvalidArgumentError(absl::StrCat("the chief needs at least one worker task and thread, got ",
                                                   options.worker_tasks, " x ", options.threads_per_task));
  }
  auto impl = std::make_unique<Impl>(options);
  SW_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<RemoteWorkers>(
      new RemoteWorkers(options.worker_tasks * options.threads_per_task, std::move(impl)));
}

RemoteWorkers::RemoteWorkers(int slots, std::unique_ptr<Impl> impl) : TaskWorkers(slots), impl_(std::move(impl)) {}

RemoteWorkers::~RemoteWorkers() {
  // After a job that ended (ExitAll), not after a failed one.
  impl_->WaitForLateJoiners();
  for (Slot& s : slots()) {
    if (s.pid > 0) Reap(s, /*kill_first=*/true);
  }
  impl_->Shutdown();
}

absl::Status RemoteWorkers::Spawn(Slot& slot) {
  SW_ASSIGN_OR_RETURN(std::shared_ptr<Inbox> inbox, impl_->Open(slot.index));
  const int fd = inbox->read_fd();
  // pid 1 until the worker task's `ready` names its own (the loop's liveness
  // mark: > 0 while the slot is in use).
  Started(slot, 1, fd, std::make_unique<SessionChannel>(impl_.get(), slot.index, std::move(inbox)));
  return absl::OkStatus();
}

int RemoteWorkers::Reap(Slot& slot, bool /*kill_first*/) {
  impl_->Close(slot.index);
  Cleared(slot);
  return 0;
}

void RemoteWorkers::ExitAll(double grace_s) {
  impl_->EndJob();
  std::vector<std::shared_ptr<SessionState>> sessions;
  for (Slot& s : slots()) {
    if (s.pid <= 0) continue;
    if (std::shared_ptr<SessionState> session = impl_->SessionOf(s.index)) {
      session->Write("exit");
      sessions.push_back(std::move(session));
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  for (auto& session : sessions) {
    MutexLock lock(&session->mu);
    session->ended.WaitFor(&session->mu, deadline - std::chrono::steady_clock::now(),
                           [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(session->mu) { return session->stream == nullptr; });
  }
  for (Slot& s : slots()) {
    if (s.pid > 0) Reap(s, /*kill_first=*/true);
  }
}

bool RemoteWorkers::awaiting(const Slot& slot) const { return slot.pid > 0 && impl_->Awaiting(slot.index); }

int RemoteWorkers::port() const { return impl_->port(); }

int RemoteWorkers::worker_tasks() const { return impl_->worker_tasks(); }

bool RemoteWorkers::FunctionsConnected(int task) const {
  return task >= 0 && task < worker_tasks() && impl_->FunctionsConnected(task);
}

bool RemoteWorkers::WaitForFunctions(int task, std::chrono::steady_clock::time_point deadline) const {
  return task >= 0 && task < worker_tasks() && impl_->WaitForFunctions(task, deadline);
}

absl::StatusOr<std::string> RemoteWorkers::CallFunction(int task, const std::string& name, const std::string& args) {
  if (task < 0 || task >= worker_tasks()) {
    return absl::InvalidArgumentError(absl::StrCat("no worker task ", task, " (the cluster has ", worker_tasks(), ")"));
  }
  return impl_->CallFunction(task, name, args);
}

}  // namespace shardwild
