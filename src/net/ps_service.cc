#include "net/ps_service.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status.h"
#include "net/half.h"
#include "workers/checkpoint.h"

namespace shardwild {

namespace {

// The number of gradient values a push message carries in `encoding`, or an
// error naming `what` when the fields do not fit the encoding.
absl::StatusOr<int64_t> ValueCount(net::Encoding encoding, int floats, const std::string& half, const std::string& what) {
  switch (encoding) {
    case net::ENCODING_FLOAT32:
      if (!half.empty()) return absl::InvalidArgumentError(what + ": 16-bit values with encoding float32");
      return floats;
    case net::ENCODING_BF16:
    case net::ENCODING_FP16:
      if (floats != 0) return absl::InvalidArgumentError(what + ": float32 values with a 16-bit encoding");
      if (half.size() % 2 != 0) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", half.size(), " bytes of 16-bit values (odd)"));
      }
      return static_cast<int64_t>(half.size() / 2);
    default:
      return absl::InvalidArgumentError(absl::StrCat(what, ": unknown encoding ", static_cast<int>(encoding)));
  }
}

// Writes the message's `count` values (ValueCount) as floats to `out`.
void DecodeValues(net::Encoding encoding, const float* floats, const std::string& half, int64_t count, float* out) {
  if (encoding == net::ENCODING_FLOAT32) {
    std::copy(floats, floats + count, out);
    return;
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(half.data());
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t h = static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
    out[i] = encoding == net::ENCODING_BF16 ? Bf16ToFloat(h) : Fp16ToFloat(h);
  }
}

}  // namespace

PsService::PsService(ShmParamStore* store, Options options)
    : store_(store), options_(std::move(options)), open_(!options_.start_closed) {}

absl::Status PsService::CheckOpen(const char* what) const {
  if (open()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(options_.task_name, ": ", what,
                                             ": this ps task (re)started and waits for the chief to reload its "
                                             "shards"));
}

absl::Status PsService::Invalid(const std::string& what) const {
  return absl::InvalidArgumentError(absl::StrCat(options_.task_name, ": ", what));
}

std::string PsService::HostedWhat() const {
  const int first = store_->first_hosted_shard(), n = store_->num_hosted_shards();
  return absl::StrCat("this server hosts shards ", first, "..", first + n - 1, " of ", store_->layout().num_shards);
}

absl::Status PsService::CheckIdHosted(const TableSpec& table, uint64_t id, const std::string& where) const {
  const int shard = ShardOfRowId(table.kind, id, static_cast<uint32_t>(store_->layout().num_shards));
  if (store_->hosts(shard)) return absl::OkStatus();
  return Invalid(absl::StrCat(where, ": id ", id, " of table ", table.name, " lives on shard ", shard,
                              ", which is not hosted here (", HostedWhat(), ")"));
}

void PsService::GetLayout(net::LayoutResponse* out) const {
  const StoreLayout& l = store_->layout();
  out->set_store_name(store_->name());
  out->set_num_shards(l.num_shards);
  for (size_t v = 0; v < l.variables.size(); ++v) {
    net::VariableInfo* info = out->add_variables();
    info->set_name(l.variables[v].name);
    info->set_rows(l.variables[v].rows);
    info->set_cols(l.variables[v].cols);
    for (const RowRange& r : l.parts[v]) {
      net::RowRangeInfo* part = info->add_parts();
      part->set_row_begin(r.begin);
      part->set_row_end(r.end);
    }
  }
  for (int node : l.shard_nodes) out->add_shard_nodes(node);
  for (const TableSpec& t : l.tables) {
    net::TableInfo* info = out->add_tables();
    info->set_name(t.name);
    info->set_dim(t.dim);
    info->set_capacity(t.capacity);
    info->set_dynamic(t.kind == EmbeddingKind::kDynamic);
    info->set_evict_lru(t.on_full == CapacityPolicy::kEvictLru);
  }
  out->set_optimizer(OptimizerTypeName(store_->optimizer().type));
  out->set_sparse_optimizer(OptimizerTypeName(store_->sparse_optimizer().type));
  out->set_update_mode(UpdateModeName(store_->update_mode()));
  out->set_version(store_->version());
  out->set_first_hosted_shard(store_->first_hosted_shard());
  out->set_num_hosted_shards(store_->num_hosted_shards());
}

