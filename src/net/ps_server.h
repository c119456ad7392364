// PsServer: one ps task's local shards (a ShmParamStore) served over gRPC
// (ps.proto's ParameterServer, and grpc.health.v1.Health).
//
// Security (PsServerOptions):
//   * It binds options.bind_address, loopback unless configured otherwise;
//     a non-loopback bind needs a token (Start fails without one).
//   * With a token, EVERY call, health checks included, must carry it as
//     "authorization: Bearer <token>" metadata. A call without it or with a
//     wrong one ends with PERMISSION_DENIED before its request is read, so
//     it never touches a shard. Tokens are compared in constant time.
//   * With a certificate and key every connection is TLS.
// Requests are validated in full by PsService (ps_service.h) before the
// store is touched: malformed ones get INVALID_ARGUMENT and the server keeps
// serving.
//
// Message sizes: the server's max send and receive sizes are both set to
// options.max_message_bytes; answers are chunked to fit.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "net/net_options.h"
#include "ps_shm/shm_store.h"

namespace shardwild {

class PsServer {
 public:
  // Starts serving `store` (not owned; it must outlive the server) on its
  // own gRPC threads and returns at once. InvalidArgument for bad options
  // (PsServerOptions::Validate); Unavailable when the address cannot be
  // bound (in use, or not an address of this machine), naming it.
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(const PsServerOptions& options, ShmParamStore* store);

  // Shuts down (Shutdown()).
  ~PsServer();
  PsServer(const PsServer&) = delete;
  PsServer& operator=(const PsServer&) = delete;

  // The port bound (the chosen one when options.bind_address asked for 0).
  int port() const;
  // host:port the server listens on, with the bound port.
  std::string address() const;

  // What health checks answer: SERVING (the default after Start) or
  // NOT_SERVING. Watchers are told at once. Thread-safe.
  void SetServing(bool serving);

  // Stops accepting calls, tells health watchers, waits up to `grace_s` for
  // calls in flight and cancels the rest, then joins the gRPC threads.
  // Idempotent; thread-safe.
  void Shutdown(double grace_s = 1.0);

  // Whether a JobDone request came (PsServerOptions::exit_when_done).
  bool job_done() const;

  // Counters since Start (thread-safe, relaxed: they order nothing).
  struct Stats {
    uint64_t calls = 0;              // calls received, all services
    uint64_t permission_denied = 0;  // rejected for a missing or wrong token
    uint64_t invalid_argument = 0;   // rejected as malformed
    uint64_t pushes_applied = 0;
    uint64_t pushes_deduplicated = 0;
  };
  Stats stats() const;

  class Impl;

 private:
  explicit PsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardwild
