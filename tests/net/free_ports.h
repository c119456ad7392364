// Ports for tests that start servers of their own on loopback.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

namespace shardwild::testing_ports {

// `n` distinct ports the kernel says are free now (bound to port 0
// together, then released); empty if that fails.
inline std::vector<int> FreePorts(int n) {
  std::vector<int> fds, ports;
  bool ok = true;
  for (int i = 0; i < n && ok; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (fd >= 0) fds.push_back(fd);
    ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
         getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    if (ok) ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : fds) close(fd);
  if (!ok) return {};
  return ports;
}

}  // namespace shardwild::testing_ports
