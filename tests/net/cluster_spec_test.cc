#include "net/cluster_spec.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "net/net_options.h"

namespace shardwild {
namespace {

constexpr char kSpec[] = R"({
  "cluster": {"chief": ["host0:2222"], "ps": ["host1:2222", "host2:2222"],
              "worker": ["host3:2222", "host4:2222"], "evaluator": ["host5:2222"]},
  "task": {"type": "worker", "index": 1, "trial": "t7"},
  "environment": "cloud", "rpc_layer": "grpc"
})";

// The message of a failed parse of `text` (empty if it parsed).
std::string ParseError(const std::string& text) {
  absl::StatusOr<ClusterSpec> s = ParseClusterSpec(text, "c.json");
  if (s.ok()) return "";
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_EQ(std::string(s.status().message()).find('\n'), std::string::npos) << "one line: " << s.status();
  return std::string(s.status().message());
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack) << "\nlacks: " << (needle)

TEST(ClusterSpecTest, ParsesTfConfigAndIgnoresUnknownKeys) {
  absl::StatusOr<ClusterSpec> s = ParseClusterSpec(kSpec, "TF_CONFIG");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->num_tasks(Role::kChief), 1);
  EXPECT_EQ(s->num_tasks(Role::kPs), 2);
  EXPECT_EQ(s->num_tasks(Role::kWorker), 2);
  EXPECT_EQ(s->num_tasks(Role::kEvaluator), 1);
  ASSERT_TRUE(s->task.has_value());
  EXPECT_EQ(s->task->ToString(), "worker:1");
  EXPECT_EQ(s->address(*s->task).ToString(), "host4:2222");
  EXPECT_EQ(s->address({Role::kPs, 0}).host, "host1");
  EXPECT_EQ(s->address({Role::kPs, 0}).port, 2222);
  EXPECT_EQ(s->source, "TF_CONFIG");
}

TEST(ClusterSpecTest, IndexObjectsAndIpv6) {
  absl::StatusOr<ClusterSpec> s = ParseClusterSpec(
      R"({"cluster": {"chief": {"0": "[::1]:1000"}, "ps": {"1": "127.0.0.1:1002", "0": "127.0.0.1:1001"}}})", "x");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->address({Role::kChief, 0}).host, "::1");
  EXPECT_EQ(s->address({Role::kChief, 0}).ToString(), "[::1]:1000");
  EXPECT_EQ(s->address({Role::kPs, 0}).port, 1001);
  EXPECT_EQ(s->address({Role::kPs, 1}).port, 1002);
  EXPECT_FALSE(s->task.has_value());
}

TEST(ClusterSpecTest, BadAddresses) {
  for (const char* addr : {"host", "host:0", "host:65536", "host:-1", ":80", "host:8a", "::1:80", "[::1:80",
                           "[zz]:80", "ho st:80", "host:"}) {
    const std::string text = std::string(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1", ")") + addr + "\"]}}";
    const std::string e = ParseError(text);
    EXPECT_HAS(e, "c.json: cluster.ps[1]: expected host:port with a port in 1..65535");
    EXPECT_HAS(e, std::string("'") + addr + "'");
  }
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1"], "ps": [7]}})"),
             "c.json: cluster.ps[0]: expected a host:port string, got the number 7");
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": "c:1", "ps": ["p:1"]}})"),
             "c.json: cluster.chief: expected a list of host:port addresses, got 'c:1'");
}

TEST(ClusterSpecTest, UnknownRole) {
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"], "master": ["m:1"]}})"),
             "c.json: cluster.master: unknown role 'master' (expected chief, ps, worker or evaluator)");
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "task": {"type": "boss", "index": 0}})"),
             "c.json: task.type: unknown role 'boss'");
}

TEST(ClusterSpecTest, Duplicates) {
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1"], "ps": {"0": "p:1", "0": "q:1"}}})"),
             "c.json: cluster.ps: index 0 appears twice");
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"], "ps": ["q:1"]}})"),
             "c.json: cluster.ps: the role appears twice");
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1", "p:1"]}})"),
             "c.json: cluster.worker[1]: address p:1 is already used by cluster.ps[0]");
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1"], "ps": {"0": "p:1", "2": "q:1"}}})"),
             "c.json: cluster.ps: index 1 is missing");
  // A launcher's own duplicate keys are not ours to judge.
  EXPECT_EQ(ParseError(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "env": {"a": 1, "a": 2}})"), "");
}

TEST(ClusterSpecTest, ChiefAndPsRequired) {
  EXPECT_HAS(ParseError(R"({"cluster": {"ps": ["p:1"], "worker": ["w:1"]}})"),
             "c.json: cluster.chief: missing (a cluster needs exactly one chief)");
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1", "d:1"], "ps": ["p:1"]}})"),
             "c.json: cluster.chief: expected exactly one chief, got 2");
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"]}})"), "c.json: cluster.ps: missing");
  EXPECT_HAS(ParseError(R"({"task": {"type": "ps"}})"), "c.json: cluster: missing");
  EXPECT_HAS(ParseError("[1]"), "c.json: expected a JSON object");
  EXPECT_HAS(ParseError("{\"cluster\": "), "c.json: invalid JSON: ");
}

