// A worker's private copies of the embedding rows it reads most (ps.hot_rows).
//
// Rows updated in place (ParamStore::RowAddresses: static f32 tables under
// Hogwild SGD) are read by every worker's pooling and written by every
// worker's fused update. A row in nearly every batch (a text model's
// frequent tokens) then moves between the cores' caches on every access:
// on a 16-core machine a text step took 5.8x as long with 16 workers as with
// one, its pooling 10x and its row updates 13x, where 16 independent
// processes each kept 0.74 of one's speed.
//
// With hot rows, each worker keeps the `count` most frequent ids of each
// such table (counted over a sample of the training data) as copies of its
// own. The first use of a hot row after a merge copies the store's row in;
// the worker's steps then read and update its copy; every `merge_every`
// steps, and when the training call returns however it ends, each copy
// used is merged into the store as a delta (HogwildMergeRows: row +=
// copy - value copied), so the updates other workers made in between are
// kept. A hot row's updates thus reach the other workers up to
// merge_every steps late, and a training call leaves every update in the
// store (evaluation, checkpoints and the next call read it there).
//
// Not thread-safe: one per worker, used by its thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "core/base/huge_page_allocator.h"
#include "core/data/dataset.h"
#include "core/model/model.h"
#include "ps_shm/param_store.h"

namespace shardwild {

class HotRows {
 public:
  // Chooses the hot ids: for every lookup of `model` that is not wide, over
  // a static f32 table of `layout` that `fused(table)` says is read and
  // updated in place by the fused SGD (the store's RowAddresses answers
  // kReadAndSgd: no copy is used for any other table, so none is counted
  // or made), the `count` ids of its table most frequent among the
  // lookups' ids of (at most kSampleRecords, evenly spaced) records of
  // `data`, loaded through `model` (which this leaves holding the last
  // sampled batch when it samples). count 0 = none.
  void Choose(Model& model, const Dataset& data, const StoreLayout& layout, int64_t count,
              absl::FunctionRef<bool(int table)> fused);
  // Records of `data` Choose counts ids over, at most.
  static constexpr int64_t kSampleRecords = 32768;

  bool empty() const { return hot_tables_ == 0; }
  // The hot ids of `table`, most frequent first (ties: smaller id first;
  // the rare id its hash table had no slot for is left out).
  const std::vector<uint64_t>& ids(int table) const;

  // For a lookup over `table` read in place, after RowAddresses wrote the
  // store's address of each of `ids` to addresses[]: replaces each hot
  // row's address with this worker's copy of it, copying the store's row
  // in on its first use since the last Merge.
  void Redirect(int table, absl::Span<const uint64_t> ids, float** addresses);

  // Merges every copy used since the last Merge into the store's row
  // (HogwildMergeRows). The next use of a row copies it in again, with what
  // the other workers merged meanwhile.
  void Merge();

  // Rows merged by Merge calls so far, all tables (tests, diagnostics).
  int64_t rows_merged() const { return rows_merged_; }

 private:
  struct Table {
    int64_t dim = 0;
    std::vector<uint64_t> ids;     // the hot ids, most frequent first
    // A hash table of at least 4 slots per hot id: id i sits in slot
    // h(i) or the next one (keys, kEmpty where free; index: its place in
    // ids). A lookup reads both slots and decides without a branch on the
    // outcome, which is as good as random from one id to the next. An id
    // that finds both slots taken when the table is built is left out (not
    // hot); at this load that is rare.
    std::vector<uint32_t> keys;
    std::vector<int32_t> index;
    uint64_t mask = 0;
    int shift = 64;
    // Per hot id: its copy's position since the last Merge, -1 = unused.
    std::vector<int32_t> position;
    // Per copy in use, in the order of first use: the store's row, the copy,
    // the value copied in, and which hot id it is.
    std::vector<float*> shared;
    // Cache-line aligned, as the store's rows: a row of a line's multiple
    // split across lines would make every vector load and store of it two.
    HugePageVector<float> local, base;
    std::vector<int32_t> used;
    int32_t in_use = 0;
    // The place of `id` in ids, or -1.
    int32_t Find(uint64_t id) const {
      const uint64_t s0 = (id * 0x9E3779B97F4A7C15ull) >> shift, s1 = (s0 + 1) & mask;
      const int32_t m0 = -static_cast<int32_t>(keys[s0] == id), m1 = -static_cast<int32_t>(keys[s1] == id);
      return (index[s0] & m0) | (index[s1] & m1) | ~(m0 | m1);
    }
  };
  // A free slot's key; never a hot id (Choose leaves such an id out).
  static constexpr uint32_t kEmpty = ~uint32_t{0};

  std::vector<Table> tables_;  // [table of the layout]; dim 0 = none hot
  // Redirect's scratch: the positions in ids of the hot ones, and which.
  std::vector<uint32_t> found_;
  std::vector<int32_t> hot_at_;
  int hot_tables_ = 0;
  int64_t rows_merged_ = 0;
};

}  // namespace shardwild