absl::Status PsService::CheckPull(const net::PullDenseRequest& request) const {
  const StoreLayout& l = store_->layout();
  const int var = request.variable();
  if (var < 0 || var >= static_cast<int>(l.variables.size())) {
    return Invalid(absl::StrCat("pull: unknown variable ", var, " (the store has ", l.variables.size(), ")"));
  }
  const VariableSpec& spec = l.variables[var];
  if (request.row_begin() < 0 || request.row_begin() > request.row_end() || request.row_end() > spec.rows) {
    return Invalid(absl::StrCat("pull: rows [", request.row_begin(), ", ", request.row_end(), ") of ", spec.name,
                   " are not within [0, ", spec.rows, ")"));
  }
  // Checked here, before the first chunk goes out: the store would only say
  // so at the block that leaves the hosted rows.
  const RowRange hosted = store_->hosted_rows(var);
  if (request.row_begin() < request.row_end() &&
      (request.row_begin() < hosted.begin || request.row_end() > hosted.end)) {
    return Invalid(absl::StrCat("pull: rows [", request.row_begin(), ", ", request.row_end(), ") of ", spec.name,
                   " are not hosted here (", HostedWhat(), ": rows [", hosted.begin, ", ", hosted.end, "))"));
  }
  return absl::OkStatus();
}

absl::Status PsService::StreamPull(const net::PullDenseRequest& request, int slice_index, uint64_t version,
                                   const Writer<net::DenseChunk>& write) const {
  const int var = request.variable();
  const VariableSpec& spec = store_->layout().variables[var];
  const int64_t chunk = std::max<int64_t>(1, options_.max_chunk_floats);
  // Pull a block of whole rows at a time (at least one row), then send it in
  // chunks; memory stays at about one chunk whatever the slice's size.
  const int64_t rows_per_block = std::max<int64_t>(1, chunk / spec.cols);
  std::vector<float> block;
  net::DenseChunk msg;
  msg.set_variable(var);
  msg.set_version(version);
  if (slice_index >= 0) msg.set_slice(slice_index);
  int64_t offset = 0;
  bool sent = false;
  for (int64_t r = request.row_begin(); r < request.row_end(); r += rows_per_block) {
    const int64_t n = std::min(rows_per_block, request.row_end() - r);
    if (n * spec.cols <= chunk) {  // the block is one chunk: pulled straight into the message
      google::protobuf::RepeatedField<float>* values = msg.mutable_values();
      values->Resize(static_cast<int>(n * spec.cols), 0.0f);
      const PullSlice direct{var, r, r + n, values->mutable_data()};
      SW_RETURN_IF_ERROR(store_->Pull({&direct, 1}));
      msg.set_offset(offset);
      if (!write(msg)) return absl::CancelledError(absl::StrCat(options_.task_name, ": pull: the client went away"));
      offset += n * spec.cols;
      sent = true;
      continue;
    }
    block.resize(n * spec.cols);
    const PullSlice slice{var, r, r + n, block.data()};
    SW_RETURN_IF_ERROR(store_->Pull({&slice, 1}));
    for (int64_t i = 0; i < static_cast<int64_t>(block.size()); i += chunk) {
      const int64_t m = std::min<int64_t>(chunk, block.size() - i);
      msg.set_offset(offset);
      msg.mutable_values()->Assign(block.data() + i, block.data() + i + m);
      if (!write(msg)) return absl::CancelledError(absl::StrCat(options_.task_name, ": pull: the client went away"));
      offset += m;
      sent = true;
    }
  }
  if (!sent) {  // an empty slice: one empty chunk carrying the version
    msg.set_offset(0);
    msg.clear_values();
    if (!write(msg)) return absl::CancelledError(absl::StrCat(options_.task_name, ": pull: the client went away"));
  }
  return absl::OkStatus();
}

