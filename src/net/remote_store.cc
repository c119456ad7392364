#include "net/remote_store.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/status.h"

namespace shardwild {

absl::StatusOr<std::unique_ptr<RemoteParamStore>> RemoteParamStore::Connect(const PsClientOptions& options) {
  SW_ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, PsClient::Create(options));
  SW_ASSIGN_OR_RETURN(RemoteLayout remote, client->GetLayout());
  std::unique_ptr<RemoteParamStore> store(new RemoteParamStore());
  store->client_ = std::move(client);
  store->layout_ = std::move(remote.layout);
  store->name_ = absl::StrCat(options.task_name, "/", remote.store_name);
  store->last_version_.store(remote.version, std::memory_order_relaxed);
  return store;
}

void RemoteParamStore::SeeVersion(uint64_t v) const {
  uint64_t seen = last_version_.load(std::memory_order_relaxed);
  while (v > seen && !last_version_.compare_exchange_weak(seen, v, std::memory_order_relaxed)) {
  }
}

absl::Status RemoteParamStore::Pull(absl::Span<const PullSlice> slices) {
  // bf16 slices (model.precision bf16): pulled as f32 (over the wire as
  // cluster.compression says), then rounded here.
  for (const PullSlice& s : slices) {
    if (s.out_bf16 != nullptr) {
      return PullConvertingToBf16(slices, layout_, [this](absl::Span<const PullSlice> f32) { return Pull(f32); });
    }
  }
  for (const PullSlice& s : slices) {
    if (s.var < 0 || s.var >= static_cast<int>(layout_.variables.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": pull: unknown variable ", s.var, " (the store has ", layout_.variables.size(), ")"));
    }
    const VariableSpec& spec = layout_.variables[s.var];
    if (s.row_begin < 0 || s.row_begin > s.row_end || s.row_end > spec.rows) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": pull: rows [", s.row_begin, ", ", s.row_end, ") of ",
                                                     spec.name, " are not within [0, ", spec.rows, ")"));
    }
    uint64_t v = 0;
    SW_RETURN_IF_ERROR(client_->PullDense(s.var, s.row_begin, s.row_end,
                                          absl::MakeSpan(s.out, (s.row_end - s.row_begin) * spec.cols), &v));
    SeeVersion(v);
  }
  return absl::OkStatus();
}

absl::Status RemoteParamStore::Push(absl::Span<const DenseGrad> grads, float lr) {
  std::vector<RemoteDenseGrad> remote;
  remote.reserve(grads.size());
  for (const DenseGrad& g : grads) {
    if (g.var < 0 || g.var >= static_cast<int>(layout_.variables.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": push: unknown variable ", g.var, " (the store has ", layout_.variables.size(), ")"));
    }
    remote.push_back({g.var, absl::MakeConstSpan(g.grad, layout_.variables[g.var].size())});
  }
  SW_ASSIGN_OR_RETURN(const uint64_t v, client_->PushDense(remote, lr));
  SeeVersion(v);
  return absl::OkStatus();
}

absl::Status RemoteParamStore::CheckTable(int table, const char* what) const {
  if (table < 0 || table >= static_cast<int>(layout_.tables.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": ", what, ": unknown table ", table, " (the store has ", layout_.tables.size(), ")"));
  }
  return absl::OkStatus();
}

absl::Status RemoteParamStore::PullRows(int table, absl::Span<const uint64_t> ids, float* out, PullMode mode,
                                        RowScratch* scratch) {
  const RowPull part{table, ids, out};
  return PullRowsBatch({&part, 1}, mode, scratch);
}

absl::Status RemoteParamStore::PushRows(int table, absl::Span<const uint64_t> ids, const float* grads, float lr,
                                        RowScratch* scratch) {
  const RowGrad part{table, ids, grads};
  return PushRowsBatch({&part, 1}, lr, scratch);
}

absl::Status RemoteParamStore::PullRowsBatch(absl::Span<const RowPull> parts, PullMode mode, RowScratch*) {
  std::vector<RemoteRowPull> remote;
  remote.reserve(parts.size());
  for (const RowPull& part : parts) {
    SW_RETURN_IF_ERROR(CheckTable(part.table, "pull rows"));
    remote.push_back({part.table, part.ids, absl::MakeSpan(part.out, part.ids.size() * layout_.tables[part.table].dim)});
  }
  return client_->PullRowsBatch(remote, mode);
}

absl::Status RemoteParamStore::PushRowsBatch(absl::Span<const RowGrad> parts, float lr, RowScratch*) {
  std::vector<RemoteRowPush> remote;
  remote.reserve(parts.size());
  for (const RowGrad& part : parts) {
    SW_RETURN_IF_ERROR(CheckTable(part.table, "push rows"));
    remote.push_back(
        {part.table, part.ids, absl::MakeConstSpan(part.grads, part.ids.size() * layout_.tables[part.table].dim)});
  }
  if (remote.empty()) return absl::OkStatus();
  SW_ASSIGN_OR_RETURN(const uint64_t v, client_->PushRowsBatch(remote, lr));
  SeeVersion(v);
  return absl::OkStatus();
}

uint64_t RemoteParamStore::version() const {
  absl::StatusOr<uint64_t> v = client_->Version();
  if (!v.ok()) return last_version_.load(std::memory_order_relaxed);
  last_version_.store(*v, std::memory_order_relaxed);  // exact now (a restore may have lowered it)
  return *v;
}

}  // namespace shardwild
