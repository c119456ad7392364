#include "net/allreduce.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <grpcpp/grpcpp.h>

#include <signal.h>

#include <chrono>
#include <cstring>
#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/mutex.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"
#include "net/grpc_util.h"
#include "net/rendezvous.grpc.pb.h"

namespace shardwild {
namespace {

using Clock = std::chrono::steady_clock;

// Rank 0's key-value store and membership. Set stores, Get waits for the
// key up to its wait_s (bounded by the call's deadline). Membership: the
// first generation is formed when `world` processes have joined; a later
// one when every member of the last has asked for it, or `grace_s` after
// the first asked (the silent ones are lost), with every late joiner
// admitted.
class RendezvousService final : public net::Rendezvous::Service {
 public:
  RendezvousService(std::string token, int world, double grace_s)
      : token_(std::move(token)), world_(world), grace_s_(grace_s), next_member_(world) {}

  grpc::Status Set(grpc::ServerContext* context, const net::KeyValue* request, net::RendezvousReply*) override {
    if (grpc::Status s = CheckToken(*context, token_, "rendezvous"); !s.ok()) return s;
    MutexLock lock(&mu_);
    values_[request->key()] = request->value();
    changed_.SignalAll();
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* context, const net::KeyRequest* request, net::KeyValue* reply) override {
    if (grpc::Status s = CheckToken(*context, token_, "rendezvous"); !s.ok()) return s;
    const auto until = Until(request->wait_s());
    const std::string& key = request->key();
    MutexLock lock(&mu_);
    while (true) {
      auto it = values_.find(key);
      if (it != values_.end()) {
        reply->set_key(key);
        reply->set_value(it->second);
        return grpc::Status::OK;
      }
      if (Clock::now() >= until || context->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("rendezvous: no key ", key));
      }
      // Wake at least every 100 ms to notice a cancelled call.
      changed_.WaitFor(&mu_, std::chrono::milliseconds(100),
                       [this, &key]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return values_.count(key) > 0; });
    }
  }

  grpc::Status Join(grpc::ServerContext* context, const net::JoinRequest* request, net::JoinReply* reply) override {
    if (grpc::Status s = CheckToken(*context, token_, "rendezvous"); !s.ok()) return s;
    MutexLock lock(&mu_);
    if (generation_ < 0) {
      if (request->rank() < 0 || request->rank() >= world_) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("rendezvous: rank ", request->rank(), " is outside the world of ", world_));
      }
      // A rank that joins again (restarted before the group formed) keeps its id.
      initial_.insert(request->rank());
      reply->set_member(request->rank());
      if (static_cast<int>(initial_.size()) == world_) Form({initial_.begin(), initial_.end()}, 0);
    } else {
      const int64_t id = next_member_++;
      pending_.insert(id);
      reply->set_member(id);
      reply->set_late(true);
    }
    changed_.SignalAll();
    return grpc::Status::OK;
  }

  grpc::Status AwaitGeneration(grpc::ServerContext* context, const net::GenerationRequest* request,
                               net::GenerationReply* reply) override {
    if (grpc::Status s = CheckToken(*context, token_, "rendezvous"); !s.ok()) return s;
    const auto until = Until(request->wait_s());
    MutexLock lock(&mu_);
    while (true) {
      MaybeReform();
      if (generation_ > request->after()) {
        const std::vector<int64_t>& m = members_;
        const bool in = std::find(m.begin(), m.end(), request->member()) != m.end();
        if (!in && pending_.count(request->member()) == 0) {
          reply->set_refused(true);
          return grpc::Status::OK;
        }
        if (in) {
          reply->set_formed(true);
        reply->set_generation(generation_);
          for (int64_t id : m) reply->add_members(id);
          reply->set_lost(lost_);
          return grpc::Status::OK;
        }
        // A late joiner: admitted at the next forming.
      }
      if (Clock::now() >= until || context->IsCancelled()) return grpc::Status::OK;  // not formed yet
      changed_.WaitFor(&mu_, std::chrono::milliseconds(100), [] { return false; });
    }
  }

  grpc::Status RequestReform(grpc::ServerContext* context, const net::ReformRequest* request,
                             net::RendezvousReply*) override {
    if (grpc::Status s = CheckToken(*context, token_, "rendezvous"); !s.ok()) return s;
    MutexLock lock(&mu_);
    if (request->generation() == generation_) {
      if (reform_asked_.empty()) reform_started_ = Clock::now();
      reform_asked_.insert(request->member());
      MaybeReform();
      changed_.SignalAll();
    }
    return grpc::Status::OK;
  }

  // Late joiners waiting to be admitted (rank 0 asks between blocks).
  bool joiners_waiting() const {
    MutexLock lock(&mu_);
    return !pending_.empty();
  }

 private:
  static Clock::time_point Until(double wait_s) {
    wait_s = std::min(std::max(wait_s, 0.0), 3600.0);
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
  }

  void Form(std::vector<int64_t> members, int lost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::sort(members.begin(), members.end());
    members_ = std::move(members);
    lost_ = lost;
    ++generation_;
    reform_asked_.clear();
    changed_.SignalAll();
  }

  // Forms the next generation once every member asked, or grace_s after the
  // first did: the members that asked and every late joiner.
  void MaybeReform() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (generation_ < 0 || reform_asked_.empty()) return;
    int asked = 0;
    for (int64_t id : members_) asked += reform_asked_.count(id) ? 1 : 0;
    const bool all = asked == static_cast<int>(members_.size());
    const double waited = SecondsSince(reform_started_);
    if (!all && waited < grace_s_) return;
    std::vector<int64_t> next;
    for (int64_t id : members_) {
      if (reform_asked_.count(id)) next.push_back(id);
    }
    next.insert(next.end(), pending_.begin(), pending_.end());
    pending_.clear();
    Form(std::move(next), static_cast<int>(members_.size()) - asked);
  }

  const std::string token_;
  const int world_;
  const double grace_s_;
  mutable Mutex mu_;
  CondVar changed_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<int64_t> members_ ABSL_GUARDED_BY(mu_);
  int lost_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int64_t> initial_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> pending_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> reform_asked_ ABSL_GUARDED_BY(mu_);
  Clock::time_point reform_started_ ABSL_GUARDED_BY(mu_);
  int64_t next_member_ ABSL_GUARDED_BY(mu_);
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
    net::RendezvousReply reply;
    const absl::Status s = Call(&net::Rendezvous::Stub::Set, kv, &reply, Clock::now() + timeout_);
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  }

  // One membership call (Join, AwaitGeneration, RequestReform), retried
  // with backoff until `until`; the error names the rendezvous.
  template <typename Req, typename Rep>
  absl::Status Call(grpc::Status (net::Rendezvous::Stub::*method)(grpc::ClientContext*, const Req&, Rep*),
                    const Req& request, Rep* reply, Clock::time_point until, double extra_deadline_s = 0) {
    double backoff = options_.initial_backoff_s;
    while (true) {
      grpc::ClientContext context;
      AddToken(options_, &context);
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(static_cast<int64_t>(
                               (std::max(options_.deadline_s, 1.0) + extra_deadline_s) * 1000)));
      const grpc::Status s = (stub_.get()->*method)(&context, request, reply);
      if (s.ok()) return absl::OkStatus();
      if (RefusedForGood(s.error_code()) || Clock::now() >= until) {
        return absl::UnavailableError(
            absl::StrCat("rendezvous at ", options_.address, " unreachable: ", s.error_message()));
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

// Gloo's TCP pairs send with writev(), which raises SIGPIPE on a socket
// whose peer has reset it: a member killed mid-collective (its unread bytes
// make its kernel answer with a reset) can kill a survivor that writes to
// it before Gloo's loop has seen the pair close, with no word on stderr.
// With the signal ignored the write fails with EPIPE, the collective fails,
// and the survivors re-form. A program that chose its own disposition for
// SIGPIPE keeps it.
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
}

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
  std::map<std::pair<float*, size_t>, std::unique_ptr<gloo::AllreduceOptions>> ring;
  // Membership: this process's member id, whether it joined after the
  // first generation formed, the generation its mesh belongs to, and how
  // many members the last forming left out.
  int64_t member = 0;
  bool late = false;
  int64_t generation = -1;
  int lost = 0;
  bool failed = false;  // a collective failed since the last forming

  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  }

  // Waits for a generation after `after` holding this member, then
  // connects its mesh: rank = this member's index, size = the members. A
  // member that dies meanwhile closes its sockets under the connect: this
  // member then asks for the next generation and connects that one, until
  // the timeout (lost counts the members every forming on the way left out).
  absl::Status JoinGeneration(int64_t after) {
    const auto until = Clock::now() + timeout();
    int lost_on_the_way = 0;
    std::string first_failure;  // the first connect that failed, for the error
    while (true) {
      if (absl::Status s = AwaitGeneration(after, until); !s.ok()) {
        if (first_failure.empty()) return s;
        return absl::UnavailableError(absl::StrCat(s.message(), " (re-forming because ", first_failure, ")"));
      }
      lost_on_the_way += lost;
      // This host's device: its failure (gloo_host is no address here) is
      // no peer's, and another generation would not mend it.
      SW_RETURN_IF_ERROR(Run("connecting", [this] {
        gloo::transport::tcp::attr attr;
        attr.hostname = options.gloo_host;
        device = gloo::transport::tcp::CreateDevice(attr);
      }));
      const absl::Status connected = Run("connecting", [this] {
        context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
        context->setTimeout(timeout());
        gloo::rendezvous::PrefixStore prefixed(absl::StrCat("g", generation), *store);
        context->connectFullMesh(prefixed, device);
        if (options.after_connect_for_test) options.after_connect_for_test(generation);
      });
      lost = lost_on_the_way;
      if (connected.ok()) return connected;
      if (first_failure.empty()) first_failure = std::string(connected.message());
      // What did connect closes: the members whose mesh is whole fail their
      // next collective at once, and re-form too.
      if (Clock::now() >= until || !AskForNextGeneration(until).ok()) {
        context.reset();
        return connected;
      }
      after = generation;
    }
  }

  // Closes this member's sockets (peers still blocked on them fail at once,
  // not at their deadline) and asks rank 0 for the generation after this
  // one, by `until`.
  absl::Status AskForNextGeneration(Clock::time_point until) {
    bound.clear();
    ring.clear();
    context.reset();
    net::ReformRequest req;
    req.set_member(member);
    req.set_generation(generation);
    net::RendezvousReply reply;
    return store->Call(&net::Rendezvous::Stub::RequestReform, req, &reply, until);
  }

  // Waits until a generation after `after` forms holding this member (rank
  // and size become its index and the members), or `until`.
  absl::Status AwaitGeneration(int64_t after, Clock::time_point until) {
    const std::string prefix = absl::StrCat("allreduce: ", after < 0 ? "connecting" : "re-forming", " over ",
                                            options.size, " ranks failed on rank ", options.rank, ": ");
    net::GenerationReply g;
    while (true) {
      net::GenerationRequest req;
      req.set_member(member);
      req.set_after(after);
      const double left = std::chrono::duration<double>(until - Clock::now()).count();
      req.set_wait_s(std::max(0.0, std::min(left, 5.0)));
      g.Clear();
      if (absl::Status st = store->Call(&net::Rendezvous::Stub::AwaitGeneration, req, &g, until, 5.0); !st.ok()) {
        return absl::UnavailableError(absl::StrCat(prefix, st.message()));
      }
      if (g.refused()) {
        return absl::UnavailableError(absl::StrCat(
            prefix, "member ", member, " was left out of the re-formed group (it asked after the others' grace period)"));
      }
      if (g.formed()) break;
      if (Clock::now() >= until) {
        return absl::UnavailableError(absl::StrCat(
            prefix, "no group of ranks formed within ", options.timeout_s, " s (cluster.collective_timeout_s)",
            after < 0 ? absl::StrCat("; a rank of the ", options.size, " did not come") : std::string()));
      }
    }
    const std::vector<int64_t> members(g.members().begin(), g.members().end());
    const int rank = static_cast<int>(std::find(members.begin(), members.end(), member) - members.begin());
    bound.clear();
    ring.clear();
    context.reset();
    tag = 0;
    options.rank = rank;
    options.size = static_cast<int>(members.size());
    generation = g.generation();
    lost = g.lost();
    failed = false;
    return absl::OkStatus();
  }

  // Runs one Gloo call; its exceptions become Unavailable naming `what`.
  template <typename F>
  absl::Status Run(const char* what, F&& f) {
    try {
      f();
      return absl::OkStatus();
    } catch (const std::exception& e) {
      failed = true;
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

absl::Status Collective::Reform() {
  Impl* const im = impl_.get();
  if (absl::Status s = im->AskForNextGeneration(Clock::now() + im->timeout()); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("allreduce: re-forming failed on rank ", im->options.rank, ": ",
                                               s.message()));
  }
  return im->JoinGeneration(im->generation);
}

int64_t Collective::generation() const { return impl_->generation; }
int64_t Collective::member() const { return impl_->member; }
bool Collective::joined_late() const { return impl_->late; }
int Collective::lost_at_last_forming() const { return impl_->lost; }
bool Collective::failed() const { return impl_->failed; }
bool Collective::joiners_waiting() const { return impl_->service != nullptr && impl_->service->joiners_waiting(); }

int Collective::rank() const { return impl_->options.rank; }
int Collective::size() const { return impl_->options.size; }

absl::StatusOr<std::unique_ptr<Collective>> Collective::Connect(const CollectiveOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("allreduce: rank ", options.rank, " is outside the world of ", options.size, " ranks"));
  }
  if (!(options.timeout_s > 0)) return absl::InvalidArgumentError("cluster.collective_timeout_s: must be > 0");
  IgnoreSigpipeUnlessHandled();
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (options.rank == 0) {
    SW_RETURN_IF_ERROR(options.server.Validate());
    impl->service =
        std::make_unique<RendezvousService>(options.server.token, options.size, std::min(options.timeout_s, 5.0));
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
  const std::string prefix = absl::StrCat("allreduce: connecting over ", options.size, " ranks failed on rank ",
                                          options.rank, ": ");
  net::JoinRequest join;
  join.set_rank(options.rank);
  net::JoinReply joined;
  if (absl::Status s = impl->store->Call(&net::Rendezvous::Stub::Join, join, &joined,
                                         Clock::now() + impl->timeout());
      !s.ok()) {
    return absl::UnavailableError(absl::StrCat(prefix, s.message()));
  }
  impl->member = joined.member();
  impl->late = joined.late();
  SW_RETURN_IF_ERROR(impl->JoinGeneration(-1));
  return std::unique_ptr<Collective>(new Collective(std::move(impl)));
}

absl::Status Collective::AllreduceSum(float* data, size_t n) {
  if (n == 0) return absl::OkStatus();
  const auto start = Clock::now();
  Impl* const im = impl_.get();
  absl::Status s = im->Run("allreduce", [im, data, n] {
    if (im->options.algorithm == AllreduceAlgorithm::kHalvingDoubling) {
      std::unique_ptr<gloo::Algorithm>& a = im->bound[{data, n}];
      if (a == nullptr) {
        a = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(im->context, std::vector<float*>{data},
                                                                    static_cast<int>(n));
      }
      a->run();
      return;
    }
    // The ring, through options bound to the buffer once (its unbound
    // buffers registered once) and run again with a fresh tag.
    std::unique_ptr<gloo::AllreduceOptions>& o = im->ring[{data, n}];
    if (o == nullptr) {
      o = std::make_unique<gloo::AllreduceOptions>(im->context);
      o->setOutput(data, n);
      o->setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      o->setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      o->setTimeout(im->timeout());
    }
    o->setTag(im->tag++);
    gloo::allreduce(*o);
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
  const auto start = Clock::now();
  absl::Status s = BroadcastBytes(data, n * sizeof(float), root);
  nanos_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count(),
                   std::memory_order_relaxed);
  payload_bytes_.fetch_add(n * sizeof(float), std::memory_order_relaxed);
  return s;
}

absl::Status Collective::BroadcastBytes(void* data, size_t bytes, int root) {
  if (bytes == 0) return absl::OkStatus();
  Impl* const im = impl_.get();
  uint8_t* const p = static_cast<uint8_t*>(data);
  return im->Run("broadcast", [im, p, bytes, root] {
    gloo::BroadcastOptions opts(im->context);
    opts.setOutput(p, bytes);
    opts.setRoot(root);
    opts.setTag(im->tag++);
    opts.setTimeout(im->timeout());
    gloo::broadcast(opts);
  });
}

uint64_t Fnv1a(const void* data, size_t bytes, uint64_t seed) {
  uint64_t h = seed;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace shardwild
