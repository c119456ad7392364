// model.precision through the command line (the built binary as a child
// process): a bf16 MLP trains to the f32 accuracy and resumes as f32,
// `bench` says what oneDNN runs and measures against the bf16 peak, and a
// CPU without bf16 instructions gets one error line. The training tests
// skip without Fashion-MNIST or without AVX512_BF16/AMX_BF16.
#include <stdlib.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_child.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

using nlohmann::json;
using namespace clitest;

// Whether `shardwild topology` finds bf16 instructions on this CPU.
bool HaveBf16() {
  const Result r = RunCli({"topology", "--json"});
  const json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  for (const json& name : j["cpu"]["instruction_sets"]) {
    if (name == "AVX512_BF16" || name == "AMX_BF16") return true;
  }
  return false;
}

// Sets an environment variable for the children started while it lives.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

// oneDNN limited to AVX2 (as on a CPU without AVX-512) has no bf16 matmul:
// one line naming the instruction sets, the key and the way out.
TEST(PrecisionCliTest, Bf16WithoutBf16InstructionsIsOneErrorLine) {
  ScopedEnv isa("ONEDNN_MAX_CPU_ISA", "AVX2");
  ExpectOneErrorLine(RunCli({"train", kConfig, "--set", "model.precision=bf16", "--set", "train.epochs=1", "--set",
                             "data.max_train_records=500", "--set", "data.max_test_records=100"}),
                     {"model.precision", "AVX512_BF16", "AMX_BF16", "model.precision: f32"});
  // With AVX-512 but no bf16 instructions oneDNN would emulate: refused too.
  ScopedEnv isa512("ONEDNN_MAX_CPU_ISA", "AVX512_CORE");
  ExpectOneErrorLine(RunCli({"bench", kConfig, "--set", "model.precision=bf16", "--set", "bench.steps=5"}),
                     {"model.precision", "AVX512_BF16"});
}

class PrecisionTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST is not under /usr/share/datasets/fashion-mnist";
    if (!HaveBf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16 or AMX_BF16";
  }
};

// The default MLP in bf16 reaches the accuracy the f32 model reaches in 10
// epochs (issue acceptance: >= 0.885); its checkpoint then resumes as f32
// (checkpoints hold the store's f32 parameters whatever the precision).
TEST_F(PrecisionTrainTest, Bf16MlpReachesTheF32AccuracyAndResumesAsF32) {
  TempDir dir;
  const std::string ckpt = (dir.path() / "ckpt").string();
  const Result bf16 = RunCli({"train", kConfig, "--set", "model.precision=bf16", "--set", "checkpoint.dir=" + ckpt,
                              "--set", "ps.job_name=prectest", "--json"});
  ASSERT_EQ(bf16.code(), 0) << bf16.err;
  const json j = LastLineJson(bf16.out);
  ASSERT_TRUE(j.is_object()) << bf16.out;
  EXPECT_EQ(j["epochs"], 10);
  EXPECT_EQ(j["precision"], "bf16");
  EXPECT_GE(j["test_accuracy"].get<double>(), 0.885) << j.dump();

  const Result f32 = RunCli({"train", kConfig, "--set", "model.precision=f32", "--set", "checkpoint.dir=" + ckpt,
                             "--set", "train.epochs=11", "--set", "ps.job_name=prectest", "--json"});
  ASSERT_EQ(f32.code(), 0) << f32.err;
  const json k = LastLineJson(f32.out);
  ASSERT_TRUE(k.is_object()) << f32.out;
  EXPECT_EQ(k["resumed_from_step"], j["steps"]) << k.dump();
  EXPECT_EQ(k["precision"], "f32");
  EXPECT_GE(k["test_accuracy"].get<double>(), 0.88) << k.dump();
}

