// MetricsServer: serves a MetricRegistry (core/metrics/prometheus.h) in the
// Prometheus text format at GET /metrics over HTTP/1.1, with cpp-httplib
// (Debian's libcpp-httplib-dev). Any other path answers 404.
//
// The server runs on threads of its own: one accepts connections, and one
// pool thread answers each request by rendering the registry (so a scrape
// calls the registry's callbacks on that thread). A scrape costs the
// training nothing but those callbacks' reads.
//
// Thread safety: Start and the destructor from one thread; port() and
// address() from any.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "core/metrics/prometheus.h"

namespace httplib {
class Server;
}

namespace shardwild {

struct MetricsServerOptions {
  // The address to listen on: an IPv4 or IPv6 literal (metrics.bind).
  std::string bind = "127.0.0.1";
  // The port, in [1, 65535]; 0 = any free port (tests; port() says which).
  int port = 0;
  // Names the setting in errors ("metrics.port").
  std::string key = "metrics.port";
  // Who listens, for errors ("worker process 1 (metrics.port + 2)"); empty
  // = not said.
  std::string who;
};

class MetricsServer {
 public:
  // Listens on options.bind:options.port and starts serving `registry`;
  // whatever its callbacks read must outlive the server. Returns once the
  // server accepts connections. Errors: InvalidArgument for a port out of
  // range; Unavailable when it cannot listen, one line naming the key and
  // the address with the reason, e.g.
  //   metrics.port: cannot listen on 127.0.0.1:9100: address in use
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const MetricsServerOptions& options,
                                                              std::unique_ptr<const MetricRegistry> registry);
  // Stops accepting, waits for the requests being answered (each bounded by
  // the server's 2 s read and write timeouts) and joins the threads.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The port it listens on.
  int port() const { return port_; }
  // "host:port" ("[::1]:9100" for IPv6), for messages.
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;

  // Constant after Start.
  std::unique_ptr<const MetricRegistry> registry_;
  std::unique_ptr<httplib::Server> server_;  // after registry_: its threads end first
  int port_ = 0;
  std::string address_;
  std::thread thread_;  // runs the accept loop until the destructor stops it

  // Set by thread_ when the accept loop has returned (Start waits for the
  // loop to run or end). Relaxed: a flag that publishes nothing else.
  std::atomic<bool> accept_loop_ended_{false};
};

}  // namespace shardwild
