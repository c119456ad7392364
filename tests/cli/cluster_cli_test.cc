// `shardwild cluster-info`: the cluster spec from --cluster, TF_CONFIG or
// flags, as the built binary prints it, and its one-line errors.
#include <stdlib.h>

#include <fstream>
#include <string>

#include "cli_child.h"
#include "gtest/gtest.h"

namespace shardwild::clitest {
namespace {

constexpr char kSpec[] = R"({
  "cluster": {"chief": ["127.0.0.1:2222"], "ps": ["127.0.0.1:2223", "127.0.0.1:2224"],
              "worker": ["127.0.0.1:2225", "127.0.0.1:2226"]},
  "task": {"type": "worker", "index": 0},
  "environment": "cloud"
})";

class ClusterInfoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    unsetenv("TF_CONFIG");
  }
  void TearDown() override { unsetenv("TF_CONFIG"); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_.path() / name).string();
    std::ofstream(path) << text;
    return path;
  }
  TempDir dir_;
};

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_F(ClusterInfoTest, PrintsClusterRoleAndShardMap) {
  const std::string spec = Write("c.json", kSpec);
  Result r = RunCli({"cluster-info", kConfig, "--cluster", spec, "--set", "ps.shards=5"});
  ASSERT_EQ(r.code(), 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  EXPECT_TRUE(Has(r.out, "cluster (from " + spec + "):")) << r.out;
  EXPECT_TRUE(Has(r.out, "ps:        127.0.0.1:2223, 127.0.0.1:2224")) << r.out;
  EXPECT_TRUE(Has(r.out, "evaluator: -")) << r.out;
  EXPECT_TRUE(Has(r.out, "this task: worker:0 (127.0.0.1:2225)")) << r.out;
  EXPECT_TRUE(Has(r.out, "shard map: 5 shards over 2 ps tasks (div rule: the first 1 get 3, the rest 2)")) << r.out;
  EXPECT_TRUE(Has(r.out, "ps:0   127.0.0.1:2223           shards 0-2")) << r.out;
  EXPECT_TRUE(Has(r.out, "ps:1   127.0.0.1:2224           shards 3-4")) << r.out;
  EXPECT_TRUE(Has(r.out, "security: bind 127.0.0.1 (loopback), token none, TLS off")) << r.out;

  // Flags win over the file's task.
  r = RunCli({"cluster-info", kConfig, "--cluster", spec, "--task-type", "ps", "--task-index", "1", "--set",
              "ps.shards=5"});
  ASSERT_EQ(r.code(), 0) << r.err;
  EXPECT_TRUE(Has(r.out, "this task: ps:1 (127.0.0.1:2224), serves shards 3-4, listens on 127.0.0.1:2224")) << r.out;
}

TEST_F(ClusterInfoTest, Json) {
  const std::string spec = Write("c.json", kSpec);
  Result r = RunCli({"cluster-info", kConfig, "--cluster", spec, "--task-type", "ps", "--task-index", "0", "--json"});
  ASSERT_EQ(r.code(), 0) << r.err;
  const json j = LastLineJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["source"], spec);
  EXPECT_EQ(j["cluster"]["worker"], json::array({"127.0.0.1:2225", "127.0.0.1:2226"}));
  EXPECT_EQ(j["cluster"]["evaluator"], json::array());
  EXPECT_EQ(j["task"]["name"], "ps:0");
  EXPECT_EQ(j["task"]["bind_address"], "127.0.0.1:2223");
  // ps.shards auto: one shard per ps task.
  EXPECT_EQ(j["shards"], 2);
  EXPECT_EQ(j["task"]["shards"], json::array({0}));
  ASSERT_EQ(j["shard_map"].size(), 2u);
  EXPECT_EQ(j["shard_map"][1]["task"], "ps:1");
  EXPECT_EQ(j["shard_map"][1]["shards"], json::array({1}));
  EXPECT_EQ(j["security"]["bind_loopback"], true);
  EXPECT_EQ(j["security"]["token"], false);
}

