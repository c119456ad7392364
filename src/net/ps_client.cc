#include "net/ps_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <random>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"
#include "net/grpc_util.h"
#include "net/half.h"
#include "net/health.grpc.pb.h"
#include "net/ps.grpc.pb.h"

namespace shardwild {
namespace {

using Clock = std::chrono::steady_clock;

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    default:
      return "error";
  }
}

net::Encoding EncodingOf(GradientCompression c) {
  switch (c) {
    case GradientCompression::kBf16:
      return net::ENCODING_BF16;
    case GradientCompression::kFp16:
      return net::ENCODING_FP16;
    case GradientCompression::kNone:
      break;
  }
  return net::ENCODING_FLOAT32;
}

// `n` floats as 16-bit values, little-endian, into *out.
void EncodeHalf(net::Encoding encoding, const float* values, int64_t n, std::string* out) {
  out->resize(2 * n);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = encoding == net::ENCODING_BF16 ? FloatToBf16(values[i]) : FloatToFp16(values[i]);
    (*out)[2 * i] = static_cast<char>(h & 0xff);
    (*out)[2 * i + 1] = static_cast<char>(h >> 8);
  }
}

// The rows of `ids` (gradients `grads`, `dim` floats each) with repeated ids
// summed in batch order: each row goes over the wire once.
void SumRepeated(absl::Span<const uint64_t> ids, absl::Span<const float> grads, int64_t dim,
                 std::vector<uint64_t>* unique, std::vector<float>* summed) {
  std::unordered_map<uint64_t, size_t> slot;
  slot.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, fresh] = slot.emplace(ids[i], unique->size());
    const float* g = grads.data() + i * dim;
    if (fresh) {
      unique->push_back(ids[i]);
      summed->insert(summed->end(), g, g + dim);
    } else {
      float* row = summed->data() + it->second * dim;
      for (int64_t k = 0; k < dim; ++k) row[k] += g[k];
    }
  }
}

uint64_t RandomClientId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return id;
}

}  // namespace

class PsClient::Impl {
 public:
  explicit Impl(const PsClientOptions& options)
      : options_(options),
        chunk_floats_((options.max_message_bytes - 1024) / int64_t{sizeof(float)}),
        encoding_(EncodingOf(options.compression)),
        // Pushed values per message: 4 or 2 bytes each.
        push_chunk_(encoding_ == net::ENCODING_FLOAT32 ? chunk_floats_ : (options.max_message_bytes - 1024) / 2),
        client_id_(RandomClientId()) {
    channel_ = MakeChannel(options);
    stub_ = net::ParameterServer::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
  }

  // Runs `attempt` with a fresh context (deadline, token) until it succeeds,
  // fails with a code that is not retried, or max_attempts are spent.
  absl::Status Call(const std::function<grpc::Status(grpc::ClientContext*)>& attempt) {
    const Clock::time_point start = Clock::now();
    double backoff = options_.initial_backoff_s;
    grpc::Status last;
    int attempts = 0;
    while (true) {
      grpc::ClientContext context;
      PrepareContext(options_, &context);
      last = attempt(&context);
      ++attempts;
      if (last.ok()) return absl::OkStatus();
      const bool retry = last.error_code() == grpc::StatusCode::UNAVAILABLE ||
                         last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      if (!retry) return Convert(last);
      if (attempts >= options_.max_attempts) break;
      BackOff(*channel_, backoff);
      backoff = NextBackoff(last.error_code(), backoff, options_);
    }
    const double spent = SecondsSince(start);
    return absl::UnavailableError(absl::StrFormat("%s (%s) is unavailable: %d attempt%s in %.1f s, last: %s: %s",
                                                  options_.task_name, options_.address, attempts,
                                                  attempts == 1 ? "" : "s", spent, CodeName(last.error_code()),
                                                  last.error_message()));
  }