TEST(ClusterSpecTest, TaskIndexOutOfRange) {
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1", "q:1"]}, "task": {"type": "ps", "index": 2}})"),
             "c.json: task.index: 2 is out of range: cluster.ps in c.json has 2 tasks (0..1)");
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "task": {"type": "worker", "index": 0}})"),
             "c.json: task.type: 'worker' but c.json has no worker tasks");
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "task": {"type": "ps", "index": -1}})"),
             "c.json: task.index: expected an integer >= 0, got -1");
  EXPECT_HAS(ParseError(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "task": {"type": "ps", "index": "0"}})"),
             "c.json: task.index: expected an integer >= 0, got '0'");
}

TEST(ClusterSpecTest, ResolveFlagsWinFileOverEnvironment) {
  const std::string path = ::testing::TempDir() + "/cluster_spec_test.json";
  {
    std::ofstream f(path);
    f << kSpec;
  }
  ClusterSpecSources src;
  src.cluster_file = path;
  src.tf_config = R"({"cluster": {"chief": ["other:1"], "ps": ["p:1"]}, "task": {"type": "chief"}})";
  absl::StatusOr<ClusterSpec> s = ResolveClusterSpec(src);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->source, path);
  EXPECT_EQ(s->task->ToString(), "worker:1");
  src.task_type = "ps";
  s = ResolveClusterSpec(src);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->task->ToString(), "ps:1");  // type from the flag, index from the file
  src.task_index = 0;
  s = ResolveClusterSpec(src);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->task->ToString(), "ps:0");
  src.task_index = 5;
  s = ResolveClusterSpec(src);
  ASSERT_FALSE(s.ok());
  EXPECT_HAS(s.status().message(), "--task-index 5: 5 is out of range: cluster.ps in " + path + " has 2 tasks");
  src.task_type = "leader";
  s = ResolveClusterSpec(src);
  ASSERT_FALSE(s.ok());
  EXPECT_HAS(s.status().message(), "--task-type: unknown role 'leader'");

  // Without a file, TF_CONFIG.
  ClusterSpecSources env;
  env.tf_config = src.tf_config;
  s = ResolveClusterSpec(env);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->source, "TF_CONFIG");
  EXPECT_EQ(s->task->ToString(), "chief:0");
  env.tf_config = R"({"cluster": {"chief": ["c:1"], "ps": ["p:x"]}})";
  s = ResolveClusterSpec(env);
  ASSERT_FALSE(s.ok());
  EXPECT_HAS(s.status().message(), "TF_CONFIG: cluster.ps[0]: expected host:port");

  // Neither.
  s = ResolveClusterSpec(ClusterSpecSources{});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_HAS(s.status().message(), "--cluster FILE, set TF_CONFIG");
  ClusterSpecSources missing;
  missing.cluster_file = path + ".absent";
  s = ResolveClusterSpec(missing);
  ASSERT_FALSE(s.ok());
  EXPECT_HAS(s.status().message(), path + ".absent: cannot open cluster spec");

  // An index without any type.
  ClusterSpecSources index_only;
  index_only.tf_config = R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]}})";
  index_only.task_index = 0;
  s = ResolveClusterSpec(index_only);
  ASSERT_FALSE(s.ok());
  EXPECT_HAS(s.status().message(), "--task-index: needs --task-type");
  std::filesystem::remove(path);
}

TEST(ClusterSpecTest, Loopback) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.1.2.3"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_TRUE(IsLoopbackHost("[::1]"));
  EXPECT_TRUE(IsLoopbackHost("::ffff:127.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("::"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("128.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("example.com"));
}

TEST(ShardMapTest, DivRuleOverPsTasks) {
  absl::StatusOr<ShardMap> m = ShardMap::Make(5, 2);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->first_shard(0), 0);
  EXPECT_EQ(m->num_shards_of(0), 3);
  EXPECT_EQ(m->first_shard(1), 3);
  EXPECT_EQ(m->num_shards_of(1), 2);
  const int owners[] = {0, 0, 0, 1, 1};
  for (int s = 0; s < 5; ++s) EXPECT_EQ(m->OwnerOf(s), owners[s]) << s;
  // 13 over 5: 3,3,3,2,2 (TF's div rule).
  m = ShardMap::Make(13, 5);
  ASSERT_TRUE(m.ok());
  const int sizes[] = {3, 3, 3, 2, 2};
  for (int p = 0; p < 5; ++p) EXPECT_EQ(m->num_shards_of(p), sizes[p]);
  for (int s = 0; s < 13; ++s) {
    const int p = m->OwnerOf(s);
    EXPECT_GE(s, m->first_shard(p));
    EXPECT_LT(s, m->first_shard(p) + m->num_shards_of(p));
  }
  absl::StatusOr<ShardMap> bad = ShardMap::Make(1, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_HAS(bad.status().message(), "ps.shards: 1 shard over 2 ps tasks would leave ps:1 without a shard");
}

