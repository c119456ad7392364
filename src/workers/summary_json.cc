#include "workers/summary_json.h"

#include <optional>

#include "core/config/options.h"
#include "ps_shm/huge_pages.h"

namespace shardwild {

using nlohmann::json;

// store.memory of the train summary, summed over the replicas: bytes of
// parameters, optimizer slots and everything else, and per embedding table
// the bytes a row takes (bytes_per_row, of which meta_bytes_per_row are
// metadata) and the same split.
json StoreMemoryJson(ReplicatedStore& store) {
  ShmParamStore::Memory m;
  for (int r = 0; r < store.num_replicas(); ++r) {
    const ShmParamStore::Memory rm = store.replica(r).memory();
    m.params += rm.params;
    m.slots += rm.slots;
    m.overhead += rm.overhead;
    if (r == 0) {
      m.tables = rm.tables;
      continue;
    }
    for (size_t t = 0; t < rm.tables.size(); ++t) {
      m.tables[t].rows += rm.tables[t].rows;
      m.tables[t].params += rm.tables[t].params;
      m.tables[t].slots += rm.tables[t].slots;
      m.tables[t].overhead += rm.tables[t].overhead;
    }
  }
  json tables = json::array();
  for (const ShmParamStore::TableMemory& t : m.tables) {
    tables.push_back({{"name", t.name},
                      {"dtype", t.bf16 ? "bf16" : "f32"},
                      {"rows", t.rows},
                      {"bytes_per_row", t.bytes_per_row},
                      {"meta_bytes_per_row", t.meta_bytes_per_row},
                      {"params_bytes", t.params},
                      {"slot_bytes", t.slots},
                      {"overhead_bytes", t.overhead}});
  }
  return {{"params_bytes", m.params}, {"slot_bytes", m.slots}, {"overhead_bytes", m.overhead}, {"tables", tables}};
}

namespace {

// A number, or null when absent.
json Optional(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

// store.replication of the train summary: what ps.replication chose and why.
json ReplicationJson(ReplicatedStore& store) {
  const ReplicationPlan& p = store.plan();
  return {{"policy", ReplicationPolicyName(p.policy)},
          {"reason", p.reason},
          {"replicas", store.num_replicas()},
          {"replica_nodes", p.replica_nodes},
          {"sync_every", p.sync_every},
          {"averagings", store.averagings()}};
}

// One entry per shard of the first replica: its NUMA node and its model version.
json ShardsJson(Job& job) {
  json shards = json::array();
  const StoreLayout& l = job.store().layout();
  for (int s = 0; s < l.num_shards; ++s) {
    shards.push_back({{"index", s}, {"node", l.shard_nodes[s]}, {"version", job.store().shard_version(s)}});
  }
  return shards;
}

// store.huge_pages of the train summary; an unknown value is null.
// Rows the readers left out, by reason: {"train": {...}, "test": {...}, "total": N}.
// Data read from several files adds {"train_files": {file: N}, ...} for the
// files that had skipped rows.
json SkippedJson(const SkippedRows& train, const Dataset* test) {
  json j = {{"train", train.by_reason}, {"total", train.total()}};
  if (!train.by_file.empty()) j["train_files"] = train.by_file;
  if (test != nullptr) {
    j["test"] = test->skipped.by_reason;
    j["total"] = train.total() + test->skipped.total();
    if (!test->skipped.by_file.empty()) j["test_files"] = test->skipped.by_file;
  }
  return j;
}

json HugePagesJson(const HugePageStatus& h) {
  auto text = [](const std::string& v) { return v.empty() ? json(nullptr) : json(v); };
  return {{"requested", h.requested},
          {"shmem_enabled", text(h.shmem_enabled)},
          {"tmpfs_huge", text(h.tmpfs_huge)},
          {"thp_enabled", text(h.thp_enabled)},
          {"granted_bytes", h.granted_bytes ? json(*h.granted_bytes) : json(nullptr)}};
}

}  // namespace

json PackedDataJson(Job& job) {
  const PackedRecords* p = job.packed_train();
  if (p == nullptr || job.num_workers() == 0) return nullptr;
  const Model& model = job.worker(0).model();
  const uint64_t bytes = (p->words.size() + p->start.size()) * sizeof(uint64_t) + p->dense_bytes.size();
  json j = {{"bytes", bytes},
            {"records", p->records},
            {"ids", p->has_ids()},
            {"dense_bytes", p->has_dense_bytes()},
            {"seconds", job.pack_seconds()}};
  if (p->has_ids()) {
    j["layout"] = p->stride_words > 0 ? "slots" : "one_after_another";
    j["slot_bytes"] = p->stride_words * static_cast<int64_t>(sizeof(uint64_t));
    j["records_after_slots"] = p->overflow_blocks;
    j["narrow_ids"] = p->narrow_ids;
    j["label_in_block"] = p->inline_label;
    // Bags of at most one id each in the one-id layout, with the dense
    // values in the block (PackedRecords::kOneIdBags).
    j["one_id_bags"] = p->slot_load == PackedRecords::SlotLoad::kOneIdBags;
    j["dense_in_block"] = p->dense_in_block() && model.dense_dim() > 0;
    json weights = json::array();
    for (int k = 0; k < p->num_bags; ++k) {
      if (!p->weighted[k]) continue;
      const PackedRecords::WeightCode& code = p->weight_codes[k];
      json w = {{"field", model.lookup(model.bag_lookup(k)).field}, {"coded", code.coded()}};
      if (code.coded()) {
        w["decimals"] = code.decimals;
        w["id_bits"] = code.id_bits;
      }
      weights.push_back(w);
    }
    j["weights"] = weights;
  }
  return j;
}

json TrainSummaryJson(const TrainSummary& s, Job& job) {
  // A job that was already complete trained nothing: no throughput and no
  // training loss to report (null), and says so.
  json j = {{"samples_per_s", s.already_complete ? json(nullptr) : json(s.samples_per_s)},
            {"already_complete", s.already_complete},
            {"epochs", s.epochs},
            {"precision", PrecisionName(job.config().model.precision)},
            {"workers", s.workers},
            {"intra_op_threads", s.intra_op_threads},
            {"shards", s.shards},
            {"steps", s.steps},
            {"records_seen", s.records_seen},
            {"eval_records_seen", s.eval_records_seen},
            {"tasks_requeued", s.tasks_requeued},
            {"worker_failures", s.worker_failures},
            {"resumed_from_step", s.resumed_from_step ? json(*s.resumed_from_step) : json(nullptr)},
            {"checkpoints_written", s.checkpoints_written},
            {"checkpoint_write_s", s.checkpoint_write_s},
            {"checkpoint_restore_s", s.checkpoint_restore_s ? json(*s.checkpoint_restore_s) : json(nullptr)},
            {"last_checkpoint", s.last_checkpoint.empty() ? json(nullptr) : json(s.last_checkpoint)},
            {"skipped_checkpoints", s.skipped_checkpoints},
            {"stopped_early_at_epoch",
             s.stopped_early_at_epoch ? json(*s.stopped_early_at_epoch) : json(nullptr)},
            {"train_loss", s.already_complete ? json(nullptr) : json(s.train_loss)},
            {"test_loss", Optional(s.test_loss)},
            {"test_accuracy", Optional(s.test_accuracy)},
            {"wall_s", s.wall_s},
            {"model_version", s.model_version},
            {"store", {{"name", s.store_name}, {"bytes", s.store_bytes}}}};
  if (job.has_local_store()) {
    j["store"]["memory"] = StoreMemoryJson(job.replicas());
    j["store"]["setup_s"] = job.store_setup_seconds();
    j["store"]["replication"] = ReplicationJson(job.replicas());
    j["store"]["shards"] = ShardsJson(job);
    j["store"]["huge_pages"] = HugePagesJson(job.store().huge_pages());
    j["store"]["memory_kind"] = StoreMemoryKindName(job.store().memory_kind());
  }
  json hist = json::array();
  for (const EpochResult& e : s.history) {
    json h = {{"epoch", e.epoch},
              {"records", e.records},
              {"train_loss", e.train_loss},
              {"train_accuracy", e.train_accuracy},
              {"test_loss", Optional(e.test_loss)},
              {"test_accuracy", Optional(e.test_accuracy)},
              {"seconds", e.seconds},
              {"samples_per_s", e.samples_per_s}};
    for (const auto& [name, value] : e.test_metrics) h[name] = value;
    hist.push_back(h);
  }
  j["history"] = hist;
  for (const auto& [name, value] : s.test_metrics) j[name] = value;
  // How the training data was read: loaded whole, or streamed from its
  // columnar cache (data.stream) with the readers' waits and peak bytes.
  j["data_wait_s"] = s.data_wait_s;
  json data = {{"stream", job.stream() != nullptr}, {"load_s", job.data_load_seconds()}};
  if (s.first_task_after_ready_s >= 0) data["first_task_after_ready_s"] = s.first_task_after_ready_s;
  if (s.records_ready_at_first_task >= 0) data["records_ready_at_first_task"] = s.records_ready_at_first_task;
  data["packed"] = PackedDataJson(job);
  if (const ColumnCache* c = job.stream()) {
    const ColumnCacheStats& st = job.stream_stats();
    data["records"] = c->records();
    data["reader_peak_bytes"] = s.reader_peak_bytes;
    data["memory_budget_bytes"] = job.config().data.memory_budget_mb << 20;
    data["cache"] = {{"dirs", c->dirs()},           {"bytes", st.bytes},          {"parts", st.parts},
                     {"files_built", st.files_built}, {"files_cached", st.files_cached}, {"build_s", st.build_s}};
  }
  j["data"] = data;
  const Dataset& train = job.train();
  j["rows_skipped"] = SkippedJson(train.skipped, job.test());
  if (train.tokens > 0 && train.count > 0 && s.workers > 0) {
    j["tokens_per_s_per_worker"] =
        s.samples_per_s * (static_cast<double>(train.tokens) / static_cast<double>(train.count)) / s.workers;
  }
  return j;
}

json EvaluationJson(const CheckpointEvaluation& e, const Dataset& data) {
  json j = {{"checkpoint", e.path}, {"step", e.step},          {"final", e.final},
            {"records", e.result.count}, {"test_loss", e.loss()}, {"test_accuracy", e.accuracy()}};
  for (const auto& [name, value] : ExtraTestMetrics(e.result)) j[name] = value;
  j["rows_skipped"] = SkippedJson(SkippedRows(), &data);
  return j;
}

}  // namespace shardwild