  // A non-retried error, with the task's name in front unless the server
  // already put it there.
  absl::Status Convert(const grpc::Status& s) const {
    std::string message = s.error_message();
    if (!absl::StartsWith(message, absl::StrCat(options_.task_name, ":"))) {
      message = absl::StrCat(options_.task_name, " (", options_.address, "): ", message);
    }
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), message);
  }

  // An answer that does not fit what was asked (not retried).
  grpc::Status Mismatch(grpc::ClientContext* context, const std::string& what) {
    context->TryCancel();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat(options_.task_name, ": ", what));
  }

  // A row push of `parts` in one PushRowsBatch stream (every message names
  // its part and table; parts without ids are left out).
  absl::StatusOr<uint64_t> PushRowParts(absl::Span<const RemoteRowPush> parts, float lr) {
    const std::string& task = options_.task_name;
    struct Part {
      int index = 0;
      int table = 0;
      int64_t dim = 0;
      std::vector<uint64_t> ids;  // unique, in batch order
      std::vector<float> grads;   // summed
      int64_t rows_per_message = 1;
    };
    std::vector<Part> sent;
    for (size_t k = 0; k < parts.size(); ++k) {
      const RemoteRowPush& p = parts[k];
      auto bad = [&](auto... what) {
        return absl::InvalidArgumentError(absl::StrCat(task, ": push rows: part ", k, ": ", what...));
      };
      Part part;
      part.index = static_cast<int>(k);
      part.table = p.table;
      if (!p.ids.empty()) {
        if (p.grads.size() % p.ids.size() != 0 || p.grads.empty()) {
          return bad(p.grads.size(), " gradient floats are not a whole row for each of ", p.ids.size(), " ids");
        }
        part.dim = static_cast<int64_t>(p.grads.size() / p.ids.size());
      } else if (!p.grads.empty()) {
        return bad("gradients without ids");
      }
      if (p.ids.empty()) continue;
      SumRepeated(p.ids, p.grads, part.dim, &part.ids, &part.grads);
      const int64_t row_bytes = 10 + (encoding_ == net::ENCODING_FLOAT32 ? 4 : 2) * part.dim;
      part.rows_per_message = (options_.max_message_bytes - 1024) / std::max<int64_t>(1, row_bytes);
      if (part.rows_per_message < 1) {
        return bad("a row of ", part.dim, " floats does not fit in cluster.max_message_bytes = ",
                   options_.max_message_bytes);
      }
      sent.push_back(std::move(part));
    }
    if (sent.empty()) {
      if (parts.empty()) return absl::InvalidArgumentError(absl::StrCat(task, ": push rows: no parts"));
      Part empty;  // one message without rows: the server answers the version
      empty.table = parts[0].table;
      sent.push_back(std::move(empty));
    }
    int64_t messages = 0;
    for (const Part& part : sent) {
      messages += std::max<int64_t>(1, (static_cast<int64_t>(part.ids.size()) + part.rows_per_message - 1) /
                                           part.rows_per_message);
    }
    const uint64_t sequence = next_sequence_.fetch_add(1, std::memory_order_relaxed);
    net::PushResponse response;
    SW_RETURN_IF_ERROR(Call([&](grpc::ClientContext* c) {
      response.Clear();
      std::unique_ptr<grpc::ClientWriter<net::PushRowsRequest>> writer = stub_->PushRowsBatch(c, &response);
      net::PushRowsRequest msg;
      bool open = true;
      bool first = true;
      // Every message but the last is written with a buffer hint, so a push
      // of many small parts leaves in few frames.
      int64_t left = messages;
      for (const Part& part : sent) {
        const int64_t size = static_cast<int64_t>(part.ids.size());
        int64_t begin = 0;
        do {
          const int64_t n = std::min<int64_t>(part.rows_per_message, size - begin);
          msg.Clear();
          if (first) {
            msg.set_client_id(client_id_);
            msg.set_sequence(sequence);
            msg.set_lr(lr);
            first = false;
          }
          msg.set_table(part.table);
          msg.set_part(part.index);
          msg.mutable_ids()->Assign(part.ids.begin() + begin, part.ids.begin() + begin + n);
          if (encoding_ == net::ENCODING_FLOAT32) {
            msg.mutable_grads()->Assign(part.grads.begin() + begin * part.dim,
                                        part.grads.begin() + (begin + n) * part.dim);
          } else {
            msg.set_encoding(encoding_);
            EncodeHalf(encoding_, part.grads.data() + begin * part.dim, n * part.dim, msg.mutable_half_grads());
          }
          Sent(msg);
          open = writer->Write(msg, --left > 0 ? grpc::WriteOptions().set_buffer_hint() : grpc::WriteOptions());
          begin += n;
        } while (open && begin < size);
        if (!open) break;
      }
      if (open) writer->WritesDone();
      return writer->Finish();
    }));
    return response.version();
  }

  // Counts a message that went out or came in (PsClient::Stats).
  void Sent(const google::protobuf::Message& m) { bytes_sent_.fetch_add(m.ByteSizeLong(), std::memory_order_relaxed); }
  void Received(const google::protobuf::Message& m) {
    bytes_received_.fetch_add(m.ByteSizeLong(), std::memory_order_relaxed);
  }

  const PsClientOptions options_;
  const int64_t chunk_floats_;
  const net::Encoding encoding_;
  const int64_t push_chunk_;
  const uint64_t client_id_;
  // Counters only, relaxed (they order nothing).
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> next_sequence_{1};
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<net::ParameterServer::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(const PsClientOptions& options) {
  SW_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<PsClient>(new PsClient(std::make_unique<Impl>(options)));
}

PsClient::PsClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PsClient::~PsClient() = default;

const PsClientOptions& PsClient::options() const { return impl_->options_; }

absl::StatusOr<RemoteLayout> PsClient::GetLayout() {
  net::LayoutResponse r;
  SW_RETURN_IF_ERROR(impl_->Call([&](grpc::ClientContext* c) {
    r.Clear();
    return impl_->stub_->GetLayout(c, net::LayoutRequest(), &r);
  }));
  RemoteLayout l;
  l.store_name = r.store_name();
  l.layout.num_shards = r.num_shards();
  for (const net::VariableInfo& v : r.variables()) {
    VariableSpec spec;
    spec.name = v.name();
    spec.rows = v.rows();
    spec.cols = v.cols();
    l.layout.variables.push_back(spec);
    std::vector<RowRange> parts;
    for (const net::RowRangeInfo& p : v.parts()) parts.push_back({p.row_begin(), p.row_end()});
    l.layout.parts.push_back(std::move(parts));
  }
  l.layout.shard_nodes.assign(r.shard_nodes().begin(), r.shard_nodes().end());
  for (const net::TableInfo& t : r.tables()) {
    TableSpec spec;
    spec.name = t.name();
    spec.kind = t.dynamic() ? EmbeddingKind::kDynamic : EmbeddingKind::kStatic;
    spec.dim = t.dim();
    spec.capacity = t.capacity();
    spec.on_full = t.evict_lru() ? CapacityPolicy::kEvictLru : CapacityPolicy::kError;
    l.layout.tables.push_back(spec);
  }
  l.optimizer = r.optimizer();
  l.sparse_optimizer = r.sparse_optimizer();
  l.update_mode = r.update_mode();
  l.version = r.version();
  l.first_hosted_shard = r.num_hosted_shards() == 0 ? 0 : r.first_hosted_shard();
  l.num_hosted_shards = r.num_hosted_shards() == 0 ? r.num_shards() : r.num_hosted_shards();
  return l;
}

absl::Status PsClient::PullDense(int var, int64_t row_begin, int64_t row_end, absl::Span<float> out,
                                 uint64_t* version) {
  net::PullDenseRequest request;
  request.set_variable(var);
  request.set_row_begin(row_begin);
  request.set_row_end(row_end);
  return impl_->Call([&](grpc::ClientContext* c) {
    std::unique_ptr<grpc::ClientReader<net::DenseChunk>> reader = impl_->stub_->PullDense(c, request);
    net::DenseChunk chunk;
    int64_t received = 0;
    while (reader->Read(&chunk)) {
      if (chunk.offset() != received || chunk.values_size() > static_cast<int64_t>(out.size()) - received) {
        grpc::Status s = impl_->Mismatch(
            c, absl::StrCat("pull of variable ", var, " rows [", row_begin, ", ", row_end, "): the answer has floats ",
                            chunk.offset(), "..", chunk.offset() + chunk.values_size(), " but `out` holds ",
                            out.size()));
        reader->Finish();
        return s;
      }
      std::copy(chunk.values().begin(), chunk.values().end(), out.begin() + received);
      received += chunk.values_size();
      impl_->Received(chunk);
      if (version != nullptr) *version = chunk.version();
    }
    grpc::Status s = reader->Finish();
    if (s.ok() && received != static_cast<int64_t>(out.size())) {
      return impl_->Mismatch(c, absl::StrCat("pull of variable ", var, " rows [", row_begin, ", ", row_end,
                                             "): the answer has ", received, " floats but `out` holds ", out.size()));
    }
    return s;
  });
}

absl::Status PsClient::PullDenseBatch(absl::Span<const RemotePullSlice> slices, uint64_t* version) {
  net::PullDenseBatchRequest request;
  for (const RemotePullSlice& sl : slices) {
    net::PullDenseRequest* r = request.add_slices();
    r->set_variable(sl.var);
    r->set_row_begin(sl.row_begin);
    r->set_row_end(sl.row_end);
  }
  return impl_->Call([&](grpc::ClientContext* c) {
    std::unique_ptr<grpc::ClientReader<net::DenseChunk>> reader = impl_->stub_->PullDenseBatch(c, request);
    std::vector<int64_t> received(slices.size(), 0);
    net::DenseChunk chunk;
    int last = -1;
    while (reader->Read(&chunk)) {
      const int i = chunk.slice();
      if (i < last || i >= static_cast<int>(slices.size()) || chunk.offset() != received[i] ||
          chunk.values_size() > static_cast<int64_t>(slices[i].out.size()) - received[i]) {
        grpc::Status s = impl_->Mismatch(c, absl::StrCat("batch pull: an answer chunk of slice ", i, " at float ",
                                                         chunk.offset(), " does not fit the request"));
        reader->Finish();
        return s;
      }
      last = i;
      std::copy(chunk.values().begin(), chunk.values().end(), slices[i].out.begin() + received[i]);
      received[i] += chunk.values_size();
      impl_->Received(chunk);
      if (version != nullptr) *version = chunk.version();
    }
    grpc::Status s = reader->Finish();
    for (size_t i = 0; s.ok() && i < slices.size(); ++i) {
      if (received[i] != static_cast<int64_t>(slices[i].out.size())) {
        return impl_->Mismatch(c, absl::StrCat("batch pull: slice ", i, " got ", received[i], " floats, not ",
                                               slices[i].out.size()));
      }
    }
    return s;
  });
}

absl::StatusOr<uint64_t> PsClient::PushDense(absl::Span<const RemoteDenseGrad> grads, float lr) {
  const uint64_t sequence = impl_->next_sequence_.fetch_add(1, std::memory_order_relaxed);
  net::PushResponse response;
  SW_RETURN_IF_ERROR(impl_->Call([&](grpc::ClientContext* c) {
    response.Clear();
    std::unique_ptr<grpc::ClientWriter<net::PushDenseRequest>> writer = impl_->stub_->PushDense(c, &response);
    net::PushDenseRequest msg;
    bool first = true;
    bool open = true;
    const int64_t step = std::max<int64_t>(1, impl_->push_chunk_);
    // Messages in all; every one but the last is written with a buffer hint,
    // so a push of many small variables leaves in few frames.
    int64_t left = 0;
    for (const RemoteDenseGrad& g : grads) {
      left += std::max<int64_t>(1, (static_cast<int64_t>(g.grad.size()) + step - 1) / step);
    }
    for (const RemoteDenseGrad& g : grads) {
      const int64_t n = static_cast<int64_t>(g.grad.size());
      for (int64_t i = 0; open && (i < n || (n == 0 && i == 0)); i += step) {
        msg.Clear();
        if (first) {
          msg.set_client_id(impl_->client_id_);
          msg.set_sequence(sequence);
          msg.set_lr(lr);
          first = false;
        }
        const int64_t m = std::min(step, n - i);
        net::DenseChunk* chunk = msg.mutable_grad();
        chunk->set_variable(g.var);
        chunk->set_offset(g.offset + i);
        if (impl_->encoding_ == net::ENCODING_FLOAT32) {
          chunk->mutable_values()->Assign(g.grad.data() + i, g.grad.data() + i + m);
        } else {
          chunk->set_encoding(impl_->encoding_);
          EncodeHalf(impl_->encoding_, g.grad.data() + i, m, chunk->mutable_half_values());
        }
        impl_->Sent(msg);
        open = writer->Write(msg, --left > 0 ? grpc::WriteOptions().set_buffer_hint() : grpc::WriteOptions());
      }
    }
    if (open) writer->WritesDone();
    return writer->Finish();
  }));
  return response.version();
}

absl::Status PsClient::PullRows(int table, absl::Span<const uint64_t> ids, absl::Span<float> out, PullMode mode) {
  const RemoteRowPull part{table, ids, out};
  return PullRowsBatch({&part, 1}, mode);
}

absl::StatusOr<uint64_t> PsClient::PushRows(int table, absl::Span<const uint64_t> ids, absl::Span<const float> grads,
                                            float lr) {
  const RemoteRowPush part{table, ids, grads};
  return impl_->PushRowParts({&part, 1}, lr);
}

absl::StatusOr<uint64_t> PsClient::PushRowsBatch(absl::Span<const RemoteRowPush> parts, float lr) {
  return impl_->PushRowParts(parts, lr);
}

absl::Status PsClient::PullRowsBatch(absl::Span<const RemoteRowPull> parts, PullMode mode) {
  const std::string& task = impl_->options_.task_name;
  std::vector<int64_t> dims(parts.size(), 0);
  for (size_t k = 0; k < parts.size(); ++k) {
    const RemoteRowPull& p = parts[k];
    if (p.ids.empty()) {
      if (!p.out.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(task, ": pull rows: part ", k, ": no ids but `out` holds ", p.out.size(), " floats"));
      }
      continue;
    }
    if (p.out.size() % p.ids.size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(task, ": pull rows: part ", k, ": `out` holds ", p.out.size(),
                                                     " floats, not a multiple of the ", p.ids.size(), " ids"));
    }
    dims[k] = static_cast<int64_t>(p.out.size() / p.ids.size());
  }
  const net::PullMode wire_mode = mode == PullMode::kInsert ? net::PULL_MODE_INSERT : net::PULL_MODE_READ_ONLY;
  // Requests of at most about max_message_bytes: an id takes at most 10
  // bytes, a part's header at most 32. A part too large for one request is
  // split over several.
  const int64_t budget = std::max<int64_t>(64, impl_->options_.max_message_bytes - 1024);
  struct Piece {
    size_t part = 0;
    int64_t begin = 0;  // ids [begin, begin + n) of the part
    int64_t n = 0;
  };
  size_t next_part = 0;
  int64_t next_id = 0;
  std::vector<Piece> pieces;
  while (true) {
    net::PullRowsBatchRequest request;
    pieces.clear();
    int64_t room = budget;
    while (next_part < parts.size() && room > 32 + 10) {
      const int64_t size = static_cast<int64_t>(parts[next_part].ids.size());
      if (next_id >= size) {
        ++next_part;
        next_id = 0;
        continue;
      }
      const int64_t n = std::min<int64_t>((room - 32) / 10, size - next_id);
      net::PullRowsRequest* r = request.add_parts();
      r->set_table(parts[next_part].table);
      r->set_mode(wire_mode);
      r->mutable_ids()->Assign(parts[next_part].ids.begin() + next_id, parts[next_part].ids.begin() + next_id + n);
      pieces.push_back({next_part, next_id, n});
      next_id += n;
      room -= 32 + 10 * n;
    }
    if (pieces.empty()) break;
    SW_RETURN_IF_ERROR(impl_->Call([&](grpc::ClientContext* c) {
      std::unique_ptr<grpc::ClientReader<net::RowsChunk>> reader = impl_->stub_->PullRowsBatch(c, request);
      std::vector<int64_t> received(pieces.size(), 0);
      net::RowsChunk chunk;
      int last = -1;
      while (reader->Read(&chunk)) {
        const int i = chunk.part();
        const bool known = i >= 0 && i >= last && i < static_cast<int>(pieces.size());
        const int64_t expected = known ? pieces[i].n * dims[pieces[i].part] : 0;
        if (!known || chunk.offset() != received[i] || chunk.values_size() > expected - received[i]) {
          grpc::Status s = impl_->Mismatch(c, absl::StrCat("batch pull rows: an answer chunk of part ", i,
                                                           " at float ", chunk.offset(), " does not fit the request"));
          reader->Finish();
          return s;
        }
        last = i;
        const Piece& piece = pieces[i];
        std::copy(chunk.values().begin(), chunk.values().end(),
                  parts[piece.part].out.begin() + piece.begin * dims[piece.part] + received[i]);
        received[i] += chunk.values_size();
        impl_->Received(chunk);
      }
      grpc::Status s = reader->Finish();
      for (size_t i = 0; s.ok() && i < pieces.size(); ++i) {
        const int64_t expected = pieces[i].n * dims[pieces[i].part];
        if (received[i] != expected) {
          return impl_->Mismatch(c, absl::StrCat("batch pull rows: part ", pieces[i].part, " (table ",
                                                 parts[pieces[i].part].table, ") got ", received[i], " floats, not ",
                                                 expected, " (is dim right?)"));
        }
      }
      return s;
    }));
  }
  return absl::OkStatus();
}