TEST(NetOptionsTest, NonLoopbackBindNeedsAToken) {
  PsServerOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.bind_address = "0.0.0.0:0";
  absl::Status s = o.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "cluster.bind_host: 0.0.0.0 is not a loopback address");
  EXPECT_HAS(s.message(), "set cluster.token_file");
  o.token = "short";
  EXPECT_HAS(o.Validate().message(), "at least 16 bytes");
  o.token = "0123456789abcdef0123";
  EXPECT_TRUE(o.Validate().ok());
  o.bind_address = "[::1]:0";
  o.token.clear();
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
  o.bind_address = "127.0.0.1:99999";
  EXPECT_HAS(o.Validate().message(), "bind address: expected host:port");
}

TEST(NetOptionsTest, TokenFile) {
  const std::string path = ::testing::TempDir() + "/cluster_spec_test.token";
  {
    std::ofstream f(path);
    f << "  0123456789abcdef0123  \nsecond line\n";
  }
  chmod(path.c_str(), 0644);
  absl::StatusOr<std::string> t = ReadTokenFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_HAS(t.status().message(), "is accessible by group or others (mode 0644); chmod 600 it");
  chmod(path.c_str(), 0600);
  t = ReadTokenFile(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "0123456789abcdef0123");
  {
    std::ofstream f(path);
    f << "short\n";
  }
  t = ReadTokenFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_HAS(t.status().message(), "the token must be at least 16 bytes, got 5");
  std::filesystem::remove(path);
  t = ReadTokenFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_HAS(t.status().message(), "cluster.token_file: " + path);
}

}  // namespace
}  // namespace shardwild

namespace shardwild {
namespace {

TEST(NetOptionsTest, FromClusterOptions) {
  const std::string dir = ::testing::TempDir() + "/net_options_test_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string token = dir + "/token", cert = dir + "/cert.pem", key = dir + "/key.pem";
  std::ofstream(token) << "a-token-of-twenty-bytes\n";
  chmod(token.c_str(), 0600);
  std::ofstream(cert) << "CERT";
  std::ofstream(key) << "KEY";
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
      R"({"cluster": {"chief": ["10.1.1.1:2000"], "ps": ["10.1.1.2:2001", "[fd00::3]:2002"]}})", "c.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ClusterOptions cluster;
  cluster.token_file = token;
  cluster.tls_cert_file = cert;
  cluster.tls_key_file = key;
  cluster.deadline_s = 3;
  cluster.max_attempts = 4;
  cluster.max_message_bytes = 1 << 16;
  cluster.keepalive_s = 2.5;

  // Loopback by default, with the spec's port.
  absl::StatusOr<PsServerOptions> server = MakePsServerOptions(cluster, *spec, {Role::kPs, 1});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(server->bind_address, "127.0.0.1:2002");
  EXPECT_EQ(server->task_name, "ps:1");
  EXPECT_EQ(server->token, "a-token-of-twenty-bytes");
  EXPECT_EQ(server->tls_cert_pem, "CERT");
  EXPECT_EQ(server->tls_key_pem, "KEY");
  EXPECT_EQ(server->max_message_bytes, 1 << 16);
  EXPECT_EQ(server->keepalive_s, 2.5);
  cluster.bind_host = "::";
  server = MakePsServerOptions(cluster, *spec, {Role::kPs, 0});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(server->bind_address, "[::]:2001");

  absl::StatusOr<PsClientOptions> client = MakePsClientOptions(cluster, *spec, {Role::kPs, 1});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(client->address, "[fd00::3]:2002");
  EXPECT_EQ(client->task_name, "ps:1");
  EXPECT_EQ(client->token, "a-token-of-twenty-bytes");
  EXPECT_TRUE(client->tls);
  EXPECT_EQ(client->tls_root_pem, "CERT");  // no CA file: the certificate itself
  EXPECT_EQ(client->deadline_s, 3);
  EXPECT_EQ(client->max_attempts, 4);
  EXPECT_EQ(client->keepalive_s, 2.5);

  // Without a token a non-loopback bind is refused; a missing file is named.
  ClusterOptions open;
  open.bind_host = "0.0.0.0";
  absl::StatusOr<PsServerOptions> refused = MakePsServerOptions(open, *spec, {Role::kPs, 0});
  ASSERT_FALSE(refused.ok());
  EXPECT_HAS(refused.status().message(), "cluster.bind_host: 0.0.0.0 is not a loopback address");
  cluster.tls_key_file = dir + "/absent.pem";
  refused = MakePsServerOptions(cluster, *spec, {Role::kPs, 0});
  ASSERT_FALSE(refused.ok());
  EXPECT_HAS(refused.status().message(), "cluster.tls_key_file: " + dir + "/absent.pem: cannot open");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardwild
