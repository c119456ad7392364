#include "core/config/options.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/base/status.h"

namespace shardwild {

const char* ActivationName(Activation a) {
  switch (a) {
    case Activation::kNone: return "none";
    case Activation::kRelu: return "relu";
    case Activation::kSigmoid: return "sigmoid";
    case Activation::kTanh: return "tanh";
  }
  return "?";
}

const char* OptimizerTypeName(OptimizerType t) {
  switch (t) {
    case OptimizerType::kSgd: return "sgd";
    case OptimizerType::kMomentum: return "momentum";
    case OptimizerType::kAdam: return "adam";
    case OptimizerType::kAdagrad: return "adagrad";
    case OptimizerType::kRmsprop: return "rmsprop";
    case OptimizerType::kFtrl: return "ftrl";
  }
  return "?";
}

const char* UpdateModeName(UpdateMode m) {
  switch (m) {
    case UpdateMode::kHogwild: return "hogwild";
    case UpdateMode::kRowLock: return "row_lock";
    case UpdateMode::kSync: return "sync";
  }
  return "?";
}

const char* ReplicationPolicyName(ReplicationPolicy p) {
  switch (p) {
    case ReplicationPolicy::kPerMachine: return "per_machine";
    case ReplicationPolicy::kPerNode: return "per_node";
    case ReplicationPolicy::kPerCore: return "per_core";
    case ReplicationPolicy::kAuto: return "auto";
  }
  return "?";
}

const char* StoreMemoryKindName(StoreMemoryKind kind) {
  switch (kind) {
    case StoreMemoryKind::kAuto: return "auto";
    case StoreMemoryKind::kShared: return "shared";
    case StoreMemoryKind::kPrivate: return "private";
  }
  return "?";
}

const char* LossReductionName(LossReduction r) {
  switch (r) {
    case LossReduction::kSumOverBatchSize: return "sum_over_batch_size";
    case LossReduction::kSum: return "sum";
  }
  return "?";
}

namespace {
absl::Status Bad(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(key, ": ", what));
}
}  // namespace

namespace {
// `last_may_be_auto`: the top tower's last layer may say units 0 (auto: the head's outputs).
absl::Status ValidateLayers(const std::string& key, const std::vector<LayerOptions>& layers, bool last_may_be_auto) {
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string k = absl::StrCat(key, "[", i, "]");
    if (layers[i].type != "dense") return Bad(k + ".type", absl::StrCat("expected 'dense', got '", layers[i].type, "'"));
    const bool auto_ok = last_may_be_auto && i + 1 == layers.size() && layers[i].units == 0;
    if (layers[i].units < 1 && !auto_ok) {
      return Bad(k + ".units", absl::StrCat("must be >= 1", last_may_be_auto && i + 1 == layers.size() ? " or auto" : "",
                                            ", got ", layers[i].units));
    }
    if (!(layers[i].dropout >= 0.0f && layers[i].dropout < 1.0f)) {
      return Bad(k + ".dropout", absl::StrCat("must be in [0, 1), got ", layers[i].dropout));
    }
  }
  return absl::OkStatus();
}
}  // namespace

const char* HeadTypeName(HeadType h) {
  switch (h) {
    case HeadType::kSoftmax: return "softmax";
    case HeadType::kBinary: return "binary";
    case HeadType::kRegression: return "regression";
  }
  return "?";
}

const char* PrecisionName(Precision p) { return p == Precision::kBf16 ? "bf16" : "f32"; }