absl::Status PsService::PullDense(const net::PullDenseRequest& request, const Writer<net::DenseChunk>& write) const {
  SW_RETURN_IF_ERROR(CheckOpen("pull"));
  SW_RETURN_IF_ERROR(CheckPull(request));
  return StreamPull(request, -1, store_->version(), write);
}

absl::Status PsService::PullDenseBatch(const net::PullDenseBatchRequest& request,
                                       const Writer<net::DenseChunk>& write) const {
  SW_RETURN_IF_ERROR(CheckOpen("pull"));
  for (const net::PullDenseRequest& slice : request.slices()) SW_RETURN_IF_ERROR(CheckPull(slice));
  const uint64_t version = store_->version();
  for (int i = 0; i < request.slices_size(); ++i) SW_RETURN_IF_ERROR(StreamPull(request.slices(i), i, version, write));
  return absl::OkStatus();
}


absl::Status PsService::PushDense(const Reader<net::PushDenseRequest>& read, net::PushResponse* out) {
  SW_RETURN_IF_ERROR(CheckOpen("push"));
  const StoreLayout& l = store_->layout();
  net::PushDenseRequest msg;
  uint64_t client = 0, sequence = 0;
  float lr = 0;
  // One buffer per variable named, filled in order.
  std::map<int, std::vector<float>> grads;
  std::map<int, int64_t> received;
  int64_t budget = options_.max_push_bytes;
  int64_t count = 0;
  while (read(&msg)) {
    if (count++ == 0) {
      client = msg.client_id();
      sequence = msg.sequence();
      lr = msg.lr();
      if (!std::isfinite(lr)) return Invalid(absl::StrCat("push: the learning rate is ", lr));
    }
    const net::DenseChunk& g = msg.grad();
    const int var = g.variable();
    if (var < 0 || var >= static_cast<int>(l.variables.size())) {
      return Invalid(absl::StrCat("push: unknown variable ", var, " (the store has ", l.variables.size(), ")"));
    }
    const VariableSpec& spec = l.variables[var];
    // The floats of the hosted rows: the one run this server takes.
    const RowRange hosted = store_->hosted_rows(var);
    const int64_t run_begin = hosted.begin * spec.cols, run_end = hosted.end * spec.cols;
    auto it = grads.find(var);
    if (it == grads.end()) {
      if (hosted.size() == 0) {
        return Invalid(absl::StrCat("push: a gradient of ", spec.name, ", which has no rows here (", HostedWhat(), ")"));
      }
      budget -= (run_end - run_begin) * static_cast<int64_t>(sizeof(float));
      if (budget < 0) {
        return Invalid(absl::StrCat("push: more than ", options_.max_push_bytes, " bytes of gradients"));
      }
      // The hosted run only (ShmParamStore::PushHosted).
      it = grads.emplace(var, std::vector<float>(run_end - run_begin)).first;
      received[var] = run_begin;
    }
    int64_t& done = received[var];
    if (g.offset() != done) {
      return Invalid(absl::StrCat("push: the gradient of ", spec.name, " continues at float ", g.offset(),
                                  ", expected ", done, " (chunks of a variable go in order, from float ", run_begin,
                                  ", the first of its hosted rows [", hosted.begin, ", ", hosted.end, "))"));
    }
    absl::StatusOr<int64_t> n = ValueCount(g.encoding(), g.values_size(), g.half_values(),
                                           absl::StrCat("push: the gradient of ", spec.name));
    if (!n.ok()) return Invalid(std::string(n.status().message()));
    if (*n > run_end - done) {
      if (!store_->partial()) {
        return Invalid(absl::StrCat("push: the gradient of ", spec.name, " has more than its ", spec.size(),
                                    " floats (", spec.rows, " x ", spec.cols, ")"));
      }
      return Invalid(absl::StrCat("push: the gradient of ", spec.name, " has more than the ", run_end - run_begin,
                                  " floats of its hosted rows [", hosted.begin, ", ", hosted.end, ") (it runs past float ",
                                  run_end, ")"));
    }
    DecodeValues(g.encoding(), g.values().data(), g.half_values(), *n, it->second.data() + (done - run_begin));
    done += *n;
  }
  if (count == 0) return Invalid("push: the request carries no gradient");
  std::vector<DenseGrad> dense;
  for (const auto& [var, values] : grads) {
    const VariableSpec& spec = l.variables[var];
    const RowRange hosted = store_->hosted_rows(var);
    if (received[var] != hosted.end * spec.cols) {
      if (!store_->partial()) {
        return Invalid(absl::StrCat("push: the gradient of ", spec.name, " has ", received[var], " floats, expected ",
                                    spec.size(), " (", spec.rows, " x ", spec.cols, ")"));
      }
      return Invalid(absl::StrCat("push: the gradient of ", spec.name, " ends at float ", received[var],
                                  ", expected ", hosted.end * spec.cols, " (the end of its hosted rows [", hosted.begin,
                                  ", ", hosted.end, ") of ", spec.rows, " x ", spec.cols, ")"));
    }
    dense.push_back({var, values.data()});
  }
  SW_ASSIGN_OR_RETURN(const bool fresh, BeginPush(client, sequence));
  if (!fresh) {
    out->set_version(store_->version());
    out->set_duplicate(true);
    return absl::OkStatus();
  }
  if (absl::Status s = store_->PushHosted(dense, lr); !s.ok()) {
    AbortPush(client, sequence);
    return s;
  }
  out->set_version(store_->version());
  out->set_duplicate(false);
  return absl::OkStatus();
}

absl::StatusOr<PullMode> PsService::CheckRowPull(const net::PullRowsRequest& request, const std::string& where) const {
  const StoreLayout& l = store_->layout();
  const int t = request.table();
  if (t < 0 || t >= static_cast<int>(l.tables.size())) {
    return Invalid(absl::StrCat(where, ": unknown table ", t, " (the store has ", l.tables.size(), ")"));
  }
  const TableSpec& table = l.tables[t];
  PullMode mode;
  switch (request.mode()) {
    case net::PULL_MODE_INSERT:
      mode = PullMode::kInsert;
      break;
    case net::PULL_MODE_READ_ONLY:
      mode = PullMode::kReadOnly;
      break;
    default:
      return Invalid(absl::StrCat(where, ": unknown mode ", static_cast<int>(request.mode())));
  }
  const auto& ids = request.ids();
  for (int i = 0; i < ids.size(); ++i) {
    const uint64_t id = ids[i];
    if (table.kind == EmbeddingKind::kStatic ? id >= static_cast<uint64_t>(table.capacity)
                                             : id == std::numeric_limits<uint64_t>::max()) {
      return Invalid(absl::StrCat(where, ": id ", id, " (item ", i, ") is not a row of table ", table.name,
                                  table.kind == EmbeddingKind::kStatic
                                      ? absl::StrCat(" (ids are in [0, ", table.capacity, "))")
                                      : std::string(" (2^64-1 is reserved)")));
    }
    SW_RETURN_IF_ERROR(CheckIdHosted(table, id, absl::StrCat(where, ": item ", i)));
  }
  return mode;
}