PsClient::Stats PsClient::stats() const {
  return {impl_->bytes_sent_.load(std::memory_order_relaxed), impl_->bytes_received_.load(std::memory_order_relaxed)};
}

absl::StatusOr<uint64_t> PsClient::Version() {
  net::VersionResponse r;
  SW_RETURN_IF_ERROR(impl_->Call(
      [&](grpc::ClientContext* c) { return impl_->stub_->Version(c, net::VersionRequest(), &r); }));
  return r.version();
}

absl::StatusOr<std::string> PsClient::SaveShard(int64_t step) {
  net::SaveShardRequest request;
  request.set_step(step);
  net::SaveShardResponse r;
  SW_RETURN_IF_ERROR(impl_->Call([&](grpc::ClientContext* c) { return impl_->stub_->SaveShard(c, request, &r); }));
  return r.path();
}

absl::StatusOr<int64_t> PsClient::RestoreShard(std::optional<int64_t> step) {
  net::RestoreShardRequest request;
  request.set_latest(!step.has_value());
  request.set_step(step.value_or(0));
  net::RestoreShardResponse r;
  SW_RETURN_IF_ERROR(
      impl_->Call([&](grpc::ClientContext* c) { return impl_->stub_->RestoreShard(c, request, &r); }));
  return r.step();
}

absl::Status PsClient::Open() {
  net::RestoreShardRequest request;
  request.set_as_is(true);
  net::RestoreShardResponse r;
  return impl_->Call([&](grpc::ClientContext* c) { return impl_->stub_->RestoreShard(c, request, &r); });
}

absl::StatusOr<bool> PsClient::JobDone(const std::string& from) {
  net::JobDoneRequest request;
  request.set_from(from);
  net::JobDoneResponse r;
  SW_RETURN_IF_ERROR(impl_->Call([&](grpc::ClientContext* c) { return impl_->stub_->JobDone(c, request, &r); }));
  return r.exiting();
}

absl::StatusOr<bool> PsClient::Healthy(const std::string& service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse r;
  SW_RETURN_IF_ERROR(impl_->Call([&](grpc::ClientContext* c) { return impl_->health_->Check(c, request, &r); }));
  return r.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace shardwild
