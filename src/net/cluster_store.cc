#include "net/cluster_store.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status.h"

namespace shardwild {
namespace {

// What differs between two layouts (variables, parts, tables), or "".
std::string LayoutDifference(const StoreLayout& a, const StoreLayout& b) {
  if (a.num_shards != b.num_shards) return absl::StrCat(a.num_shards, " shards, not ", b.num_shards);
  if (a.variables.size() != b.variables.size()) {
    return absl::StrCat(a.variables.size(), " variables, not ", b.variables.size());
  }
  for (size_t v = 0; v < a.variables.size(); ++v) {
    const VariableSpec& x = a.variables[v];
    const VariableSpec& y = b.variables[v];
    if (x.name != y.name || x.rows != y.rows || x.cols != y.cols) {
      return absl::StrCat("variable ", v, " '", x.name, "' [", x.rows, ", ", x.cols, "], not '", y.name, "' [", y.rows,
                          ", ", y.cols, "]");
    }
    if (a.parts.size() <= v || b.parts.size() <= v || a.parts[v].size() != b.parts[v].size()) {
      return absl::StrCat("variable '", x.name, "' on another number of shards");
    }
    for (size_t s = 0; s < a.parts[v].size(); ++s) {
      if (a.parts[v][s].begin != b.parts[v][s].begin || a.parts[v][s].end != b.parts[v][s].end) {
        return absl::StrCat("rows [", a.parts[v][s].begin, ", ", a.parts[v][s].end, ") of '", x.name, "' on shard ", s,
                            ", not [", b.parts[v][s].begin, ", ", b.parts[v][s].end, ")");
      }
    }
  }
  if (a.tables.size() != b.tables.size()) return absl::StrCat(a.tables.size(), " tables, not ", b.tables.size());
  for (size_t t = 0; t < a.tables.size(); ++t) {
    const TableSpec& x = a.tables[t];
    const TableSpec& y = b.tables[t];
    if (x.name != y.name || x.kind != y.kind || x.dim != y.dim || x.capacity != y.capacity || x.on_full != y.on_full) {
      return absl::StrCat("table ", t, " '", x.name, "' (", EmbeddingKindName(x.kind), ", dim ", x.dim, ", capacity ",
                          x.capacity, "), not '", y.name, "' (", EmbeddingKindName(y.kind), ", dim ", y.dim,
                          ", capacity ", y.capacity, ")");
    }
  }
  return "";
}

// Counts of a finished batch of calls, signalled by the lanes' threads.
struct Latch {
  Mutex mu;
  CondVar cv;
  int pending ABSL_GUARDED_BY(mu) = 0;
};

}  // namespace

ClusterParamStore::ClusterParamStore(const ShardMap& map, const ClusterStoreOptions& options)
    : map_(map), options_(options) {}

ClusterParamStore::~ClusterParamStore() {
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    if (lane == nullptr) continue;
    {
      MutexLock lock(&lane->mu);
      lane->stop = true;
    }
    lane->cv.SignalAll();
    for (std::thread& t : lane->threads) t.join();
  }
}

void ClusterParamStore::LaneLoop(Lane* lane) {
  while (true) {
    std::function<void()> job;
    {
      MutexLock lock(&lane->mu);
      lane->cv.Wait(&lane->mu, [lane]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane->mu) {
        return lane->stop || !lane->queue.empty();
      });
      if (lane->queue.empty()) return;  // stopping, nothing left
      job = std::move(lane->queue.front());
      lane->queue.erase(lane->queue.begin());
    }
    job();
  }
}

void ClusterParamStore::Enqueue(int p, std::function<void()> job) const {
  Lane* lane = lanes_[p].get();
  {
    MutexLock lock(&lane->mu);
    lane->queue.push_back(std::move(job));
  }
  lane->cv.SignalAll();
}

void ClusterParamStore::RunOnAll(absl::Span<const int> targets, const std::function<absl::Status(int)>& fn,
                                 std::vector<absl::Status>* statuses, bool grpc_only) const {
  statuses->assign(map_.num_ps(), absl::OkStatus());
  Latch latch;
  auto inline_here = [&](int p) { return !grpc_only && local_[p] != nullptr; };
  int remote = 0;
  for (int p : targets) remote += inline_here(p) ? 0 : 1;
  {
    MutexLock lock(&latch.mu);
    latch.pending = remote;
  }
  // Every remote call first, so they are all in flight while the local ones run.
  for (int p : targets) {
    if (inline_here(p)) continue;
    absl::Status* out = &(*statuses)[p];
    Enqueue(p, [&fn, &latch, out, p] {
      absl::Status s = fn(p);
      MutexLock done(&latch.mu);
      *out = std::move(s);
      // Signalled under the mutex: the waiter may destroy the latch as soon
      // as it sees pending reach 0, which it cannot before we unlock.
      if (--latch.pending == 0) latch.cv.SignalAll();
    });
  }
  for (int p : targets) {
    if (inline_here(p)) (*statuses)[p] = Local(p, fn(p));
  }
  MutexLock lock(&latch.mu);
  latch.cv.Wait(&latch.mu, [&latch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(latch.mu) { return latch.pending == 0; });
}

absl::Status ClusterParamStore::FirstError(const std::vector<absl::Status>& statuses) {
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ClusterParamStore::Local(int p, absl::Status s) const {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(task_names_[p], " (local): ", s.message()));
}

absl::StatusOr<std::unique_ptr<ClusterParamStore>> ClusterParamStore::Connect(const ShardMap& map,
                                                                              std::vector<PsClientOptions> ps,
                                                                              std::vector<ParamStore*> local,
                                                                              const ClusterStoreOptions& options) {
  const int nps = map.num_ps();
  if (static_cast<int>(ps.size()) != nps) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster store: ", ps.size(), " ps client options for a shard map of ", nps, " ps tasks"));
  }
  if (!local.empty() && static_cast<int>(local.size()) != nps) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster store: ", local.size(), " local stores for ", nps, " ps tasks (give one per task, or none)"));
  }
  if (options.async_pushes < 0 || options.async_pushes > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster store: async_pushes must be 0..64, got ", options.async_pushes));
  }
  if (options.threads_per_ps < 1 || options.threads_per_ps > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster store: threads_per_ps must be 1..64, got ", options.threads_per_ps));
  }
  std::unique_ptr<ClusterParamStore> st(new ClusterParamStore(map, options));
  st->local_ = local.empty() ? std::vector<ParamStore*>(nps, nullptr) : std::move(local);
  for (int p = 0; p < nps; ++p) {
    SW_ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, PsClient::Create(ps[p]));
    st->clients_.push_back(std::move(client));
    st->task_names_.push_back(ps[p].task_name);
  }
  // Every ps task gets a lane, local ones too: GetLayout, SaveShard and
  // RestoreShard always go through gRPC.
  for (int p = 0; p < nps; ++p) {
    auto lane = std::make_unique<Lane>();
    for (int k = 0; k < options.threads_per_ps; ++k) lane->threads.emplace_back(LaneLoop, lane.get());
    st->lanes_.push_back(std::move(lane));
  }
  std::vector<RemoteLayout> layouts(nps);
  std::vector<int> all(nps);
  for (int p = 0; p < nps; ++p) all[p] = p;
  std::vector<absl::Status> statuses;
  st->RunOnAll(
      all,
      [&](int p) -> absl::Status {
        SW_ASSIGN_OR_RETURN(layouts[p], st->clients_[p]->GetLayout());
        return absl::OkStatus();
      },
      &statuses, /*grpc_only=*/true);
  SW_RETURN_IF_ERROR(FirstError(statuses));

  const RemoteLayout& ref = layouts[0];
  for (int p = 0; p < nps; ++p) {
    const RemoteLayout& l = layouts[p];
    auto bad = [&](const std::string& what) {
      return absl::FailedPreconditionError(absl::StrCat(ps[p].task_name, " (", ps[p].address, "): ", what));
    };
    if (l.layout.num_shards != map.num_shards()) {
      return bad(absl::StrCat("serves a store of ", l.layout.num_shards, " shards, the cluster's shard map has ",
                              map.num_shards()));
    }
    if (l.first_hosted_shard != map.first_shard(p) || l.num_hosted_shards != map.num_shards_of(p)) {
      return bad(absl::StrCat("hosts shards ", l.first_hosted_shard, "..", l.first_hosted_shard + l.num_hosted_shards - 1,
                              ", the shard map gives it shards ", map.first_shard(p), "..",
                              map.first_shard(p) + map.num_shards_of(p) - 1, " of ", map.num_shards()));
    }
    if (const std::string diff = LayoutDifference(l.layout, ref.layout); !diff.empty()) {
      return bad(absl::StrCat("its store's layout differs from ", ps[0].task_name, "'s: ", diff));
    }
    if (l.optimizer != ref.optimizer || l.sparse_optimizer != ref.sparse_optimizer || l.update_mode != ref.update_mode) {
      return bad(absl::StrCat("optimizers / update mode ", l.optimizer, "/", l.sparse_optimizer, "/", l.update_mode,
                              ", ", ps[0].task_name, " has ", ref.optimizer, "/", ref.sparse_optimizer, "/",
                              ref.update_mode));
    }
    if (ParamStore* loc = st->local_[p]; loc != nullptr) {
      if (const std::string diff = LayoutDifference(loc->layout(), ref.layout); !diff.empty()) {
        return bad(absl::StrCat("the local store ", loc->name(), " has another layout: ", diff));
      }
      if (const auto* shm = dynamic_cast<const ShmParamStore*>(loc); shm != nullptr) {
        if (shm->name() != l.store_name || shm->first_hosted_shard() != l.first_hosted_shard ||
            shm->num_hosted_shards() != l.num_hosted_shards) {
          return bad(absl::StrCat("the local store ", shm->name(), " (shards ", shm->first_hosted_shard(), "..",
                                  shm->first_hosted_shard() + shm->num_hosted_shards() - 1,
                                  ") is not the one the server serves (", l.store_name, ")"));
        }
      }
    }
  }
  st->layout_ = ref.layout;
  for (int s = 0; s < map.num_shards(); ++s) {
    const std::vector<int>& nodes = layouts[map.OwnerOf(s)].layout.shard_nodes;
    if (s < static_cast<int>(st->layout_.shard_nodes.size())) {
      st->layout_.shard_nodes[s] = s < static_cast<int>(nodes.size()) ? nodes[s] : -1;
    }
  }
  // Each ps task's rows of each variable: the union of its shards' parts,
  // one contiguous range (each server's ShmParamStore checked it).
  const int nvars = static_cast<int>(st->layout_.variables.size());
  st->hosted_.assign(nps, std::vector<RowRange>(nvars));
  for (int p = 0; p < nps; ++p) {
    for (int v = 0; v < nvars; ++v) {
      int64_t begin = std::numeric_limits<int64_t>::max(), end = 0;
      for (int s = map.first_shard(p); s < map.first_shard(p) + map.num_shards_of(p); ++s) {
        const RowRange r = st->layout_.parts[v][s];
        if (r.size() == 0) continue;
        begin = std::min(begin, r.begin);
        end = std::max(end, r.end);
      }
      st->hosted_[p][v] = end > 0 ? RowRange{begin, end} : RowRange{0, 0};
    }
  }
  std::vector<std::string> names;
  for (int p = 0; p < nps; ++p) names.push_back(absl::StrCat(ps[p].task_name, "/", layouts[p].store_name));
  st->name_ = absl::StrJoin(names, ",");
  st->SeeVersion(ref.version);
  return st;
}

absl::Status ClusterParamStore::Pull(absl::Span<const PullSlice> slices) {
  // bf16 slices (model.precision bf16): pulled as f32 (over the wire as
  // cluster.compression says), then rounded here.
  for (const PullSlice& s : slices) {
    if (s.out_bf16 != nullptr) {
      return PullConvertingToBf16(slices, layout_, [this](absl::Span<const PullSlice> f32) { return Pull(f32); });
    }
  }
  const int nps = map_.num_ps();
  // The pieces of each ps task, validated first (nothing is pulled on error).
  std::vector<std::vector<PullSlice>> pieces(nps);
  for (const PullSlice& sl : slices) {
    if (sl.var < 0 || sl.var >= static_cast<int>(layout_.variables.size())) {
      return absl::InvalidArgumentError(absl::StrCat("pull: no variable ", sl.var));
    }
    const VariableSpec& spec = layout_.variables[sl.var];
    if (sl.row_begin < 0 || sl.row_end > spec.rows || sl.row_begin > sl.row_end) {
      return absl::InvalidArgumentError(absl::StrCat("pull: rows [", sl.row_begin, ", ", sl.row_end,
                                                     ") out of range for '", spec.name, "' with ", spec.rows, " rows"));
    }
    for (int p = 0; p < nps; ++p) {
      const RowRange h = hosted_[p][sl.var];
      const int64_t b = std::max(h.begin, sl.row_begin), e = std::min(h.end, sl.row_end);
      if (b >= e) continue;
      pieces[p].push_back({sl.var, b, e, sl.out + (b - sl.row_begin) * spec.cols});
    }
  }
  std::vector<int> targets;
  for (int p = 0; p < nps; ++p) {
    if (!pieces[p].empty()) targets.push_back(p);
  }
  std::vector<absl::Status> statuses;
  RunOnAll(
      targets,
      [&](int p) -> absl::Status {
        if (local_[p] != nullptr) return local_[p]->Pull(pieces[p]);
        // Every piece of this ps task in one call (batched per step).
        std::vector<RemotePullSlice> remote;
        remote.reserve(pieces[p].size());
        for (const PullSlice& piece : pieces[p]) {
          const int64_t n = (piece.row_end - piece.row_begin) * layout_.variables[piece.var].cols;
          remote.push_back({piece.var, piece.row_begin, piece.row_end,
                            absl::Span<float>(piece.out, static_cast<size_t>(n))});
        }
        uint64_t v = 0;
        SW_RETURN_IF_ERROR(clients_[p]->PullDenseBatch(remote, &v));
        SeeVersion(v);
        return absl::OkStatus();
      },
      &statuses);
  return FirstError(statuses);
}

absl::Status ClusterParamStore::Push(absl::Span<const DenseGrad> grads, float lr) {
  const int nps = map_.num_ps();
  for (const DenseGrad& g : grads) {
    if (g.var < 0 || g.var >= static_cast<int>(layout_.variables.size())) {
      return absl::InvalidArgumentError(absl::StrCat("push: no variable ", g.var));
    }
    if (g.grad == nullptr) return absl::InvalidArgumentError(absl::StrCat("push: the gradient of variable ", g.var, " is null"));
  }
  // Each ps task's rows of each gradient.
  std::vector<std::vector<RemoteDenseGrad>> remote(nps);
  std::vector<std::vector<DenseGrad>> whole(nps);  // local ps tasks take whole-variable pointers
  for (const DenseGrad& g : grads) {
    const int64_t cols = layout_.variables[g.var].cols;
    for (int p = 0; p < nps; ++p) {
      const RowRange h = hosted_[p][g.var];
      if (h.size() == 0) continue;
      if (local_[p] != nullptr) {
        whole[p].push_back(g);
      } else {
        remote[p].push_back({g.var, absl::Span<const float>(g.grad + h.begin * cols, static_cast<size_t>(h.size() * cols)),
                             h.begin * cols});
      }
    }
  }
  std::vector<int> targets;
  for (int p = 0; p < nps; ++p) {
    if (!remote[p].empty() || !whole[p].empty()) targets.push_back(p);
  }
  std::function<absl::StatusOr<uint64_t>(int)> send;
  if (options_.async_pushes > 0) {
    // The remote rows are copied: the caller reuses its gradients at once.
    struct Copies {
      std::vector<std::vector<float>> rows;             // one per remote gradient
      std::vector<std::vector<RemoteDenseGrad>> parts;  // [ps], into rows
    };
    auto copies = std::make_shared<Copies>();
    copies->parts.resize(nps);
    for (int p = 0; p < nps; ++p) {
      for (const RemoteDenseGrad& g : remote[p]) {
        // A copy's buffer stays put when `rows` grows: its vectors move.
        copies->rows.emplace_back(g.grad.begin(), g.grad.end());
        copies->parts[p].push_back({g.var, absl::MakeConstSpan(copies->rows.back()), g.offset});
      }
    }
    send = [this, lr, copies](int p) { return clients_[p]->PushDense(copies->parts[p], lr); };
  } else {
    send = [this, lr, &remote](int p) { return clients_[p]->PushDense(remote[p], lr); };
  }
  return PushParts(targets, send, [&](int p) -> absl::Status {
    SW_RETURN_IF_ERROR(local_[p]->Push(whole[p], lr));
    SeeVersion(local_[p]->version());
    return absl::OkStatus();
  });
}

absl::Status ClusterParamStore::PushParts(absl::Span<const int> targets,
                                          const std::function<absl::StatusOr<uint64_t>(int)>& send,
                                          const std::function<absl::Status(int)>& local) {
  if (options_.async_pushes == 0) {
    std::vector<absl::Status> statuses;
    RunOnAll(
        targets,
        [&](int p) -> absl::Status {
          if (local_[p] != nullptr) return local(p);
          SW_ASSIGN_OR_RETURN(const uint64_t v, send(p));
          SeeVersion(v);
          return absl::OkStatus();
        },
        &statuses);
    return FirstError(statuses);
  }
  int remote = 0;
  for (int p : targets) remote += local_[p] == nullptr ? 1 : 0;
  if (remote > 0) {
    SW_RETURN_IF_ERROR(BeginAsyncPush());
    auto parts_left = std::make_shared<std::atomic<int>>(remote);
    for (int p : targets) {
      if (local_[p] != nullptr) continue;
      Enqueue(p, [this, p, send, parts_left] {
        absl::StatusOr<uint64_t> v = send(p);
        if (v.ok()) SeeVersion(*v);
        EndAsyncPart(v.status(), *parts_left);
      });
    }
  }
  // The local parts, on this thread, while the remote ones travel.
  for (int p : targets) {
    if (local_[p] != nullptr) SW_RETURN_IF_ERROR(Local(p, local(p)));
  }
  return absl::OkStatus();
}

absl::Status ClusterParamStore::BeginAsyncPush() {
  MutexLock lock(&async_mu_);
  // A failure of an earlier push is this call's to report (once).
  if (!async_error_.ok()) {
    absl::Status s = std::move(async_error_);
    async_error_ = absl::OkStatus();
    return s;
  }
  async_cv_.Wait(&async_mu_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(async_mu_) {
    return in_flight_ < options_.async_pushes;
  });
  ++in_flight_;
  return absl::OkStatus();
}

void ClusterParamStore::EndAsyncPart(const absl::Status& status, std::atomic<int>& parts_left) {
  MutexLock done(&async_mu_);
  if (!status.ok() && async_error_.ok()) async_error_ = DeepCopy(status);  // handed to another thread
  if (parts_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    --in_flight_;
    async_cv_.SignalAll();
  }
}

absl::Status ClusterParamStore::Flush() {
  MutexLock lock(&async_mu_);
  async_cv_.Wait(&async_mu_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(async_mu_) { return in_flight_ == 0; });
  absl::Status s = std::move(async_error_);
  async_error_ = absl::OkStatus();
  return s;
}

absl::Status ClusterParamStore::CheckIds(int table, absl::Span<const uint64_t> ids, const char* what) const {
  if (table < 0 || table >= static_cast<int>(layout_.tables.size())) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no embedding table ", table));
  }
  const TableSpec& spec = layout_.tables[table];
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t id = ids[i];
    if (spec.kind == EmbeddingKind::kStatic && id >= static_cast<uint64_t>(spec.capacity)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": embedding table '", spec.name, "': id ", id, " (item ", i,
                                                     ") is out of range for a static table of ", spec.capacity, " rows"));
    }
    if (spec.kind == EmbeddingKind::kDynamic && id == EmbeddingTable::kReservedId) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": embedding table '", spec.name, "': id 2^64-1 (item ", i,
                                                     ") is reserved in dynamic tables"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Ids of a batch grouped by owning ps task, stable (batch order within each).
struct IdGroups {
  std::vector<uint64_t> ids;
  std::vector<uint32_t> positions;  // batch index of each grouped id
  std::vector<size_t> offsets;      // ps p's group: [offsets[p], offsets[p + 1])
};

IdGroups GroupByOwner(const TableSpec& spec, absl::Span<const uint64_t> ids, const ShardMap& map) {
  const int nps = map.num_ps();
  const uint32_t nshards = static_cast<uint32_t>(map.num_shards());
  std::vector<int> owner(ids.size());
  IdGroups g;
  g.offsets.assign(nps + 1, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    owner[i] = map.OwnerOf(ShardOfRowId(spec.kind, ids[i], nshards));
    ++g.offsets[owner[i] + 1];
  }
  for (int p = 0; p < nps; ++p) g.offsets[p + 1] += g.offsets[p];
  std::vector<size_t> at(g.offsets.begin(), g.offsets.end() - 1);
  g.ids.resize(ids.size());
  g.positions.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const size_t k = at[owner[i]]++;
    g.ids[k] = ids[i];
    g.positions[k] = static_cast<uint32_t>(i);
  }
  return g;
}

}  // namespace

namespace {

// A step's row parts grouped by owning ps task: for each part, its ids by
// owner (IdGroups) and a buffer of its rows in that grouped order.
struct GroupedParts {
  std::vector<int> tables;               // [part]
  std::vector<size_t> dims;              // [part]
  std::vector<IdGroups> groups;          // [part]
  std::vector<std::vector<float>> rows;  // [part] ids.size() * dim floats, grouped order

  // Groups `ids` of `table` as part k (appended) with room for its rows.
  void Add(int table, const TableSpec& spec, absl::Span<const uint64_t> ids, const ShardMap& map) {
    tables.push_back(table);
    dims.push_back(static_cast<size_t>(spec.dim));
    groups.push_back(GroupByOwner(spec, ids, map));
    rows.emplace_back(ids.size() * dims.back());
  }
  // Part k's ids owned by ps p, and their rows.
  size_t count(size_t k, int p) const { return groups[k].offsets[p + 1] - groups[k].offsets[p]; }
  absl::Span<const uint64_t> ids(size_t k, int p) const {
    return {groups[k].ids.data() + groups[k].offsets[p], count(k, p)};
  }
  absl::Span<float> rows_of(size_t k, int p) {
    return {rows[k].data() + groups[k].offsets[p] * dims[k], count(k, p) * dims[k]};
  }
  // The ps tasks owning any id of any part.
  std::vector<int> Targets(int nps) const {
    std::vector<int> targets;
    for (int p = 0; p < nps; ++p) {
      for (size_t k = 0; k < groups.size(); ++k) {
        if (count(k, p) > 0) {
          targets.push_back(p);
          break;
        }
      }
    }
    return targets;
  }
  // The parts of ps p, each made by make(k, ids, rows).
  template <typename Part, typename Make>
  std::vector<Part> PartsOf(int p, const Make& make) {
    std::vector<Part> out;
    for (size_t k = 0; k < groups.size(); ++k) {
      if (count(k, p) > 0) out.push_back(make(k, ids(k, p), rows_of(k, p)));
    }
    return out;
  }
};

}  // namespace

absl::Status ClusterParamStore::CheckRowPart(size_t k, int table, absl::Span<const uint64_t> ids, const void* rows,
                                             const char* what) const {
  SW_RETURN_IF_ERROR(CheckIds(table, ids, what));
  if (!ids.empty() && rows == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": part ", k, " has ids but no rows"));
  }
  if (ids.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": more than 2^32-1 ids in one part"));
  }
  return absl::OkStatus();
}

absl::Status ClusterParamStore::PullRows(int table, absl::Span<const uint64_t> ids, float* out, PullMode mode,
                                         RowScratch* scratch) {
  const RowPull part{table, ids, out};
  return PullRowsBatch({&part, 1}, mode, scratch);
}

absl::Status ClusterParamStore::PushRows(int table, absl::Span<const uint64_t> ids, const float* grads, float lr,
                                         RowScratch* scratch) {
  const RowGrad part{table, ids, grads};
  return PushRowsBatch({&part, 1}, lr, scratch);
}

absl::Status ClusterParamStore::PullRowsBatch(absl::Span<const RowPull> parts, PullMode mode, RowScratch*) {
  for (size_t k = 0; k < parts.size(); ++k) {
    SW_RETURN_IF_ERROR(CheckRowPart(k, parts[k].table, parts[k].ids, parts[k].out, "pull rows"));
  }
  GroupedParts g;
  for (const RowPull& part : parts) g.Add(part.table, layout_.tables[part.table], part.ids, map_);
  std::vector<absl::Status> statuses;
  RunOnAll(
      g.Targets(map_.num_ps()),
      [&](int p) -> absl::Status {
        if (local_[p] != nullptr) {
          RowScratch scratch;
          return local_[p]->PullRowsBatch(
              g.PartsOf<RowPull>(p, [&](size_t k, absl::Span<const uint64_t> ids, absl::Span<float> rows) {
                return RowPull{g.tables[k], ids, rows.data()};
              }),
              mode, &scratch);
        }
        // Every part of this ps task in one call (batched per step).
        return clients_[p]->PullRowsBatch(
            g.PartsOf<RemoteRowPull>(p, [&](size_t k, absl::Span<const uint64_t> ids, absl::Span<float> rows) {
              return RemoteRowPull{g.tables[k], ids, rows};
            }),
            mode);
      },
      &statuses);
  SW_RETURN_IF_ERROR(FirstError(statuses));
  for (size_t k = 0; k < parts.size(); ++k) {
    const size_t dim = g.dims[k];
    const std::vector<uint32_t>& positions = g.groups[k].positions;
    for (size_t i = 0; i < positions.size(); ++i) {
      std::memcpy(parts[k].out + positions[i] * dim, g.rows[k].data() + i * dim, dim * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status ClusterParamStore::PushRowsBatch(absl::Span<const RowGrad> parts, float lr, RowScratch*) {
  for (size_t k = 0; k < parts.size(); ++k) {
    SW_RETURN_IF_ERROR(CheckRowPart(k, parts[k].table, parts[k].ids, parts[k].grads, "push rows"));
  }
  // The gradient rows in grouped order (batch order within each ps task, so
  // repeated ids are summed in the order a single store sums them), owned
  // by the remote sends (asynchronous pushes keep them until sent).
  auto g = std::make_shared<GroupedParts>();
  for (const RowGrad& part : parts) {
    g->Add(part.table, layout_.tables[part.table], part.ids, map_);
    const size_t dim = g->dims.back();
    const std::vector<uint32_t>& positions = g->groups.back().positions;
    float* grouped = g->rows.back().data();
    for (size_t i = 0; i < positions.size(); ++i) {
      std::memcpy(grouped + i * dim, part.grads + positions[i] * dim, dim * sizeof(float));
    }
  }
  return PushParts(
      g->Targets(map_.num_ps()),
      [this, lr, g](int p) {
        return clients_[p]->PushRowsBatch(
            g->PartsOf<RemoteRowPush>(p, [&](size_t k, absl::Span<const uint64_t> ids, absl::Span<float> rows) {
              return RemoteRowPush{g->tables[k], ids, rows};
            }),
            lr);
      },
      [&](int p) {
        RowScratch scratch;
        return local_[p]->PushRowsBatch(
            g->PartsOf<RowGrad>(p, [&](size_t k, absl::Span<const uint64_t> ids, absl::Span<float> rows) {
              return RowGrad{g->tables[k], ids, rows.data()};
            }),
            lr, &scratch);
      });
}

void ClusterParamStore::SeeVersion(uint64_t v) const {
  uint64_t cur = last_version_.load(std::memory_order_relaxed);
  while (v > cur && !last_version_.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

uint64_t ClusterParamStore::version() const {
  const int nps = map_.num_ps();
  std::vector<uint64_t> versions(nps, 0);
  std::vector<int> all(nps);
  for (int p = 0; p < nps; ++p) all[p] = p;
  std::vector<absl::Status> statuses;
  RunOnAll(
      all,
      [&](int p) -> absl::Status {
        if (local_[p] != nullptr) {
          versions[p] = local_[p]->version();
          return absl::OkStatus();
        }
        SW_ASSIGN_OR_RETURN(versions[p], clients_[p]->Version());
        return absl::OkStatus();
      },
      &statuses);
  if (!FirstError(statuses).ok()) return last_version_.load(std::memory_order_relaxed);
  const uint64_t v = *std::max_element(versions.begin(), versions.end());
  SeeVersion(v);
  return v;
}

absl::StatusOr<std::vector<std::string>> ClusterParamStore::SaveShards(int64_t step) {
  const int nps = map_.num_ps();
  std::vector<std::string> paths(nps);
  std::vector<absl::Status> statuses;
  // Through gRPC even for local ps tasks: the server owns its checkpoint
  // directory.
  std::vector<int> all(nps);
  for (int p = 0; p < nps; ++p) all[p] = p;
  RunOnAll(
      all,
      [&](int p) -> absl::Status {
        SW_ASSIGN_OR_RETURN(paths[p], clients_[p]->SaveShard(step));
        return absl::OkStatus();
      },
      &statuses, /*grpc_only=*/true);
  SW_RETURN_IF_ERROR(FirstError(statuses));
  return paths;
}

absl::StatusOr<int64_t> ClusterParamStore::RestoreShards(std::optional<int64_t> step) {
  const int nps = map_.num_ps();
  std::vector<int64_t> steps(nps, -1);
  std::vector<absl::Status> statuses;
  std::vector<int> all(nps);
  for (int p = 0; p < nps; ++p) all[p] = p;
  RunOnAll(
      all,
      [&](int p) -> absl::Status {
        SW_ASSIGN_OR_RETURN(steps[p], clients_[p]->RestoreShard(step));
        return absl::OkStatus();
      },
      &statuses, /*grpc_only=*/true);
  SW_RETURN_IF_ERROR(FirstError(statuses));
  for (int p = 1; p < nps; ++p) {
    if (steps[p] != steps[0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "restore: ", task_names_[0], " loaded step ", steps[0], " but ", task_names_[p], " loaded step ", steps[p],
          "; the ps tasks' checkpoints disagree (restore a step they all have)"));
    }
  }
  // The version the ps tasks now hold may be lower than what this store saw.
  last_version_.store(0, std::memory_order_relaxed);
  (void)version();
  return steps[0];
}

PsClient::Stats ClusterParamStore::stats() const {
  PsClient::Stats total;
  for (const std::unique_ptr<PsClient>& c : clients_) {
    const PsClient::Stats s = c->stats();
    total.bytes_sent += s.bytes_sent;
    total.bytes_received += s.bytes_received;
  }
  return total;
}

std::vector<ParamStore*> LocalPsStores::pointers() const {
  std::vector<ParamStore*> out;
  for (const std::unique_ptr<ShmParamStore>& s : stores) out.push_back(s.get());
  return out;
}

LocalPsStores AttachLocalPsStores(absl::Span<const PsClientOptions> ps, const std::string& host,
                                  const OptimizerOptions& optimizer,
                                  const std::optional<OptimizerOptions>& sparse_optimizer) {
  LocalPsStores out;
  out.stores.resize(ps.size());
  out.fallbacks.resize(ps.size());
  for (size_t p = 0; p < ps.size(); ++p) {
    absl::StatusOr<HostPort> addr = ParseHostPort(ps[p].address);
    if (!addr.ok()) continue;
    // The same host string (localhost read as 127.0.0.1): distinct loopback
    // addresses stand for distinct machines, so one box can run a cluster of
    // several "machines" (127.0.0.1, 127.0.0.2, ...).
    auto canonical = [](const std::string& h) { return h == "localhost" ? std::string("127.0.0.1") : h; };
    const bool same = canonical(addr->host) == canonical(host);
    if (!same) continue;
    absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Create(ps[p]);
    if (!client.ok()) {
      out.fallbacks[p] = std::string(client.status().message());
      continue;
    }
    absl::StatusOr<RemoteLayout> layout = (*client)->GetLayout();
    if (!layout.ok()) {
      out.fallbacks[p] = std::string(layout.status().message());
      continue;
    }
    absl::StatusOr<std::unique_ptr<ShmParamStore>> store =
        ShmParamStore::Attach(layout->store_name, optimizer, sparse_optimizer);
    if (!store.ok()) {
      out.fallbacks[p] = absl::StrCat(ps[p].task_name, ": cannot attach to its store ", layout->store_name,
                                      " through shared memory: ", store.status().message());
      continue;
    }
    out.stores[p] = *std::move(store);
  }
  return out;
}

}  // namespace shardwild