absl::Status PsService::StreamRows(const net::PullRowsRequest& request, PullMode mode, int part, uint64_t version,
                                   const Writer<net::RowsChunk>& write) const {
  const int t = request.table();
  const int64_t dim = store_->layout().tables[t].dim;
  const auto& ids = request.ids();
  const int64_t chunk = std::max<int64_t>(1, options_.max_chunk_floats);
  const int64_t ids_per_block = std::max<int64_t>(1, chunk / dim);
  RowScratch scratch;
  std::vector<float> block;
  net::RowsChunk msg;
  msg.set_version(version);
  msg.set_part(part);
  int64_t offset = 0;
  bool sent = false;
  for (int64_t i = 0; i < ids.size(); i += ids_per_block) {
    const int64_t n = std::min<int64_t>(ids_per_block, ids.size() - i);
    const absl::Span<const uint64_t> block_ids(ids.data() + i, static_cast<size_t>(n));
    if (n * dim <= chunk) {  // the block is one chunk: pulled straight into the message
      google::protobuf::RepeatedField<float>* values = msg.mutable_values();
      values->Resize(static_cast<int>(n * dim), 0.0f);
      SW_RETURN_IF_ERROR(store_->PullRows(t, block_ids, values->mutable_data(), mode, &scratch));
      msg.set_offset(offset);
      if (!write(msg)) return absl::CancelledError(absl::StrCat(options_.task_name, ": pull rows: the client went away"));
      offset += n * dim;
      sent = true;
      continue;
    }
    block.resize(n * dim);
    SW_RETURN_IF_ERROR(store_->PullRows(t, block_ids, block.data(), mode, &scratch));
    for (int64_t j = 0; j < static_cast<int64_t>(block.size()); j += chunk) {
      const int64_t m = std::min<int64_t>(chunk, block.size() - j);
      msg.set_offset(offset);
      msg.mutable_values()->Assign(block.data() + j, block.data() + j + m);
      if (!write(msg)) return absl::CancelledError(absl::StrCat(options_.task_name, ": pull rows: the client went away"));
      offset += m;
      sent = true;
    }
  }
  if (!sent) {  // no ids: one empty chunk carrying the version
    msg.set_offset(0);
    msg.clear_values();
    if (!write(msg)) return absl::CancelledError(absl::StrCat(options_.task_name, ": pull rows: the client went away"));
  }
  return absl::OkStatus();
}

absl::Status PsService::PullRowsBatch(const net::PullRowsBatchRequest& request,
                                      const Writer<net::RowsChunk>& write) const {
  SW_RETURN_IF_ERROR(CheckOpen("pull rows"));
  std::vector<PullMode> modes;
  modes.reserve(request.parts_size());
  for (int i = 0; i < request.parts_size(); ++i) {
    SW_ASSIGN_OR_RETURN(const PullMode mode, CheckRowPull(request.parts(i), absl::StrCat("pull rows: part ", i)));
    modes.push_back(mode);
  }
  const uint64_t version = store_->version();
  for (int i = 0; i < request.parts_size(); ++i) {
    SW_RETURN_IF_ERROR(StreamRows(request.parts(i), modes[i], i, version, write));
  }
  return absl::OkStatus();
}

absl::Status PsService::ReadRowPush(const Reader<net::PushRowsRequest>& read, RowPushRequest* out) const {
  const StoreLayout& l = store_->layout();
  net::PushRowsRequest msg;
  int64_t bytes = 0;
  int64_t count = 0;
  const TableSpec* table = nullptr;
  while (read(&msg)) {
    if (count == 0) {
      out->client = msg.client_id();
      out->sequence = msg.sequence();
      out->lr = msg.lr();
      if (!std::isfinite(out->lr)) return Invalid(absl::StrCat("push rows: the learning rate is ", out->lr));
    }
    // A new part starts with the first message, and with each message
    // naming a later part; its table is read from that message.
    const bool starts = count == 0 || msg.part() != out->parts.back().part;
    if (count > 0 && msg.part() < out->parts.back().part) {
      return Invalid(absl::StrCat("push rows: message ", count, " is of part ", msg.part(), " after part ",
                                  out->parts.back().part, " (parts go in increasing order)"));
    }
    if (starts) {
      const int t = msg.table();
      if (t < 0 || t >= static_cast<int>(l.tables.size())) {
        return Invalid(absl::StrCat("push rows: unknown table ", t, " (the store has ", l.tables.size(), ")"));
      }
      table = &l.tables[t];
      // Each part costs its bookkeeping too, so empty messages cannot grow
      // the request without bound.
      bytes += 64;
      out->parts.push_back({msg.part(), t, {}, {}});
    } else if (msg.table() != out->parts.back().table) {
      return Invalid(absl::StrCat("push rows: message ", count, " of part ", msg.part(), " names table ", msg.table(),
                                  ", the part's first message names ", out->parts.back().table));
    }
    RowPushPart& part = out->parts.back();
    const int64_t n = msg.ids_size();
    absl::StatusOr<int64_t> values = ValueCount(msg.encoding(), msg.grads_size(), msg.half_grads(),
                                                absl::StrCat("push rows: message ", count));
    if (!values.ok()) return Invalid(std::string(values.status().message()));
    if (*values != n * table->dim) {
      return Invalid(absl::StrCat("push rows: message ", count, ": ", n, " ids of table ", table->name, " need ", n,
                                  " x ", table->dim, " = ", n * table->dim, " gradient floats, got ", *values));
    }
    bytes += n * static_cast<int64_t>(sizeof(uint64_t) + table->dim * sizeof(float));
    if (bytes > options_.max_push_bytes) {
      return Invalid(absl::StrCat("push rows: more than ", options_.max_push_bytes, " bytes of ids and gradients"));
    }
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t id = msg.ids(i);
      if (table->kind == EmbeddingKind::kStatic ? id >= static_cast<uint64_t>(table->capacity)
                                                : id == std::numeric_limits<uint64_t>::max()) {
        return Invalid(absl::StrCat("push rows: id ", id, " (message ", count, ", item ", i,
                                    ") is not a row of table ", table->name,
                                    table->kind == EmbeddingKind::kStatic
                                        ? absl::StrCat(" (ids are in [0, ", table->capacity, "))")
                                        : std::string(" (2^64-1 is reserved)")));
      }
      SW_RETURN_IF_ERROR(CheckIdHosted(*table, id, absl::StrCat("push rows: message ", count, ", item ", i)));
    }
    part.ids.insert(part.ids.end(), msg.ids().begin(), msg.ids().end());
    const size_t at = part.grads.size();
    part.grads.resize(at + *values);
    DecodeValues(msg.encoding(), msg.grads().data(), msg.half_grads(), *values, part.grads.data() + at);
    ++count;
  }
  if (count == 0) return Invalid("push rows: the request carries no message");
  return absl::OkStatus();
}

absl::Status PsService::ApplyRowPush(const RowPushRequest& request, net::PushResponse* out) {
  SW_ASSIGN_OR_RETURN(const bool fresh, BeginPush(request.client, request.sequence));
  if (!fresh) {
    out->set_version(store_->version());
    out->set_duplicate(true);
    return absl::OkStatus();
  }
  RowScratch scratch;
  for (const RowPushPart& part : request.parts) {
    if (part.ids.empty()) continue;
    if (absl::Status s = store_->PushRows(part.table, part.ids, part.grads.data(), request.lr, &scratch); !s.ok()) {
      AbortPush(request.client, request.sequence);
      return s;
    }
  }
  out->set_version(store_->version());
  out->set_duplicate(false);
  return absl::OkStatus();
}

absl::Status PsService::PushRowsBatch(const Reader<net::PushRowsRequest>& read, net::PushResponse* out) {
  SW_RETURN_IF_ERROR(CheckOpen("push rows"));
  RowPushRequest request;
  SW_RETURN_IF_ERROR(ReadRowPush(read, &request));
  return ApplyRowPush(request, out);
}

absl::Status PsService::SaveShard(const net::SaveShardRequest& request, net::SaveShardResponse* out) {
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(options_.task_name, ": save: this server has no checkpoint directory"));
  }
  if (request.step() < 0) return Invalid(absl::StrCat("save: step must be >= 0, got ", request.step()));
  if (!open()) {
    return absl::FailedPreconditionError(absl::StrCat(
        options_.task_name, ": save: this ps task (re)started and its shards were not reloaded yet"));
  }
  MutexLock lock(&checkpoint_mu_);
  CheckpointState state;
  state.step = request.step();
  CheckpointWriteOptions write;
  write.keep = options_.checkpoint_keep;
  SW_ASSIGN_OR_RETURN(const std::string path, WriteCheckpoint(options_.checkpoint_dir, *store_, state, write));
  out->set_path(path);
  out->set_version(store_->version());
  return absl::OkStatus();
}

