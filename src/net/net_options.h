// Options of the PS server and client, and how they are made from the
// config's cluster.* section (core/config/options.h ClusterOptions) and the
// cluster spec (net/cluster_spec.h).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/options.h"
#include "net/cluster_spec.h"

namespace shardwild {

// The metadata key every request's token travels in, as "Bearer <token>".
inline constexpr char kTokenMetadataKey[] = "authorization";
// The shortest token accepted.
inline constexpr size_t kMinTokenBytes = 16;

struct PsServerOptions {
  // host:port to listen on ("[::1]:0" for IPv6); port 0 = any free port
  // (PsServer::port() says which). A host that is not loopback needs a token.
  std::string bind_address = "127.0.0.1:0";
  // The shared secret every request must carry; empty = none, allowed only
  // on a loopback bind address.
  std::string token;
  // TLS: PEM certificate chain and private key, both or neither.
  std::string tls_cert_pem;
  std::string tls_key_pem;
  // The largest message the server sends or accepts (set explicitly on the
  // server); pulls answer in chunks that fit. In [4096, 1 GiB].
  int64_t max_message_bytes = 4 << 20;
  // The most bytes of gradients (plus ids) one push stream may carry; a
  // larger push is INVALID_ARGUMENT. >= 1.
  int64_t max_push_bytes = int64_t{1} << 30;
  // Where SaveShard writes checkpoints and RestoreShard reads them; empty =
  // both answer FAILED_PRECONDITION. Requests name steps, never paths.
  std::string checkpoint_dir;
  // Complete checkpoints SaveShard keeps there, oldest pruned first
  // (checkpoint.keep of the job's config). >= 1.
  int checkpoint_keep = 5;
  // This task's name for messages ("ps:0").
  std::string task_name = "ps";
  // Closed: pulls and pushes answer UNAVAILABLE (clients retry) and
  // SaveShard FAILED_PRECONDITION until a RestoreShard (a checkpoint, or
  // as_is) opens the store. A ps task of a cluster starts closed, so that
  // after a restart no worker trains against its initial values before the
  // chief has reloaded its shards.
  bool start_closed = false;
  // A ps task started by srun or mpirun: a JobDone request makes it exit
  // (PsServer::job_done). false = JobDone is acknowledged and ignored.
  bool exit_when_done = false;
  // HTTP/2 keepalive (cluster.keepalive_s): pings after this long without
  // traffic, the connection dropped when one goes unanswered as long; and
  // clients' pings as often are allowed. 0 = off.
  double keepalive_s = 10.0;
  // InvalidArgument naming the field: a bind address that is not
  // host:port, a non-loopback bind without a token, a short token, TLS
  // half given, sizes out of range.
  absl::Status Validate() const;
};

struct PsClientOptions {
  // The server's host:port, and its task name for messages ("ps:1").
  std::string address;
  std::string task_name = "ps";
  std::string token;  // sent with every request when non-empty
  // TLS: connect with TLS, verifying the server against tls_root_pem; empty
  // root = the system's roots. tls_server_name overrides the name checked
  // against the certificate (empty = the host of `address`).
  bool tls = false;
  std::string tls_root_pem;
  std::string tls_server_name;
  // Per attempt; > 0.
  double deadline_s = 10.0;
  // Attempts of one call (1 = no retry). A call is retried when it fails
  // with UNAVAILABLE or DEADLINE_EXCEEDED, after initial_backoff_s, doubling
  // up to max_backoff_s.
  int max_attempts = 3;
  double initial_backoff_s = 0.1;
  double max_backoff_s = 2.0;
  // The largest message the client sends or accepts; requests are split to
  // fit. In [4096, 1 GiB].
  int64_t max_message_bytes = 4 << 20;
  // Pushed gradients as float32, or rounded to bf16 / fp16 (net/half.h).
  GradientCompression compression = GradientCompression::kNone;
  // HTTP/2 keepalive of the channel, as PsServerOptions::keepalive_s. 0 = off.
  double keepalive_s = 10.0;
  absl::Status Validate() const;
};

// Reads a token file: its first line without surrounding whitespace. The
// file must not be readable or writable by group or others (like ssh keys),
// and the token must be at least kMinTokenBytes long. Errors name the file.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The server options of ps task `task` (its port from the spec) under
// `cluster` (bind host, token file, TLS files, message size). With a
// loopback cluster.bind_host and a loopback address in the spec, the server
// binds that address (so 127.0.0.2 can stand for a second machine). Reads the
// token and TLS files; errors name the config key and the file.
absl::StatusOr<PsServerOptions> MakePsServerOptions(const ClusterOptions& cluster, const ClusterSpec& spec,
                                                    const TaskId& task);

// host:port a server of task `task` binds under `cluster` (the rule of
// MakePsServerOptions: cluster.bind_host with the spec's port, or the
// task's own loopback address when both are loopback).
std::string BindAddressOf(const ClusterOptions& cluster, const ClusterSpec& spec, const TaskId& task);

// The client options for calling task `task` of `spec` under `cluster`.
absl::StatusOr<PsClientOptions> MakePsClientOptions(const ClusterOptions& cluster, const ClusterSpec& spec,
                                                    const TaskId& task);

}  // namespace shardwild
