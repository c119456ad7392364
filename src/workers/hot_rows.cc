#include "workers/hot_rows.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "core/model/hogwild_kernels.h"

namespace shardwild {

void HotRows::Choose(Model& model, const Dataset& data, const StoreLayout& layout, int64_t count,
                     absl::FunctionRef<bool(int table)> fused) {
  tables_.assign(layout.tables.size(), Table{});
  hot_tables_ = 0;
  if (count <= 0 || data.count <= 0) return;
  std::vector<char> eligible(layout.tables.size(), 0);
  std::vector<int> lookups;
  for (int l = 0; l < model.num_lookups(); ++l) {
    const Lookup& lk = model.lookup(l);
    const TableSpec& t = layout.tables[lk.table];
    if (lk.wide || t.kind != EmbeddingKind::kStatic || t.bf16 || !fused(lk.table)) continue;
    eligible[lk.table] = 1;
    lookups.push_back(l);
  }
  if (lookups.empty()) return;
  // Whole batches, evenly spaced over the data: every `stride`-th batch.
  const int64_t batch = model.batch();
  const int64_t batches = (data.count + batch - 1) / batch;
  const int64_t stride = std::max<int64_t>(1, batches / std::max<int64_t>(1, kSampleRecords / batch));
  std::vector<std::unordered_map<uint64_t, int64_t>> counts(layout.tables.size());
  for (int64_t b = 0; b < batches; b += stride) {
    const int64_t first = b * batch;
    model.LoadRange(data, first, std::min(batch, data.count - first));
    for (int l : lookups) {
      auto& c = counts[model.lookup(l).table];
      for (uint64_t id : model.ids(l)) ++c[id];
    }
  }
  for (size_t t = 0; t < layout.tables.size(); ++t) {
    if (!eligible[t] || counts[t].empty()) continue;
    std::vector<std::pair<int64_t, uint64_t>> by_count;
    by_count.reserve(counts[t].size());
    for (const auto& [id, n] : counts[t]) by_count.emplace_back(-n, id);
    const size_t k = std::min<size_t>(static_cast<size_t>(count), by_count.size());
    std::partial_sort(by_count.begin(), by_count.begin() + k, by_count.end());
    Table& h = tables_[t];
    h.dim = layout.tables[t].dim;
    const uint64_t capacity = std::bit_ceil(std::max<uint64_t>(4 * k, 4));
    h.keys.assign(capacity, kEmpty);
    h.index.assign(capacity, -1);
    h.mask = capacity - 1;
    h.shift = 64 - std::countr_zero(capacity);
    for (size_t i = 0; i < k; ++i) {
      const uint64_t id = by_count[i].second;
      if (id >= kEmpty) continue;
      const uint64_t s0 = (id * 0x9E3779B97F4A7C15ull) >> h.shift;
      for (uint64_t slot : {s0, (s0 + 1) & h.mask}) {
        if (h.keys[slot] != kEmpty) continue;
        h.keys[slot] = static_cast<uint32_t>(id);
        h.index[slot] = static_cast<int32_t>(h.ids.size());
        h.ids.push_back(id);
        break;
      }
    }
    const size_t n = h.ids.size();
    h.position.assign(n, -1);
    h.shared.assign(n, nullptr);
    h.local.assign(n * h.dim, 0.0f);
    h.base.assign(n * h.dim, 0.0f);
    h.used.assign(n, -1);
    ++hot_tables_;
  }
}

const std::vector<uint64_t>& HotRows::ids(int table) const {
  static const std::vector<uint64_t> kNone;
  return table >= 0 && table < static_cast<int>(tables_.size()) ? tables_[table].ids : kNone;
}

void HotRows::Redirect(int table, absl::Span<const uint64_t> ids, float** addresses) {
  if (table < 0 || table >= static_cast<int>(tables_.size())) return;
  Table& h = tables_[table];
  if (h.dim == 0) return;
  // Whether an id is hot is as good as random from one to the next, so the
  // first pass decides it without a branch (Find), writing the positions of
  // the hot ones to a list.
  found_.resize(ids.size());
  hot_at_.resize(ids.size());
  size_t hits = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t hot = h.Find(ids[i]);
    found_[hits] = static_cast<uint32_t>(i);
    hot_at_[hits] = hot;
    hits += static_cast<size_t>(hot >= 0);
  }
  for (size_t k = 0; k < hits; ++k) {
    const size_t i = found_[k];
    const int32_t hot = hot_at_[k];
    int32_t p = h.position[hot];
    if (p < 0) {
      p = h.in_use++;
      h.position[hot] = p;
      h.used[p] = hot;
      h.shared[p] = addresses[i];
      float* local = h.local.data() + static_cast<int64_t>(p) * h.dim;
      HogwildCopyFrom(addresses[i], local, h.dim);
      std::memcpy(h.base.data() + static_cast<int64_t>(p) * h.dim, local, h.dim * sizeof(float));
    }
    addresses[i] = h.local.data() + static_cast<int64_t>(p) * h.dim;
  }
}

void HotRows::Merge() {
  for (Table& h : tables_) {
    if (h.in_use == 0) continue;
    HogwildMergeRows(h.shared.data(), h.local.data(), h.base.data(), h.in_use, h.dim);
    for (int32_t p = 0; p < h.in_use; ++p) h.position[h.used[p]] = -1;
    rows_merged_ += h.in_use;
    h.in_use = 0;
  }
}

}  // namespace shardwild
