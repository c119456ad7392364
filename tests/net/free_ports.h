// Ports for tests that start servers of their own on loopback.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mutex>
#include <set>
#include <vector>

namespace shardwild::testing_ports {

// `n` distinct ports the kernel says are free now (bound to port 0
// together, then released), none of them one this process was given
// before: two calls in a row could otherwise get the same released port
// back (a cluster test's evaluator was given a worker's, and every task
// refused the spec). Empty if that fails.
inline std::vector<int> FreePorts(int n) {
  static std::mutex mu;
  static std::set<int> given;
  const std::lock_guard<std::mutex> lock(mu);
  std::vector<int> fds, ports;
  bool ok = true;
  // Ports given before are held bound too, so the kernel moves on; a few
  // hundred tries are far more than a test's calls need.
  for (int tries = 0; static_cast<int>(ports.size()) < n && ok && tries < n + 256; ++tries) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (fd >= 0) fds.push_back(fd);
    ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
         getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    if (ok && given.insert(ntohs(a.sin_port)).second) ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : fds) close(fd);
  if (!ok || static_cast<int>(ports.size()) < n) return {};
  return ports;
}

}  // namespace shardwild::testing_ports
