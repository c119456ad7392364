// Ports for tests that start servers of their own on loopback.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace shardwild::testing_ports {

// The kernel's range of ports for outgoing connections
// (/proc/sys/net/ipv4/ip_local_port_range; Linux's default if unreadable).
inline std::pair<int, int> EphemeralRange() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (in >> lo >> hi && lo > 0 && lo <= hi) return {lo, hi};
  return {32768, 60999};
}

// Binds a loopback TCP socket to `port` (0: the kernel's choice); returns
// the fd (-1 on failure) and sets *bound to the port it got.
inline int BindLoopback(int port, int* bound) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return -1;
  }
  *bound = ntohs(a.sin_port);
  return fd;
}

// `n` distinct ports free now (each bound, then released), none of them
// one this process was given before: two calls in a row could otherwise
// get the same released port back (a cluster test's evaluator was given a
// worker's, and every task refused the spec). Empty if that fails.
//   They are drawn below the kernel's range for outgoing connections, from
// a place that differs between processes. A port from that range (what
// binding port 0 gives) could be taken by any connection's local end
// between this call and the server's bind: a worker process's metrics port
// once was, under ThreadSanitizer beside the rest of the suite, while the
// test's own scrapes connected in a loop. Below it only another server can
// take it. Where that range leaves no room below it, the kernel's choice.
inline std::vector<int> FreePorts(int n) {
  static std::mutex mu;
  static std::set<int> given;
  const std::lock_guard<std::mutex> lock(mu);
  std::vector<int> fds, ports;
  const int ephemeral_lo = EphemeralRange().first;
  const int lo = std::max(1024, ephemeral_lo - 12000), span = ephemeral_lo - lo;
  if (span >= 1000) {
    static std::mt19937 rng(static_cast<uint32_t>(getpid()) * 2654435761u ^
                            static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
    int next = lo + static_cast<int>(rng() % static_cast<uint32_t>(span));
    for (int tries = 0; static_cast<int>(ports.size()) < n && tries < span; ++tries) {
      const int port = next;
      next = next + 1 < ephemeral_lo ? next + 1 : lo;
      if (given.count(port) != 0) continue;
      int got = 0;
      const int fd = BindLoopback(port, &got);
      if (fd < 0) continue;
      fds.push_back(fd);
      given.insert(got);
      ports.push_back(got);
    }
  } else {
    // Ports given before are held bound too, so the kernel moves on; a few
    // hundred tries are far more than a test's calls need.
    for (int tries = 0; static_cast<int>(ports.size()) < n && tries < n + 256; ++tries) {
      int got = 0;
      const int fd = BindLoopback(0, &got);
      if (fd < 0) break;
      fds.push_back(fd);
      if (given.insert(got).second) ports.push_back(got);
    }
  }
  for (int fd : fds) close(fd);
  if (static_cast<int>(ports.size()) < n) return {};
  return ports;
}

}  // namespace shardwild::testing_ports
