#include "net/ps_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/base/mutex.h"
#include "core/base/status.h"
#include "net/health.grpc.pb.h"
#include "net/ps.grpc.pb.h"
#include "net/grpc_util.h"
#include "net/ps_service.h"

namespace shardwild {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// The name health checks use for the parameter service ("" = the server).
constexpr char kServiceName[] = "shardwild.net.ParameterServer";

}  // namespace

class PsServer::Impl {
 public:
  Impl(const PsServerOptions& options, ShmParamStore* store)
      : options_(options),
        service_(store, PsService::Options{
                            // Room for the other fields and the length prefixes.
                            .max_chunk_floats = (options.max_message_bytes - 1024) / int64_t{sizeof(float)},
                            .max_push_bytes = options.max_push_bytes,
                            .checkpoint_dir = options.checkpoint_dir,
                            .checkpoint_keep = options.checkpoint_keep,
                            .task_name = options.task_name,
                            .start_closed = options.start_closed,
                            .exit_when_done = options.exit_when_done}),
        ps_(this),
        health_(this) {}

  absl::Status Start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(options_.bind_address, ServerCredentialsOf(options_), &port_);
    // Two servers must not share a port silently (gRPC sets SO_REUSEPORT by default).
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    SetServerKeepalive(options_, &builder);
    builder.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
    builder.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
    grpc::ResourceQuota quota(absl::StrCat("shardwild-", options_.task_name));
    quota.SetMaxThreads(256);
    builder.SetResourceQuota(quota);
    builder.RegisterService(&ps_);
    builder.RegisterService(&health_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      server_.reset();
      return absl::UnavailableError(absl::StrCat(options_.task_name, ": cannot listen on ", options_.bind_address,
                                                 " (in use, or not an address of this machine)"));
    }
    return absl::OkStatus();
  }

  void Shutdown(double grace_s) {
    {
      MutexLock lock(&mu_);
      if (shut_down_) return;
      shut_down_ = true;
    }
    health_cv_.SignalAll();
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(grace_s * 1e6)));
      server_->Wait();
    }
  }

  void SetServing(bool serving) {
    {
      MutexLock lock(&mu_);
      serving_ = serving;
    }
    health_cv_.SignalAll();
  }

  // Counts the call and checks its token. Non-OK = reject with this status.
  grpc::Status Admit(grpc::ServerContext* context) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    grpc::Status s = CheckToken(*context, options_.token, options_.task_name);
    if (!s.ok()) permission_denied_.fetch_add(1, std::memory_order_relaxed);
    return s;
  }

  grpc::Status Finish(const absl::Status& s) {
    if (s.code() == absl::StatusCode::kInvalidArgument) invalid_argument_.fetch_add(1, std::memory_order_relaxed);
    return ToGrpc(s);
  }

  const PsService& service() const { return service_; }

  PsServer::Stats stats() const {
    PsServer::Stats s;
    s.calls = calls_.load(std::memory_order_relaxed);
    s.permission_denied = permission_denied_.load(std::memory_order_relaxed);
    s.invalid_argument = invalid_argument_.load(std::memory_order_relaxed);
    s.pushes_applied = service_.pushes_applied();
    s.pushes_deduplicated = service_.pushes_deduplicated();
    return s;
  }

  int port() const { return port_; }
  const PsServerOptions& options() const { return options_; }

 private:
  class ParameterServerImpl final : public net::ParameterServer::Service {
   public:
    explicit ParameterServerImpl(Impl* impl) : impl_(impl) {}

    grpc::Status GetLayout(grpc::ServerContext* context, const net::LayoutRequest*,
                           net::LayoutResponse* response) override {
      if (grpc::Status s = impl_->Admit(context); !s.ok()) return s;
      impl_->service_.GetLayout(response);
      return grpc::Status::OK;
    }
    grpc::Status PullDense(grpc::ServerContext* context, const net::PullDenseRequest* request,
                           grpc::ServerWriter<net::DenseChunk>* writer) override {
      if (grpc::Status s = impl_->Admit(context); !s.ok()) return s;
      return impl_->Finish(
          impl_->service_.PullDense(*request, [writer](const net::DenseChunk& c) { return writer->Write(c); }));
    }
    grpc::Status PullDenseBatch(grpc::ServerContext* context, const net::PullDenseBatchRequest* request,
                                grpc::ServerWriter<net::DenseChunk>* writer) override {
      if (grpc::Status s = impl_->Admit(context); !s.ok()) return s;
      return impl_->Finish(
          impl_->service_.PullDenseBatch(*request, [writer](const net::DenseChunk& c) { return writer->Write(c); }));
    }
    grpc::Status PushDense(grpc::ServerContext* context, grpc::ServerReader<net::PushDenseRequest>* reader,
                           net::PushResponse* response) override {
      if (grpc::Status s = impl_->Admit(context); !s.ok()) return s;
      return impl_->Finish(impl_->service_.PushDense(
          [reader](net::PushDenseRequest* m) { return reader->Read(m); }, response));
    }
    grpc::Status PullRowsBatch(grpc::ServerContext* context, const net::PullRowsBatchRequest* request,
                               grpc::ServerWriter<net::RowsChunk>* writer) override {
      if (grpc::Status s = impl_->Admit(context); !s.ok()) return s;
      return impl_->Finish(
          impl_->service_.PullRowsBatch(*request, [writer](const net::RowsChunk& c) { return writer->Write(c); }));
    }
    grpc::Status PushRowsBatch(grpc::ServerContext* context, grpc::ServerReader<net::PushRowsRequest>* reader,
                               net::PushResponse* response) override {
      if (grpc::Status s = impl_->Admit(context); !s.ok()) return s;
      return impl_->Finish(
          impl_->service_.PushRowsBatch([reader](net::PushRowsRequest* m) { return reader->Read(m); }, response));
    }
    grpc::Status Version(grpc::ServerContext* context, const net::VersionRequest*,
                         net::VersionResponse* response) override {
      if (grpc::Status s = impl_->Admit(context); !s.ok()) return s;
      response->set_version(impl_->service_.Version());
      return grpc::Status::OK;
    }
    grpc::Status SaveShard(grpc::ServerContext* context, const net::SaveShardRequest* request,
                           net::SaveShardResponse* response) override {
      if (grpc::Status s = impl_->Admit(context); !s.ok()) return s;
      return impl_->Finish(impl_->service_.SaveShard(*request, response));
    }
    grpc::Status RestoreShard(grpc::ServerContext* context, const net::RestoreShardRequest* request,
                              net::RestoreShardResponse* response) override {
      if (grpc::Status s = impl_->Admit(context); !s.ok()) return s;
      return impl_->Finish(impl_->service_.RestoreShard(*request, response));
    }
    grpc::Status JobDone(grpc::ServerContext* context, const net::JobDoneRequest* request,
                         net::JobDoneResponse* response) override {
      if (grpc::Status s = impl_->Admit(context); !s.ok()) return s;
      impl_->service_.JobDone(*request, response);
      return grpc::Status::OK;
    }

   private:
    Impl* const impl_;
  };

  class HealthImpl final : public grpc::health::v1::Health::Service {
   public:
    explicit HealthImpl(Impl* impl) : impl_(impl) {}

    grpc::Status Check(grpc::ServerContext* context, const HealthCheckRequest* request,
                       HealthCheckResponse* response) override {
      if (grpc::Status s = impl_->Admit(context); !s.ok()) return s;
      if (!Known(request->service())) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            absl::StrCat("unknown service '", request->service(), "' (this server has '",
                                         kServiceName, "')"));
      }
      response->set_status(impl_->Current());
      return grpc::Status::OK;
    }

    // Sends the status now and at every change, until the client cancels or
    // the server shuts down (then NOT_SERVING, and the stream ends).
    grpc::Status Watch(grpc::ServerContext* context, const HealthCheckRequest* request,
                       grpc::ServerWriter<HealthCheckResponse>* writer) override {
      if (grpc::Status s = impl_->Admit(context); !s.ok()) return s;
      const bool known = Known(request->service());
      int last = -1;
      while (true) {
        HealthCheckResponse::ServingStatus now;
        bool stop;
        {
          MutexLock lock(&impl_->mu_);
          impl_->health_cv_.WaitFor(&impl_->mu_, std::chrono::milliseconds(100), [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return impl_->shut_down_ || last != StatusLocked(known);
          });
          stop = impl_->shut_down_;
          now = stop ? HealthCheckResponse::NOT_SERVING : StatusLocked(known);
        }
        if (now != last) {
          HealthCheckResponse r;
          r.set_status(now);
          if (!writer->Write(r)) return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
          last = now;
        }
        if (stop) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
        if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled");
      }
    }

   private:
    static bool Known(const std::string& service) { return service.empty() || service == kServiceName; }
    HealthCheckResponse::ServingStatus StatusLocked(bool known) ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl_->mu_) {
      if (!known) return HealthCheckResponse::SERVICE_UNKNOWN;
      return impl_->serving_ ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
    }
    Impl* const impl_;
  };

  HealthCheckResponse::ServingStatus Current() {
    MutexLock lock(&mu_);
    return serving_ ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  }

  // Constant after construction.
  const PsServerOptions options_;
  PsService service_;
  ParameterServerImpl ps_;
  HealthImpl health_;
  std::unique_ptr<grpc::Server> server_;  // set by Start, before any call
  int port_ = 0;                          // set by Start

  Mutex mu_;
  // State below is guarded by mu_.
  bool serving_ ABSL_GUARDED_BY(mu_) = true;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  CondVar health_cv_;  // signalled when serving_ or shut_down_ changes

  // Atomics: counters only, relaxed (they order nothing).
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> permission_denied_{0};
  std::atomic<uint64_t> invalid_argument_{0};
};

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(const PsServerOptions& options, ShmParamStore* store) {
  SW_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>(options, store);
  SW_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<PsServer>(new PsServer(std::move(impl)));
}

PsServer::PsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PsServer::~PsServer() { Shutdown(); }

int PsServer::port() const { return impl_->port(); }

std::string PsServer::address() const {
  const std::string& bind = impl_->options().bind_address;
  return absl::StrCat(bind.substr(0, bind.rfind(':')), ":", impl_->port());
}

void PsServer::SetServing(bool serving) { impl_->SetServing(serving); }

void PsServer::Shutdown(double grace_s) { impl_->Shutdown(grace_s); }

bool PsServer::job_done() const { return impl_->service().job_done(); }

PsServer::Stats PsServer::stats() const { return impl_->stats(); }

}  // namespace shardwild
