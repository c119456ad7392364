// Helpers of the tests that scrape the live metrics (metrics.port) of
// `shardwild` child processes: free ports, a port held busy, and scrapes of
// http://127.0.0.1:PORT/metrics with httplib's client, parsed strictly.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli_child.h"
#include "tests/core/metrics/prometheus_text_parser.h"
#include "tests/net/free_ports.h"

namespace shardwild::clitest {

// Whether a server could listen on 127.0.0.1:`port` now.
inline bool CanListen(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && listen(fd, 1) == 0;
  close(fd);
  return ok;
}

// A port P with P..P+extra all free now; -1 if none was found.
inline int FreePortRun(int extra) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::vector<int> p = testing_ports::FreePorts(1);
    // The run stays below the range for outgoing connections (FreePorts).
    const int ephemeral_lo = testing_ports::EphemeralRange().first;
    if (p.empty() || p[0] + extra > 65535 || (p[0] < ephemeral_lo && p[0] + extra >= ephemeral_lo)) continue;
    bool all = true;
    for (int k = 1; k <= extra && all; ++k) all = CanListen(p[0] + k);
    if (all) return p[0];
  }
  return -1;
}

// A socket listening on 127.0.0.1:`port` for as long as it lives. Bound
// with SO_REUSEADDR, as CanListen and the metrics server bind: without it a
// port that CanListen called free failed here while an earlier test's
// connections to it were still in TIME_WAIT (a `make test` run failed
// WorkerProcessPortInUseFailsTheStart at busy.ok()); a live listener still
// makes the bind fail either way.
class BusyPort {
 public:
  explicit BusyPort(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ >= 0) {
      int yes = 1;
      setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    ok_ = fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && listen(fd_, 1) == 0;
  }
  ~BusyPort() {
    if (fd_ >= 0) close(fd_);
  }
  BusyPort(const BusyPort&) = delete;
  BusyPort& operator=(const BusyPort&) = delete;
  bool ok() const { return ok_; }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

struct Scrape {
  int status = 0;
  std::string content_type;
  std::string body;
  prometheus_text::Parsed parsed;  // of body
};

// GET http://127.0.0.1:`port`/metrics; nullopt when nothing answers.
inline std::optional<Scrape> ScrapeOnce(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1);
  client.set_read_timeout(10);
  httplib::Result res = client.Get("/metrics");
  if (!res) return std::nullopt;
  Scrape s;
  s.status = res->status;
  s.content_type = res->get_header_value("Content-Type");
  s.body = res->body;
  s.parsed = prometheus_text::Parse(s.body);
  return s;
}

// Scrapes `port` every 50 ms until a scrape parses and `ready` holds for it
// (returned), `child` ends, or `limit` passes (nullopt).
inline std::optional<Scrape> ScrapeUntil(Child& child, int port, const std::function<bool(const Scrape&)>& ready,
                                         std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline && !child.Poll()) {
    if (std::optional<Scrape> s = ScrapeOnce(port); s && s->status == 200 && s->parsed.ok() && ready(*s)) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::nullopt;
}

// The families every chief serves (workers/live_metrics.h).
inline const std::vector<std::string>& ChiefFamilies() {
  static const std::vector<std::string> kFamilies = {
      "shardwild_samples_total",         "shardwild_steps_total",           "shardwild_step_phase_seconds_total",
      "shardwild_train_loss",            "shardwild_store_version",         "shardwild_store_bytes",
      "shardwild_tasks_requeued_total",  "shardwild_worker_failures_total", "shardwild_checkpoints_written_total",
      "shardwild_job_records_total",     "shardwild_info"};
  return kFamilies;
}

}  // namespace shardwild::clitest
