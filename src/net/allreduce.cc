#include "net/allreduce.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <map>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/mutex.h"
#include "core/base/status.h"
#include "net/grpc_util.h"
#include "net/rendezvous.grpc.pb.h"

namespace shardwild {
namespace {

using Clock = std::chrono::steady_clock;

// Rank 0's key-value store: Set stores, Get waits for the key up to its
// wait_s (bounded by the call's deadline).
class RendezvousService final : public net::Rendezvous::Service {
 public:
  explicit RendezvousService(std::string token) : token_(std::move(token)) {}

  grpc::Status Set(grpc::ServerContext* context, const net::KeyValue* request, net::RendezvousReply*) override {
    if (grpc::Status s = CheckToken(*context, token_, "rendezvous"); !s.ok()) return s;
    MutexLock lock(&mu_);
    values_[request->key()] = request->value();
    changed_.SignalAll();
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* context, const net::KeyRequest* request, net::KeyValue* reply) override {
    if (grpc::Status s = CheckToken(*context, token_, "rendezvous"); !s.ok()) return s;
    const double wait_s = std::min(std::max(request->wait_s(), 0.0), 3600.0);
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
    MutexLock lock(&mu_);
    while (true) {
      auto it = values_.find(request->key());
      if (it != values_.end()) {
        reply->set_key(request->key());
        reply->set_value(it->second);
        return grpc::Status::OK;
      }
      if (Clock::now() >= until || context->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("rendezvous: no key ", request->key()));
      }
      // Wake at least every 100 ms to notice a cancelled call.
      const std::string& key = request->key();
      changed_.WaitFor(&mu_, std::chrono::milliseconds(100),
                       [this, &key]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return values_.count(key) > 0; });
    }
  }

 private:
  const std::string token_;
  Mutex mu_;
  CondVar changed_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// Gloo's view of the rendezvous: each call one gRPC call (Get waits on the
// server, in slices, until the store's deadline).
class GrpcStore final : public gloo::rendezvous::Store {
 public:
  GrpcStore(const PsClientOptions& options, std::chrono::milliseconds timeout)
      : options_(options), timeout_(timeout), channel_(MakeChannel(options)),
        stub_(net::Rendezvous::NewStub(channel_)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    net::KeyValue kv;
    kv.set_key(key);
    kv.set_value(std::string(data.begin(), data.end()));
    const auto until = Clock::now() + timeout_;
    double backoff = options_.initial_backoff_s;
    while (true) {
      grpc::ClientContext context;
      PrepareContext(options_, &context);
      net::RendezvousReply reply;
      const grpc::Status s = stub_->Set(&context, kv, &reply);
      if (s.ok()) return;
      if (RefusedForGood(s.error_code()) || Clock::now() >= until) {
        throw std::runtime_error(absl::StrCat("rendezvous at ", options_.address, " unreachable: ",
                                              s.error_message()));
      }
      BackOff(*channel_, backoff);
      backoff = std::min(backoff * 2, options_.max_backoff_s);
    }
  }

  std::vector<char> get(const std::string& key) override {
    const std::string v = Fetch(key, Clock::now() + timeout_);
    return std::vector<char>(v.begin(), v.end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto until = Clock::now() + timeout;
    for (const std::string& k : keys) (void)Fetch(k, until);
  }

 private:
  std::string Fetch(const std::string& key, Clock::time_point until) {
    double backoff = options_.initial_backoff_s;
    std::string last;
    while (Clock::now() < until) {
      const double left = std::chrono::duration<double>(until - Clock::now()).count();
      net::KeyRequest req;
      req.set_key(key);
      req.set_wait_s(std::min(left, 5.0));
      grpc::ClientContext context;
      AddToken(options_, &context);
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(static_cast<int64_t>((std::min(left, 5.0) + 5.0) * 1000)));
      net::KeyValue reply;
      const grpc::Status s = stub_->Get(&context, req, &reply);
      if (s.ok()) return reply.value();
      if (RefusedForGood(s.error_code())) {
        throw std::runtime_error(absl::StrCat("rendezvous at ", options_.address, ": ", s.error_message()));
      }
      last = s.error_message();
      if (s.error_code() != grpc::StatusCode::NOT_FOUND) {
        BackOff(*channel_, backoff);
        backoff = std::min(backoff * 2, options_.max_backoff_s);
      }
    }
    throw std::runtime_error(absl::StrCat("rendezvous at ", options_.address, ": '", key, "' not set within ",
                                          timeout_.count() / 1000.0, " s (a rank did not come; last: ", last, ")"));
  }

  const PsClientOptions options_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<net::Rendezvous::Stub> stub_;
};

}  // namespace

class Collective::Impl {
 public:
  CollectiveOptions options;
  std::unique_ptr<RendezvousService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<GrpcStore> store;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  uint32_t tag = 0;  // one per collective, the same sequence on every rank
  // Bound algorithms (Gloo's older interface: buffers registered once, then
  // run again and again) for the buffers a job reduces every round.
  std::map<std::pair<float*, size_t>, std::unique_ptr<gloo::Algorithm>> bound;

  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  }

  // Runs one Gloo call; its exceptions become Unavailable naming `what`.
  template <typename F>
  absl::Status Run(const char* what, F&& f) {
    try {
      f();
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("allreduce: ", what, " over ", options.size,
                                                 " ranks failed on rank ", options.rank, ": ", e.what()));
    }
  }
};

Collective::Collective(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Collective::~Collective() {
  impl_->context.reset();
  impl_->device.reset();
  if (impl_->server) impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
}

int Collective::rank() const { return impl_->options.rank; }
int Collective::size() const { return impl_->options.size; }

absl::StatusOr<std::unique_ptr<Collective>> Collective::Connect(const CollectiveOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("allreduce: rank ", options.rank, " is outside the world of ", options.size, " ranks"));
  }
  if (!(options.timeout_s > 0)) return absl::InvalidArgumentError("cluster.collective_timeout_s: must be > 0");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (options.rank == 0) {
    SW_RETURN_IF_ERROR(options.server.Validate());
    impl->service = std::make_unique<RendezvousService>(options.server.token);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(options.server.bind_address, ServerCredentialsOf(options.server), &port);
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    SetServerKeepalive(options.server, &builder);
    builder.RegisterService(impl->service.get());
    impl->server = builder.BuildAndStart();
    if (impl->server == nullptr || port == 0) {
      return absl::UnavailableError(absl::StrCat("allreduce: rank 0 cannot serve the rendezvous on ",
                                                 options.server.bind_address,
                                                 " (in use, or not an address of this machine)"));
    }
  }
  impl->store = std::make_unique<GrpcStore>(options.rendezvous, impl->timeout());
  Impl* const im = impl.get();
  SW_RETURN_IF_ERROR(im->Run("connecting", [im] {
    gloo::transport::tcp::attr attr;
    attr.hostname = im->options.gloo_host;
    im->device = gloo::transport::tcp::CreateDevice(attr);
    im->context = std::make_shared<gloo::rendezvous::Context>(im->options.rank, im->options.size);
    im->context->setTimeout(im->timeout());
    gloo::rendezvous::PrefixStore prefixed("g0", *im->store);
    im->context->connectFullMesh(prefixed, im->device);
  }));
  return std::unique_ptr<Collective>(new Collective(std::move(impl)));
}

absl::Status Collective::AllreduceSum(float* data, size_t n) {
  if (n == 0) return absl::OkStatus();
  const auto start = Clock::now();
  Impl* const im = impl_.get();
  absl::Status s = im->Run("allreduce", [im, data, n] {
    std::unique_ptr<gloo::Algorithm>& a = im->bound[{data, n}];
    if (a == nullptr) {
      if (im->options.algorithm == AllreduceAlgorithm::kRing) {
        a = std::make_unique<gloo::AllreduceRingChunked<float>>(im->context, std::vector<float*>{data}, static_cast<int>(n));
      } else {
        a = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(im->context, std::vector<float*>{data},
                                                                    static_cast<int>(n));
      }
    }
    a->run();
  });
  nanos_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count(),
                   std::memory_order_relaxed);
  payload_bytes_.fetch_add(n * sizeof(float), std::memory_order_relaxed);
  calls_.fetch_add(1, std::memory_order_relaxed);
  return s;
}

absl::Status Collective::AllreduceSum(int64_t* data, size_t n) {
  if (n == 0) return absl::OkStatus();
  Impl* const im = impl_.get();
  return im->Run("allreduce", [im, data, n] {
    gloo::AllreduceOptions opts(im->context);
    opts.setOutput(data, n);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<int64_t>));
    opts.setTag(im->tag++);
    opts.setTimeout(im->timeout());
    gloo::allreduce(opts);
  });
}

absl::StatusOr<std::vector<uint64_t>> Collective::Allgather(uint64_t value) {
  Impl* const im = impl_.get();
  std::vector<uint64_t> all(im->options.size);
  SW_RETURN_IF_ERROR(im->Run("allgather", [im, &value, &all] {
    gloo::AllgatherOptions opts(im->context);
    opts.setInput(&value, 1);
    opts.setOutput(all.data(), all.size());
    opts.setTag(im->tag++);
    opts.setTimeout(im->timeout());
    gloo::allgather(opts);
  }));
  return all;
}

absl::Status Collective::CheckSame(uint64_t value, const std::string& what) {
  SW_ASSIGN_OR_RETURN(const std::vector<uint64_t> all, Allgather(value));
  std::vector<int> differ;
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] != all[0]) differ.push_back(static_cast<int>(r));
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("allreduce: ", what, " of rank", differ.size() == 1 ? " " : "s ",
                                                    absl::StrJoin(differ, ", "), " differ", differ.size() == 1 ? "s" : "",
                                                    " from rank 0's (this is rank ", impl_->options.rank, ")"));
}

absl::Status Collective::Broadcast(float* data, size_t n, int root) {
  if (n == 0) return absl::OkStatus();
  Impl* const im = impl_.get();
  const auto start = Clock::now();
  absl::Status s = im->Run("broadcast", [im, data, n, root] {
    gloo::BroadcastOptions opts(im->context);
    opts.setOutput(data, n);
    opts.setRoot(root);
    opts.setTag(im->tag++);
    opts.setTimeout(im->timeout());
    gloo::broadcast(opts);
  });
  nanos_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count(),
                   std::memory_order_relaxed);
  payload_bytes_.fetch_add(n * sizeof(float), std::memory_order_relaxed);
  return s;
}

uint64_t Fingerprint(const float* data, size_t n, uint64_t seed) {
  uint64_t h = seed;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n * sizeof(float); ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace shardwild