void PsService::JobDone(const net::JobDoneRequest& request, net::JobDoneResponse* out) {
  out->set_exiting(options_.exit_when_done);
  if (options_.exit_when_done) job_done_.store(true, std::memory_order_release);
}

absl::Status PsService::RestoreShard(const net::RestoreShardRequest& request, net::RestoreShardResponse* out) {
  if (request.as_is()) {
    if (request.latest() || request.step() != 0) return Invalid("restore: as_is names no checkpoint");
    MutexLock lock(&checkpoint_mu_);
    open_.store(true, std::memory_order_release);
    out->set_step(-1);
    out->set_version(store_->version());
    return absl::OkStatus();
  }
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(options_.task_name, ": restore: this server has no checkpoint directory"));
  }
  if (!request.latest() && request.step() < 0) {
    return Invalid(absl::StrCat("restore: step must be >= 0, got ", request.step()));
  }
  MutexLock lock(&checkpoint_mu_);
  CheckpointInfo info;
  if (request.latest()) {
    SW_ASSIGN_OR_RETURN(std::optional<CheckpointInfo> latest, FindLatestCheckpoint(options_.checkpoint_dir));
    if (!latest) {
      return absl::NotFoundError(
          absl::StrCat(options_.task_name, ": restore: no checkpoint in ", options_.checkpoint_dir));
    }
    info = std::move(*latest);
  } else {
    SW_ASSIGN_OR_RETURN(info, VerifyCheckpoint(absl::StrCat(options_.checkpoint_dir, "/ckpt-", request.step())));
  }
  SW_RETURN_IF_ERROR(RestoreCheckpoint(info, *store_));
  open_.store(true, std::memory_order_release);
  out->set_path(info.path);
  out->set_step(info.step);
  out->set_version(store_->version());
  return absl::OkStatus();
}

absl::StatusOr<bool> PsService::BeginPush(uint64_t client, uint64_t sequence) {
  MutexLock lock(&mu_);
  if (client == 0) {
    ++pushes_applied_;
    return true;
  }
  auto it = clients_.find(client);
  if (it == clients_.end()) {
    if (clients_.size() >= kMaxClients) {
      auto idle = std::min_element(clients_.begin(), clients_.end(), [](const auto& a, const auto& b) {
        return a.second.last_use < b.second.last_use;
      });
      clients_.erase(idle);
    }
    it = clients_.emplace(client, ClientPushes{}).first;
  }
  ClientPushes& c = it->second;
  c.last_use = ++tick_;
  if (c.sequences.count(sequence)) {
    ++pushes_deduplicated_;
    return false;
  }
  if (c.sequences.size() >= kSequencesPerClient && sequence < *c.sequences.begin()) {
    return absl::FailedPreconditionError(absl::StrCat(options_.task_name, ": push sequence ", sequence,
                                                      " of this client is too old to tell whether it was applied"));
  }
  c.sequences.insert(sequence);
  if (c.sequences.size() > kSequencesPerClient) c.sequences.erase(c.sequences.begin());
  ++pushes_applied_;
  return true;
}

void PsService::AbortPush(uint64_t client, uint64_t sequence) {
  MutexLock lock(&mu_);
  --pushes_applied_;
  if (client == 0) return;
  auto it = clients_.find(client);
  if (it != clients_.end()) it->second.sequences.erase(sequence);
}

uint64_t PsService::pushes_applied() const {
  MutexLock lock(&mu_);
  return pushes_applied_;
}

uint64_t PsService::pushes_deduplicated() const {
  MutexLock lock(&mu_);
  return pushes_deduplicated_;
}

}  // namespace shardwild
