// Tests for YAML config loading, --set overrides and their error messages.
#include "core/config/config.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/base/status.h"
#include "core/config/options.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

// Succeeds if the message of `status` contains every one of `parts`.
::testing::AssertionResult MessageContains(const absl::Status& status, std::initializer_list<std::string> parts) {
  if (status.ok()) return ::testing::AssertionFailure() << "status is OK";
  for (const std::string& part : parts) {
    if (status.message().find(part) == absl::string_view::npos) {
      return ::testing::AssertionFailure() << "message \"" << status.message() << "\" lacks \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

// The smallest valid config: one layer and a training set.
constexpr char kMinimal[] =
    "model:\n"
    "  layers:\n"
    "    - {units: 10}\n"
    "data:\n"
    "  train: /data/train\n";

// A valid config whose line 8 is `train_line`.
std::string WithTrainLine(const std::string& train_line) {
  return std::string(kMinimal) +
         "optimizer:\n"
         "  type: sgd\n" +
         train_line + "\n";
}

std::vector<ConfigOverride> Sets(std::initializer_list<std::string> texts) {
  std::vector<ConfigOverride> out;
  for (const std::string& t : texts) {
    absl::StatusOr<ConfigOverride> o = ParseOverride(t);
    EXPECT_TRUE(o.ok()) << o.status();
    if (o.ok()) out.push_back(*o);
  }
  return out;
}

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/config_test_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
  }

  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Writes `text` to dir_/name and returns the path.
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream out(path, std::ios::binary);
    out << text;
    EXPECT_TRUE(out.good()) << path;
    return path;
  }

  std::string dir_;
};

// ------------------------------------------------------------- loading

TEST_F(ConfigTest, MinimalConfigGetsDefaults) {
  const std::string path = Write("minimal.yaml", kMinimal);
  absl::StatusOr<Config> c = LoadConfig(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, path);
  ASSERT_EQ(c->model.layers.size(), 1u);
  EXPECT_EQ(c->model.layers[0].type, "dense");
  EXPECT_EQ(c->model.layers[0].units, 10);
  EXPECT_EQ(c->model.layers[0].activation, Activation::kNone);
  EXPECT_EQ(c->model.input_dim, 0);
  EXPECT_EQ(c->model.loss, LossType::kSoftmaxCrossEntropy);
  EXPECT_EQ(c->data.format, DataFormat::kIdx);
  EXPECT_EQ(c->data.train, "/data/train");
  EXPECT_EQ(c->data.test, "");
  EXPECT_EQ(c->data.max_train_records, 0);
  const TrainOptions train_defaults;
  EXPECT_EQ(c->train.workers, train_defaults.workers);
  EXPECT_EQ(c->train.intra_op_threads, train_defaults.intra_op_threads);
  EXPECT_EQ(c->train.epochs, 10);
  EXPECT_EQ(c->train.batch_size, 128);
  EXPECT_EQ(c->train.seed, 1u);
  EXPECT_TRUE(c->train.pin_threads);
  EXPECT_EQ(c->train.log_every_s, 1.0);
  EXPECT_EQ(c->optimizer.type, OptimizerType::kAdam);
  EXPECT_FLOAT_EQ(c->optimizer.lr, 0.001f);
  EXPECT_EQ(c->optimizer.schedule, LrSchedule::kConstant);
  EXPECT_FALSE(c->optimizer.nesterov);
  EXPECT_EQ(c->ps.shards, 0);
  EXPECT_EQ(c->ps.update, UpdateMode::kHogwild);
  EXPECT_EQ(c->ps.job_name, "shardwild");
  EXPECT_EQ(c->bench.steps, 200);
  EXPECT_TRUE(c->topology.synthetic.empty());
}

TEST_F(ConfigTest, EveryKeyIsRead) {
  const std::string yaml =
      "model:\n"
      "  input_dim: 6\n"
      "  loss: softmax_cross_entropy\n"
      "  layers:\n"
      "    - {type: dense, units: 5, activation: relu}\n"
      "    - {type: dense, units: 3, activation: none}\n"
      "data: {format: idx, train: tr, test: te, max_train_records: 100, max_test_records: 50}\n"
      "train: {workers: 3, intra_op_threads: auto, epochs: 2, batch_size: 16, seed: 99, pin_threads: off,\n"
      "        log_every_s: 0.5}\n"
      "optimizer: {type: momentum, lr: 0.1, momentum: 0.5, nesterov: true, beta1: 0.8, beta2: 0.95,\n"
      "            epsilon: 1e-6, schedule: cosine, final_lr: 0.01}\n"
      "ps: {shards: 2, update: hogwild, job_name: my-job_1}\n"
      "bench: {warmup_steps: 0, steps: 7, peak_seconds: 0.25}\n"
      "topology: {synthetic: 'pack:2 core:4'}\n";
  absl::StatusOr<Config> c = LoadConfigFromString(yaml, "all.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.input_dim, 6);
  ASSERT_EQ(c->model.layers.size(), 2u);
  EXPECT_EQ(c->model.layers[0].units, 5);
  EXPECT_EQ(c->model.layers[0].activation, Activation::kRelu);
  EXPECT_EQ(c->model.layers[1].activation, Activation::kNone);
  EXPECT_EQ(c->data.test, "te");
  EXPECT_EQ(c->data.max_train_records, 100);
  EXPECT_EQ(c->data.max_test_records, 50);
  EXPECT_EQ(c->train.workers, 3);
  EXPECT_EQ(c->train.intra_op_threads, 0);
  EXPECT_EQ(c->train.epochs, 2);
  EXPECT_EQ(c->train.batch_size, 16);
  EXPECT_EQ(c->train.seed, 99u);
  EXPECT_FALSE(c->train.pin_threads);
  EXPECT_EQ(c->train.log_every_s, 0.5);
  EXPECT_EQ(c->optimizer.type, OptimizerType::kMomentum);
  EXPECT_FLOAT_EQ(c->optimizer.lr, 0.1f);
  EXPECT_FLOAT_EQ(c->optimizer.momentum, 0.5f);
  EXPECT_TRUE(c->optimizer.nesterov);
  EXPECT_FLOAT_EQ(c->optimizer.beta1, 0.8f);
  EXPECT_FLOAT_EQ(c->optimizer.beta2, 0.95f);
  EXPECT_FLOAT_EQ(c->optimizer.epsilon, 1e-6f);
  EXPECT_EQ(c->optimizer.schedule, LrSchedule::kCosine);
  EXPECT_FLOAT_EQ(c->optimizer.final_lr, 0.01f);
  EXPECT_EQ(c->ps.shards, 2);
  EXPECT_EQ(c->ps.job_name, "my-job_1");
  EXPECT_EQ(c->bench.warmup_steps, 0);
  EXPECT_EQ(c->bench.steps, 7);
  EXPECT_EQ(c->bench.peak_seconds, 0.25);
  EXPECT_EQ(c->topology.synthetic, "pack:2 core:4");
}

TEST(ShippedConfigTest, FashionMnistMlpLoads) {
  const std::string path = SHARDWILD_SOURCE_DIR "/configs/fashion_mnist_mlp.yaml";
  absl::StatusOr<Config> c = LoadConfig(path);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->model.layers.size(), 3u);
  EXPECT_EQ(c->model.layers[0].units, 256);
  EXPECT_EQ(c->model.layers[0].activation, Activation::kRelu);
  EXPECT_EQ(c->model.layers[1].units, 128);
  EXPECT_EQ(c->model.layers[1].activation, Activation::kRelu);
  EXPECT_EQ(c->model.layers[2].units, 10);
  EXPECT_EQ(c->model.layers[2].activation, Activation::kNone);
  EXPECT_FALSE(c->data.train.empty());
  EXPECT_EQ(c->train.workers, 2);
  EXPECT_EQ(c->optimizer.type, OptimizerType::kAdam);
  EXPECT_EQ(c->optimizer.schedule, LrSchedule::kCosine);
  EXPECT_EQ(c->ps.shards, 0);  // auto
  EXPECT_TRUE(c->Validate().ok());
}

// Every config under configs/ loads and validates as shipped (a typo in any
// of them, a key moved or a section added, is one clear error here rather
// than a user's first run), with its bench section read: the configs whose
// step is tens of microseconds time 20000 steps, not the defaults' 200.
TEST(ShippedConfigTest, EveryShippedConfigLoadsAndValidates) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(SHARDWILD_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    absl::StatusOr<Config> c = LoadConfig(entry.path().string());
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->Validate().ok()) << entry.path() << ": " << c->Validate();
    const std::string name = entry.path().filename().string();
    if (name == "sparse_logreg.yaml" || name == "text_bow.yaml") {
      EXPECT_EQ(c->bench.warmup_steps, 200) << name;
      EXPECT_EQ(c->bench.steps, 20000) << name;
    }
  }
  EXPECT_EQ(count, 5);  // fashion_mnist_mlp, ctr_dlrm, ctr_wide_deep, sparse_logreg, text_bow
}

TEST(ConfigStringTest, EmptyDocumentFailsValidation) {
  // An empty file has no layers and no data: validation names the first missing key.
  absl::StatusOr<Config> c = LoadConfigFromString("", "empty.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"empty.yaml", "model.layers"}));
}

// ------------------------------------------------------------- errors

TEST_F(ConfigTest, UnknownKeyNamesFileLineAndKey) {
  const std::string path = Write("typo.yaml", WithTrainLine("train: {wokers: 2}"));
  absl::StatusOr<Config> c = LoadConfig(path);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {path + ":8:", "unknown key 'train.wokers'", "workers"}));
  // Column of the key: "train: {" is 8 characters.
  EXPECT_TRUE(MessageContains(c.status(), {path + ":8:9:"}));
}

