#include "workers/trainer.h"

#include <algorithm>
#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/io/crc32c.h"
#include "core/base/random.h"
#include "workers/checkpoint.h"
#include "workers/live_metrics.h"
#include "workers/run_callbacks.h"
#include "workers/task_trainer.h"
#include "core/model/partitioner.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"

namespace shardwild {
namespace {

using Clock = std::chrono::steady_clock;


struct Totals {
  int64_t steps = 0, samples = 0, correct = 0;
  double loss = 0;
};

Totals ReadCounters(Job& job) {
  Totals t;
  for (int i = 0; i < job.num_workers(); ++i) {
    WorkerCounters& c = job.worker(i).counters();
    t.steps += c.steps.load(std::memory_order_relaxed);
    t.samples += c.samples.load(std::memory_order_relaxed);
    t.correct += c.correct.load(std::memory_order_relaxed);
    t.loss += c.loss_sum.load(std::memory_order_relaxed);
  }
  return t;
}

// The lock-step rounds of (what is left of) an epoch: `order` split into
// the world's world * workers parts by the div rule; this process's
// workers take parts rank * workers .., and a round is one step of every
// part that has a batch left.
struct RoundPlan {
  std::vector<int32_t> order;       // the records, in training order
  std::vector<RowRange> all_parts;  // world * workers, into order
  std::vector<RowRange> parts;      // this process's workers'
  std::vector<int64_t> worker_steps;
  int64_t rounds = 0;               // the most steps of any part
  int64_t local_steps = 0;          // this process's steps in all