const TableOptions* ModelOptions::FindTable(const std::string& name) const {
  for (const TableOptions& t : tables) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::Status ValidateTables(const std::vector<TableOptions>& tables, const std::string& key) {
  for (size_t i = 0; i < tables.size(); ++i) {
    const TableOptions& t = tables[i];
    const std::string k = absl::StrCat(key, "[", i, "] (", t.name, ")");
    if (t.name.empty() || t.name.size() > 40) return Bad(k + ".name", "must be 1..40 bytes");
    if (t.name.rfind("wide/", 0) == 0) return Bad(k + ".name", "names starting with 'wide/' are the wide part's");
    for (size_t j = 0; j < i; ++j) {
      if (tables[j].name == t.name) return Bad(k + ".name", absl::StrCat("table '", t.name, "' is defined twice"));
    }
    if (t.rows < 1) return Bad(k + ".rows", absl::StrCat("must be >= 1, got ", t.rows));
    if (t.dim < 1) return Bad(k + ".dim", absl::StrCat("must be >= 1, got ", t.dim));
    if (t.evict_lru && !t.dynamic) return Bad(k + ".on_full", "evict_lru needs kind: dynamic");
    if (!(t.init_scale >= 0.0f)) return Bad(k + ".init_scale", "must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status ModelOptions::Validate() const {
  if (input_dim < 0) return Bad("model.input_dim", absl::StrCat("must be >= 0, got ", input_dim));
  if (layers.empty()) return Bad("model.layers", "must list at least one layer (the top tower; its last layer gives the outputs)");
  SW_RETURN_IF_ERROR(ValidateLayers("model.layers", layers, /*last_may_be_auto=*/true));
  SW_RETURN_IF_ERROR(ValidateLayers("model.bottom", bottom, /*last_may_be_auto=*/false));
  if (layers.back().activation != Activation::kNone) {
    return Bad(absl::StrCat("model.layers[", layers.size() - 1, "].activation"),
               "the last layer produces logits and must have activation 'none'");
  }
  if (layers.back().dropout != 0.0f) {
    return Bad(absl::StrCat("model.layers[", layers.size() - 1, "].dropout"), "the last layer produces logits: no dropout");
  }
  if (head != HeadType::kSoftmax && layers.back().units != 1 && layers.back().units != 0) {
    return Bad(absl::StrCat("model.layers[", layers.size() - 1, "].units"),
               absl::StrCat("a ", HeadTypeName(head), " head takes one output, got ", layers.back().units));
  }
  SW_RETURN_IF_ERROR(ValidateTables(tables, "model.tables"));
  for (size_t i = 0; i < sparse.size(); ++i) {
    const std::string k = absl::StrCat("model.sparse[", i, "] (", sparse[i].field, ")");
    if (sparse[i].field.empty()) return Bad(k + ".field", "is required");
    if (FindTable(sparse[i].table) == nullptr) {
      return Bad(k + ".table", absl::StrCat("no table named '", sparse[i].table, "' in model.tables"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (sparse[j].field == sparse[i].field) return Bad(k + ".field", "this field is listed twice");
    }
  }
  if (interaction != Interaction::kConcat) {
    if (sparse.size() < (interaction == Interaction::kDot ? 1u : 2u)) {
      return Bad("model.interaction", "dot needs sparse features to interact (dot_no_dense: at least two)");
    }
    const int64_t d = FindTable(sparse[0].table)->dim;
    for (const SparseFeatureOptions& f : sparse) {
      if (FindTable(f.table)->dim != d) {
        return Bad("model.interaction", absl::StrCat("dot needs every embedding equally wide; table '", f.table,
                                                     "' has dim ", FindTable(f.table)->dim, ", table '",
                                                     sparse[0].table, "' has dim ", d));
      }
    }
    if (interaction == Interaction::kDot && !bottom.empty() && bottom.back().units != d) {
      return Bad(absl::StrCat("model.bottom[", bottom.size() - 1, "].units"),
                 absl::StrCat("dot interaction: the bottom tower's output must be as wide as the embeddings (", d,
                              "), got ", bottom.back().units));
    }
  }
  for (size_t i = 0; i < wide.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (wide[j] == wide[i]) return Bad(absl::StrCat("model.wide[", i, "]"), absl::StrCat("'", wide[i], "' is listed twice"));
    }
  }
  if (!wide.empty() && wide_rows < 1) return Bad("model.wide_rows", absl::StrCat("must be >= 1, got ", wide_rows));
  return absl::OkStatus();
}

absl::Status DataOptions::Validate() const {
  if (train.empty()) return Bad("data.train", "is required");
  if (max_train_records < 0) return Bad("data.max_train_records", "must be >= 0");
  if (max_test_records < 0) return Bad("data.max_test_records", "must be >= 0");
  if (records_per_task < 1) return Bad("data.records_per_task", absl::StrCat("must be >= 1, got ", records_per_task));
  if (reader_threads < 0) return Bad("data.reader_threads", absl::StrCat("must be >= 0 (0 = auto), got ", reader_threads));
  if (shuffle_buffer < 0) return Bad("data.shuffle_buffer", absl::StrCat("must be >= 0 (0 = auto), got ", shuffle_buffer));
  if (prefetch_batches < 1 || prefetch_batches > 4096) {
    return Bad("data.prefetch_batches", absl::StrCat("must be 1..4096, got ", prefetch_batches));
  }
  if (memory_budget_mb < 1 || memory_budget_mb > (int64_t{1} << 30)) {
    return Bad("data.memory_budget_mb", absl::StrCat("must be >= 1, got ", memory_budget_mb));
  }
  if (prefetch_burst_lines < 0 || prefetch_burst_lines > 1024) {
    return Bad("data.prefetch_burst_lines", absl::StrCat("must be auto or 1..1024, got ", prefetch_burst_lines));
  }
  if (cache_part_mb < 1 || cache_part_mb > (int64_t{1} << 20)) {
    return Bad("data.cache_part_mb", absl::StrCat("must be 1..1048576, got ", cache_part_mb));
  }
  if (stream && (format == DataFormat::kText || format == DataFormat::kIdx)) {
    return Bad("data.stream", "streams criteo, libsvm and csv data; text and idx are loaded whole");
  }
  if (text.word_ngrams != 1 && text.word_ngrams != 2) {
    return Bad("data.text.word_ngrams", absl::StrCat("must be 1 or 2, got ", text.word_ngrams));
  }
  if (format == DataFormat::kCsv && csv.label.empty()) return Bad("data.csv.label", "is required with data.format csv");
  if (format != DataFormat::kCsv && (!csv.label.empty() || !csv.dense.empty() || !csv.categorical.empty())) {
    return Bad("data.csv", "applies to data.format csv only");
  }
  if (csv.delimiter == '"' || csv.delimiter == '\n' || csv.delimiter == '\r') {
    return Bad("data.csv.delimiter", "must not be a quote or a line end");
  }
  return absl::OkStatus();
}

absl::Status TrainOptions::Validate() const {
  if (workers < 0 || workers > 4096) return Bad("train.workers", absl::StrCat("must be 'auto' or 1..4096, got ", workers));
  if (intra_op_threads < 0 || intra_op_threads > 1024)
    return Bad("train.intra_op_threads", absl::StrCat("must be 'auto' or 1..1024, got ", intra_op_threads));
  if (epochs < 1) return Bad("train.epochs", absl::StrCat("must be >= 1, got ", epochs));
  if (batch_size < 1 || batch_size > (1 << 20))
    return Bad("train.batch_size", absl::StrCat("must be 1..1048576, got ", batch_size));
  if (!(log_every_s > 0)) return Bad("train.log_every_s", "must be > 0");
  if (pull_every < 1) return Bad("train.pull_every", absl::StrCat("must be >= 1, got ", pull_every));
  if (!(task_timeout_s > 0) || !std::isfinite(task_timeout_s))
    return Bad("train.task_timeout_s", absl::StrCat("must be a finite number > 0, got ", task_timeout_s));
  if (max_task_retries < 0) return Bad("train.max_task_retries", absl::StrCat("must be >= 0, got ", max_task_retries));
  return absl::OkStatus();
}

float OptimizerOptions::LrAt(double progress) const {
  const double p = std::clamp(progress, 0.0, 1.0);
  if (p < warmup) {
    return static_cast<float>(warmup_start_lr + (static_cast<double>(lr) - warmup_start_lr) * (p / warmup));
  }
  const double t = p - warmup;  // time since the warmup ended, in fractions of the run
  switch (schedule) {
    case LrSchedule::kConstant:
      return lr;
    case LrSchedule::kCosine: {
      const double rest = 1.0 - warmup;
      const double q = rest > 0 ? std::min(t / rest, 1.0) : 1.0;
      return static_cast<float>(final_lr + 0.5 * (static_cast<double>(lr) - final_lr) * (1.0 + std::cos(M_PI * q)));
    }
    case LrSchedule::kLinear: {
      const double rest = 1.0 - warmup;
      const double q = rest > 0 ? std::min(t / rest, 1.0) : 1.0;
      return static_cast<float>(final_lr + (static_cast<double>(lr) - final_lr) * (1.0 - q));
    }
    case LrSchedule::kStep: {
      if (!(decay_every > 0)) return lr;  // rejected by Validate
      // The 1e-9 absorbs rounding: progress (e-1)/E over a period k/E must
      // give a whole number, not 2.9999999999999996.
      const double periods = std::floor(t / decay_every + 1e-9);
      return static_cast<float>(lr * std::pow(static_cast<double>(decay_rate), periods));
    }
  }
  return lr;
}

absl::Status OptimizerOptions::Validate() const {
  // lr first: the bounds of final_lr and warmup_start_lr are given by it.
  if (!(lr > 0) || !std::isfinite(lr)) return Bad("optimizer.lr", absl::StrCat("must be a finite number > 0, got ", lr));
  if (!(final_lr >= 0) || final_lr > lr) return Bad("optimizer.final_lr", absl::StrCat("must be in [0, lr], got ", final_lr));
  if (!(decay_rate > 0 && decay_rate <= 1)) {
    return Bad("optimizer.decay_rate", absl::StrCat("must be in (0, 1], got ", decay_rate));
  }
  if (!(decay_every >= 0 && decay_every <= 1)) {
    return Bad("optimizer.decay_every", absl::StrCat("must be in (0, 1] (a fraction of the run), got ", decay_every));
  }
  if (schedule == LrSchedule::kStep && decay_every == 0) {
    return Bad("optimizer.decay_every",
               "is required with schedule step (a fraction of the run in (0, 1]; or give optimizer.decay_epochs)");
  }
  if (!(warmup >= 0 && warmup < 1)) {
    return Bad("optimizer.warmup", absl::StrCat("must be in [0, 1) (a fraction of the run), got ", warmup));
  }
  if (!(warmup_start_lr >= 0) || warmup_start_lr > lr) {
    return Bad("optimizer.warmup_start_lr", absl::StrCat("must be in [0, lr], got ", warmup_start_lr));
  }
  if (!(momentum >= 0 && momentum < 1)) return Bad("optimizer.momentum", "must be in [0, 1)");
  if (!(beta1 >= 0 && beta1 < 1)) return Bad("optimizer.beta1", "must be in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) return Bad("optimizer.beta2", "must be in [0, 1)");
  if (!(epsilon > 0)) return Bad("optimizer.epsilon", "must be > 0");
  if (!(initial_accumulator_value >= 0) || !std::isfinite(initial_accumulator_value))
    return Bad("optimizer.initial_accumulator_value", absl::StrCat("must be a finite number >= 0, got ", initial_accumulator_value));
  // FTRL divides by sqrt(accumulator) with no epsilon.
  if (type == OptimizerType::kFtrl && !(initial_accumulator_value > 0))
    return Bad("optimizer.initial_accumulator_value", "must be > 0 for ftrl");
  if (!(rho >= 0 && rho < 1)) return Bad("optimizer.rho", absl::StrCat("must be in [0, 1), got ", rho));
  if (!(l1 >= 0) || !std::isfinite(l1)) return Bad("optimizer.l1", absl::StrCat("must be a finite number >= 0, got ", l1));
  if (!(l2 >= 0) || !std::isfinite(l2)) return Bad("optimizer.l2", absl::StrCat("must be a finite number >= 0, got ", l2));
  if (loss_reduction != LossReduction::kSumOverBatchSize && loss_reduction != LossReduction::kSum) {
    return Bad("optimizer.loss_reduction",
               absl::StrCat("must be sum_over_batch_size or sum, got value ", static_cast<int>(loss_reduction)));
  }
  if (schedule != LrSchedule::kConstant && schedule != LrSchedule::kCosine && schedule != LrSchedule::kStep &&
      schedule != LrSchedule::kLinear) {
    return Bad("optimizer.schedule",
               absl::StrCat("must be constant, cosine, step or linear, got value ", static_cast<int>(schedule)));
  }
  return absl::OkStatus();
}

absl::Status StoreOptions::Validate() const {
  if (shards < 0 || shards > 4096) return Bad("ps.shards", absl::StrCat("must be 'auto' or 1..4096, got ", shards));
  if (job_name.empty() || job_name.size() > 40) return Bad("ps.job_name", "must be 1..40 characters");
  for (char c : job_name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return Bad("ps.job_name", "may hold only letters, digits, '_' and '-'");
  }
  if (update != UpdateMode::kHogwild && update != UpdateMode::kRowLock && update != UpdateMode::kSync) {
    return Bad("ps.update", "must be hogwild, row_lock or sync");
  }
  if (max_staleness < 0) return Bad("ps.max_staleness", absl::StrCat("must be >= 0 (0 = unbounded), got ", max_staleness));
  if (hot_rows < 0 || hot_rows > (int64_t{1} << 24)) {
    return Bad("ps.hot_rows", absl::StrCat("must be 0 (none) .. 16777216 rows per table, got ", hot_rows));
  }
  if (hot_rows_merge_every < 1) {
    return Bad("ps.hot_rows_merge_every", absl::StrCat("must be >= 1 step, got ", hot_rows_merge_every));
  }
  if (stale_segments != StaleSegmentPolicy::kRemove && stale_segments != StaleSegmentPolicy::kReport &&
      stale_segments != StaleSegmentPolicy::kFail) {
    return Bad("ps.stale_segments", "must be remove, report or fail");
  }
  if (huge_pages != HugePagePolicy::kAuto && huge_pages != HugePagePolicy::kOff) {
    return Bad("ps.huge_pages", "must be auto or off");
  }
  if (memory_kind != StoreMemoryKind::kAuto && memory_kind != StoreMemoryKind::kShared &&
      memory_kind != StoreMemoryKind::kPrivate) {
    return Bad("ps.memory_kind", "must be auto, shared or private");
  }
  if (replication != ReplicationPolicy::kPerMachine && replication != ReplicationPolicy::kPerNode &&
      replication != ReplicationPolicy::kPerCore && replication != ReplicationPolicy::kAuto) {
    return Bad("ps.replication", "must be per_machine, per_node, per_core or auto");
  }
  if (sync_every < 1) return Bad("ps.sync_every", absl::StrCat("must be >= 1, got ", sync_every));
  if (update == UpdateMode::kSync &&
      (replication == ReplicationPolicy::kPerNode || replication == ReplicationPolicy::kPerCore)) {
    return Bad("ps.replication",
               absl::StrCat(ReplicationPolicyName(replication),
                            " cannot be combined with ps.update sync (sync averages every step over a single copy); "
                            "use ps.replication per_machine or auto, or ps.update hogwild or row_lock"));
  }
  return partitioner.Validate();
}

absl::Status PartitionerOptions::Validate() const {
  if (min_shard_bytes < 1) {
    return Bad("ps.partitioner.min_shard_bytes", absl::StrCat("must be >= 1, got ", min_shard_bytes));
  }
  if (kind == Kind::kMaxSize && max_shard_bytes < 1) {
    return Bad("ps.partitioner.max_shard_bytes", absl::StrCat("must be >= 1 for type max_size, got ", max_shard_bytes));
  }
  if (max_shard_bytes < 0) {
    return Bad("ps.partitioner.max_shard_bytes", absl::StrCat("must be >= 0, got ", max_shard_bytes));
  }
  if (max_shards < 0 || max_shards > 4096) {
    return Bad("ps.partitioner.max_shards",
               absl::StrCat("must be 0 (the store's shard count) or 1..4096, got ", max_shards));
  }
  return absl::OkStatus();
}

absl::Status BenchOptions::Validate() const {
  if (warmup_steps < 0) return Bad("bench.warmup_steps", "must be >= 0");
  if (steps < 1) return Bad("bench.steps", "must be >= 1");
  if (!(peak_seconds > 0)) return Bad("bench.peak_seconds", "must be > 0");
  return absl::OkStatus();
}

absl::Status TopologyOptions::Validate() const {
  if (!synthetic.empty() && !xml.empty()) return Bad("topology", "give either 'synthetic' or 'xml', not both");
  return absl::OkStatus();
}

absl::Status CheckpointOptions::Validate() const {
  if (every_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint.every_steps: must be >= 0, got ", every_steps));
  }
  if (every_epochs < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint.every_epochs: must be >= 0, got ", every_epochs));
  }
  if (keep < 1) return absl::InvalidArgumentError(absl::StrCat("checkpoint.keep: must be >= 1, got ", keep));
  return absl::OkStatus();
}

bool EarlyStoppingOptions::maximize() const {
  if (mode == "max") return true;
  if (mode == "min") return false;
  return monitor.find("acc") != std::string::npos || monitor.find("auc") != std::string::npos ||
         monitor.find("precision") != std::string::npos;
}

absl::Status EarlyStoppingOptions::Validate() const {
  static const char* const kMonitors[] = {"test_loss", "test_accuracy", "test_auc",  "test_logloss",
                                          "test_rmse", "test_precision_at_5", "train_loss", "train_accuracy"};
  if (!monitor.empty() && std::find(std::begin(kMonitors), std::end(kMonitors), monitor) == std::end(kMonitors)) {
    return Bad("early_stopping.monitor",
               absl::StrCat("must be one of test_loss, test_accuracy, test_auc, test_logloss, test_rmse, "
                            "test_precision_at_5, train_loss, train_accuracy (or empty: off), got '",
                            monitor, "'"));
  }
  if (mode != "min" && mode != "max" && mode != "auto") {
    return Bad("early_stopping.mode", absl::StrCat("must be min, max or auto, got '", mode, "'"));
  }
  if (!(min_delta >= 0) || !std::isfinite(min_delta)) {
    return Bad("early_stopping.min_delta", absl::StrCat("must be a finite number >= 0, got ", min_delta));
  }
  if (patience < 0) return Bad("early_stopping.patience", absl::StrCat("must be >= 0, got ", patience));
  return absl::OkStatus();
}

absl::Status EvalOptions::Validate() const {
  if (every_epochs < 0) {
    return absl::InvalidArgumentError(absl::StrCat("eval.every_epochs: must be >= 0, got ", every_epochs));
  }
  if (every_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("eval.every_steps: must be >= 0, got ", every_steps));
  }
  return absl::OkStatus();
}

const char* GradientCompressionName(GradientCompression c) {
  switch (c) {
    case GradientCompression::kNone:
      return "none";
    case GradientCompression::kBf16:
      return "bf16";
    case GradientCompression::kFp16:
      return "fp16";
  }
  return "?";
}

const char* TrainStrategyName(TrainStrategy s) {
  switch (s) {
    case TrainStrategy::kPs:
      return "ps";
    case TrainStrategy::kAllreduce:
      return "allreduce";
  }
  return "?";
}

const char* CollectiveAlgorithmName(CollectiveAlgorithm a) {
  return a == CollectiveAlgorithm::kRing ? "ring" : "halving_doubling";
}

const char* AllreduceOverlapName(AllreduceOverlap o) {
  switch (o) {
    case AllreduceOverlap::kAuto:
      return "auto";
    case AllreduceOverlap::kOn:
      return "true";
    case AllreduceOverlap::kOff:
      return "false";
  }
  return "?";
}

const char* ClusterLauncherName(ClusterLauncher l) {
  switch (l) {
    case ClusterLauncher::kAuto:
      return "auto";
    case ClusterLauncher::kTfConfig:
      return "tf_config";
    case ClusterLauncher::kSlurm:
      return "slurm";
    case ClusterLauncher::kMpi:
      return "mpi";
    case ClusterLauncher::kNone:
      return "none";
  }
  return "?";
}

absl::Status ClusterOptions::Validate() const {
  if (base_port < 1 || base_port > 65535) {
    return Bad("cluster.base_port", absl::StrCat("must be in 1..65535, got ", base_port));
  }
  if (ps_tasks < -1) {
    return Bad("cluster.ps_tasks", absl::StrCat("must be -1 (auto) or >= 0, got ", ps_tasks));
  }
  if (min_workers < 1) return Bad("cluster.min_workers", absl::StrCat("must be >= 1, got ", min_workers));
  if (!(collective_timeout_s > 0) || !std::isfinite(collective_timeout_s)) {
    return Bad("cluster.collective_timeout_s", absl::StrCat("must be a finite number > 0, got ", collective_timeout_s));
  }
  if (bind_host.empty()) return Bad("cluster.bind_host", "must not be empty (the default is 127.0.0.1)");
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return Bad(tls_cert_file.empty() ? "cluster.tls_cert_file" : "cluster.tls_key_file",
               "TLS needs both cluster.tls_cert_file and cluster.tls_key_file");
  }
  if (!tls_ca_file.empty() && tls_cert_file.empty()) {
    return Bad("cluster.tls_ca_file", "only meaningful with cluster.tls_cert_file and cluster.tls_key_file");
  }
  if (!(deadline_s > 0)) return Bad("cluster.deadline_s", absl::StrCat("must be > 0, got ", deadline_s));
  if (!(keepalive_s == 0 || (keepalive_s >= 0.1 && keepalive_s <= 86400))) {
    return Bad("cluster.keepalive_s", absl::StrCat("must be 0 (off) or in [0.1, 86400], got ", keepalive_s));
  }
  if (max_attempts < 1) return Bad("cluster.max_attempts", absl::StrCat("must be >= 1, got ", max_attempts));
  if (!(initial_backoff_s > 0)) {
    return Bad("cluster.initial_backoff_s", absl::StrCat("must be > 0, got ", initial_backoff_s));
  }
  if (!(max_backoff_s >= initial_backoff_s)) {
    return Bad("cluster.max_backoff_s",
               absl::StrCat("must be >= cluster.initial_backoff_s (", initial_backoff_s, "), got ", max_backoff_s));
  }
  if (max_message_bytes < 4096 || max_message_bytes > (int64_t{1} << 30)) {
    return Bad("cluster.max_message_bytes", absl::StrCat("must be in [4096, 1073741824], got ", max_message_bytes));
  }
  return absl::OkStatus();
}

absl::Status MetricsOptions::Validate() const {
  if (port < 0 || port > 65535) {
    return Bad("metrics.port", absl::StrCat("must be in [1, 65535], or 0 for off, got ", port));
  }
  in6_addr addr;
  if (inet_pton(AF_INET, bind.c_str(), &addr) != 1 && inet_pton(AF_INET6, bind.c_str(), &addr) != 1) {
    return Bad("metrics.bind", absl::StrCat("expected an IPv4 or IPv6 address such as 127.0.0.1, ::1 or 0.0.0.0, got '",
                                            bind, "'"));
  }
  return absl::OkStatus();
}

absl::Status Config::Validate() const {
  for (absl::Status s : {model.Validate(), data.Validate(), train.Validate(), optimizer.Validate(),
                         ps.Validate(), bench.Validate(), topology.Validate(), checkpoint.Validate(),
                         early_stopping.Validate(), eval.Validate(), cluster.Validate(), metrics.Validate()}) {
    if (!s.ok()) return s;
  }
  if (data.stream && ps.update == UpdateMode::kSync) {
    return Bad("data.stream",
               "streamed data trains in dispatcher tasks, and ps.update sync trains in lock-step rounds over the "
               "whole data set; use ps.update hogwild or row_lock, or load the data whole");
  }
  // 0 ps tasks is meaningful under allreduce only (the model stays on the
  // ranks); the ps strategy's shards need somewhere to live.
  if (train.strategy == TrainStrategy::kPs && cluster.ps_tasks == 0) {
    return Bad("cluster.ps_tasks",
               "train.strategy ps needs at least one ps task: expected -1 (auto: 1) or >= 1, got 0");
  }
  if (train.strategy == TrainStrategy::kAllreduce) {
    if (train.worker_processes) {
      return Bad("train.strategy", "allreduce steps the workers of a process together (a barrier inside one "
                                   "process); it cannot be combined with train.worker_processes");
    }
    if (data.stream) {
      return Bad("train.strategy", "allreduce trains in lock-step rounds over the whole data set; load the data "
                                   "whole instead of data.stream");
    }
    if (ps.replication == ReplicationPolicy::kPerNode || ps.replication == ReplicationPolicy::kPerCore) {
      return Bad("ps.replication", absl::StrCat(ReplicationPolicyName(ps.replication),
                                                " cannot be combined with train.strategy allreduce (each process "
                                                "keeps one copy); use ps.replication per_machine or auto"));
    }
  }
  if (train.worker_processes && ps.memory_kind == StoreMemoryKind::kPrivate) {
    return Bad("ps.memory_kind", "private memory cannot be attached to by other processes, and "
                                 "train.worker_processes' workers attach to the store; use shared or auto");
  }
  if (train.worker_processes && ps.update == UpdateMode::kSync) {
    return Bad("train.worker_processes",
               "worker processes cannot run ps.update sync (a lock-step barrier inside one process); "
               "use ps.update hogwild or row_lock");
  }
  if (train.worker_processes &&
      (ps.replication == ReplicationPolicy::kPerNode || ps.replication == ReplicationPolicy::kPerCore)) {
    return Bad("ps.replication", absl::StrCat(ReplicationPolicyName(ps.replication),
                                              " cannot be combined with train.worker_processes (worker processes "
                                              "share one copy); use ps.replication per_machine or auto"));
  }
  if (eval.sidecar && checkpoint.dir.empty()) {
    return Bad("eval.sidecar", "a sidecar evaluator reads checkpoints: set checkpoint.dir too");
  }
  if (early_stopping.monitor.rfind("test_", 0) == 0 && data.test.empty()) {
    return Bad("early_stopping.monitor", absl::StrCat("'", early_stopping.monitor, "' needs a test set (data.test)"));
  }
  if (sparse_optimizer) SW_RETURN_IF_ERROR(ValidateSparseOptimizer(*sparse_optimizer));
  return absl::OkStatus();
}

absl::Status ValidateSparseOptimizer(const OptimizerOptions& sparse) {
  // Its errors name optimizer.* keys; they are optimizer.sparse.* here.
  if (absl::Status s = sparse.Validate(); !s.ok()) {
    std::string message(s.message());
    if (message.rfind("optimizer.", 0) == 0) message.insert(10, "sparse.");
    return absl::InvalidArgumentError(message);
  }
  return absl::OkStatus();
}

}  // namespace shardwild