TEST(ConfigStringTest, UnknownTopLevelAndNestedKeys) {
  absl::StatusOr<Config> c = LoadConfigFromString(std::string(kMinimal) + "trian: {epochs: 2}\n", "t.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"t.yaml:6:", "unknown key 'trian'"}));
  c = LoadConfigFromString(
      "model:\n"
      "  layers:\n"
      "    - {units: 10, actvation: relu}\n"
      "data: {train: x}\n",
      "l.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"l.yaml:3:", "unknown key 'model.layers[0].actvation'"}));
}

TEST(ConfigStringTest, WrongTypeNamesKeyExpectationValueAndLine) {
  absl::StatusOr<Config> c = LoadConfigFromString(WithTrainLine("train: {epochs: ten}"), "w.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"w.yaml:8:", "train.epochs", "expected an integer", "'ten'"}));

  c = LoadConfigFromString(WithTrainLine("train: {pin_threads: maybe}"), "w.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"w.yaml:8:", "train.pin_threads", "true or false", "'maybe'"}));

  c = LoadConfigFromString(WithTrainLine("train: {log_every_s: [1]}"), "w.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"w.yaml:8:", "train.log_every_s", "expected a number", "a list"}));

  c = LoadConfigFromString(WithTrainLine("train: {workers: -2}"), "w.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"w.yaml:8:", "train.workers", "'auto'", "'-2'"}));

  c = LoadConfigFromString(WithTrainLine("train: {seed: -1}"), "w.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"w.yaml:8:", "train.seed", "non-negative integer", "'-1'"}));

  c = LoadConfigFromString(WithTrainLine("train: 5"), "w.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"w.yaml:8:", "train", "expected a mapping", "'5'"}));
}

TEST(ConfigStringTest, EnumErrorListsChoices) {
  absl::StatusOr<Config> c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {type: adamw}\n", "e.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"e.yaml:6:", "optimizer.type", "sgd", "momentum", "adam", "'adamw'"}));

  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {schedule: exponential}\n", "e.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"optimizer.schedule", "constant", "cosine", "step", "'exponential'"}));

  c = LoadConfigFromString(
      "model:\n"
      "  layers: [{units: 10, activation: gelu}]\n"
      "data: {train: x}\n",
      "e.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"e.yaml:2:", "model.layers[0].activation", "none", "relu", "sigmoid", "tanh", "'gelu'"}));
}

// model.precision: f32 by default, bf16 from the file or --set, anything
// else one line naming the key and the choices.
TEST(ConfigStringTest, ModelPrecision) {
  const std::string yaml = WithTrainLine("train: {workers: 1}");
  absl::StatusOr<Config> c = LoadConfigFromString(yaml, "p.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.precision, Precision::kF32);
  c = LoadConfigFromString(yaml, "p.yaml", Sets({"model.precision=bf16"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.precision, Precision::kBf16);
  EXPECT_STREQ(PrecisionName(c->model.precision), "bf16");
  c = LoadConfigFromString(yaml, "p.yaml", Sets({"model.precision=fp16"}));
  EXPECT_TRUE(MessageContains(c.status(), {"model.precision", "f32", "bf16", "'fp16'"})) << c.status();
}

TEST_F(ConfigTest, MissingFileIsNotFound) {
  const std::string path = dir_ + "/does_not_exist.yaml";
  absl::StatusOr<Config> c = LoadConfig(path);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageContains(c.status(), {path}));
}

TEST_F(ConfigTest, InvalidYamlNamesLine) {
  const std::string path = Write("bad.yaml",
                                 "model:\n"
                                 "  layers: [{units: 10}]\n"
                                 "data: {train: x\n"
                                 "train: {epochs: 1}\n");
  absl::StatusOr<Config> c = LoadConfig(path);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {path + ":", "invalid YAML"}));
  // The flow mapping opened on line 3 is broken by line 4.
  const bool names_line = c.status().message().find(path + ":3:") != absl::string_view::npos ||
                          c.status().message().find(path + ":4:") != absl::string_view::npos;
  EXPECT_TRUE(names_line) << c.status();

  c = LoadConfigFromString("model:\n  layers: [\n  - \"unterminated\n", "q.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"q.yaml:", "invalid YAML"}));
}

TEST(ConfigStringTest, ValidationErrorNamesKey) {
  absl::StatusOr<Config> c = LoadConfigFromString(WithTrainLine("train: {batch_size: 0}"), "v.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"v.yaml", "train.batch_size", "got 0"}));

  c = LoadConfigFromString(
      "model:\n"
      "  layers: [{units: 10, activation: relu}]\n"
      "data: {train: x}\n",
      "v.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"model.layers[0].activation"}));

  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {lr: 0.1, final_lr: 0.5}\n", "v.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"optimizer.final_lr"}));

  c = LoadConfigFromString("model: {layers: [{units: 3}]}\n", "v.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"data.train", "required"}));
}

// ------------------------------------------------------------- ps.partitioner

TEST(ConfigPartitionerTest, DefaultsAreFixedShardsOverEveryShard) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "p.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ps.partitioner.kind, PartitionerOptions::Kind::kFixedShards);
  EXPECT_EQ(c->ps.partitioner.min_shard_bytes, 256 << 10);  // TF's MinSizePartitioner default
  EXPECT_EQ(c->ps.partitioner.max_shard_bytes, 0);
  EXPECT_EQ(c->ps.partitioner.max_shards, 0);
}

TEST(ConfigPartitionerTest, EveryKeyIsRead) {
  absl::StatusOr<Config> c = LoadConfigFromString(
      std::string(kMinimal) +
          "ps:\n"
          "  shards: 4\n"
          "  partitioner: {type: min_size, min_shard_bytes: 1024, max_shard_bytes: 8192, max_shards: 3}\n",
      "p.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ps.shards, 4);
  EXPECT_EQ(c->ps.partitioner.kind, PartitionerOptions::Kind::kMinSize);
  EXPECT_EQ(c->ps.partitioner.min_shard_bytes, 1024);
  EXPECT_EQ(c->ps.partitioner.max_shard_bytes, 8192);
  EXPECT_EQ(c->ps.partitioner.max_shards, 3);

  c = LoadConfigFromString(std::string(kMinimal) + "ps: {partitioner: {type: max_size, max_shard_bytes: 65536}}\n",
                           "p.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ps.partitioner.kind, PartitionerOptions::Kind::kMaxSize);
  EXPECT_EQ(c->ps.partitioner.max_shard_bytes, 65536);

  c = LoadConfigFromString(std::string(kMinimal) + "ps: {partitioner: {type: fixed_shards, max_shards: 2}}\n", "p.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ps.partitioner.kind, PartitionerOptions::Kind::kFixedShards);
  EXPECT_EQ(c->ps.partitioner.max_shards, 2);

  c = LoadConfigFromString(kMinimal, "p.yaml",
                           Sets({"ps.partitioner.type=max_size", "ps.partitioner.max_shard_bytes=4096"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ps.partitioner.kind, PartitionerOptions::Kind::kMaxSize);
  EXPECT_EQ(c->ps.partitioner.max_shard_bytes, 4096);
}

TEST(ConfigPartitionerTest, ErrorsNameTheKey) {
  const std::string base = std::string(kMinimal) + "ps:\n  partitioner: ";
  absl::StatusOr<Config> c = LoadConfigFromString(base + "{type: variable_axis}\n", "p.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"p.yaml:7:", "ps.partitioner.type", "fixed_shards", "min_size", "max_size",
                                           "'variable_axis'"}));

  c = LoadConfigFromString(base + "{type: max_size}\n", "p.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"p.yaml", "ps.partitioner.max_shard_bytes", "max_size"}));

  c = LoadConfigFromString(base + "{type: min_size, min_shard_bytes: 0}\n", "p.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"ps.partitioner.min_shard_bytes", "got 0"}));

  c = LoadConfigFromString(base + "{max_shards: -1}\n", "p.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"ps.partitioner.max_shards", "got -1"}));

  c = LoadConfigFromString(base + "{max_shard_bytes: -5}\n", "p.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"ps.partitioner.max_shard_bytes", "got -5"}));

  c = LoadConfigFromString(base + "{min_shard_bytes: lots}\n", "p.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"p.yaml:7:", "ps.partitioner.min_shard_bytes", "expected an integer"}));

  c = LoadConfigFromString(base + "{max_shard: 2}\n", "p.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"p.yaml:7:", "unknown key 'ps.partitioner.max_shard'", "max_shards"}));

  c = LoadConfigFromString(base + "min_size\n", "p.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"p.yaml:7:", "ps.partitioner", "expected a mapping"}));
}

// ps.memory_kind: auto by default; shared and private read; anything else
// names the key, the line and the choices; private cannot serve worker
// processes, which attach to the store.
TEST(ConfigStoreMemoryTest, ReadsChecksAndRefusesWorkerProcesses) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "m.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ps.memory_kind, StoreMemoryKind::kAuto);
  c = LoadConfigFromString(kMinimal, "m.yaml", Sets({"ps.memory_kind=private"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ps.memory_kind, StoreMemoryKind::kPrivate);
  c = LoadConfigFromString(std::string(kMinimal) + "ps:\n  memory_kind: shared\n", "m.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ps.memory_kind, StoreMemoryKind::kShared);
  EXPECT_STREQ(StoreMemoryKindName(c->ps.memory_kind), "shared");
  c = LoadConfigFromString(std::string(kMinimal) + "ps:\n  memory_kind: anonymous\n", "m.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"m.yaml:7:", "ps.memory_kind", "auto", "shared", "private", "'anonymous'"}))
      << c.status();
  c = LoadConfigFromString(kMinimal, "m.yaml", Sets({"ps.memory_kind=private", "train.worker_processes=true"}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"ps.memory_kind", "train.worker_processes", "shared or auto"}))
      << c.status();
  c = LoadConfigFromString(kMinimal, "m.yaml", Sets({"ps.memory_kind=auto", "train.worker_processes=true"}));
  EXPECT_TRUE(c.ok()) << c.status();
}

TEST(ConfigPartitionerTest, ValidateNamesTheKey) {
  PartitionerOptions p;
  EXPECT_TRUE(p.Validate().ok());
  p.kind = PartitionerOptions::Kind::kMaxSize;
  EXPECT_TRUE(MessageContains(p.Validate(), {"ps.partitioner.max_shard_bytes"}));
  p.max_shard_bytes = 1;
  EXPECT_TRUE(p.Validate().ok());
  p.max_shards = 4097;
  EXPECT_TRUE(MessageContains(p.Validate(), {"ps.partitioner.max_shards"}));
  // StoreOptions::Validate covers its partitioner.
  StoreOptions s;
  s.partitioner.min_shard_bytes = 0;
  EXPECT_TRUE(MessageContains(s.Validate(), {"ps.partitioner.min_shard_bytes"}));
}

TEST(ConfigStringTest, AdagradRmspropFtrlTypesAndKeys) {
  for (OptimizerType type : {OptimizerType::kAdagrad, OptimizerType::kRmsprop, OptimizerType::kFtrl}) {
    const std::string name = OptimizerTypeName(type);
    absl::StatusOr<Config> c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {type: " + name + "}\n", "n.yaml");
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_EQ(c->optimizer.type, type) << name;
    // Defaults: TF's accumulator start and Keras' rho; no regularisation.
    EXPECT_FLOAT_EQ(c->optimizer.initial_accumulator_value, 0.1f);
    EXPECT_FLOAT_EQ(c->optimizer.rho, 0.9f);
    EXPECT_EQ(c->optimizer.l1, 0.0f);
    EXPECT_EQ(c->optimizer.l2, 0.0f);
  }

  absl::StatusOr<Config> c = LoadConfigFromString(
      std::string(kMinimal) + "optimizer: {type: ftrl, initial_accumulator_value: 0.5, rho: 0.7, l1: 0.01, l2: 0.02}\n",
      "n.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->optimizer.initial_accumulator_value, 0.5f);
  EXPECT_FLOAT_EQ(c->optimizer.rho, 0.7f);
  EXPECT_FLOAT_EQ(c->optimizer.l1, 0.01f);
  EXPECT_FLOAT_EQ(c->optimizer.l2, 0.02f);

  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {type: ftrl}\n", "n.yaml", Sets({"optimizer.l1=0.3"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->optimizer.l1, 0.3f);

  // Bad values name the key; a wrong type names the key and the line.
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {type: rmsprop, rho: 1}\n", "n.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"optimizer.rho"}));
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {l2: -1}\n", "n.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"optimizer.l2"}));
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {type: ftrl, initial_accumulator_value: 0}\n", "n.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"optimizer.initial_accumulator_value", "ftrl"}));
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {l1: lots}\n", "n.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"n.yaml:6:", "optimizer.l1", "expected a number", "'lots'"}));
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {type: adamw}\n", "n.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"optimizer.type", "adagrad", "rmsprop", "ftrl"}));
}

// ------------------------------------------------------------- --set

TEST(ParseOverrideTest, SplitsAtFirstEquals) {
  absl::StatusOr<ConfigOverride> o = ParseOverride("a=b");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->key, "a");
  EXPECT_EQ(o->value, "b");
  o = ParseOverride("data.train=/x=y");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->key, "data.train");
  EXPECT_EQ(o->value, "/x=y");
  o = ParseOverride("data.test=");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->value, "");
}

TEST(ParseOverrideTest, RejectsMissingEqualsOrKey) {
  absl::StatusOr<ConfigOverride> o = ParseOverride("novalue");
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(o.status(), {"novalue"}));
  o = ParseOverride("=3");
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigOverrideTest, OverridesChangeValues) {
  const std::string yaml = WithTrainLine("train: {workers: 4, epochs: 3}");
  absl::StatusOr<Config> c = LoadConfigFromString(
      yaml, "o.yaml", Sets({"train.workers=2", "optimizer.lr=0.01", "model.layers.0.units=7", "bench.steps=9"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.workers, 2);
  EXPECT_EQ(c->train.epochs, 3);  // untouched
  EXPECT_FLOAT_EQ(c->optimizer.lr, 0.01f);
  EXPECT_EQ(c->optimizer.type, OptimizerType::kSgd);  // untouched sibling
  ASSERT_EQ(c->model.layers.size(), 1u);
  EXPECT_EQ(c->model.layers[0].units, 7);
  EXPECT_EQ(c->bench.steps, 9);  // a section absent from the file

  c = LoadConfigFromString(yaml, "o.yaml", Sets({"train.workers=auto"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.workers, 0);

  // Applied in order: the last one wins.
  c = LoadConfigFromString(yaml, "o.yaml", Sets({"train.workers=5", "train.workers=6"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.workers, 6);

  // A whole list as a YAML value.
  c = LoadConfigFromString(yaml, "o.yaml",
                           Sets({"model.layers=[{units: 8, activation: relu}, {units: 2}]"}));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->model.layers.size(), 2u);
  EXPECT_EQ(c->model.layers[0].units, 8);
  EXPECT_EQ(c->model.layers[0].activation, Activation::kRelu);
  EXPECT_EQ(c->model.layers[1].units, 2);
}

TEST_F(ConfigTest, OverridesApplyToFiles) {
  const std::string path = Write("f.yaml", kMinimal);
  absl::StatusOr<Config> c = LoadConfig(path, Sets({"train.epochs=4", "data.train=/elsewhere"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.epochs, 4);
  EXPECT_EQ(c->data.train, "/elsewhere");
  // An override can also fix what the file lacks.
  const std::string no_data = Write("g.yaml", "model: {layers: [{units: 3}]}\n");
  c = LoadConfig(no_data, Sets({"data.train=/d"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.train, "/d");
}

TEST(ConfigOverrideTest, BadValueNamesTheSetFlag) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "o.yaml", Sets({"train.epochs=abc"}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"--set train.epochs=abc", "train.epochs", "expected an integer"}));

  c = LoadConfigFromString(kMinimal, "o.yaml", Sets({"model.layers.0.activation=swish"}));
  EXPECT_TRUE(MessageContains(c.status(), {"--set model.layers.0.activation=swish", "'swish'"}));
}

TEST(ConfigOverrideTest, UnknownKeyIsAnError) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "o.yaml", Sets({"train.wokers=2"}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"--set train.wokers=2", "unknown key 'train.wokers'"}));

  c = LoadConfigFromString(kMinimal, "o.yaml", Sets({"trian.epochs=2"}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"unknown key 'trian'"}));
}

TEST(ConfigOverrideTest, ListIndexOutOfRange) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "o.yaml", Sets({"model.layers.3.units=7"}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"model.layers.3.units", "out of range", "1 item"}));
}

TEST(ConfigOverrideTest, PathThroughScalarIsAnError) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "o.yaml", Sets({"data.train.x=1"}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"data.train.x", "'train' is not a mapping"}));

  c = LoadConfigFromString(kMinimal, "o.yaml", Sets({"train..epochs=1"}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(c.status(), {"train..epochs", "empty key segment"}));
}

TEST(UpdateOptionsConfigTest, UpdateModesPullEveryAndStaleness) {
  absl::StatusOr<Config> c = LoadConfigFromString(
      "model: {layers: [{type: dense, units: 3}]}\n"
      "data: {train: tr}\n"
      "train: {pull_every: 4}\n"
      "ps: {update: row_lock, max_staleness: 7}\n",
      "upd.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ps.update, UpdateMode::kRowLock);
  EXPECT_EQ(c->train.pull_every, 4);
  EXPECT_EQ(c->ps.max_staleness, 7);
  EXPECT_STREQ(UpdateModeName(UpdateMode::kHogwild), "hogwild");
  EXPECT_STREQ(UpdateModeName(UpdateMode::kRowLock), "row_lock");
  EXPECT_STREQ(UpdateModeName(UpdateMode::kSync), "sync");
  // Defaults: pull every step, no staleness bound.
  EXPECT_EQ(TrainOptions{}.pull_every, 1);
  EXPECT_EQ(StoreOptions{}.max_staleness, 0);

  c = LoadConfigFromString("model: {layers: [{type: dense, units: 3}]}\ndata: {train: tr}\nps: {update: sync}\n", "s.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ps.update, UpdateMode::kSync);

  c = LoadConfigFromString("model: {layers: [{type: dense, units: 3}]}\ndata: {train: tr}\nps: {update: locked}\n", "b.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("hogwild, row_lock, sync"), absl::string_view::npos) << c.status();

  c = LoadConfigFromString("model: {layers: [{type: dense, units: 3}]}\ndata: {train: tr}\ntrain: {pull_every: 0}\n", "b.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("train.pull_every"), absl::string_view::npos) << c.status();

  c = LoadConfigFromString("model: {layers: [{type: dense, units: 3}]}\ndata: {train: tr}\nps: {max_staleness: -1}\n", "b.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("ps.max_staleness"), absl::string_view::npos) << c.status();
}

TEST(UpdateOptionsConfigTest, HotRows) {
  absl::StatusOr<Config> c = LoadConfigFromString(
      "model: {layers: [{type: dense, units: 3}]}\ndata: {train: tr}\nps: {hot_rows: 256, hot_rows_merge_every: 5}\n",
      "hot.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ps.hot_rows, 256);
  EXPECT_EQ(c->ps.hot_rows_merge_every, 5);
  // Defaults: none, merged every 32 steps when there are.
  EXPECT_EQ(StoreOptions{}.hot_rows, 0);
  EXPECT_EQ(StoreOptions{}.hot_rows_merge_every, 32);
  for (const char* bad : {"ps: {hot_rows: -1}\n", "ps: {hot_rows: 16777217}\n", "ps: {hot_rows_merge_every: 0}\n",
                          "ps: {hot_rows: many}\n"}) {
    c = LoadConfigFromString(std::string("model: {layers: [{type: dense, units: 3}]}\ndata: {train: tr}\n") + bad,
                             "b.yaml");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find(std::string(bad).find("merge") != std::string::npos ? "ps.hot_rows_merge_every"
                                                                                            : "ps.hot_rows"),
              absl::string_view::npos)
        << c.status();
  }
}

}  // namespace
}  // namespace shardwild

namespace shardwild {
namespace {

TEST(SparseOptimizerConfigTest, NestedSectionAndItsErrors) {
  absl::StatusOr<Config> c = LoadConfigFromString(
      std::string(kMinimal) + "optimizer: {type: adam, lr: 0.001, sparse: {type: adagrad, lr: 0.05}}\n", "s.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer.type, OptimizerType::kAdam);
  EXPECT_FLOAT_EQ(c->optimizer.lr, 0.001f);
  ASSERT_TRUE(c->sparse_optimizer.has_value());
  EXPECT_EQ(c->sparse_optimizer->type, OptimizerType::kAdagrad);
  EXPECT_FLOAT_EQ(c->sparse_optimizer->lr, 0.05f);

  absl::StatusOr<Config> none = LoadConfigFromString(kMinimal, "n.yaml");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->sparse_optimizer.has_value());

  absl::StatusOr<Config> bad = LoadConfigFromString(std::string(kMinimal) + "optimizer: {sparse: {momentum: 2}}\n", "b.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("optimizer.sparse.momentum"), std::string::npos) << bad.status();
  absl::StatusOr<Config> typo = LoadConfigFromString(std::string(kMinimal) + "optimizer: {sparse: {lrr: 1}}\n", "t.yaml");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(std::string(typo.status().message()).find("optimizer.sparse.lrr"), std::string::npos) << typo.status();
}


// ------------------------------------------------- store specs (StoreSpec)

TEST(StoreSpecTest, ReadsEveryPart) {
  absl::StatusOr<StoreSpec> spec = LoadStoreSpecFromString(
      "variables:\n"
      "  w: [784, 10]\n"
      "  b: [10]\n"
      "  k: {shape: [4, 3], init: glorot_uniform}\n"
      "tables:\n"
      "  - {name: emb, rows: 100000, dim: 16, kind: static}\n"
      "  - {name: ids, rows: 1000, dim: 8, kind: dynamic, on_full: evict_lru, init_scale: 0.5, dtype: bf16}\n"
      "optimizer: {type: sgd, lr: 0.1, sparse: {type: adagrad, lr: 0.05, initial_accumulator_value: 0.2}}\n"
      "ps: {shards: 2, update: row_lock, job_name: mystore, stale_segments: fail, huge_pages: off,\n"
      "     partitioner: {type: min_size, min_shard_bytes: 4096}}\n"
      "seed: 7\n",
      "s.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->variables.size(), 3u);
  EXPECT_EQ(spec->variables[0].name, "w");
  EXPECT_EQ(spec->variables[0].shape, (std::vector<int64_t>{784, 10}));
  EXPECT_EQ(spec->variables[0].init, StoreVariableInit::kZeros);
  EXPECT_EQ(spec->variables[1].name, "b");
  EXPECT_EQ(spec->variables[1].shape, (std::vector<int64_t>{10}));
  EXPECT_EQ(spec->variables[2].shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(spec->variables[2].init, StoreVariableInit::kGlorotUniform);
  ASSERT_EQ(spec->tables.size(), 2u);
  EXPECT_EQ(spec->tables[0].name, "emb");
  EXPECT_EQ(spec->tables[0].rows, 100000);
  EXPECT_EQ(spec->tables[0].dim, 16);
  EXPECT_FALSE(spec->tables[0].dynamic);
  EXPECT_TRUE(spec->tables[1].dynamic);
  EXPECT_TRUE(spec->tables[1].evict_lru);
  EXPECT_TRUE(spec->tables[1].bf16);
  EXPECT_FLOAT_EQ(spec->tables[1].init_scale, 0.5f);
  EXPECT_EQ(spec->optimizer.type, OptimizerType::kSgd);
  EXPECT_FLOAT_EQ(spec->optimizer.lr, 0.1f);
  ASSERT_TRUE(spec->sparse_optimizer.has_value());
  EXPECT_EQ(spec->sparse_optimizer->type, OptimizerType::kAdagrad);
  EXPECT_FLOAT_EQ(spec->sparse_optimizer->initial_accumulator_value, 0.2f);
  EXPECT_EQ(spec->ps.shards, 2);
  EXPECT_EQ(spec->ps.update, UpdateMode::kRowLock);
  EXPECT_EQ(spec->ps.job_name, "mystore");
  EXPECT_EQ(spec->ps.stale_segments, StaleSegmentPolicy::kFail);
  EXPECT_EQ(spec->ps.huge_pages, HugePagePolicy::kOff);
  EXPECT_EQ(spec->ps.partitioner.kind, PartitionerOptions::Kind::kMinSize);
  EXPECT_EQ(spec->ps.partitioner.min_shard_bytes, 4096);
  EXPECT_EQ(spec->seed, 7u);
}

TEST(StoreSpecTest, DefaultsAreTheConfigsAndJsonIsRead) {
  // JSON (what the Python API hands over) is YAML too.
  absl::StatusOr<StoreSpec> spec =
      LoadStoreSpecFromString(R"({"tables": [{"name": "e", "rows": 10, "dim": 4}]})", "layout", false);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const Config defaults;
  EXPECT_TRUE(spec->variables.empty());
  EXPECT_EQ(spec->optimizer.type, defaults.optimizer.type);
  EXPECT_FLOAT_EQ(spec->optimizer.lr, defaults.optimizer.lr);
  EXPECT_FALSE(spec->sparse_optimizer.has_value());
  EXPECT_EQ(spec->ps.shards, defaults.ps.shards);
  EXPECT_EQ(spec->ps.update, defaults.ps.update);
  EXPECT_EQ(spec->ps.job_name, defaults.ps.job_name);
  EXPECT_EQ(spec->seed, 1u);
}

TEST(StoreSpecTest, ErrorsNameTheKey) {
  // {layout, exact message} with positions off (a Python dict's JSON).
  const std::pair<const char*, const char*> cases[] = {
      {R"({"variables": {"w": [2, 2]}, "optimzer": {}})",
       "layout: unknown key 'optimzer' (expected one of: seed, optimizer, ps, tables, variables)"},
      {R"({"variables": {"w": [2, 2]}, "ps": {"replication": "per_node"}})",
       "layout: unknown key 'ps.replication' (expected one of: huge_pages, job_name, shards, stale_segments, update, "
       "partitioner)"},
      {R"({"variables": {"w": [2, 2]}, "optimizer": {"schedule": "cosine"}})", "layout: unknown key 'optimizer.schedule' (expected one of: beta1, beta2, epsilon, initial_accumulator_value, "
       "l1, l2, lr, momentum, nesterov, rho, type, sparse)"},
      {R"({"variables": {"w": [2, 2]}, "optimizer": {"sparse": {"warmup_epochs": 1}}})",
       "layout: unknown key 'optimizer.sparse.warmup_epochs' (expected one of: beta1, beta2, epsilon, "
       "initial_accumulator_value, l1, l2, lr, momentum, nesterov, rho, type)"},
      {R"({"variables": {"w": [2, 0]}})", "layout: variables.w: expected a shape: a list of 1 or 2 integers >= 1, got '0' in it"},
      {R"({"variables": {"w": [2, 3, 4]}})", "layout: variables.w: expected a shape: a list of 1 or 2 integers >= 1, got a list of 3"},
      {R"({"variables": {"w": 5}})", "layout: variables.w: expected a shape: a list of 1 or 2 integers >= 1, got '5'"},
      {R"({"variables": {"w": {"init": "zeros"}}})", "layout: variables.w.shape: is required"},
      {R"({"variables": {"w": {"shape": [2], "init": "ones"}}})",
       "layout: variables.w.init: expected one of zeros, glorot_uniform; got 'ones'"},
      {R"({"variables": {"w": {"shape": [2], "dtype": "f32"}}})",
       "layout: unknown key 'variables.w.dtype' (expected one of: init, shape)"},
      {R"({"variables": [1, 2]})", "layout: variables: expected a mapping of variable names to shapes, got a list"},
      {R"({"tables": [{"name": "e", "rows": 10, "dim": "x"}]})", "layout: tables[0].dim: expected an integer, got 'x'"},
      {R"({"tables": [{"name": "e", "rows": 10, "dim": 0}]})", "layout: tables[0] (e).dim: must be >= 1, got 0"},
      {R"({"tables": [{"rows": 10, "dim": 2}]})", "layout: tables[0].name: is required"},
      {R"({"tables": [{"name": "e", "rows": 10, "dim": 2, "knd": "static"}]})", "layout: unknown key 'tables[0].knd' (expected one of: dim, init_scale, name, rows, dtype, kind, "
       "on_full)"},
      {R"({"tables": [{"name": "e", "rows": 1, "dim": 2}, {"name": "e", "rows": 1, "dim": 2}]})",
       "layout: tables[1] (e).name: table 'e' is defined twice"},
      {R"({"variables": {"w": [2]}, "optimizer": {"type": "lamb"}})",
       "layout: optimizer.type: expected one of sgd, momentum, adam, adagrad, rmsprop, ftrl; got 'lamb'"},
      {R"({"variables": {"w": [2]}, "optimizer": {"lr": -1}})", "layout: optimizer.lr: must be a finite number > 0, got -1"},
      {R"({"variables": {"w": [2]}, "optimizer": {"sparse": {"rho": 2}}})",
       "layout: optimizer.sparse.rho: must be in [0, 1), got 2"},
      {R"({"variables": {"w": [2]}, "ps": {"shards": 0}})", "layout: ps.shards: expected a positive integer or 'auto', got '0'"},
      {R"({"variables": {"w": [2]}, "ps": {"job_name": "a/b"}})",
       "layout: ps.job_name: may hold only letters, digits, '_' and '-'"},
      {R"({"variables": {"w": [2]}, "ps": {"update": "sync"}})",
       "layout: ps.update: sync averages the gradients of a training job's workers in lock-step; a store on its own "
       "takes hogwild or row_lock"},
      {R"({"variables": {"w": [2]}, "seed": -1})", "layout: seed: expected a non-negative integer, got '-1'"},
      {R"({"optimizer": {"type": "sgd"}})",
       "layout: a store needs at least one variable (variables) or embedding table (tables)"},
      {R"([1, 2])", "layout: expected a mapping of variables, tables, optimizer, ps and seed, got a list"},
  };
  for (const auto& [layout, message] : cases) {
    absl::StatusOr<StoreSpec> spec = LoadStoreSpecFromString(layout, "layout", /*positions=*/false);
    ASSERT_FALSE(spec.ok()) << layout;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << layout;
    EXPECT_EQ(std::string(spec.status().message()), message) << layout;
    EXPECT_EQ(ErrorKindOf(spec.status()), ErrorKind::kConfig) << layout;
  }
}

TEST(StoreSpecTest, PositionsNameLineAndColumn) {
  absl::StatusOr<StoreSpec> spec = LoadStoreSpecFromString("variables:\n  w: [2, 2]\ntables:\n  - {name: e, rows: x}\n", "s.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(std::string(spec.status().message()), "s.yaml:4:21: tables[0].rows: expected an integer, got 'x'");
  spec = LoadStoreSpecFromString("variables: {w: [1]}\nps: {shard: 2}\n", "s.yaml");
  EXPECT_TRUE(MessageContains(spec.status(), {"s.yaml:2:6: unknown key 'ps.shard'"})) << spec.status();
  spec = LoadStoreSpecFromString("variables: [\n", "s.yaml");
  EXPECT_TRUE(MessageContains(spec.status(), {"s.yaml:", "invalid YAML"})) << spec.status();
}

TEST(StoreSpecTest, OptimizersOnTheirOwn) {
  absl::StatusOr<StoreOptimizers> o =
      LoadStoreOptimizersFromString(R"({"type": "adagrad", "lr": 0.5, "sparse": {"type": "sgd"}})", "optimizer=", false);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->optimizer.type, OptimizerType::kAdagrad);
  EXPECT_FLOAT_EQ(o->optimizer.lr, 0.5f);
  ASSERT_TRUE(o->sparse_optimizer.has_value());
  EXPECT_EQ(o->sparse_optimizer->type, OptimizerType::kSgd);
  o = LoadStoreOptimizersFromString("{}", "optimizer=", false);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->sparse_optimizer.has_value());

  const std::pair<const char*, const char*> cases[] = {
      {R"({"typ": "sgd"})", "optimizer=: unknown key 'optimizer.typ'"},
      {R"({"decay_rate": 0.5})", "optimizer=: unknown key 'optimizer.decay_rate'"},
      {R"({"epsilon": 0})", "optimizer=: optimizer.epsilon: must be > 0"},
      {R"({"sparse": {"lr": 0}})", "optimizer=: optimizer.sparse.lr: must be a finite number > 0, got 0"},
      {R"("sgd")", "optimizer=: optimizer: expected a mapping, got 'sgd'"},
  };
  for (const auto& [text, message] : cases) {
    o = LoadStoreOptimizersFromString(text, "optimizer=", false);
    ASSERT_FALSE(o.ok()) << text;
    EXPECT_EQ(std::string(o.status().message()).substr(0, std::string(message).size()), message) << o.status();
    EXPECT_EQ(ErrorKindOf(o.status()), ErrorKind::kConfig) << text;
  }
}

// ------------------------------------------------- learning-rate schedules

TEST(ConfigScheduleTest, ReadsStepAndWarmupKeys) {
  absl::StatusOr<Config> c = LoadConfigFromString(
      std::string(kMinimal) +
          "optimizer: {lr: 0.1, schedule: step, decay_rate: 0.5, decay_every: 0.25, warmup: 0.1,\n"
          "            warmup_start_lr: 0.001}\n",
      "s.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer.schedule, LrSchedule::kStep);
  EXPECT_FLOAT_EQ(c->optimizer.decay_rate, 0.5f);
  EXPECT_EQ(c->optimizer.decay_every, 0.25);
  EXPECT_EQ(c->optimizer.warmup, 0.1);
  EXPECT_FLOAT_EQ(c->optimizer.warmup_start_lr, 0.001f);
  EXPECT_FALSE(c->sparse_optimizer.has_value());

  // Defaults.
  c = LoadConfigFromString(kMinimal, "d.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->optimizer.decay_rate, 0.1f);
  EXPECT_EQ(c->optimizer.decay_every, 0.0);
  EXPECT_EQ(c->optimizer.warmup, 0.0);
  EXPECT_EQ(c->optimizer.warmup_start_lr, 0.0f);
}

TEST(ConfigScheduleTest, LinearScheduleAndLossReductionAreRead) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "d.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer.loss_reduction, LossReduction::kSumOverBatchSize);

  c = LoadConfigFromString(std::string(kMinimal) +
                               "optimizer: {type: sgd, lr: 0.5, schedule: linear, loss_reduction: sum_over_batch_size,\n"
                               "            sparse: {type: sgd, lr: 0.5, schedule: linear, loss_reduction: sum}}\n",
                           "r.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer.schedule, LrSchedule::kLinear);
  EXPECT_EQ(c->optimizer.loss_reduction, LossReduction::kSumOverBatchSize);
  ASSERT_TRUE(c->sparse_optimizer.has_value());
  EXPECT_EQ(c->sparse_optimizer->schedule, LrSchedule::kLinear);
  EXPECT_EQ(c->sparse_optimizer->loss_reduction, LossReduction::kSum);
  EXPECT_FLOAT_EQ(c->sparse_optimizer->LrAt(0.5), 0.25f);

  c = LoadConfigFromString(kMinimal, "r.yaml", Sets({"optimizer.loss_reduction=sum"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer.loss_reduction, LossReduction::kSum);

  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {loss_reduction: mean}\n", "r.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"r.yaml:6:", "optimizer.loss_reduction", "sum_over_batch_size", "sum",
                                           "'mean'"}));
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {sparse: {loss_reduction: none}}\n", "r.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"optimizer.sparse.loss_reduction", "'none'"}));
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {schedule: polynomial}\n", "r.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"optimizer.schedule", "linear", "'polynomial'"}));
}

TEST(ConfigScheduleTest, EpochKeysBecomeFractionsOfTheRun) {
  absl::StatusOr<Config> c = LoadConfigFromString(
      std::string(kMinimal) +
          "optimizer: {schedule: step, decay_epochs: 3, warmup_epochs: 0.5,\n"
          "            sparse: {type: adagrad, schedule: cosine, warmup_epochs: 2}}\n"
          "train: {epochs: 10}\n",  // after the optimizer: order does not matter
      "e.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer.decay_every, 3.0 / 10);
  EXPECT_EQ(c->optimizer.warmup, 0.5 / 10);
  ASSERT_TRUE(c->sparse_optimizer.has_value());
  EXPECT_EQ(c->sparse_optimizer->warmup, 2.0 / 10);
  EXPECT_EQ(c->sparse_optimizer->decay_every, 0.0);
  // Periods count from the end of the warmup: the step lands 3 epochs after
  // it, at progress 0.05 + 0.3.
  EXPECT_FLOAT_EQ(c->optimizer.LrAt(0.34), c->optimizer.lr);
  EXPECT_FLOAT_EQ(c->optimizer.LrAt(0.35), c->optimizer.lr * 0.1f);

  // With --set, and against the overridden epoch count.
  c = LoadConfigFromString(kMinimal, "e.yaml",
                           Sets({"optimizer.schedule=step", "optimizer.decay_epochs=2", "train.epochs=4"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer.decay_every, 0.5);
  // All of the run is one period.
  c = LoadConfigFromString(std::string(kMinimal) + "train: {epochs: 4}\noptimizer: {schedule: step, decay_epochs: 4}\n",
                           "e.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer.decay_every, 1.0);
}

TEST(ConfigScheduleTest, EpochKeyErrorsNameKeyAndLine) {
  // Both forms of one setting.
  absl::StatusOr<Config> c = LoadConfigFromString(
      std::string(kMinimal) + "optimizer:\n  decay_every: 0.5\n  decay_epochs: 2\n", "b.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"b.yaml:8:", "optimizer.decay_epochs", "give either",
                                           "optimizer.decay_every", "not both"}));
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer:\n  sparse: {warmup_epochs: 1, warmup: 0.1}\n",
                           "b.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"b.yaml:7:", "optimizer.sparse.warmup_epochs", "optimizer.sparse.warmup,"}));
  // Out of range for train.epochs (default 10).
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer:\n  schedule: step\n  decay_epochs: 11\n", "r.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"r.yaml:8:", "optimizer.decay_epochs: must be in (0, train.epochs = 10], got 11"}));
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {schedule: step, decay_epochs: 0}\n", "r.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"r.yaml:6:", "optimizer.decay_epochs: must be in (0, train.epochs = 10], got 0"}));
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {warmup_epochs: 10}\n", "r.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"optimizer.warmup_epochs: must be in [0, train.epochs = 10), got 10"}));
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {warmup_epochs: -1}\n", "r.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"optimizer.warmup_epochs", "got -1"}));
  c = LoadConfigFromString(std::string(kMinimal) + "optimizer: {warmup_epochs: two}\n", "r.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"r.yaml:6:", "optimizer.warmup_epochs", "expected a number", "'two'"}));
  c = LoadConfigFromString(kMinimal, "r.yaml", Sets({"optimizer.decay_epochs=20"}));
  EXPECT_TRUE(MessageContains(c.status(), {"--set optimizer.decay_epochs=20", "optimizer.decay_epochs"}));
}

TEST(ConfigScheduleTest, ValidationErrorsNameTheKey) {
  const auto load = [](const std::string& optimizer) {
    return LoadConfigFromString(std::string(kMinimal) + "optimizer: " + optimizer + "\n", "v.yaml").status();
  };
  EXPECT_TRUE(MessageContains(load("{decay_rate: 2}"), {"v.yaml: optimizer.decay_rate: must be in (0, 1], got 2"}));
  EXPECT_TRUE(MessageContains(load("{decay_rate: 0}"), {"optimizer.decay_rate: must be in (0, 1], got 0"}));
  EXPECT_TRUE(MessageContains(load("{decay_every: 2}"), {"optimizer.decay_every: must be in (0, 1]", "got 2"}));
  EXPECT_TRUE(MessageContains(load("{schedule: step}"), {"optimizer.decay_every: is required with schedule step"}));
  EXPECT_TRUE(MessageContains(load("{warmup: 1}"), {"optimizer.warmup: must be in [0, 1)", "got 1"}));
  EXPECT_TRUE(MessageContains(load("{lr: 0.1, warmup_start_lr: 0.2}"),
                              {"optimizer.warmup_start_lr: must be in [0, lr], got 0.2"}));
  EXPECT_TRUE(MessageContains(load("{decay_rate: fast}"), {"v.yaml:6:", "optimizer.decay_rate", "expected a number"}));
  // The same keys under optimizer.sparse name optimizer.sparse.*.
  EXPECT_TRUE(MessageContains(load("{sparse: {decay_rate: 2}}"),
                              {"optimizer.sparse.decay_rate: must be in (0, 1], got 2"}));
  EXPECT_TRUE(MessageContains(load("{sparse: {schedule: step}}"), {"optimizer.sparse.decay_every: is required"}));
  EXPECT_TRUE(MessageContains(load("{sparse: {warmup: -0.5}}"), {"optimizer.sparse.warmup: must be in [0, 1)"}));
  EXPECT_TRUE(MessageContains(load("{sparse: {lr: 0.01, warmup_start_lr: 0.1}}"),
                              {"optimizer.sparse.warmup_start_lr: must be in [0, lr], got 0.1"}));
  absl::StatusOr<Config> ok = LoadConfigFromString(
      std::string(kMinimal) + "optimizer: {sparse: {schedule: step, decay_every: 0.5, decay_rate: 0.9}}\n", "v.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->sparse_optimizer->schedule, LrSchedule::kStep);
  EXPECT_FLOAT_EQ(ok->sparse_optimizer->decay_rate, 0.9f);
  EXPECT_EQ(ok->sparse_optimizer->decay_every, 0.5);
}

// ----------------------------------------------------------- early_stopping

TEST(ConfigEarlyStoppingTest, ReadsTheSection) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "d.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->early_stopping.enabled());
  EXPECT_EQ(c->early_stopping.mode, "auto");
  EXPECT_EQ(c->early_stopping.min_delta, 0.0);
  EXPECT_EQ(c->early_stopping.patience, 0);

  c = LoadConfigFromString(std::string(kMinimal) +
                               "  test: /data/test\n"
                               "early_stopping: {monitor: test_accuracy, mode: max, min_delta: 0.001, patience: 3}\n",
                           "e.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->early_stopping.enabled());
  EXPECT_EQ(c->early_stopping.monitor, "test_accuracy");
  EXPECT_EQ(c->early_stopping.mode, "max");
  EXPECT_EQ(c->early_stopping.min_delta, 0.001);
  EXPECT_EQ(c->early_stopping.patience, 3);

  // Train metrics need no test set.
  c = LoadConfigFromString(kMinimal, "e.yaml", Sets({"early_stopping.monitor=train_loss"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->early_stopping.maximize());
}

TEST(ConfigEarlyStoppingTest, ErrorsNameTheKey) {
  const auto load = [](const std::string& section) {
    return LoadConfigFromString(std::string(kMinimal) + "  test: /data/test\nearly_stopping: " + section + "\n",
                                "x.yaml")
        .status();
  };
  EXPECT_TRUE(MessageContains(load("{monitor: val_loss}"),
                              {"x.yaml: early_stopping.monitor: must be one of test_loss, test_accuracy, test_auc, "
                               "test_logloss, test_rmse, test_precision_at_5, train_loss, train_accuracy (or empty: "
                               "off), got 'val_loss'"}));
  EXPECT_TRUE(MessageContains(load("{monitor: test_loss, mode: lowest}"),
                              {"early_stopping.mode: must be min, max or auto, got 'lowest'"}));
  EXPECT_TRUE(MessageContains(load("{monitor: test_loss, min_delta: -1}"),
                              {"early_stopping.min_delta: must be a finite number >= 0, got -1"}));
  EXPECT_TRUE(MessageContains(load("{monitor: test_loss, patience: -2}"),
                              {"early_stopping.patience: must be >= 0, got -2"}));
  EXPECT_TRUE(MessageContains(load("{monitor: test_loss, patience: 1.5}"),
                              {"x.yaml:7:", "early_stopping.patience", "expected an integer", "'1.5'"}));
  EXPECT_TRUE(MessageContains(load("{monitor: test_loss, patients: 3}"),
                              {"x.yaml:7:", "unknown key 'early_stopping.patients'", "patience"}));
  EXPECT_TRUE(MessageContains(load("[test_loss]"), {"early_stopping", "expected a mapping"}));
  // A test metric without a test set.
  absl::StatusOr<Config> c =
      LoadConfigFromString(std::string(kMinimal) + "early_stopping: {monitor: test_loss}\n", "x.yaml");
  EXPECT_TRUE(MessageContains(c.status(), {"early_stopping.monitor", "'test_loss' needs a test set (data.test)"}));
}

}  // namespace
}  // namespace shardwild

namespace shardwild {
namespace {


// ------------------------------------------------------------- data.* (the text readers)

// kMinimal with `lines` appended: its data: section goes on at line 6.
std::string WithDataLines(const std::string& lines) { return std::string(kMinimal) + lines; }

// The message of loading `yaml` (named "d.yaml"), or "OK".
std::string LoadError(const std::string& yaml, std::initializer_list<std::string> sets = {}) {
  absl::StatusOr<Config> c = LoadConfigFromString(yaml, "d.yaml", Sets(sets));
  if (c.ok()) return "OK";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  return std::string(c.status().message());
}

TEST(ConfigDataTest, ReaderKeysInBlockStyleAndATabDelimiter) {
  absl::StatusOr<Config> c = LoadConfigFromString(WithDataLines("  format: text\n"
                                                                "  on_error: skip\n"
                                                                "  dense_transform: log3\n"
                                                                "  cache: true\n"
                                                                "  cache_dir: /var/cache/sw\n"
                                                                "  reader_threads: 3\n"
                                                                "  text:\n"
                                                                "    word_ngrams: 2\n"
                                                                "    ngrams_field: yes\n"),
                                                  "d.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.format, DataFormat::kText);
  EXPECT_EQ(c->data.on_error, OnBadRow::kSkip);
  EXPECT_EQ(c->data.dense_transform, DenseTransform::kLog3);
  EXPECT_TRUE(c->data.cache);
  EXPECT_EQ(c->data.cache_dir, "/var/cache/sw");
  EXPECT_EQ(c->data.reader_threads, 3);
  EXPECT_EQ(c->data.text.word_ngrams, 2);
  EXPECT_TRUE(c->data.text.ngrams_field);

  c = LoadConfigFromString(WithDataLines("  format: csv\n"
                                         "  on_error: fail\n"
                                         "  dense_transform: none\n"
                                         "  csv:\n"
                                         "    label: clicked\n"
                                         "    dense: [age, price]\n"
                                         "    categorical: city\n"  // one name: a list of one
                                         "    delimiter: ';'\n"),
                           "d.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.format, DataFormat::kCsv);
  EXPECT_EQ(c->data.on_error, OnBadRow::kFail);
  EXPECT_EQ(c->data.dense_transform, DenseTransform::kNone);
  EXPECT_EQ(c->data.csv.label, "clicked");
  EXPECT_EQ(c->data.csv.dense, (std::vector<std::string>{"age", "price"}));
  EXPECT_EQ(c->data.csv.categorical, (std::vector<std::string>{"city"}));
  EXPECT_EQ(c->data.csv.delimiter, ';');

  // A tab, and dense_transform log1p spelled out.
  c = LoadConfigFromString(WithDataLines("  format: csv\n"
                                         "  dense_transform: log1p\n"
                                         "  csv: {label: y, delimiter: \"\\t\", categorical: [a, b]}\n"),
                           "d.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.csv.delimiter, '\t');
  EXPECT_EQ(c->data.dense_transform, DenseTransform::kLog1p);
  EXPECT_EQ(c->data.csv.categorical, (std::vector<std::string>{"a", "b"}));
}

TEST(ConfigDataTest, OverridesReachTheReaderKeys) {
  absl::StatusOr<Config> c = LoadConfigFromString(
      kMinimal, "d.yaml",
      // A bare | would be a YAML block scalar (the empty string): quoted.
      Sets({"data.format=csv", "data.csv.label=y", "data.csv.delimiter='|'", "data.csv.dense=[a, b]",
            "data.on_error=skip", "data.reader_threads=2", "data.cache=on", "data.text.word_ngrams=2"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.format, DataFormat::kCsv);
  EXPECT_EQ(c->data.csv.label, "y");
  EXPECT_EQ(c->data.csv.delimiter, '|');
  EXPECT_EQ(c->data.csv.dense, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c->data.on_error, OnBadRow::kSkip);
  EXPECT_EQ(c->data.reader_threads, 2);
  EXPECT_TRUE(c->data.cache);
  EXPECT_EQ(c->data.text.word_ngrams, 2);
  EXPECT_EQ(LoadError(kMinimal, {"data.on_error=ignore"}),
            "--set data.on_error=ignore: data.on_error: expected one of fail, skip; got 'ignore'");
  EXPECT_EQ(LoadError(kMinimal, {"data.format=csv", "data.csv.label=y", "data.csv.delimiter=ab"}),
            "--set data.csv.delimiter=ab: data.csv.delimiter: expected one character, got 'ab'");
}

// Type and name errors are found while parsing: they name the key and the
// line and column of the value.
TEST(ConfigDataTest, ParseErrorsNameTheKeyAndLine) {
  EXPECT_EQ(LoadError(WithDataLines("  format: parquet\n")),
            "d.yaml:6:11: data.format: expected one of idx, criteo, libsvm, text, csv; got 'parquet'");
  EXPECT_EQ(LoadError(WithDataLines("  on_error: ignore\n")),
            "d.yaml:6:13: data.on_error: expected one of fail, skip; got 'ignore'");
  EXPECT_EQ(LoadError(WithDataLines("  dense_transform: log\n")),
            "d.yaml:6:20: data.dense_transform: expected one of log1p, log3, none; got 'log'");
  EXPECT_EQ(LoadError(WithDataLines("  cache: maybe\n")), "d.yaml:6:10: data.cache: expected true or false, got 'maybe'");
  EXPECT_EQ(LoadError(WithDataLines("  cache_dir: [a]\n")), "d.yaml:6:14: data.cache_dir: expected a string, got a list");
  EXPECT_EQ(LoadError(WithDataLines("  reader_threads: two\n")),
            "d.yaml:6:19: data.reader_threads: expected an integer, got 'two'");
  EXPECT_EQ(LoadError(WithDataLines("  reader_threads: 1.5\n")),
            "d.yaml:6:19: data.reader_threads: expected an integer, got '1.5'");
  EXPECT_EQ(LoadError(WithDataLines("  text:\n    word_ngrams: bi\n")),
            "d.yaml:7:18: data.text.word_ngrams: expected an integer, got 'bi'");
  EXPECT_EQ(LoadError(WithDataLines("  text:\n    ngrams_field: 2\n")),
            "d.yaml:7:19: data.text.ngrams_field: expected true or false, got '2'");
  EXPECT_EQ(LoadError(WithDataLines("  text:\n    ngrams: 2\n")),
            "d.yaml:7:5: unknown key 'data.text.ngrams' (expected one of: ngrams_field, word_ngrams)");
  EXPECT_EQ(LoadError(WithDataLines("  text: 2\n")), "d.yaml:6:9: data.text: expected a mapping, got '2'");
  const std::string csv = "  format: csv\n  csv:\n    label: y\n";  // csv.* from line 8 on
  EXPECT_EQ(LoadError(WithDataLines(csv + "    delimiter: ab\n")),
            "d.yaml:9:16: data.csv.delimiter: expected one character, got 'ab'");
  EXPECT_EQ(LoadError(WithDataLines(csv + "    delimiter: ''\n")),
            "d.yaml:9:16: data.csv.delimiter: expected one character, got ''");
  EXPECT_EQ(LoadError(WithDataLines(csv + "    dense: {a: 1}\n")),
            "d.yaml:9:12: data.csv.dense: expected a list of names, got a mapping");
  EXPECT_EQ(LoadError(WithDataLines(csv + "    categorical: [a, [b]]\n")),
            "d.yaml:9:22: data.csv.categorical[1]: expected a name, got a list");
  EXPECT_EQ(LoadError(WithDataLines(csv + "    label: [y]\n")), "d.yaml:9:12: data.csv.label: expected a string, got a list");
  EXPECT_EQ(LoadError(WithDataLines(csv + "    lable: y\n")),
            "d.yaml:9:5: unknown key 'data.csv.lable' (expected one of: delimiter, label, categorical, dense)");
}

// Value errors are found by DataOptions::Validate, after parsing: they name
// the file and the key (the validator has no line numbers).
TEST(ConfigDataTest, ValidationErrorsNameTheKey) {
  EXPECT_EQ(LoadError(WithDataLines("  text: {word_ngrams: 3}\n")), "d.yaml: data.text.word_ngrams: must be 1 or 2, got 3");
  EXPECT_EQ(LoadError(WithDataLines("  text: {word_ngrams: 0}\n")), "d.yaml: data.text.word_ngrams: must be 1 or 2, got 0");
  EXPECT_EQ(LoadError(WithDataLines("  reader_threads: -1\n")),
            "d.yaml: data.reader_threads: must be >= 0 (0 = auto), got -1");
  EXPECT_EQ(LoadError(WithDataLines("  format: csv\n")), "d.yaml: data.csv.label: is required with data.format csv");
  EXPECT_EQ(LoadError(WithDataLines("  format: csv\n  csv: {dense: [a]}\n")),
            "d.yaml: data.csv.label: is required with data.format csv");
  EXPECT_EQ(LoadError(WithDataLines("  format: criteo\n  csv: {label: y}\n")),
            "d.yaml: data.csv: applies to data.format csv only");
  EXPECT_EQ(LoadError(WithDataLines("  format: csv\n  csv: {label: y, delimiter: '\"'}\n")),
            "d.yaml: data.csv.delimiter: must not be a quote or a line end");
  EXPECT_EQ(LoadError(WithDataLines("  format: csv\n  csv: {label: y, delimiter: \"\\n\"}\n")),
            "d.yaml: data.csv.delimiter: must not be a quote or a line end");
  EXPECT_EQ(LoadError(WithDataLines("  format: csv\n  csv: {label: y, delimiter: \"\\t\"}\n")), "OK");
  EXPECT_EQ(LoadError(WithDataLines("  prefetch_burst_lines: 2000\n")),
            "d.yaml: data.prefetch_burst_lines: must be auto or 1..1024, got 2000");
}

// data.prefetch_burst_lines: auto (0, measured) by default, or a count.
TEST(ConfigDataTest, PrefetchBurstLines) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "d.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.prefetch_burst_lines, 0);
  c = LoadConfigFromString(kMinimal, "d.yaml", Sets({"data.prefetch_burst_lines=16"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.prefetch_burst_lines, 16);
  c = LoadConfigFromString(WithDataLines("  prefetch_burst_lines: auto\n"), "d.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.prefetch_burst_lines, 0);
  EXPECT_EQ(LoadError(WithDataLines("  prefetch_burst_lines: 0\n")),
            "d.yaml:6:25: data.prefetch_burst_lines: expected a positive integer or 'auto', got '0'");
  EXPECT_EQ(LoadError(kMinimal, {"data.prefetch_burst_lines=many"}),
            "--set data.prefetch_burst_lines=many: data.prefetch_burst_lines: expected a positive integer or 'auto', "
            "got 'many'");
}

}  // namespace
}  // namespace shardwild

namespace shardwild {
namespace {

// data.* reader keys in flow style, their defaults, and every format name.
TEST(ConfigReaderKeysTest, DefaultsFlowStyleAndFormatNames) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "m.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.format, DataFormat::kIdx);
  EXPECT_EQ(c->data.on_error, OnBadRow::kFail);
  EXPECT_EQ(c->data.dense_transform, DenseTransform::kLog1p);
  EXPECT_FALSE(c->data.cache);
  EXPECT_TRUE(c->data.cache_dir.empty());
  EXPECT_EQ(c->data.reader_threads, 0);
  EXPECT_EQ(c->data.text.word_ngrams, 1);
  EXPECT_FALSE(c->data.text.ngrams_field);
  EXPECT_TRUE(c->data.csv.label.empty());
  EXPECT_EQ(c->data.csv.delimiter, ',');

  c = LoadConfigFromString(
      "model: {layers: [{units: 10}]}\n"
      "data: {format: csv, train: tr.csv, on_error: skip, dense_transform: none, cache: true, cache_dir: /tmp/swc,\n"
      "       reader_threads: 3, text: {word_ngrams: 2, ngrams_field: true},\n"
      "       csv: {label: y, dense: [a, b], categorical: [c], delimiter: ';'}}\n",
      "f.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.format, DataFormat::kCsv);
  EXPECT_EQ(c->data.on_error, OnBadRow::kSkip);
  EXPECT_EQ(c->data.dense_transform, DenseTransform::kNone);
  EXPECT_TRUE(c->data.cache);
  EXPECT_EQ(c->data.cache_dir, "/tmp/swc");
  EXPECT_EQ(c->data.reader_threads, 3);
  EXPECT_EQ(c->data.text.word_ngrams, 2);
  EXPECT_TRUE(c->data.text.ngrams_field);
  EXPECT_EQ(c->data.csv.label, "y");
  EXPECT_EQ(c->data.csv.dense, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c->data.csv.categorical, (std::vector<std::string>{"c"}));
  EXPECT_EQ(c->data.csv.delimiter, ';');

  const std::pair<const char*, DataFormat> formats[] = {{"idx", DataFormat::kIdx},
                                                        {"criteo", DataFormat::kCriteo},
                                                        {"libsvm", DataFormat::kLibsvm},
                                                        {"text", DataFormat::kText},
                                                        {"csv", DataFormat::kCsv}};
  for (const auto& [name, format] : formats) {
    SCOPED_TRACE(name);
    const std::string extra = format == DataFormat::kCsv ? "  csv: {label: y}\n" : "";
    c = LoadConfigFromString(absl::StrCat(kMinimal, "  format: ", name, "\n", extra), "n.yaml");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->data.format, format);
  }
}

}  // namespace
}  // namespace shardwild

namespace shardwild {
namespace {

TEST(ConfigClusterTest, DefaultsAndEveryKeyIsRead) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.bind_host, "127.0.0.1");
  EXPECT_TRUE(c->cluster.token_file.empty());
  EXPECT_EQ(c->cluster.max_attempts, 3);
  EXPECT_EQ(c->cluster.max_message_bytes, 4 << 20);
  EXPECT_EQ(c->cluster.keepalive_s, 10.0);
  c = LoadConfigFromString(std::string(kMinimal) +
                               "cluster: {bind_host: 10.0.0.5, token_file: /run/tok, tls_cert_file: c.pem, "
                               "tls_key_file: k.pem, tls_ca_file: ca.pem, deadline_s: 2.5, max_attempts: 5, "
                               "initial_backoff_s: 0.2, max_backoff_s: 4, max_message_bytes: 65536, "
                               "compression: fp16, keepalive_s: 0}\n",
                           "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.bind_host, "10.0.0.5");
  EXPECT_EQ(c->cluster.token_file, "/run/tok");
  EXPECT_EQ(c->cluster.tls_cert_file, "c.pem");
  EXPECT_EQ(c->cluster.tls_key_file, "k.pem");
  EXPECT_EQ(c->cluster.tls_ca_file, "ca.pem");
  EXPECT_EQ(c->cluster.deadline_s, 2.5);
  EXPECT_EQ(c->cluster.max_attempts, 5);
  EXPECT_EQ(c->cluster.initial_backoff_s, 0.2);
  EXPECT_EQ(c->cluster.max_backoff_s, 4.0);
  EXPECT_EQ(c->cluster.max_message_bytes, 65536);
  EXPECT_EQ(c->cluster.compression, GradientCompression::kFp16);
  EXPECT_EQ(c->cluster.keepalive_s, 0.0);
}

TEST(ConfigClusterTest, ValidateNamesTheKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"{tls_cert_file: c.pem}", "cluster.tls_key_file: TLS needs both"},
      {"{tls_key_file: k.pem}", "cluster.tls_cert_file: TLS needs both"},
      {"{tls_ca_file: ca.pem}", "cluster.tls_ca_file: only meaningful with"},
      {"{deadline_s: 0}", "cluster.deadline_s: must be > 0, got 0"},
      {"{max_attempts: 0}", "cluster.max_attempts: must be >= 1, got 0"},
      {"{keepalive_s: 0.01}", "cluster.keepalive_s: must be 0 (off) or in [0.1, 86400], got 0.01"},
      {"{keepalive_s: -1}", "cluster.keepalive_s: must be 0 (off) or in [0.1, 86400], got -1"},
      {"{initial_backoff_s: 3}", "cluster.max_backoff_s: must be >= cluster.initial_backoff_s (3), got 2"},
      {"{max_message_bytes: 100}", "cluster.max_message_bytes: must be in [4096, 1073741824], got 100"},
      {"{bind_host: ''}", "cluster.bind_host: must not be empty"},
      {"{token: x}", "unknown key 'cluster.token'"},
      {"{compression: zstd}", "cluster.compression: expected one of none, bf16, fp16; got 'zstd'"},
      {"{ps_tasks: -2}", "cluster.ps_tasks: must be -1 (auto) or >= 0, got -2"},
      {"{ps_tasks: 0}", "cluster.ps_tasks: train.strategy ps needs at least one ps task"},
  };
  for (const auto& [yaml, message] : cases) {
    absl::StatusOr<Config> c = LoadConfigFromString(std::string(kMinimal) + "cluster: " + yaml + "\n", "c.yaml");
    EXPECT_TRUE(MessageContains(c.status(), {"c.yaml", message})) << yaml;
  }
}

// cluster.ps_tasks: -1 (the default) is 1 ps task under train.strategy ps
// and none under allreduce; 0 is allowed under allreduce only.
TEST(ConfigClusterTest, PsTasksAutoFollowsTheStrategy) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.ps_tasks, -1);
  EXPECT_EQ(c->cluster.PsTasksFor(TrainStrategy::kPs), 1);
  EXPECT_EQ(c->cluster.PsTasksFor(TrainStrategy::kAllreduce), 0);
  c = LoadConfigFromString(kMinimal, "c.yaml", {{"train.strategy", "allreduce"}, {"cluster.ps_tasks", "0"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.PsTasksFor(c->train.strategy), 0);
  c = LoadConfigFromString(kMinimal, "c.yaml", {{"train.strategy", "allreduce"}, {"cluster.ps_tasks", "2"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.PsTasksFor(c->train.strategy), 2);
  c = LoadConfigFromString(kMinimal, "c.yaml", {{"train.strategy", "allreduce"}, {"cluster.ps_tasks", "-2"}});
  EXPECT_TRUE(MessageContains(c.status(), {"cluster.ps_tasks: must be -1 (auto) or >= 0, got -2"})) << c.status();
}

TEST(ConfigMetricsTest, PortAndBind) {
  absl::StatusOr<Config> c = LoadConfigFromString(kMinimal, "m.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics.port, 0);  // off
  EXPECT_EQ(c->metrics.bind, "127.0.0.1");
  c = LoadConfigFromString(std::string(kMinimal) + "metrics: {port: 9100, bind: '::'}\n", "m.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics.port, 9100);
  EXPECT_EQ(c->metrics.bind, "::");
  c = LoadConfigFromString(kMinimal, "m.yaml", {{"metrics.port", "65535"}, {"metrics.bind", "0.0.0.0"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics.port, 65535);
  EXPECT_EQ(c->metrics.bind, "0.0.0.0");
  const std::pair<const char*, const char*> cases[] = {
      {"{port: 70000}", "metrics.port: must be in [1, 65535], or 0 for off, got 70000"},
      {"{port: -1}", "metrics.port: must be in [1, 65535], or 0 for off, got -1"},
      {"{port: http}", "metrics.port: expected an integer, got 'http'"},
      {"{bind: localhost}", "metrics.bind: expected an IPv4 or IPv6 address such as 127.0.0.1, ::1 or 0.0.0.0, got 'localhost'"},
      {"{bind: ''}", "metrics.bind: expected an IPv4 or IPv6 address"},
      {"{bind: 10.0.0}", "metrics.bind: expected an IPv4 or IPv6 address"},
      {"{pot: 1}", "unknown key 'metrics.pot'"},
  };
  for (const auto& [yaml, message] : cases) {
    c = LoadConfigFromString(std::string(kMinimal) + "metrics: " + yaml + "\n", "m.yaml");
    EXPECT_TRUE(MessageContains(c.status(), {"m.yaml", message})) << yaml << ": " << c.status();
  }
}

}  // namespace
}  // namespace shardwild

namespace shardwild {
namespace {

// data.train and data.test: a path, a glob, or a list of them (kept joined
// by commas, which ExpandDataFiles splits again), from the file or --set.
TEST(ConfigStringTest, DataFilesTakeAListOrAGlob) {
  const std::string head = "model:\n  layers:\n    - {units: 10}\n";
  absl::StatusOr<Config> c = LoadConfigFromString(
      head + "data:\n  format: criteo\n  train: [/d/day_1.tsv.gz, '/d/day_[2-9].tsv.gz']\n  test: /d/t*.zst\n", "l.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.train, "/d/day_1.tsv.gz,/d/day_[2-9].tsv.gz");
  EXPECT_EQ(c->data.test, "/d/t*.zst");
  c = LoadConfigFromString(head + "data:\n  format: criteo\n  train: [a.tsv, 'b,c.tsv']\n", "l.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("l.yaml:6"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("data.train[1]"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("expected a file name without a comma"), std::string::npos) << c.status();
  c = LoadConfigFromString(head + "data:\n  format: criteo\n  train: {a: 1}\n", "l.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("data.train"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace shardwild
