// What every gRPC endpoint of the bridge shares: status conversion, the
// token check, credentials and channels made from the options, and quieting
// gRPC's own log lines.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "net/net_options.h"

namespace shardwild {

// absl and gRPC status codes share their numbers.
grpc::Status ToGrpc(const absl::Status& s);

// Compares in time that depends only on the lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// The token check every call of a server starts with: OK when `token` is
// empty (a loopback-only server) or the call's "authorization" metadata is
// "Bearer <token>"; else PERMISSION_DENIED naming `task` and what was wrong
// (no token, or a wrong one).
grpc::Status CheckToken(const grpc::ServerContext& context, const std::string& token, const std::string& task);

// TLS server credentials from the PEM certificate and key when given, else
// insecure ones (PsServerOptions::Validate allows that on loopback only).
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsOf(const PsServerOptions& options);

// The server's HTTP/2 keepalive (options.keepalive_s): it pings its clients
// after that long without traffic and drops a connection whose ping goes
// unanswered as long, and it accepts the clients' own keepalive pings.
void SetServerKeepalive(const PsServerOptions& options, grpc::ServerBuilder* builder);

// A channel to options.address with its TLS settings, both message limits
// set explicitly, reconnect backoffs as short as the call retries (so a
// restarted server is found by the next attempt), and keepalive pings
// (options.keepalive_s; a server that vanished fails the calls and streams
// in flight instead of leaving them waiting).
std::shared_ptr<grpc::Channel> MakeChannel(const PsClientOptions& options);

// Adds the token (if any) and a deadline options.deadline_s from now to
// `context`.
void PrepareContext(const PsClientOptions& options, grpc::ClientContext* context);
// Adds the token (if any) alone: a stream that lasts as long as the job
// (a worker task's sessions with the chief) has no deadline.
void AddToken(const PsClientOptions& options, grpc::ClientContext* context);

// Whether a long-lived stream the chief ended with `code` is refused for
// good (a wrong token, a hello it will never take): not retried.
bool RefusedForGood(grpc::StatusCode code);
// The wait before opening such a stream again after it ended with `code`:
// ABORTED (the chief asks for a retry) keeps `backoff`; anything else
// doubles it, up to options.max_backoff_s.
double NextBackoff(grpc::StatusCode code, double backoff, const PsClientOptions& options);

// Waits `seconds` between two attempts on `channel` (or until `stop`, asked
// every 100 ms, says true), driving the channel's connection attempts the
// while. A synchronous client polls its connections only inside a call,
// and a call on a channel in TRANSIENT_FAILURE fails at once: a thread
// that only slept between attempts would leave the background reconnect
// to gRPC's backup poller, which runs every 5 s, so a peer that comes up
// (a chief started after its workers, a restarted ps task) would be
// reached only about 5 s later, or not at all when the connect deadline
// passes first. Every retry loop of a client waits here.
void BackOff(grpc::Channel& channel, double seconds, const std::function<bool()>& stop = nullptr);

// gRPC writes its own lines to stderr (a port in use, a peer gone, ...);
// the command line reports each failure as one line of its own, so they are
// dropped, except with SHARDWILD_GRPC_LOGS set in the environment (for
// debugging the bridge). Call once, before any gRPC object exists.
void QuietGrpcLogs();

}  // namespace shardwild
