#include "net/grpc_util.h"

#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"

namespace shardwild {
namespace {

void DropLog(gpr_log_func_args* /*args*/) {}

}  // namespace

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

grpc::Status CheckToken(const grpc::ServerContext& context, const std::string& token, const std::string& task) {
  if (token.empty()) return grpc::Status::OK;
  constexpr std::string_view kBearer = "Bearer ";
  const auto& md = context.client_metadata();
  auto it = md.find(kTokenMetadataKey);
  const std::string_view got = it == md.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
  // "Bearer " then the token, compared in time that depends only on the lengths.
  const bool ok = it != md.end() && got.substr(0, kBearer.size()) == kBearer &&
                  ConstantTimeEquals(got.substr(std::min(got.size(), kBearer.size())), token);
  if (!ok) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(task, ": ",
                                     it == md.end() ? "the request carries no token" : "the request's token is wrong",
                                     " (cluster.token_file)"));
  }
  return grpc::Status::OK;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsOf(const PsServerOptions& options) {
  if (options.tls_cert_pem.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
  return grpc::SslServerCredentials(ssl);
}

namespace {

// Keepalive after `seconds` without traffic, and as long for the answer
// (0: none). Pings go even without calls in flight (an idle session or
// channel is watched too) and without data in between.
template <typename SetInt>
void SetKeepalive(double seconds, const SetInt& set) {
  if (seconds <= 0) return;
  const int ms = std::max(100, static_cast<int>(seconds * 1000));
  set(GRPC_ARG_KEEPALIVE_TIME_MS, ms);
  set(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms);
  set(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  set(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

}  // namespace

void SetServerKeepalive(const PsServerOptions& options, grpc::ServerBuilder* builder) {
  SetKeepalive(options.keepalive_s, [builder](const char* key, int v) { builder->AddChannelArgument(key, v); });
  if (options.keepalive_s <= 0) return;
  // The clients ping as often as this server does: allow it (a ping
  // more frequent than the minimum is a strike, and too many strikes close
  // the connection).
  const int ms = std::max(100, static_cast<int>(options.keepalive_s * 1000));
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, ms / 2);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

std::shared_ptr<grpc::Channel> MakeChannel(const PsClientOptions& options) {
  grpc::ChannelArguments args;
  SetKeepalive(options.keepalive_s, [&args](const char* key, int v) { args.SetInt(key, v); });
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  const int initial_ms = std::max(1, static_cast<int>(options.initial_backoff_s * 1000));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, initial_ms);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, initial_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(initial_ms, static_cast<int>(options.max_backoff_s * 1000)));
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options.tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_pem;
    creds = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  return grpc::CreateCustomChannel(options.address, creds, args);
}

void PrepareContext(const PsClientOptions& options, grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(options.deadline_s * 1e6)));
  AddToken(options, context);
}

void AddToken(const PsClientOptions& options, grpc::ClientContext* context) {
  if (!options.token.empty()) context->AddMetadata(kTokenMetadataKey, absl::StrCat("Bearer ", options.token));
}

bool RefusedForGood(grpc::StatusCode code) {
  return code == grpc::StatusCode::INVALID_ARGUMENT || code == grpc::StatusCode::PERMISSION_DENIED ||
         code == grpc::StatusCode::UNAUTHENTICATED;
}

double NextBackoff(grpc::StatusCode code, double backoff, const PsClientOptions& options) {
  return code == grpc::StatusCode::ABORTED ? backoff : std::min(2 * backoff, options.max_backoff_s);
}

void BackOff(grpc::Channel& channel, double seconds, const std::function<bool()>& stop) {
  // Steady time throughout: a wall-clock step (NTP) must not stretch or cut
  // a backoff, so each slice's gRPC deadline is on gRPC's monotonic clock.
  using SteadyClock = std::chrono::steady_clock;
  constexpr std::chrono::milliseconds kSlice(100);
  const SteadyClock::time_point end =
      SteadyClock::now() + std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, seconds) * 1e6));
  while (!(stop && stop())) {
    const SteadyClock::time_point now = SteadyClock::now();
    if (now >= end) return;
    const auto slice = std::min<SteadyClock::duration>(end - now, kSlice);
    const grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) {
      std::this_thread::sleep_for(slice);
    } else {
      // Returns at a state change or after `slice`; polls the attempt meanwhile.
      const int64_t micros = std::chrono::duration_cast<std::chrono::microseconds>(slice).count();
      (void)channel.WaitForStateChange(
          state, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_micros(micros, GPR_TIMESPAN)));
    }
  }
}

void QuietGrpcLogs() {
  if (std::getenv("SHARDWILD_GRPC_LOGS") != nullptr) return;
  gpr_set_log_function(DropLog);
}

}  // namespace shardwild