TEST_F(ClusterInfoTest, TfConfigEnvironmentAndFilePrecedence) {
  setenv("TF_CONFIG", R"({"cluster": {"chief": ["localhost:1"], "ps": ["localhost:2"]}, "task": {"type": "chief"}})",
         1);
  Result r = RunCli({"cluster-info", kConfig, "--json"});
  ASSERT_EQ(r.code(), 0) << r.err;
  json j = LastLineJson(r.out);
  EXPECT_EQ(j["source"], "TF_CONFIG");
  EXPECT_EQ(j["task"]["name"], "chief:0");
  // --cluster FILE wins over TF_CONFIG.
  const std::string spec = Write("c.json", kSpec);
  r = RunCli({"cluster-info", kConfig, "--cluster", spec, "--json"});
  ASSERT_EQ(r.code(), 0) << r.err;
  j = LastLineJson(r.out);
  EXPECT_EQ(j["source"], spec);
  EXPECT_EQ(j["task"]["name"], "worker:0");
  // A bad TF_CONFIG is named as such.
  setenv("TF_CONFIG", R"({"cluster": {"chief": ["localhost:1"], "ps": ["localhost:70000"]}})", 1);
  ExpectOneErrorLine(RunCli({"cluster-info", kConfig}),
                     {"TF_CONFIG: cluster.ps[0]: expected host:port with a port in 1..65535, got 'localhost:70000'"});
}

TEST_F(ClusterInfoTest, SpecErrorsAreOneLine) {
  struct Case {
    const char* text;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {R"({"cluster": {"chief": ["c:1"], "ps": ["p"]}})", {"cluster.ps[0]: expected host:port", "'p'"}},
      {R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"], "master": ["m:1"]}})",
       {"cluster.master: unknown role 'master'"}},
      {R"({"cluster": {"chief": ["c:1"], "ps": {"0": "p:1", "0": "q:1"}}})", {"cluster.ps: index 0 appears twice"}},
      {R"({"cluster": {"chief": ["c:1"], "ps": ["p:1", "p:1"]}})",
       {"cluster.ps[1]: address p:1 is already used by cluster.ps[0]"}},
      {R"({"cluster": {"ps": ["p:1"]}})", {"cluster.chief: missing"}},
      {R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "task": {"type": "ps", "index": 3}})",
       {"task.index: 3 is out of range: cluster.ps in"}},
      {R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "task": {"type": "tpu", "index": 0}})",
       {"task.type: unknown role 'tpu'"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    const std::string spec = Write("bad.json", c.text);
    std::vector<std::string> parts = c.parts;
    parts.push_back(spec + ": ");
    ExpectOneErrorLine(RunCli({"cluster-info", kConfig, "--cluster", spec}), parts);
  }
  const std::string spec = Write("c.json", kSpec);
  ExpectOneErrorLine(RunCli({"cluster-info", kConfig, "--cluster", spec, "--task-type", "worker", "--task-index", "2"}),
                     {"--task-index 2: 2 is out of range: cluster.worker in " + spec + " has 2 tasks (0..1)"});
  ExpectOneErrorLine(RunCli({"cluster-info", kConfig, "--cluster", spec, "--task-type", "boss"}),
                     {"--task-type: unknown role 'boss'"});
  ExpectOneErrorLine(RunCli({"cluster-info", kConfig}), {"no cluster spec: give --cluster FILE, set TF_CONFIG"});
  ExpectOneErrorLine(RunCli({"cluster-info", kConfig, "--cluster", spec + ".absent"}),
                     {spec + ".absent: cannot open cluster spec"});
  ExpectOneErrorLine(RunCli({"cluster-info", kConfig, "--cluster", spec, "--set", "ps.shards=1"}),
                     {"ps.shards: 1 shard over 2 ps tasks would leave ps:1 without a shard"});
  ExpectOneErrorLine(RunCli({"cluster-info", kConfig, "--cluster", spec, "--set", "cluster.bind_host=0.0.0.0"}),
                     {"cluster.bind_host: 0.0.0.0 is not a loopback address", "set cluster.token_file"});
  ExpectOneErrorLine(RunCli({"cluster-info", kConfig, "--cluster", spec, "--set", "cluster.deadline_s=0"}),
                     {"cluster.deadline_s: must be > 0, got 0"});
  ExpectOneErrorLine(RunCli({"cluster-info", kConfig, "--cluster", spec, "--set", "cluster.tokenfile=x"}),
                     {"unknown key 'cluster.tokenfile'"});
}

}  // namespace
}  // namespace shardwild::clitest
