#include "workers/metrics_server.h"

#include <sys/socket.h>

#include <httplib.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardwild {
namespace {

// Handler threads: scrapes are rare and cheap, and a second thread keeps
// one slow client from holding up the next scrape.
constexpr size_t kHandlerThreads = 2;

// Why listening failed, from the errno the library's bind() or listen()
// left (it closes the socket after that, which keeps errno).
std::string ListenError(int err) {
  switch (err) {
    case EADDRINUSE: return "address in use";
    case EADDRNOTAVAIL: return "address not available on this machine";
    case EACCES: return "permission denied";
    case 0: return "the address could not be bound";
    default: return std::strerror(err);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const MetricsServerOptions& options,
                                                                     std::unique_ptr<const MetricRegistry> registry) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.key, ": must be in [1, 65535], got ", options.port));
  }
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->registry_ = std::move(registry);
  s->server_ = std::make_unique<httplib::Server>();
  httplib::Server& http = *s->server_;
  http.new_task_queue = [] { return new httplib::ThreadPool(kHandlerThreads); };
  // SO_REUSEADDR only: the library's default adds SO_REUSEPORT, with which
  // a second server (another run's, another process of this job) could
  // bind the same port and share its connections instead of failing.
  http.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // Bound how long a request (and so the destructor) can take.
  http.set_keep_alive_timeout(1);
  http.set_read_timeout(std::chrono::seconds(2));
  http.set_write_timeout(std::chrono::seconds(2));
  http.Get("/metrics", [registry = s->registry_.get()](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Render(), kPrometheusContentType);
  });

  const bool v6 = absl::StrContains(options.bind, ':');
  const std::string host = v6 ? absl::StrCat("[", options.bind, "]") : options.bind;
  errno = 0;
  if (options.port == 0) {
    s->port_ = http.bind_to_any_port(options.bind);
  } else if (http.bind_to_port(options.bind, options.port)) {
    s->port_ = options.port;
  }
  if (s->port_ <= 0) {
    const int err = errno;
    return absl::UnavailableError(absl::StrCat(options.key, ": cannot listen on ", host, ":", options.port,
                                               options.who.empty() ? "" : " for ", options.who, ": ",
                                               ListenError(err)));
  }
  s->address_ = absl::StrCat(host, ":", s->port_);
  MetricsServer* const self = s.get();
  s->thread_ = std::thread([self] {
    self->server_->listen_after_bind();
    self->accept_loop_ended_.store(true, std::memory_order_relaxed);
  });
  // stop() only acts on a running server: wait until the accept loop runs,
  // so that the destructor's stop() cannot come too early and be lost.
  while (!http.is_running() && !s->accept_loop_ended_.load(std::memory_order_relaxed)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return s;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace shardwild
