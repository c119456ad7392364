#include "net/net_options.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status.h"

namespace shardwild {
namespace {

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// host:port where the port may be 0.
absl::StatusOr<HostPort> ParseBindAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon != std::string::npos && address.substr(colon + 1) == "0") {
    SW_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(address.substr(0, colon + 1) + "1"));
    hp.port = 0;
    return hp;
  }
  return ParseHostPort(address);
}

absl::Status CheckMessageBytes(const std::string& field, int64_t v) {
  if (v < 4096 || v > (int64_t{1} << 30)) return Bad(field, absl::StrCat("must be in [4096, 1073741824], got ", v));
  return absl::OkStatus();
}

absl::Status CheckKeepalive(double v) {
  if (v == 0 || (v >= 0.1 && v <= 86400)) return absl::OkStatus();
  return Bad("cluster.keepalive_s", absl::StrCat("must be 0 (off) or in [0.1, 86400], got ", v));
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& key, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(key, ": ", path, ": cannot open: ", std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::Status PsServerOptions::Validate() const {
  absl::StatusOr<HostPort> bind = ParseBindAddress(bind_address);
  if (!bind.ok()) return Bad("bind address", std::string(bind.status().message()));
  if (!bind->IsLoopback() && token.empty()) {
    return Bad("cluster.bind_host",
               absl::StrCat(bind->host, " is not a loopback address, so the server would be reachable from other "
                            "machines: set cluster.token_file (a shared secret every request must carry)"));
  }
  if (!token.empty() && token.size() < kMinTokenBytes) {
    return Bad("cluster.token_file", absl::StrCat("the token must be at least ", kMinTokenBytes, " bytes, got ",
                                                  token.size()));
  }
  if (tls_cert_pem.empty() != tls_key_pem.empty()) {
    return Bad("cluster.tls_cert_file", "TLS needs both a certificate and a private key");
  }
  SW_RETURN_IF_ERROR(CheckMessageBytes("cluster.max_message_bytes", max_message_bytes));
  if (max_push_bytes < 1) return Bad("max_push_bytes", absl::StrCat("must be >= 1, got ", max_push_bytes));
  if (checkpoint_keep < 1) return Bad("checkpoint_keep", absl::StrCat("must be >= 1, got ", checkpoint_keep));
  return CheckKeepalive(keepalive_s);
}

absl::Status PsClientOptions::Validate() const {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok()) return Bad(absl::StrCat(task_name, " address"), std::string(hp.status().message()));
  if (!(deadline_s > 0) || !std::isfinite(deadline_s)) {
    return Bad("cluster.deadline_s", absl::StrCat("must be > 0, got ", deadline_s));
  }
  if (max_attempts < 1) return Bad("cluster.max_attempts", absl::StrCat("must be >= 1, got ", max_attempts));
  if (!(initial_backoff_s > 0) || !(max_backoff_s >= initial_backoff_s)) {
    return Bad("cluster.initial_backoff_s",
               absl::StrCat("need 0 < initial_backoff_s <= max_backoff_s, got ", initial_backoff_s, " and ",
                            max_backoff_s));
  }
  SW_RETURN_IF_ERROR(CheckKeepalive(keepalive_s));
  return CheckMessageBytes("cluster.max_message_bytes", max_message_bytes);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cluster.token_file: ", path, ": ", std::strerror(errno)));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "cluster.token_file: %s is accessible by group or others (mode %04o); chmod 600 it", path,
        static_cast<unsigned>(st.st_mode & 07777)));
  }
  SW_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile("cluster.token_file", path));
  const std::string first_line = text.substr(0, text.find('\n'));
  const std::string token(absl::StripAsciiWhitespace(first_line));
  if (token.size() < kMinTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("cluster.token_file: ", path, ": the token must be at least ",
                                                   kMinTokenBytes, " bytes, got ", token.size()));
  }
  return token;
}

std::string BindAddressOf(const ClusterOptions& cluster, const ClusterSpec& spec, const TaskId& task) {
  const HostPort& addr = spec.address(task);
  // On loopback, the task's own loopback address: distinct loopback addresses
  // (127.0.0.2, ...) then stand for distinct machines of one box.
  const bool own = IsLoopbackHost(cluster.bind_host) && addr.IsLoopback();
  return HostPort{own ? addr.host : cluster.bind_host, addr.port}.ToString();
}

absl::StatusOr<PsServerOptions> MakePsServerOptions(const ClusterOptions& cluster, const ClusterSpec& spec,
                                                    const TaskId& task) {
  PsServerOptions o;
  o.task_name = task.ToString();
  o.bind_address = BindAddressOf(cluster, spec, task);
  if (!cluster.token_file.empty()) {
    SW_ASSIGN_OR_RETURN(o.token, ReadTokenFile(cluster.token_file));
  }
  if (!cluster.tls_cert_file.empty()) {
    SW_ASSIGN_OR_RETURN(o.tls_cert_pem, ReadWholeFile("cluster.tls_cert_file", cluster.tls_cert_file));
    SW_ASSIGN_OR_RETURN(o.tls_key_pem, ReadWholeFile("cluster.tls_key_file", cluster.tls_key_file));
  }
  o.max_message_bytes = cluster.max_message_bytes;
  o.keepalive_s = cluster.keepalive_s;
  SW_RETURN_IF_ERROR(o.Validate());
  return o;
}

absl::StatusOr<PsClientOptions> MakePsClientOptions(const ClusterOptions& cluster, const ClusterSpec& spec,
                                                    const TaskId& task) {
  PsClientOptions o;
  o.task_name = task.ToString();
  o.address = spec.address(task).ToString();
  if (!cluster.token_file.empty()) {
    SW_ASSIGN_OR_RETURN(o.token, ReadTokenFile(cluster.token_file));
  }
  if (!cluster.tls_cert_file.empty()) {
    o.tls = true;
    const std::string& root = cluster.tls_ca_file.empty() ? cluster.tls_cert_file : cluster.tls_ca_file;
    SW_ASSIGN_OR_RETURN(o.tls_root_pem,
                        ReadWholeFile(cluster.tls_ca_file.empty() ? "cluster.tls_cert_file" : "cluster.tls_ca_file",
                                      root));
  }
  o.deadline_s = cluster.deadline_s;
  o.max_attempts = cluster.max_attempts;
  o.initial_backoff_s = cluster.initial_backoff_s;
  o.max_backoff_s = cluster.max_backoff_s;
  o.max_message_bytes = cluster.max_message_bytes;
  o.compression = cluster.compression;
  o.keepalive_s = cluster.keepalive_s;
  SW_RETURN_IF_ERROR(o.Validate());
  return o;
}

}  // namespace shardwild