  // Records the first r rounds train (every part's first r batches).
  int64_t RecordsAfter(int64_t r, int64_t batch) const {
    int64_t done = 0;
    for (const RowRange& p : all_parts) done += std::min(p.size(), r * batch);
    return done;
  }
  // The records the rounds after r leave, part by part.
  std::vector<int32_t> Remaining(int64_t r, int64_t batch) const {
    std::vector<int32_t> rest;
    for (const RowRange& p : all_parts) {
      const int64_t from = p.begin + std::min(p.size(), r * batch);
      rest.insert(rest.end(), order.begin() + from, order.begin() + p.end);
    }
    return rest;
  }
};

RoundPlan MakeRoundPlan(std::vector<int32_t> order, int world, int rank, int workers, int64_t batch) {
  RoundPlan p;
  p.order = std::move(order);
  p.all_parts = FixedShardsDiv(static_cast<int64_t>(p.order.size()), static_cast<int64_t>(workers) * world);
  p.parts.assign(p.all_parts.begin() + static_cast<int64_t>(rank) * workers,
                 p.all_parts.begin() + static_cast<int64_t>(rank + 1) * workers);
  for (const RowRange& part : p.all_parts) p.rounds = std::max(p.rounds, (part.size() + batch - 1) / batch);
  for (const RowRange& part : p.parts) {
    p.worker_steps.push_back((part.size() + batch - 1) / batch);
    p.local_steps += p.worker_steps.back();
  }
  return p;
}

}  // namespace

std::vector<int32_t> EpochOrder(int64_t n, uint64_t seed, int epoch) {
  std::vector<int32_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
  uint64_t state = seed * 0x100000001b3ULL + static_cast<uint64_t>(epoch);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(SplitMix64(state) % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

absl::StatusOr<EvalResult> EvaluateAll(Job& job, const Dataset& data) {
  // The chunks of inline evaluation's tasks (data.records_per_task records,
  // merged in order), so both give the same sums bit for bit.
  const int64_t chunk = job.config().data.records_per_task;
  const int64_t chunks = (data.count + chunk - 1) / chunk;
  std::vector<EvalResult> results(chunks);
  SW_RETURN_IF_ERROR(job.pool().RunAll([&](int i) -> absl::Status {
    for (int64_t c = i; c < chunks; c += job.num_workers()) {
      SW_ASSIGN_OR_RETURN(results[c], job.worker(i).Evaluate(data, c * chunk, std::min(data.count, (c + 1) * chunk)));
    }
    return absl::OkStatus();
  }));
  EvalResult total;
  for (const EvalResult& r : results) total.Add(r);
  return total;
}

absl::StatusOr<std::vector<float>> PredictAll(Job& job, const Dataset& data) {
  const int64_t k = job.worker(0).model().outputs();
  std::vector<float> probs(static_cast<size_t>(data.count * k));
  const std::vector<RowRange> parts = FixedShardsDiv(data.count, job.num_workers());
  SW_RETURN_IF_ERROR(job.pool().RunAll([&](int i) -> absl::Status {
    return job.worker(i).Predict(data, parts[i].begin, parts[i].end, probs.data() + parts[i].begin * k);
  }));
  return probs;
}

nlohmann::json DataPreprocessingJson(const Config& c) {
  static const char* const kFormats[] = {"idx", "criteo", "libsvm", "text", "csv"};
  static const char* const kTransforms[] = {"log1p", "log3", "none"};
  nlohmann::json j = {{"format", kFormats[static_cast<int>(c.data.format)]}};
  switch (c.data.format) {
    case DataFormat::kIdx: j["scale"] = "byte/255"; break;
    case DataFormat::kCriteo: j["dense_transform"] = kTransforms[static_cast<int>(c.data.dense_transform)]; break;
    case DataFormat::kLibsvm: break;
    case DataFormat::kText:
      j["word_ngrams"] = c.data.text.word_ngrams;
      j["ngrams_field"] = c.data.text.ngrams_field;
      j["token_hash"] = "fnv1a64";
      break;
    case DataFormat::kCsv:
      j["dense_transform"] = kTransforms[static_cast<int>(c.data.dense_transform)];
      j["label"] = c.data.csv.label;
      j["dense"] = c.data.csv.dense;
      j["categorical"] = c.data.csv.categorical;
      break;
  }
  return j;
}

absl::Status CheckCheckpointData(const Config& config, const CheckpointInfo& checkpoint) {
  // The model's parameters only mean something on data read the same way.
  const nlohmann::json& extra = checkpoint.state.extra;
  if (extra.is_object() && extra.contains("data")) {
    const nlohmann::json now = DataPreprocessingJson(config);
    if (extra.at("data") != now) {
      return absl::FailedPreconditionError(absl::StrCat(
          checkpoint.path, ": trained on data read as ", extra.at("data").dump(), ", but the config reads it as ",
          now.dump(), " (data.format, data.dense_transform, data.text.*, data.csv.* must match)"));
    }
  }
  return absl::OkStatus();
}

absl::Status RestoreJob(Job& job, const CheckpointInfo& checkpoint) {
  SW_RETURN_IF_ERROR(WithErrorKind(CheckCheckpointData(job.config(), checkpoint), ErrorKind::kCheckpoint));
  // A cluster's checkpoint (the chief's, naming the ps tasks' parts)
  // assembles the whole model here.
  const bool cluster = checkpoint.kind == CheckpointKind::kState;
  for (int r = 0; r < job.replicas().num_replicas(); ++r) {
    SW_RETURN_IF_ERROR(WithErrorKind(cluster ? RestoreClusterCheckpoint(checkpoint, job.replicas().replica(r))
                                             : RestoreCheckpoint(checkpoint, job.replicas().replica(r)),
                                     ErrorKind::kCheckpoint));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<CheckpointInfo>> ResumeJob(Job& job, bool fresh, ProgressReporter& progress,
                                                        TrainSummary* summary,
                                                        const ExternalTraining* external) {
  const Config& cfg = job.config();
  if (cfg.checkpoint.dir.empty() || fresh) return std::optional<CheckpointInfo>();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> skipped_here;
  SW_ASSIGN_OR_RETURN(std::optional<CheckpointInfo> found,
                      WithErrorKind(FindLatestCheckpoint(cfg.checkpoint.dir, &skipped_here), ErrorKind::kCheckpoint));
  for (const std::string& s : skipped_here) progress.Line(absl::StrCat("warning: skipped checkpoint ", s));
  summary->skipped_checkpoints.insert(summary->skipped_checkpoints.end(), skipped_here.begin(), skipped_here.end());
  if (!found) return found;
  if (external != nullptr) {
    SW_RETURN_IF_ERROR(WithErrorKind(CheckCheckpointData(cfg, *found), ErrorKind::kCheckpoint));
    SW_RETURN_IF_ERROR(WithErrorKind(external->restore_params(*found), ErrorKind::kCheckpoint));
  } else {
    SW_RETURN_IF_ERROR(RestoreJob(job, *found));
  }
  summary->checkpoint_restore_s = SecondsSince(start);
  const std::string config_hash = TrainingConfigHash(cfg);
  if (found->state.config_hash != config_hash) {
    progress.Line(absl::StrCat("warning: ", found->path, " was written under another config (hash ",
                               found->state.config_hash, ", now ", config_hash, ")"));
  }
  return found;
}

absl::Status WriteTrainingCheckpoint(Job& job, CheckpointState state, const RunCallbacks& callbacks,
                                     const TrainRunOptions& options, TrainSummary* summary) {
  if (nlohmann::json es = callbacks.early_stopping_state(); !es.is_null()) state.extra["early_stopping"] = es;
  state.extra["data"] = DataPreprocessingJson(job.config());
  CheckpointWriteOptions wo;
  wo.keep = job.config().checkpoint.keep;
  const auto start = std::chrono::steady_clock::now();
  absl::Cleanup timed = [&] { summary->checkpoint_write_s += SecondsSince(start); };
  if (options.external != nullptr) {
    SW_ASSIGN_OR_RETURN(summary->last_checkpoint, options.external->write_checkpoint(state, wo));
  } else {
    // Tables kept elsewhere are saved first; the dense part's atomic rename
    // then commits both (a crash in between leaves parts no checkpoint names).
    if (options.tables != nullptr) {
      SW_ASSIGN_OR_RETURN(state.extra["tables"], WithErrorKind(options.tables->save(state.step), ErrorKind::kCheckpoint));
    }
    SW_ASSIGN_OR_RETURN(summary->last_checkpoint, WriteCheckpoint(job.config().checkpoint.dir, job.store(), state, wo));
  }
  ++summary->checkpoints_written;
  if (options.live_metrics != nullptr) options.live_metrics->AddCheckpoint();
  if (options.stop_after_checkpoints > 0 && summary->checkpoints_written >= options.stop_after_checkpoints) {
    return absl::AbortedError(absl::StrCat("stopped after checkpoint ", summary->last_checkpoint, " (test hook)"));
  }
  return absl::OkStatus();
}

std::string TrainingConfigHash(const Config& c) {
  std::string key = absl::StrCat("input:", c.model.input_dim, ";loss:", static_cast<int>(c.model.loss));
  for (const LayerOptions& l : c.model.layers) {
    absl::StrAppend(&key, ";layer:", l.type, ",", l.units, ",", ActivationName(l.activation));
  }
  absl::StrAppend(&key, ";train:", c.data.train, ";max_train:", c.data.max_train_records, ";test:", c.data.test, ";workers:", c.train.workers,
                                 ";batch:", c.train.batch_size, ";seed:", c.train.seed, ";epochs:", c.train.epochs,
                                 ";pull_every:", c.train.pull_every, ";update:", UpdateModeName(c.ps.update),
                                 ";replication:", ReplicationPolicyName(c.ps.replication));
  auto opt = [&key](const char* name, const OptimizerOptions& o) {
    absl::StrAppend(&key, ";", name, ":", OptimizerTypeName(o.type), ",", o.lr, ",", o.momentum, ",", o.nesterov, ",",
                    o.beta1, ",", o.beta2, ",", o.epsilon, ",", o.initial_accumulator_value, ",", o.rho, ",", o.l1,
                    ",", o.l2, ",", static_cast<int>(o.schedule), ",", o.final_lr);
    // Added later; only when set, so older checkpoints keep their hash.
    if (o.decay_every != 0 || o.warmup != 0) {
      absl::StrAppend(&key, ",decay:", o.decay_rate, ",", o.decay_every, ",warmup:", o.warmup, ",", o.warmup_start_lr);
    }
    if (o.loss_reduction != LossReduction::kSumOverBatchSize) {
      absl::StrAppend(&key, ",reduction:", LossReductionName(o.loss_reduction));
    }
  };
  opt("optimizer", c.optimizer);
  if (c.sparse_optimizer) opt("sparse", *c.sparse_optimizer);
  // Added with sparse models; only when they are used, so the hash of a
  // dense model's checkpoint stays what it was.
  const ModelOptions& m = c.model;
  if (!m.bottom.empty() || !m.sparse.empty() || !m.wide.empty() || m.head != HeadType::kSoftmax ||
      c.data.format != DataFormat::kIdx) {
    absl::StrAppend(&key, ";head:", HeadTypeName(m.head), ";interaction:", static_cast<int>(m.interaction),
                    ";data:", DataPreprocessingJson(c).dump());
    for (const LayerOptions& l : m.bottom) {
      absl::StrAppend(&key, ";bottom:", l.units, ",", ActivationName(l.activation), ",", l.dropout);
    }
    for (const LayerOptions& l : m.layers) absl::StrAppend(&key, ";dropout:", l.dropout);
    for (const TableOptions& t : m.tables) {
      absl::StrAppend(&key, ";table:", t.name, ",", t.rows, ",", t.dim, ",", t.dynamic, ",", t.evict_lru, ",",
                      t.init_scale);
    }
    for (const SparseFeatureOptions& f : m.sparse) {
      absl::StrAppend(&key, ";sparse:", f.field, ",", f.table, ",", static_cast<int>(f.pooling), ",", f.weighted);
    }
    for (const std::string& w : m.wide) absl::StrAppend(&key, ";wide:", w);
    if (!m.wide.empty()) absl::StrAppend(&key, ";wide_rows:", m.wide_rows);
  }
  return absl::StrFormat("%08x", Crc32c(key.data(), key.size()));
}

absl::Status InterruptedError() {
  return absl::CancelledError("training interrupted; the checkpoints written so far are kept");
}

absl::StatusOr<TrainSummary> RunTraining(Job& job, ProgressReporter& progress, const TrainRunOptions& options) {
  // Scrapes read the workers' counters and the store while the run lasts.
  const std::vector<LiveMetrics::Attachment> live_sources = AttachJob(options.live_metrics, job);
  // Hogwild and row_lock train in dispatcher tasks (on worker processes or
  // on the job's threads); sync trains in lockstep rounds below.
  const bool allreduce = job.config().train.strategy == TrainStrategy::kAllreduce;
  if (job.config().train.worker_processes || (job.config().ps.update != UpdateMode::kSync && !allreduce)) {
    return RunTaskTraining(job, progress, options);
  }
  const Config& cfg = job.config();
  const int workers = job.num_workers();
  const int64_t n = job.train().count;
  const int64_t batch = cfg.train.batch_size;
  ElasticGroup* const elastic = options.elastic;
  if (elastic != nullptr && (job.sync() == nullptr || !allreduce)) {
    return absl::InvalidArgumentError("train: a group of processes needs train.strategy allreduce and its sync barrier");
  }
  auto world = [elastic] { return elastic != nullptr ? elastic->world() : 1; };
  auto rank = [elastic] { return elastic != nullptr ? elastic->rank() : 0; };
  auto make_plan = [&](std::vector<int32_t> order) {
    return MakeRoundPlan(std::move(order), world(), rank(), workers, batch);
  };
  // The plan of the epoch under way (the first epoch's until the loop
  // starts); with a group it is re-made for the rest of the epoch whenever
  // the group changes.
  RoundPlan plan = make_plan(EpochOrder(n, cfg.train.seed, 1));
  int64_t steps_per_epoch = plan.local_steps;  // over this process's workers
  int64_t epoch_rounds = plan.rounds;          // the most steps any worker of the world takes
  const CheckpointOptions& ck = cfg.checkpoint;
  // In a group, rank 0 alone writes (its rank may change as members leave:
  // the first generation's rank 0 keeps the membership and stays rank 0).
  const bool checkpointing = !ck.dir.empty() && rank() == 0;
  const std::string config_hash = TrainingConfigHash(cfg);

  TrainSummary summary;
  summary.epochs = cfg.train.epochs;
  summary.workers = workers;
  summary.intra_op_threads = job.placement().threads_per_worker;
  summary.shards = job.store().layout().num_shards;
  summary.store_name = job.store().name();
  summary.store_bytes = job.replicas().total_bytes();

  // Where this run starts: epoch `first_epoch`, with `first_round` steps of
  // each worker already done in it; what the restored run had counted.
  int first_epoch = 1;
  int64_t first_round = 0;
  int64_t base_records = 0, base_steps = 0;
  nlohmann::json restored_extra;
  if (job.tables_store() != nullptr && !ck.dir.empty() && options.tables == nullptr) {
    return absl::InternalError(
        "train: a job whose tables live outside its store checkpoints them through TrainRunOptions::tables");
  }
  {
    SW_ASSIGN_OR_RETURN(std::optional<CheckpointInfo> found, ResumeJob(job, options.fresh, progress, &summary));
    if (found) {
      const nlohmann::json& cur = found->state.data_cursor;
      const nlohmann::json& extra = found->state.extra;
      restored_extra = extra;
      first_epoch = cur.value("epoch", 1);
      first_round = cur.value("round", int64_t{0});
      base_records = extra.value("records_seen", int64_t{0});
      base_steps = extra.value("steps", int64_t{0});
      if (cur.value("workers", 0) != workers * world() || cur.value("batch", int64_t{0}) != batch ||
          cur.value("records", int64_t{0}) != n) {
        if (first_round > 0) {
          progress.Line(absl::StrCat("warning: workers, batch size or data changed since ", found->path,
                                     "; epoch ", first_epoch, " restarts from its beginning"));
          base_records -= cur.value("epoch_records", int64_t{0});
          first_round = 0;
        }
      } else if (first_round == 0 && cur.value("epoch_records", int64_t{0}) > 0) {
        // Written in the middle of an epoch by task training (a dispatcher
        // cursor, not a round): these rounds cannot continue it task by
        // task, so the epoch restarts and its records done count once.
        progress.Line(absl::StrCat("warning: ", found->path, " was written between tasks of epoch ", first_epoch,
                                   "; lockstep (ps.update sync) training restarts that epoch"));
        base_records -= cur.value("epoch_records", int64_t{0});
      }
      // In a group the epoch's records are counted whole at its end (by
      // rounds, from its first), so those before a mid-epoch checkpoint come
      // off what it had counted.
      if (elastic != nullptr && first_round > 0) base_records -= cur.value("epoch_records", int64_t{0});
      summary.resumed_from_step = found->step;
      progress.Line(absl::StrCat("resumed from ", found->path, ": epoch ", first_epoch, ", step ", first_round, " of ",
                                 epoch_rounds));
    }
    if (job.tables_store() != nullptr) {
      // Tables outside the Job's store: restored by their owner to the dense
      // part's step, before any rank of the group trains on them.
      if (found) {
        const auto t = found->state.extra.find("tables");
        if (t == found->state.extra.end()) {
          return WithErrorKind(
              absl::FailedPreconditionError(absl::StrCat(
                  found->path, ": holds no checkpoint of the embedding tables this job keeps on ps tasks (it was "
                               "written by a run that kept them in its own store): resume it with that setup, or "
                               "start afresh with --fresh")),
              ErrorKind::kCheckpoint);
        }
        SW_RETURN_IF_ERROR(WithErrorKind(options.tables->restore(*found, *t), ErrorKind::kCheckpoint));
      }
      if (elastic != nullptr && !elastic->joined_late()) SW_RETURN_IF_ERROR(elastic->Barrier());
    }
  }

  // Metrics, early stopping (its state travels in checkpoints), epoch lines.
  SW_ASSIGN_OR_RETURN(std::unique_ptr<RunCallbacks> callbacks,
                      RunCallbacks::Create(cfg, summary.resumed_from_step.has_value(), restored_extra, &progress));
  if (options.on_metrics) callbacks->set_observer(options.on_metrics);
  const bool inline_eval = job.test() != nullptr && !cfg.eval.sidecar;

  // Ends the rounds between steps when the run is stopped (a callback) or
  // interrupted: every worker checks it before each step, for this run only.
  std::atomic<bool> stop_steps{false};
  struct StopFlagGuard {
    Job& job;
    ~StopFlagGuard() {
      for (int i = 0; i < job.num_workers(); ++i) job.worker(i).set_stop(nullptr);
    }
  } stop_guard{job};
  for (int i = 0; i < workers; ++i) job.worker(i).set_stop(&stop_steps);
  // The progress tick runs every train.log_every_s; with an interrupt to
  // watch, the wait wakes every 100 ms to look at it and ticks when due.
  const double tick_s = options.interrupt != nullptr ? std::min(cfg.train.log_every_s, 0.1) : cfg.train.log_every_s;

  // In a group: the records the world has trained in the epochs before the
  // one under way (counted by rounds, so the same on every rank, whatever
  // members came and went).
  int64_t group_records = 0;
  // Writes a checkpoint of the (quiescent) job: the next step to run is step
  // `round` of epoch `epoch`, with `epoch_records` of it trained (in a
  // group, the group's, as records_seen counts them; group_records holds
  // the epochs before).
  auto write_checkpoint = [&](int epoch, int64_t round, int64_t epoch_records) -> absl::Status {
    SW_RETURN_IF_ERROR(job.replicas().Average());
    const Totals t = ReadCounters(job);
    CheckpointState state;
    state.step = base_steps + t.steps;
    state.epoch = epoch - 1;
    state.config_hash = config_hash;
    state.data_cursor = {{"epoch", epoch},      {"round", round},          {"workers", workers * world()},
                         {"batch", batch},      {"records", n},            {"epoch_records", epoch_records},
                         {"seed", cfg.train.seed}};
    state.rng = {{"shuffle_seed", cfg.train.seed}, {"epoch", epoch}};
    state.extra = {{"records_seen", base_records + (elastic != nullptr ? group_records + epoch_records : t.samples)},
                   {"steps", base_steps + t.steps},
                   {"final", epoch > cfg.train.epochs || callbacks->stopped()}};
    return WriteTrainingCheckpoint(job, std::move(state), *callbacks, options, &summary);
  };

  absl::Status metrics_status;  // the first error of a write from the progress callback
  // Evaluates data.test with every worker stopped.
  struct Evaluated {
    double loss = 0, accuracy = 0;
    MetricValues extra;
  };
  auto evaluate = [&]() -> absl::StatusOr<Evaluated> {
    SW_ASSIGN_OR_RETURN(EvalResult ev, EvaluateAll(job, *job.test()));
    summary.eval_records_seen += ev.count;
    return Evaluated{ev.count ? ev.loss_sum / ev.count : 0.0,
                     ev.count ? static_cast<double>(ev.correct) / ev.count : 0.0, ExtraTestMetrics(ev)};
  };

  const auto run_start = Clock::now();
  double train_seconds = 0;
  int64_t global_round = static_cast<int64_t>(first_epoch - 1) * epoch_rounds + first_round;
  // And the state a process that joined the running job takes from rank 0
  // first.
  std::optional<std::vector<int32_t>> carried_order;  // what is left of the epoch under way
  int64_t carried_epoch_records = 0;
  // A group's cursor, as SyncState hands it around: the epoch, the records
  // of it done, the records before it, and the rounds so far (where every
  // member cuts its segments).
  auto sync_group = [&](int64_t epoch, int64_t epoch_records, std::vector<int32_t> rest)
      -> absl::StatusOr<std::vector<int64_t>> {
    std::vector<int64_t> cursor = {epoch, epoch_records, group_records, global_round};
    SW_RETURN_IF_ERROR(elastic->SyncState(&cursor, &rest));
    if (cursor.size() != 4) return absl::InternalError("train: a group's cursor has 4 fields");
    group_records = cursor[2];
    global_round = cursor[3];
    carried_order = std::move(rest);
    carried_epoch_records = cursor[1];
    return cursor;
  };
  if (elastic != nullptr && elastic->joined_late()) {
    // Joined a running job: its epoch, what is left of it, its parameters.
    SW_ASSIGN_OR_RETURN(const std::vector<int64_t> cursor, sync_group(first_epoch, 0, {}));
    first_epoch = static_cast<int>(cursor[0]);
    first_round = 0;
    progress.Line(absl::StrCat("joined the running job at epoch ", first_epoch, " (", carried_epoch_records,
                               " of its records done), as rank ", rank(), " of ", world()));
  }
  for (int epoch = first_epoch; epoch <= cfg.train.epochs; ++epoch) {
    // The epoch's plan: all of it, or (after a change of the group) the
    // part the group has left.
    const double epoch_progress_begin = static_cast<double>(epoch - 1) / cfg.train.epochs;
    const double progress_end = static_cast<double>(epoch) / cfg.train.epochs;
    int64_t epoch_records_before_plan = 0;  // of this epoch, trained before the plan under way
    double progress_begin = epoch_progress_begin;  // where the plan starts in the schedule
    bool replanned = false;
    // Takes the plan SyncState handed over: what is left of this epoch.
    auto adopt_carried = [&] {
      plan = make_plan(std::move(*carried_order));
      carried_order.reset();
      epoch_records_before_plan = carried_epoch_records;
      progress_begin = epoch_progress_begin + static_cast<double>(epoch_records_before_plan) / n / cfg.train.epochs;
      epoch_rounds = plan.rounds;
      steps_per_epoch = plan.local_steps;
      replanned = true;
    };
    if (carried_order) {
      adopt_carried();
    } else {
      plan = make_plan(EpochOrder(n, cfg.train.seed, epoch));
      epoch_rounds = plan.rounds;
      steps_per_epoch = plan.local_steps;
    }
    const Totals before = ReadCounters(job);
    const auto epoch_start = Clock::now();
    const int64_t start_round = epoch == first_epoch ? first_round : 0;
    auto last_tick = Clock::now();
    auto tick = [&] {
      if (Interrupted(options) || callbacks->stopped()) stop_steps.store(true, std::memory_order_relaxed);
      if (SecondsSince(last_tick) < cfg.train.log_every_s - 1e-3) return;
      last_tick = Clock::now();
      const Totals now = ReadCounters(job);
      const double elapsed = SecondsSince(epoch_start);
      ProgressState s;
      s.epoch = epoch;
      s.epochs = cfg.train.epochs;
      s.step = now.steps - before.steps;
      s.steps = steps_per_epoch;
      const int64_t samples = now.samples - before.samples;
      s.samples_per_s = elapsed > 0 ? samples / elapsed : 0;
      s.loss = samples > 0 ? (now.loss - before.loss) / samples : 0;
      const double per_step = s.step > 0 ? elapsed / s.step : 0;
      s.eta_s = per_step * ((steps_per_epoch - s.step) + steps_per_epoch * (cfg.train.epochs - epoch));
      progress.Update(s);
      if (samples > 0 && metrics_status.ok()) {
        metrics_status = callbacks->OnProgress(epoch, base_steps + now.steps, s.loss, s.samples_per_s);
        if (!metrics_status.ok() || callbacks->stopped()) stop_steps.store(true, std::memory_order_relaxed);
      }
      if (samples > 0 && options.live_metrics != nullptr) {
        options.live_metrics->SetTrainLoss(s.loss);
        options.live_metrics->SetJobRecords(base_records + now.samples);
      }
    };
    // The epoch in segments of whole steps, ending where a checkpoint is due
    // (and in a group every kGroupSegmentRounds rounds, where joiners are let
    // in). Every rank cuts the same segments.
    constexpr int64_t kGroupSegmentRounds = 16;
    for (int64_t round = start_round; round < epoch_rounds;) {
      int64_t end = epoch_rounds;
      if (!ck.dir.empty() && ck.every_steps > 0) {
        end = std::min(end, round + (ck.every_steps - global_round % ck.every_steps));
      }
      if (inline_eval && cfg.eval.every_steps > 0) {
        end = std::min(end, round + (cfg.eval.every_steps - global_round % cfg.eval.every_steps));
      }
      if (elastic != nullptr) end = std::min(end, round + kGroupSegmentRounds);
      const uint64_t rounds_before = job.sync() != nullptr ? job.sync()->rounds() : 0;
      const uint64_t completed_before = job.sync() != nullptr ? job.sync()->completed_rounds() : 0;
      absl::Status segment = job.pool().RunAll(
          [&](int i) {
            const int64_t first = std::min(round, plan.worker_steps[i]);
            const int64_t last = std::min(end, plan.worker_steps[i]);
            const int64_t begin_record = first * batch;
            const int64_t count = std::min(plan.parts[i].size(), last * batch) - begin_record;
            const double per_step = plan.worker_steps[i] > 0 ? (progress_end - progress_begin) /
                                                                   static_cast<double>(plan.worker_steps[i])
                                                             : 0.0;
            return job.worker(i).TrainRange(plan.order.data() + plan.parts[i].begin + begin_record, count,
                                            cfg.optimizer, progress_begin, per_step, first, nullptr);
          },
          absl::Seconds(tick_s), tick);
      // Segments shorter than a tick (a group's) still show progress.
      tick();
      if (segment.ok() && elastic != nullptr && !stop_steps.load(std::memory_order_relaxed)) {
        // The rounds of [round, end) this process's parts ran out before.
        const int64_t done = static_cast<int64_t>(job.sync()->rounds() - rounds_before);
        segment = job.sync()->PadRounds(end - round - done);
      }
      if (!segment.ok()) {
        if (elastic == nullptr) return segment;
        // A member was lost: the group re-forms, every member takes rank
        // 0's parameters and what is left of the epoch after the rounds
        // rank 0 completed, and the epoch goes on over the new group.
        SW_ASSIGN_OR_RETURN(const bool reformed, elastic->Recover(segment));
        if (!reformed) return segment;
        const int64_t completed = round + static_cast<int64_t>(job.sync()->completed_rounds() - completed_before);
        SW_RETURN_IF_ERROR(sync_group(epoch, epoch_records_before_plan + plan.RecordsAfter(completed, batch),
                                      plan.Remaining(completed, batch))
                               .status());
        progress.Line(absl::StrCat("the group re-formed after a failure: rank ", rank(), " of ", world(), "; epoch ",
                                   epoch, " goes on with ", carried_order->size(), " records left"));
        adopt_carried();
        round = 0;
        continue;
      }
      if (Interrupted(options)) return InterruptedError();
      SW_RETURN_IF_ERROR(metrics_status);
      if (callbacks->stopped()) break;  // a callback stopped the run: the epoch ends here
      global_round += end - round;
      round = end;
      if (elastic != nullptr && round < epoch_rounds) {
        SW_ASSIGN_OR_RETURN(const bool admitted, elastic->AdmitJoiners());
        if (admitted) {
          SW_RETURN_IF_ERROR(sync_group(epoch, epoch_records_before_plan + plan.RecordsAfter(round, batch),
                                        plan.Remaining(round, batch))
                                 .status());
          progress.Line(absl::StrCat("the group took in new members: rank ", rank(), " of ", world()));
          adopt_carried();
          round = 0;
          continue;
        }
      }
      if (inline_eval && cfg.eval.every_steps > 0 && global_round % cfg.eval.every_steps == 0 && round < epoch_rounds) {
        // Inline evaluation between steps: every worker is stopped.
        SW_RETURN_IF_ERROR(job.replicas().Average());
        SW_ASSIGN_OR_RETURN(const auto result, evaluate());
        SW_ASSIGN_OR_RETURN(const bool stop, callbacks->OnEvaluation(epoch, round, epoch_rounds,
                                                                     base_steps + ReadCounters(job).steps,
                                                                     result.loss, result.accuracy, result.extra));
        if (stop) break;
      }
      if (checkpointing && ck.every_steps > 0 && global_round % ck.every_steps == 0 && round < epoch_rounds) {
        // After the group changed within the epoch, rounds no longer index
        // it: such a checkpoint restarts the epoch (its records counted once).
        SW_RETURN_IF_ERROR(write_checkpoint(epoch, replanned ? 0 : round,
                                            elastic != nullptr
                                                ? epoch_records_before_plan + plan.RecordsAfter(round, batch)
                                                : ReadCounters(job).samples - before.samples));
      }
    }
    if (elastic != nullptr) group_records += epoch_records_before_plan + plan.RecordsAfter(epoch_rounds, batch);
    // With several replicas, end the epoch on one model (evaluation and the
    // next epoch's first pulls see the mean). No worker runs now.
    SW_RETURN_IF_ERROR(job.replicas().Average());
    const double seconds = SecondsSince(epoch_start);
    train_seconds += seconds;
    const Totals after = ReadCounters(job);

    EpochResult er;
    er.epoch = epoch;
    er.records = after.samples - before.samples;  // this process's
    er.train_loss = er.records > 0 ? (after.loss - before.loss) / er.records : 0;
    er.train_accuracy = er.records > 0 ? static_cast<double>(after.correct - before.correct) / er.records : 0;
    er.seconds = seconds;
    er.samples_per_s = seconds > 0 ? er.records / seconds : 0;
    if (er.records > 0 && options.live_metrics != nullptr) options.live_metrics->SetTrainLoss(er.train_loss);
    const bool last_epoch = epoch == cfg.train.epochs;
    if (inline_eval && !callbacks->stopped() &&
        (last_epoch || (cfg.eval.every_epochs > 0 && epoch % cfg.eval.every_epochs == 0))) {
      SW_ASSIGN_OR_RETURN(const auto result, evaluate());
      er.test_loss = result.loss;
      er.test_accuracy = result.accuracy;
      er.test_metrics = result.extra;
    }
    SW_RETURN_IF_ERROR(metrics_status);
    const bool stopped_before = callbacks->stopped();
    SW_ASSIGN_OR_RETURN(const bool stop, callbacks->OnEpochEnd(er, cfg.train.epochs, base_steps + ReadCounters(job).steps));
    summary.history.push_back(er);
    if (stopped_before || stop) {
      summary.stopped_early_at_epoch = epoch;
      // The final checkpoint; a restart resumes after the last epoch and trains no more.
      if (checkpointing) SW_RETURN_IF_ERROR(write_checkpoint(cfg.train.epochs + 1, 0, 0));
      break;
    }
    if (checkpointing && (last_epoch || (ck.every_epochs > 0 && epoch % ck.every_epochs == 0))) {
      SW_RETURN_IF_ERROR(write_checkpoint(epoch + 1, 0, 0));
    }
  }
  const Totals end = ReadCounters(job);
  summary.steps = base_steps + end.steps;
  // In a group the world's records (rank 0's count, handed to joiners), not
  // this process's share.
  summary.records_seen = base_records + (elastic != nullptr ? group_records : end.samples);
  summary.samples_per_s = train_seconds > 0 ? end.samples / train_seconds : 0;
  if (!summary.history.empty()) {
    summary.train_loss = summary.history.back().train_loss;
  }
  if (const auto& last = callbacks->last_evaluation()) {
    summary.test_loss = last->loss;
    summary.test_accuracy = last->accuracy;
    summary.test_metrics = last->extra;
  }
  if (first_epoch > cfg.train.epochs) {
    // Resumed from the final checkpoint: say so, and report the final model.
    summary.already_complete = true;
    progress.Line(absl::StrCat("the job was already complete (its final checkpoint is the newest in ", ck.dir,
                               "): nothing to train", inline_eval ? "; evaluating the final model" : ""));
    if (inline_eval) {
      SW_ASSIGN_OR_RETURN(const Evaluated ev, evaluate());
      summary.test_loss = ev.loss;
      summary.test_accuracy = ev.accuracy;
      summary.test_metrics = ev.extra;
    }
  }
  summary.model_version = job.replicas().version();
  summary.wall_s = SecondsSince(run_start);
  return summary;
}

}  // namespace shardwild