// `bench` in bf16: oneDNN's implementation of every layer is a bf16 one, and
// peak_fraction is against the same-run bf16 peak.
TEST_F(PrecisionTrainTest, BenchReportsBf16ImplementationsAndPeak) {
  const Result r = RunCli({"bench", kConfig, "--set", "model.precision=bf16", "--set", "bench.steps=20", "--set",
                           "bench.warmup_steps=2", "--json"});
  ASSERT_EQ(r.code(), 0) << r.err;
  const json j = LastLineJson(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["precision"], "bf16");
  ASSERT_EQ(j["layer_impls"].size(), 3u) << j.dump();
  for (const json& impl : j["layer_impls"]) {
    const std::string s = impl.get<std::string>();
    EXPECT_TRUE(s.find("bf16") != std::string::npos || s.find("amx") != std::string::npos) << s;
  }
  ASSERT_TRUE(j["bf16_peak_gflops"].is_number()) << j.dump();
  EXPECT_NEAR(j["peak_fraction"].get<double>(),
              j["model_gflops"].get<double>() / j["bf16_peak_gflops"].get<double>(), 1e-9);
  EXPECT_NE(r.out.find("of the bf16 peak"), std::string::npos) << r.out;

  const Result f = RunCli({"bench", kConfig, "--set", "bench.steps=20", "--set", "bench.warmup_steps=2", "--json"});
  ASSERT_EQ(f.code(), 0) << f.err;
  const json k = LastLineJson(f.out);
  EXPECT_EQ(k["precision"], "f32");
  EXPECT_NEAR(k["peak_fraction"].get<double>(), k["model_gflops"].get<double>() / k["peak_gflops"].get<double>(),
              1e-9);
  // The images are packed as their bytes (every pixel k / 255), with no ids.
  EXPECT_EQ(k["data"]["packed"]["dense_bytes"], true) << k.dump();
  EXPECT_EQ(k["data"]["packed"]["ids"], false) << k.dump();
  EXPECT_GT(k["data"]["packed"]["bytes"].get<int64_t>(), 0);
  // The prefetch burst the workers used, measured here (one entry per size
  // probed, the lines one of them) or the default where it could not be.
  const json& burst = k["prefetch_burst"];
  ASSERT_TRUE(burst.is_object()) << k.dump();
  if (burst["source"] == "measured") {
    ASSERT_EQ(burst["sizes"].size(), 8u) << burst.dump();
    bool found = false;
    for (const json& size : burst["sizes"]) {
      found = found || size["lines"] == burst["lines"];
      EXPECT_GE(size["lost"].get<double>(), 0.0) << burst.dump();
      EXPECT_LE(size["lost"].get<double>(), 1.0) << burst.dump();
    }
    EXPECT_TRUE(found) << burst.dump();
  } else {
    EXPECT_EQ(burst["source"], "default") << burst.dump();
    EXPECT_EQ(burst["lines"], 32) << burst.dump();
    EXPECT_TRUE(burst["sizes"].empty()) << burst.dump();
  }
  // Where the store lives, as train reports it; and what ps.memory_kind asks.
  EXPECT_TRUE(k["store"]["memory_kind"] == "private" || k["store"]["memory_kind"] == "shared") << k.dump();
  const Result s = RunCli({"bench", kConfig, "--set", "bench.steps=5", "--set", "bench.warmup_steps=1", "--set",
                           "ps.memory_kind=shared", "--json"});
  ASSERT_EQ(s.code(), 0) << s.err;
  EXPECT_EQ(LastLineJson(s.out)["store"]["memory_kind"], "shared") << s.out;
  const Result p = RunCli({"bench", kConfig, "--set", "bench.steps=5", "--set", "bench.warmup_steps=1", "--set",
                           "ps.memory_kind=private", "--json"});
  ASSERT_EQ(p.code(), 0) << p.err;
  EXPECT_EQ(LastLineJson(p.out)["store"]["memory_kind"], "private") << p.out;
}

}  // namespace
}  // namespace shardwild
